"""Whole-model ONNX export: two-stage detectors (deployment/detector.py) and segmentor label
maps, against mmdet's and mmseg's own ``predict``.

The tiny models have random weights. Random classifiers score every class and anchor
almost alike, so the order of NMS would hang on float noise; the classifiers' weights
are scaled (``spread_scores``) so that scores differ as a trained model's do, without
saturating at 1.0 (ties again). The tensor-only prediction path is checked in PyTorch
first (fast tier), then exported and run in onnxruntime (slow tier) at two sizes that
are not multiples of 32.
"""
import os.path as osp

import numpy as np
import pytest
import torch

from mmplugin_inline.deployment import detector as det
from mmplugin_inline.deployment import onnx as export

from helpers.runs import PYTHON, ok, run_tool
from helpers.tiny_models import REPO, shrink_model
from helpers.tool_configs import tiny_sem_fpn

pytest.importorskip('onnxruntime')

# sizes other than the export size (64 x 96), not multiples of 32
VERIFY_HW = [(61, 83), (77, 101)]
DETECTORS = {  # config -> tiny backbone family it gets (shrink_model keeps the family)
    'mask-rcnn': 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py',
    'cascade-mask-rcnn': 'configs/inline_swin/cascade-mask-rcnn_inline-swin-t_fpn_1x_coco.py',
}


def spread_scores(model) -> None:
    """Scale the RPN's and the box heads' classifiers of a random model, in place."""
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, 'fc_cls'):
                m.fc_cls.weight.mul_(4)
            if type(m).__name__ == 'RPNHead':
                m.rpn_cls.weight.mul_(3)


def tiny_detector_cfg(name):
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, DETECTORS[name]))
    shrink_model(cfg.model, num_classes=3)
    return cfg


def tiny_detector(name):
    from mmplugin_inline.analysis import build_model
    torch.manual_seed(0)
    model = build_model(tiny_detector_cfg(name)).eval()
    spread_scores(model)
    return model


def _inputs():
    return export.random_inputs(VERIFY_HW, seed=1)


def test_match_detections_counts_label_box_and_score():
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 30], [5, 5, 9, 9]], dtype=np.float32)
    ref = dict(boxes=boxes, scores=np.array([0.9, 0.8, 0.7]), labels=np.array([0, 1, 2]))
    same = det.match_detections(ref, dict(ref))
    assert (same['matched'], same['share']) == (3, 1.0)
    got = dict(boxes=boxes.copy(), scores=ref['scores'].copy(), labels=ref['labels'].copy())
    got['labels'][0] = 1                 # another label
    got['boxes'][1, 2] += 1.0            # IoU 20 x 10 / 21 x 10 = 0.952
    got['scores'][2] += 2e-3             # score off by more than 1e-3
    assert det.match_detections(ref, got)['matched'] == 0
    got = {k: v[:2] for k, v in ref.items()}  # one missing: 2 of 3
    r = det.match_detections(ref, got)
    assert (r['matched'], r['share']) == (2, pytest.approx(2 / 3))
    assert det.match_detections({k: v[:0] for k, v in ref.items()},
                                {k: v[:0] for k, v in ref.items()})['share'] == 1.0


def test_grid_anchors_are_mmdets_grid_priors():
    from mmdet.models.task_modules.prior_generators import AnchorGenerator
    gen = AnchorGenerator(strides=[4, 8, 16, 32, 64], ratios=[0.5, 1.0, 2.0], scales=[8])
    sizes = [(16, 21), (8, 11), (4, 6), (2, 3), (1, 2)]
    for level, (ref, hw) in enumerate(zip(gen.grid_priors(sizes, device='cpu'), sizes)):
        torch.testing.assert_close(det.grid_anchors(gen, level, hw, torch.float32), ref)


def test_paste_masks_is_mmdets_paste_and_threshold():
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask
    gen = torch.Generator().manual_seed(0)
    masks = torch.rand(5, 28, 28, generator=gen)
    xy = torch.rand(5, 2, generator=gen) * 60
    boxes = torch.cat([xy, xy + 3 + torch.rand(5, 2, generator=gen) * 40], dim=1)
    boxes[0, 2] = boxes[0, 0]  # an empty box (mmdet replaces the inf grid by 0)
    got = det.paste_masks(masks, boxes, (61, 83), 0.5)
    for i in range(5):
        chunk, (ys, xs) = _do_paste_mask(masks[i:i + 1, None], boxes[i:i + 1], 61, 83,
                                         skip_empty=True)
        ref = torch.zeros(61, 83, dtype=torch.bool)
        ref[ys, xs] = chunk[0] >= 0.5
        assert torch.equal(got[i], ref), i


@pytest.mark.parametrize('name', sorted(DETECTORS))
def test_detector_graph_is_mmdets_predict(name):
    """The tensor-only path in PyTorch, before any export: the same detections and masks."""
    model = tiny_detector(name)
    graph = det.detector_graph(model).eval()
    for x in _inputs():
        ref = det.torch_detections(model, x)
        with torch.no_grad():
            got = dict(zip(graph.output_names, (t.numpy() for t in graph(x))))
        r = det.match_detections(ref, got)
        assert r['ref'] > 10 and r['share'] == 1.0, r
        assert got['labels'].dtype == np.int64 and got['masks'].dtype == np.bool_
        assert got['masks'].shape[1:] == tuple(x.shape[2:])
        pairs = r['pairs']
        assert all(np.array_equal(ref['masks'][i], got['masks'][j]) for i, j in pairs)


def test_unsupported_detectors_are_named():
    model = tiny_detector('mask-rcnn')
    del model.rpn_head
    with pytest.raises(ValueError, match='two-stage detectors.*--backbone-only'):
        det.detector_graph(model)


@pytest.mark.slow
def test_cascade_mask_rcnn_exports_and_matches(tmp_path):
    model = tiny_detector('cascade-mask-rcnn')
    graph = det.detector_graph(model).eval()
    path = str(tmp_path / 'cascade.onnx')
    result = export.export_onnx(graph, (64, 96), path, batch=1,
                                output_names=graph.output_names)
    assert result['ranges'][:2] == [1, 3]
    rows = export.verify_detector(model, path, _inputs())
    print(rows, f'export {result["seconds"]:.1f} s')
    assert all(r['ref'] > 10 and r['share'] >= 0.99 for r in rows), rows
    assert all(r['mask_equal'] >= 0.999 for r in rows), rows
    _assert_standard_ops(path)


def _assert_standard_ops(path):
    """Only the default ONNX domain: no custom op library needed."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    domains = {n.domain for n in model.graph.node} - {'', 'ai.onnx'}
    ops = {n.op_type for n in model.graph.node}
    assert not domains and {'NonMaxSuppression', 'RoiAlign', 'TopK'} <= ops, (domains, ops)


@pytest.mark.slow
def test_cli_exports_and_verifies_a_whole_mask_rcnn(tmp_path):
    """The tool as a user runs it: a config and a checkpoint of a tiny Mask R-CNN."""
    config = str(tmp_path / 'tiny_mask_rcnn.py')
    tiny_detector_cfg('mask-rcnn').dump(config)
    checkpoint = str(tmp_path / 'tiny.pth')
    torch.save(dict(state_dict=tiny_detector('mask-rcnn').state_dict(), meta={}), checkpoint)
    out = str(tmp_path / 'det.onnx')
    rc, text, _ = run_tool([PYTHON, osp.join(REPO, 'tools/deployment/pytorch2onnx.py'), config,
                            '--checkpoint', checkpoint, '--out', out, '--shape', '64', '96',
                            '--verify', '--verify-shapes', '61', '83', '77', '101'],
                           timeout=1800)
    ok(rc, text)
    print(text[-1500:])
    assert 'whole detector' in text and 'Outputs: boxes, scores, labels, masks' in text
    assert '| random 61x83 | 61x83 |' in text and 'Verified: matched detections' in text
    _assert_standard_ops(out)
    import json

    import onnx
    meta = {p.key: p.value for p in onnx.load(out, load_external_data=False).metadata_props}
    record = json.loads(meta[export.METADATA_KEY])
    assert record['task'] == 'detection' and record['size_divisor'] == 32
    assert record['resize'] == dict(scale=[1333, 800], keep_ratio=True)
    assert len(record['classes']) == 80  # the config's COCO metainfo (the model: 3 classes)


@pytest.mark.slow
def test_cli_exports_segmentor_labels(tmp_path):
    """--with-argmax: labels [B, H, W] at the input size, equal to mmseg's predict."""
    config = tiny_sem_fpn(tmp_path)
    out = str(tmp_path / 'seg.onnx')
    rc, text, _ = run_tool([PYTHON, osp.join(REPO, 'tools/deployment/pytorch2onnx.py'), config,
                            '--out', out, '--shape', '64', '96', '--with-argmax', '--verify',
                            '--verify-shapes', '61', '83', '77', '101'], timeout=1800)
    ok(rc, text)
    print(text[-1000:])
    assert 'segmentor (label map)' in text and '| random 61x83 | 61x83 | 1x61x83 |' in text
    assert 'Verified: equal labels' in text

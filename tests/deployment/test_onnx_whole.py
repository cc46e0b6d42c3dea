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

from helpers.runs import PYTHON, ok, run_tool
from helpers.tiny_models import REPO, shrink_model
from helpers.tool_configs import tiny_sem_fpn
from mmplugin_inline.deployment import detector as det
from mmplugin_inline.deployment import detector_check as check
from mmplugin_inline.deployment import metadata, runtime, verify
from mmplugin_inline.deployment import onnx as export

pytest.importorskip('onnxruntime')
# one worker runs this file: its slow tests share one export (a module fixture)
pytestmark = pytest.mark.xdist_group('onnx_whole')

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
    return verify.random_inputs(VERIFY_HW, seed=1)


def test_match_detections_counts_label_box_and_score():
    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 30], [5, 5, 9, 9]], dtype=np.float32)
    ref = dict(boxes=boxes, scores=np.array([0.9, 0.8, 0.7]), labels=np.array([0, 1, 2]))
    same = check.match_detections(ref, dict(ref))
    assert (same['matched'], same['share']) == (3, 1.0)
    got = dict(boxes=boxes.copy(), scores=ref['scores'].copy(), labels=ref['labels'].copy())
    got['labels'][0] = 1                 # another label
    got['boxes'][1, 2] += 1.0            # IoU 20 x 10 / 21 x 10 = 0.952
    got['scores'][2] += 2e-3             # score off by more than 1e-3
    assert check.match_detections(ref, got)['matched'] == 0
    got = {k: v[:2] for k, v in ref.items()}  # one missing: 2 of 3
    r = check.match_detections(ref, got)
    assert (r['matched'], r['share']) == (2, pytest.approx(2 / 3))
    assert check.match_detections({k: v[:0] for k, v in ref.items()},
                                {k: v[:0] for k, v in ref.items()})['share'] == 1.0
    # a box 0.1 px tall, rounded to 0.01 px: IoU 0.9, every coordinate within box_tol
    thin = dict(boxes=np.array([[3.0, 47.837, 6.7, 47.937]]), scores=np.array([0.5]),
                labels=np.array([0]))
    rounded = dict(thin, boxes=np.round(thin['boxes'], 2))
    assert check.match_detections(thin, rounded)['matched'] == 0
    assert check.match_detections(thin, rounded, box_tol=0.006)['matched'] == 1
    assert check.match_detections(thin, dict(rounded, boxes=rounded['boxes'] + 0.01),
                                box_tol=0.006)['matched'] == 0


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
    """The tensor-only path in PyTorch, before any export: the same detections and masks,
    on inputs that are the image and on an image padded at the bottom and right (boxes
    clipped to the image, masks zero in the padding)."""
    model = tiny_detector(name)
    graph = det.detector_graph(model).eval()
    padded = torch.randn(1, 3, 96, 128, generator=torch.Generator().manual_seed(2))
    cases = [(x, tuple(x.shape[2:])) for x in _inputs()] + [(padded, (71, 101))]
    for x, img_hw in cases:
        ref = check.torch_detections(model, x, img_hw)
        with torch.no_grad():
            got = dict(zip(graph.output_names, (t.numpy() for t in graph(
                x, torch.tensor(img_hw)))))
        r = check.match_detections(ref, got)
        assert r['ref'] > 10 and r['share'] == 1.0, r
        assert got['labels'].dtype == np.int64 and got['masks'].dtype == np.bool_
        assert got['masks'].shape[1:] == tuple(x.shape[2:])
        pairs = r['pairs']
        assert all(np.array_equal(ref['masks'][i], got['masks'][j]) for i, j in pairs)
        assert (got['boxes'] <= [img_hw[1], img_hw[0]] * 2).all()
        assert not got['masks'][:, img_hw[0]:].any() and not got['masks'][:, :, img_hw[1]:].any()


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
    rows = verify.verify_detector(model, path, _inputs())
    print(rows, f'export {result["seconds"]:.1f} s')
    assert all(r['ref'] > 10 and r['share'] >= 0.99 for r in rows), rows
    assert all(r['mask_equal'] >= 0.999 for r in rows), rows
    _assert_standard_ops(path)


def _assert_standard_ops(path, detector=True):
    """Only the default ONNX domain: no custom op library needed. The inputs: ``input``,
    and a detector's ``img_hw``."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    assert [i.name for i in model.graph.input] == (['input', 'img_hw'] if detector
                                                    else ['input'])
    domains = {n.domain for n in model.graph.node} - {'', 'ai.onnx'}
    ops = {n.op_type for n in model.graph.node}
    assert not domains, domains
    if detector:
        assert {'NonMaxSuppression', 'RoiAlign', 'TopK'} <= ops, ops


# the tiny Mask R-CNN's test-time resize (its config's 1333 x 800 would make the runtime
# test's images large): the metadata must carry this one
TEST_SCALE = (128, 96)


@pytest.fixture(scope='module')
def mask_rcnn_export(tmp_path_factory):
    """A tiny Mask R-CNN config and checkpoint, exported and verified by the tool as a user
    runs it: (config, checkpoint, ONNX file, the tool's output)."""
    tmp = tmp_path_factory.mktemp('mask_rcnn_onnx')
    cfg = tiny_detector_cfg('mask-rcnn')
    for step in cfg.test_dataloader.dataset.pipeline:
        if step['type'] == 'Resize':
            step['scale'] = TEST_SCALE
    config = str(tmp / 'tiny_mask_rcnn.py')
    cfg.dump(config)
    checkpoint = str(tmp / 'tiny.pth')
    torch.save(dict(state_dict=tiny_detector('mask-rcnn').state_dict(), meta={}), checkpoint)
    out = str(tmp / 'det.onnx')
    rc, text, _ = run_tool([PYTHON, osp.join(REPO, 'tools/deployment/pytorch2onnx.py'), config,
                            '--checkpoint', checkpoint, '--out', out, '--shape', '64', '96',
                            '--verify', '--verify-shapes', '61', '83', '77', '101'],
                           timeout=1800)
    ok(rc, text)
    print(text[-1500:])
    return config, checkpoint, out, text


@pytest.mark.slow
def test_cli_exports_and_verifies_a_whole_mask_rcnn(mask_rcnn_export):
    import json

    import onnx
    _, _, out, text = mask_rcnn_export
    assert 'whole detector' in text and 'Outputs: boxes, scores, labels, masks' in text
    assert '| random 61x83 | 61x83 |' in text and 'Verified: matched detections' in text
    _assert_standard_ops(out)
    meta = {p.key: p.value for p in onnx.load(out, load_external_data=False).metadata_props}
    record = json.loads(meta[metadata.METADATA_KEY])
    assert record['task'] == 'detection' and record['size_divisor'] == 32
    assert record['resize'] == dict(scale=list(TEST_SCALE), keep_ratio=True)
    assert record['bgr_to_rgb'] and record['mean'] == [123.675, 116.28, 103.53]
    assert len(record['classes']) == 80  # the config's COCO metainfo (the model: 3 classes)


# imports blocked in the runtime's process: the training stack (and so the package itself,
# whose __init__ imports torch)
BLOCKER = """
import sys
BLOCKED = ('torch', 'torchvision', 'mmdet', 'mmseg', 'mmcv', 'mmengine')
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ImportError(f'{name} is blocked in this test')
sys.meta_path.insert(0, Block())
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def _mmdet_detections(config, checkpoint, path):
    """mmdet's own test pipeline and predict(rescale=True): original-image detections."""
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint

    from mmplugin_inline.analysis import build_model
    from mmplugin_inline.tools_common import load_config
    cfg = load_config(config)
    init_default_scope('mmdet')
    model = build_model(cfg).eval()
    load_checkpoint(model, checkpoint, map_location='cpu')
    steps = [s for s in cfg.test_dataloader.dataset.pipeline if 'Annotations' not in s['type']]
    data = Compose(steps)(dict(img_path=path, img_id=0))
    with torch.no_grad():
        batch = model.data_preprocessor(dict(inputs=[data['inputs']],
                                             data_samples=[data['data_samples']]), False)
        pred = model.predict(batch['inputs'], batch['data_samples'], rescale=True)[0]
    p = pred.pred_instances
    return dict(boxes=p.bboxes.numpy(), scores=p.scores.numpy(), labels=p.labels.numpy(),
                masks=p.masks.numpy())


@pytest.mark.slow
def test_onnx_inference_runs_without_torch_or_mmdet(mask_rcnn_export, tmp_path):
    """tools/deployment/onnx_inference.py with torch and mmdet blocked from import: its
    detections and masks, in the original image's coordinates, are mmdet's on the same
    files (masks pasted at the original size, as ``predict(rescale=True)`` does).

    a.jpg is scaled up, b.png down, both to 96 x 128 (no padding); c.png is padded to
    96 x 128 after its resize to 95 x 128 (the graph's img_hw).
    """
    import json

    import cv2
    config, checkpoint, onnx_file, _ = mask_rcnn_export
    images = tmp_path / 'images'
    images.mkdir()
    gen = np.random.RandomState(0)
    files = {'a.jpg': (48, 64), 'b.png': (192, 256), 'c.png': (97, 131)}
    for name, (h, w) in files.items():
        cv2.imwrite(str(images / name), gen.randint(0, 256, (h, w, 3)).astype(np.uint8))
    out_dir = tmp_path / 'out'
    rc, text, _ = run_tool([PYTHON, '-c', BLOCKER,
                            osp.join(REPO, 'tools/deployment/onnx_inference.py'), onnx_file,
                            str(images), '--out-dir', str(out_dir), '--score-thr', '0'],
                           env=dict(PYTHONPATH=''))
    ok(rc, text)
    for name, (h, w) in files.items():
        stem = osp.splitext(name)[0]
        assert cv2.imread(str(out_dir / f'{stem}.png')).shape == (h, w, 3)
        with open(out_dir / f'{stem}.json') as f:
            result = json.load(f)
        dets = result['detections']
        assert dets and all(d['mask']['size'] == [h, w] and sum(d['mask']['counts']) == h * w
                            for d in dets)
        got = dict(boxes=np.array([d['bbox'] for d in dets], np.float32).reshape(-1, 4),
                   scores=np.array([d['score'] for d in dets]),
                   labels=np.array([d['label'] for d in dets]))
        assert (got['boxes'] >= 0).all() and (got['boxes'] <= [w, h, w, h]).all()
        ref = _mmdet_detections(config, checkpoint, str(images / name))
        # the runtime's JSON rounds boxes to 0.01 px (and scores to 1e-5)
        r = check.match_detections(ref, got, iou=0.99, score_tol=1e-3, box_tol=0.006)
        assert r['ref'] > 10 and r['share'] >= 0.99, (name, r)
        equal = [np.mean(ref['masks'][i] == runtime._decode_rle(dets[j]['mask']))
                 for i, j in r['pairs']]
        assert min(equal) >= 0.999 and np.mean(equal) >= 0.9999, (name, equal)


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
    _assert_standard_ops(out, detector=False)


def test_cli_rejects_bad_whole_model_options(tmp_path, capsys):
    """One message, exit status 1 and no traceback (the tool's main, in process)."""
    from helpers.runs import tool_failure
    from mmplugin_inline.cli import pytorch2onnx
    config = str(tmp_path / 'tiny_mask_rcnn.py')
    tiny_detector_cfg('mask-rcnn').dump(config)
    base = [config, '--out', str(tmp_path / 'x.onnx'), '--shape', '64', '96']
    err = tool_failure(pytorch2onnx.main, base + ['--with-argmax'], capsys)
    assert '--with-argmax is for whole mmseg segmentors' in err
    err = tool_failure(pytorch2onnx.main, base + ['--verify', '--verify-images',
                                                  str(tmp_path / 'none')], capsys)
    assert '--verify-images: not a folder' in err
    (tmp_path / 'empty').mkdir()
    err = tool_failure(pytorch2onnx.main, base + ['--verify', '--verify-images',
                                                  str(tmp_path / 'empty')], capsys)
    assert '--verify-images: no images' in err
    err = tool_failure(pytorch2onnx.main, base + ['--min-share', '2'], capsys)
    assert '--min-share must be between 0 and 1' in err


def test_onnx_inference_rejects_bad_input(tmp_path, capsys):
    from mmplugin_inline.cli import onnx_inference
    assert onnx_inference.main([str(tmp_path / 'none.onnx'), str(tmp_path),
                                '--out-dir', str(tmp_path / 'out')]) == 1
    assert 'ONNX file not found' in capsys.readouterr().err


def test_runtime_paste_is_mmdets_paste_at_the_original_size():
    """runtime.paste_mask (numpy) against mmdet's CPU ``_do_paste_mask`` (skip_empty),
    mask by mask: boxes inside, across the border, sub-pixel and of zero width."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask

    gen = torch.Generator().manual_seed(0)
    h, w = 57, 83
    probs = torch.rand(40, 28, 28, generator=gen)
    xy = torch.rand(40, 2, generator=gen) * torch.tensor([w + 10, h + 10]) - 5
    wh = torch.rand(40, 2, generator=gen) * torch.tensor([w, h]) * 0.8
    boxes = torch.cat([xy, xy + wh], 1)                      # some across the border
    boxes = torch.minimum(boxes, torch.tensor([w - 1, h - 1, w + 3, h + 3]))
    boxes[0] = torch.tensor([10.3, 20.7, 10.9, 21.1])        # under a pixel
    boxes[1] = torch.tensor([30.0, 5.0, 30.0, 40.0])         # zero width
    boxes[2] = torch.tensor([-20.0, -10.0, w + 20.0, h + 9])  # beyond the image
    equal = []
    for prob, box in zip(probs, boxes):
        pasted, (ys, xs) = _do_paste_mask(prob[None, None], box[None], h, w, skip_empty=True)
        ref = torch.zeros(h, w, dtype=torch.bool)
        ref[ys, xs] = pasted[0] >= 0.5
        got = runtime.paste_mask(prob.numpy(), box.numpy(), (h, w), 0.5)
        equal.append(np.mean(got == ref.numpy()))
    assert min(equal) >= 0.999 and np.mean(equal) >= 0.9999, equal
    assert sum(e == 1.0 for e in equal) >= 38, equal


def test_coco_scoring_of_runtime_detections(shapes):
    """Runtime-style detections (x1, y1, x2, y2, RLE of the runtime) made from the ground
    truth score 1.0 bbox and segm mAP through coco_eval; boxes moved by half their size
    do not."""
    import pycocotools.mask as mask_util
    from pycocotools.coco import COCO

    from mmplugin_inline.deployment import coco_eval
    coco = COCO(osp.join(shapes, 'annotations', 'instances_validation.json'))
    cat_ids = sorted(coco.getCatIds())
    perfect, moved = [], []
    for ann in coco.loadAnns(coco.getAnnIds()):
        info = coco.loadImgs([ann['image_id']])[0]
        mask = coco.annToMask(ann).astype(bool)
        x, y, w, h = ann['bbox']
        d = dict(bbox=[x, y, x + w, y + h], score=0.9, label=cat_ids.index(ann['category_id']),
                 mask=runtime.rle(mask))
        assert mask_util.area(mask_util.frPyObjects(d['mask'], info['height'],
                                                    info['width'])) == mask.sum()
        perfect.append(coco_eval.coco_result(d, ann['image_id'], cat_ids))
        d = dict(d, bbox=[x + w / 2, y + h / 2, x + 1.5 * w, y + 1.5 * h],
                 mask=runtime.rle(np.roll(mask, (int(h / 2), int(w / 2)), (0, 1))))
        moved.append(coco_eval.coco_result(d, ann['image_id'], cat_ids))
    img_ids = coco.getImgIds()
    assert coco_eval.coco_map(perfect, coco, img_ids) == dict(bbox_mAP=1.0, segm_mAP=1.0)
    low = coco_eval.coco_map(moved, coco, img_ids)
    assert low['bbox_mAP'] < 0.5 and low['segm_mAP'] < 0.5, low

"""Pad-aware mode in stock mmdet / mmseg models, through the plugin's data preprocessors.

Built from the repository's configs (tiny backbones and heads, ``helpers.tiny_models``)
with ``model.data_preprocessor.type`` set to the plugin's preprocessor and
``backbone.pad_aware=True``: the config snippet users write.
"""
import copy
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

import mmplugin_inline  # noqa: F401
from helpers.tiny_models import REPO, shrink_model
from mmplugin_inline.models.layers import REAL_HW_ATTR

TOL = 1e-5
DET_CONFIG = osp.join(REPO, 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py')
SEG_CONFIG = osp.join(REPO, 'configs/inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py')


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def build(path, pad_aware=True, **preprocessor):
    cfg = Config.fromfile(path)
    scope = cfg.default_scope
    model_cfg = copy.deepcopy(cfg.model)
    shrink_model(model_cfg)
    # the snippet a user adds to a config
    model_cfg.data_preprocessor.type = ('PadAwareDetDataPreprocessor' if scope == 'mmdet'
                                        else 'PadAwareSegDataPreProcessor')
    model_cfg.data_preprocessor.update(preprocessor)
    model_cfg.backbone.pad_aware = pad_aware
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    model.init_weights()
    return model.eval()


def det_sample(hw):
    from mmdet.structures import DetDataSample
    return DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, scale_factor=(1.0, 1.0)))


def test_config_snippet_builds_with_stock_registries():
    from mmdet.models.data_preprocessors import DetDataPreprocessor
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    det, seg = build(DET_CONFIG), build(SEG_CONFIG)
    assert isinstance(det.data_preprocessor, DetDataPreprocessor) and det.backbone.pad_aware
    assert isinstance(seg.data_preprocessor, SegDataPreProcessor) and seg.backbone.pad_aware


def test_mask_rcnn_neck_and_roi_head_do_not_depend_on_the_batch():
    """Batch 1 (padded to 32) vs batch 2 with a larger partner (padded to its size).

    The backbone's outputs are equal on the image's valid region. The neck's too, except
    on the last valid row / column of each level once the FPN's lateral 1x1 convs have
    a bias: the stock FPN's 3x3 output conv there reads the padding beyond, which holds
    that bias (alone, its own zero padding). At initialisation (zero biases) the neck is
    equal on the whole valid region. Given the same proposals, the RoI head's boxes and
    scores are then equal too; the end-to-end detections may still differ, by mmdet
    itself: the RPN places anchors in the padding (more of them in a larger canvas),
    whose proposals, clipped into the image, compete in the RPN's top-k and NMS.
    """
    model = build(DET_CONFIG)
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, 100, 84), generator=g, dtype=torch.uint8)
    partner = torch.randint(0, 256, (3, 150, 130), generator=g, dtype=torch.uint8)
    pre = model.data_preprocessor
    one = pre(dict(inputs=[img], data_samples=[det_sample((100, 84))]), False)
    two = pre(dict(inputs=[img, partner],
                   data_samples=[det_sample((100, 84)), det_sample((150, 130))]), False)
    assert one['inputs'].shape[-2:] == (128, 96) and two['inputs'].shape[-2:] == (160, 160)
    assert getattr(two['inputs'], REAL_HW_ATTR).tolist() == [[100, 84], [150, 130]]

    def valid(x, s, ring=0):
        return x[:1, :, :-(-100 // s) - ring, :-(-84 // s) - ring]

    with torch.no_grad():
        feats = [model.extract_feat(d['inputs']) for d in (one, two)]
        for i, (a, b) in enumerate(zip(*feats)):
            assert rel_err(valid(b, 4 * 2 ** i), valid(a, 4 * 2 ** i)) < TOL, f'P{i + 2}'
        # the same proposals give the same boxes and scores
        samples = one['data_samples']
        model.roi_head.test_cfg.score_thr = 0.0  # an untrained head: keep every box
        proposals = model.rpn_head.predict(feats[0], samples, rescale=False)
        results = [model.roi_head.predict([f[:1] for f in fs], copy.deepcopy(proposals), samples,
                                          rescale=False)[0] for fs in feats]
        # end to end, the RPN's own proposals: nearly all shared (measured 98 of 100; the
        # rest come from anchors in the larger canvas' padding); the default mode: none
        own = model.rpn_head.predict([f[:1] for f in feats[1]], samples, rescale=False)[0]
        shared = sum(bool((own.bboxes - box).abs().sum(1).min() < 1e-3)
                     for box in proposals[0].bboxes)
        assert shared >= 0.9 * len(proposals[0])
        # nonzero lateral biases: equal but for the last valid row / column
        for conv in model.neck.lateral_convs:
            conv.conv.bias.normal_(0, 0.5)
        feats = [model.extract_feat(d['inputs']) for d in (one, two)]
        ring_diff = 0.0
        for i, (a, b) in enumerate(zip(*feats)):
            s = 4 * 2 ** i
            assert rel_err(valid(b, s, 1), valid(a, s, 1)) < TOL, f'P{i + 2}'
            ring_diff = max(ring_diff, rel_err(valid(b, s), valid(a, s)))
        assert ring_diff > TOL  # the stock FPN's border (see the docstring)

    a, b = results
    assert len(a.bboxes) > 0 and a.bboxes.shape == b.bboxes.shape
    assert rel_err(b.scores, a.scores) < 1e-4
    assert rel_err(b.bboxes, a.bboxes) < 1e-4


def test_semantic_fpn_image_smaller_than_the_crop():
    """An image smaller than the crop, padded to it by the preprocessor (training mode),
    gives the backbone features of the image alone on its valid region; the logits too,
    away from a band at the bottom / right border, where the stock FPN neck and head
    (3x3 convs, bilinear upsampling) read the padding (alone: their own zero padding or
    edge replication), and at image sizes that are multiples of the coarsest stride."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    model = build(SEG_CONFIG, size=(256, 256))
    # a multiple of 32: mmseg's FPNHead resizes each upsampled level to the next one's
    # size, which at other sizes is not a factor of 2 alone (a resampling of the whole
    # map) but is in the padded crop
    hw = (192, 224)
    img = torch.randint(0, 256, (3, *hw), generator=torch.Generator().manual_seed(0),
                        dtype=torch.uint8)

    def sample():
        s = SegDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, scale_factor=(1.0, 1.0)))
        s.gt_sem_seg = PixelData(data=torch.zeros(1, *hw, dtype=torch.long))
        return s
    pre = model.data_preprocessor
    padded = pre(dict(inputs=[img], data_samples=[sample()]), True)   # padded to the crop
    alone = pre(dict(inputs=[img], data_samples=[sample()]), False)   # as it is
    assert padded['inputs'].shape[-2:] == (256, 256) and alone['inputs'].shape[-2:] == hw
    with torch.no_grad():
        fa, fp = (model.backbone(d['inputs']) for d in (alone, padded))
        for a, p in zip(fa, fp):
            assert rel_err(p[..., :a.shape[2], :a.shape[3]], a) < TOL
        # the head's logits (stride 4), before mmseg's resizing to the metas' sizes
        la, lp = (model.decode_head(model.extract_feat(d['inputs'])) for d in (alone, padded))
    band = 32  # in logits (stride 4): the stock neck's and head's reach beyond the backbone
    inner = (slice(None), slice(None), slice(0, hw[0] // 4 - band), slice(0, hw[1] // 4 - band))
    assert rel_err(lp[inner], la[inner]) < TOL
    # the default mode: the padded tokens change the whole map
    model.backbone.pad_aware = False
    with torch.no_grad():
        ld = model.decode_head(model.extract_feat(padded['inputs']))
    assert rel_err(ld[inner], la[inner]) > 100 * TOL

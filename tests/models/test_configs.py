"""Every config under configs/ loads, follows its recipe, and its model (with a tiny
backbone) trains and predicts on two odd-sized images; the mmdet / mmseg pipelines run."""
import copy
import functools
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config

from helpers.samples import build_codebase_model, det_sample, seg_sample
from helpers.tiny_models import REPO, config_files, shrink_model
from mmplugin_inline.engine.runner import RUNNER_TYPE
from mmplugin_inline.registry import MODELS, released_weights

CONFIGS = config_files()
ODD_SIZES = [(61, 83), (77, 53)]
# the position parameters a family keeps out of weight decay in the Swin detection recipe
# (CSWin has none: its positional term is a convolution, LePE)
POSITION_TABLES = {'InLineSwinTransformer': ['relative_position_bias_table'],
                   'InLineDeiT': ['pos_embed', 'cls_token']}


@functools.lru_cache(maxsize=None)
def _load_cached(path):
    return Config.fromfile(osp.join(REPO, path))


def _load(path):
    """The config (a copy: resolving mmdet:: / mmseg:: bases takes ~1 s per file)."""
    return copy.deepcopy(_load_cached(path))


def test_the_configs_of_the_issue_are_all_there():
    names = {osp.basename(p) for p in CONFIGS}
    expected = (
        [f'mask-rcnn_inline-pvt-{a}_fpn_1x_coco.py' for a in 'tsml'] +
        [f'mask-rcnn_inline-swin-{a}_fpn_{s}_coco.py' for a in 'ts' for s in ('1x', 'ms-crop-3x')] +
        [f'cascade-mask-rcnn_inline-swin-{a}_fpn_{s}_coco.py' for a in 'tsb'
         for s in ('1x', 'ms-crop-3x')] +
        ['mask-rcnn_inline-cswin-t_fpn_1x_coco.py', 'mask_rcnn_inline_pvt.py',
         'mask-rcnn_inline-deit-s_sfp_1x_coco.py'] +
        [f'fpn_inline-pvt-{a}_8xb4-40k_ade20k-512x512.py' for a in 'tsml'] +
        [f'upernet_inline-swin-{a}_8xb2-160k_ade20k-512x512.py' for a in 'tsb'] +
        ['upernet_inline-cswin-t_8xb2-160k_ade20k-512x512.py',
         'upernet_inline-deit-s_mln_8xb2-160k_ade20k-512x512.py',
         'upernet_inline-swin-t_8xb1-80k_cityscapes-1024x1024.py',
         'upernet_inline-swin-t_8xb2-160k_ade20k-640x640.py'])
    assert not set(expected) - names


@pytest.mark.parametrize('path', CONFIGS)
def test_config_names_the_plugin_and_where_its_imagenet_weights_go(path):
    cfg = _load(path)
    assert cfg.custom_imports == dict(imports=['mmplugin_inline'], allow_failed_imports=False)
    assert cfg.default_scope in ('mmdet', 'mmseg')
    assert cfg.runner_type == RUNNER_TYPE  # configs/_base_/plugin_runtime.py
    backbone = cfg.model.backbone
    if backbone.init_cfg is None:  # only demos train from scratch
        assert path.startswith('configs/demo/')
    else:  # the file the backbone's arch and family were released as, under checkpoints/
        checkpoint = backbone.init_cfg.checkpoint
        short_name = MODELS.get(backbone.type).short_name
        assert checkpoint == f'checkpoints/{short_name}_{backbone.arch}.pth'
        assert osp.basename(checkpoint) in released_weights()
    assert cfg.model.get('pretrained') is None  # would bypass the backbone's own loading
    name = osp.basename(path)
    if name != 'mask_rcnn_inline_pvt.py':  # {algo}_{backbone}_... with the backbone's arch
        family = MODELS.get(backbone.type).short_name.replace('_', '-')
        assert f'_{family}-{backbone.arch}_' in name


def _milestones(cfg):
    return [s for s in cfg.param_scheduler if s.type == 'MultiStepLR'][0].milestones


@pytest.mark.parametrize('path', [p for p in CONFIGS if p.endswith('_coco.py')
                                  or p.endswith('mask_rcnn_inline_pvt.py')])
def test_detection_configs_follow_their_family_recipe(path):
    cfg = _load(path)
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW'
    assert cfg.train_dataloader.batch_size == 2 and cfg.auto_scale_lr.base_batch_size == 16
    three_x = '3x' in path
    assert cfg.train_cfg.max_epochs == (36 if three_x else 12)
    assert _milestones(cfg) == ([27, 33] if three_x else [8, 11])
    resize = [t for t in cfg.train_dataloader.dataset.pipeline if 'Resize' in t.type]
    if three_x:  # multi-scale with crops
        assert cfg.train_dataloader.dataset.pipeline[3].type == 'RandomChoice'
    else:  # single scale 1333x800
        assert [(t.type, t.scale) for t in resize] == [('Resize', (1333, 800))]
    backbone = cfg.model.backbone.type
    if backbone == 'InLinePVT':
        assert (opt.lr, opt.weight_decay) == (1e-4, 1e-4)
    else:  # Swin recipe (also for CSWin, DeiT): no decay on norms and position tables
        assert (opt.lr, opt.weight_decay) == (1e-4, 0.05)
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert keys.norm.decay_mult == 0
        assert all(keys[k].decay_mult == 0 for k in POSITION_TABLES.get(backbone, []))
    if backbone == 'InLineDeiT':  # one stride-16 map: the pyramid is the neck's
        assert cfg.model.neck.type == 'SimpleFeaturePyramid'
    if cfg.model.type == 'CascadeRCNN':
        heads = cfg.model.roi_head.bbox_head
        assert len(heads) == 3 and {h.loss_bbox.type for h in heads} == {'GIoULoss'}


def _poly(cfg):
    return [s for s in cfg.param_scheduler if s.type == 'PolyLR'][0]


@pytest.mark.parametrize('path', [p for p in CONFIGS if 'ade20k' in p or 'cityscapes' in p])
def test_segmentation_configs_follow_their_recipe(path):
    cfg = _load(path)
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW'
    poly = _poly(cfg)
    assert poly.end == cfg.train_cfg.max_iters
    num_classes = 19 if 'cityscapes' in path else 150
    assert cfg.model.decode_head.num_classes == num_classes
    crop = tuple(int(v) for v in re.search(r'(\d+)x(\d+)\.py$', path).groups())
    assert tuple(cfg.model.data_preprocessor.size) == crop
    assert [t for t in cfg.train_dataloader.dataset.pipeline
            if t.type == 'RandomCrop'][0].crop_size == crop
    if path.startswith('configs/inline_pvt/fpn_'):  # Semantic FPN, PVT recipe
        assert (opt.lr, opt.weight_decay, poly.power) == (2e-4, 1e-4, 0.9)
        assert cfg.train_cfg.max_iters == 40000
    else:  # UperNet, Swin / ViT recipe
        assert (opt.lr, opt.weight_decay, poly.power) == (6e-5, 0.01, 1.0)
        warmup = [s for s in cfg.param_scheduler if s.type == 'LinearLR'][0]
        assert warmup.end == 1500 == poly.begin
        assert cfg.model.decode_head.type == 'UPerHead'
        assert 8 * cfg.train_dataloader.batch_size == (8 if 'cityscapes' in path else 16)
    if 'cityscapes' in path:  # trained on 1024 crops, tested on whole 1024x2048 images
        assert cfg.model.test_cfg.mode == 'whole'
        assert [t.scale for t in cfg.test_dataloader.dataset.pipeline
                if t.type == 'Resize'] == [(2048, 1024)]
    if cfg.model.backbone.type == 'InLineDeiT':
        assert cfg.model.neck.type == 'MultiLevelNeck'


def _build(cfg):
    scope = cfg.default_scope
    model_cfg = copy.deepcopy(cfg.model)
    shrink_model(model_cfg)
    # no padding to a size divisor / crop size: the backbone sees odd sizes
    if scope == 'mmdet':
        model_cfg.data_preprocessor.pad_size_divisor = 1
    else:  # a training batch is padded to one (odd) size, a single test image not at all
        model_cfg.data_preprocessor.size = tuple(max(s) for s in zip(*ODD_SIZES))
        model_cfg.data_preprocessor.size_divisor = None
    return build_codebase_model(model_cfg, scope)


@pytest.mark.parametrize('path', CONFIGS)
def test_model_builds_and_runs_loss_and_predict_on_two_odd_sizes(path):
    cfg = _load(path)
    torch.manual_seed(0)
    model = _build(cfg)
    seg = cfg.default_scope == 'mmseg'
    num_classes = (cfg.model.decode_head.num_classes if seg else
                   cfg.model.roi_head.mask_head.num_classes)
    make_sample = seg_sample if seg else det_sample
    images = [torch.randint(0, 256, (3, *hw), dtype=torch.uint8) for hw in ODD_SIZES]
    samples = [make_sample(hw, num_classes, i) for i, hw in enumerate(ODD_SIZES)]

    model.train()
    data = model.data_preprocessor(dict(inputs=images, data_samples=samples), True)
    losses = model.loss(data['inputs'], data['data_samples'])
    total, _ = model.parse_losses(losses)  # what the runner's train_step optimizes
    assert torch.isfinite(total) and total > 0
    total.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    # DDP with find_unused_parameters=False (mmengine's default) needs a gradient, even a
    # zero one, for every trainable parameter of the model after each backward
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f'parameters without a gradient (DDP would fail): {no_grad}'

    model.eval()
    for image, sample, hw in zip(images, samples, ODD_SIZES):
        with torch.no_grad():
            data = model.data_preprocessor(dict(inputs=[image], data_samples=[sample]), False)
            assert tuple(data['inputs'].shape[-2:]) == hw
            feats = model.extract_feat(data['inputs'])
            assert all(torch.isfinite(f).all() for f in feats)
            # mmcv's RoIAlign reads its input as NCHW memory whatever the strides: a
            # channels-last feature map is pooled wrongly (box / mask heads then fail)
            assert all(f.is_contiguous() for f in feats)
            result = model.predict(data['inputs'], data['data_samples'])[0]
        if seg:
            assert tuple(result.pred_sem_seg.data.shape[-2:]) == hw
            assert result.pred_sem_seg.data.max() < num_classes
        else:
            pred = result.pred_instances
            assert pred.bboxes.shape[1] == 4 and len(pred.labels) == len(pred.scores)
            if len(pred):
                assert tuple(pred.masks.shape[-2:]) == hw


# keys of the shared schedules (configs/_base_/schedules/) written for every family: a
# family without such parameters (PVT has no relative position table) does not match them,
# so each must match in some config (the test after next); 'norm' is not among them: every
# family has norms
SHARED_KEYS = {'pos_embed', 'cls_token', 'relative_position_bias_table'}


def _custom_keys(cfg) -> dict:
    return dict(cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {}))


@functools.lru_cache(maxsize=None)
def _parameter_names(path):
    """The parameter names of the config's backbone as the whole model names them
    (``backbone.``), built on the meta device (no memory, no initialisation cost)."""
    backbone = copy.deepcopy(_load(path).model.backbone)
    backbone.pop('init_cfg', None)
    with torch.device('meta'):
        model = MODELS.build(backbone)
    return tuple(f'backbone.{name}' for name, _ in model.named_parameters())


@pytest.mark.parametrize('path', CONFIGS)
def test_custom_keys_match_a_parameter(path):
    """A custom_keys entry that matches no parameter changes nothing, silently (the CSWin
    stem norm trained with weight decay once its module was renamed)."""
    names = _parameter_names(path)
    keys = [k for k in _custom_keys(_load(path)) if k not in SHARED_KEYS]
    missed = [k for k in keys if not any(k in name for name in names)]
    assert not missed, f'custom_keys {missed} match no parameter of the model'


def test_shared_custom_keys_match_in_some_config():
    hits = {key: [path for path in CONFIGS if key in _custom_keys(_load(path)) and
                  any(key in name for name in _parameter_names(path))] for key in SHARED_KEYS}
    assert all(hits.values()), {k: v for k, v in hits.items() if not v}


def test_cswin_stem_norm_has_no_weight_decay():
    for path in CONFIGS:
        if 'cswin' in path:
            stem = [n for n in _parameter_names(path) if n.startswith('backbone.stages.0.'
                                                                       'downsample.2.')]
            keys = _custom_keys(_load(path))
            assert stem and all(any(k in n and keys[k].decay_mult == 0 for k in keys)
                                for n in stem), path

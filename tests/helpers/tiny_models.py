"""Shrinking the configs' models for CPU tests, and tiny run configs for the tools.

``shrink_model(cfg.model)`` keeps a config's architecture (detector / segmentor, heads,
block types of the backbone family) but swaps in a tiny backbone without pretrained
weights, narrow necks and heads, fewer proposals. ``det_run_config`` /
``seg_run_config`` write configs inheriting a real one, with that tiny model and the
synthetic shapes data, for runs of tools/.
"""
import os.path as osp
import pprint

from .paths import REPO  # noqa: E402,F401 (imported from here by the tests)

CONFIGS = osp.join(REPO, 'configs')
SHAPES = ('circle', 'square', 'triangle')

# The one table of the tiny models of the tests, per backbone family (tests/models/
# test_backbones.py checks that every registered family has an entry in each):
#
# TINY_BACKBONES: (tiny arch, extra backbone settings, channels of stage / block outputs);
# the backbones of the shrunk configs (``shrink_model``, the tool runs) and of the
# per-family tests (export, compile, with_cp, AMP, fast paths, bad input)
TINY_BACKBONES = {
    'InLinePVT': (dict(embed_dims=[16, 32, 64, 128], num_heads=[1, 2, 4, 8],
                       mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1]), {}, [16, 32, 64, 128]),
    # depth 3 in stage 3 keeps a softmax block in the mixed stage of 'IIMS2'
    'InLineSwinTransformer': (dict(embed_dim=16, depths=[1, 1, 3, 1], num_heads=[1, 2, 4, 8]),
                              {}, [16, 32, 64, 128]),
    'InLineCSWinTransformer': (dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]),
                               {}, [16, 32, 64, 128]),
    'InLineDeiT': (dict(embed_dim=32, depth=12, num_heads=2), dict(pretrain_img_size=64),
                   [32] * 12),
}
# SMALL_BACKBONES: narrower still, each with softmax or mixed blocks beside the InLine ones
# (block_types): the backbone contract at several input sizes (tests/models/test_backbones.py)
SMALL_BACKBONES = {
    'InLinePVT': dict(arch=dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 2, 2, 4],
                                mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 2, 1]),
                      block_types='IISI'),
    'InLineSwinTransformer': dict(arch=dict(embed_dim=8, depths=[1, 1, 3, 2],
                                            num_heads=[1, 2, 2, 4]), block_types='IIMS1'),
    'InLineCSWinTransformer': dict(arch=dict(embed_dim=8, depths=[1, 1, 2, 1],
                                             num_heads=[2, 2, 4, 4]), block_types='IISS'),
    'InLineDeiT': dict(arch=dict(embed_dim=16, depth=4, num_heads=2), out_indices=(1, 3)),
}
# TOOL_PVT: the InLine-PVT of the tool configs written by ``helpers.tool_configs`` (Mask
# R-CNN and Semantic FPN on mmdet's / mmseg's own bases)
TOOL_PVT = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                depths=[1, 1, 1, 1])


def config_files():
    """Every complete config under configs/ (not the ``_base_`` fragments), sorted."""
    import glob
    files = glob.glob(osp.join(CONFIGS, '**', '*.py'), recursive=True)
    return sorted(osp.relpath(f, REPO) for f in files
                  if '_base_' not in osp.relpath(f, CONFIGS).split(osp.sep))


def _preset_block_types(backbone: dict):
    """The block types the config's preset implies, kept when the arch becomes a dict."""
    if backbone.get('block_types') or not isinstance(backbone.get('arch'), str):
        return None
    import mmplugin_inline  # noqa: F401
    from mmplugin_inline.models.backbones.base import resolve_arch
    from mmplugin_inline.registry import MODELS
    family = MODELS.get(backbone['type'])
    return resolve_arch(backbone['arch'], family.arch_settings, family.__name__,
                        ()).get('block_types')


def shrink_backbone(backbone: dict) -> list:
    """Make ``backbone`` (a config dict, changed in place) tiny; return its out channels."""
    arch, extra, widths = TINY_BACKBONES[backbone['type']]
    block_types = _preset_block_types(backbone)
    if block_types:
        backbone['block_types'] = block_types
    backbone['arch'] = dict(arch)
    backbone.update(extra)
    backbone['init_cfg'] = None
    return [widths[i] for i in backbone.get('out_indices', range(4))]


WIDTH = 32  # channels of necks and heads in the shrunk models


def _as_list(x):
    return x if isinstance(x, list) else [x]


def _shrink_detector_heads(model: dict, num_classes) -> None:
    """Narrow FPN / RPN / RoI heads and sample fewer proposals (real heads, less work)."""
    model['neck']['out_channels'] = WIDTH
    model['rpn_head'].update(in_channels=WIDTH, feat_channels=WIDTH)
    roi = model['roi_head']
    roi['bbox_roi_extractor']['out_channels'] = WIDTH
    for head in _as_list(roi['bbox_head']):
        head.update(in_channels=WIDTH, fc_out_channels=2 * WIDTH)
        if head.get('num_shared_convs'):
            head['conv_out_channels'] = WIDTH
        if num_classes:
            head['num_classes'] = num_classes
    if roi.get('mask_head'):
        roi['mask_roi_extractor']['out_channels'] = WIDTH
        roi['mask_head'].update(in_channels=WIDTH, conv_out_channels=WIDTH)
        if num_classes:
            roi['mask_head']['num_classes'] = num_classes
    train, test = model['train_cfg'], model['test_cfg']
    train['rpn_proposal'].update(nms_pre=200, max_per_img=100)
    for rcnn in _as_list(train['rcnn']):
        rcnn['sampler']['num'] = 64
    test['rpn'].update(nms_pre=200, max_per_img=100)


def _shrink_segmentor_heads(model: dict, channels: list, num_classes) -> None:
    """Wire the decode / auxiliary heads to the tiny backbone (or neck), narrowed."""
    neck, head, aux = model.get('neck'), model['decode_head'], model.get('auxiliary_head')
    if neck is None:
        feats = channels
    elif neck['type'] == 'MultiLevelNeck':
        neck.update(in_channels=channels, out_channels=channels[0])
        feats = [channels[0]] * len(neck.get('scales', channels))
    else:  # FPN
        neck.update(in_channels=channels, out_channels=WIDTH)
        feats = [WIDTH] * neck.get('num_outs', len(channels))
    head['in_channels'] = [feats[i] for i in head.get('in_index', range(len(feats)))]
    head['channels'] = WIDTH
    for h in [head] + ([aux] if aux else []):
        if num_classes:
            h['num_classes'] = num_classes
    if aux:
        aux.update(in_channels=feats[aux.get('in_index', -1)], channels=WIDTH // 2)


def shrink_model(model: dict, num_classes=None) -> None:
    """A tiny version of a config's model, changed in place.

    Tiny backbone of the same family and block types without pretrained weights,
    narrow necks and heads of the same types, fewer proposals; ``num_classes`` (when
    given) for every head.
    """
    model.pop('pretrained', None)
    channels = shrink_backbone(model['backbone'])
    if 'decode_head' in model:
        _shrink_segmentor_heads(model, channels, num_classes)
        return
    if model['neck']['type'] == 'SimpleFeaturePyramid':
        model['neck']['in_channels'] = channels[-1]
    else:
        model['neck']['in_channels'] = channels
    _shrink_detector_heads(model, num_classes)


def _fmt(value) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def det_run_config(base: str, data_root: str, epochs: int = 1, batch_size: int = 2) -> str:
    """Text of a Mask R-CNN run config on the shapes set: tiny model, small images."""
    from mmengine.config import Config
    model = Config.fromfile(base).model.to_dict()
    shrink_model(model, num_classes=len(SHAPES))
    pipeline_train = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='Resize', scale=(128, 128), keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs')]
    pipeline_test = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(128, 128), keep_ratio=True),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                              'scale_factor'))]

    def loader(split, pipeline, shuffle, batch):
        return dict(batch_size=batch, num_workers=0, persistent_workers=False,
                    sampler=dict(type='DefaultSampler', shuffle=shuffle),
                    dataset=dict(data_root=data_root, metainfo=dict(classes=SHAPES),
                                 ann_file=f'annotations/instances_{split}.json',
                                 data_prefix=dict(img=f'images/{split}/'), pipeline=pipeline))
    ann_val = osp.join(data_root, 'annotations/instances_validation.json')
    return f"""_base_ = {base!r}
model = {_fmt(dict(model, _delete_=True))}
train_dataloader = {_fmt(loader('training', pipeline_train, True, batch_size))}
val_dataloader = {_fmt(loader('validation', pipeline_test, False, 2))}
test_dataloader = val_dataloader
val_evaluator = dict(ann_file={ann_val!r}, metric=['bbox', 'segm'])
test_evaluator = val_evaluator
train_cfg = dict(max_epochs={epochs}, val_interval=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
log_processor = dict(window_size=1)
env_cfg = dict(mp_cfg=dict(mp_start_method='fork'))
"""


def seg_run_config(base: str, data_root: str, iters: int = 2) -> str:
    """Text of an UperNet run config on the shapes set: tiny model, 64x64 crops."""
    from mmengine.config import Config
    model = Config.fromfile(base).model.to_dict()
    shrink_model(model, num_classes=len(SHAPES))
    crop = (64, 64)
    model['data_preprocessor']['size'] = crop
    pipeline_train = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='Resize', scale=(96, 96), keep_ratio=True),
        dict(type='RandomCrop', crop_size=crop, cat_max_ratio=0.75),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackSegInputs')]
    pipeline_test = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(96, 96), keep_ratio=True),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='PackSegInputs')]

    def loader(split, pipeline, sampler, batch):
        return dict(batch_size=batch, num_workers=0, persistent_workers=False, sampler=sampler,
                    # ADE20KDataset fixes its 150 classes; BaseSegDataset with ADE20K's
                    # suffixes and reduce_zero_label reads the same layout
                    dataset=dict(type='BaseSegDataset', data_root=data_root,
                                 img_suffix='.jpg', seg_map_suffix='.png',
                                 reduce_zero_label=True,
                                 metainfo=dict(classes=SHAPES,
                                               palette=[[220, 20, 60], [0, 130, 200],
                                                        [60, 180, 75]]),
                                 data_prefix=dict(img_path=f'images/{split}',
                                                  seg_map_path=f'annotations/{split}'),
                                 pipeline=pipeline))
    return f"""_base_ = {base!r}
model = {_fmt(dict(model, _delete_=True))}
train_dataloader = {_fmt(loader('training', pipeline_train,
                                dict(type='InfiniteSampler', shuffle=True), 2))}
val_dataloader = {_fmt(loader('validation', pipeline_test,
                              dict(type='DefaultSampler', shuffle=False), 1))}
test_dataloader = val_dataloader
train_cfg = dict(max_iters={iters}, val_interval={iters})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval={iters}))
log_processor = dict(window_size=1)
env_cfg = dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method='fork'))
"""

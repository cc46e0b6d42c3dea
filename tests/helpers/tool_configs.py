"""Config files for the tool tests: real mmdet / mmseg bases, InLine backbones, shrunk.

Each function writes a config into a directory and returns its path, so the tools
are exercised as users run them (``Config.fromfile`` with ``mmdet::`` / ``mmseg::``
inheritance and ``custom_imports``).
"""
import os

from .tiny_models import TOOL_PVT

PLUGIN = "custom_imports = dict(imports=['mmplugin_inline'], allow_failed_imports=False)\n"
TINY_PVT = repr(dict(type='InLinePVT', init_cfg=None, arch=TOOL_PVT))  # helpers.tiny_models


def _write(directory, name, text):
    path = os.path.join(str(directory), name)
    with open(path, 'w') as f:
        f.write(text)
    return path


def mask_rcnn_inline_pvt_t(directory):
    """Mask R-CNN 1x COCO with InLine-PVT-T: the full-size model of the short-name config."""
    return _write(directory, 'mask_rcnn_inline_pvt_t.py', (
        "_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'\n" + PLUGIN +
        "model = dict(\n"
        "    backbone=dict(_delete_=True, type='InLinePVT', arch='t', init_cfg=None),\n"
        "    neck=dict(in_channels=[64, 128, 320, 512]))\n"))


def tiny_mask_rcnn(directory):
    """Mask R-CNN with a two-digit-width InLine-PVT and thin neck / heads."""
    return _write(directory, 'tiny_mask_rcnn.py', (
        "_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'\n" + PLUGIN +
        f"model = dict(\n    backbone=dict(_delete_=True, **{TINY_PVT}),\n"
        f"    neck=dict(in_channels={TOOL_PVT['embed_dims']}, out_channels=32),\n"
        "    rpn_head=dict(in_channels=32, feat_channels=32),\n"
        "    roi_head=dict(\n"
        "        bbox_roi_extractor=dict(out_channels=32),\n"
        "        bbox_head=dict(in_channels=32, fc_out_channels=64),\n"
        "        mask_roi_extractor=dict(out_channels=32),\n"
        "        mask_head=dict(in_channels=32, conv_out_channels=32)))\n"))


def tiny_sem_fpn(directory):
    """Semantic FPN on ADE20K (150 classes) with a two-digit-width InLine-PVT."""
    return _write(directory, 'tiny_sem_fpn.py', (
        "_base_ = 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py'\n" + PLUGIN +
        f"model = dict(\n    pretrained=None,\n    backbone=dict(_delete_=True, **{TINY_PVT}),\n"
        f"    neck=dict(in_channels={TOOL_PVT['embed_dims']}, out_channels=32),\n"
        "    decode_head=dict(in_channels=[32, 32, 32, 32], channels=32))\n"))


def resumable_mask_rcnn(directory, data_root, max_iters, interval,
                        name='resumable_mask_rcnn.py'):
    """The tiny Mask R-CNN of ``det_run_config`` on the shapes set, 1 image per step, in an
    ``IterBasedTrainLoop`` of ``max_iters`` with a checkpoint every ``interval``
    iterations, a warm-up that a resumed run must continue, and validation at
    ``2 * interval`` (right after a checkpoint) and at the end. No ``randomness``: the
    runs pass it with ``--cfg-options``."""
    from .runs import DET_CONFIG
    from .tiny_models import det_run_config
    return _write(directory, name, det_run_config(DET_CONFIG, data_root, batch_size=1) + f"""
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={max_iters},
                 val_interval={2 * interval})
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=10)]
default_hooks['checkpoint'] = dict(type='CheckpointHook', by_epoch=False, interval={interval})
log_processor = dict(by_epoch=False, window_size=1)
""")

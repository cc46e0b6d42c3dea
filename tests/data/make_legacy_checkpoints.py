"""Write the plugin's own files of release 0.x (``tests/data/legacy/``), with that release.

Run once, by hand, from a checkout of the release whose files the tests must keep
reading (the module tree before the stages were unified), e.g.::

    cd /path/to/old/checkout && PYTHONPATH=$PWD .venv/bin/python \\
        /path/to/new/tests/data/make_legacy_checkpoints.py /path/to/new/tests/data/legacy

It writes, from a fixed seed:

* ``<short_name>_small.pth``, one per family: ``backbone.state_dict()`` of a small model
  (the SMALL_BACKBONES of ``tests/helpers/tiny_models.py``, narrower still so that the
  files stay small: softmax or mixed blocks beside the InLine ones, output norms), every
  parameter moved off its initial value;
* ``fpn_<short_name>_iter_1.pth`` for PVT and Swin: a whole mmseg segmentor (Semantic
  FPN, narrow) after one AdamW step, saved as mmengine's ``Runner.save_checkpoint``
  lays a run's checkpoint out (``meta``, ``state_dict``, ``message_hub``, ``optimizer``,
  ``param_schedulers``); the Swin one with per-parameter groups (``paramwise_cfg``);
* ``outputs.pt``: the input (fixed, odd size) and per file, the config it was built
  from and the outputs of the model in eval mode on that input (backbone maps;
  segmentor: backbone maps and the decode head's logits).
"""
import copy
import os
import sys
import time

import torch

SMALL_BACKBONES = {
    'InLinePVT': dict(arch=dict(embed_dims=[4, 8, 12, 16], num_heads=[1, 2, 2, 4],
                                mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 2, 1]),
                      block_types='IISI', pretrain_img_size=64),
    'InLineSwinTransformer': dict(arch=dict(embed_dim=4, depths=[1, 1, 3, 2],
                                            num_heads=[1, 2, 2, 4]), block_types='IIMS1',
                                  mlp_ratio=2.0),
    'InLineCSWinTransformer': dict(arch=dict(embed_dim=4, depths=[1, 1, 2, 1],
                                             num_heads=[2, 2, 4, 4]), block_types='IISS',
                                   mlp_ratio=2.0),
    'InLineDeiT': dict(arch=dict(embed_dim=16, depth=4, num_heads=2), out_indices=(1, 3),
                       final_norm=True, pretrain_img_size=64, mlp_ratio=2.0),
}
SEGMENTORS = {  # family: (paramwise optimizer groups, shallower backbone settings)
    'InLinePVT': (False, dict(arch=dict(SMALL_BACKBONES['InLinePVT']['arch'],
                                        depths=[1, 1, 1, 1]))),
    'InLineSwinTransformer': (True, dict(arch=dict(SMALL_BACKBONES['InLineSwinTransformer'][
        'arch'], depths=[1, 1, 1, 2]), block_types='IISS')),
}


def fixed_input():
    """The input of every recorded output: one image of an odd size."""
    return torch.randn(1, 3, 45, 59, generator=torch.Generator().manual_seed(4))


def _perturb(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def backbone_cfg(family, **overrides):
    return dict(type=f'mmplugin_inline.{family}', init_cfg=None, drop_path_rate=0.0,
                **dict(copy.deepcopy(SMALL_BACKBONES[family]), **overrides))


def segmentor_cfg(family, channels):
    paramwise, overrides = SEGMENTORS[family]
    return dict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53],
                               std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_val=0,
                               seg_pad_val=255, size=(64, 64)),
        backbone=backbone_cfg(family, **overrides),
        neck=dict(type='FPN', in_channels=channels, out_channels=8, num_outs=4),
        decode_head=dict(type='FPNHead', in_channels=[8, 8, 8, 8], in_index=[0, 1, 2, 3],
                         feature_strides=[4, 8, 16, 32], channels=8, dropout_ratio=0.1,
                         num_classes=3, norm_cfg=dict(type='BN', requires_grad=True),
                         align_corners=False,
                         loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                          loss_weight=1.0)),
        train_cfg=dict(), test_cfg=dict(mode='whole'))


def optim_cfg(paramwise):
    cfg = dict(type='OptimWrapper',
               optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01))
    if paramwise:
        cfg['paramwise_cfg'] = dict(custom_keys={
            'relative_position_bias_table': dict(decay_mult=0.), 'norm': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.)})
    return cfg


def seg_batch(seed):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    gen = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(2):
        inputs.append(torch.randint(0, 256, (3, 64, 64), generator=gen, dtype=torch.uint8))
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 3, (1, 64, 64), generator=gen))
        sample.set_metainfo(dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def save_segmentor(family, out_dir, records):
    from mmengine.config import Config
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper
    from mmengine.optim.scheduler import PolyLR
    from mmengine.runner.checkpoint import get_state_dict, save_checkpoint, weights_to_cpu
    from mmseg.registry import MODELS as SEG_MODELS
    from mmseg.utils import register_all_modules
    register_all_modules()
    from mmplugin_inline.registry import MODELS
    backbone = MODELS.build(backbone_cfg(family, **SEGMENTORS[family][1]))
    channels = [o.shape[1] for o in backbone.eval()(torch.zeros(1, 3, 64, 64))]
    cfg = segmentor_cfg(family, channels)
    torch.manual_seed(1)
    model = SEG_MODELS.build(cfg)
    model.init_weights()
    _perturb(model, 2)
    paramwise = SEGMENTORS[family][0]
    optim = build_optim_wrapper(model, optim_cfg(paramwise))
    scheduler = PolyLR(optim.optimizer, eta_min=0.0, power=0.9, begin=0, end=100,
                       by_epoch=False)
    hub = MessageHub.get_instance(f'legacy_{family}')
    model.train()
    log_vars = model.train_step(seg_batch(3), optim)
    scheduler.step()
    hub.update_info('iter', 1)
    hub.update_info('epoch', 0)
    hub.update_info('max_iters', 100)
    for name, value in log_vars.items():
        hub.update_scalar(f'train/{name}', float(value))
    full_cfg = dict(model=cfg, optim_wrapper=optim_cfg(paramwise),
                    param_scheduler=[dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0,
                                          end=100, by_epoch=False)],
                    default_scope='mmseg', custom_imports=dict(imports=['mmplugin_inline'],
                                                               allow_failed_imports=False))
    meta = dict(epoch=0, iter=1, cfg=Config(full_cfg).pretty_text, seed=0,
                experiment_name=f'fpn_{family}_legacy',
                time=time.strftime('%Y%m%d_%H%M%S', time.localtime(0)),
                mmengine_version=__import__('mmengine').__version__,
                dataset_meta=dict(classes=('circle', 'square', 'triangle')))
    checkpoint = dict(meta=meta, state_dict=weights_to_cpu(get_state_dict(model)),
                      message_hub=hub.state_dict(), optimizer=optim.state_dict(),
                      param_schedulers=[scheduler.state_dict()])
    name = f'fpn_{type(backbone).short_name}_iter_1.pth'
    save_checkpoint(checkpoint, os.path.join(out_dir, name))
    model.eval()
    x = fixed_input()
    with torch.no_grad():
        feats = model.backbone(x)
        logits = model._forward(x)
    records[name] = dict(family=family, cfg=cfg, optim=optim_cfg(paramwise),
                         backbone_outputs=list(feats), logits=logits)


def save_backbone(family, out_dir, records, seed):
    from mmplugin_inline.registry import MODELS
    torch.manual_seed(seed)
    cfg = backbone_cfg(family)
    model = MODELS.build(cfg)
    model.init_weights()
    _perturb(model, seed + 100)
    model.eval()
    name = f'{type(model).short_name}_small.pth'
    torch.save(model.state_dict(), os.path.join(out_dir, name))
    x = fixed_input()
    with torch.no_grad():
        outs = model(x)
    records[name] = dict(family=family, cfg=cfg, outputs=list(outs))


def main(out_dir):
    import mmplugin_inline  # noqa: F401  (the release being recorded)
    os.makedirs(out_dir, exist_ok=True)
    records = {}
    for i, family in enumerate(SMALL_BACKBONES):
        save_backbone(family, out_dir, records, seed=10 * i)
    for family in SEGMENTORS:
        save_segmentor(family, out_dir, records)
    torch.save(dict(release=mmplugin_inline.__version__, input=fixed_input(), files=records),
               os.path.join(out_dir, 'outputs.pt'))
    return out_dir


if __name__ == '__main__':
    print(main(sys.argv[1] if len(sys.argv) > 1 else
               os.path.join(os.path.dirname(os.path.abspath(__file__)), 'legacy')))

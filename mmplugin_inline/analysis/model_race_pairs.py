"""The whole-model race's pairs (:mod:`mmplugin_inline.analysis.model_race`): our config,
the same model with the softmax backbone of the same size, and their configs with random
weights."""
import copy
import os.path as osp
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Pair:
    """Two whole models that differ only in the backbone.

    Attributes:
        key: the name on the command line.
        ours: our model's name in tables.
        peer: the softmax model's name in tables.
        config: our config, relative to the plugin's ``configs/``.
        peer_backbone: the backbone config that replaces ours in the peer.
        channels: the backbone's output channels, which both models share (what the
            config's neck / head take).
    """
    key: str
    ours: str
    peer: str
    config: str
    peer_backbone: dict
    channels: Tuple[int, ...]


#: mmseg's Swin-T as its UperNet configs build it (``_base_/models/upernet_swin.py`` with
#: ``swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py``)
SWIN_T = dict(type='SwinTransformer', pretrain_img_size=224, embed_dims=96, patch_size=4,
              window_size=7, mlp_ratio=4, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
              strides=(4, 2, 2, 2), out_indices=(0, 1, 2, 3), qkv_bias=True, qk_scale=None,
              patch_norm=True, drop_rate=0., attn_drop_rate=0., drop_path_rate=0.3,
              use_abs_pos_embed=False, act_cfg=dict(type='GELU'),
              norm_cfg=dict(type='LN', requires_grad=True))
#: mmdet's PVT-T as ``mask-rcnn_pvt-t-p4_fpn_1x_coco.py`` builds it (the class defaults
#: are PVT-T's widths, heads, reductions and MLP ratios; depths 2-2-2-2)
PVT_T = dict(type='PyramidVisionTransformer', num_layers=[2, 2, 2, 2], drop_path_rate=0.1,
             out_indices=(0, 1, 2, 3))

PAIRS = {pair.key: pair for pair in (
    Pair('upernet-swin', 'UperNet InLine-Swin-T', 'UperNet Swin-T',
         'inline_swin/upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py', SWIN_T,
         (96, 192, 384, 768)),
    # mmseg has no PVT: mmdet's, from the mmseg registry across scopes
    Pair('fpn-pvt', 'Semantic FPN InLine-PVT-T', 'Semantic FPN PVT-T',
         'inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py',
         dict(PVT_T, type='mmdet.PyramidVisionTransformer'), (64, 128, 320, 512)),
    Pair('mask-rcnn-pvt', 'Mask R-CNN InLine-PVT-T', 'Mask R-CNN PVT-T',
         'inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py', PVT_T, (64, 128, 320, 512)),
)}


def config_root() -> str:
    """The plugin's ``configs/``: in an installed package's ``.mim/``, else beside the
    package in a source checkout."""
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    for root in (osp.join(package, '.mim', 'configs'), osp.join(osp.dirname(package), 'configs')):
        if osp.isdir(root):
            return root
    raise FileNotFoundError(f'no configs/ in {package}/.mim or beside {package}')


def backbone_channels(model_cfg: dict) -> Tuple[int, ...]:
    """The backbone channels a config's neck (or, without one, decode head) takes."""
    taker = model_cfg.get('neck') or model_cfg['decode_head']
    return tuple(taker['in_channels'])


def pair_configs(pair: Pair, root: Optional[str] = None):
    """Our config and the peer's (mmengine Configs), both with random weights.

    The peer is ours with ``pair.peer_backbone`` in place of the backbone. Every
    ``init_cfg`` of the backbones and the model's ``pretrained`` are None, so building
    or initialising reads nothing.
    """
    from ..tools_common import load_config
    ours = load_config(osp.join(root or config_root(), pair.config))
    if backbone_channels(ours.model) != tuple(pair.channels):
        raise ValueError(f'{pair.config} takes backbone channels {backbone_channels(ours.model)}'
                         f', but {pair.key} races backbones of {pair.channels}')
    if 'pretrained' in ours.model:
        ours.model.pretrained = None
    ours.model.backbone.init_cfg = None
    peer = copy.deepcopy(ours)
    peer.model.backbone = dict(pair.peer_backbone, init_cfg=None)
    return ours, peer


def num_classes_of(model_cfg: dict) -> int:
    """Classes of a segmentor's decode head or of a detector's box head."""
    if 'decode_head' in model_cfg:
        return model_cfg['decode_head']['num_classes']
    head = model_cfg['roi_head']['bbox_head']
    return (head[0] if isinstance(head, (list, tuple)) else head)['num_classes']

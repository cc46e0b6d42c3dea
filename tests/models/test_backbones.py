"""The backbone contract: shapes at any size, freezing, checkpointing, gradients, errors,
and the released checkpoints' key sets."""
import os
import re

import pytest
import torch

from helpers.paths import DATA as TEST_DATA
from helpers.tiny_models import SMALL_BACKBONES as SMALL
from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.models.backbones.base import preset_key
from mmplugin_inline.registry import MODELS, registered_families
from mmplugin_inline.weights import convert_checkpoint

DATA = os.path.join(TEST_DATA, 'reference', 'state_dict_keys')
FAMILIES = sorted(registered_families())

STRIDES = {'InLineDeiT': [16, 16]}
SIZES = [(224, 224), (112, 137), (511, 511)]


def test_every_registered_family_has_test_sizes():
    assert sorted(SMALL) == FAMILIES and sorted(TINY_BACKBONES) == FAMILIES


def build(name, **kw):
    cfg = dict(type=name, drop_path_rate=0.0)
    cfg.update(SMALL[name])
    cfg.update(kw)
    return MODELS.build(cfg)


def channels(model):
    dims = model.embed_dims
    return [dims] * len(model.out_indices) if isinstance(dims, int) else \
        [dims[i] for i in model.out_indices]


@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('hw', SIZES)
def test_output_shapes_and_strides_at_any_size(name, hw):
    model = build(name).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    strides = STRIDES.get(name, [4, 8, 16, 32])
    assert len(outs) == len(strides)
    for out, c, s in zip(outs, channels(model), strides):
        expect = tuple(-(-x // s) for x in hw)  # padded inside: ceil(H / stride)
        assert out.shape == (1, c, *expect)
        assert torch.isfinite(out).all()
        assert out.is_contiguous()  # NCHW memory: mmcv's RoIAlign ignores strides


@pytest.mark.parametrize('name', FAMILIES)
def test_every_parameter_gets_a_gradient(name):
    model = build(name).train()
    outs = model(torch.randn(2, 3, 67, 45))
    sum(o.square().mean() for o in outs).backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and
               (p.grad is None or p.grad.abs().sum() == 0)]
    assert no_grad == []  # DDP with find_unused_parameters=False needs every one


@pytest.mark.parametrize('name', FAMILIES)
def test_with_cp_gives_same_outputs_and_gradients(name):
    torch.manual_seed(0)
    ref = build(name).train()
    cp = build(name, with_cp=True).train()
    cp.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 61, 75)
    outs = [m(x) for m in (ref, cp)]
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b)
    for o in outs:
        sum(t.sum() for t in o).backward()
    for (n, p), (_, q) in zip(ref.named_parameters(), cp.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


@pytest.mark.parametrize('name', FAMILIES)
def test_frozen_stages_have_no_grad_even_after_train(name):
    model = build(name, frozen_stages=1)
    model.train()
    frozen = [m for group in model.stage_modules()[:2] for m in group]
    frozen_params = set()
    for m in frozen:
        ps = [m] if isinstance(m, torch.nn.Parameter) else list(m.parameters())
        frozen_params.update(id(p) for p in ps)
        if not isinstance(m, torch.nn.Parameter):
            assert not m.training
    assert frozen_params
    for p in model.parameters():
        assert p.requires_grad == (id(p) not in frozen_params)
    outs = model(torch.randn(1, 3, 64, 64))
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is None for p in model.parameters() if id(p) in frozen_params)


def test_norm_eval_keeps_batchnorm_in_eval():
    model = build('InLinePVT', norm_eval=True)
    model.bn = torch.nn.BatchNorm2d(4)  # a configured BN anywhere in the backbone
    model.train()
    assert not model.bn.training and model.stages[0].training


@pytest.mark.parametrize('name', FAMILIES)
def test_inputs_smaller_than_a_window_or_a_patch(name):
    model = build(name).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 9, 40))
    assert all(torch.isfinite(o).all() for o in outs)


def test_inline_blocks_in_windows_for_ablation():
    model = build('InLineSwinTransformer', inline_window=7).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 100, 70))
    assert outs[0].shape == (1, 8, 25, 18)


# -- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize('name,kw,match', [
    ('InLinePVT', dict(arch='xl'), 'unknown arch'),
    ('InLineSwinTransformer', dict(arch='q'), 'unknown arch'),
    ('InLinePVT', dict(block_types='III'), 'one letter per stage'),
    ('InLineCSWinTransformer', dict(block_types='IIXS'), r"\['X'\]"),
    ('InLineSwinTransformer', dict(block_types='IIMS'), 'number of InLine blocks'),
    ('InLinePVT', dict(block_types='IIIII'), '5 letters for 4 stages'),
    ('InLinePVT', dict(arch=dict(embed_dims=[8, 16, 24, 32], num_heads=[3, 2, 2, 4],
                                 mlp_ratios=[2] * 4, depths=[1] * 4)), 'must divide the width'),
    ('InLineDeiT', dict(arch=dict(embed_dim=16, depth=4, num_heads=5)), 'must divide the width'),
    ('InLineDeiT', dict(arch=dict(embed_dim=16, depth=2)), 'lacks'),
    ('InLinePVT', dict(out_indices=(4,)), 'out of range'),
    ('InLineDeiT', dict(final_norm=True, out_indices=(1,)), 'final_norm'),
])
def test_bad_configurations_are_named(name, kw, match):
    with pytest.raises(ValueError, match=match):
        build(name, **kw)


@pytest.mark.parametrize('name', FAMILIES)
def test_wrong_input_channels_are_named(name):
    with pytest.raises(ValueError, match=r'\[B, 3, H, W\]'):
        build(name)(torch.randn(1, 4, 32, 32))


# -- the released checkpoints' keys ------------------------------------------------------------

def _key_lists():
    """``{model name: (family, arch name)}`` of the key lists, ``<short_name>_<arch>.txt``."""
    by_short_name = {cls.short_name: name for name, cls in registered_families().items()}
    lists = {}
    for file_name in os.listdir(DATA):
        model_name = file_name[:-len('.txt')]
        short_name, arch = model_name.rsplit('_', 1)
        lists[model_name] = (by_short_name[short_name], arch)
    return lists


RELEASED = _key_lists()


def test_every_released_model_has_a_key_list():
    listed = sorted((family, preset_key(arch)) for family, arch in RELEASED.values())
    assert listed == sorted((name, arch) for name, cls in registered_families().items()
                            for arch in cls.released_weights)


def read_key_list(model_name):
    with open(os.path.join(DATA, f'{model_name}.txt')) as f:
        header, *lines = f.read().splitlines()
    sd = {}
    for line in lines:
        key, shape = re.match(r'^(\S+) \[(.*)\]$', line).groups()
        sd[key] = torch.empty([int(s) for s in shape.split(', ') if s], device='meta')
    return header, sd


@pytest.mark.parametrize('model_name', sorted(RELEASED))
def test_released_checkpoint_keys_and_shapes_match_the_presets(model_name):
    family, arch = RELEASED[model_name]
    header, released = read_key_list(model_name)
    with torch.device('meta'):
        model = MODELS.build(dict(type=family, arch=arch))
    sd = model.adapt_pretrained(convert_checkpoint({'model': released}, family))
    own = model.state_dict()
    assert sorted(set(sd) - set(own)) == []
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(own[k].shape) for k in sd}
    # only per-output norms are new: those of the inner stages (the released final norm
    # becomes the last one), or all four for PVT, whose released model has no final norm
    # (each stage's output norm: stages.<i>.norm)
    new_norms = r'stages\.[0-3]\.norm' if family == 'InLinePVT' else r'stages\.[0-2]\.norm'
    assert all(re.fullmatch(new_norms + r'\.(weight|bias)', k) for k in set(own) - set(sd))
    # the preset has the released parameter count (the header's, minus the classifier)
    n_released = float(re.search(r'([\d.]+)M parameters', header).group(1)) * 1e6
    n_head = sum(v.numel() for k, v in released.items() if k.startswith('head.'))
    n_new = sum(own[k].numel() for k in set(own) - set(sd))
    n_ours = sum(p.numel() for p in model.parameters())
    assert abs(n_ours - n_new + n_head - n_released) < 0.006e6


def test_simple_feature_pyramid_on_deit_gives_strides_4_to_64():
    backbone = build('InLineDeiT').eval()
    neck = MODELS.build(dict(type='SimpleFeaturePyramid', in_channels=16, out_channels=8))
    hw = (128, 160)  # mmdet pads detector inputs to multiples of 32
    with torch.no_grad():
        outs = neck(backbone(torch.randn(1, 3, *hw)))
    assert len(outs) == 5
    for out, stride in zip(outs, (4, 8, 16, 32, 64)):
        expect = tuple(-(-x // stride) for x in hw)
        assert out.shape == (1, 8, *expect), stride
        assert out.is_contiguous()  # for RoIAlign


class _ZeroKernels(torch.nn.Module):
    """A stand-in for the local residual's kernel predictor: all kernels zero."""

    def forward(self, mean_token):
        return mean_token.new_zeros(*mean_token.shape, 3, 3)


@pytest.mark.parametrize('name', FAMILIES)
def test_a_module_swapped_in_through_named_modules_is_the_one_that_runs(name):
    """What tools that swap child modules do (LoRA injection, FSDP wrapping, quantisation
    preparation, a user's hook): every local-residual predictor replaced by name, through
    ``named_modules``, by one whose output is zero. The output must change, and equal a
    model built without the local residual (same weights otherwise)."""
    from mmplugin_inline.models.layers import Mixer, ResidualKernelPredictor
    torch.manual_seed(0)
    model = build(name).eval()
    bare = build(name, local_residual=False).eval()
    bare.load_state_dict({k: v for k, v in model.state_dict().items() if 'residual' not in k})
    x = torch.randn(1, 3, 61, 83)
    with torch.no_grad():
        before = model(x)
    paths = [path for path, m in model.named_modules() if isinstance(m, ResidualKernelPredictor)]
    assert paths and all(path.endswith('.mixer.residual') for path in paths)
    for path in paths:
        parent, _, leaf = path.rpartition('.')
        setattr(model.get_submodule(parent), leaf, _ZeroKernels())
    called = []
    for m in model.modules():
        if isinstance(m, Mixer):  # hooks on a mixer run: it is in the tree
            m.register_forward_hook(lambda *args: called.append(1))
    with torch.no_grad():
        after, without = model(x), bare(x)
    assert called
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(after, before))
    for a, b in zip(after, without):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize('arch, timm_name', [
    ('deit-t', 'vit_tiny_patch16_224'),
    pytest.param('deit-s', 'vit_small_patch16_224', marks=pytest.mark.slow)])
def test_the_paper_softmax_deit_baselines_are_timm_vits(arch, timm_name):
    """``arch='deit-t'`` is the paper's softmax DeiT-T (3 heads; ``arch='t'`` with softmax
    blocks keeps InLine-DeiT-T's 6): timm's model with the same weights, copied through
    the family's checkpoint filter, gives the same tokens."""
    timm = pytest.importorskip('timm')
    from mmplugin_inline.weights import convert_state_dict
    torch.manual_seed(0)
    theirs = timm.create_model(timm_name, pretrained=False).eval()
    ours = MODELS.build(dict(type='InLineDeiT', arch=arch, out_indices=(-1,), final_norm=True,
                             drop_path_rate=0.0)).eval()
    assert all(blk.attn.attn_type == 'S' and blk.attn.num_heads == theirs.blocks[0].attn.num_heads
               for stage in ours.stages for blk in stage.blocks)
    sd = convert_state_dict(theirs.state_dict(), 'InLineDeiT', ours)
    ours.load_state_dict(sd)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = theirs.forward_features(x)                          # [1, 1 + 196, C], normed
        _, hw, final = ours.forward_tokens(x)
        tokens = ours.norm(final)
        maps = ours(x)[-1]
    torch.testing.assert_close(tokens, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(maps, expected[:, 1:].transpose(1, 2).reshape(maps.shape),
                               rtol=1e-4, atol=1e-4)
    inline_t = MODELS.build(dict(type='InLineDeiT', arch='t', block_types='S'))
    assert inline_t.stages[0].blocks[0].attn.num_heads == 6

"""Selective recomputation (``with_cp`` = False / True / 'mlp' / 'attn') in every family:
the same outputs and gradients as without, less kept for the backward, clear errors."""
import pytest
import torch

from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.models.backbones.base import InLineBackbone
from mmplugin_inline.models.layers import WITH_CP_MODES
from mmplugin_inline.registry import MODELS, registered_families

FAMILIES = sorted(registered_families())
MODES = (True, 'mlp', 'attn')


def build(name, **kw):
    arch, extra, _ = TINY_BACKBONES[name]
    torch.manual_seed(0)
    # drop-path on: the recomputation must draw the same masks as the forward did
    return MODELS.build(dict(type=name, arch=dict(arch), drop_path_rate=0.2, **extra, **kw))


def run(model, x, seed=1):
    torch.manual_seed(seed)
    outs = model(x)
    sum((o * torch.linspace(-1, 1, o.shape[1]).view(1, -1, 1, 1)).sum() for o in outs).backward()
    return outs


@pytest.mark.parametrize('name', FAMILIES)
def test_every_mode_gives_the_plain_outputs_and_gradients(name):
    x = torch.randn(1, 3, 61, 75)
    ref = build(name).train()
    ref_outs = run(ref, x)
    for mode in MODES:
        model = build(name, with_cp=mode).train()
        model.load_state_dict(ref.state_dict())
        outs = run(model, x)
        for a, b in zip(ref_outs, outs):
            torch.testing.assert_close(a, b, msg=f'with_cp={mode!r}')
        for (n, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=f'with_cp={mode!r}: {n}')


def saved_bytes(model, x):
    """Bytes the forward keeps for the backward outside recomputed parts."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total[0]


@pytest.mark.parametrize('name', FAMILIES)
def test_each_mode_keeps_less_and_the_whole_block_least(name):
    x = torch.randn(1, 3, 64, 64)
    model = build(name).train()
    kept = {}
    for mode in (False,) + MODES:
        model.with_cp = mode
        kept[mode] = saved_bytes(model, x)
    assert kept['mlp'] < kept[False] and kept['attn'] < kept[False]
    assert kept[True] < min(kept['mlp'], kept['attn'])


@pytest.mark.parametrize('bad', ['full', 'MLP', 1, None, ('mlp',)])
def test_a_bad_value_is_refused_naming_the_allowed_ones(bad):
    with pytest.raises(ValueError, match=r"InLinePVT: with_cp must be one of False, True, "
                                         r"'attn' or 'mlp'.*got"):
        build('InLinePVT', with_cp=bad)


@pytest.mark.parametrize('name', FAMILIES)
def test_every_family_documents_with_cp_once_on_the_shared_base(name):
    # the values are written once, on InLineBackbone; a family points there
    doc = ' '.join(MODELS.get(name).__doc__.split())
    assert 'with_cp (bool | str): see :class:`InLineBackbone`' in doc
    base = ' '.join(InLineBackbone.__doc__.split())
    for mode in WITH_CP_MODES:
        assert f'{mode!r} ' in base or f'{mode} ' in base, mode

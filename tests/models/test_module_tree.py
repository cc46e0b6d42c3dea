"""Every module with parameters runs through its own ``forward``.

Hooks, ``checkpoint_wrapper``, FSDP wrapping, LoRA / quantisation wrappers and
``torch.compile`` of a submodule act on a module's ``forward``: code that reads a child's
weights to compute around it, or that calls a stage in three pieces, escapes them.
"""
import pytest
import torch
import torch.nn as nn

from mmplugin_inline.models.backbones import FAMILIES

# one small preset per family: every block letter and the local residual appear
SMALL = {
    'inline_pvt': dict(arch=dict(embed_dims=[16, 32, 32, 32], num_heads=[1, 2, 2, 2],
                                 mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1]),
                       block_types='ISLI'),
    'inline_swin': dict(arch=dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 2]),
                        block_types='ILIS'),
    'inline_cswin': dict(arch=dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 2]),
                         block_types='ISIL'),
    'inline_deit': dict(arch=dict(embed_dim=32, depth=4, num_heads=2), block_types='ISLI',
                        out_indices=(1, 3), final_norm=True),
}

#: modules with parameters that a forward does not call, each with its reason (none today)
NOT_CALLED = {}


def _with_parameters(model):
    return {name: m for name, m in model.named_modules()
            if any(True for _ in m.parameters(recurse=False))}


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_every_module_with_parameters_runs_its_forward(family):
    model = FAMILIES[family](drop_path_rate=0.0, **SMALL[family]).eval()
    called = set()
    modules = _with_parameters(model)
    assert any(name.endswith('residual.0') for name in modules)  # the predictor is covered
    for name, m in modules.items():
        m.register_forward_pre_hook(lambda mod, args, name=name: called.add(name))
    with torch.no_grad():
        model(torch.randn(1, 3, 67, 93))
    missed = sorted(set(modules) - called - set(NOT_CALLED.get(family, ())))
    assert not missed, f'modules with parameters whose forward did not run: {missed}'


@pytest.mark.parametrize('family', sorted(FAMILIES))
def test_a_stage_is_one_call(family):
    """A stage hook sees its input bundle and its whole output: the loop calls each stage
    once, and nothing of a stage runs outside its forward."""
    model = FAMILIES[family](drop_path_rate=0.0, **SMALL[family]).eval()
    calls = []
    for i, stage in enumerate(model.stages):
        stage.register_forward_hook(lambda mod, args, out, i=i: calls.append(i))
    with torch.no_grad():
        model(torch.randn(1, 3, 64, 64))
    assert calls == list(range(max(model.out_indices) + 1))


class _Scaled(nn.Module):
    """A wrapper (as LoRA's) that changes what the wrapped layer gives."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 2.0 * self.inner(x)


def test_wrapping_the_kernel_predictor_changes_the_output():
    """A wrapper on ``mixer.residual.0`` (the predictor's first Conv1d) takes effect."""
    model = FAMILIES['inline_pvt'](drop_path_rate=0.0, **SMALL['inline_pvt']).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
        predictor = model.stages[0].blocks[0].attn.mixer.residual
        assert isinstance(predictor[0], nn.Conv1d)
        predictor[0] = _Scaled(predictor[0])
        after = model(x)
    assert not torch.allclose(before[0], after[0])


def test_grouped_pointwise_is_the_convolution():
    """The predictor's Conv1d computes as grouped matrix products: the same values as
    ``F.conv1d``, also on inputs it hands to the convolution."""
    from mmplugin_inline.models.layers.mixers import GroupedPointwise
    conv = GroupedPointwise(12, 36, groups=3)
    x = torch.randn(5, 12, 1)
    ref = nn.functional.conv1d(x, conv.weight, conv.bias, groups=3)
    torch.testing.assert_close(conv(x), ref)
    longer = torch.randn(2, 12, 4)
    torch.testing.assert_close(conv(longer),
                               nn.functional.conv1d(longer, conv.weight, conv.bias, groups=3))

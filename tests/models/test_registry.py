"""The registry glue: plugin models, hooks and the runner resolve under mmdet's and mmseg's
default scopes, and the runner also before any scope is set."""
import pytest
import torch.nn as nn
from mmengine.registry import DefaultScope

import mmplugin_inline  # noqa: F401  (what custom_imports does)
from mmplugin_inline.registry import MODELS, register_into_codebases

NAMES = ['InLinePVT', 'InLineSwinTransformer', 'InLineCSWinTransformer', 'InLineDeiT']


@MODELS.register_module()
class _RegistryProbe(nn.Module):
    """A placeholder module registered through the glue."""

    def __init__(self, width=3):
        super().__init__()
        self.width = width


def _codebase_models(scope):
    if scope == 'mmdet':
        from mmdet.registry import MODELS as target
    else:
        from mmseg.registry import MODELS as target
    return target


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_placeholder_is_found_bare_and_scoped_under_each_default_scope(scope):
    register_into_codebases()
    target = _codebase_models(scope)
    with DefaultScope.overwrite_default_scope(scope):
        bare = target.build(dict(type='_RegistryProbe', width=5))
        scoped = target.build(dict(type='mmplugin_inline._RegistryProbe', width=7))
    assert isinstance(bare, _RegistryProbe) and bare.width == 5
    assert isinstance(scoped, _RegistryProbe) and scoped.width == 7


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('name', NAMES)
def test_backbones_are_registered_in_each_codebase(scope, name):
    target = _codebase_models(scope)
    assert target.get(name) is MODELS.get(name)
    assert target.get(f'mmplugin_inline.{name}') is MODELS.get(name)


def test_registering_twice_is_harmless_and_conflicts_are_named():
    register_into_codebases()
    register_into_codebases()
    from mmdet.registry import MODELS as det_models

    class Other(nn.Module):
        pass

    det_models.register_module(name='_ConflictProbe', module=Other)
    MODELS.register_module(name='_ConflictProbe', module=_RegistryProbe)
    try:
        with pytest.raises(KeyError, match='already has a different'):
            register_into_codebases()
    finally:
        det_models.module_dict.pop('_ConflictProbe')
        MODELS.module_dict.pop('_ConflictProbe')


def test_the_runner_type_resolves_as_stock_tools_build_it():
    """mmdet's / mmseg's tools/train.py call mmengine's ``RUNNERS.build(cfg)`` before any
    default scope exists: the scoped name must resolve from mmengine's root; under a
    codebase's scope the bare name does too."""
    from mmengine.registry import RUNNERS as ROOT

    from mmplugin_inline.engine import SafeCheckpointRunner
    from mmplugin_inline.engine.runner import RUNNER_TYPE
    # the look-up of mmengine's build_runner_from_cfg, for a config without _scope_
    with ROOT.switch_scope_and_registry(None) as registry:
        assert registry.get(RUNNER_TYPE) is SafeCheckpointRunner
    for scope in ('mmdet', 'mmseg'):
        codebase = __import__(f'{scope}.registry', fromlist=['RUNNERS']).RUNNERS
        with DefaultScope.overwrite_default_scope(scope):
            assert codebase.get('SafeCheckpointRunner') is SafeCheckpointRunner
            assert codebase.get(RUNNER_TYPE) is SafeCheckpointRunner

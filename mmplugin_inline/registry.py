"""The one place that touches the OpenMMLab registries.

The plugin keeps its own ``MODELS``, ``HOOKS`` and ``RUNNERS`` registries (scope
``mmplugin_inline``, children of mmengine's roots), so ``type='mmplugin_inline.InLinePVT'``
and ``runner_type='mmplugin_inline.SafeCheckpointRunner'`` resolve from any scope, also
when no default scope is set yet (mmdet's and mmseg's ``tools/train.py`` build the runner
before the runner sets one). :func:`register_into_codebases` also adds every plugin
model, hook and runner to mmdet's and mmseg's registries (whichever is installed), so
configs under ``default_scope='mmdet'`` or ``'mmseg'`` can name them bare:
``type='InLinePVT'``.
"""
import importlib
from typing import Dict, Tuple

from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmplugin_inline')
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmplugin_inline')
RUNNERS = Registry('runner', parent=MMENGINE_RUNNERS, scope='mmplugin_inline')
#: the plugin's registries, by the attribute name the codebases use for theirs
PLUGIN_REGISTRIES = {'MODELS': MODELS, 'HOOKS': HOOKS, 'RUNNERS': RUNNERS}

CODEBASE_REGISTRIES = ('mmdet.registry', 'mmseg.registry')


def registered_families() -> dict:
    """The backbone families registered in the plugin's ``MODELS``, by class name.

    A family is a class that declares ``is_backbone_family = True`` (``InLineBackbone``
    does); importing :mod:`mmplugin_inline` registers them, and a new family is found
    here once its module is imported (``models/backbones/__init__.py``). Code that needs
    every family's facts (checkpoint detection, preflight, tests) iterates over this.
    """
    return {name: cls for name, cls in MODELS.module_dict.items()
            if getattr(cls, 'is_backbone_family', False)}


def released_weights() -> Dict[str, Tuple[str, str]]:
    """The InLine authors' released ImageNet-1K weights (their README), by the file name
    the configs expect under checkpoints/: ``{file name: (model, URL)}``, gathered from
    the registered backbone families (each declares its own ``released_weights``)."""
    weights = {}
    for family in registered_families().values():
        weights.update(family.released_files())
    return weights


def register_into_codebases() -> list:
    """Add the plugin's models, hooks and runners to the installed codebases' registries.

    Returns:
        list[str]: the codebase registries that were updated.
    """
    updated = []
    for module_name in CODEBASE_REGISTRIES:
        try:
            codebase = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that codebase is not installed
            raise
        for attr, ours in PLUGIN_REGISTRIES.items():
            target = getattr(codebase, attr)
            for name, cls in ours.module_dict.items():
                existing = target.module_dict.get(name)
                if existing is cls:
                    continue
                if existing is not None:
                    raise KeyError(f'{module_name}.{attr} already has a different {name!r} '
                                   f'({existing.__module__}); mmplugin_inline cannot register '
                                   'its own')
                target.register_module(name=name, module=cls)
        updated.append(module_name)
    return updated

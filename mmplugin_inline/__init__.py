"""mmplugin_inline: InLine attention backbones for timm, mmdetection and mmsegmentation.

One model definition in PyTorch (:mod:`mmplugin_inline.models`, the kernels in
:mod:`mmplugin_inline.core`), two faces:

- timm: importing the package registers the timm models (``inline_pvt_tiny``, ...:
  :mod:`mmplugin_inline.timm_models`), so ``timm.create_model``, smp's ``tu-`` encoders
  and transformers' ``TimmBackbone`` find them. Needs torch and timm only, and then
  imports no OpenMMLab package.
- OpenMMLab: where mmengine and mmcv are installed, importing the package (as
  ``custom_imports=dict(imports=['mmplugin_inline'])`` does) also registers the
  backbones, necks, data preprocessors, hooks and runner in the plugin's registry and in
  mmdet's / mmseg's, adds to torch's ``weights_only`` allow-list exactly the globals
  mmengine's checkpoints need, so stock mmdet / mmseg tools resume plugin runs (see
  :mod:`.weights`), and on the maintained fork (``onedl-*`` packages) lets ``mmseg::``
  config bases resolve (:func:`.utils.stacks.register_config_scopes`).
"""
import importlib

from . import timm_models  # noqa: F401  (registers the timm models)
from .version import __version__


def _openmmlab_installed() -> bool:
    """mmengine and mmcv are installed (a package that is installed but fails to import
    raises, naming why)."""
    for name in ('mmengine', 'mmcv'):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                return False
            raise
    return True


if _openmmlab_installed():
    from . import engine, openmmlab  # noqa: F401  (registers the models and hooks)
    from .registry import register_into_codebases
    from .utils.stacks import register_config_scopes
    from .weights import register_mmengine_safe_globals

    register_into_codebases()
    register_mmengine_safe_globals()
    register_config_scopes()

__all__ = ['__version__']

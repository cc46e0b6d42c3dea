"""mmplugin_inline: InLine attention backbones for mmdetection and mmsegmentation.

Importing the package (as ``custom_imports=dict(imports=['mmplugin_inline'])`` does)
registers the backbones and necks in the plugin's registry and in mmdet's / mmseg's, and
adds to torch's ``weights_only`` allow-list exactly the globals mmengine's checkpoints
need, so stock mmdet / mmseg tools resume plugin runs (see :mod:`.weights`). On the
maintained fork (``onedl-*`` packages) it lets ``mmseg::`` config bases resolve
(:func:`.utils.stacks.register_config_scopes`).
``mmplugin_inline.core`` (the kernels) needs only PyTorch.
"""
from .version import __version__

try:
    import mmengine  # noqa: F401
except ModuleNotFoundError:  # kernels-only use: ``from mmplugin_inline.core import ...``
    pass
else:
    from . import engine, models  # noqa: F401  (registers the models and hooks)
    from .registry import register_into_codebases
    from .utils.stacks import register_config_scopes
    from .weights import register_mmengine_safe_globals

    register_into_codebases()
    register_mmengine_safe_globals()
    register_config_scopes()

__all__ = ['__version__']

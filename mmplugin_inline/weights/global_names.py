"""The globals a checkpoint's pickle names: does each exist here? Decided without
importing anything the file names (:func:`absent_global`); a name that certainly does not
exist is damage (:func:`check_names`)."""
import functools
import importlib.util
import inspect
import os.path as osp
import sys
import types
from typing import Optional

from .files import damaged, human_size
from .set_aside import data_globals
from .torch_private import TORCH_MODULE_RENAMES

__all__ = ['absent_global']


def _is_dotted_name(text) -> bool:
    return isinstance(text, str) and all(part.isidentifier() for part in text.split('.'))


def _static_member(owner, name: str):
    """``owner.name`` without running anything: no ``__getattr__``, no descriptor."""
    return inspect.getattr_static(owner, name)


def absent_global(module: str, name: str) -> Optional[str]:
    """Why the global ``module.name`` that a file names certainly does not exist here, or
    None when it exists, or when that cannot be known without importing something.

    Deciding this imports nothing the file names, since importing a module runs its code,
    and the file chose the name:

    * A module already in ``sys.modules`` was imported by someone else; its namespace is
      read statically (``inspect.getattr_static``), never through ``getattr``, which would
      call a module's ``__getattr__`` (PEP 562: torch imports submodules lazily through it).
      A name it lacks does not exist, unless the module has such a ``__getattr__``, which
      may make names on demand: then we cannot tell.
    * A module not yet imported is looked up with ``importlib.util.find_spec``, which finds
      where a module would be loaded from without running it, but only for a top-level name
      or for a child of an already imported package: ``find_spec('a.b.c')`` imports ``a.b``
      first. So only the first link of the dotted path that is not imported yet is looked
      up (everything above it is in ``sys.modules``). If it is not found, the module does
      not exist; if it is found, the module exists but is not imported, and what it holds
      is left unknown rather than imported.
    """
    full = f'{module}.{name}'
    if not (_is_dotted_name(module) and _is_dotted_name(name)):
        return f'names {full!r}, which is not a Python name'
    parts = module.split('.')
    imported = next((depth for depth in range(len(parts), 0, -1)
                     if sys.modules.get('.'.join(parts[:depth])) is not None), 0)
    if imported < len(parts):
        missing = '.'.join(parts[:imported + 1])
        if imported:
            parent = sys.modules['.'.join(parts[:imported])]
            if '__path__' not in vars(parent):  # not a package: no submodules to find
                try:
                    _static_member(parent, parts[imported])
                    return None  # an attribute that is a module (os.path): unknown
                except AttributeError:
                    return f'names `{full}`, but there is no module `{missing}`'
        try:
            found = importlib.util.find_spec(missing) is not None
        except (ImportError, ValueError, AttributeError):
            return None  # a finder that cannot answer: unknown
        return None if found else f'names `{full}`, but there is no module `{missing}`'
    owner = sys.modules[module]
    for attribute in name.split('.'):
        try:
            owner = _static_member(owner, attribute)
        except AttributeError:
            if isinstance(owner, types.ModuleType) and '__getattr__' in vars(owner):
                return None  # names made on demand: unknown
            return f'names `{full}`, which does not exist'
    return None


@functools.lru_cache(maxsize=1)
def _data_modules() -> frozenset:
    return frozenset(full.rpartition('.')[0] for full in data_globals())


def _names_data(module: str) -> bool:
    """Whether the file's data itself (tensors, storages, containers) comes from ``module``:
    torch's modules and those of torch's weights_only globals (``collections``, ...)."""
    return module.split('.')[0] == 'torch' or module in _data_modules()


def check_names(path: str, named, every_module: bool) -> None:
    """Damage when the file names a global that does not exist here (:func:`absent_global`).

    ``every_module``: judge every name (the run's checkpoints, and full unpickling, where a
    name that does not exist cannot be read at all); otherwise only names of the modules the
    data comes from (:func:`_names_data`): a data-only reading sets aside any other object,
    including those of packages that are not installed (the authors' yacs config).
    """
    for module, name in dict.fromkeys(named):
        if not (every_module or _names_data(module) or not _is_dotted_name(module) or
                not _is_dotted_name(name)):
            continue
        reason = absent_global(TORCH_MODULE_RENAMES.get(module, module), name)
        if reason is None:
            continue
        if 'there is no module' in reason and not _names_data(module):
            likely = ('the file is probably corrupt, or it needs a package that is not installed '
                      "here. A backbone's pretrained weights are read as data only through its "
                      "init_cfg=dict(type='Pretrained', checkpoint=...), which does not need it")
        else:
            likely = 'the file is probably corrupt. Download or copy it again'
        raise damaged(path, f'cannot be read ({human_size(osp.getsize(path))}): it {reason}: '
                            f'{likely}')

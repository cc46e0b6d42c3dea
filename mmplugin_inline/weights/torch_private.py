"""The one module of the package that reads torch's private API, and what it mirrors of it.

Judging a checkpoint file without running it needs three facts that torch keeps to
itself: the globals its ``weights_only`` loader rebuilds (:func:`weights_only_globals`),
the element size of a storage class named in a file (:func:`storage_element_size`) and the
module names its loader renames before resolving them (:data:`TORCH_MODULE_RENAMES`).
A torch release that changes them makes these raise :class:`TorchInternalsChanged` (and
``tests/weights/test_torch_private.py`` fail) instead of misjudging files quietly.
"""
import functools
from typing import Dict

import torch

__all__ = ['TorchInternalsChanged', 'weights_only_globals', 'storage_element_size',
           'TORCH_MODULE_RENAMES']

#: what torch's loader renames before it resolves a module (the ``load_module_mapping``
#: of ``torch.serialization._load``)
TORCH_MODULE_RENAMES = {'torch.tensor': 'torch._tensor'}


class TorchInternalsChanged(RuntimeError):
    """torch no longer offers a private piece that :mod:`mmplugin_inline.weights` reads."""


def _changed(what: str, exc: Exception) -> TorchInternalsChanged:
    return TorchInternalsChanged(
        f'torch {torch.__version__} changed {what}, which mmplugin_inline.weights reads to '
        f'judge checkpoint files ({type(exc).__name__}: {exc}); this torch is newer than the '
        'plugin supports: use the torch version of requirements/, or update '
        'mmplugin_inline/weights/torch_private.py')


@functools.lru_cache(maxsize=1)
def weights_only_globals() -> Dict[str, object]:
    """torch's ``weights_only`` allow-list, ``{'module.name': object}``: what a data-only
    load rebuilds for real (tensors, storages, dtypes, ``OrderedDict``, ``torch.Size``, ...).

    From ``torch._weights_only_unpickler._get_allowed_globals()``; torch's public
    ``get_safe_globals()`` holds only what users added to it."""
    try:
        from torch import _weights_only_unpickler
        found = dict(_weights_only_unpickler._get_allowed_globals())
    except Exception as exc:  # noqa: BLE001 - any change of torch's private API
        raise _changed('torch._weights_only_unpickler._get_allowed_globals', exc) from exc
    if 'torch._utils._rebuild_tensor_v2' not in found or 'collections.OrderedDict' not in found:
        raise _changed('torch._weights_only_unpickler._get_allowed_globals',
                       ValueError('it no longer lists torch._utils._rebuild_tensor_v2 and '
                                  'collections.OrderedDict'))
    return found


def storage_element_size(storage_class: str) -> int:
    """Bytes per element of a storage class as a file names it (``'FloatStorage'``: 4),
    as torch's loaders read it: the dtype from the class name alone.

    Raises:
        ValueError: not a storage class torch knows.
    """
    try:
        storage_type = torch.serialization.StorageType
    except AttributeError as exc:
        raise _changed('torch.serialization.StorageType', exc) from exc
    try:
        dtype = storage_type(storage_class).dtype
    except Exception as exc:  # noqa: BLE001 - a name torch does not know
        raise ValueError(f'{storage_class!r} is not a storage class of torch') from exc
    return dtype.itemsize

"""The run's own mmengine checkpoints (``--resume``, ``load_from``, ``tools/test.py``):
read with ``torch.load(weights_only=True)`` and an exact allow-list of what mmengine saves
(:func:`mmengine_checkpoint_globals`); a file that needs more is refused
(:class:`UnsafeCheckpointError`) unless the caller opts in with ``allow_unsafe``.
:func:`mmengine_checkpoint_loading` makes mmengine's own loading use this policy for a
block (the runner's, :class:`~mmplugin_inline.engine.SafeCheckpointRunner`, and the
inferencers')."""
import contextlib
import inspect
import pickle
from typing import Iterator, List, Optional, Tuple

import torch

from .download import checked_local_file
from .errors import CheckpointError, UnsafeCheckpointError
from .files import read_failure
from .global_names import check_names
from .pickle_walk import walk

__all__ = ['load_run_checkpoint', 'mmengine_checkpoint_globals',
           'register_mmengine_safe_globals', 'mmengine_checkpoint_loading',
           'history_buffer_getattr']


# numeric dtype classes (numpy >= 1.25 pickles a dtype by its class, e.g. Float64DType)
_NUMERIC_DTYPES = ('BoolDType', 'Int8DType', 'Int16DType', 'Int32DType', 'Int64DType',
                   'UInt8DType', 'UInt16DType', 'UInt32DType', 'UInt64DType', 'Float16DType',
                   'Float32DType', 'Float64DType', 'LongDoubleDType', 'Complex64DType',
                   'Complex128DType', 'ByteDType', 'UByteDType', 'ShortDType', 'UShortDType',
                   'IntDType', 'UIntDType', 'LongDType', 'ULongDType', 'LongLongDType',
                   'ULongLongDType')


def _numpy_multiarray():
    """numpy's ``multiarray`` module (``numpy._core`` from numpy 2, ``numpy.core`` before)."""
    import numpy as np
    core = getattr(np, '_core', None)
    if core is not None and hasattr(core, 'multiarray'):
        return core.multiarray
    return np.core.multiarray


def history_buffer_getattr(obj, name: str):
    """``getattr`` as an mmengine checkpoint uses it, and nothing more.

    A ``HistoryBuffer`` pickles its statistics methods (``HistoryBuffer.min``, ...) as
    ``getattr(HistoryBuffer, 'min')``. The real ``builtins.getattr`` would let a file
    reach any attribute of any allowed object, so the checkpoint's ``getattr`` is this:
    public functions of ``HistoryBuffer`` only.
    """
    from mmengine.logging.history_buffer import HistoryBuffer
    value = getattr(HistoryBuffer, name, None) if obj is HistoryBuffer else None
    if name.startswith('_') or not inspect.isfunction(value):
        raise pickle.UnpicklingError(
            f'getattr({getattr(obj, "__name__", type(obj).__name__)}, {name!r}) is not '
            'something an mmengine checkpoint needs (only HistoryBuffer methods are)')
    return value


def mmengine_checkpoint_globals() -> List[object]:
    """The globals an mmengine checkpoint needs beyond torch's default allow-list.

    ``HistoryBuffer`` (the message hub's logged scalars) with its statistics methods
    (through :func:`history_buffer_getattr` in place of ``builtins.getattr``) and what
    numpy arrays and scalars pickle to: ``ndarray`` / ``_reconstruct``, ``scalar``,
    ``dtype`` and the numeric dtype classes. None of them runs code of the file's choosing.
    """
    import numpy as np
    from mmengine.logging.history_buffer import HistoryBuffer
    multiarray = _numpy_multiarray()
    allowed = [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr'), np.ndarray,
               multiarray._reconstruct, multiarray.scalar, np.dtype]
    # a file pickled under the other numpy major version names the same functions by the
    # other module path (numpy 1: numpy.core.multiarray; numpy 2: numpy._core.multiarray):
    # a run of the official line (numpy 1) resumes on the fork (numpy 2) and back
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        for func in (multiarray._reconstruct, multiarray.scalar):
            name = f'{module}.{func.__name__}'
            if name != f'{func.__module__}.{func.__name__}':
                allowed.append((func, name))
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        allowed += [getattr(dtypes, name) for name in _NUMERIC_DTYPES if hasattr(dtypes, name)]
    return allowed


def register_mmengine_safe_globals() -> bool:
    """Add :func:`mmengine_checkpoint_globals` to torch's weights_only allow-list.

    Called when the package is imported (``custom_imports`` does it), so that
    mmengine's own ``torch.load`` calls (``--resume``, ``load_from`` in mmdet's and
    mmseg's stock tools) read the run's checkpoints under torch >= 2.6. Exactly those
    globals, nothing broader. Returns False on a torch without the allow-list API.
    """
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is None:
        return False
    add(mmengine_checkpoint_globals())
    return True


def _qualified_name(entry) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


def _refusal(filename: str, exc: Exception) -> UnsafeCheckpointError:
    """The error for a run checkpoint that needs more than the allow-list."""
    needed = []
    if hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint'):
        allowed = {_qualified_name(g) for g in mmengine_checkpoint_globals()}
        try:
            needed = [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(
                filename) if name not in allowed]
        except Exception:  # noqa: BLE001 - the listing is a courtesy
            needed = []
    if needed:
        found = 'it needs ' + ', '.join(needed)
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        found = next((line for line in lines if 'Unsupported global' in line or
                      'not something an mmengine checkpoint needs' in line),
                     lines[-1] if lines else type(exc).__name__)
    return UnsafeCheckpointError(
        f'{filename} holds Python objects beyond tensors, plain containers and what mmengine '
        f'itself saves ({found}). Loading it could run code from the file, so it is '
        'refused. If you trust the file, opt in with --allow-unsafe (tools/train.py, '
        'tools/test.py) or allow_unsafe=True; or re-save only its state dict with '
        'torch.save({"state_dict": model_state}, path). Pretrained backbone weights do not '
        "need this: give them as the backbone's init_cfg=dict(type='Pretrained', "
        'checkpoint=...), which reads them as data only.')


@contextlib.contextmanager
def _mmengine_globals_scope() -> Iterator[None]:
    """The allow-list in force for one load, whether or not it was registered globally.

    Only the entries not registered already are scoped: torch's ``safe_globals`` removes
    on exit what it added, which would undo :func:`register_mmengine_safe_globals`.
    """
    scoped = getattr(torch.serialization, 'safe_globals', None)
    if scoped is None:
        yield
        return
    registered = torch.serialization.get_safe_globals()
    missing = [g for g in mmengine_checkpoint_globals() if g not in registered]
    if not missing:
        yield
        return
    with scoped(missing):
        yield


def load_run_checkpoint(filename: str, map_location=None, allow_unsafe: bool = False,
                        verify_hash: bool = True):
    """Load one of the run's own checkpoints (``weights_only=True`` + mmengine allow-list).

    Drop-in for mmengine's ``load_from_local`` (same signature); also takes URLs. A file
    named ``NAME-<hex>.pth`` is checked against that sha256 prefix unless ``verify_hash``
    is False.

    Raises:
        FileNotFoundError: the file does not exist.
        DamagedCheckpointError: empty, truncated, a web page, not a checkpoint, corrupt,
            not the published hash.
        UnsafeCheckpointError: it needs more than the allow-list and ``allow_unsafe``
            is False.
    """
    filename = checked_local_file(filename, verify_hash)
    check_names(filename, walk(filename).named, every_module=True)
    return read_run_checkpoint(filename, map_location, allow_unsafe)


def read_run_checkpoint(filename: str, map_location, allow_unsafe: bool):
    """:func:`load_run_checkpoint` on a file that is checked and walked already."""
    try:
        if allow_unsafe:
            return torch.load(filename, map_location=map_location, weights_only=False)
        with _mmengine_globals_scope():
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if not allow_unsafe:  # the walk found a well-formed pickle: a refusal, not damage
            raise _refusal(filename, exc) from exc
        raise read_failure(filename, exc) from exc
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the bytes is damage
        raise read_failure(filename, exc) from exc


#: the settings of the :func:`mmengine_checkpoint_loading` blocks in force, innermost last
_RUN_LOADING: List[Tuple[bool, bool]] = []

# the prefixes mmengine's ``CheckpointLoader`` maps to local files and to URLs
_LOCAL_AND_URL_PREFIXES = ('', 'http://', 'https://')


def _use_loaders(settings: Optional[Tuple[bool, bool]]) -> None:
    """Register with mmengine's ``CheckpointLoader`` (its public ``register_scheme``) the
    loaders for local paths and ``http(s)://`` URLs: :func:`load_run_checkpoint` with
    ``settings`` (allow_unsafe, verify_hash), or mmengine's own with None."""
    from mmengine.runner.checkpoint import CheckpointLoader, load_from_http, load_from_local
    if settings is None:
        CheckpointLoader.register_scheme('', load_from_local, force=True)
        CheckpointLoader.register_scheme(('http://', 'https://'), load_from_http, force=True)
        return
    allow_unsafe, verify_hash = settings

    def load_from_run_policy(filename, map_location=None):  # mmengine logs the name
        return load_run_checkpoint(filename, map_location, allow_unsafe=allow_unsafe,
                                   verify_hash=verify_hash)

    CheckpointLoader.register_scheme(_LOCAL_AND_URL_PREFIXES, load_from_run_policy, force=True)


@contextlib.contextmanager
def mmengine_checkpoint_loading(allow_unsafe: bool = False,
                                verify_hash: bool = True) -> Iterator[None]:
    """Within the block, mmengine reads checkpoints with :func:`load_run_checkpoint`
    (``allow_unsafe`` and ``verify_hash`` as there).

    The loaders that mmengine's ``CheckpointLoader`` uses for local paths and for
    ``http://`` / ``https://`` URLs are registered for the block (``register_scheme``);
    on exit those of the enclosing block are back, or, outside any, mmengine's own
    ``load_from_local`` / ``load_from_http`` (a loader someone else registered for these
    prefixes before the block is not restored). Other schemes (``s3://``, ...) are left
    as they are.
    """
    _RUN_LOADING.append((allow_unsafe, verify_hash))
    _use_loaders(_RUN_LOADING[-1])
    try:
        yield
    finally:
        _RUN_LOADING.pop()
        _use_loaders(_RUN_LOADING[-1] if _RUN_LOADING else None)

"""Resume and ``load_from`` with mmengine's own checkpoints, without full unpickling.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``: it unpickles only
tensors, plain containers and an allow-list of globals. mmengine 0.10.7 calls
``torch.load(filename, map_location)`` for local files, and the checkpoints it writes
hold more than tensors: the message hub's ``HistoryBuffer`` objects (with numpy
arrays inside) and numpy scalars among the logged values. So ``--resume`` and
``load_from`` fail on the run's own files (``Unsupported global:
mmengine.logging.history_buffer.HistoryBuffer``, then numpy globals).

The fix here keeps ``weights_only=True`` and allow-lists exactly those globals
(:func:`mmengine_checkpoint_globals`), only while the runner loads its checkpoint
(:func:`guard_runner_checkpoints`). A file that needs anything else is refused with
:class:`~mmplugin_inline.checkpoint.UnsafeCheckpointError` naming what it contains;
full unpickling (which runs code from the file) happens only on an explicit opt-in
(``allow_unsafe=True``, ``--allow-unsafe`` in ``tools/train.py`` / ``tools/test.py``).
Pretrained backbone weights do not go through here: they are loaded by
:func:`mmplugin_inline.checkpoint.load_checkpoint_file` with torch's default allow-list.
"""
import contextlib
import inspect
import os.path as osp
import pickle
from typing import Iterator, List

import numpy as np
import torch

from mmplugin_inline.checkpoint import UnsafeCheckpointError

# numeric dtype classes (numpy >= 1.25 pickles a dtype by its class, e.g. Float64DType)
_NUMERIC_DTYPES = ('BoolDType', 'Int8DType', 'Int16DType', 'Int32DType', 'Int64DType',
                   'UInt8DType', 'UInt16DType', 'UInt32DType', 'UInt64DType', 'Float16DType',
                   'Float32DType', 'Float64DType', 'LongDoubleDType', 'Complex64DType',
                   'Complex128DType', 'ByteDType', 'UByteDType', 'ShortDType', 'UShortDType',
                   'IntDType', 'UIntDType', 'LongDType', 'ULongDType', 'LongLongDType',
                   'ULongLongDType')


def _numpy_multiarray():
    """numpy's ``multiarray`` module (``numpy._core`` from numpy 2, ``numpy.core`` before)."""
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
    from mmengine.logging.history_buffer import HistoryBuffer
    multiarray = _numpy_multiarray()
    allowed = [HistoryBuffer, (history_buffer_getattr, 'builtins.getattr'), np.ndarray,
               multiarray._reconstruct, multiarray.scalar, np.dtype]
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        allowed += [getattr(dtypes, name) for name in _NUMERIC_DTYPES if hasattr(dtypes, name)]
    return allowed


@contextlib.contextmanager
def allow_mmengine_globals() -> Iterator[None]:
    """Within the block, ``torch.load(weights_only=True)`` accepts mmengine checkpoints."""
    serialization = torch.serialization
    if hasattr(serialization, 'safe_globals'):  # torch >= 2.5: scoped
        with serialization.safe_globals(mmengine_checkpoint_globals()):
            yield
    elif hasattr(serialization, 'add_safe_globals'):  # torch 2.4: process-wide
        serialization.add_safe_globals(mmengine_checkpoint_globals())
        yield
    else:  # older torch cannot extend weights_only loading
        yield


def _qualified_name(entry) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


def _refusal(filename: str, exc: Exception) -> UnsafeCheckpointError:
    """The error for a file that needs more than the allow-list, naming what it needs."""
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
        'torch.save({"state_dict": model_state}, path).')


def load_local_checkpoint(filename: str, map_location=None, allow_unsafe: bool = False):
    """Load a local checkpoint with ``weights_only=True`` and the mmengine allow-list.

    Drop-in for mmengine's ``load_from_local`` (same signature and errors).

    Raises:
        FileNotFoundError: the file does not exist.
        UnsafeCheckpointError: it needs more than the allow-list and ``allow_unsafe``
            is False.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    try:
        with allow_mmengine_globals():
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if not allow_unsafe:
            raise _refusal(filename, exc) from exc
    return torch.load(filename, map_location=map_location, weights_only=False)


@contextlib.contextmanager
def mmengine_checkpoint_loading(allow_unsafe: bool = False) -> Iterator[None]:
    """Within the block, mmengine loads local checkpoints with :func:`load_local_checkpoint`.

    Replaces the loader that mmengine's ``CheckpointLoader`` uses for local paths (the
    empty prefix) and restores it on exit; remote schemes (``http://``, ``s3://``, ...)
    are left as they are.
    """
    from mmengine.runner.checkpoint import CheckpointLoader

    def load_from_local_safely(filename, map_location=None):  # mmengine logs the name
        return load_local_checkpoint(filename, map_location, allow_unsafe=allow_unsafe)

    previous = CheckpointLoader._get_checkpoint_loader('')
    CheckpointLoader.register_scheme('', load_from_local_safely, force=True)
    try:
        yield
    finally:
        CheckpointLoader.register_scheme('', previous, force=True)


def guard_runner_checkpoints(runner, allow_unsafe: bool = False):
    """Make ``runner`` resume / ``load_from`` through :func:`mmengine_checkpoint_loading`.

    Only the runner's ``load_or_resume`` step (what ``--resume``, ``load_from`` and
    ``tools/test.py``'s checkpoint use) runs in that scope; model initialisation,
    including pretrained backbone weights, does not.

    Returns:
        the runner, for chaining.
    """
    original = runner.load_or_resume

    def load_or_resume():
        with mmengine_checkpoint_loading(allow_unsafe):
            return original()

    runner.load_or_resume = load_or_resume
    return runner

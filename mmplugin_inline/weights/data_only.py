"""Third-party weights (the authors' released files, a converted backbone, anything an
``init_cfg=dict(type='Pretrained', ...)`` names) read as data only: :func:`load_weights`."""
import os

import torch

from .download import checked_local_file
from .errors import CheckpointError
from .files import read_failure
from .global_names import check_names
from .pickle_walk import walk
from .run_checkpoints import read_run_checkpoint
from .set_aside import DataOnlyPickleModule

__all__ = ['load_weights']


def load_weights(path: str, map_location='cpu', allow_unsafe: bool = False,
                 verify_hash: bool = True):
    """Read third-party weights (a file or an ``http(s)://`` URL) as data only.

    Args:
        path (str): a local file, or a URL (downloaded once, see :func:`cached_file`).
        map_location: as for ``torch.load``. Default: 'cpu'.
        allow_unsafe (bool): full unpickling instead (runs code from the file; only for
            files you trust). Default: False.
        verify_hash (bool): check a file named ``NAME-<hex>.pth`` against that sha256
            prefix (:func:`verify_published_file`). Default: True.

    Returns:
        the loaded object; non-data objects are :class:`SetAside` placeholders.

    Raises:
        FileNotFoundError: no such file.
        DamagedCheckpointError: empty, truncated, a web page, not a checkpoint, corrupt,
            not the published hash.
        CheckpointDownloadError: a URL that could not be fetched.
    """
    path = checked_local_file(path, verify_hash)
    check_names(path, walk(path).named, every_module=allow_unsafe)
    if not allow_unsafe and os.environ.get('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '0').lower() in (
            '1', 'y', 'yes', 'true'):
        # torch then refuses any custom unpickler; its own loader is the strictest reading
        return read_run_checkpoint(path, map_location, allow_unsafe=False)
    try:
        if allow_unsafe:
            return torch.load(path, map_location=map_location, weights_only=False)
        return torch.load(path, map_location=map_location, weights_only=False,
                          pickle_module=DataOnlyPickleModule)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the bytes is damage
        raise read_failure(path, exc) from exc

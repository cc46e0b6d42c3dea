"""Is a checkpoint file sound? Damage (empty, truncated, a web page, not a checkpoint)
found from its size and first bytes, the sha256 a published file's name declares, and the
errors for a file that passed those checks but could not be read."""
import hashlib
import os.path as osp
import re
import zipfile
from typing import Optional

from .errors import CheckpointError, DamagedCheckpointError

__all__ = ['damage_of', 'check_checkpoint_file', 'published_sha256', 'sha256_of',
           'verify_published_file']

ZIP_MAGIC = b'PK\x03\x04'
_PICKLE_PROTO = b'\x80'


def looks_like_html(head: bytes) -> bool:
    text = head.lstrip().lower()
    return text.startswith((b'<!doctype html', b'<html', b'<head', b'<body', b'<?xml')) or \
        (text.startswith(b'<') and b'<html' in text)


def human_size(size: int) -> str:
    for unit in ('bytes', 'KiB', 'MiB', 'GiB'):
        if size < 1024 or unit == 'GiB':
            return f'{size} {unit}' if unit == 'bytes' else f'{size:.1f} {unit}'
        size /= 1024
    return str(size)


def damage_of(path: str) -> Optional[str]:
    """What is wrong with the file at ``path`` as a checkpoint, or None if it looks sound.

    Looks at the size and the first bytes, and for the zip format (``torch.save``'s
    since torch 1.6) at the archive's directory, which a truncated file lacks.
    """
    size = osp.getsize(path)
    if size == 0:
        return 'is empty (0 bytes): the download or copy did not happen or was cut off'
    with open(path, 'rb') as f:
        head = f.read(1024)
    if looks_like_html(head):
        return (f'is a web page (HTML, {human_size(size)}), not a checkpoint: this looks like '
                'the page a cloud-share link shows in a browser. For cloud-share links add '
                '`?dl=1` to the URL (e.g. https://cloud.tsinghua.edu.cn/f/KEY/?dl=1) and '
                'download again')
    if head.startswith(ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except Exception:  # noqa: BLE001 - BadZipFile, OSError, and what a corrupt directory
            # raises from zipfile (UnicodeDecodeError, NotImplementedError, struct.error, ...)
            return (f'is truncated or corrupt ({human_size(size)}): it starts like a torch.save '
                    'zip checkpoint but its end (the zip directory) is missing or damaged; the '
                    'download was probably interrupted. Download it again')
        if not any(name.endswith('data.pkl') for name in names):
            return (f'is a zip archive ({human_size(size)}) but not a torch checkpoint (no '
                    'data.pkl inside); was it saved with torch.jit.save, or is it a zipped '
                    'folder?')
        return None
    if head.startswith(_PICKLE_PROTO):
        return None  # a pickle (torch's legacy format); truncation shows when it is read
    shown = head[:8].hex(' ')
    return (f'is neither a torch.save zip checkpoint nor a pickle ({human_size(size)}, starts '
            f'with bytes {shown}); is it the right file?')


def damaged(path: str, reason: str) -> DamagedCheckpointError:
    return DamagedCheckpointError(f'Checkpoint {path} {reason}.')


def check_checkpoint_file(path: str) -> None:
    """Raise ``FileNotFoundError`` / :class:`DamagedCheckpointError` for a bad local file."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path} ({osp.abspath(path)})')
    reason = damage_of(path)
    if reason:
        raise damaged(path, reason)


# --------------------------------------------------------------------------- published files

# ``NAME-<8 to 64 hex digits>.pth``: publish_model.py's names, mmdet's and torch hub's
_HASH_SUFFIX = re.compile(r'-([0-9a-f]{8,64})\.pth$')
_HASH_OPT_OUT = ("verify_hash=False: an argument of the loaders, a key of the backbone's "
                 "init_cfg=dict(type='Pretrained', ...), a top-level config key for load_from "
                 'and --resume, --no-verify-hash for the converter')


def published_sha256(path: str) -> Optional[str]:
    """The sha256 prefix that a published file's name declares, or None.

    ``mask-rcnn_inline-pvt-t_coco-1a2b3c4d.pth`` -> ``'1a2b3c4d'``.
    """
    match = _HASH_SUFFIX.search(osp.basename(path))
    return match.group(1) if match else None


def sha256_of(path: str, chunk: int = 1 << 20) -> str:
    """The hex sha256 digest of a file's bytes, read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(chunk), b''):
            digest.update(block)
    return digest.hexdigest()


def verify_published_file(path: str, shown_as: Optional[str] = None) -> None:
    """Check a file whose name ends in ``-<hex>.pth`` against that sha256 prefix; other
    names are not checked. The whole file is hashed, 1 MiB at a time.

    Args:
        path (str): the file.
        shown_as (str, optional): how the message names it (a downloaded file's URL).
            Default: ``path``.

    Raises:
        DamagedCheckpointError: the file's sha256 does not start with the declared digits.
    """
    expected = published_sha256(path)
    if expected is None:
        return
    found = sha256_of(path)
    if not found.startswith(expected):
        raise DamagedCheckpointError(
            f'Checkpoint {shown_as or path} does not match the hash in its name '
            f'({human_size(osp.getsize(path))}): expected sha256 {expected}..., the file has '
            f'{found[:len(expected)]}...: the file changed after publishing, or the download '
            'is damaged; if the suffix is not a hash, rename the file or turn the check off '
            f'({_HASH_OPT_OUT}).')


def read_failure(path: str, exc: BaseException) -> CheckpointError:
    """The error for a file that passed :func:`damage_of` (and the safety policy) but could
    not be read: whatever torch or the unpickler raised (``IndexError``, ``KeyError``,
    ``struct.error``, ``UnicodeDecodeError``, ``MemoryError``, ...) means the bytes are not
    what ``torch.save`` wrote. The one exception is a sound file saved on a device this
    machine lacks, which is a plain :class:`CheckpointError` saying so."""
    first = (str(exc).strip().splitlines() or [''])[0]
    if isinstance(exc, RuntimeError) and 'Attempting to deserialize object on' in first:
        return CheckpointError(f'Checkpoint {path} was saved on a device this machine does not '
                               f"have ({first}); load it with map_location='cpu'.")
    what = f'{type(exc).__name__}: {first}' if first else type(exc).__name__
    if isinstance(exc, MemoryError):
        what += (' (a size recorded in the file asks for more memory than the machine has; '
                 'in a file of this size that is a corrupt size field)')
    return unreadable(path, what)


def unreadable(path: str, what: str) -> DamagedCheckpointError:
    return damaged(path, f'could not be read ({human_size(osp.getsize(path))}): {what}. It is '
                         'probably truncated or corrupt (an interrupted download or copy); '
                         'download or copy it again')

"""How every checkpoint file of the plugin is read: one policy, one module.

Two kinds of file, two rules:

* **Third-party weights** (the InLine authors' released files, a converted backbone,
  anything named by ``init_cfg=dict(type='Pretrained', checkpoint=...)`` or given to the
  converter) are read *as data only* (:func:`load_weights`). Tensors and plain
  containers are rebuilt; every other object the file names (a yacs ``CfgNode``, an
  ``argparse.Namespace``, an optimizer's classes, ``os.system`` in a malicious file, ...)
  becomes an inert :class:`SetAside` placeholder. Nothing named in the file is imported
  or called, so the authors' training-format files (``{'model', 'optimizer',
  'lr_scheduler', 'max_accuracy', 'epoch', 'config'}``) load without yacs and without
  an opt-in.
* **The run's own mmengine checkpoints** (``--resume``, ``load_from``,
  ``tools/test.py``) are read with ``torch.load(weights_only=True)`` and an exact
  allow-list of what mmengine saves (:func:`mmengine_checkpoint_globals`). Importing the
  package registers that allow-list with torch (:func:`register_mmengine_safe_globals`),
  so mmdet's and mmseg's own ``tools/train.py`` resume plugin runs under torch >= 2.6.
  A file that needs more is refused (:class:`UnsafeCheckpointError`).

Full unpickling, which runs code from the file, happens only on the explicit opt-in
``allow_unsafe=True`` (``--allow-unsafe``). Before either rule, a damaged file (empty,
truncated, a web page saved under a ``.pth`` name) gets its own error
(:class:`DamagedCheckpointError`), which never suggests ``allow_unsafe``. So does any
corruption found later: the file's pickle is first walked with nothing rebuilt
(:func:`_walk`: a malformed pickle, a storage larger than its record, a global that does
not exist here, :func:`absent_global`), and any exception while torch reads it is damage.
``http(s)://`` names are downloaded once into the cache (:func:`cached_file`).
"""
import _compat_pickle
import contextlib
import functools
import hashlib
import importlib.util
import inspect
import io
import os
import os.path as osp
import pickle
import re
import struct
import sys
import types
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from typing import Iterator, List, Optional

import torch

__all__ = [
    'CheckpointError', 'DamagedCheckpointError', 'UnsafeCheckpointError',
    'CheckpointDownloadError', 'SetAside', 'load_weights', 'load_run_checkpoint',
    'cached_file', 'cache_dir', 'url_file_name', 'probe_url', 'is_url',
    'mmengine_checkpoint_globals', 'register_mmengine_safe_globals',
    'mmengine_checkpoint_loading', 'guard_runner_checkpoints', 'check_checkpoint_file',
    'absent_global', 'published_sha256', 'sha256_of', 'verify_published_file',
]


class CheckpointError(RuntimeError):
    """A checkpoint could not be loaded; the message says why and what to do."""


class UnsafeCheckpointError(CheckpointError):
    """The file needs full unpickling, which the caller has not allowed."""


class DamagedCheckpointError(CheckpointError):
    """The file is not a readable checkpoint: empty, truncated, a web page, ..."""


class CheckpointDownloadError(CheckpointError):
    """A checkpoint URL could not be fetched (404, refused connection, a web page)."""


# --------------------------------------------------------------------------- damaged files

_ZIP_MAGIC = b'PK\x03\x04'
_PICKLE_PROTO = b'\x80'


def _looks_like_html(head: bytes) -> bool:
    text = head.lstrip().lower()
    return text.startswith((b'<!doctype html', b'<html', b'<head', b'<body', b'<?xml')) or \
        (text.startswith(b'<') and b'<html' in text)


def _human_size(size: int) -> str:
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
    if _looks_like_html(head):
        return (f'is a web page (HTML, {_human_size(size)}), not a checkpoint: this looks like '
                'the page a cloud-share link shows in a browser. For cloud-share links add '
                '`?dl=1` to the URL (e.g. https://cloud.tsinghua.edu.cn/f/KEY/?dl=1) and '
                'download again')
    if head.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except Exception:  # noqa: BLE001 - BadZipFile, OSError, and what a corrupt directory
            # raises from zipfile (UnicodeDecodeError, NotImplementedError, struct.error, ...)
            return (f'is truncated or corrupt ({_human_size(size)}): it starts like a torch.save '
                    'zip checkpoint but its end (the zip directory) is missing or damaged; the '
                    'download was probably interrupted. Download it again')
        if not any(name.endswith('data.pkl') for name in names):
            return (f'is a zip archive ({_human_size(size)}) but not a torch checkpoint (no '
                    'data.pkl inside); was it saved with torch.jit.save, or is it a zipped '
                    'folder?')
        return None
    if head.startswith(_PICKLE_PROTO):
        return None  # a pickle (torch's legacy format); truncation shows when it is read
    shown = head[:8].hex(' ')
    return (f'is neither a torch.save zip checkpoint nor a pickle ({_human_size(size)}, starts '
            f'with bytes {shown}); is it the right file?')


def _damaged(path: str, reason: str) -> DamagedCheckpointError:
    return DamagedCheckpointError(f'Checkpoint {path} {reason}.')


def check_checkpoint_file(path: str) -> None:
    """Raise ``FileNotFoundError`` / :class:`DamagedCheckpointError` for a bad local file."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path} ({osp.abspath(path)})')
    reason = damage_of(path)
    if reason:
        raise _damaged(path, reason)


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
            f'({_human_size(osp.getsize(path))}): expected sha256 {expected}..., the file has '
            f'{found[:len(expected)]}...: the file changed after publishing, or the download '
            'is damaged; if the suffix is not a hash, rename the file or turn the check off '
            f'({_HASH_OPT_OUT}).')


def _checked_local_file(path: str, verify_hash: bool = True) -> str:
    """The local file behind ``path`` (a URL is downloaded once, and its hash verified then),
    checked for damage, and for a published file's name, against its hash
    (:func:`verify_published_file`)."""
    if is_url(path):
        path = cached_file(path, verify_hash=verify_hash)
        check_checkpoint_file(path)
        return path
    path = osp.expanduser(path)
    check_checkpoint_file(path)
    if verify_hash:
        verify_published_file(path)
    return path


def _read_failure(path: str, exc: BaseException) -> CheckpointError:
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
    return _unreadable(path, what)


def _unreadable(path: str, what: str) -> DamagedCheckpointError:
    return _damaged(path, f'could not be read ({_human_size(osp.getsize(path))}): {what}. It is '
                          'probably truncated or corrupt (an interrupted download or copy); '
                          'download or copy it again')


# --------------------------------------------------------------------------- data-only loading

class SetAside:
    """An object of a checkpoint that was not rebuilt: a stand-in that holds its data.

    A data-only load puts one of these wherever the file names something other than
    tensors and plain containers. ``pickled_as`` is the name the file gave
    (``'yacs.config.CfgNode'``); ``args``, ``state``, ``items`` and ``elements`` keep
    what the file would have passed to it, as data. Nothing of the named module is
    imported and nothing it names is called.
    """
    pickled_as = '?'

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.__dict__.update(args=args, kwargs=kwargs, state=None, items={}, elements=[])
        return obj

    def __init__(self, *args, **kwargs):  # the data was kept by __new__
        pass

    def __call__(self, *args, **kwargs):  # a pickled method of a set-aside object
        return _placeholder_class(f'{self.pickled_as}(...)')(*args, **kwargs)

    def __setstate__(self, state):
        self.__dict__['state'] = state

    def __setitem__(self, key, value):
        self.items[key] = value

    def append(self, value):
        self.elements.append(value)

    def add(self, value):  # a set's items, as protocol 4 pickles them
        self.elements.append(value)

    def extend(self, values):
        self.elements.extend(values)

    def __repr__(self):
        return f'<set aside: {self.pickled_as}>'


@functools.lru_cache(maxsize=None)
def _placeholder_class(full_name: str) -> type:
    """One :class:`SetAside` subclass per name the file uses (``module.qualname``)."""
    return type(f'SetAside[{full_name}]', (SetAside,),
                {'pickled_as': full_name, '__module__': __name__})


@functools.lru_cache(maxsize=1)
def _data_globals() -> dict:
    """The globals a data-only load rebuilds for real: exactly torch's weights_only set
    (tensors, storages, dtypes, ``OrderedDict``, ``torch.Size``, ...)."""
    from torch import _weights_only_unpickler
    return dict(_weights_only_unpickler._get_allowed_globals())


class _DataOnlyUnpickler(pickle.Unpickler):
    """Resolves every global to a real object only if torch's weights_only loader would,
    and to a :class:`SetAside` placeholder otherwise (without importing its module)."""

    def find_class(self, module, name):
        full_name = f'{module}.{name}'
        found = _data_globals().get(full_name)
        if found is not None:
            return found
        return _placeholder_class(full_name)


class _DataOnlyPickleModule:
    """What ``torch.load(pickle_module=...)`` needs: ``Unpickler`` and ``load``."""
    __name__ = 'mmplugin_inline_data_only'
    Unpickler = _DataOnlyUnpickler

    @staticmethod
    def load(file, **kwargs):
        return _DataOnlyUnpickler(file, **kwargs).load()


# --------------------------------------------------------------------------- walking a file

class _Damage(Exception):
    """What a walk of a file found wrong with it: the finding of a damaged-file error."""


class _PickleWalker(pickle._Unpickler):
    """Reads a pickle without rebuilding anything of it, to judge the file before torch does.

    Every global becomes an inert :class:`SetAside` placeholder (nothing is imported or
    called) and is recorded in ``named`` as ``(module, name)``; torch's storage records (the
    persistent ids) are collected in ``storages`` instead of loaded. It is the pure-Python
    unpickler, whose memo is a dict: C's unpickler, which torch's loaders use, sizes its memo
    table by the largest index it sees, so one corrupt ``LONG_BINPUT`` index of 2**31 would
    make it allocate and clear 32 GiB. An index larger than the pickle itself is refused here.
    """
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, max_memo_index: int):
        super().__init__(file, encoding='utf-8')  # torch.load's default
        self.named, self.storages = [], []
        self._max_memo_index = max_memo_index

    def find_class(self, module, name):
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        self.named.append((module, name))
        return _placeholder_class(f'{module}.{name}')

    def persistent_load(self, pid):
        kind = _as_text(pid[0]) if isinstance(pid, tuple) and pid else None
        if kind == 'storage':
            self.storages.append(pid[1:])
        elif kind != 'module':  # the legacy format's whole-module records
            raise _Damage(f'its pickle has a persistent id {_shown(pid)} that torch does not '
                          'write')
        return _placeholder_class('persistent id')()

    def _memoize_at(self, index: int) -> None:
        if index > self._max_memo_index:
            raise _Damage(f'its pickle stores an object at memo index {index}, more than the '
                          'pickle has bytes (a corrupt index)')
        if index < 0:
            raise ValueError('negative memo index')
        self.memo[index] = self.stack[-1]

    def _load_put(self):
        self._memoize_at(int(self.readline()[:-1]))

    def _load_long_binput(self):
        self._memoize_at(struct.unpack('<I', self.read(4))[0])

    dispatch[pickle.PUT[0]] = _load_put
    dispatch[pickle.LONG_BINPUT[0]] = _load_long_binput


def _as_text(value):
    return value.decode('ascii', 'replace') if isinstance(value, bytes) else value


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + '...'


def _first_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [''])[0]
    return f'{type(exc).__name__}: {first}' if first else type(exc).__name__


def _walk_pickle(walker: _PickleWalker, what: str):
    """``walker.load()``, any failure a :class:`_Damage`; returns what it read."""
    try:
        return walker.load()
    except _Damage:
        raise
    except Exception as exc:  # noqa: BLE001 - a pickle that cannot even be walked
        raise _Damage(f'{what} is not a well-formed pickle ({_first_line(exc)})') from exc


def _storage_bytes(storage_type, numel, key) -> int:
    """The bytes torch would allocate for a storage record, or :class:`_Damage`."""
    name = getattr(storage_type, 'pickled_as', '?').rsplit('.', 1)[-1]
    if name == 'UntypedStorage':
        element_size = 1
    else:
        try:  # what torch's loaders make of the name (dtype from the class name only)
            element_size = torch._utils._element_size(torch.serialization.StorageType(name).dtype)
        except Exception:  # noqa: BLE001 - an unknown storage class
            raise _Damage(f'its storage {_shown(key)} has an unknown type '
                          f'{_shown(getattr(storage_type, "pickled_as", storage_type))}') from None
    if type(numel) is not int or numel < 0:
        raise _Damage(f'its storage {_shown(key)} declares {_shown(numel)} elements')
    return numel * element_size


def _walk_zip(path: str, size: int) -> _PickleWalker:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        # torch's reader takes the folder of the first record as the archive's name
        prefix = infos[0].filename.split('/', 1)[0] + '/' if infos else ''
        records = {info.filename[len(prefix):]: info for info in infos
                   if info.filename.startswith(prefix)}
        for info in records.values():
            if info.compress_size > size or (info.compress_type == zipfile.ZIP_STORED and
                                             info.file_size != info.compress_size):
                raise _Damage(f'its zip directory gives the record {info.filename} '
                              f'{info.file_size} bytes, which the file cannot hold')
            if info.external_attr & 0x10:  # torch writes 0; miniz would read it as a folder
                raise _Damage(f'its zip directory marks the record {info.filename} as a folder')
        pkl = records.get('data.pkl')
        if pkl is None:
            raise _Damage(f'it has no {prefix}data.pkl record (the zip directory is damaged)')
        try:
            data = archive.read(pkl)  # zipfile checks the record's CRC-32
        except Exception as exc:  # noqa: BLE001 - BadZipFile, zlib.error, EOFError, ...
            raise _Damage(f'its record {pkl.filename} cannot be read ({_first_line(exc)})') \
                from exc
    walker = _PickleWalker(io.BytesIO(data), len(data))
    _walk_pickle(walker, pkl.filename)
    for record in walker.storages:
        if len(record) != 4:
            raise _Damage(f'a storage record of {pkl.filename} has {len(record)} fields, not 4')
        storage_type, key, _, numel = record
        needed = _storage_bytes(storage_type, numel, key)
        info = records.get(f'data/{key}')
        if info is None:
            raise _Damage(f'its pickle names a storage data/{key} that the archive does not hold')
        if needed > info.file_size:  # found before torch allocates it
            raise _Damage(f'its storage data/{key} declares {needed} bytes, but its record '
                          f'holds {info.file_size}')
    return walker


def _walk_legacy(path: str, size: int) -> _PickleWalker:
    with open(path, 'rb') as f:
        # torch's magic number, protocol version and system information, as torch checks them
        header = [_walk_pickle(_PickleWalker(f, size), 'its header') for _ in range(3)]
        if header[:2] != [torch.serialization.MAGIC_NUMBER, torch.serialization.PROTOCOL_VERSION] \
                or not isinstance(header[2], dict):
            raise _Damage(f'its header is not the one torch.save writes ({_shown(header)})')
        walker = _PickleWalker(f, size)
        _walk_pickle(walker, 'its pickle')
        # then the names of the storages whose bytes follow
        keys = _walk_pickle(_PickleWalker(f, size), 'its list of storages')
        if not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)):
            raise _Damage(f'its list of storages is not a list of names ({_shown(keys)})')
    total, seen = 0, set()
    for record in walker.storages:
        if len(record) != 5:
            raise _Damage(f'a storage record of its pickle has {len(record)} fields, not 5')
        storage_type, key, _, numel, _ = record
        needed = _storage_bytes(storage_type, numel, key)
        if isinstance(key, str) and key not in seen:  # views name their root storage again
            seen.add(key)
            total += needed
    if total > size:  # the storages' bytes follow the pickle in the same file
        raise _Damage(f'its storages declare {total} bytes, more than the whole file holds')
    return walker


def _walk(path: str) -> _PickleWalker:
    """Walk the pickle of the checkpoint at ``path`` (zip or legacy format) without rebuilding
    anything, and check every storage it declares against what the file can hold, so that a
    corrupt size never reaches an allocation.

    Raises:
        DamagedCheckpointError: the pickle cannot be walked, or a storage is larger than its
            zip record (the legacy format: than the file).
    """
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        zipped = f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    try:
        return _walk_zip(path, size) if zipped else _walk_legacy(path, size)
    except _Damage as exc:
        finding, cause = str(exc), exc.__cause__  # the exception behind it, if any
    except Exception as exc:  # noqa: BLE001 - zipfile on a damaged archive
        finding, cause = f'its zip archive cannot be read ({_first_line(exc)})', exc
    raise _unreadable(path, finding) from cause


# --------------------------------------------------------------------------- names in a file

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


# what torch's own loader renames before resolving a module (torch.serialization._load)
_TORCH_MODULE_RENAMES = {'torch.tensor': 'torch._tensor'}


@functools.lru_cache(maxsize=1)
def _data_modules() -> frozenset:
    return frozenset(full.rpartition('.')[0] for full in _data_globals())


def _names_data(module: str) -> bool:
    """Whether the file's data itself (tensors, storages, containers) comes from ``module``:
    torch's modules and those of torch's weights_only globals (``collections``, ...)."""
    return module.split('.')[0] == 'torch' or module in _data_modules()


def _check_names(path: str, named, every_module: bool) -> None:
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
        reason = absent_global(_TORCH_MODULE_RENAMES.get(module, module), name)
        if reason is None:
            continue
        if 'there is no module' in reason and not _names_data(module):
            likely = ('the file is probably corrupt, or it needs a package that is not installed '
                      "here. A backbone's pretrained weights are read as data only through its "
                      "init_cfg=dict(type='Pretrained', checkpoint=...), which does not need it")
        else:
            likely = 'the file is probably corrupt. Download or copy it again'
        raise _damaged(path, f'cannot be read ({_human_size(osp.getsize(path))}): it {reason}: '
                             f'{likely}')



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
    path = _checked_local_file(path, verify_hash)
    _check_names(path, _walk(path).named, every_module=allow_unsafe)
    if not allow_unsafe and os.environ.get('TORCH_FORCE_WEIGHTS_ONLY_LOAD', '0').lower() in (
            '1', 'y', 'yes', 'true'):
        # torch then refuses any custom unpickler; its own loader is the strictest reading
        return _read_run_checkpoint(path, map_location, allow_unsafe=False)
    try:
        if allow_unsafe:
            return torch.load(path, map_location=map_location, weights_only=False)
        return torch.load(path, map_location=map_location, weights_only=False,
                          pickle_module=_DataOnlyPickleModule)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the bytes is damage
        raise _read_failure(path, exc) from exc


# --------------------------------------------------------------------------- run checkpoints

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
    filename = _checked_local_file(filename, verify_hash)
    _check_names(filename, _walk(filename).named, every_module=True)
    return _read_run_checkpoint(filename, map_location, allow_unsafe)


def _read_run_checkpoint(filename: str, map_location, allow_unsafe: bool):
    """:func:`load_run_checkpoint` on a file that is checked and walked already."""
    try:
        if allow_unsafe:
            return torch.load(filename, map_location=map_location, weights_only=False)
        with _mmengine_globals_scope():
            return torch.load(filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if not allow_unsafe:  # the walk found a well-formed pickle: a refusal, not damage
            raise _refusal(filename, exc) from exc
        raise _read_failure(filename, exc) from exc
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read the bytes is damage
        raise _read_failure(filename, exc) from exc


@contextlib.contextmanager
def mmengine_checkpoint_loading(allow_unsafe: bool = False,
                                verify_hash: bool = True) -> Iterator[None]:
    """Within the block, mmengine reads checkpoints with :func:`load_run_checkpoint`
    (``allow_unsafe`` and ``verify_hash`` as there).

    Replaces the loaders that mmengine's ``CheckpointLoader`` uses for local paths and
    for ``http://`` / ``https://`` URLs and restores them on exit; other schemes
    (``s3://``, ...) are left as they are.
    """
    from mmengine.runner.checkpoint import CheckpointLoader

    def load_checkpoint_of_the_run(filename, map_location=None):  # mmengine logs the name
        return load_run_checkpoint(filename, map_location, allow_unsafe=allow_unsafe,
                                   verify_hash=verify_hash)

    prefixes = ('', 'http://', 'https://')
    previous = {p: CheckpointLoader._schemes.get(p) for p in prefixes}
    for prefix in prefixes:
        CheckpointLoader.register_scheme(prefix, load_checkpoint_of_the_run, force=True)
    try:
        yield
    finally:
        for prefix, loader in previous.items():
            if loader is None:
                CheckpointLoader._schemes.pop(prefix, None)
            else:
                CheckpointLoader.register_scheme(prefix, loader, force=True)


def guard_runner_checkpoints(runner, allow_unsafe: bool = False, verify_hash: bool = True):
    """Make ``runner`` resume / ``load_from`` through :func:`mmengine_checkpoint_loading`.

    Only the runner's ``load_or_resume`` step (what ``--resume``, ``load_from`` and
    ``tools/test.py``'s checkpoint use) runs in that scope; model initialisation,
    including pretrained backbone weights (read by :func:`load_weights`), does not.

    Returns:
        the runner, for chaining.
    """
    original = runner.load_or_resume

    def load_or_resume():
        with mmengine_checkpoint_loading(allow_unsafe, verify_hash):
            return original()

    runner.load_or_resume = load_or_resume
    return runner


# --------------------------------------------------------------------------- URLs

def is_url(path) -> bool:
    """Whether ``path`` is an ``http://`` or ``https://`` URL."""
    return isinstance(path, str) and path.lower().startswith(('http://', 'https://'))


def cache_dir() -> str:
    """Where downloaded checkpoints go: torch hub's ``checkpoints`` folder (as mmengine's
    own URL loading uses; ``TORCH_HOME`` moves it)."""
    return osp.join(torch.hub.get_dir(), 'checkpoints')


def url_file_name(url: str) -> str:
    """The cache file name for ``url``: the last part of its path, not its query.

    ``https://host/f/90ac52b1/?dl=1`` -> ``90ac52b1.pth``; ``.../swin_t.pth?x=1`` ->
    ``swin_t.pth``. A name without a suffix gets ``.pth``.
    """
    parts = [p for p in urllib.parse.urlparse(url).path.split('/') if p]
    if not parts:
        raise ValueError(f'{url}: the URL has no path to name the downloaded file after')
    name = urllib.parse.unquote(parts[-1])
    return name if osp.splitext(name)[1] else name + '.pth'


def _download_error(url: str, exc: BaseException) -> CheckpointDownloadError:
    if isinstance(exc, urllib.error.HTTPError):
        what = f'the server answered HTTP {exc.code} {exc.reason}'
        if exc.code == 404:
            what += ' (no file at that address: check the URL)'
    elif isinstance(exc, urllib.error.URLError):
        what = f'could not connect ({exc.reason}); check the address and your network'
    else:
        what = f'{type(exc).__name__}: {exc}'
    return CheckpointDownloadError(
        f'Could not download the checkpoint {url}: {what}. You can also download it yourself '
        'and give the local path instead of the URL.')


def _fetch(url: str, destination: str, progress: bool, verify_hash: bool = True) -> None:
    """Download ``url`` to ``destination`` (atomically, with a progress bar); refuse a web
    page, a damaged file or one that is not the hash in its name, leaving nothing in the
    cache."""
    os.makedirs(osp.dirname(destination), exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, destination, progress=progress)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _download_error(url, exc) from exc
    reason = damage_of(destination)
    if reason:
        os.remove(destination)
        if reason.startswith('is a web page'):
            raise CheckpointDownloadError(
                f'The checkpoint URL {url} returned a web page (HTML), not a checkpoint. For '
                'cloud-share links add `?dl=1` to the URL (e.g. '
                'https://cloud.tsinghua.edu.cn/f/KEY/?dl=1); otherwise open the link in a '
                'browser and download the file yourself.')
        raise CheckpointDownloadError(f'The file downloaded from {url} {reason}.')
    if verify_hash:  # once, here: a file in the cache came through this check
        try:
            verify_published_file(destination, shown_as=url)
        except DamagedCheckpointError as exc:
            os.remove(destination)
            raise DamagedCheckpointError(f'{exc} The downloaded file was deleted from the '
                                         'cache; the next run downloads it again.') from None


def _local_rank_and_world() -> tuple:
    """This process's rank on its machine (the launchers' ``LOCAL_RANK``) and the world size."""
    from mmengine.dist import get_dist_info
    rank, world_size = get_dist_info()
    if world_size == 1:
        return 0, 1
    return int(os.environ.get('LOCAL_RANK', rank)), world_size


def cached_file(url: str, directory: Optional[str] = None, progress: Optional[bool] = None,
                verify_hash: bool = True) -> str:
    """The local path of ``url``'s file, downloading it into the cache the first time.

    A file named ``NAME-<hex>.pth`` (torch hub's and mmdet's published names) is checked
    against that sha256 prefix once, right after the download; a mismatch deletes it.

    Under a distributed launcher only the local rank 0 of each machine downloads; the
    other ranks wait for it, then read the cached file.

    Args:
        url (str): ``http://`` or ``https://`` address.
        directory (str, optional): the cache. Default: :func:`cache_dir`.
        progress (bool, optional): show a progress bar. Default: when stderr is a terminal.
        verify_hash (bool): check a published name's hash after the download. Default: True.

    Raises:
        CheckpointDownloadError: 404, refused connection, a web page, a damaged file.
        DamagedCheckpointError: the download does not match the hash in its name.
    """
    destination = osp.join(directory or cache_dir(), url_file_name(url))
    if progress is None:
        progress = hasattr(sys.stderr, 'isatty') and sys.stderr.isatty()
    local_rank, world_size = _local_rank_and_world()
    error = None
    if local_rank == 0 and not osp.isfile(destination):
        from mmengine.logging import print_log
        print_log(f'Downloading {url} to {destination}', logger='current')
        try:
            _fetch(url, destination, progress, verify_hash)
        except CheckpointError as exc:
            error = exc
    if world_size > 1:
        import torch.distributed as dist
        dist.barrier()
    if error is not None:
        raise error
    if not osp.isfile(destination):
        raise CheckpointDownloadError(
            f'Could not download the checkpoint {url}: the process that downloads it (local '
            f'rank 0) did not leave {destination}; see its log for the reason.')
    return destination


def probe_url(url: str, timeout: float = 10.0) -> Optional[str]:
    """Why ``url`` cannot give a checkpoint (unreachable, 404, a web page), or None.

    Cheap: reads the answer's headers and first bytes only; a URL already in the cache
    is not contacted.
    """
    if osp.isfile(osp.join(cache_dir(), url_file_name(url))):
        return None
    request = urllib.request.Request(url, headers={'User-Agent': 'mmplugin_inline',
                                                   'Range': 'bytes=0-1023'})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            head = answer.read(1024)
            kind = answer.headers.get('Content-Type', '')
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(_download_error(url, exc))
    if 'text/html' in kind or _looks_like_html(head):
        return (f'The checkpoint URL {url} returns a web page (HTML), not a checkpoint. For '
                'cloud-share links add `?dl=1` to the URL.')
    return None

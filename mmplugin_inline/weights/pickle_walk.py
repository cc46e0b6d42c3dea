"""Walking a checkpoint's pickle with nothing rebuilt, to judge the file before torch
reads it: a malformed pickle, a storage larger than its record (or than the file), a
corrupt memo index. What the walk finds is damage (:class:`DamagedCheckpointError`)."""
import _compat_pickle
import io
import os.path as osp
import pickle
import struct
import zipfile

import torch

from .files import ZIP_MAGIC, unreadable
from .set_aside import placeholder_class
from .torch_private import storage_element_size


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
        return placeholder_class(f'{module}.{name}')

    def persistent_load(self, pid):
        kind = _as_text(pid[0]) if isinstance(pid, tuple) and pid else None
        if kind == 'storage':
            self.storages.append(pid[1:])
        elif kind != 'module':  # the legacy format's whole-module records
            raise _Damage(f'its pickle has a persistent id {_shown(pid)} that torch does not '
                          'write')
        return placeholder_class('persistent id')()

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
            element_size = storage_element_size(name)
        except ValueError:  # an unknown storage class
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


def walk(path: str) -> _PickleWalker:
    """Walk the pickle of the checkpoint at ``path`` (zip or legacy format) without rebuilding
    anything, and check every storage it declares against what the file can hold, so that a
    corrupt size never reaches an allocation.

    Raises:
        DamagedCheckpointError: the pickle cannot be walked, or a storage is larger than its
            zip record (the legacy format: than the file).
    """
    size = osp.getsize(path)
    with open(path, 'rb') as f:
        zipped = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    try:
        return _walk_zip(path, size) if zipped else _walk_legacy(path, size)
    except _Damage as exc:
        finding, cause = str(exc), exc.__cause__  # the exception behind it, if any
    except Exception as exc:  # noqa: BLE001 - zipfile on a damaged archive
        finding, cause = f'its zip archive cannot be read ({_first_line(exc)})', exc
    raise unreadable(path, finding) from cause

"""Publish a checkpoint of a run: only its weights and meta, named by its hash.

    python tools/model_converters/publish_model.py work_dirs/upernet/iter_160000.pth \\
        upernet_inline-swin-t_ade20k-512x512.pth
    # -> upernet_inline-swin-t_ade20k-512x512-1a2b3c4d.pth (printed as the last line)

As mmdet's tool of the same name: the training checkpoint's ``meta`` and ``state_dict``
are kept, everything else (optimizer, message hub, parameter schedulers, hooks' state)
is dropped, and the first 8 hex digits of the saved file's sha256 are appended to the
name (a trailing ``.pth`` of OUT_FILE is stripped first).

The published file holds tensors and plain Python data only, so ``torch.load(path,
weights_only=True)`` reads it without any allow-list, as mmengine, the mmdet / mmseg
inferencers and ``init_cfg=dict(type='Pretrained')`` do under torch >= 2.6: numpy
scalars and arrays in the meta become Python numbers and lists, and whatever else is not
plain data is dropped and listed. The input is read as the run's own checkpoint
(``weights_only=True`` with the allow-list of what mmengine saves); one that needs more
is refused unless you pass --allow-unsafe (only for files you trust).
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
import warnings
from collections import OrderedDict

import numpy as np
import torch

# mmengine imports pkg_resources, whose deprecation notice would bury the tool's messages
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
from mmplugin_inline.weights import CheckpointError, load_run_checkpoint, sha256_of  # noqa: E402

KEPT_KEYS = ('meta', 'state_dict')
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)
_BUILTIN_BASES = (int, float, complex, str, bytes)  # what a subclass is turned back into
_DROP = object()  # marks a value that is not plain data


def _type_name(value) -> str:
    return f'{type(value).__module__}.{type(value).__qualname__}'


def plain_data(value, where: str, dropped: list):
    """``value`` as tensors and plain Python data, or ``_DROP`` if it cannot be.

    numpy scalars become Python numbers, numpy arrays (nested) lists, subclasses of the
    builtin types (``ConfigDict``, ``torch.Size``, ...) the builtin type; containers are
    converted item by item. What remains is dropped and recorded in ``dropped`` as
    ``'WHERE (TYPE)'``.
    """
    if type(value) in _PLAIN_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().as_subclass(torch.Tensor)
    if isinstance(value, np.generic):  # np.float64, np.int64, np.bool_, np.str_, ...
        return plain_data(value.item(), where, dropped)
    if isinstance(value, np.ndarray):
        return plain_data(value.tolist(), where, dropped)
    if isinstance(value, dict):
        out = OrderedDict() if isinstance(value, OrderedDict) else {}
        for key, item in value.items():
            plain_key = plain_data(key, f'{where}[{key!r}] (its key)', dropped)
            plain_item = plain_data(item, f'{where}[{key!r}]', dropped)
            if plain_key is not _DROP and plain_item is not _DROP:
                out[plain_key] = plain_item
        metadata = getattr(value, '_metadata', None)  # a state dict's module versions
        if isinstance(out, OrderedDict) and metadata is not None:
            metadata = plain_data(metadata, f'{where}._metadata', dropped)
            if metadata is not _DROP:
                out._metadata = metadata
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [plain_data(item, f'{where}[{i}]', dropped) for i, item in enumerate(value)]
        kept = [item for item in items if item is not _DROP]
        if isinstance(value, tuple):  # namedtuples, torch.Size
            return tuple(kept)
        return set(kept) if isinstance(value, (set, frozenset)) else kept
    for base in _BUILTIN_BASES:  # a subclass of int, float, str, ... (an enum member)
        if isinstance(value, base):
            return base(value)
    dropped.append(f'{where} ({_type_name(value)})')
    return _DROP


def _refused_by_plain_weights_only(path: str):
    """The error plain ``torch.load(weights_only=True)`` raises on ``path``, or None.

    Every global allow-listed at run time (``add_safe_globals``: the plugin's mmengine
    globals, and any other) is set aside meanwhile, so the check is at least as strict as
    a process that never imported the plugin.
    """
    serialization = torch.serialization
    allowed = []
    if hasattr(serialization, 'get_safe_globals'):
        allowed = serialization.get_safe_globals()
        serialization.clear_safe_globals()
    try:
        torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - reported to the user
        return exc
    finally:
        if allowed:
            serialization.add_safe_globals(allowed)
    return None


def published_name(out_file: str, sha256: str) -> str:
    """``OUT_STEM-XXXXXXXX.pth``: mmdet's name for a published checkpoint."""
    stem = out_file[:-len('.pth')] if out_file.endswith('.pth') else out_file
    return f'{stem}-{sha256[:8]}.pth'


class PublishError(Exception):
    """The input cannot be published (the message says why)."""


def publish(in_file: str, out_file: str, allow_unsafe: bool = False) -> dict:
    """Write the published form of ``in_file``; return a summary.

    Returns:
        dict: ``path`` (the final file name), ``removed`` (top-level keys not kept) and
        ``dropped`` (values that were not plain data, ``'WHERE (TYPE)'``).

    Raises:
        PublishError: ``in_file`` is missing or has no ``state_dict``.
        CheckpointError: it is damaged (``DamagedCheckpointError``), or it needs more than
            the allow-list and ``allow_unsafe`` is False (``UnsafeCheckpointError``).
    """
    if not osp.isfile(in_file):
        raise PublishError(f'Checkpoint not found: {in_file} ({osp.abspath(in_file)}).')
    if osp.isdir(out_file):
        raise PublishError(f'{out_file} is a folder; give the name of the file to write, '
                           f'e.g. {osp.join(out_file, "model.pth")}.')
    checkpoint = load_run_checkpoint(in_file, map_location='cpu', allow_unsafe=allow_unsafe)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get('state_dict'), dict):
        keys = sorted(map(str, checkpoint)) if isinstance(checkpoint, dict) else None
        found = (f'a {type(checkpoint).__name__}' if keys is None else
                 f"keys {keys[:6]}{' and more' if len(keys) > 6 else ''}")
        raise PublishError(
            f'{in_file} is not an mmengine training checkpoint: it has no state_dict ({found}). '
            'This tool publishes the files tools/train.py writes (WORK_DIR/iter_N.pth, '
            'epoch_N.pth).')
    removed = [str(key) for key in checkpoint if key not in KEPT_KEYS]
    dropped = []
    published = {key: plain_data(checkpoint[key], key, dropped) for key in KEPT_KEYS
                 if key in checkpoint}

    out_dir = osp.dirname(osp.abspath(out_file))
    os.makedirs(out_dir, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix='.publish-', suffix='.pth', dir=out_dir)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as a file torch.save creates, not mkstemp's 0600
    try:
        with open(tmp, 'wb') as f:  # a file object: the archive inside is not named after
            torch.save(published, f)  # the temporary file, so the same input gives the same hash
        refusal = _refused_by_plain_weights_only(tmp)
        if refusal is not None:  # a type plain_data let through: a bug of this tool
            raise PublishError(f'the published file would not load with weights_only=True: '
                               f'{refusal}')
        final = published_name(out_file, sha256_of(tmp))
        os.replace(tmp, final)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
    return dict(path=final, removed=removed, dropped=dropped)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('in_file', help='checkpoint written by tools/train.py')
    parser.add_argument('out_file', help='output name; -XXXXXXXX (its sha256) is appended')
    parser.add_argument('--allow-unsafe', action='store_true',
                        help='allow full unpickling of IN_FILE (runs code in it; trusted files '
                             'only)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = publish(args.in_file, args.out_file, args.allow_unsafe)
    except (PublishError, CheckpointError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    if summary['removed']:
        print(f"removed: {', '.join(summary['removed'])} (only {' and '.join(KEPT_KEYS)} are "
              'published)')
    for entry in summary['dropped']:
        print(f'dropped, not plain data: {entry}')
    print(summary['path'])
    return 0


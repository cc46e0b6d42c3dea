"""Convert an authors' released InLine checkpoint to this plugin's backbone format.

    python tools/model_converters/inline2mm.py inline_swin_t.pth checkpoints/inline_swin_t_mm.pth

The family is detected from the keys (or given with --family). The output is
``{'state_dict': ..., 'meta': ...}`` with the backbone's key names, no classifier and
no buffers; ``init_cfg=dict(type='Pretrained', checkpoint=DST)`` loads it, as it loads
the released file directly. SRC may be a local file or an http(s) URL (downloaded once
into the cache). It is read as data only (``mmplugin_inline.weights.load_weights``):
whatever else the file holds (optimizer, a yacs config, ...) is set aside, and listed.
"""
import argparse
import os
import sys

import torch

from mmplugin_inline.weights import (
    CheckpointError,
    convert_state_dict,
    detect_family,
    dropped_entries,
    family_signatures,
    load_weights,
    split_checkpoint,
)


def convert_file(src: str, dst: str, family: str = None, allow_unsafe: bool = False,
                 verify_hash: bool = True) -> dict:
    """Convert ``src`` into ``dst``; return a summary dict."""
    obj = load_weights(src, allow_unsafe=allow_unsafe, verify_hash=verify_hash)
    raw, ignored = split_checkpoint(obj)
    detected = detect_family(raw)
    family = family or detected
    if family is None:
        raise ValueError(f'{src}: cannot tell which InLine family this checkpoint is (none of '
                         f'the known key patterns match); pass --family')
    sd = convert_state_dict(raw, family)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    torch.save({'state_dict': sd, 'meta': dict(source=os.path.basename(src), family=family)}, dst)
    return dict(family=family, detected=detected, entries_in=len(raw), entries_out=len(sd),
                dropped=list(filter(dropped_entries(family).search, raw)), ignored=ignored)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='released checkpoint ({"model": state_dict} or variants), '
                                    'a local file or an http(s) URL')
    parser.add_argument('dst', help='output file')
    parser.add_argument('--family', choices=sorted(family_signatures()),
                        help='override the detected family')
    parser.add_argument('--allow-unsafe', action='store_true',
                        help='full unpickling of SRC instead of the data-only reading (runs '
                             'code in it; trusted files only; no common file needs it)')
    parser.add_argument('--no-verify-hash', dest='verify_hash', action='store_false',
                        help='do not check a SRC named NAME-<hex>.pth against that sha256 '
                             'prefix (for a suffix that is not a hash)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = convert_file(args.src, args.dst, args.family, args.allow_unsafe,
                               args.verify_hash)
    except (FileNotFoundError, CheckpointError, ValueError, TypeError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    print(f"{args.src}: {summary['family']} checkpoint, {summary['entries_in']} entries -> "
          f"{summary['entries_out']} written to {args.dst}")
    if summary['dropped']:
        print(f"dropped (classifier / buffers): {summary['dropped']}")
    if summary['ignored']:
        print(f"ignored (not weights): {', '.join(summary['ignored'])}")
    return 0


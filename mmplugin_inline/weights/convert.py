"""Loading the authors' released classification checkpoints into the backbones.

The conversion is a pure function (:func:`convert_checkpoint`): it detects the file's
layout (``{'model': ...}``, ``{'state_dict': ...}``, ``module.`` / ``backbone.``
prefixes) and the family it was trained as, drops the classifier and the family's
non-persistent buffers, and hands the rest to the family's own hook. What is particular
to a family is declared in its backbone file: the signature of its checkpoints and their
buffers (``checkpoint_signature``, ``checkpoint_buffers``), and one hook,
``checkpoint_filter(sd, model=None)``, which renames the keys to the backbone's (with
:func:`rename_keys`) and, given the model, resizes position embeddings / tables to it.
What is generic lives here: detecting the family by its keys' signature, the layouts,
the comparison of depths, the messages. :func:`load_pretrained` adds what needs the
model: loading, and a loud report. Files (local paths or ``http(s)://`` URLs) are read
as data only by :func:`mmplugin_inline.weights.load_weights`: whatever else the file
holds (optimizer state, a yacs config, ...) is set aside, and the log says what.
"""
import logging
import re
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

from .data_only import load_weights
from .set_aside import SetAside

__all__ = ['CLASSIFIER', 'family_class', 'family_signatures', 'dropped_entries',
           'rename_keys', 'split_checkpoint', 'unwrap_state_dict', 'detect_family',
           'convert_checkpoint', 'convert_state_dict', 'depth_differences', 'load_pretrained']

CLASSIFIER = r'^head(_dist)?\.'  # classifier heads (and a distillation head): never loaded


def _families() -> dict:
    """The backbone families, by class name (each knows its checkpoints): the registered
    OpenMMLab backbones where OpenMMLab is loaded, else the plain families."""
    import sys
    if 'mmplugin_inline.registry' in sys.modules:
        return sys.modules['mmplugin_inline.registry'].registered_families()
    from mmplugin_inline.models.backbones import FAMILIES
    return {cls.__name__: cls for cls in FAMILIES.values()}


def family_signatures() -> Dict[str, re.Pattern]:
    """``{family: regex}``, the regex matching keys only that family's released
    checkpoints have (each family's ``checkpoint_signature``)."""
    return {name: re.compile(cls.checkpoint_signature) for name, cls in _families().items()
            if cls.checkpoint_signature}


def family_class(family: Union[type, str]) -> Optional[type]:
    """The backbone class ``family`` stands for: the class itself, or the class registered
    under that name (None if no family has it)."""
    return family if isinstance(family, type) else _families().get(family)


def dropped_entries(family: Union[type, str]) -> re.Pattern:
    """A regex of the entries never loaded into ``family``'s backbone: classifier heads and
    the buffers that family rebuilds at run time (its ``checkpoint_buffers``)."""
    buffers = getattr(family_class(family), 'checkpoint_buffers', None)
    return re.compile('|'.join([CLASSIFIER] + ([buffers] if buffers else [])))


def rename_keys(sd: Dict[str, torch.Tensor],
                renames: Iterable[Tuple[str, str]]) -> Dict[str, torch.Tensor]:
    """``sd`` with every key passed through the ``(regex, replacement)`` pairs in turn, in
    the same order. A family's ``checkpoint_filter`` uses it for the released key names;
    the renames must leave the backbone's own names as they are (a converted file is
    loaded through the same hook again)."""
    renames = [(re.compile(p), repl) for p, repl in renames]
    out = OrderedDict()
    for key, value in sd.items():
        for pattern, repl in renames:
            key = pattern.sub(repl, key)
        out[key] = value
    return out


_STATE_DICT_KEYS = ('state_dict', 'model', 'model_ema', 'module')


def _describe(key, value) -> str:
    return f'{key} ({value.pickled_as})' if isinstance(value, SetAside) else str(key)


def split_checkpoint(obj) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """The state dict of a checkpoint (``module.`` / ``backbone.`` stripped) and what
    else the file held, as ``['config (yacs.config.CfgNode)', 'optimizer', ...]``."""
    if isinstance(obj, SetAside):
        raise TypeError(f'the checkpoint is a pickled {obj.pickled_as} object, not a state '
                        'dict; re-save it with torch.save({"model": model.state_dict()}, path)')
    if not isinstance(obj, dict):
        raise TypeError(f'a checkpoint must be a dict, got {type(obj).__name__}')
    ignored = []
    for key in _STATE_DICT_KEYS:
        if key in obj and isinstance(obj[key], dict):
            ignored = [_describe(k, v) for k, v in obj.items() if k != key]
            obj = obj[key]
            break
    sd = OrderedDict((k, v) for k, v in obj.items() if isinstance(v, torch.Tensor))
    ignored += [_describe(k, v) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if not sd:
        raise ValueError('no tensors found in the checkpoint (expected a state dict, or a dict '
                         "with 'model' / 'state_dict')")
    if all(k.startswith('module.') for k in sd):
        sd = OrderedDict((k[len('module.'):], v) for k, v in sd.items())
    if any(k.startswith('backbone.') for k in sd):  # a detector / segmentor checkpoint
        sd = OrderedDict((k[len('backbone.'):], v) for k, v in sd.items()
                         if k.startswith('backbone.'))
    return sd, ignored


def unwrap_state_dict(obj) -> Dict[str, torch.Tensor]:
    """Find the state dict in a checkpoint and strip ``module.`` / ``backbone.`` prefixes."""
    return split_checkpoint(obj)[0]


def detect_family(sd: Dict[str, torch.Tensor]) -> Optional[str]:
    """Name of the family whose released checkpoints look like ``sd``, or None."""
    scores = {name: sum(bool(p.search(k)) for k in sd)
              for name, p in family_signatures().items()}
    best = max(scores, key=scores.get, default=None)
    return best if best and scores[best] else None


def convert_checkpoint(obj, family: Union[type, str]) -> Dict[str, torch.Tensor]:
    """Convert a released checkpoint (any supported layout) to ``family``'s key names.

    Args:
        obj (dict): the loaded checkpoint.
        family (type | str): the backbone class, or its registered name, e.g.
            ``'InLineSwinTransformer'``; its ``checkpoint_filter`` renames the keys.

    Returns:
        OrderedDict: the converted state dict (classifier and buffers dropped).
    """
    return convert_state_dict(unwrap_state_dict(obj), family)


def convert_state_dict(sd: Dict[str, torch.Tensor], family: Union[type, str],
                       model: Optional[torch.nn.Module] = None) -> Dict[str, torch.Tensor]:
    """:func:`convert_checkpoint` of a state dict already unwrapped (:func:`split_checkpoint`).

    Drops what :func:`dropped_entries` names, then applies the family's hook,
    ``checkpoint_filter(sd, model)``: the renames, and given ``model``, its adaptation to
    that model (resized position embeddings / tables, the final norm's place).
    """
    cls = family_class(family)
    dropped = dropped_entries(cls)
    sd = OrderedDict((k, v) for k, v in sd.items() if not dropped.search(k))
    hook = getattr(cls, 'checkpoint_filter', None)
    return hook(sd, model) if hook is not None else sd


def _list_lengths(keys) -> Dict[str, set]:
    """``{module list: indices}`` over ``keys``: ``stages.2.blocks.5.mlp...`` gives index 2
    of ``stages`` and 5 of ``stages.2.blocks``."""
    lists: Dict[str, set] = {}
    for key in keys:
        parts = key.split('.')
        for i, part in enumerate(parts[1:], 1):
            if part.isdigit():
                lists.setdefault('.'.join(parts[:i]), set()).add(int(part))
    return lists


def depth_differences(own_keys, checkpoint_keys) -> List[str]:
    """Module lists (blocks, stages, branches) that have another length in the
    checkpoint than in the model, as ``'stages.0.blocks: 3 in the checkpoint, 2 in the
    model'``."""
    own, theirs = _list_lengths(own_keys), _list_lengths(checkpoint_keys)
    return [f'{name}: {len(theirs[name])} in the checkpoint, {len(own[name])} in the model'
            for name in own if name in theirs and own[name] != theirs[name]]


def _fix_for(cls: type, guess: Optional[str]) -> str:
    """What to change when a checkpoint does not fit the family ``cls`` (``guess``: the
    family the file looks like, if another)."""
    family = cls.__name__
    files = sorted(cls.released_files()) if hasattr(cls, 'released_files') else []
    own = f'; the released {family} files are {", ".join(files)}' if files else ''
    if guess and guess != family:
        return f"build {guess} (type='{guess}') for this file, or give {family} weights{own}"
    presets = sorted(getattr(cls, 'arch_settings', {}))
    return ('set arch to the preset the file was made for' +
            (f' (one of {presets})' if presets else '') +
            f', or give the weights of this arch{own}')


def load_pretrained(model: torch.nn.Module, path: str, allow_unsafe: bool = False,
                    logger: Optional[logging.Logger] = None, min_match: float = 0.5,
                    verify_hash: bool = True) -> Tuple[list, list, list]:
    """Load a released checkpoint into ``model`` and report what matched.

    The model's class is the family: its ``checkpoint_filter(sd, model)`` renames the
    keys and resizes position embeddings and tables in ``sd`` to the model's
    (:func:`convert_state_dict`). Entries whose shapes still differ are skipped and
    reported.

    Returns:
        tuple: ``(missing, unexpected, mismatched)`` key lists.

    Raises:
        RuntimeError: when the checkpoint is for another family or size: less than
            ``min_match`` of the model's parameters matched, or a list of blocks (or
            stages) has another length than the model's (e.g. InLine-PVT-S weights, 3
            blocks in stage 1, into InLine-PVT-T, 2 blocks). The message names the
            family the file looks like and what to change.
    """
    from mmplugin_inline.logs import log
    raw, ignored = split_checkpoint(load_weights(path, allow_unsafe=allow_unsafe,
                                                 verify_hash=verify_hash))
    family_cls = type(model)
    family = family_cls.__name__
    sd = convert_state_dict(raw, family_cls, model)
    own = model.state_dict()
    mismatched = [k for k, v in sd.items() if k in own and own[k].shape != v.shape]
    loadable = OrderedDict((k, v) for k, v in sd.items() if k in own and k not in mismatched)
    unexpected = [k for k in sd if k not in own]
    missing = [k for k in own if k not in loadable]
    n_params = sum(1 for k, _ in model.named_parameters())
    matched_params = sum(1 for k, _ in model.named_parameters() if k in loadable)
    report = (f'{family}: loaded {len(loadable)} / {len(sd)} checkpoint entries from {path}; '
              f'{matched_params} / {n_params} model parameters matched, {len(missing)} missing, '
              f'{len(unexpected)} unexpected, {len(mismatched)} with another shape')
    depths = depth_differences(own, sd)
    if matched_params < min_match * n_params or depths:
        guess = detect_family(sd)
        shapes = [f'{k} {list(sd[k].shape)} in the file, {list(own[k].shape)} in the model'
                  for k in mismatched[:2]]
        if guess and guess != family:
            cause = f'the file looks like an {guess} checkpoint'
        elif depths or shapes:
            cause = ('the checkpoint is for another arch / size: ' +
                     '; '.join(depths[:3] + shapes))
        else:
            cause = ('the checkpoint is probably for another arch / size (e.g. small weights '
                     'into a tiny model) or another model altogether')
        raise RuntimeError(f'{family}: {path} does not fit this model: {cause}. To fix: '
                           f'{_fix_for(family_cls, guess)}. [{report}. Examples: missing '
                           f'{missing[:3]}, unexpected {unexpected[:3]}, other shape '
                           f'{mismatched[:3]}]')
    model.load_state_dict(loadable, strict=False)
    log(report, logger=logger)
    if ignored:
        log(f'{family}: ignored (not weights) in {path}: {", ".join(ignored)}', logger=logger)
    for title, keys in (('missing', missing), ('unexpected', unexpected),
                        ('shape mismatch', mismatched)):
        if keys:
            log(f'{family}: {title} keys: {keys}', logging.WARNING, logger=logger)
    return missing, unexpected, mismatched

"""Loading the authors' released classification checkpoints into the backbones.

The conversion is a pure function (:func:`convert_checkpoint`): it detects the file's
layout (``{'model': ...}``, ``{'state_dict': ...}``, ``module.`` / ``backbone.``
prefixes) and the family it was trained as, renames keys to the backbone's names and
drops the classifier and non-persistent buffers. What is particular to a family (the
signature of its checkpoints, their buffers, its renames) is declared on its backbone
class and read here from the registered families. :func:`load_pretrained` adds what
needs the model: resizing position embeddings / tables, loading, and a loud report.
Files (local paths or ``http(s)://`` URLs) are read as data only by
:func:`mmplugin_inline.loading.load_weights`: whatever else the file holds (optimizer
state, a yacs config, ...) is set aside, and the log says what.
"""
import logging
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch

from mmplugin_inline.loading import SetAside, load_weights

CLASSIFIER = r'^head(_dist)?\.'  # classifier heads (and a distillation head): never loaded


def _families() -> dict:
    """The registered backbone families, by class name (each knows its checkpoints)."""
    from mmplugin_inline.registry import registered_families  # needs mmengine: lazily
    return registered_families()


def family_signatures() -> Dict[str, re.Pattern]:
    """``{family: regex}``, the regex matching keys only that family's released
    checkpoints have (each family's ``checkpoint_signature``)."""
    return {name: re.compile(cls.checkpoint_signature) for name, cls in _families().items()
            if cls.checkpoint_signature}


def dropped_entries() -> re.Pattern:
    """A regex of the entries never loaded into a backbone: classifier heads and the
    buffers a family rebuilds at run time (each family's ``checkpoint_buffers``)."""
    return re.compile('|'.join([CLASSIFIER] + [cls.checkpoint_buffers for cls in
                                               _families().values() if cls.checkpoint_buffers]))


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


def convert_checkpoint(obj, family: str) -> Dict[str, torch.Tensor]:
    """Convert a released checkpoint (any supported layout) to ``family``'s key names.

    Args:
        obj (dict): the loaded checkpoint.
        family (str): backbone class name, e.g. ``'InLineSwinTransformer'``; its
            ``checkpoint_renames`` rename the keys.

    Returns:
        OrderedDict: the converted state dict (classifier and buffers dropped).
    """
    return convert_state_dict(unwrap_state_dict(obj), family)


def convert_state_dict(sd: Dict[str, torch.Tensor], family: str) -> Dict[str, torch.Tensor]:
    """:func:`convert_checkpoint` of a state dict already unwrapped (:func:`split_checkpoint`)."""
    renames = [(re.compile(p), repl) for p, repl in
               getattr(_families().get(family), 'checkpoint_renames', ())]
    dropped = dropped_entries()
    out = OrderedDict()
    for key, value in sd.items():
        if dropped.search(key):
            continue
        for pattern, repl in renames:
            key = pattern.sub(repl, key)
        out[key] = value
    return out


def load_pretrained(model: torch.nn.Module, path: str, family: str, allow_unsafe: bool = False,
                    logger: Optional[logging.Logger] = None,
                    min_match: float = 0.5) -> Tuple[list, list, list]:
    """Load a released checkpoint into ``model`` and report what matched.

    ``model.adapt_pretrained(sd)`` (when defined) resizes position embeddings and
    tables in ``sd`` to the model's. Entries whose shapes still differ are skipped and
    reported.

    Returns:
        tuple: ``(missing, unexpected, mismatched)`` key lists.

    Raises:
        RuntimeError: when less than ``min_match`` of the model's parameters matched,
            naming the family the checkpoint looks like.
    """
    from mmengine.logging import print_log
    raw, ignored = split_checkpoint(load_weights(path, allow_unsafe=allow_unsafe))
    sd = convert_state_dict(raw, family)
    if hasattr(model, 'adapt_pretrained'):
        sd = model.adapt_pretrained(sd)
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
    if matched_params < min_match * n_params:
        guess = detect_family(sd)
        cause = (f'the file looks like an {guess} checkpoint' if guess and guess != family else
                 'the checkpoint is probably for another arch / size (e.g. small weights into '
                 'a tiny model) or another model altogether')
        raise RuntimeError(f'{report}. Almost nothing matched: {cause}. Examples: missing '
                           f'{missing[:3]}, unexpected {unexpected[:3]}, other shape '
                           f'{mismatched[:3]}')
    model.load_state_dict(loadable, strict=False)
    print_log(report, logger=logger or 'current')
    if ignored:
        print_log(f'{family}: ignored (not weights) in {path}: {", ".join(ignored)}',
                  logger=logger or 'current')
    for title, keys in (('missing', missing), ('unexpected', unexpected),
                        ('shape mismatch', mismatched)):
        if keys:
            print_log(f'{family}: {title} keys: {keys}', logger=logger or 'current',
                      level=logging.WARNING)
    return missing, unexpected, mismatched

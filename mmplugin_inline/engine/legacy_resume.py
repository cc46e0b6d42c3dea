"""Resuming a run from a checkpoint of release 0.1: its optimizer state in today's order.

A PyTorch optimizer's state dict names parameters by their position (the order of
``model.named_parameters()`` with mmengine's optimizer constructor: one group, or one
group per parameter with ``paramwise_cfg``). Release 0.1 had another module tree, so
its parameters came in another order: loaded as it is, the moments of one parameter
would be given to another. The state dict of the checkpoint holds the old names in the
old order; the backbones' legacy-key upgrade (``upgrade_legacy_keys`` of each module
that has one) gives their names today, and :func:`upgrade_optimizer_state` moves each
parameter's state and group to its position today.
"""
from typing import Dict, List, Optional

from mmengine.logging import print_log


def upgraded_names(model, keys: List[str]) -> Dict[str, str]:
    """``{key of a release 0.1 state dict of model: today's key}`` for ``keys`` (a whole
    detector's or segmentor's), through the upgrade of every module that has one."""
    names = {k: k for k in keys}
    for prefix, module in model.named_modules():
        upgrade = getattr(module, 'upgrade_legacy_keys', None)
        if callable(upgrade):
            current = list(names.values())
            upgraded = upgrade(dict.fromkeys(current), f'{prefix}.' if prefix else '', module)
            renamed = dict(zip(current, upgraded))
            names = {k: renamed[v] for k, v in names.items()}
    return names


def reorder_optimizer_state(state: dict, old_names: List[str], new_names: List[str]) -> dict:
    """An optimizer state dict whose parameters were ``old_names`` (in index order),
    reordered for parameters ``new_names`` (the same set, another order): each index's
    state moves to the parameter's new index, and groups are ordered by their first
    parameter, with their parameters in the new order (torch pairs them by position)."""
    new_index = {name: j for j, name in enumerate(new_names)}
    to_new = {i: new_index[name] for i, name in enumerate(old_names)}
    groups = [dict(g, params=sorted(to_new[i] for i in g['params']))
              for g in state['param_groups']]
    groups.sort(key=lambda g: g['params'][0] if g['params'] else len(new_names))
    return dict(state, state={to_new[i]: s for i, s in state['state'].items()},
                param_groups=groups)


def upgrade_optimizer_state(model, state_dict: dict, optimizer_state: dict) -> Optional[dict]:
    """``optimizer_state`` of a checkpoint whose model state is ``state_dict``, in the
    parameter order of ``model`` today; None when nothing moved (a file of today) or
    the state cannot be matched (then mmengine loads it as it is and reports)."""
    if not isinstance(optimizer_state, dict) or 'param_groups' not in optimizer_state:
        return None
    names = upgraded_names(model, list(state_dict))
    params = [n for n, _ in model.named_parameters()]
    known = set(params)
    old = [names[k] for k in state_dict if names[k] in known]
    if old == params or sorted(old) != sorted(params):
        return None
    indices = [i for g in optimizer_state['param_groups'] for i in g['params']]
    if sorted(indices) != list(range(len(params))):
        return None
    print_log('Resuming from a checkpoint of release 0.1: its optimizer state is reordered '
              "to today's module tree", logger='current')
    return reorder_optimizer_state(optimizer_state, old, params)

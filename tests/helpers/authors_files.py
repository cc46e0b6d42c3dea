"""The authors' reference data (``tests/data/reference``) and files in their released
training format, with torch alone (no OpenMMLab import: the timm-face tests use it in a
Python where OpenMMLab cannot be imported).

The authors release ``max_acc.pth`` as their training script saves it: ``model``,
``optimizer``, ``lr_scheduler``, ``max_accuracy``, ``epoch`` and ``config``, a yacs
``CfgNode``. For DeiT the reference folder holds such a file written by the authors' own
code (``make_training_format_checkpoint.py``). For the other families
:func:`training_format_file` writes one in the same layout from the family's reference
weights: optimizer and scheduler states of the same shape, and a ``config`` pickled under
the name ``yacs.config.CfgNode`` (a stand-in class of that name, registered only while
saving), so that reading it needs yacs exactly as the released files do.
"""
import os
import sys
import types

import torch

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data',
                    'reference')
FAMILIES = ('pvt', 'swin', 'cswin', 'deit')
AUTHORS_MAX_ACC = {'deit': os.path.join(DATA, 'inline_deit_mini_max_acc.pth')}


def load_fixture(family: str) -> dict:
    """``inline_<family>_mini.pt``: ``arch``, ``checkpoint``, ``cases`` (README there)."""
    return torch.load(os.path.join(DATA, f'inline_{family}_mini.pt'), weights_only=True)


def reference_logits(fixture: dict, case: dict) -> torch.Tensor:
    """The authors' logits of a case: their ``forward_features`` output (``pooled``, made by
    their code) through the head of the fixture's checkpoint."""
    sd = fixture['checkpoint']['model']
    return case['pooled'] @ sd['head.weight'].T + sd['head.bias']


def _stand_in_cfgnode():
    """A module ``yacs.config`` with a ``CfgNode`` (a dict with attributes, as yacs')."""
    yacs, config = types.ModuleType('yacs'), types.ModuleType('yacs.config')

    class CfgNode(dict):
        pass

    CfgNode.__module__, CfgNode.__qualname__ = 'yacs.config', 'CfgNode'
    config.CfgNode, yacs.config = CfgNode, config
    return yacs, config, CfgNode


def training_format_file(family: str, directory: str) -> str:
    """The path of a file in the authors' released training format with ``family``'s
    reference weights (the authors' own file for DeiT)."""
    if family in AUTHORS_MAX_ACC:
        return AUTHORS_MAX_ACC[family]
    sd = load_fixture(family)['checkpoint']['model']
    params = [v for v in sd.values() if v.is_floating_point()]
    yacs, config, CfgNode = _stand_in_cfgnode()
    cfg = CfgNode(MODEL=CfgNode(TYPE=f'inline_{family}', NUM_CLASSES=10),
                  TRAIN=CfgNode(EPOCHS=300, BASE_LR=1e-3))
    cfg.__dict__['__immutable__'] = True  # yacs keeps its flags in the instance dict
    saved = {name: sys.modules.get(name) for name in ('yacs', 'yacs.config')}
    sys.modules.update({'yacs': yacs, 'yacs.config': config})
    path = os.path.join(directory, f'inline_{family}_mini_max_acc.pth')
    try:
        torch.save({'model': sd,
                    'optimizer': {'state': {i: {'step': torch.tensor(1.0),
                                                'exp_avg': torch.zeros_like(p),
                                                'exp_avg_sq': torch.zeros_like(p)}
                                            for i, p in enumerate(params)},
                                  'param_groups': [{'lr': 1e-3, 'weight_decay': 0.05,
                                                    'params': list(range(len(params)))}]},
                    'lr_scheduler': {'t_initial': 300, 'last_epoch': 299},
                    'max_accuracy': 80.1, 'epoch': 299, 'config': cfg}, path)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return path

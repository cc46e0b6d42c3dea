"""Write ``inline_deit_mini_max_acc.pth`` with the InLine authors' own training code.

The InLine authors' ``main.py`` saves ``max_acc.pth`` (the file they release) through
``utils.save_checkpoint_new``: ``{'model', 'optimizer', 'lr_scheduler', 'max_accuracy',
'epoch', 'config'}``, where ``config`` is a yacs ``CfgNode``. This script runs *their*
code to make such a file from the DeiT reference fixture's weights, so that the tests
read a file in the exact format users download, made by code we did not write:

* their ``config.py`` (yacs ``_C`` merged with their ``cfgs/inline_deit_t.yaml``);
* their ``optimizer.build_optimizer`` (AdamW, their weight-decay groups), one real step;
* their ``lr_scheduler.build_scheduler`` (timm's cosine scheduler), a few updates;
* their ``utils.save_checkpoint_new(..., name='max_acc')``.

The fixture's weights are put back before saving, so the file's ``model`` gives the
fixture's reference outputs. Run it once, by hand, where the authors' repository and
yacs are importable (neither is a dependency of this project)::

    pip install --target /tmp/yacs_env yacs
    PYTHONPATH=/path/to/LeapLabTHU/InLine:/tmp/yacs_env \\
        .venv/bin/python tests/data/make_training_format_checkpoint.py /path/to/LeapLabTHU/InLine
"""
import logging
import os
import sys
import tempfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, 'reference', 'inline_deit_mini.pt')
OUT = os.path.join(HERE, 'reference', 'inline_deit_mini_max_acc.pth')


class ParameterHolder(nn.Module):
    """A module whose parameters and buffers carry exactly the given state-dict names."""

    def __init__(self, state_dict):
        super().__init__()
        for key, value in state_dict.items():
            owner = self
            *path, leaf = key.split('.')
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            if value.is_floating_point():
                owner.register_parameter(leaf, nn.Parameter(value.clone()))
            else:
                owner.register_buffer(leaf, value.clone())


def main(authors_repo: str) -> str:
    sys.path.insert(0, authors_repo)
    from config import _C, _update_config_from_file  # the authors' yacs config
    from lr_scheduler import build_scheduler
    from optimizer import build_optimizer
    from utils import save_checkpoint_new

    weights = torch.load(FIXTURE, weights_only=True)['checkpoint']['model']
    model = ParameterHolder(weights)
    assert list(model.state_dict()) == list(weights)

    config = _C.clone()
    _update_config_from_file(config, os.path.join(authors_repo, 'cfgs', 'inline_deit_t.yaml'))
    out_dir = tempfile.mkdtemp()
    config.defrost()
    config.OUTPUT = out_dir
    config.freeze()

    optimizer = build_optimizer(config, model)
    lr_scheduler = build_scheduler(config, optimizer, n_iter_per_epoch=10)
    torch.manual_seed(0)
    loss = sum((p * torch.randn_like(p)).sum() for p in model.parameters())
    loss.backward()
    optimizer.step()
    for step in range(3):
        lr_scheduler.step_update(step)
    model.load_state_dict(weights)  # the released weights, not the stepped ones

    logger = logging.getLogger('authors')
    save_checkpoint_new(config, 300, model, 72.5, optimizer, lr_scheduler, logger,
                        name='max_acc')
    os.replace(os.path.join(out_dir, 'max_acc.pth'), OUT)
    return OUT


if __name__ == '__main__':
    print(main(sys.argv[1]))

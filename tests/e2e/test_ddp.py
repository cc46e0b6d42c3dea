"""Distributed training without ``find_unused_parameters``: every parameter of the model
must get a gradient in every step, else DDP stops at the start of the second one. The
launch is also the test of ``tools/dist_train.sh`` with two CPU processes
(``helpers.runs.dist_train_two_processes``: distributed, 2 steps an epoch, saved); how the
launcher picks its rendezvous is checked without starting torchrun."""
import os
import os.path as osp
import subprocess

import pytest
from mmengine.config import Config

from helpers.runs import dist_train_two_processes
from helpers.tiny_models import REPO, det_run_config

DEIT_DET_CONFIG = osp.join(REPO, 'configs/inline_deit/mask-rcnn_inline-deit-s_sfp_1x_coco.py')
# mmengine's default wrapper, spelled out: the DDP reducer expects a gradient for every
# parameter and raises "Expected to have finished reduction in the prior iteration" in
# the forward of the next step when one had none
STRICT_DDP = """
model_wrapper_cfg = dict(type='MMDistributedDataParallel', find_unused_parameters=False,
                         broadcast_buffers=False)
train_cfg = dict(max_epochs=1, val_interval=2)  # train only: no validation after the epoch
"""


@pytest.mark.slow
def test_deit_mask_rcnn_trains_with_ddp_without_find_unused_parameters(shapes, tmp_path):
    config = tmp_path / 'mask-rcnn_inline-deit_tiny.py'
    config.write_text(det_run_config(DEIT_DET_CONFIG, shapes + '/', batch_size=1) + STRICT_DDP)
    cfg = Config.fromfile(str(config))
    assert cfg.model.backbone.type == 'InLineDeiT'
    assert 'final_norm' not in cfg.model.backbone  # the default, False: no final norm
    assert cfg.model_wrapper_cfg.find_unused_parameters is False
    # 2 steps per process, the second being where DDP would fail
    dist_train_two_processes(config, str(tmp_path / 'work'))


def _torchrun_args(tmp_path, **env):
    """What tools/dist_train.sh passes to ``python -m torch.distributed.run`` (a PYTHON
    that prints its arguments instead of running them)."""
    fake = tmp_path / 'python'
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if k not in ('PORT', 'NNODES', 'NODE_RANK')}
    full.update(env, PYTHON=str(fake))
    out = subprocess.run(['bash', osp.join(REPO, 'tools/dist_train.sh'), 'CONFIG', '2',
                          '--work-dir', 'W'], env=full, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ['-m', 'torch.distributed.run'] and '--nproc_per_node=2' in out
    assert out[-5:] == ['CONFIG', '--work-dir', 'W', '--launcher', 'pytorch']
    return out


def test_one_machine_without_port_lets_torchrun_pick_the_port(tmp_path):
    """No fixed port on one machine (a port found free and handed over can be taken by a
    second run in between): torchrun's standalone rendezvous binds one the system picks."""
    args = _torchrun_args(tmp_path)
    assert '--standalone' in args and not any(a.startswith('--master_port') for a in args)
    args = _torchrun_args(tmp_path, PORT='')  # set but empty: the same
    assert '--standalone' in args


def test_a_given_port_or_several_nodes_use_a_fixed_port(tmp_path):
    args = _torchrun_args(tmp_path, PORT='29533')
    assert '--master_port=29533' in args and '--standalone' not in args
    args = _torchrun_args(tmp_path, NNODES='2', NODE_RANK='1', MASTER_ADDR='10.0.0.1')
    assert {'--nnodes=2', '--node_rank=1', '--master_addr=10.0.0.1',
            '--master_port=29500'} <= set(args) and '--standalone' not in args

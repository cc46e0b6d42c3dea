"""Distributed training without ``find_unused_parameters``: every parameter of the model
must get a gradient in every step, else DDP stops at the start of the second one. The
launch is also the test of ``tools/dist_train.sh`` with two CPU processes
(``helpers.runs.dist_train_two_processes``: distributed, 2 steps an epoch, saved)."""
import os.path as osp

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

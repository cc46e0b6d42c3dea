"""Fixtures shared by the test files; ``helpers`` (beside this file) holds the shared code.

``shapes``, ``det_run`` and ``seg_run`` are made once per pytest run (also across
pytest-xdist workers, see ``helpers.shared``) and are read-only for the tests.
"""
import os
import os.path as osp
from types import SimpleNamespace

import pytest

from helpers.runs import DET_CONFIG, PYTHON, SEG_CONFIG, make_shapes, ok, run_tool
from helpers.shared import shared_dir
from helpers.tiny_models import REPO, det_run_config, seg_run_config
from mmplugin_inline.weights import load_run_checkpoint


def pytest_configure(config):
    if os.environ.get('PYTEST_XDIST_WORKER'):  # 2 workers on 2 cores: one thread each
        import torch
        torch.set_num_threads(1)


@pytest.fixture(scope='session')
def shapes(tmp_path_factory):
    """A small shapes data set (COCO json + ADE20K-style maps): 4 training, 2 val images."""
    def make(out):
        assert make_shapes.main([str(out), '--train', '4', '--val', '2', '--min-size', '64',
                                 '--max-size', '96', '--seed', '3']) == 0
    return str(shared_dir(tmp_path_factory, 'shapes', make))


def _train_and_test(root, config_text, checkpoint, *test_args, bare_weights=False):
    """tools/train.py of ``config_text`` into ROOT/work, then tools/test.py of its
    ``checkpoint`` (or of a file holding only its state dict) into ROOT/test."""
    import torch
    config = osp.join(root, 'config.py')
    with open(config, 'w') as f:
        f.write(config_text)
    work = osp.join(root, 'work')
    ok(*run_tool([PYTHON, osp.join(REPO, 'tools/train.py'), config, '--work-dir', work])[:2])
    weights = osp.join(work, checkpoint)
    if bare_weights:
        weights = osp.join(root, 'weights.pth')
        torch.save({'state_dict': load_run_checkpoint(osp.join(work, checkpoint))['state_dict']},
                   weights)
    ok(*run_tool([PYTHON, osp.join(REPO, 'tools/test.py'), config, weights, '--work-dir',
                  osp.join(root, 'test'), *test_args])[:2])


@pytest.fixture(scope='session')
def det_run(shapes, tmp_path_factory):
    """The tiny Mask R-CNN (``det_run_config``) trained 1 epoch on ``shapes`` (4 images,
    batch 2: epoch_1.pth at iteration 2, one validation), and tools/test.py of
    epoch_1.pth with ``--show-dir pictures --out preds.pkl``."""
    root = shared_dir(tmp_path_factory, 'det_run', lambda root: _train_and_test(
        str(root), det_run_config(DET_CONFIG, shapes + '/'), 'epoch_1.pth',
        '--show-dir', 'pictures', '--out', osp.join(str(root), 'preds.pkl')))
    return SimpleNamespace(config=str(root / 'config.py'), work=str(root / 'work'),
                           checkpoint=str(root / 'work' / 'epoch_1.pth'),
                           test_dir=str(root / 'test'), preds=str(root / 'preds.pkl'))


@pytest.fixture(scope='session')
def seg_run(shapes, tmp_path_factory):
    """The tiny UperNet (``seg_run_config``) trained 2 iterations on ``shapes``
    (iter_2.pth, validation at 2), and tools/test.py with ``--out preds`` (the label maps)
    of a file holding only iter_2.pth's state dict (no meta)."""
    root = shared_dir(tmp_path_factory, 'seg_run', lambda root: _train_and_test(
        str(root), seg_run_config(SEG_CONFIG, shapes), 'iter_2.pth',
        '--out', osp.join(str(root), 'preds'), bare_weights=True))
    return SimpleNamespace(config=str(root / 'config.py'), work=str(root / 'work'),
                           checkpoint=str(root / 'work' / 'iter_2.pth'),
                           test_dir=str(root / 'test'), preds=str(root / 'preds'))

"""Running the repository's tools as users do: as subprocesses, or their scripts as modules."""
import importlib.util
import os
import os.path as osp
import socket
import subprocess
import sys

from mmplugin_inline.loading import load_run_checkpoint

from .tiny_models import REPO

PYTHON = sys.executable
DET_CONFIG = osp.join(REPO, 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py')
SEG_CONFIG = osp.join(REPO, 'configs/inline_swin/upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py')


def load_script(relpath: str):
    """Import a script of the repository (``tools/...py``, ``demo/...py``) as a module."""
    spec = importlib.util.spec_from_file_location(osp.basename(relpath)[:-3],
                                                  osp.join(REPO, relpath))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


make_shapes = load_script('tools/misc/make_shapes_dataset.py')


def run_tool(args, cwd=REPO, timeout=300, env=None):
    """Run a tool as a subprocess; return (returncode, stdout + stderr, stderr)."""
    full_env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='2')
    full_env.update(env or {})
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    return proc.returncode, proc.stdout + proc.stderr, proc.stderr


def ok(rc, out):
    """Assert a tool run succeeded, showing the end of its output otherwise."""
    assert rc == 0, out[-6000:]


def checkpoint_meta(path):
    """The ``meta`` of a checkpoint a run wrote."""
    return load_run_checkpoint(path)['meta']


def free_port():
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def dist_train_two_processes(config, work: str) -> str:
    """``tools/dist_train.sh CONFIG 2`` on the 4 shapes images, 1 image per process and
    step; checks that it ran 2 distributed steps and saved; returns the output."""
    rc, out, _ = run_tool(['bash', osp.join(REPO, 'tools/dist_train.sh'), str(config), '2',
                           '--work-dir', work],
                          env=dict(PYTHON=PYTHON, PORT=str(free_port()), OMP_NUM_THREADS='1'))
    ok(rc, out)
    assert 'Distributed training: True' in out
    # 4 images, 1 per process and step: 2 steps per epoch with 2 processes (4 with one)
    assert 'Epoch(train) [1][2/2]' in out
    assert checkpoint_meta(osp.join(work, 'epoch_1.pth'))['iter'] == 2
    return out

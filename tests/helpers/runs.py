"""Running the repository's tools as users do (as subprocesses), and what the tests of runs
share; a tool's insides are imported from ``mmplugin_inline.cli`` and the package."""
import glob
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import time

from mmplugin_inline.analysis.scalars import read_scalars
from mmplugin_inline.cli import make_shapes_dataset as make_shapes  # noqa: F401 (for the tests)
from mmplugin_inline.weights import load_run_checkpoint

from .tiny_models import REPO

PYTHON = sys.executable
DET_CONFIG = osp.join(REPO, 'configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py')
SEG_CONFIG = osp.join(REPO, 'configs/inline_swin/upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py')
# threads of a tool run: the 2 cores, or 1 under pytest-xdist (2 workers share them)
THREADS = '1' if os.environ.get('PYTEST_XDIST_WORKER') else '2'


def run_tool(args, cwd=REPO, timeout=300, env=None):
    """Run a tool as a subprocess; return (returncode, stdout + stderr, stderr)."""
    full_env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS=THREADS)
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


def dist_train_two_processes(config, work: str) -> str:
    """``tools/dist_train.sh CONFIG 2`` on the 4 shapes images, 1 image per process and
    step (no ``PORT``: torchrun picks a free one); checks that it ran 2 distributed steps
    and saved; returns the output."""
    rc, out, _ = run_tool(['bash', osp.join(REPO, 'tools/dist_train.sh'), str(config), '2',
                           '--work-dir', work],
                          env=dict(PYTHON=PYTHON, PORT='', OMP_NUM_THREADS='1'))
    ok(rc, out)
    assert 'Distributed training: True' in out
    # 4 images, 1 per process and step: 2 steps per epoch with 2 processes (4 with one)
    assert 'Epoch(train) [1][2/2]' in out
    assert checkpoint_meta(osp.join(work, 'epoch_1.pth'))['iter'] == 2
    return out


def kill_when_logged(args, needle: str, cwd=REPO, timeout=300, env=None, tree=False):
    """Start a tool as a subprocess and SIGKILL it as soon as a line of its output
    contains ``needle``; return (returncode, output). The output read after the kill
    (what the pipe still held) is included. ``tree``: its child processes are killed
    too, at the same moment (torchrun starts each worker in a session of its own)."""
    full_env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS=THREADS)
    full_env.update(env or {})
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=full_env)
    lines, deadline = [], time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                for pid in [proc.pid] + (_descendants(proc.pid) if tree else []):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:  # it ended in the meantime
                        pass
                break
            if time.monotonic() > deadline:
                break
        lines += proc.stdout.readlines()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    return proc.returncode, ''.join(lines)


def _descendants(pid: int) -> list:
    """The ids of every process below ``pid`` (Linux ``/proc``)."""
    found = []
    for task in glob.glob(f'/proc/{pid}/task/*/children'):
        with open(task) as f:
            for child in f.read().split():
                found += [int(child)] + _descendants(int(child))
    return found


def dist_train_args(config, work: str, *extra, nproc: int = 2):
    """(args, env) of ``tools/dist_train.sh CONFIG NPROC --work-dir WORK EXTRA...`` on CPU
    processes, with ``tests/`` importable (for ``helpers.run_hooks``). No ``PORT``: torchrun
    listens on a port the system picks (two launches at once never get the same one)."""
    args = ['bash', osp.join(REPO, 'tools/dist_train.sh'), str(config), str(nproc),
            '--work-dir', str(work), *extra]
    env = dict(PYTHON=PYTHON, PORT='', OMP_NUM_THREADS='1',
               PYTHONPATH=REPO + os.pathsep + osp.join(REPO, 'tests'))
    return args, env


def train_losses(work_dir):
    """{iteration: loss} of every training line of WORK_DIR/*/vis_data/scalars.json
    (several runs in one work directory: the later run's line wins)."""
    return {entry['iter']: entry['loss'] for entry in read_scalars(work_dir) if 'loss' in entry}


def max_weight_difference(path_a, path_b):
    """Largest absolute difference between the state dicts of two run checkpoints (also
    checks they have the same keys and shapes)."""
    a, b = (load_run_checkpoint(p, map_location='cpu')['state_dict'] for p in (path_a, path_b))
    assert a.keys() == b.keys()
    worst = 0.0
    for key, value in a.items():
        assert value.shape == b[key].shape, key
        if value.is_floating_point():
            worst = max(worst, (value - b[key]).abs().max().item() if value.numel() else 0.0)
        else:
            worst = max(worst, float((value != b[key]).any()))
    return worst


def tool_failure(main, argv, capsys):
    """Run a tool's ``main(argv)`` in-process; return the stderr of its status-1 exit.

    Checks what every tool promises on bad input: exit status 1 and one message, no
    traceback.
    """
    import pytest
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert 'Traceback' not in out + err
    return err


def truncate(path, keep=0.5):
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:int(len(data) * keep)])


def work_dir_of_a_cut_save(work, pointer, ref=None):
    """A work directory as a run killed while saving iter_9.pth leaves it: iter_3 and
    iter_6 complete, iter_9.pth truncated (and the newest file), ``last_checkpoint``
    naming ``pointer``. The checkpoints are ``ref``'s, or small torch.save files."""
    import torch
    os.makedirs(work)
    for it in (3, 6, 9):
        if ref is None:
            torch.save({'meta': {'iter': it}, 'state_dict': {'w': torch.full((64,), it)}},
                       work / f'iter_{it}.pth')
        else:
            shutil.copy(ref / f'iter_{it}.pth', work / f'iter_{it}.pth')
        os.utime(work / f'iter_{it}.pth', (time.time() + it, time.time() + it))
    truncate(work / 'iter_9.pth')
    (work / 'last_checkpoint').write_text(str(work / pointer))

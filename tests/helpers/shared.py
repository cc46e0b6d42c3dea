"""Set-up that many tests share, made once per pytest session: the shapes data set and one
tiny detection and one tiny segmentation run (trained and tested by tools/train.py and
tools/test.py as subprocesses; see the fixtures in tests/conftest.py).

With pytest-xdist each worker is a session of its own; ``shared_dir`` makes the folder
once for all of them: the first worker to ask makes it under a file lock in the folder
the workers' temporary folders share, the others wait and reuse it. Tests read these
folders and never write into them (copy a run with ``copy_run`` to resume it).
"""
import fcntl
import os
import shutil
from pathlib import Path


def shared_dir(tmp_path_factory, name: str, make) -> Path:
    """A folder ``name`` made by ``make(path)`` once per pytest run (all workers)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        base = base.parent  # .../pytest-N/popen-gwK: the workers share pytest-N
    path = base / f'shared_{name}'
    with open(base / f'shared_{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (path / '.done').exists():
                if path.exists():  # an attempt that failed: start again
                    shutil.rmtree(path)
                path.mkdir()
                make(path)
                (path / '.done').write_text('')
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return path


def copy_run(work_dir, dest) -> str:
    """A copy of a run's work directory whose ``last_checkpoint`` names the copy's file,
    for a test that resumes it (the shared run stays as it is)."""
    dest = str(dest)
    shutil.copytree(str(work_dir), dest)
    pointer = os.path.join(dest, 'last_checkpoint')
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = os.path.basename(f.read().strip())
        with open(pointer, 'w') as f:
            f.write(os.path.join(dest, name))
    return dest

"""Run code in a Python where no OpenMMLab package can be imported.

:func:`run_without_openmmlab` starts a fresh interpreter of this environment whose import
system refuses ``mmcv``, ``mmengine``, ``mmdet`` and ``mmseg`` (and their submodules) as if
they were not installed, runs ``code`` there and, at the end, fails if any module of those
packages was imported. It is how the tests show that the timm face (and the plain models
under it) needs torch and timm only.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKED = ('mmcv', 'mmengine', 'mmdet', 'mmseg')

_PRELUDE = f'''
import sys
BLOCKED = {BLOCKED!r}


class _NotInstalled:
    """A meta-path finder that answers for the OpenMMLab packages as for missing ones."""

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'No module named {{name!r}}', name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''

_EPILOGUE = '''
_loaded = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
assert not _loaded, f'OpenMMLab modules were imported: {_loaded}'
print('NO-OPENMMLAB-IMPORTED')
'''


def run_without_openmmlab(code: str, timeout: float = 600) -> str:
    """Run ``code`` (a script) with the OpenMMLab packages blocked; returns its stdout.

    Raises AssertionError with the output when the script fails or an OpenMMLab module
    was imported."""
    script = _PRELUDE + textwrap.dedent(code) + _EPILOGUE
    paths = [ROOT, os.path.join(ROOT, 'tests')] + \
        [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.setdefault('OMP_NUM_THREADS', '1')
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and 'NO-OPENMMLAB-IMPORTED' in proc.stdout, out[-6000:]
    return proc.stdout

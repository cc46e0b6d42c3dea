"""The offline bundle for a GPU node (``make bundle``, ``scripts/gpu_check.py --bundle``),
tested on the CPU.

The slow test builds the bundle for this machine's Python and the running OpenMMLab line,
creates a fresh environment that holds only torch (with torchvision) and what every GPU
image with torch has (numpy, opencv, scipy, matplotlib: ``make_bundle.NODE_PROVIDES``;
linked from the running environment, not installed), installs the bundle there with no
index, and runs the check's CPU mode: it says there is no GPU, runs one backbone forward
and exits 0. mmcv is compiled by the check unless a wheel for the same mmcv, torch and
Python is in the cache that scripts/setup_env.sh fills (it is, after ``make setup``), as
on a node where it ran before.
"""
import json
import os
import os.path as osp
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from helpers.local_server import refused_port
from helpers.runs import ok, run_tool
from helpers.tiny_models import REPO
from scripts import gpu_check, make_bundle

pytestmark = pytest.mark.xdist_group('bundle')

#: what the fresh environment links from the running one: torch (with what it requires)
#: and the packages every GPU image with torch has, which the bundle leaves to the node
NODE_DISTS = ['torch', 'torchvision', 'numpy', 'opencv-python', 'opencv-python-headless',
              'scipy', 'matplotlib']


def _line():
    from mmplugin_inline.utils import stacks
    line, problems = stacks.detect_line()
    assert line is not None and not problems, problems
    return line


def _closure(names):
    """The installed distributions ``names`` need, with their requirements (markers and
    extras evaluated for this interpreter)."""
    seen, todo = {}, [(n, frozenset()) for n in names]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata['Name'].lower()
        if key in seen and extras <= seen[key][1]:
            continue
        seen[key] = (dist, extras | seen.get(key, (None, frozenset()))[1])
        for text in dist.requires or []:
            req = Requirement(text)
            envs = [dict(default_environment(), extra=e) for e in (extras or {''})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return [d for d, _ in seen.values()]


def _fresh_node_env(root):
    """A new venv (no pip packages of ours) whose site-packages links only the closure of
    NODE_DISTS from the running environment."""
    base = getattr(sys, '_base_executable', sys.executable)
    subprocess.run([base, '-m', 'venv', str(root)], check=True, timeout=300)
    python = osp.join(root, 'bin', 'python')
    site = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
                                         '["purelib"])'], check=True, capture_output=True,
                          text=True).stdout.strip()
    linked = []
    for dist in _closure(NODE_DISTS):
        tops = {str(f).split('/')[0] for f in dist.files or []}
        for top in tops:
            src = str(dist.locate_file(top))
            dst = osp.join(site, top)
            if top.endswith('.pth') or top == '..' or not osp.exists(src) or osp.lexists(dst):
                continue
            os.symlink(src, dst)
        linked.append(dist.metadata['Name'])
    return python, linked


def test_the_mmcv_cache_key_is_the_one_setup_env_writes():
    """gpu_check reuses the wheels of scripts/setup_env.sh: same folder, same key."""
    import torch

    from mmplugin_inline.utils import stacks
    line = _line()
    dist = stacks.COMPONENT['mmcv'].dists[line]
    import mmcv
    key = gpu_check._mmcv_key(dist, mmcv.__version__, None)
    with open(osp.join(REPO, 'scripts', 'setup_env.sh'), encoding='utf-8') as f:
        assert 'KEY="$MMCV_DIST-$MMCV-torch-$TORCH-$PYTAG-$(uname -m)"' in f.read()
    assert key == (f"{dist}-{mmcv.__version__}-torch-{torch.__version__.split('+')[0]}-"
                   f'cp{sys.version_info[0]}{sys.version_info[1]}-{os.uname().machine}')
    assert gpu_check._mmcv_key(dist, '2.3.6', '9.0').endswith('-cuda9.0')
    assert gpu_check._dist_of_wheel('wheels/onedl_mmcv-2.3.6-cp312-cp312-linux_x86_64.whl') \
        == ('onedl-mmcv', '2.3.6')


def test_the_summary_names_each_step():
    report = dict(date='2026-12-04T10:00:00', ok=False, python='3.12.3', torch='2.11.0',
                  torch_cuda='13.0', cuda_available=True, device='NVIDIA H200',
                  capability='9.0', memory_gib=139.8,
                  bundle=dict(installed=['a.whl'], target='/t', seconds=3.0, node_had={},
                              mmcv=dict(dist='onedl-mmcv', version='2.3.6', built=True,
                                        cuda_ops=False, cuda_arch=None, build_seconds=70)),
                  env_check=dict(ok=True),
                  cuda_tests=dict(counts={'passed': 3, 'failed': 1}, tests=[
                      dict(test='t::a', outcome='failed', message='wrong', seconds=1.0)]),
                  benchmark=dict(ok=True, results={'results.md': '| a | b |'}))
    text = '\n'.join(gpu_check.summary_lines(report))
    assert 'FAILED' in text.splitlines()[0] and 'NVIDIA H200' in text
    assert 'onedl-mmcv 2.3.6 built (CPU ops) in 70 s' in text
    assert "FAILED t::a: wrong" in text and '| a | b |' in text


@pytest.mark.slow
def test_bundle_installs_offline_into_a_torch_only_environment_and_checks(tmp_path):
    line = _line()
    bundle = tmp_path / 'bundle'
    rc, out, _ = run_tool([sys.executable, osp.join(REPO, 'scripts', 'make_bundle.py'),
                           '--stack', line, '--out', str(bundle)], cwd=REPO, timeout=900)
    ok(rc, out)
    with open(bundle / 'manifest.json') as f:
        manifest = json.load(f)
    total = sum(f['bytes'] for f in manifest['files'])
    assert total <= make_bundle.MAX_BYTES, total
    wheels = {gpu_check._dist_of_wheel(f['path'])[0] for f in manifest['files']
              if f['path'].startswith('wheels/')}
    assert not wheels & {'torch', 'torchvision', 'numpy', 'triton'}, wheels
    assert 'mmplugin-inline' in wheels and set(manifest['codebases']) <= wheels
    assert (bundle / 'README.md').is_file() and (bundle / manifest['mmcv']['source']).is_file()
    assert manifest['python_version'] == '{}.{}'.format(*sys.version_info[:2])

    python, linked = _fresh_node_env(tmp_path / 'node')
    assert 'torch' in [n.lower() for n in linked]
    # nothing of the stack is importable there before the bundle is installed
    probe = subprocess.run([python, '-c', 'import mmengine'], capture_output=True, text=True)
    assert probe.returncode != 0 and 'mmengine' in probe.stderr

    out_dir = tmp_path / 'check'
    with refused_port() as port:  # no index, and any reach for the network fails
        dead = f'http://127.0.0.1:{port}'
        env = dict(os.environ, PIP_NO_INDEX='1', PYTHONPATH='', HTTP_PROXY=dead,
                   HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead, no_proxy='',
                   NO_PROXY='')
        rc, out, _ = run_tool([python, osp.join(REPO, 'scripts', 'gpu_check.py'), '--bundle',
                               str(bundle), '--out-dir', str(out_dir),
                               '--target', str(tmp_path / 'site')], cwd=str(tmp_path),
                              env=env, timeout=1500)
    ok(rc, out)
    assert 'no CUDA device' in out
    with open(out_dir / 'gpu_check.json') as f:
        report = json.load(f)
    assert report['ok'] is True and report['cuda_available'] is False
    assert report['env_check']['ok'] is True, report['env_check']
    assert report['cpu_smoke']['ok'] is True, report['cpu_smoke']
    assert 'backbone forward: [(1, 64, 24, 32)' in report['cpu_smoke']['output']
    installed = ' '.join(report['bundle']['installed'])
    assert 'mmplugin_inline' in installed and 'torch-' not in installed
    assert report['bundle']['mmcv']['dist'] == manifest['mmcv']['dist']
    assert (out_dir / 'summary.txt').read_text().startswith('gpu-check')

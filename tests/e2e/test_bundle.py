"""The offline bundle for a GPU node (``make bundle``, ``scripts/gpu_check.py --bundle``),
tested on the CPU.

The slow tests build the bundle for this machine's Python and the running OpenMMLab line,
create a fresh environment that holds only torch (with torchvision) and what every GPU
image with torch has (numpy, opencv, scipy, matplotlib: ``make_bundle.NODE_PROVIDES``;
linked from the running environment, not installed; no pytest, no hypothesis), and run
the check there with no index: without --cpu it refuses (no GPU) before installing; with
--cpu it installs, runs the environment check, one backbone forward and the collection
of the cuda tests, and exits 0; the cuda tests collect from its install. A second node
already holds the line's packages, which the check keeps. mmcv is compiled by the check
unless a wheel for the same mmcv, torch (and its CUDA build) and Python is in the cache
that scripts/setup_env.sh fills (it is, after ``make setup``), as on a node where it ran
before.
"""
import json
import os
import os.path as osp
import re
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


def _fresh_node_env(root, dists):
    """A new venv (no pip packages of ours) whose site-packages links only the closure of
    ``dists`` from the running environment."""
    base = getattr(sys, '_base_executable', sys.executable)
    subprocess.run([base, '-m', 'venv', str(root)], check=True, timeout=300)
    python = osp.join(root, 'bin', 'python')
    site = subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
                                         '["purelib"])'], check=True, capture_output=True,
                          text=True).stdout.strip()
    linked = []
    for dist in _closure(dists):
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
    """gpu_check reuses the wheels of scripts/setup_env.sh: same folder, same key, which
    holds torch's CUDA build and the ops kind (a CPU-ops wheel is never taken for one with
    CUDA ops, nor one built for another CUDA)."""
    import torch

    from mmplugin_inline.utils import stacks
    line = _line()
    dist = stacks.COMPONENT['mmcv'].dists[line]
    import mmcv
    key = gpu_check._mmcv_key(dist, mmcv.__version__, None)
    with open(osp.join(REPO, 'scripts', 'setup_env.sh'), encoding='utf-8') as f:
        script = f.read()
    assert 'KEY="$MMCV_DIST-$MMCV-torch-$TORCH-$TORCH_CUDA-$PYTAG-$(uname -m)-ops-cpu"' in script
    # setup_env.sh's TORCH_CUDA, run here
    code = script.split('TORCH_CUDA=$("$PY" -c \'')[1].split("\')")[0]
    torch_cuda = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                                check=True).stdout.strip()
    assert torch_cuda == ('cu' + torch.version.cuda.replace('.', '') if torch.version.cuda
                          else 'cpu')
    assert key == (f"{dist}-{mmcv.__version__}-torch-{torch.__version__.split('+')[0]}-"
                   f'{torch_cuda}-cp{sys.version_info[0]}{sys.version_info[1]}-'
                   f'{os.uname().machine}-ops-cpu')
    assert gpu_check._mmcv_key(dist, '2.3.6', '9.0').endswith(f'{os.uname().machine}-ops-cuda9.0')
    # the CPU-ops build hides a visible GPU from mmcv's setup.py
    assert "FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=''" in script
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


def _cuda_test_ids(python, env=None):
    """``pytest -m cuda --collect-only`` in the checkout with ``python``: (rc, output, the
    collected test ids)."""
    rc, out, _ = run_tool([python, '-m', 'pytest', '-m', 'cuda', '--collect-only', '-q',
                           '-p', 'no:cacheprovider'], cwd=REPO, env=env, timeout=600)
    return rc, out, sorted(line for line in out.splitlines() if '::' in line)


def _offline(env_extra, port):
    dead = f'http://127.0.0.1:{port}'
    return dict(os.environ, PIP_NO_INDEX='1', PYTHONPATH='', HTTP_PROXY=dead,
                HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead, no_proxy='', NO_PROXY='',
                **env_extra)


@pytest.fixture(scope='module')
def bundle(tmp_path_factory):
    """The bundle of the running line for this Python (``make_bundle.py``), built once."""
    out = tmp_path_factory.mktemp('bundle') / 'bundle'
    rc, log, _ = run_tool([sys.executable, osp.join(REPO, 'scripts', 'make_bundle.py'),
                           '--stack', _line(), '--out', str(out)], cwd=REPO, timeout=900)
    ok(rc, log)
    return out


@pytest.mark.slow
def test_bundle_installs_offline_into_a_torch_only_node_and_checks(bundle, tmp_path):
    """The issue's stand-in node: a venv with torch, torchvision, numpy, opencv, scipy and
    matplotlib only (no pytest, no hypothesis, no OpenMMLab). Without a GPU and without
    --cpu the check refuses before installing anything; with --cpu it installs and passes;
    from its install every cuda test is collected with no error; a node that already has
    the line keeps its packages; no temporary install is left behind."""
    with open(bundle / 'manifest.json') as f:
        manifest = json.load(f)
    total = sum(f['bytes'] for f in manifest['files'])
    assert total <= make_bundle.MAX_BYTES, total
    wheels = {gpu_check._dist_of_wheel(f['path'])[0] for f in manifest['files']
              if f['path'].startswith('wheels/')}
    assert not wheels & {'torch', 'torchvision', 'numpy', 'triton'}, wheels
    assert 'mmplugin-inline' in wheels and set(manifest['codebases']) <= wheels
    # the test runner, what the tests import beside the package, and the build tools
    assert {'pytest', 'pluggy', 'iniconfig', 'hypothesis', 'sortedcontainers', 'ninja',
            'setuptools', 'wheel'} <= wheels, wheels
    assert (bundle / 'README.md').is_file() and (bundle / manifest['mmcv']['source']).is_file()
    assert manifest['python_version'] == '{}.{}'.format(*sys.version_info[:2])

    python, linked = _fresh_node_env(tmp_path / 'node', NODE_DISTS)
    assert 'torch' in [n.lower() for n in linked]
    for module in ('mmengine', 'pytest', 'hypothesis'):  # none of it before the bundle
        probe = subprocess.run([python, '-c', f'import {module}'], capture_output=True,
                               text=True)
        assert probe.returncode != 0 and module in probe.stderr
    rc, out, expected = _cuda_test_ids(sys.executable)  # in this (the developers') env
    ok(rc, out)
    assert len(expected) > 10, out[-2000:]

    check = [python, osp.join(REPO, 'scripts', 'gpu_check.py'), '--bundle', str(bundle)]
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    with refused_port() as port:  # no index, and any reach for the network fails
        env = _offline(dict(TMPDIR=str(tmp)), port)
        # 1. no GPU, no --cpu: refused before anything is installed
        rc, out, _ = run_tool(check + ['--out-dir', str(tmp_path / 'refused'), '--target',
                                       str(tmp_path / 'never')], cwd=str(tmp_path), env=env,
                              timeout=600)
        assert rc == gpu_check.REFUSED, out[-3000:]
        assert 'refused before installing anything' in out and 'no GPU' in out
        assert not (tmp_path / 'never').exists() and os.listdir(tmp) == []
        # 2. --cpu: installs, checks, exits 0 (the install kept in --target)
        out_dir = tmp_path / 'check'
        rc, out, _ = run_tool(check + ['--cpu', '--out-dir', str(out_dir), '--target',
                                       str(tmp_path / 'site')], cwd=str(tmp_path), env=env,
                              timeout=1500)
        ok(rc, out)
        # 3. the cuda tests from that install, with the node's python: all, no error
        rc, out, ids = _cuda_test_ids(python, env=dict(
            env, PYTHONPATH=str(tmp_path / 'site'),
            PATH=os.pathsep.join([str(tmp_path / 'site' / 'bin'), os.environ['PATH']])))
    ok(rc, out)
    assert ids == expected and not re.search(r'\d+ errors?\b', out), out[-3000:]
    with open(out_dir / 'gpu_check.json') as f:
        report = json.load(f)
    assert report['ok'] is True and report['cuda_available'] is False
    assert report['env_check']['ok'] is True, report['env_check']
    assert report['cpu_smoke']['ok'] is True, report['cpu_smoke']
    assert 'backbone forward: [(1, 64, 24, 32)' in report['cpu_smoke']['output']
    assert report['cuda_collect']['collected'] == len(expected), report['cuda_collect']
    installed = ' '.join(report['bundle']['installed'])
    assert 'mmplugin_inline' in installed and 'torch-' not in installed
    assert 'pytest-' in installed and 'hypothesis-' in installed
    assert report['bundle']['mmcv']['dist'] == manifest['mmcv']['dist']
    assert (out_dir / 'summary.txt').read_text().startswith('gpu-check')
    assert os.listdir(tmp) == []  # the mmcv build (if any) cleaned up after itself


@pytest.mark.slow
def test_a_node_that_has_the_line_keeps_it_and_the_temporary_install_goes(bundle, tmp_path):
    """A node whose environment already holds the line's packages (its mmcv with ops, as
    administrators install it): the check installs only the plugin and what is missing,
    builds no mmcv, and without --target leaves nothing in the temporary folder."""
    from mmplugin_inline.utils import stacks
    line = _line()
    line_dists = [c.dists[line] for c in stacks.COMPONENTS]
    python, linked = _fresh_node_env(tmp_path / 'node', NODE_DISTS + line_dists)
    assert set(line_dists) <= {n.lower() for n in linked}
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    out_dir = tmp_path / 'check'
    with refused_port() as port:
        rc, out, _ = run_tool([python, osp.join(REPO, 'scripts', 'gpu_check.py'), '--bundle',
                               str(bundle), '--cpu', '--out-dir', str(out_dir)],
                              cwd=str(tmp_path), env=_offline(dict(TMPDIR=str(tmp)), port),
                              timeout=1500)
    ok(rc, out)
    with open(out_dir / 'gpu_check.json') as f:
        report = json.load(f)
    installed = {gpu_check._dist_of_wheel(w)[0] for w in report['bundle']['installed']}
    assert 'mmplugin-inline' in installed and not installed & set(line_dists), installed
    mmcv = stacks.COMPONENT['mmcv'].dists[line]  # a source in the bundle, not a wheel
    assert set(line_dists) - {mmcv} <= set(report['bundle']['node_had']), report['bundle']
    assert report['bundle']['mmcv']['node'].startswith(mmcv)
    assert report['ok'] is True and report['env_check']['ok'] is True
    assert os.listdir(tmp) == [], os.listdir(tmp)  # the temporary install is gone

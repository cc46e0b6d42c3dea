"""scripts/gpu_check.py looks at the node before it installs anything: each refusal, on a
node faked piece by piece (its torch, its packages, its OpenMMLab distributions, nvcc);
what it installs over a node that already has a line; the CPUs it compiles with; the
output folder it refuses. The whole check on a stand-in node is tests/e2e/test_bundle.py."""
import argparse
import json
import os
import platform
import sys

import pytest

from scripts import gpu_check

PYTHON = '{}.{}'.format(*sys.version_info[:2])
NODE = {'torch': 'torch 2.8.0', 'torchvision': 'torchvision 0.23.0', 'numpy': 'numpy 2.2.6',
        'cv2': 'opencv-python 4.11.0.86', 'scipy': 'scipy 1.16.3',
        'matplotlib': 'matplotlib 3.10.7'}
ONEDL = {'onedl-mmengine': '0.10.12', 'onedl-mmcv': '2.3.6', 'onedl-mmdetection': '3.5.1',
         'onedl-mmsegmentation': '1.4.2'}
OFFICIAL = {'mmengine': '0.10.7', 'mmcv': '2.1.0', 'mmdet': '3.3.0',
            'mmsegmentation': '1.2.2'}


def _manifest(stack='onedl', python=PYTHON, files=()):
    mmcv = 'onedl-mmcv' if stack == 'onedl' else 'mmcv'
    codebases = {d: v for d, v in (ONEDL if stack == 'onedl' else OFFICIAL).items()
                 if d != mmcv}
    return dict(stack=stack, python_version=python, arch=platform.machine(),
                mmcv=dict(dist=mmcv, version=(ONEDL if stack == 'onedl' else OFFICIAL)[mmcv],
                          source='src/x.tar.gz'),
                codebases=codebases, files=list(files))


def _torch(version='2.8.0', cuda='12.4', gpu=True, capability='9.0'):
    info = dict(torch=version, torch_cuda=cuda, cuda_available=gpu, python=PYTHON)
    if gpu:
        info['capability'] = capability
    return info


@pytest.fixture
def node(monkeypatch):
    """A fake node: its packages, OpenMMLab distributions, mmcv ops and nvcc, as set."""
    state = dict(packages=dict(NODE), dists={}, ops='cpu', nvcc=('/cuda/bin/nvcc', '12.4'))
    stacks = gpu_check.load_stacks()
    monkeypatch.setattr(stacks, 'installed_version', lambda d: state['dists'].get(d))
    monkeypatch.setattr(gpu_check, 'load_stacks', lambda: stacks)
    monkeypatch.setattr(gpu_check, 'node_packages', lambda: dict(state['packages']))
    monkeypatch.setattr(gpu_check, 'node_mmcv_ops', lambda: state['ops'])
    monkeypatch.setattr(gpu_check, 'nvcc_cuda', lambda: state['nvcc'])
    monkeypatch.setattr(gpu_check, '_installed', lambda d: state['dists'].get(d))
    return state


def _check(manifest=None, torch_info=None, cpu=False, cuda_ops=False, arch=None):
    args = argparse.Namespace(cpu=cpu, cuda_ops=cuda_ops, arch=arch)
    return gpu_check.preflight(args, manifest, torch_info or _torch())


def test_a_sound_node_is_not_refused(node):
    facts = _check(_manifest())
    assert facts['refusals'] == [] and facts['build_mmcv'] and facts['keep'] == {}


def test_no_gpu_is_refused_unless_cpu_asks_for_the_smoke(node):
    facts = _check(_manifest(), _torch(gpu=False))
    (reason,) = facts['refusals']
    assert reason.startswith('no GPU') and 'sees no CUDA device' in reason
    assert '--gres=gpu:1' in reason and '--cpu' in reason
    (reason,) = _check(_manifest(), _torch(cuda=None, gpu=False))['refusals']
    assert 'CPU-only build' in reason
    assert _check(_manifest(), _torch(gpu=False), cpu=True)['refusals'] == []


@pytest.mark.parametrize('version', ['2.7.1+cu126', '2.6.0', '2.5.1+cu124', '1.13.1'])
def test_a_torch_below_the_floor_is_refused_by_name(node, version):
    (reason,) = _check(_manifest(), _torch(version))['refusals']
    floor = gpu_check.load_stacks().TORCH_FLOOR
    assert f'torch {version} is older than the lowest torch' in reason
    assert f'torch >= {floor}' in reason


def test_missing_node_packages_are_named_with_what_the_node_has(node):
    node['packages'].update(numpy=None, cv2=None)
    (reason,) = _check(_manifest())['refusals']
    assert 'the node lacks numpy, opencv-python-headless' in reason
    assert 'torch 2.8.0' in reason and 'pip install numpy opencv-python-headless' in reason


def test_a_bundle_for_another_python_is_refused_with_the_command(node):
    (reason,) = _check(_manifest(python='3.99'))['refusals']
    assert 'Python 3.99' in reason and f'runs Python {PYTHON}' in reason
    assert f'make bundle BUNDLE_STACK=onedl BUNDLE_PYTHON={PYTHON}' in reason


def test_a_node_with_the_other_line_is_told_which_bundle_to_make(node):
    node['dists'] = dict(OFFICIAL)
    (reason,) = _check(_manifest('onedl'))['refusals']
    assert 'mmcv 2.1.0' in reason and 'mmdet 3.3.0' in reason
    assert f'make bundle BUNDLE_STACK=official BUNDLE_PYTHON={PYTHON}' in reason


def test_a_node_with_mixed_lines_is_refused_without_touching_them(node):
    node['dists'] = dict(ONEDL, mmdet='3.3.0')
    (reason,) = _check(_manifest())['refusals']
    assert 'conflict' in reason and 'mmdet 3.3.0' in reason and 'onedl-mmcv 2.3.6' in reason
    assert 'pip uninstall' not in reason  # the node's site-packages are not ours to edit


def test_a_node_with_the_bundles_line_keeps_its_packages(node):
    node['dists'] = dict(ONEDL)
    facts = _check(_manifest())
    assert facts['refusals'] == [] and facts['keep'] == ONEDL
    assert not facts['build_mmcv']                      # its mmcv has its ops
    node['ops'] = None                                  # no ops (a source install): built
    facts = _check(_manifest())
    assert facts['build_mmcv'] and 'onedl-mmcv' not in facts['keep']
    assert any('has no ops' in n for n in facts['notes'])
    node['ops'] = 'cpu'                                 # CPU ops, --cuda-ops: built
    facts = _check(_manifest(), cuda_ops=True)
    assert facts['build_mmcv'] and facts['cuda_arch'] == '9.0'
    node['ops'] = '12.4'                                # CUDA ops: nothing to build
    facts = _check(_manifest(), cuda_ops=True)
    assert not facts['build_mmcv'] and facts['refusals'] == []


def test_a_node_with_an_unsupported_version_of_the_line_is_refused(node):
    node['dists'] = dict(ONEDL, **{'onedl-mmdetection': '4.1.0'})
    (reason,) = _check(_manifest())['refusals']
    assert 'onedl-mmdetection 4.1.0 (supported: 3.4.0 to below 4.0.0)' in reason


def test_cuda_ops_need_nvcc_of_torchs_cuda_and_an_architecture(node):
    node['nvcc'] = (None, None)
    (reason,) = _check(_manifest(), cuda_ops=True)['refusals']
    assert 'needs nvcc of CUDA 12.4' in reason and 'CUDA_HOME' in reason
    node['nvcc'] = ('/cuda/bin/nvcc', '11.8')
    (reason,) = _check(_manifest(), cuda_ops=True)['refusals']
    assert 'CUDA 11.8' in reason and 'major releases must match' in reason
    node['nvcc'] = ('/cuda/bin/nvcc', '12.6')            # same major: a note only
    facts = _check(_manifest(), cuda_ops=True)
    assert facts['refusals'] == [] and any('12.6' in n for n in facts['notes'])
    reasons = _check(_manifest(), _torch(cuda=None, gpu=False), cpu=True,
                     cuda_ops=True, arch='9.0')['refusals']
    assert len(reasons) == 1 and 'CPU-only build' in reasons[0], reasons
    # no visible GPU: the architecture must be given, and then it builds without one
    (reason,) = _check(_manifest(), _torch(gpu=False), cpu=True, cuda_ops=True)['refusals']
    assert '--arch' in reason
    facts = _check(_manifest(), _torch(gpu=False), cpu=True, cuda_ops=True, arch='9.0')
    assert facts['refusals'] == [] and facts['cuda_arch'] == '9.0'


def test_install_skips_what_the_node_has_and_the_kept_line(node, monkeypatch, tmp_path):
    node['dists'] = dict(ONEDL, addict='2.4.0')
    files = [dict(path=f'wheels/{w}') for w in (
        'onedl_mmdetection-3.5.1-py3-none-any.whl', 'mmplugin_inline-0.2.0-py3-none-any.whl',
        'addict-2.4.0-py3-none-any.whl', 'pytest-8.4.2-py3-none-any.whl',
        'onedl_mmengine-0.10.12-py3-none-any.whl')]
    calls = []
    monkeypatch.setattr(gpu_check, '_pip', lambda args, *a, **k: calls.append(args) or 0.1)
    keep = {d: v for d, v in ONEDL.items() if d != 'onedl-mmengine'}   # say its engine is not
    out = gpu_check.install_bundle('/b', _manifest(files=files), str(tmp_path), keep,
                                   str(tmp_path / 'log'), 60)
    assert out['installed'] == ['mmplugin_inline-0.2.0-py3-none-any.whl',
                                'onedl_mmengine-0.10.12-py3-none-any.whl',
                                'pytest-8.4.2-py3-none-any.whl']
    assert out['node_had'] == {'onedl-mmdetection': '3.5.1', 'addict': '2.4.0'}
    assert calls[0][:2] == ['install', '--no-deps'] and '--target' in calls[0]


def test_jobs_follow_the_cpus_the_process_may_use(monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv('SLURM_CPUS_PER_TASK', raising=False)
    assert gpu_check.available_cpus() == 16
    monkeypatch.setenv('SLURM_CPUS_PER_TASK', '4')
    assert gpu_check.available_cpus() == 4
    assert gpu_check.parse_args([]).jobs == 4


def test_cuda_ops_with_an_architecture_need_no_gpu_but_go_with_a_bundle():
    args = gpu_check.parse_args(['--bundle', 'b', '--cuda-ops', '--arch', '9.0'])
    assert args.arch == '9.0' and args.cuda_ops
    for bad in (['--bundle', 'b', '--cuda-ops', '--arch', 'sm90'], ['--cuda-ops']):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)


def test_the_cxx20_patch_only_where_torch_needs_it(tmp_path):
    assert not gpu_check.needs_cxx20('2.8.0') and not gpu_check.needs_cxx20('2.9.1+cu128')
    assert gpu_check.needs_cxx20('2.10.0') and gpu_check.needs_cxx20('2.14.1+cu130')
    (tmp_path / 'setup.py').write_text("args = ['-std=c++17']\n")
    gpu_check.patch_cxx20(str(tmp_path))
    assert (tmp_path / 'setup.py').read_text() == "args = ['-std=c++20']\n"


def test_a_non_empty_output_folder_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / 'gpu_check.json').write_text('{"ok": true}')
    assert gpu_check.main(['--out-dir', str(tmp_path), '--cpu']) == gpu_check.REFUSED
    assert 'is not empty' in capsys.readouterr().err
    assert os.listdir(tmp_path) == ['gpu_check.json']
    assert json.loads((tmp_path / 'gpu_check.json').read_text()) == {'ok': True}


def test_a_refusal_installs_nothing_and_reports_every_step_not_run(node, monkeypatch,
                                                                  tmp_path, capsys):
    bundle = tmp_path / 'bundle'
    bundle.mkdir()
    (bundle / 'manifest.json').write_text(json.dumps(_manifest(files=[
        dict(path='wheels/addict-2.4.0-py3-none-any.whl')])))
    monkeypatch.setattr(gpu_check, 'torch_facts', lambda: _torch(gpu=False))

    def no_pip(*args, **kwargs):
        raise AssertionError('pip ran after a refusal')
    monkeypatch.setattr(gpu_check, '_pip', no_pip)
    target = tmp_path / 'site'
    rc = gpu_check.main(['--out-dir', str(tmp_path / 'out'), '--bundle', str(bundle),
                         '--target', str(target)])
    assert rc == gpu_check.REFUSED and not target.exists()
    err = capsys.readouterr().err
    assert 'refused before installing anything' in err and 'no GPU' in err
    report = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())
    assert report['ok'] is False and report['exit'] == gpu_check.REFUSED
    assert {report[s]['status'] for s in ('env_check', 'cuda_tests', 'benchmark')} == \
        {'not run'}
    summary = (tmp_path / 'out' / 'summary.txt').read_text()
    assert 'REFUSED' in summary.splitlines()[0] and 'refused: no GPU' in summary

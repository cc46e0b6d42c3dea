"""OpenMMLab's mim on the installed package: search, train and test.

The package is installed as users get it, from a wheel built from a copy of the
repository into a temporary folder (``pip install --target``), so ``.mim/`` (configs,
tools, demo, model-index.yml) is what setup.py puts into a wheel; mim then finds it on
PYTHONPATH. mim runs with proxies pointing at a closed port on 127.0.0.1 and no package
index, so anything reaching for the network fails. mim train trains the tiny Mask R-CNN
2 iterations on the shapes data; mim test tests its checkpoint.
"""
import glob
import json
import os.path as osp
import re
import shutil
import sys

import pytest
import yaml

from helpers.local_server import refused_port
from helpers.runs import DET_CONFIG, PYTHON, checkpoint_meta, ok, run_tool
from helpers.tiny_models import REPO, det_run_config

# one pytest-xdist worker runs this file's tests: they share the wheel install (a module fixture)
pytestmark = pytest.mark.xdist_group('mim')

#: developer scripts (scripts/ in the repository), which the wheel's .mim/tools must not hold
DEVELOPER_SCRIPTS = ('setup_env.sh', 'gpu_check.py', 'gen_model_index.py', 'misc/gpu_check.py',
                     'misc/gen_model_index.py')
# what a wheel is built from (setup.cfg reads README.md; MANIFEST.in lists the rest)
SOURCES = ('setup.py', 'setup.cfg', 'pyproject.toml', 'README.md', 'MANIFEST.in', 'requirements',
           'mmplugin_inline', 'configs', 'tools', 'demo', 'model-index.yml')


def _onedl_mim():
    """The fork's mim (onedl-mim) finds an installed package's folder from the first entry
    of its RECORD, which pip writes sorted: for a wheel whose distribution and package names
    agree (``mmplugin_inline-0.1.0.dist-info/`` sorts before ``mmplugin_inline/``) that is the
    dist-info folder, so search / train / test look for ``.mim`` there. Editable installs
    (``make setup``) are found through direct_url.json and work."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version('onedl-mim')
    except PackageNotFoundError:
        return None


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """A folder holding mmplugin_inline installed from its wheel (not editable)."""
    if _onedl_mim():
        pytest.skip(f'onedl-mim {_onedl_mim()} looks for .mim in the dist-info folder of a '
                    'wheel install (see _onedl_mim); its editable install is tested below')
    src = tmp_path_factory.mktemp('src')
    ignore = shutil.ignore_patterns('__pycache__', '.mim', '*.egg-info')
    for name in SOURCES:
        path = osp.join(REPO, name)
        if osp.isdir(path):
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    target = tmp_path_factory.mktemp('site')
    rc, out, _ = run_tool([PYTHON, '-m', 'pip', 'install', '--disable-pip-version-check',
                           '--no-deps', '--no-build-isolation', '--no-compile', '--no-index',
                           '--target', str(target), str(src)], cwd=str(src))
    ok(rc, out)
    return str(target)


def mim(site, args, cwd, timeout=600, python=PYTHON):
    """``python -m mim ARGS`` seeing the wheel install first on its path (``site``; None:
    nothing but the environment of ``python``), offline."""
    with refused_port() as port:
        dead = f'http://127.0.0.1:{port}'
        env = dict(PYTHONPATH=site or '', http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead,
                   HTTPS_PROXY=dead, no_proxy='', NO_PROXY='', PIP_NO_INDEX='1')
        return run_tool([python, '-m', 'mim'] + args, cwd=str(cwd), env=env, timeout=timeout)


def model_names():
    """The names of every model of the model index (what ``mim search`` must list)."""
    names = set()
    with open(osp.join(REPO, 'model-index.yml')) as f:
        for metafile in yaml.safe_load(f)['Import']:
            with open(osp.join(REPO, metafile)) as g:
                names |= {m['Name'] for m in yaml.safe_load(g)['Models']}
    return names


def test_the_wheel_carries_configs_tools_and_the_model_index(site):
    mim_dir = osp.join(site, 'mmplugin_inline', '.mim')
    for rel in ('model-index.yml', 'tools/train.py', 'tools/test.py',
                'configs/inline_pvt/metafile.yml', 'configs/mask_rcnn_inline_pvt.py'):
        assert osp.isfile(osp.join(mim_dir, rel)), rel
        assert not osp.islink(osp.join(mim_dir, rel))  # copies, not links into a source tree
    for rel in DEVELOPER_SCRIPTS:  # what users run, not the developer scripts
        assert not osp.exists(osp.join(mim_dir, 'tools', rel)), rel
    with open(osp.join(REPO, 'model-index.yml')) as f:
        for metafile in yaml.safe_load(f)['Import']:
            assert osp.isfile(osp.join(mim_dir, metafile)), metafile


def test_mim_search_lists_every_model_offline(site, tmp_path):
    rc, out, _ = mim(site, ['search', 'mmplugin_inline'], tmp_path)
    ok(rc, out)
    assert set(re.findall(r'^config id: (\S+)$', out, re.M)) == model_names()
    assert 'https://cloud.tsinghua.edu.cn/f/90ac52b1555b401eb5e6/?dl=1' in out  # PVT-T weights

    rc, out, _ = mim(site, ['search', 'mmplugin_inline', '--model', 'inline-swin',
                            '--field', 'config'], tmp_path)
    ok(rc, out)
    configs = re.findall(r'^config\s+(\S+)$', out, re.M)
    assert configs and all(c.startswith('configs/inline_swin/') for c in configs)


@pytest.mark.slow
def test_mim_train_and_test_run_the_installed_tools(site, shapes, tmp_path):
    config = tmp_path / 'mask-rcnn_tiny.py'
    config.write_text(det_run_config(DET_CONFIG, shapes + '/'))
    work = str(tmp_path / 'work')
    rc, out, _ = mim(site, ['train', 'mmplugin_inline', str(config), '--work-dir', work],
                     tmp_path)  # 1 epoch: 4 images, batch 2
    ok(rc, out)
    assert osp.join(site, 'mmplugin_inline', '.mim', 'tools', 'train.py') in out
    assert checkpoint_meta(osp.join(work, 'epoch_1.pth'))['iter'] == 2

    test_dir = str(tmp_path / 'test')
    rc, out, _ = mim(site, ['test', 'mmplugin_inline', str(config), '--checkpoint',
                            osp.join(work, 'epoch_1.pth'), '--work-dir', test_dir], tmp_path)
    ok(rc, out)
    assert osp.join(site, 'mmplugin_inline', '.mim', 'tools', 'test.py') in out
    metrics_files = glob.glob(osp.join(test_dir, '*', '2*.json'))
    assert len(metrics_files) == 1
    with open(metrics_files[0]) as f:
        assert {'coco/bbox_mAP', 'coco/segm_mAP'} <= json.load(f).keys()


def test_editable_install_links_the_mim_extension(tmp_path):
    """An editable install (setup.py's build_py in editable mode) links, never copies."""
    import setup  # the repository's setup.py (the repository root is on pytest's path)
    package = tmp_path / 'mmplugin_inline'
    package.mkdir()
    (package / '.mim').mkdir()
    (package / '.mim' / 'configs').write_text('stale')  # replaced, whatever was there
    setup.link_mim_extension(str(package))
    for item in setup.MIM_ITEMS:
        link = package / '.mim' / item
        assert osp.islink(link) and osp.samefile(link, osp.join(REPO, item)), item


def test_mim_search_in_the_environment_make_setup_builds(tmp_path):
    """``mim search`` in the repository's venv of the running stack (``make setup``, .venv/;
    ``make setup STACK=onedl``, .venv-onedl/: an editable install) with nothing on
    PYTHONPATH, from another folder. mim reads ``<dist-info location>/
    mmplugin_inline/.mim/model-index.yml``; the editable install keeps its dist-info in
    site-packages, where scripts/setup_env.sh links ``.mim`` (before, mim reported the
    model index missing)."""
    venv = osp.basename(sys.prefix)
    python = osp.join(REPO, venv, 'bin', 'python')
    if not venv.startswith('.venv') or not osp.isfile(python):
        pytest.skip('not run from a venv of the repository (make setup makes one)')
    rc, origin, _ = run_tool([python, '-c', 'import importlib.util as u; '
                              'print(u.find_spec("mmplugin_inline").origin)'],
                             cwd=str(tmp_path), env=dict(PYTHONPATH=''))
    ok(rc, origin)
    origin = origin.strip().splitlines()[-1]
    if not osp.samefile(osp.dirname(origin), osp.join(REPO, 'mmplugin_inline')):
        pytest.skip(f'.venv/ holds the package of another checkout ({origin})')
    rc, out, _ = mim(None, ['search', 'mmplugin_inline'], tmp_path, python=python)
    ok(rc, out)
    assert set(re.findall(r'^config id: (\S+)$', out, re.M)) == model_names()

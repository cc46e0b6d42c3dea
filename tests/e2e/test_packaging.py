"""Packaging as pip sees it: the metadata setuptools builds from this checkout.

Neither OpenMMLab line (the official releases, the onedl-* fork) is an install
requirement: each has an extra of its name, and `.[all]` is line-neutral, so an install
into either line's environment never pulls in the other's. mmcv is built separately
(OpenMMLab's convention; ``requirements/mminstall.txt`` lists it for ``mim install``). The
licence and citation files agree with the package. The wheel's ``.mim/tools`` holds what users run,
not the developer scripts of ``scripts/``.
"""
import email
import glob
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from helpers.tiny_models import REPO

# one pytest-xdist worker runs this file's tests: they share the wheel metadata (a module fixture)
pytestmark = pytest.mark.xdist_group('packaging')


@pytest.fixture(scope='module')
def metadata(tmp_path_factory):
    """The METADATA file of a wheel built from this checkout (setuptools' own backend)."""
    out = tmp_path_factory.mktemp('meta')
    code = ('import sys, setuptools.build_meta as b; '
            'print(b.prepare_metadata_for_build_wheel(sys.argv[1]))')
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1')
    res = subprocess.run([sys.executable, '-c', code, str(out)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    dist_info = res.stdout.strip().splitlines()[-1]
    with open(osp.join(out, dist_info, 'METADATA'), encoding='utf-8') as f:
        return email.message_from_string(f.read())


def _requirements(metadata):
    return [Requirement(r) for r in metadata.get_all('Requires-Dist') or []]


def _extra_of(req):
    """The extra a requirement belongs to ('' for an install requirement)."""
    if req.marker is None:
        return ''
    found = re.search(r'extra\s*==\s*"([^"]+)"', str(req.marker))
    return found.group(1) if found else ''


def _pins(name='pinned.txt'):
    pins = {}
    with open(osp.join(REPO, 'requirements', name), encoding='utf-8') as f:
        for line in f:
            line = line.split('#')[0].strip()
            if '==' in line:
                name, version = line.split('==')
                pins[name.strip().lower()] = Version(version.strip())
    return pins


def _by_extra(metadata):
    by_extra = {}
    for r in _requirements(metadata):
        by_extra.setdefault(_extra_of(r), set()).add(r.name.lower())
    return by_extra


def _line_dists():
    from mmplugin_inline.utils import stacks
    return {line: {c.dists[line] for c in stacks.COMPONENTS} | ({'mmcv-lite', 'mmcv-full'}
            if line == stacks.OFFICIAL else set()) for line in (stacks.OFFICIAL, stacks.ONEDL)}


def test_no_openmmlab_line_is_an_install_requirement(metadata):
    """`pip install .` must not pull one line's packages over the other's: no distribution
    of either line is a plain requirement (mmengine included: the fork's is onedl-mmengine)."""
    plain = _by_extra(metadata)['']
    assert {'torch', 'timm'} <= plain
    for line, dists in _line_dists().items():
        assert not plain & dists, (line, plain & dists)


def test_extras_all_det_seg_are_line_neutral_and_each_line_has_its_own(metadata):
    by_extra = _by_extra(metadata)
    lines = _line_dists()
    assert set(metadata.get_all('Provides-Extra')) >= {'det', 'seg', 'all', 'official',
                                                       'onedl'}
    # an extra naming the official mmcv would pull it onto the fork ([mim] once did):
    # mmcv is built for the machine's torch (requirements/mminstall.txt, setup_env.sh)
    assert not any('mmcv' in names for names in by_extra.values()), by_extra
    everything = lines['official'] | lines['onedl']
    for extra in ('det', 'seg', 'all'):
        assert not by_extra[extra] & everything, (extra, by_extra[extra] & everything)
    assert by_extra['det'] | by_extra['seg'] <= by_extra['all']
    assert {'mmengine', 'mmdet', 'mmsegmentation'} <= by_extra['official'] <= (
        lines['official'] | by_extra['all'])
    assert {'onedl-mmengine', 'onedl-mmdetection', 'onedl-mmsegmentation'} <= (
        by_extra['onedl']) <= lines['onedl'] | by_extra['all']


@pytest.mark.parametrize('line, pins', [('official', 'pinned.txt'),
                                        ('onedl', 'pinned-onedl.txt')])
def test_each_pinned_stack_satisfies_every_declared_range(metadata, line, pins):
    """Each line's pins lie inside the ranges declared for it: setup.cfg's install
    requirements and the line's extra, mim's mmcv range (official), and the environment
    check's ranges (utils/stacks.py)."""
    from mmplugin_inline.utils import stacks
    pins = _pins(pins)
    reqs = [r for r in _requirements(metadata) if _extra_of(r) in ('', line)]
    if line == 'official':
        with open(osp.join(REPO, 'requirements/mminstall.txt'), encoding='utf-8') as f:
            reqs += [Requirement(text.strip()) for text in f
                     if text.strip() and not text.startswith('#')]
    checked = set()
    for r in reqs:
        name = r.name.lower()
        if name in pins:
            assert r.specifier.contains(pins[name], prereleases=True), \
                f'{r} does not admit the pinned {name}=={pins[name]}'
            checked.add(name)
    assert {'torch', 'timm'} <= checked
    for comp in stacks.COMPONENTS:
        dist = comp.dists[line]
        low, high = comp.ranges[line]
        assert Version(low) <= pins[dist] < Version(high), (dist, pins[dist], low, high)
        if dist != 'onedl-mmcv' and dist != 'mmcv':
            assert dist in checked, f'{dist} has no range in setup.cfg'


def test_the_lower_end_of_the_torch_range_is_a_tested_pin(metadata):
    """setup.cfg's torch range starts at the older of the two tested torch releases."""
    torch_req = [r for r in _requirements(metadata) if r.name == 'torch' and not _extra_of(r)]
    lowest = min(_pins()['torch'], _pins('pinned-onedl.txt')['torch'])
    low = [Version(s.version) for s in torch_req[0].specifier if s.operator == '>=']
    assert low and low[0].release[:2] == lowest.release[:2], (torch_req, lowest)
    # the environment and GPU checks refuse below the same floor, and name the tested ends
    from mmplugin_inline.utils import stacks
    assert Version(stacks.TORCH_FLOOR) == low[0], (stacks.TORCH_FLOOR, low)
    tested = sorted([_pins()['torch'], _pins('pinned-onedl.txt')['torch']])
    assert [Version(v) for v in stacks.TORCH_TESTED] == tested, (stacks.TORCH_TESTED, tested)
    # and no upper bound: a node's newer torch is never replaced on install
    assert all(s.operator == '>=' for s in torch_req[0].specifier), torch_req


def test_licence_and_citation_agree_with_the_package(metadata):
    from mmplugin_inline import __version__
    with open(osp.join(REPO, 'LICENSE'), encoding='utf-8') as f:
        licence = f.read()
    assert 'Apache License' in licence and 'Version 2.0, January 2004' in licence
    assert metadata['License'] == 'Apache-2.0'
    with open(osp.join(REPO, 'CITATION.cff'), encoding='utf-8') as f:
        cff = yaml.safe_load(f)
    assert cff['cff-version'] == '1.2.0' and cff['license'] == 'Apache-2.0'
    assert str(cff['version']) == __version__ == metadata['Version']
    paper = cff['preferred-citation']
    with open(osp.join(REPO, 'README.md'), encoding='utf-8') as f:
        bibtex = re.search(r'```bibtex\n(.*?)```', f.read(), re.S).group(1)
    title = re.search(r'title\s*=\s*\{(.*?)\}', bibtex).group(1)
    assert title == paper['title']
    assert re.search(r'year\s*=\s*\{(\d+)\}', bibtex).group(1) == str(paper['year'])
    authors = re.search(r'author\s*=\s*\{(.*?)\}', bibtex, re.S).group(1)
    names = [' '.join(a.split()) for a in authors.split(' and ')]
    assert names == [f"{a['family-names']}, {a['given-names']}" for a in paper['authors']]


def test_no_package_module_imports_an_extra_at_import_time():
    """The backbones work without mmdet / mmseg: only registry.py looks for them, lazily."""
    offenders = []
    for path in glob.glob(osp.join(REPO, 'mmplugin_inline', '**', '*.py'), recursive=True):
        with open(path, encoding='utf-8') as f:
            for line in f:
                if re.match(r'(from|import)\s+(mmdet|mmseg)\b', line):
                    offenders.append(f'{osp.relpath(path, REPO)}: {line.strip()}')
    assert not offenders, offenders


def test_the_wheels_tools_are_what_users_run(tmp_path):
    """setup.py's copy of tools/ into a wheel's ``.mim/`` (what ``build_py`` does for a
    wheel): the launchers, analysis tools, converters, deployment, the shapes-data maker
    and demo.sh, and none of the developer scripts."""
    import setup  # the repository's setup.py (the repository root is on pytest's path)
    files = setup.copy_mim_extension(str(tmp_path / 'mmplugin_inline'))
    tools = {osp.relpath(f, str(tmp_path / 'mmplugin_inline' / '.mim' / 'tools'))
             for f in files if osp.sep + 'tools' + osp.sep in f}
    assert {'train.py', 'test.py', 'dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
            'slurm_test.sh', 'demo.sh', 'analysis_tools/get_flops.py',
            'analysis_tools/benchmark.py', 'model_converters/publish_model.py',
            'deployment/pytorch2onnx.py', 'misc/make_shapes_dataset.py'} <= tools
    developer = {osp.basename(f) for f in glob.glob(osp.join(REPO, 'scripts', '*'))}
    assert {'setup_env.sh', 'gpu_check.py', 'gen_model_index.py'} <= developer
    assert not {osp.basename(t) for t in tools} & developer, tools

"""The manual builds with no warning, and its model zoo is the metafiles'."""
import os
import subprocess
import sys

import pytest
import yaml

from helpers.paths import REPO

ROOT = REPO
DOCS = os.path.join(ROOT, 'docs')

pytest.importorskip('sphinx')
pytest.importorskip('myst_parser')


def test_the_manual_builds_with_warnings_as_errors(tmp_path):
    # the build of `make docs`, into a temporary folder: a broken cross-reference, a
    # page missing from a toctree or a bad autodoc target fails it
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-b', 'html',
                           '-q', '-d', str(tmp_path / 'doctrees'), DOCS, str(tmp_path / 'html')],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    html = (tmp_path / 'html')
    for page in ('index', 'get_started', 'model_zoo', 'api', 'user_guides/high_resolution'):
        assert (html / f'{page}.html').is_file(), page
    zoo = (html / 'model_zoo.html').read_text()
    api = (html / 'api.html').read_text()
    # the API reference documents every argument of a backbone (autodoc ran)
    assert 'with_cp' in api and 'InLineSwinTransformer' in api and 'inline_attention' in api
    # every model of the metafiles is on the model zoo page
    with open(os.path.join(ROOT, 'model-index.yml')) as f:
        imports = yaml.safe_load(f)['Import']
    names = []
    for rel in imports:
        with open(os.path.join(ROOT, rel)) as f:
            names += [m['Name'] for m in yaml.safe_load(f)['Models']]
    assert len(names) > 40
    missing = [n for n in names if f'>{n}<' not in zoo]
    assert not missing, missing


def test_the_zoo_table_reads_the_metafiles_values():
    sys.path.insert(0, os.path.join(DOCS, '_ext'))
    try:
        import model_zoo
    finally:
        sys.path.pop(0)
    text = model_zoo.model_zoo_tables(ROOT)
    with open(os.path.join(ROOT, 'configs/inline_pvt/metafile.yml')) as f:
        pvt_t = next(m for m in yaml.safe_load(f)['Models'] if m['Name'] == 'InLine-PVT-T')
    row = next(line for line in text.splitlines() if line.startswith('| InLine-PVT-T |'))
    assert f"{pvt_t['Metadata']['Parameters'] / 1e6:.1f}" in row
    assert f"{pvt_t['Metadata']['FLOPs'] / 1e9:.1f}" in row

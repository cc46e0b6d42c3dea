"""The model index (model-index.yml, configs/*/metafile.yml, the folder READMEs' tables).

Every config is listed once, every path in it exists, the backbones' weights are the
families' released ones, and the recorded numbers are what the tools measure now:
parameters are rebuilt for a representative subset (one detector or segmentor per
family, the short name, a demo) and checked for equality across configs that build the
same model; FLOPs are re-counted with mmplugin_inline.analysis.flops (get_flops.py's) for
the smallest whole model that has them recorded (Semantic FPN InLine-PVT-T, 512x512)
and for the smallest backbone of each family; the all-configs check loads every config.
"""
import glob
import json
import os.path as osp
import re

import pytest
import torch
import yaml
from mmengine.analysis import parameter_count
from modelindex.load_model_index import load

from helpers.tiny_models import REPO, config_files
from mmplugin_inline.analysis import build_model, count_module
from mmplugin_inline.analysis import flops as flop_count
from mmplugin_inline.registry import MODELS, registered_families
from mmplugin_inline.tools_common import load_config
from scripts import gen_model_index as gen

# parameters are rebuilt for these (a detector or segmentor per family, the short name,
# a demo); FLOPS_CONFIG's are checked with its FLOPs
PARAMS_SUBSET = (
    'configs/mask_rcnn_inline_pvt.py',
    'configs/demo/mask-rcnn_inline-pvt-t_fpn_shapes-demo.py',
    'configs/inline_swin/mask-rcnn_inline-swin-t_fpn_1x_coco.py',
    'configs/inline_cswin/mask-rcnn_inline-cswin-t_fpn_1x_coco.py',
    'configs/inline_deit/upernet_inline-deit-s_mln_8xb2-160k_ade20k-512x512.py',
)
FLOPS_CONFIG = 'configs/inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-512x512.py'


def read_yaml(rel):
    with open(osp.join(REPO, rel)) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope='module')
def index():
    """{model name: (metafile path, model entry)} over the model index's imports."""
    imports = read_yaml('model-index.yml')['Import']
    models = {}
    for metafile in imports:
        for model in read_yaml(metafile)['Models']:
            assert model['Name'] not in models, f'{model["Name"]} is listed twice'
            models[model['Name']] = (metafile, model)
    return models


def by_config(index):
    return {m['Config']: m for _, m in index.values() if 'Config' in m}


def test_model_index_loads_and_passes_modelindex_checks():
    mi = load(osp.join(REPO, 'model-index.yml'))
    mi.check(silent=True)
    # modelindex resolves README against the metafile's folder; OpenMMLab's metafiles
    # (mmdet's too) give it from the repository root, as mim shows it: checked below
    errors = [(e['filepath'], e['type'], err) for e in mi.collect_check_errors()
              for err in e['errors'] if not err.startswith('Path to README file configs/')]
    assert not errors, errors
    assert len(mi.models) > len(config_files())  # configs + released backbones


def test_every_config_is_listed_exactly_once(index):
    listed = [m['Config'] for _, m in index.values() if 'Config' in m]
    assert len(listed) == len(set(listed)), 'a config is listed twice'
    assert sorted(listed) == config_files(), (
        'configs and model index differ: run python scripts/gen_model_index.py '
        '(--flops-only NAME ... to count FLOPs for some configs only)')


def test_every_path_in_the_index_exists(index):
    imports = read_yaml('model-index.yml')['Import']
    on_disk = glob.glob(osp.join(REPO, 'configs', '*', 'metafile.yml'))
    assert sorted(imports) == sorted(osp.relpath(p, REPO) for p in on_disk)
    for metafile in imports:
        for collection in read_yaml(metafile)['Collections']:
            if 'README' in collection:
                assert osp.isfile(osp.join(REPO, collection['README'])), collection['README']
    for metafile, model in index.values():
        if 'Config' in model:
            assert osp.isfile(osp.join(REPO, model['Config']))
            assert osp.dirname(model['Config']) in (osp.dirname(metafile), 'configs')


def test_backbone_entries_are_the_released_weights(index):
    released = {}
    for cls in registered_families().values():
        for arch, (name, url) in cls.released_weights.items():
            released[name] = (url, f'checkpoints/{cls.short_name}_{arch}.pth',
                              f'configs/{cls.short_name}/metafile.yml')
    backbones = {n: (m['Weights'], m['Metadata']['Checkpoint File'], f)
                 for n, (f, m) in index.items() if 'Config' not in m}
    assert backbones == released
    for _, model in index.values():  # every config names a released backbone
        if 'Config' in model:
            assert model['Metadata']['Backbone'] in released, model['Name']


def test_no_results_are_recorded_without_runs(index):
    assert not [n for n, (_, m) in index.items() if m.get('Results')]


@pytest.mark.parametrize('config', PARAMS_SUBSET)
def test_recorded_parameters_are_what_the_built_model_has(index, config):
    meta = by_config(index)[config]['Metadata']
    model = build_model(load_config(osp.join(REPO, config)))
    counts = parameter_count(model)
    assert (meta['Parameters'], meta['Backbone Parameters']) == (counts[''], counts['backbone'])


@pytest.mark.slow
def test_configs_that_build_the_same_model_record_the_same_parameters(index):
    """All configs, without building: equal model dicts must have equal counts."""
    seen = {}
    for config, model in by_config(index).items():
        arch = load_config(osp.join(REPO, config)).model.to_dict()
        arch['backbone'].pop('init_cfg', None)  # where the weights come from: not the model
        key = json.dumps(arch, sort_keys=True, default=str)
        counts = (model['Metadata']['Parameters'], model['Metadata']['Backbone Parameters'])
        first, first_counts = seen.setdefault(key, (config, counts))
        assert counts == first_counts, (config, first)
    assert len(seen) < len(by_config(index))  # the 1x / 3x pairs and the short name share


def test_recorded_flops_are_what_get_flops_counts(index):
    meta = by_config(index)[FLOPS_CONFIG]['Metadata']
    h, w = (int(s) for s in meta['Input Shape'].split('x')[1:])
    result = flop_count.get_flops(osp.join(REPO, FLOPS_CONFIG), (h, w))
    rows = {name: (params, flops) for name, params, flops in result['rows']}
    assert (meta['FLOPs'], meta['Backbone FLOPs']) == (rows['model'][1], rows['backbone'][1])
    assert (meta['Parameters'], meta['Backbone Parameters']) == (rows['model'][0],
                                                                 rows['backbone'][0])


@pytest.mark.parametrize('family', sorted(registered_families()))
def test_smallest_backbone_flops_and_parameters(index, family):
    cls = registered_families()[family]
    arch = next(iter(cls.released_weights))  # the first preset is the smallest
    meta = index[cls.released_weights[arch][0]][1]['Metadata']
    size = int(meta['Input Shape'].split('x')[-1])
    assert size == cls.arch_settings[arch].get('pretrain_img_size', 224)
    model = MODELS.build(dict(type=family, arch=arch)).eval()
    counted = count_module(model, torch.zeros(1, 3, size, size))
    assert (meta['Parameters'], meta['FLOPs']) == (counted['params'], counted['flops'])


def test_folder_readmes_tables_are_the_metafiles_and_urls_the_released_weights():
    released = {url for cls in registered_families().values()
                for _, url in cls.released_weights.values()}
    for metafile in read_yaml('model-index.yml')['Import']:
        folder = osp.dirname(metafile)
        readme = osp.join(REPO, folder, 'README.md')
        if not osp.isfile(readme):
            continue
        with open(readme) as f:
            text = f.read()
        assert text == gen.with_tables(text, folder, read_yaml(metafile)), folder
        assert gen.readme_tables(folder, read_yaml(metafile)).count('\n|') > 2
        urls = set(re.findall(r'https://cloud\.tsinghua\.edu\.cn/\S+?dl=1', text))
        assert urls and urls <= released, folder  # weights named anywhere are the released ones

"""The plugin's own files of release 0.1 (``tests/data/legacy``, written by that release with
``tests/data/make_legacy_checkpoints.py``) load into today's module tree strictly, through
every entry point, and give the outputs they gave then (<= 1e-5 relative)."""
import os

import pytest
import torch

from helpers.paths import REPO

LEGACY = os.path.join(REPO, 'tests', 'data', 'legacy')
_OUTPUTS = torch.load(os.path.join(LEGACY, 'outputs.pt'), weights_only=True)
RECORDS = {name: dict(record, input=_OUTPUTS['input'])
           for name, record in _OUTPUTS['files'].items()}
BACKBONE_FILES = sorted(n for n, r in RECORDS.items() if 'outputs' in r)
SEGMENTOR_FILES = sorted(n for n, r in RECORDS.items() if 'logits' in r)
RTOL = 1e-5


def assert_same(ours, theirs, what):
    ours = list(ours) if isinstance(ours, (list, tuple)) else [ours]
    theirs = list(theirs) if isinstance(theirs, (list, tuple)) else [theirs]
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, f'{what} output {i}'
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        assert rel <= RTOL, f'{what} output {i}: relative error {rel:.2e}'


def build_backbone(record, **kw):
    from mmplugin_inline.registry import MODELS
    cfg = dict(record['cfg'], **kw)
    return MODELS.build(cfg)


def build_segmentor(record):
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules()
    return MODELS.build(record['cfg'])


def test_the_fixtures_hold_every_family_and_were_made_by_the_release_before():
    from mmplugin_inline.registry import registered_families
    assert {RECORDS[n]['family'] for n in BACKBONE_FILES} == set(registered_families())
    keys = torch.load(os.path.join(LEGACY, BACKBONE_FILES[0]), weights_only=True)
    assert not any(k.startswith('stages.') for k in keys)       # the old module tree
    total = sum(os.path.getsize(os.path.join(LEGACY, n)) for n in os.listdir(LEGACY))
    assert total < 2e6


@pytest.mark.parametrize('name', BACKBONE_FILES)
def test_a_backbone_file_loads_strictly_through_load_checkpoint(name):
    from mmengine.runner import load_checkpoint
    record = RECORDS[name]
    model = build_backbone(record)
    load_checkpoint(model, os.path.join(LEGACY, name), map_location='cpu', strict=True)
    with torch.no_grad():
        assert_same(model.eval()(record['input']), record['outputs'], name)
    # and through torch's own load_state_dict, strictly
    again = build_backbone(record)
    again.load_state_dict(torch.load(os.path.join(LEGACY, name), weights_only=True))
    with torch.no_grad():
        assert_same(again.eval()(record['input']), record['outputs'], name)


@pytest.mark.parametrize('name', BACKBONE_FILES)
def test_a_backbone_file_loads_through_init_cfg_with_nothing_missing(name):
    from mmplugin_inline.weights import load_pretrained
    record = RECORDS[name]
    path = os.path.join(LEGACY, name)
    model = build_backbone(record, init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    with torch.no_grad():
        assert_same(model.eval()(record['input']), record['outputs'], name)
    missing, unexpected, mismatched = load_pretrained(build_backbone(record), path)
    assert (missing, unexpected, mismatched) == ([], [], [])


@pytest.mark.parametrize('name', SEGMENTOR_FILES)
def test_a_whole_segmentor_file_loads_strictly_through_load_checkpoint(name):
    from mmengine.runner import load_checkpoint

    from mmplugin_inline.weights import mmengine_checkpoint_loading
    record = RECORDS[name]
    model = build_segmentor(record)
    with mmengine_checkpoint_loading():
        load_checkpoint(model, os.path.join(LEGACY, name), map_location='cpu', strict=True)
    model.eval()
    with torch.no_grad():
        assert_same(model.backbone(record['input']), record['backbone_outputs'], name)
        assert_same(model._forward(record['input']), record['logits'], name)


@pytest.mark.parametrize('name', SEGMENTOR_FILES)
def test_the_backbone_of_a_whole_segmentor_file_loads_through_init_cfg(name):
    from mmplugin_inline.weights import load_pretrained
    record = RECORDS[name]
    path = os.path.join(LEGACY, name)
    backbone = build_backbone(dict(cfg=record['cfg']['backbone']),
                              init_cfg=dict(type='Pretrained', checkpoint=path))
    backbone.init_weights()
    with torch.no_grad():
        assert_same(backbone.eval()(record['input']), record['backbone_outputs'], name)
    backbone = build_backbone(dict(cfg=record['cfg']['backbone']))
    assert load_pretrained(backbone, path) == ([], [], [])


def _old_optimizer_state(name):
    from mmplugin_inline.weights import load_run_checkpoint
    return load_run_checkpoint(os.path.join(LEGACY, name), map_location='cpu')


@pytest.mark.parametrize('name', SEGMENTOR_FILES)
def test_resuming_gives_each_parameter_its_own_optimizer_state(name):
    """The old module tree ordered the parameters otherwise: the optimizer state of a
    file of release 0.1 is reordered so that each parameter gets its own moments."""
    from mmengine.optim import build_optim_wrapper

    from mmplugin_inline.engine.legacy_resume import upgrade_optimizer_state, upgraded_names
    record = RECORDS[name]
    checkpoint = _old_optimizer_state(name)
    model = build_segmentor(record)
    state = checkpoint['optimizer']
    upgraded = upgrade_optimizer_state(model, checkpoint['state_dict'], state)
    assert upgraded is not None  # the order did change
    optim = build_optim_wrapper(model, dict(record['optim']))
    optim.load_state_dict(upgraded)
    names = upgraded_names(model, list(checkpoint['state_dict']))
    params = dict(model.named_parameters())
    old_order = [names[k] for k in checkpoint['state_dict'] if names[k] in params]
    assert sorted(old_order) == sorted(params)
    for new_name, p in params.items():
        old = state['state'][old_order.index(new_name)]
        torch.testing.assert_close(optim.optimizer.state[p]['exp_avg'], old['exp_avg'],
                                   rtol=0, atol=0)
        group = next(g for g in optim.optimizer.param_groups if any(q is p for q in g['params']))
        old_group = next(g for g in state['param_groups']
                         if old_order.index(new_name) in g['params'])
        assert group['weight_decay'] == old_group['weight_decay'], new_name
    # a file of today is left as it is
    today = dict(checkpoint, state_dict=model.state_dict())
    assert upgrade_optimizer_state(model, today['state_dict'], state) is None


class _Batches(torch.utils.data.Dataset):
    def __init__(self, record):
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample
        gen = torch.Generator().manual_seed(5)
        self.items = []
        for _ in range(4):
            sample = SegDataSample()
            sample.gt_sem_seg = PixelData(data=torch.randint(0, 3, (1, 64, 64), generator=gen))
            sample.set_metainfo(dict(img_shape=(64, 64), ori_shape=(64, 64),
                                     pad_shape=(64, 64)))
            self.items.append(dict(inputs=torch.randint(0, 256, (3, 64, 64), generator=gen,
                                                        dtype=torch.uint8),
                                   data_samples=sample))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _runner(record, work_dir, load_from, resume):
    from mmengine.dataset import pseudo_collate

    from mmplugin_inline.engine import SafeCheckpointRunner
    loader = torch.utils.data.DataLoader(_Batches(record), batch_size=2, collate_fn=pseudo_collate)
    return SafeCheckpointRunner(
        model=record['cfg'], work_dir=str(work_dir), train_dataloader=loader,
        optim_wrapper=record['optim'], train_cfg=dict(by_epoch=False, max_iters=2),
        param_scheduler=[dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=100,
                              by_epoch=False)],
        default_scope='mmseg', load_from=load_from, resume=resume,
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=100)),
        experiment_name=f'legacy_{os.path.basename(str(work_dir))}')


@pytest.mark.slow
@pytest.mark.parametrize('name', SEGMENTOR_FILES)
def test_load_from_and_resume_read_a_run_of_release_0_1(name, tmp_path):
    from mmseg.utils import register_all_modules
    register_all_modules()
    record = RECORDS[name]
    path = os.path.join(LEGACY, name)
    runner = _runner(record, tmp_path / 'load', path, resume=False)
    runner.load_or_resume()
    model = runner.model.eval()
    with torch.no_grad():
        assert_same(model._forward(record['input']), record['logits'], f'{name} load_from')
    runner = _runner(record, tmp_path / 'resume', path, resume=True)
    runner.train()  # resumes at iteration 1 and trains the second: the moments fit
    assert runner.iter == 2

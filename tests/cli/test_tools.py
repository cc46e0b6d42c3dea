"""The tools end to end on CPU: the synthetic data set, train / resume / test with real
mmdet and mmseg pipelines (on the shared runs of tests/conftest.py), safe checkpoint
loading and the messages for missing files (2-process training: tests/e2e/test_ddp.py).
Runs of tools/ are subprocesses, as users run them."""
import glob
import json
import os
import os.path as osp
import pickle

import cv2
import numpy as np
import pytest
import torch

from helpers.pickles import writes_marker
from helpers.runs import (
    DET_CONFIG,
    PYTHON,
    SEG_CONFIG,
    checkpoint_meta,
    make_shapes,
    ok,
    run_tool,
    tool_failure,
)
from helpers.shared import copy_run
from helpers.tiny_models import REPO, SHAPES, det_run_config
from mmplugin_inline.analysis.scalars import read_scalars
from mmplugin_inline.engine.preflight import dataset_problems, format_problems, preflight
from mmplugin_inline.tools_common import load_run_config, load_tool_config
from mmplugin_inline.weights import (
    UnsafeCheckpointError,
    load_run_checkpoint,
    mmengine_checkpoint_loading,
)

# --------------------------------------------------------------------------- data set

def _tree_bytes(root):
    result = {}
    for path in sorted(glob.glob(osp.join(root, '**', '*'), recursive=True)):
        if osp.isfile(path):
            with open(path, 'rb') as f:
                result[osp.relpath(path, root)] = f.read()
    return result


def test_shapes_dataset_is_deterministic_and_seeded(tmp_path):
    args = ['--train', '3', '--val', '2', '--min-size', '48', '--max-size', '80']
    make_shapes.main([str(tmp_path / 'a')] + args)
    make_shapes.main([str(tmp_path / 'b')] + args)
    make_shapes.main([str(tmp_path / 'c')] + args + ['--seed', '1'])
    a, b, c = (_tree_bytes(str(tmp_path / n)) for n in 'abc')
    assert len(a) == 3 + 2 + 3 + 2 + 2 + 1  # images, label maps, 2 json, dataset_info
    assert a == b
    assert a.keys() == c.keys() and a['images/training/000000.jpg'] != \
        c['images/training/000000.jpg']
    # a smaller set is a prefix of a larger one, and a rerun leaves no stale files
    make_shapes.main([str(tmp_path / 'a'), '--train', '1', '--val', '1', '--min-size', '48',
                      '--max-size', '80'])
    smaller = _tree_bytes(str(tmp_path / 'a'))
    assert sorted(k for k in smaller if k.endswith('.jpg')) == [
        'images/training/000000.jpg', 'images/validation/000000.jpg']
    assert smaller['images/training/000000.jpg'] == a['images/training/000000.jpg']


@pytest.mark.parametrize('mask_format', ['polygon', 'rle'])
def test_shapes_coco_masks_agree_with_the_ade_label_maps(tmp_path, mask_format):
    from pycocotools.coco import COCO
    out = str(tmp_path / 'shapes')
    make_shapes.main([out, '--train', '6', '--val', '1', '--min-size', '60', '--max-size', '90',
                      '--min-shapes', '2', '--max-shapes', '3', '--classes', 'star', 'circle',
                      '--mask-format', mask_format])
    coco = COCO(osp.join(out, 'annotations/instances_training.json'))
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == ['star', 'circle']
    for image_id, info in coco.imgs.items():
        assert 60 <= info['height'] <= 90 and 60 <= info['width'] <= 90
        img = cv2.imread(osp.join(out, 'images/training', info['file_name']))
        assert img.shape[:2] == (info['height'], info['width'])
        label_map = cv2.imread(osp.join(out, 'annotations/training',
                                        info['file_name'].replace('.jpg', '.png')), 0)
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        assert 1 <= len(anns) <= 3
        drawn = np.zeros_like(label_map)
        for ann in anns:
            assert isinstance(ann['segmentation'], list if mask_format == 'polygon' else dict)
            mask = coco.annToMask(ann).astype(bool)
            x, y, w, h = ann['bbox']
            assert mask.sum() == ann['area'] and w > 0 and h > 0
            assert mask[int(y):int(y + h), int(x):int(x + w)].sum() == mask.sum()
            # the label map holds the category id (0 = background) under the mask
            agree = (label_map[mask] == ann['category_id']).mean()
            assert agree == 1.0
            drawn[mask] = ann['category_id']
        assert set(np.unique(label_map)) <= {0, 1, 2}
        assert (drawn == label_map).all()


def test_shapes_noisy_fraction_switches_the_background(tmp_path):
    def background_std(noisy):
        out = str(tmp_path / f'n{noisy}')
        make_shapes.main([out, '--train', '3', '--val', '0', '--noisy', str(noisy),
                          '--formats', 'ade'])
        stds = []
        for name in sorted(os.listdir(osp.join(out, 'images/training'))):
            img = cv2.imread(osp.join(out, 'images/training', name)).astype(float)
            label = cv2.imread(osp.join(out, 'annotations/training',
                                        name.replace('.jpg', '.png')), 0)
            bg = cv2.erode((label == 0).astype(np.uint8), np.ones((7, 7), np.uint8)) > 0
            stds.append(img[bg].std(axis=0).mean())
        assert not osp.exists(osp.join(out, 'annotations/instances_training.json'))
        return max(stds), min(stds)
    assert background_std(0)[0] < 3  # plain colour (JPEG noise only)
    assert background_std(1)[1] > 8


# --------------------------------------------------------------------------- safe loading

def _mmengine_like_checkpoint(path):
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('test_safe_load')
    hub.update_scalar('train/loss', np.float64(0.5))
    hub.update_scalar('train/loss', 0.25)
    hub.update_info('best_score', np.float32(0.7))
    torch.save(dict(meta=dict(epoch=1, iter=3, dataset_meta=dict(classes=SHAPES)),
                    state_dict={'w': torch.ones(2)}, message_hub=hub.state_dict()), path)


_SAFE_GLOBALS_SCRIPT = """
import sys, torch
before = set(map(str, torch.serialization.get_safe_globals()))
try:
    torch.load(sys.argv[1], weights_only=True)
    print('loaded without the plugin')
except Exception as exc:
    print('refused without the plugin:', type(exc).__name__)
import mmplugin_inline
from mmplugin_inline.weights import mmengine_checkpoint_globals
after = torch.serialization.get_safe_globals()
# torch.distributed.tensor, which mmengine imports, registers its own DTensor classes
added = {str(g) for g in after if str(g) not in before and
         not getattr(g[0] if isinstance(g, tuple) else g, '__module__', '').startswith('torch.')}
print('added exactly the mmengine list:', added == set(map(str, mmengine_checkpoint_globals())))
ckpt = torch.load(sys.argv[1], weights_only=True)  # what mmengine's load_from_local does
print('mean', ckpt['message_hub']['log_scalars']['train/loss'].mean())
from mmplugin_inline.weights import load_run_checkpoint
load_run_checkpoint(sys.argv[1])  # our loader's scoped allow-list leaves the registration
torch.load(sys.argv[1], weights_only=True)
print('still registered after our loader')
"""


def test_importing_the_plugin_lets_torch_load_mmengine_checkpoints_and_no_more(tmp_path):
    path = str(tmp_path / 'run.pth')
    _mmengine_like_checkpoint(path)
    rc, out, _ = run_tool([PYTHON, '-c', _SAFE_GLOBALS_SCRIPT, path])
    ok(rc, out)
    assert 'refused without the plugin: UnpicklingError' in out  # mmengine 0.10.7 on torch 2.6+
    assert 'added exactly the mmengine list: True' in out
    assert 'mean 0.375' in out and 'still registered after our loader' in out
    ckpt = load_run_checkpoint(path)
    buffer = ckpt['message_hub']['log_scalars']['train/loss']
    assert buffer.mean() == pytest.approx(0.375) and buffer.current() == 0.25
    assert ckpt['message_hub']['runtime_info']['best_score'] == np.float32(0.7)


def test_files_that_run_code_are_refused_unless_opted_in(tmp_path):
    marker = str(tmp_path / 'marker')
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': writes_marker(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match='exec.*--allow-unsafe'):
        load_run_checkpoint(path)
    with mmengine_checkpoint_loading(), pytest.raises(UnsafeCheckpointError):
        from mmengine.runner.checkpoint import _load_checkpoint
        _load_checkpoint(path)  # mmengine's own entry point, inside the scope
    assert not osp.exists(marker)
    load_run_checkpoint(path, allow_unsafe=True)  # the explicit opt-in
    assert open(marker).read() == 'ran'


def test_only_history_buffer_methods_are_reachable_through_getattr(tmp_path):
    from mmengine.logging.history_buffer import HistoryBuffer

    class Sneaky:
        def __reduce__(self):
            return getattr, (HistoryBuffer, '_set_default_statistics')

    path = str(tmp_path / 'sneaky.pth')
    torch.save({'x': Sneaky()}, path)
    with pytest.raises(UnsafeCheckpointError):
        load_run_checkpoint(path)


def test_pretrained_weights_that_would_run_code_load_as_data(tmp_path):
    """The other path: backbone init_cfg=Pretrained reads third-party files as data only."""
    from helpers.tiny_models import TINY_BACKBONES
    from mmplugin_inline.openmmlab import InLinePVT
    marker = str(tmp_path / 'marker')
    path = str(tmp_path / 'pretrained.pth')
    source = InLinePVT(arch=TINY_BACKBONES['InLinePVT'][0])
    torch.save({'model': source.state_dict(), 'x': writes_marker(marker)}, path)
    model = InLinePVT(arch=TINY_BACKBONES['InLinePVT'][0],
                      init_cfg=dict(type='Pretrained', checkpoint=path))
    model.init_weights()
    assert not osp.exists(marker)
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


# --------------------------------------------------------------------------- preflight

def test_preflight_names_each_missing_path_through_dataset_wrappers(tmp_path):
    from mmengine.config import Config
    (tmp_path / 'root' / 'imgs').mkdir(parents=True)
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(type='RepeatDataset', times=2, dataset=dict(
            type='CocoDataset', data_root=str(tmp_path / 'root'), ann_file='ann.json',
            data_prefix=dict(img='imgs/')))),
        val_dataloader=dict(dataset=dict(type='ADE20KDataset', data_root=str(tmp_path / 'no'),
                                         data_prefix=dict(img_path='images/validation'))),
        val_cfg=dict(type='ValLoop'), val_evaluator=dict(type='IoUMetric'),
        model=dict(backbone=dict(init_cfg=dict(type='Pretrained',
                                               checkpoint='checkpoints/inline_swin_b.pth'))),
        load_from='s3://bucket/remote.pth'))
    problems = preflight(cfg, 'train')
    assert len(problems) == 3, problems
    coco, ade, weights = problems
    assert 'ann.json' in coco and 'imgs' not in coco.split('How to get it')[0]
    assert 'cocodataset.org' in coco and f"ln -s /path/to/it {tmp_path / 'root'}" in coco
    assert str(tmp_path / 'no') in ade and 'ADEChallengeData2016' in ade
    assert 'InLine-Swin-B' in weights and 'cloud.tsinghua.edu.cn' in weights
    assert 'model.backbone.init_cfg=None' in weights
    (tmp_path / 'root' / 'ann.json').write_text('{}')
    assert len(dataset_problems(cfg, ['train_dataloader'])) == 0
    # once the data is there, a missing evaluator annotation file is named
    cfg.val_dataloader = cfg.train_dataloader
    cfg.val_evaluator = dict(type='CocoMetric', ann_file=str(tmp_path / 'val.json'))
    problems = preflight(cfg, 'train')
    assert len(problems) == 2 and 'val.json' in problems[0]
    # test mode: the test data and the checkpoint, not the pretrained weights
    cfg.load_from = str(tmp_path / 'missing.pth')
    cfg.test_dataloader = cfg.train_dataloader
    problems = preflight(cfg, 'test')
    assert len(problems) == 1 and 'missing.pth' in problems[0]
    assert format_problems(problems).startswith('Cannot start')


# --------------------------------------------------------------------------- tool set-up

def _unscoped_config(directory, model_type=None):
    """The short-name Mask R-CNN config without its default_scope (and, with
    ``model_type``, a model type that no codebase registers)."""
    text = (f"_base_ = {osp.join(REPO, 'configs/mask_rcnn_inline_pvt.py')!r}\n"
            'default_scope = None\n')
    if model_type:
        text += f'model = dict(type={model_type!r})\n'
    path = osp.join(str(directory), f'unscoped_{model_type or "mask_rcnn"}.py')
    with open(path, 'w') as f:
        f.write(text)
    return path


def test_every_tool_reads_and_attributes_a_config_the_same_way(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('LOCAL_RANK', '0')  # what train / test export for mmengine
    monkeypatch.chdir(tmp_path)            # no data/ nor checkpoints/ here
    from mmplugin_inline.cli import benchmark, demo_report, get_flops, image_demo, train
    from mmplugin_inline.cli import test as test_tool
    tools = dict(train=train.main, test=test_tool.main, get_flops=get_flops.main,
                 benchmark=benchmark.main, image_demo=image_demo.main,
                 demo_report=demo_report.main)

    def argv(tool, config):
        return dict(test=[config, 'nope.pth'], image_demo=['nope.jpg', config, '--out-dir', 'o'],
                    demo_report=[config, 'nope.pth', 'work', '--out-dir', 'o']).get(tool, [config])

    # a missing config file and a config of neither codebase: one message for all tools
    neither = _unscoped_config(tmp_path, 'NoSuchModel')
    for tool, main in tools.items():
        err = tool_failure(main, argv(tool, 'missing.py'), capsys)
        assert 'Config file not found: missing.py' in err and 'configs/' in err, tool
        err = tool_failure(main, argv(tool, neither), capsys)
        assert 'Cannot tell whether the config is for mmdet or mmseg' in err, tool
        assert "'NoSuchModel'" in err and "default_scope = 'mmdet' or 'mmseg'" in err, tool
    # without default_scope the codebase is the one whose registry has the model type
    unscoped = _unscoped_config(tmp_path)
    cfg, codebase = load_tool_config(unscoped)
    assert codebase == 'mmdet' and cfg.get('default_scope') is None
    cfg, codebase = load_run_config(unscoped, {'launcher': 'pytorch'}, work_dir='w')
    assert (codebase, cfg.default_scope, cfg.launcher, cfg.work_dir) == ('mmdet', 'mmdet',
                                                                         'pytorch', 'w')
    # ... so train gets as far as the preflight check of the data and the weights
    err = tool_failure(tools['train'], [unscoped], capsys)
    assert 'data/coco/' in err and 'checkpoints/inline_pvt_t.pth' in err


@pytest.mark.slow
def test_train_and_test_explain_missing_data_and_weights_without_a_traceback(tmp_path):
    # run from an empty directory: data/coco/ and checkpoints/ are not there
    rc, out, err = run_tool([PYTHON, osp.join(REPO, 'tools/train.py'),
                             osp.join(REPO, 'configs/mask_rcnn_inline_pvt.py')], cwd=tmp_path)
    assert rc == 1 and 'Traceback' not in out
    assert 'data/coco/' in err and 'cocodataset.org' in err
    assert 'checkpoints/inline_pvt_t.pth' in err and 'cloud.tsinghua.edu.cn' in err
    rc, out, err = run_tool([PYTHON, osp.join(REPO, 'tools/test.py'), SEG_CONFIG, 'nope.pth'],
                            cwd=tmp_path)
    assert rc == 1 and 'Traceback' not in out
    assert 'ADEChallengeData2016' in err and 'nope.pth' in err
    assert 'inline_swin_t.pth' not in err  # testing does not need the ImageNet weights
    assert not os.listdir(tmp_path)  # nothing was started


# --------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_mask_rcnn_train_resume_and_test(det_run, tmp_path):
    # the shared run (conftest.det_run): tools/train.py, 1 epoch of 4 images, batch 2
    assert checkpoint_meta(det_run.checkpoint)['iter'] == 2
    val = [s for s in read_scalars(det_run.work) if 'coco/bbox_mAP' in s]
    assert len(val) == 1 and 'coco/segm_mAP' in val[0]

    work = copy_run(det_run.work, tmp_path / 'work')
    rc, out, _ = run_tool([PYTHON, osp.join(REPO, 'tools/train.py'), det_run.config,
                           '--work-dir', work, '--resume', osp.join(work, 'epoch_1.pth'),
                           '--cfg-options', 'train_cfg.max_epochs=2'])
    ok(rc, out)
    assert 'resumed epoch: 1, iter: 2' in out
    meta = checkpoint_meta(osp.join(work, 'epoch_2.pth'))
    assert (meta['epoch'], meta['iter']) == (2, 4)
    assert meta['dataset_meta']['classes'] == SHAPES

    # its tools/test.py run: --show-dir pictures --out preds.pkl
    test_dir = det_run.test_dir
    metrics_files = glob.glob(osp.join(test_dir, '*', '2*.json'))
    assert len(metrics_files) == 1
    with open(metrics_files[0]) as f:
        metrics = json.load(f)
    assert {'coco/bbox_mAP', 'coco/segm_mAP', 'coco/bbox_mAP_50'} <= metrics.keys()
    assert len(glob.glob(osp.join(test_dir, '*', 'pictures', '*.jpg'))) == 2
    with open(det_run.preds, 'rb') as f:
        assert len(pickle.load(f)) == 2


@pytest.mark.slow
def test_upernet_train_auto_resume_and_test(seg_run, tmp_path):
    # the shared run (conftest.seg_run): tools/train.py, 2 iterations, validation, checkpoint
    assert checkpoint_meta(seg_run.checkpoint)['iter'] == 2
    assert [s['mIoU'] for s in read_scalars(seg_run.work) if 'mIoU' in s]

    # --resume without a path: the latest checkpoint of the work directory
    work = copy_run(seg_run.work, tmp_path / 'work')
    rc, out, _ = run_tool([PYTHON, osp.join(REPO, 'tools/train.py'), seg_run.config,
                           '--work-dir', work, '--resume', '--cfg-options',
                           'train_cfg.max_iters=4', 'default_hooks.checkpoint.interval=4'])
    ok(rc, out)
    assert 'resumed epoch: 0, iter: 2' in out
    assert checkpoint_meta(osp.join(work, 'iter_4.pth'))['iter'] == 4

    # its tools/test.py run (of iter_2.pth's state dict)
    with open(glob.glob(osp.join(seg_run.test_dir, '*', '2*.json'))[0]) as f:
        metrics = json.load(f)
    assert {'mIoU', 'aAcc', 'mAcc'} <= metrics.keys() and 0 <= metrics['mIoU'] <= 100


@pytest.mark.slow
def test_load_from_a_file_that_runs_code_is_refused_by_train(shapes, tmp_path):
    marker = str(tmp_path / 'marker')
    evil = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {}, 'x': writes_marker(marker)}, evil)
    config = tmp_path / 'mask-rcnn_tiny.py'
    config.write_text(det_run_config(DET_CONFIG, shapes + '/'))
    rc, out, err = run_tool([PYTHON, osp.join(REPO, 'tools/train.py'), str(config),
                             '--work-dir', str(tmp_path / 'work'),
                             '--cfg-options', f'load_from={evil}'])
    assert rc == 1 and 'Traceback' not in err
    assert 'builtins.exec' in err and '--allow-unsafe' in err
    assert not osp.exists(marker)


# --------------------------------------------------------------------------- stock tools

# The core of mmdet's and mmseg's own tools/train.py and tools/test.py (3.x / 1.x) for a
# config without runner_type: mmengine's plain Runner, which reads the plugin's
# checkpoints through the allow-list that importing the plugin registers; the config's
# custom_imports is the only thing that imports it. (Stock mmdet's tools/train.py with our
# configs' runner_type: tests/e2e/test_runs_reliability.py.)
_STOCK_TOOL = """
import sys
from mmengine.config import Config
from mmengine.runner import Runner
config, work_dir, mode = sys.argv[1:4]
cfg = Config.fromfile(config)
cfg.launcher = 'none'
cfg.work_dir = work_dir
if mode == 'resume-auto':        # mmseg: --resume; mmdet: --resume without a path
    cfg.resume, cfg.load_from = True, None
elif mode == 'resume-path':      # mmdet: --resume CHECKPOINT
    cfg.resume, cfg.load_from = True, sys.argv[4]
elif mode == 'load_from':        # --cfg-options load_from=CHECKPOINT
    cfg.load_from = sys.argv[4]
if mode != 'test':
    cfg.train_cfg.max_iters = int(sys.argv[5])
    cfg.default_hooks.checkpoint.interval = int(sys.argv[5])
    Runner.from_cfg(cfg).train()
else:                            # tools/test.py CONFIG CHECKPOINT
    cfg.load_from = sys.argv[4]
    Runner.from_cfg(cfg).test()
print('plugin imported by custom_imports:', 'mmplugin_inline' in sys.modules)
"""


@pytest.mark.slow
def test_stock_runner_from_cfg_resumes_loads_and_tests_a_plugin_run(seg_run, tmp_path):
    config = seg_run.config
    work = copy_run(seg_run.work, tmp_path / 'work')  # our tool wrote the run: iter_2.pth

    def stock(mode, *args):
        rc, out, _ = run_tool([PYTHON, '-c', _STOCK_TOOL, str(config), work, mode, *args])
        ok(rc, out)
        assert 'Weights only load failed' not in out
        assert 'plugin imported by custom_imports: True' in out
        return out

    out = stock('resume-auto', '', '4')
    assert 'resumed epoch: 0, iter: 2' in out
    assert checkpoint_meta(osp.join(work, 'iter_4.pth'))['iter'] == 4
    out = stock('resume-path', osp.join(work, 'iter_4.pth'), '6')
    assert 'resumed epoch: 0, iter: 4' in out
    assert checkpoint_meta(osp.join(work, 'iter_6.pth'))['iter'] == 6
    out = stock('load_from', osp.join(work, 'iter_6.pth'), '1')
    assert 'Load checkpoint from' in out and 'resumed' not in out
    out = stock('test', osp.join(work, 'iter_6.pth'))
    assert 'mIoU' in out

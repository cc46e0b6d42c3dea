"""tools/misc/print_config.py, browse_dataset.py and tools/analysis_tools/analyze_logs.py,
confusion_matrix.py: our configs through mmdet's / mmseg's own scripts, headless."""
import glob
import json
import os
import os.path as osp
import pickle
import sys

import cv2
import numpy as np
import pytest
import torch

from helpers.runs import DET_CONFIG, SEG_CONFIG, tool_failure
from helpers.tiny_models import SHAPES, det_run_config, seg_run_config
from mmplugin_inline.analysis.scalars import scalars_files
from mmplugin_inline.cli import analyze_logs, browse_dataset, confusion_matrix, print_config


@pytest.fixture
def headless(monkeypatch):
    monkeypatch.delenv('DISPLAY', raising=False)
    monkeypatch.delenv('WAYLAND_DISPLAY', raising=False)


@pytest.fixture
def fresh_visualizers(monkeypatch):
    """No visualizer instance made so far in this process, as in the tool's own process.

    The scripts build theirs by name (``VISUALIZERS.build`` of ``name='visualizer'``
    returns the instance of that name if there is one): an inferencer of an earlier test in
    the same pytest process may hold it, with its own opacity (which of them ran before
    depends on the test order, e.g. on how pytest-xdist shares the tests out)."""
    from collections import OrderedDict

    from mmdet.visualization import DetLocalVisualizer
    from mmengine.visualization import Visualizer
    from mmseg.visualization import SegLocalVisualizer
    for cls in (Visualizer, DetLocalVisualizer, SegLocalVisualizer):
        monkeypatch.setattr(cls, '_instance_dict', OrderedDict())


@pytest.fixture(scope='module')
def run_configs(shapes, tmp_path_factory):
    """Tiny Mask R-CNN and UperNet configs on the shapes set."""
    directory = tmp_path_factory.mktemp('configs')
    det, seg = directory / 'mask-rcnn_tiny.py', directory / 'upernet_tiny.py'
    det.write_text(det_run_config(DET_CONFIG, shapes + '/'))
    seg.write_text(seg_run_config(SEG_CONFIG, shapes))
    return str(det), str(seg)


# --------------------------------------------------------------------------- shared

def test_each_tool_names_a_missing_or_foreign_config_and_a_missing_script(tmp_path, capsys):
    neither = tmp_path / 'neither.py'
    neither.write_text("default_scope = None\nmodel = dict(type='NoSuchModel')\n")
    tools = {print_config.main: [], browse_dataset.main: ['--output-dir', 'o'],
             confusion_matrix.main: ['preds.pkl', 'out']}
    for main, rest in tools.items():
        err = tool_failure(main, ['missing.py'] + rest, capsys)
        assert 'Config file not found: missing.py' in err
        err = tool_failure(main, [str(neither)] + rest, capsys)
        assert 'Cannot tell whether the config is for mmdet or mmseg' in err
    from mmplugin_inline.tools_common import codebase_script
    with pytest.raises(SystemExit):
        codebase_script('mmdet', 'misc/no_such_tool.py')
    err = capsys.readouterr().err
    assert 'does not ship tools/misc/no_such_tool.py' in err and '.mim' in err


# --------------------------------------------------------------------------- print_config

@pytest.mark.parametrize('config', [DET_CONFIG, SEG_CONFIG], ids=['mmdet', 'mmseg'])
def test_print_config_prints_and_saves_the_merged_config(config, tmp_path, monkeypatch, capsys):
    from mmengine.config import Config
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('MMDET_DATASETS', '/elsewhere/')  # mmdet's update_data_root: 2.x only
    cfg = print_config.main([config, '--save-path', 'whole.json',   # a bare file name
                             '--cfg-options', 'model.backbone.drop_path_rate=0.37'])
    out = capsys.readouterr().out
    assert 'Config:\n' in out and "type='InLine" in out and 'drop_path_rate=0.37' in out
    assert f"default_scope = '{cfg.default_scope}'" in out
    assert ('MMDET_DATASETS=/elsewhere/ is ignored' in out) == (cfg.default_scope == 'mmdet')
    assert '/elsewhere/' not in out.split('Config:', 1)[1]
    saved = Config.fromfile(str(tmp_path / 'whole.json'))
    assert saved.model.backbone.drop_path_rate == 0.37
    assert saved.model.backbone.type == cfg.model.backbone.type
    assert os.listdir(tmp_path) == ['whole.json']  # mmseg's example.py is not left behind
    err = tool_failure(print_config.main, [config, '--save-path', 'whole.txt'], capsys)
    assert '--save-path must end with .py' in err and 'whole.txt' in err


# --------------------------------------------------------------------------- browse_dataset

@pytest.mark.parametrize('codebase', ['mmdet', 'mmseg'])
def test_browse_dataset_headless_writes_the_drawn_training_set(codebase, run_configs, shapes,
                                                               tmp_path, headless, capsys,
                                                               fresh_visualizers):
    config = run_configs[codebase == 'mmseg']
    # no resizing, cropping or flipping: the pictures line up with the images on disk
    pipeline = ("[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, "
                "with_mask=True), dict(type='PackDetInputs')]" if codebase == 'mmdet' else
                "[dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', "
                "reduce_zero_label=True), dict(type='PackSegInputs')]")
    plain = tmp_path / 'plain.py'
    plain.write_text(f'_base_ = {config!r}\n'
                     f'train_dataloader = dict(dataset=dict(pipeline={pipeline}))\n')
    out_dir = tmp_path / 'browse'
    browse_dataset.main([str(plain), '--output-dir', str(out_dir)])
    assert 'No display' in capsys.readouterr().out  # shown by default: said, then skipped
    images = sorted(glob.glob(osp.join(shapes, 'images', 'training', '*.jpg')))
    assert sorted(os.listdir(out_dir)) == [osp.basename(p) for p in images]
    for path in images:
        image = cv2.imread(path).astype(int)
        drawn = cv2.imread(str(out_dir / osp.basename(path))).astype(int)
        label = cv2.imread(path.replace('images', 'annotations').replace('.jpg', '.png'), 0)
        assert drawn.shape == image.shape
        background = cv2.erode((label == 0).astype(np.uint8), np.ones((9, 9))) > 0
        if codebase == 'mmdet':
            # the shapes are drawn over (masks); the background much less (box outlines,
            # class names, the visualizer's resampling of the JPEG)
            changed = np.abs(drawn - image).sum(-1) > 60
            assert changed[label > 0].mean() > 0.5 > 2 * changed[background].mean()
            continue
        # mmseg: 0.2 x image + 0.8 x the class colour (none on the ignored background)
        palette = np.array([[220, 20, 60], [0, 130, 200], [60, 180, 75]])[:, ::-1]  # BGR
        assert np.abs(drawn - 0.2 * image)[background].mean() < 10
        for k in np.unique(label[label > 0]):
            inside = cv2.erode((label == k).astype(np.uint8), np.ones((5, 5))) > 0
            error = np.abs(drawn - 0.2 * image - 0.8 * palette[k - 1])[inside]
            assert np.median(error) < 12, (path, k)


def test_browse_dataset_without_display_or_output_dir_says_what_to_do(run_configs, headless,
                                                                      capsys):
    err = tool_failure(browse_dataset.main, [run_configs[0]], capsys)
    assert 'Nothing to do' in err and '--output-dir' in err


# --------------------------------------------------------------------------- analyze_logs

def _write_log(path, lines):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.writelines(json.dumps(line) + '\n' for line in lines)
    return path


def _iteration_log(path):
    """An mmseg-like iteration-based run: 6 training lines, validation at 3 and 6."""
    rng = np.random.RandomState(0)
    times = rng.uniform(0.5, 1.0, 6).round(4).tolist()
    lines = []
    for i, t in enumerate(times, 1):
        lines.append(dict(lr=0.01, loss=1.0 / i, time=t, data_time=0.01, iter=i, step=i))
        if i % 3 == 0:
            lines.append(dict(aAcc=50.0 + i, mIoU=10.0 + i, mAcc=20.0, time=100.0, step=i))
    return _write_log(path, lines), times


def test_analyze_logs_iteration_run_uses_mmseg_plot_and_counts_training_lines_only(
        tmp_path, capsys):
    log, times = _iteration_log(str(tmp_path / 'run' / 'vis_data' / 'scalars.json'))
    out_png = str(tmp_path / 'figs' / 'miou.png')
    log_dicts = analyze_logs.main(['plot_curve', log, '--keys', 'mIoU', 'loss', '--out', out_png])
    assert sorted(log_dicts[0]) == [1, 2, 3, 4, 5, 6]  # mmseg's loader: by step
    assert log_dicts[0][3]['mIoU'] == [13.0] and log_dicts[0][6]['mIoU'] == [16.0]
    assert cv2.imread(out_png) is not None
    analyze_logs.main(['cal_train_time', log])
    out = capsys.readouterr().out
    # the first iteration is an outlier; validation lines (time 100) are not training
    assert f'average iter time: {np.mean(times[1:]):.4f} s/iter' in out
    analyze_logs.main(['cal_train_time', log, '--include-outliers'])
    assert f'average iter time: {np.mean(times):.4f} s/iter' in capsys.readouterr().out
    import importlib.util  # the stand-in for a missing seaborn does not outlive the tool
    assert ('seaborn' in sys.modules) == (importlib.util.find_spec('seaborn') is not None)


def test_analyze_logs_messages(tmp_path, headless, capsys):
    log, _ = _iteration_log(str(tmp_path / 'scalars.json'))
    err = tool_failure(analyze_logs.main, ['plot_curve', log], capsys)
    assert 'No display' in err and '--out' in err
    err = tool_failure(analyze_logs.main, ['cal_train_time', str(tmp_path / 'nope.json')], capsys)
    assert 'Log not found' in err and 'nope.json' in err
    text = tmp_path / '20260101_000000.log'
    text.write_text('12/01 11:58:41 - mmengine - INFO - Checkpoints will be saved\n')
    err = tool_failure(analyze_logs.main, ['cal_train_time', str(text)], capsys)
    assert 'is not json' in err and 'scalars.json' in err
    err = tool_failure(analyze_logs.main, ['plot_curve', log, '--legend', 'a', 'b', '--out',
                                       str(tmp_path / 'x.png')], capsys)
    assert '--legend needs one entry per log and key' in err


# --------------------------------------------------------------------------- confusion_matrix

def _gt_instances(shapes):
    """Boxes (x1, y1, x2, y2) and 0-based labels of the validation images, in id order."""
    from pycocotools.coco import COCO
    coco = COCO(osp.join(shapes, 'annotations', 'instances_validation.json'))
    cats = sorted(coco.getCatIds())
    result = []
    for image_id in sorted(coco.getImgIds()):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        boxes = [[a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
                  a['bbox'][1] + a['bbox'][3]] for a in anns]
        result.append((np.array(boxes, np.float32), np.array([cats.index(a['category_id'])
                                                             for a in anns])))
    return result


def test_detection_confusion_matrix_of_known_predictions(run_configs, shapes, tmp_path, capsys):
    gts = _gt_instances(shapes)
    # every object found with its class, except the first, called the next class, plus one
    # box on the background of the second image
    results, expected = [], np.zeros((len(SHAPES) + 1,) * 2, np.int64)
    for i, (boxes, labels) in enumerate(gts):
        pred_labels = labels.copy()
        if i == 0:
            pred_labels[0] = (labels[0] + 1) % len(SHAPES)
        pred_boxes = boxes
        if i == 1:
            pred_boxes = np.concatenate([boxes, [[0, 0, 3, 3]]]).astype(np.float32)
            pred_labels = np.append(pred_labels, 0)
            expected[-1, 0] += 1
        for gt, pred in zip(labels, pred_labels):
            expected[gt, pred] += 1
            if gt != pred:
                expected[gt, -1] += 1  # missed: no detection of its class
        results.append(dict(pred_instances=dict(
            bboxes=torch.from_numpy(pred_boxes), labels=torch.from_numpy(pred_labels),
            scores=torch.ones(len(pred_labels)))))
    preds = str(tmp_path / 'preds.pkl')
    with open(preds, 'wb') as f:
        pickle.dump(results, f)
    matrix = confusion_matrix.main([run_configs[0], preds, str(tmp_path / 'cm')])
    assert np.array_equal(matrix, expected)
    assert cv2.imread(str(tmp_path / 'cm' / 'confusion_matrix.png')) is not None
    assert 'background' in capsys.readouterr().out
    with open(preds, 'wb') as f:
        pickle.dump(results[:1], f)
    err = tool_failure(confusion_matrix.main, [run_configs[0], preds, str(tmp_path / 'cm')], capsys)
    assert 'one detection result per image of the test set (2 images)' in err


def test_segmentation_confusion_matrix_of_known_label_maps(run_configs, shapes, tmp_path,
                                                           headless, capsys):
    # the label maps as IoUMetric writes them (the dataset's numbering, 0 = background):
    # the ground truth, with the circles of the first image predicted as squares
    preds = tmp_path / 'preds'
    preds.mkdir()
    n = len(SHAPES)
    expected = np.zeros((n, n), np.int64)
    maps = sorted(glob.glob(osp.join(shapes, 'annotations', 'validation', '*.png')))
    for i, path in enumerate(maps):
        label = cv2.imread(path, 0).astype(np.int64)
        pred = label.copy()
        if i == 0:
            pred[label == 1] = 2
        keep = label > 0  # reduce_zero_label: background is ignored
        np.add.at(expected, (label[keep] - 1, pred[keep] - 1), 1)
        cv2.imwrite(str(preds / osp.basename(path)), pred.astype(np.uint8))
    matrix = confusion_matrix.main([run_configs[1], str(preds), str(tmp_path / 'cm'), '--show'])
    assert 'No display' in capsys.readouterr().out
    assert np.array_equal(matrix, expected) and expected.trace() > 0
    assert cv2.imread(str(tmp_path / 'cm' / 'confusion_matrix.png')) is not None
    os.remove(preds / osp.basename(maps[1]))
    err = tool_failure(confusion_matrix.main, [run_configs[1], str(preds), str(tmp_path)], capsys)
    assert f'No prediction {osp.basename(maps[1])}' in err


# --------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_train_log_curves_and_confusion_matrix_of_a_test_run(det_run, shapes, tmp_path,
                                                             headless, capsys):
    """A real run: the json log tools/train.py writes read by analyze_logs, the .pkl of
    tools/test.py --out read by confusion_matrix (the shared run of conftest.det_run)."""
    config, work, preds = det_run.config, det_run.work, det_run.preds

    [log] = scalars_files(work)
    curves = str(tmp_path / 'curves.png')
    log_dicts = analyze_logs.main(['plot_curve', log, '--keys', 'loss', 'coco/bbox_mAP',
                                   '--out', curves])
    assert 'metric is bbox_mAP' in capsys.readouterr().out and cv2.imread(curves) is not None
    assert len(log_dicts[0][1]['bbox_mAP']) == 1  # mmdet's loader: by epoch, 1 validation
    analyze_logs.main(['cal_train_time', log, '--include-outliers'])
    with open(log) as f:
        train_times = [line['time'] for line in map(json.loads, f) if 'lr' in line]
    assert f'average iter time: {np.mean(train_times):.4f} s/iter' in capsys.readouterr().out

    matrix = confusion_matrix.main([config, preds, str(tmp_path / 'cm'), '--score-thr', '0',
                                    '--show'])
    assert 'No display' in capsys.readouterr().out
    assert cv2.imread(str(tmp_path / 'cm' / 'confusion_matrix.png')) is not None
    # each ground-truth object is matched or missed, so counted in its row at least once
    per_class = np.bincount(np.concatenate([labels for _, labels in _gt_instances(shapes)]),
                            minlength=len(SHAPES))
    assert (matrix[:len(SHAPES)].sum(1) >= per_class).all() and matrix[-1, -1] == 0


@pytest.mark.slow
def test_segmentation_confusion_matrix_of_a_test_run_agrees_with_its_metrics(
        seg_run, tmp_path, headless):
    """tools/test.py --out DIR (label maps in the dataset's numbering, written by mmseg's
    IoUMetric) read back: the matrix's accuracy is the aAcc the same run reported (the
    shared run of conftest.seg_run)."""
    config, preds = seg_run.config, seg_run.preds
    [metrics] = glob.glob(osp.join(seg_run.test_dir, '*', '2*.json'))
    with open(metrics) as f:
        a_acc = json.load(f)['aAcc']
    matrix = confusion_matrix.main([config, preds, str(tmp_path / 'cm')])
    assert matrix.sum() > 0
    assert 100 * matrix.trace() / matrix.sum() == pytest.approx(a_acc, abs=0.01)

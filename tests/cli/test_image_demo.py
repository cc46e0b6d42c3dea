"""demo/image_demo.py: pictures from mmdet (boxes + masks) and mmseg (overlay) configs, for
an image, a folder or a glob pattern, headless."""
import json
import os
import shutil

import mmcv
import numpy as np
import pytest
import torch

from helpers.runs import SEG_CONFIG
from helpers.tiny_models import REPO, SHAPES, seg_run_config
from helpers.tool_configs import tiny_mask_rcnn, tiny_sem_fpn
from mmplugin_inline.cli import image_demo


@pytest.fixture
def image(tmp_path):
    """An odd-sized picture of two coloured rectangles on grey."""
    img = np.full((90, 123, 3), 200, np.uint8)
    img[20:60, 30:80] = (0, 0, 255)
    img[50:85, 70:115] = (0, 180, 0)
    path = str(tmp_path / 'shapes.jpg')
    mmcv.imwrite(img, path)
    return path


def test_detection_picture_with_random_weights(tmp_path, image, capsys):
    # an untrained detector scores every class about 1/81, under mmdet's test score_thr of
    # 0.05: keep all detections (--cfg-options) and draw them all (--score-thr 0)
    torch.manual_seed(0)   # the random weights decide where the boxes are
    [out] = image_demo.main([image, tiny_mask_rcnn(tmp_path), '--out-dir', str(tmp_path / 'out'),
                             '--score-thr', '0', '--cfg-options',
                             'model.test_cfg.rcnn.score_thr=0'])
    assert out == str(tmp_path / 'out' / 'vis' / 'shapes.jpg')
    assert image_demo.RANDOM_WEIGHTS_WARNING in capsys.readouterr().out
    drawn, original = mmcv.imread(out), mmcv.imread(image)
    assert drawn.shape == original.shape
    # 100 boxes, masks and labels cover much of the picture (a third to all of it over
    # seeds); with nothing drawn only the visualizer's resampling changes pixels: 7 %
    changed = np.abs(drawn.astype(int) - original.astype(int)).sum(-1) > 30
    assert changed.mean() > 0.25


def test_segmentation_overlay_uses_the_given_weights(tmp_path, image, capsys):
    config = tiny_sem_fpn(tmp_path)
    from mmplugin_inline.analysis import build_model
    from mmplugin_inline.tools_common import load_config
    model = build_model(load_config(config))
    # weights that make every pixel class 7: the prediction must come from this file
    torch.nn.init.zeros_(model.decode_head.conv_seg.weight)
    with torch.no_grad():
        model.decode_head.conv_seg.bias.fill_(-10).index_fill_(0, torch.tensor([7]), 10)
    weights = str(tmp_path / 'sem_fpn.pth')
    torch.save({'state_dict': model.state_dict(),
                'meta': {'dataset_meta': {'classes': [f'c{i}' for i in range(150)],
                                          'palette': [[i, 255 - i, 3 * i % 256]
                                                      for i in range(150)]}}}, weights)
    [out] = image_demo.main([image, config, '--weights', weights, '--out-dir',
                             str(tmp_path / 'out'), '--opacity', '1'])
    assert image_demo.RANDOM_WEIGHTS_WARNING not in capsys.readouterr().out
    drawn = mmcv.imread(out)
    assert drawn.shape == (90, 123, 3)
    label_maps = os.listdir(tmp_path / 'out' / 'pred')
    assert len(label_maps) == 1
    labels = mmcv.imread(str(tmp_path / 'out' / 'pred' / label_maps[0]), flag='unchanged')
    assert labels.shape == (90, 123) and (labels == 7).all()
    # opacity 1: the picture is class 7's colour (BGR of RGB (7, 248, 21)), up to JPEG
    assert np.abs(drawn.reshape(-1, 3).mean(0) - (21, 248, 7)).max() < 12


def test_missing_inputs_are_named(tmp_path, image, capsys):
    config = tiny_sem_fpn(tmp_path)
    with pytest.raises(FileNotFoundError, match='nope.jpg'):
        image_demo.run_demo(str(tmp_path / 'nope.jpg'), config, str(tmp_path))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(FileNotFoundError, match='no image .* in the folder .*empty'):
        image_demo.run_demo(str(tmp_path / 'empty'), config, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r'no file matches the pattern .*\*.png'):
        image_demo.run_demo(str(tmp_path / '*.png'), config, str(tmp_path))
    with pytest.raises(SystemExit):  # the tool: one message, no traceback
        image_demo.main([str(tmp_path / 'nope.jpg'), config])
    assert 'image not found' in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        image_demo.run_demo(image, config, str(tmp_path), weights=str(tmp_path / 'nope.pth'))


def test_a_glob_of_images_batched_with_the_default_out_dir_headless(tmp_path, image, capsys,
                                                                    monkeypatch):
    """mmdet: a glob pattern, 2 images per batch, --pred-score-thr above every score (nothing
    drawn), --show without a display, --print-result, pictures in ./outputs/vis/."""
    monkeypatch.delenv('DISPLAY', raising=False)
    monkeypatch.delenv('WAYLAND_DISPLAY', raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / 'images'
    folder.mkdir()
    for name in ('a.jpg', 'b.jpg', 'c.jpg'):
        shutil.copy(image, folder / name)
    (folder / 'notes.txt').write_text('not an image')
    torch.manual_seed(0)
    out = image_demo.main([str(folder / '[ab].jpg'), tiny_mask_rcnn(tmp_path), '--batch-size',
                           '2', '--pred-score-thr', '1.01', '--show', '--print-result',
                           '--cfg-options', 'model.test_cfg.rcnn.score_thr=0',
                           'test_dataloader.dataset.pipeline.1.scale=(160,160)'])
    assert out == [os.path.join('outputs', 'vis', name) for name in ('a.jpg', 'b.jpg')]
    assert sorted(os.listdir('outputs/vis')) == ['a.jpg', 'b.jpg']
    printed = capsys.readouterr().out
    assert 'No display' in printed and "'predictions'" in printed and "'scores'" in printed
    original = mmcv.imread(image).astype(int)
    for path in out:  # nothing scored over 1.01: only the resampling changes pixels
        changed = np.abs(mmcv.imread(path).astype(int) - original).sum(-1) > 30
        assert changed.mean() < 0.15


def test_a_folder_for_segmentation_names_the_config_classes(tmp_path, shapes, capsys):
    """mmseg with random weights: every image of the folder, the classes printed per image
    are the config's (not Cityscapes', the inferencer's default without a checkpoint)."""
    config = tmp_path / 'upernet_tiny.py'
    config.write_text(seg_run_config(SEG_CONFIG, shapes))
    folder = os.path.join(shapes, 'images', 'validation')
    sizes = {mmcv.imread(os.path.join(folder, name)).shape for name in os.listdir(folder)}
    assert len(sizes) == 2  # mmseg batches only images of one size: a message, not an assert
    with pytest.raises(SystemExit):
        image_demo.main([folder, str(config), '--batch-size', '2'])
    assert 'mmseg batches only images of one size' in capsys.readouterr().err
    out = image_demo.main([folder, str(config), '--out-dir', str(tmp_path / 'out'),
                           '--print-result'])
    names = sorted(os.listdir(folder))
    assert [os.path.basename(p) for p in out] == names
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith('{')]
    assert [os.path.basename(line['image']) for line in lines] == names
    for line in lines:
        image = mmcv.imread(os.path.join(folder, os.path.basename(line['image'])))
        assert line['shape'] == list(image.shape[:2])
        assert set(line['classes']) <= set(SHAPES)
        assert abs(sum(line['classes'].values()) - 1) < 1e-3


def test_the_shipped_sample_image_is_small_and_from_the_shapes_tool():
    path = os.path.join(REPO, 'demo', 'shapes.jpg')
    assert os.path.getsize(path) < 50_000
    assert mmcv.imread(path).shape == (224, 224, 3)  # as its recipe in image_demo.py says

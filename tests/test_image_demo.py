"""demo/image_demo.py: a picture from mmdet (boxes + masks) and mmseg (overlay) configs."""
import os

import mmcv
import numpy as np
import pytest
import torch

from helpers.tool_configs import tiny_mask_rcnn, tiny_sem_fpn
from helpers.runs import load_script

image_demo = load_script('demo/image_demo.py')


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
    out = image_demo.main([image, tiny_mask_rcnn(tmp_path), '--out-dir', str(tmp_path / 'out'),
                           '--score-thr', '0', '--cfg-options', 'model.test_cfg.rcnn.score_thr=0'])
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
    from mmplugin_inline.utils.tool_setup import load_config
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
    out = image_demo.main([image, config, '--weights', weights, '--out-dir',
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


def test_missing_inputs_are_named(tmp_path, image):
    config = tiny_sem_fpn(tmp_path)
    with pytest.raises(FileNotFoundError, match='nope.jpg'):
        image_demo.run_demo(str(tmp_path / 'nope.jpg'), config, str(tmp_path))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        image_demo.run_demo(image, config, str(tmp_path), weights=str(tmp_path / 'nope.pth'))

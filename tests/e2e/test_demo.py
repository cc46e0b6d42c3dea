"""`make demo` / `make demo-seg` end to end, shortened: data, training, metrics, pictures."""
import json
import os
import subprocess

import mmcv
import pytest

from helpers.paths import REPO

ROOT = REPO


@pytest.mark.slow
@pytest.mark.parametrize('mode,metric', [('det', 'coco/segm_mAP'), ('seg', 'mIoU')])
def test_shortened_demo_writes_metrics_and_pictures(mode, metric, tmp_path):
    # a 12 s budget, and at least 6 iterations however busy the 2 cores are (6 train
    # images in batches of 2: the logger writes the training scalars at 3 and 6)
    env = dict(os.environ, DEMO_TRAIN='6', DEMO_VAL='3', DEMO_BUDGET_S='12',
               DEMO_MIN_ITERS='6',
               DEMO_VAL_INTERVAL='4', DEMO_DATA_DIR=str(tmp_path / 'data'),
               DEMO_WORK_DIR=str(tmp_path / 'work'))
    res = subprocess.run(['bash', 'tools/demo.sh', mode], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert 'Iter(train)' in out or 'Iter(val)' in out       # OpenMMLab progress logs
    report = tmp_path / 'work' / 'report'
    metrics = json.load(open(report / 'metrics.json'))
    assert metric in metrics['final'] and metrics['iterations'] >= 6
    # validations are logged at their iteration (the mAP / mIoU curve needs it)
    steps = [v['step'] for v in metrics['validations']]
    assert steps and all(s >= 1 for s in steps) and steps == sorted(steps)
    assert f'{metric} ' in out                              # printed at the end
    for name in ('predictions.png', 'curves.png'):
        assert str(report / name) in out
        image = mmcv.imread(str(report / name))
        assert image is not None and image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 5                               # not a blank picture

"""tools/model_converters/publish_model.py: a run's checkpoint becomes its weights and meta
only, named by its sha256, and reads with plain ``torch.load(weights_only=True)`` and the
stock mmseg / mmdet inferencers."""
import hashlib
import os
import os.path as osp
import re
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.registry import DefaultScope

from helpers.pickles import RunsCode
from helpers.runs import PYTHON, ok, run_tool
from helpers.tiny_models import REPO, SHAPES
from mmplugin_inline.cli import publish_model
from mmplugin_inline.weights import DamagedCheckpointError, load_run_checkpoint

TOOL = osp.join(REPO, 'tools/model_converters/publish_model.py')

# in a fresh interpreter that imports neither the plugin nor mmengine: torch's own allow-list
_PLAIN_LOAD = """
import sys, torch
checkpoint = torch.load(sys.argv[1], map_location='cpu', weights_only=True)
assert not {'mmplugin_inline', 'mmengine'} & set(sys.modules)
print(sorted(checkpoint), len(checkpoint['state_dict']))
"""


def _check_published(out_file: str, stdout: str) -> str:
    """The printed path: OUT_STEM-<8 hex of its sha256>.pth, alone in its folder."""
    path = stdout.strip().splitlines()[-1]
    stem = out_file[:-len('.pth')]
    assert re.fullmatch(re.escape(stem) + r'-[0-9a-f]{8}\.pth', path), path
    with open(path, 'rb') as f:
        assert path[-len('12345678.pth'):-len('.pth')] == hashlib.sha256(f.read()).hexdigest()[:8]
    assert os.listdir(osp.dirname(path)) == [osp.basename(path)]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as open() makes it, not 0600
    return path


def _plain_load_in_a_fresh_process(path: str) -> str:
    rc, out, _ = run_tool([PYTHON, '-c', _PLAIN_LOAD, path])
    assert rc == 0, out[-3000:]
    return out.strip().splitlines()[-1]


# --------------------------------------------------------------------------- fast

def _mmengine_style_checkpoint(path):
    """What a run checkpoint can hold: numpy values and mmengine objects in the meta too."""
    state_dict = OrderedDict(weight=torch.arange(6.).reshape(2, 3), bias=torch.zeros(2))
    state_dict._metadata = OrderedDict({'': dict(version=1)})
    torch.save({
        'meta': dict(iter=4, seed=np.int64(7), best_score=np.float64(0.25),
                     dataset_meta=dict(classes=('a', 'b'), palette=np.array([[1, 2, 3]]),
                                       flags={np.int64(3): np.bool_(True)}),
                     buffer=HistoryBuffer([1.0, 2.0], [1, 1])),
        'state_dict': state_dict,
        'message_hub': dict(log_scalars=dict(loss=HistoryBuffer([0.5], [1]))),
        'optimizer': dict(state={}, param_groups=[dict(lr=np.float64(0.1))]),
        'param_schedulers': [], 'time_budget': dict(elapsed_s=1.0)}, path)


def test_publish_keeps_weights_and_plain_meta(tmp_path, capsys):
    src = str(tmp_path / 'iter_4.pth')
    _mmengine_style_checkpoint(src)
    out_file = str(tmp_path / 'published' / 'tiny.pth')  # the folder is created
    assert publish_model.main([src, out_file]) == 0
    stdout = capsys.readouterr().out
    path = _check_published(out_file, stdout)
    assert 'message_hub, optimizer, param_schedulers, time_budget' in stdout
    assert "meta['buffer'] (mmengine.logging.history_buffer.HistoryBuffer)" in stdout

    published = torch.load(path, weights_only=True)
    assert list(published) == ['meta', 'state_dict']
    meta = published['meta']
    assert meta == dict(iter=4, seed=7, best_score=0.25,
                        dataset_meta=dict(classes=('a', 'b'), palette=[[1, 2, 3]],
                                          flags={3: True}))
    assert type(meta['seed']) is int and type(meta['best_score']) is float
    assert type(next(iter(meta['dataset_meta']['flags']))) is int
    state_dict = published['state_dict']
    assert isinstance(state_dict, OrderedDict) and list(state_dict) == ['weight', 'bias']
    assert torch.equal(state_dict['weight'], torch.arange(6.).reshape(2, 3))
    assert state_dict._metadata == {'': dict(version=1)}  # module versions kept
    assert _plain_load_in_a_fresh_process(path) == "['meta', 'state_dict'] 2"
    # the name's hash is what the loaders verify; a copy that changed is refused
    assert list(load_run_checkpoint(path)) == ['meta', 'state_dict']
    with open(path, 'ab') as f:
        f.write(b'\0')
    with pytest.raises(DamagedCheckpointError, match='the file changed after publishing'):
        load_run_checkpoint(path)

    # the same input gives the same bytes, hence the same name
    assert publish_model.main([src, str(tmp_path / 'again' / 'tiny')]) == 0
    assert capsys.readouterr().out.strip().endswith(f'again/{osp.basename(path)}')


def test_publish_explains_bad_input_without_a_traceback(tmp_path, capsys):
    rc, out, err = run_tool([PYTHON, TOOL, str(tmp_path / 'missing.pth'),
                             str(tmp_path / 'out.pth')])
    assert rc == 1 and 'Traceback' not in err
    assert f'Checkpoint not found: {tmp_path / "missing.pth"}' in err

    weights_only = str(tmp_path / 'weights.pth')
    torch.save({'model': {'w': torch.ones(1)}}, weights_only)
    assert publish_model.main([weights_only, str(tmp_path / 'out.pth')]) == 1
    err = capsys.readouterr().err
    assert "is not an mmengine training checkpoint: it has no state_dict (keys ['model'])" in err

    damaged = tmp_path / 'damaged.pth'
    damaged.write_bytes(b'<html><body>not found</body></html>')
    assert publish_model.main([str(damaged), str(tmp_path / 'out.pth')]) == 1
    assert 'is a web page' in capsys.readouterr().err

    unsafe = str(tmp_path / 'unsafe.pth')
    torch.save({'state_dict': {}, 'meta': {}, 'x': RunsCode(print, 'ran')}, unsafe)
    assert publish_model.main([unsafe, str(tmp_path / 'out.pth')]) == 1
    assert '--allow-unsafe' in capsys.readouterr().err
    assert not list(tmp_path.glob('out*'))  # nothing was written


# --------------------------------------------------------------------------- end to end

RUNS = {'mmseg': 'seg_run', 'mmdet': 'det_run'}  # codebase: its shared run (tests/conftest.py)


def _predict(codebase, config, weights, image):
    """One image through the codebase's stock inferencer; the prediction's data sample."""
    with DefaultScope.overwrite_default_scope(codebase):
        if codebase == 'mmseg':
            from mmseg.apis import MMSegInferencer
            inferencer = MMSegInferencer(model=config, weights=weights, device='cpu')
            sample = inferencer(image, return_datasamples=True)  # one image: the sample
        else:
            from mmdet.apis import DetInferencer
            inferencer = DetInferencer(model=config, weights=weights, device='cpu')
            sample = inferencer(image, return_datasamples=True)['predictions'][0]
    return inferencer.model, sample


@pytest.mark.slow
@pytest.mark.parametrize('codebase', list(RUNS))
def test_published_run_checkpoint_loads_plainly_and_infers(request, shapes, tmp_path, codebase):
    run = request.getfixturevalue(RUNS[codebase])  # trained by tools/train.py
    config = run.config
    trained = load_run_checkpoint(run.checkpoint)
    assert {'meta', 'state_dict', 'optimizer', 'message_hub', 'param_schedulers'} <= set(trained)

    out_file = str(tmp_path / 'published' / 'tiny_run.pth')
    rc, out, err = run_tool([PYTHON, TOOL, run.checkpoint, out_file])
    ok(rc, out)
    stdout = out[:len(out) - len(err)]
    path = _check_published(out_file, stdout)
    assert 'removed: message_hub, optimizer, param_schedulers' in stdout
    assert _plain_load_in_a_fresh_process(path) == \
        f"['meta', 'state_dict'] {len(trained['state_dict'])}"
    published = torch.load(path, weights_only=True)
    assert published['meta']['dataset_meta']['classes'] == SHAPES
    for key, value in trained['state_dict'].items():
        assert torch.equal(published['state_dict'][key], value), key

    image = osp.join(shapes, 'images', 'validation', '000000.jpg')
    model, sample = _predict(codebase, str(config), path, image)
    assert model.dataset_meta['classes'] == SHAPES  # read from the published meta
    height, width = sample.ori_shape
    if codebase == 'mmseg':
        assert sample.pred_sem_seg.data.shape == (1, height, width)
    else:
        assert sample.pred_instances.bboxes.shape[1] == 4
        assert sample.pred_instances.masks.shape[1:] == (height, width)

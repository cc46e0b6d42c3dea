"""Reproduce the authors' released models' outputs from their checkpoints (fp32, 1e-4)."""
import pytest
import torch

from helpers.fidelity import FAMILIES, backbone_cfg, load_fixture
from mmplugin_inline.registry import MODELS

ATOL = 1e-4


def _build(family, fixture, tmp_path, **overrides):
    path = tmp_path / f'{family}_released.pth'
    torch.save(fixture['checkpoint'], path)  # exactly the released {'model': state_dict}
    cfg = backbone_cfg(family, fixture['arch'], **overrides)
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path))
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval()


def _pooled(family, model, x, raw_outs, outs):
    if family == 'deit':
        _, _, final = model.forward_tokens(x)
        return model.norm(final)[:, 0]
    if family == 'pvt':  # the authors' PVT has no final norm: the raw last stage, pooled
        return raw_outs[-1].mean(dim=(2, 3))
    return outs[-1].mean(dim=(2, 3))  # Swin / CSWin: final norm = last out norm


@pytest.mark.parametrize('family', FAMILIES)
def test_stage_outputs_and_pooled_feature_match_the_authors(family, tmp_path):
    fixture = load_fixture(family)
    raw_kwargs = {} if family == 'deit' else dict(out_norm=False)
    normed_kwargs = dict(final_norm=True) if family == 'deit' else {}  # DeiT: norm only then
    raw = _build(family, fixture, tmp_path, **raw_kwargs)
    normed = _build(family, fixture, tmp_path, **normed_kwargs)
    for case in fixture['cases']:
        x = case['input']
        with torch.no_grad():
            outs = raw(x)
            pooled = _pooled(family, normed, x, outs, normed(x))
        assert len(outs) == len(case['stage_outputs'])
        for i, (ours, theirs) in enumerate(zip(outs, case['stage_outputs'])):
            assert ours.shape == theirs.shape, f'stage {i}'
            err = (ours - theirs).abs().max().item()
            assert err <= ATOL, f'{family} stage {i} at {tuple(x.shape)}: max abs error {err:.2e}'
        err = (pooled - case['pooled']).abs().max().item()
        assert err <= ATOL, f'{family} pooled feature: max abs error {err:.2e}'


@pytest.mark.parametrize('family', FAMILIES)
def test_an_unloaded_model_does_not_reproduce_them(family):
    """The fixtures' weights are perturbed: without loading them the outputs differ."""
    fixture = load_fixture(family)
    model = MODELS.build(backbone_cfg(family, fixture['arch'])).eval()
    case = fixture['cases'][0]
    with torch.no_grad():
        outs = model(case['input'])
    assert (outs[-1] - case['stage_outputs'][-1]).abs().max() > 1e-2

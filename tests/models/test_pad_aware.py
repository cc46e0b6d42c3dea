"""Pad-aware mode: an image's features do not depend on its batch partners.

For every family (and softmax / mixed block types, DeiT's cls token): an image alone
equals the same image zero-padded inside a batch with a larger partner, on its valid
region, at every output stage; the gradients of the image's own loss are equal too;
with ``pad_aware=False`` (or no sizes) the outputs are today's.
"""
import copy

import pytest
import torch

import mmplugin_inline  # noqa: F401
from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.models.layers import REAL_HW_ATTR
from mmplugin_inline.registry import MODELS

TOL = 1e-5

# (family, extra settings): softmax / mixed variants of each family that has them
CASES = [
    ('InLinePVT', {}),
    ('InLinePVT', dict(block_types='SSSS')),
    ('InLinePVT', dict(block_types='ISIS')),
    ('InLineSwinTransformer', {}),
    # two blocks per stage: the second is shifted (SW-MSA); the partner's canvas is larger
    # than one window where the image alone is not (stage 2), so the shift differs per image
    ('InLineSwinTransformer', dict(block_types='SSSS', arch_depths=[2, 2, 2, 2])),
    ('InLineSwinTransformer', dict(block_types='IIMS1', arch_depths=[1, 1, 2, 2])),
    ('InLineSwinTransformer', dict(inline_window=4)),
    ('InLineCSWinTransformer', {}),
    ('InLineCSWinTransformer', dict(block_types='ISSS')),
    ('InLineCSWinTransformer', dict(block_types='IIII')),
    ('InLineDeiT', dict(out_indices=(3, 11), final_norm=True)),
    # the paper's comparison variants: plain linear attention, and no local residual
    ('InLinePVT', dict(block_types='LLLL')),
    ('InLinePVT', dict(block_types='ILSI', local_residual=False)),
    ('InLineSwinTransformer', dict(block_types='LLLS')),
    ('InLineSwinTransformer', dict(block_types='LLLL', inline_window=4, local_residual=False)),
    ('InLineCSWinTransformer', dict(block_types='LLSS')),
    ('InLineCSWinTransformer', dict(block_types='IILS', local_residual=False)),
    ('InLineDeiT', dict(out_indices=(3, 11), block_types='LLLLSSSSIIII')),
    ('InLineDeiT', dict(out_indices=(3, 11), block_types='L', local_residual=False)),
]


def build(family, pad_aware=True, **extra):
    arch, settings, _ = TINY_BACKBONES[family]
    arch = dict(arch)
    if 'arch_depths' in extra:
        arch['depths'] = extra.pop('arch_depths')
    cfg = dict(type=family, arch=arch, init_cfg=None, **settings, **extra)
    if pad_aware is not None:
        cfg['pad_aware'] = pad_aware
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    # random output norms, so that a zero in the padding is the mode's doing
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith('norm') or name.endswith('bias'):
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def valid_part(out, size, stride):
    h, w = -(-size[0] // stride), -(-size[1] // stride)
    return out[..., :h, :w]


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def images(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    small = torch.randn(1, 3, 52, 44, generator=g, dtype=dtype)   # the image
    big = torch.randn(1, 3, 80, 96, generator=g, dtype=dtype)     # its partner
    batch = torch.zeros(2, 3, 96, 96, dtype=dtype)                 # padded to 32
    batch[0, :, :52, :44] = small[0]
    batch[1, :, :80, :96] = big[0]
    return small, big, batch, [(52, 44), (80, 96)]


@pytest.mark.parametrize('family,extra', CASES,
                         ids=[f'{f}-{e.get("block_types", "")}{e.get("inline_window", "")}'
                              + ('-nores' if e.get('local_residual') is False else '')
                              for f, e in CASES])
def test_alone_equals_padded_batch(family, extra):
    model = build(family, **copy.deepcopy(extra))
    small, big, batch, sizes = images()
    stride_of = (lambda i: 16) if family == 'InLineDeiT' else \
        (lambda i: 4 * 2 ** model.out_indices[i])
    alone = model(small)
    partner = model(big)
    padded = model(batch, real_hw=sizes)
    assert len(alone) == len(padded)
    for i, (a, p, q) in enumerate(zip(alone, padded, partner)):
        s = stride_of(i)
        assert rel_err(valid_part(p[:1], sizes[0], s), a) < TOL, f'output {i}'
        assert rel_err(valid_part(p[1:], sizes[1], s), q) < TOL, f'output {i} (partner)'
        # zero outside the valid region
        part = p[0].clone()
        part[:, :-(-52 // s), :-(-44 // s)] = 0
        assert part.abs().max() == 0

    # the gradients of the image's own loss, alone and in the batch
    weights = [torch.randn_like(a) for a in alone]

    def grads(outs):
        model.zero_grad()
        loss = sum((valid_part(o[:1], sizes[0], stride_of(i)) * w).sum()
                   for i, (o, w) in enumerate(zip(outs, weights)))
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    g_alone = grads(model(small))
    g_batch = grads(model(batch, real_hw=torch.tensor(sizes)))
    assert g_alone.keys() == g_batch.keys()
    for name in g_alone:
        if g_alone[name].abs().max() > 0:
            assert rel_err(g_batch[name], g_alone[name]) < TOL, name


@pytest.mark.parametrize('family', list(TINY_BACKBONES))
def test_off_is_todays_path(family):
    """pad_aware=False (the default) or no known sizes: today's outputs, bit for bit."""
    default = build(family, pad_aware=None)
    on = build(family, pad_aware=True)
    off = build(family, pad_aware=False)
    assert not default.pad_aware
    _, _, batch, sizes = images()
    ref = default(batch)
    setattr(batch, REAL_HW_ATTR, torch.tensor(sizes))   # ignored when the mode is off
    for model, x in ((off, batch), (on, batch.clone())):  # a clone has no sizes: default
        for a, b in zip(model(x), ref):
            assert torch.equal(a, b)
    # the mode on with every image filling the canvas: the default path too
    full = on(batch.clone(), real_hw=[(96, 96), (96, 96)])
    for a, b in zip(full, ref):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match='pad_aware=True'):
        off(batch, real_hw=sizes)


def test_the_mode_without_sizes_warns_once_per_model():
    """pad_aware=True on an input that carries no sizes (the stock data preprocessor):
    one warning per model, however many forwards, naming the fix; none with sizes."""
    import warnings
    _, _, batch, sizes = images()
    first, second = build('InLinePVT'), build('InLinePVT')
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        for _ in range(3):
            first(batch.clone())
        second(batch.clone())
        first(batch, real_hw=sizes)
    messages = [str(w.message) for w in seen if 'pad_aware=True' in str(w.message)]
    assert len(messages) == 2                                   # one per model
    assert 'PadAwareDetDataPreprocessor' in messages[0] and 'real_hw=' in messages[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        build('InLinePVT', pad_aware=False)(batch.clone())
        sized = batch.clone()
        setattr(sized, REAL_HW_ATTR, torch.tensor(sizes))
        build('InLinePVT')(sized)
    assert not [w for w in seen if 'pad_aware=True' in str(w.message)]


def test_sizes_from_the_input_attribute():
    model = build('InLinePVT')
    small, _, batch, sizes = images()
    setattr(batch, REAL_HW_ATTR, torch.tensor(sizes))
    a, p = model(small), model(batch)
    assert rel_err(valid_part(p[0][:1], sizes[0], 4), a[0]) < TOL


@pytest.mark.parametrize('with_cp', [True, 'attn'])
def test_with_cp_recomputes_with_the_mask(with_cp):
    """Checkpointed blocks get the grid as an argument: the backward recomputation too."""
    ref = build('InLineSwinTransformer', block_types='SSSS', arch_depths=[2, 2, 2, 2])
    cp = build('InLineSwinTransformer', block_types='SSSS', arch_depths=[2, 2, 2, 2],
               with_cp=with_cp)
    _, _, batch, sizes = images()
    grads = []
    for model in (ref, cp):
        x = batch.clone().requires_grad_()
        sum(o.square().sum() for o in model(x, real_hw=sizes)).backward()
        grads.append(x.grad)
    assert rel_err(grads[1], grads[0]) < TOL

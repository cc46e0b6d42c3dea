"""Every mixer in every attention layer against the explicit N x N definition.

For each family's layer (PVT's spatial-reduction attention, DeiT's global attention with
a cls token, Swin's whole-map and window attention, CSWin's stripes) and each block
letter ('I', 'L', 'S'; the linear ones with and without their local residual), the layer
is compared, in fp64, forward and backward, on a map that is not a whole number of
windows / stripes / reduction cells, with a reference written here token by token: for
each group of real tokens (a window, a stripe, the map), the attention weights of
``core/reference.py`` on its real keys times V, plus the local residual (the 3x3 conv of
the group's real V, zero padded at its border, with the kernels the two ``Conv1d``
modules predict from the group's mean token), then the layer's output projection.
"""
import pytest
import torch
import torch.nn as nn

from mmplugin_inline.core import (
    inline_attention_weights,
    linear_attention_weights,
    local_residual_reference,
    softmax_attention_weights,
)
from mmplugin_inline.models.layers import CSWinAttention, GlobalAttention, WindowAttention

HW, C, HEADS = (7, 9), 8, 2
WINDOW, SPLIT, SR = 4, 2, 2


def heads_of(t, heads):
    """[N, C] -> [1, heads, N, d]."""
    return t.view(t.shape[0], heads, -1).transpose(0, 1)[None]


def attend(mixer, q, k, v, bias=None):
    """The explicit weights of the mixer's letter times V: [Nq, C]."""
    qh, kh = heads_of(q, mixer.num_heads), heads_of(k, mixer.num_heads)
    if mixer.letter == 'I':
        w = inline_attention_weights(qh, kh, kernel=mixer.kernel)
    elif mixer.letter == 'L':
        w = linear_attention_weights(qh, kh, kernel=mixer.kernel)
    else:
        w = softmax_attention_weights(qh, kh, bias=bias)
    assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5) \
        or mixer.letter == 'L'                       # rows of a distribution ('L': + eps)
    return (w @ heads_of(v, mixer.num_heads))[0].transpose(0, 1).reshape(q.shape[0], -1)


def residual(mixer, v, hw, mean):
    """The local residual of a group's real values v [h*w, C] (zero padded at its border),
    kernels from the ``Conv1d`` modules on the mean token; zero without a residual."""
    if getattr(mixer, 'residual', None) is None:
        return 0
    c = v.shape[1]
    kernels = nn.Sequential.forward(mixer.residual, mean.view(1, c, 1)).view(1, c, 3, 3)
    out = local_residual_reference(v.T.reshape(1, c, *hw), kernels)
    return out[0].reshape(c, -1).T


def grid_cells(h, w):
    return [(i, j) for i in range(h) for j in range(w)]


def global_reference(attn, x, hw):
    """PVT (spatial reduction for softmax), DeiT (cls prefix), Swin's whole-map blocks."""
    p = attn.num_prefix
    tokens = x[0]
    kv_source = tokens
    if attn.sr_ratio > 1:                               # zero padded to whole cells
        h, w = hw
        x_map = tokens.T.reshape(1, C, h, w)
        ph, pw = -h % attn.sr_ratio, -w % attn.sr_ratio
        x_map = torch.nn.functional.pad(x_map, (0, pw, 0, ph))
        kv_source = attn.norm(attn.sr(x_map).flatten(2)[0].T)
    q, k, v = attn.project(tokens[None], kv_source[None])
    q, k, v = q[0], k[0], v[0]
    out = attend(attn.mixer, q, k, v)
    out[p:] = out[p:] + residual(attn.mixer, v[p:], hw, tokens.mean(0))
    return attn.proj(out)[None]


def window_reference(attn, x, hw):
    """Swin's windows: each query attends to the real keys of its (shifted) window and,
    shifted, of its region; relative position bias for softmax; a residual per window."""
    h, w = hw
    ws, s = attn.window_size, attn.shift_for(hw)
    hp, wp = h + (-h % ws), w + (-w % ws)
    xm = torch.zeros(hp, wp, C, dtype=x.dtype)
    xm[:h, :w] = x[0].view(h, w, C)
    qkv = attn.qkv(xm)                                  # the padded map projected too
    q, k, v = qkv.chunk(3, dim=-1)

    def rolled(i, j):                                   # position in the rolled map
        return (i - s) % hp, (j - s) % wp

    def region(i, j):                                   # Swin's shift regions (rolled map)
        def band(a, n):
            return 0 if a < n - ws else (1 if a < n - s else 2)
        return (band(i, hp), band(j, wp)) if s else (0, 0)

    out = torch.zeros(h, w, C, dtype=x.dtype)
    table = getattr(attn, 'relative_position_bias_table', None)
    windows = {}
    for i, j in grid_cells(h, w):
        ri, rj = rolled(i, j)
        windows.setdefault((ri // ws, rj // ws), []).append((i, j))
    for cells in windows.values():                      # the real tokens of one window
        if attn.mixer.letter == 'S':
            for i, j in cells:
                ri, rj = rolled(i, j)
                keys = [(a, b) for a, b in cells if region(*rolled(a, b)) == region(ri, rj)]
                bias = None
                if table is not None:
                    bias = torch.stack([table[((ri % ws) - (rolled(a, b)[0] % ws) + ws - 1)
                                              * (2 * ws - 1) + (rj % ws) - (rolled(a, b)[1] % ws)
                                              + ws - 1] for a, b in keys], 1)[None, :, None]
                ka, kb = zip(*keys)
                out[i, j] = attend(attn.mixer, q[i, j][None], k[ka, kb], v[ka, kb], bias)[0]
            continue
        (top, left), (bottom, right) = cells[0], cells[-1]  # unshifted: a rectangle
        rh, rw = bottom - top + 1, right - left + 1
        block = (slice(top, bottom + 1), slice(left, right + 1))
        qw, kw, vw = (t[block].reshape(rh * rw, C) for t in (q, k, v))
        res = residual(attn.mixer, vw, (rh, rw), xm[block].reshape(-1, C).mean(0))
        out[block] = (attend(attn.mixer, qw, kw, vw) + res).view(rh, rw, C)
    return attn.proj(out.view(1, h * w, C))


def cswin_reference(attn, x, hw, shortcut):
    """CSWin: per branch, each stripe's real tokens (or the whole map) + LePE of the
    stripe's real V; a residual from the block input's mean (whole-map branch)."""
    h, w = hw
    q, k, v = (t[0].view(h, w, C) for t in attn.qkv(x).chunk(3, dim=-1))
    outs, c0 = [], 0
    for branch in attn.attns:
        c = branch.dim
        qb, kb, vb = (t[..., c0:c0 + c] for t in (q, k, v))
        c0 += c
        width, vertical = branch.stripe if branch.stripe is not None else (w, True)
        out = torch.zeros(h, w, c, dtype=x.dtype)
        for lo in range(0, w if vertical else h, width):
            block = (slice(None), slice(lo, lo + width)) if vertical else \
                (slice(lo, lo + width), slice(None))
            rh, rw = qb[block].shape[:2]
            qs, ks, vs = (t[block].reshape(rh * rw, c) for t in (qb, kb, vb))
            lepe = branch.get_v(vs.T.reshape(1, c, rh, rw))[0].reshape(c, -1).T
            res = residual(branch.mixer, vs, (rh, rw), shortcut[0].mean(0))
            out[block] = (attend(branch.mixer, qs, ks, vs) + lepe + res).view(rh, rw, c)
        outs.append(out)
    return attn.proj(torch.cat(outs, -1).view(1, h * w, C))


def build(layer, letter, local_residual):
    linear = letter != 'S'
    if layer == 'pvt':
        return GlobalAttention(C, HEADS, letter, separate_q=True, sr_ratio=1 if linear else SR,
                               local_residual=local_residual)
    if layer == 'deit':
        return GlobalAttention(C, HEADS, letter, num_prefix=1, local_residual=local_residual)
    if layer == 'swin':
        return GlobalAttention(C, HEADS, letter, local_residual=local_residual) if linear \
            else WindowAttention(C, HEADS, 'S', window_size=WINDOW, shift=True)
    if layer == 'swin-windows':
        return WindowAttention(C, HEADS, letter, window_size=WINDOW, local_residual=local_residual)
    return CSWinAttention(C, HEADS, letter, split_size=SPLIT, local_residual=local_residual)


CASES = [(layer, letter, lr) for layer in ('pvt', 'deit', 'swin', 'swin-windows', 'cswin')
         for letter in 'ILS' for lr in (True, False) if letter != 'S' or lr]


@pytest.mark.parametrize('layer,letter,local_residual', CASES,
                         ids=[f'{a}-{b}-{"res" if c else "nores"}' for a, b, c in CASES])
def test_layer_matches_the_explicit_definition(layer, letter, local_residual):
    torch.manual_seed(len(layer) * 10 + ord(letter))
    attn = build(layer, letter, local_residual).double().eval()
    with torch.no_grad():                               # non-trivial biases and tables
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    prefix = 1 if layer == 'deit' else 0
    x = torch.randn(1, prefix + HW[0] * HW[1], C, dtype=torch.float64, requires_grad=True)
    shortcut = torch.randn(1, HW[0] * HW[1], C, dtype=torch.float64, requires_grad=True)
    if layer == 'cswin':
        out, ref = attn(x, HW, shortcut=shortcut), cswin_reference(attn, x, HW, shortcut)
    elif isinstance(attn, WindowAttention):
        out, ref = attn(x, HW), window_reference(attn, x, HW)
    else:
        out, ref = attn(x, HW), global_reference(attn, x, HW)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64)
    inputs = [x, shortcut] + list(attn.parameters())
    grads = torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)
    ref_grads = torch.autograd.grad((ref * weight).sum(), inputs, allow_unused=True)
    for g, rg in zip(grads, ref_grads):
        if rg is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-9)
    assert any(getattr(m, 'residual', None) is not None for m in attn.modules()) == \
        (local_residual and letter != 'S')

"""Attention layers against token-by-token references on odd, padded sizes."""
import copy
import pickle

import pytest
import torch

from mmplugin_inline.core import inline_attention_reference, local_residual_reference
from mmplugin_inline.models.layers import (
    MIXERS,
    CSWinAttention,
    CSWinBranch,
    GlobalAttention,
    InLineMixer,
    LinearMixer,
    SoftmaxMixer,
    TransformerBlock,
    WindowAttention,
    mixer_class,
    parse_block_types,
    shifted_window_mask,
)


def _qkv(attn, x):
    return [t[0] for t in attn.project(x)]  # [N, C] each, batch 1


def _softmax_rows(q, k, v, heads, bias=None):
    """Per-query softmax attention over the given keys, head by head: [Nq, C]."""
    d = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        s = (q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T) * d ** -0.5
        if bias is not None:
            s = s + bias[h]
        outs.append(torch.softmax(s, -1) @ v[:, h * d:(h + 1) * d])
    return torch.cat(outs, -1)


def test_window_attention_on_a_padded_map_matches_per_window_reference():
    torch.manual_seed(0)
    h, w, c, heads, ws = 6, 7, 8, 2, 4
    attn = WindowAttention(c, heads, 'S', window_size=ws).double().eval()
    x = torch.randn(1, h * w, c, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x, (h, w))
        q, k, v = _qkv(attn, x)
        table = attn.relative_position_bias_table
        ref = torch.zeros(h * w, c, dtype=torch.float64)
        for i in range(h):
            for j in range(w):
                keys = [(a, b) for a in range(h) for b in range(w)
                        if a // ws == i // ws and b // ws == j // ws]   # real tokens only
                idx = [a * w + b for a, b in keys]
                bias = torch.stack([table[((i % ws) - (a % ws) + ws - 1) * (2 * ws - 1)
                                          + (j % ws) - (b % ws) + ws - 1] for a, b in keys], 1)
                ref[i * w + j] = _softmax_rows(q[i * w + j:i * w + j + 1], k[idx], v[idx],
                                               heads, bias[:, None, :])[0]
        ref = attn.proj(ref)
    torch.testing.assert_close(out[0], ref)


def test_shift_mask_matches_the_swin_rule_without_padding():
    mask = shifted_window_mask((8, 8), (8, 8), (4, 4), (2, 2))
    assert mask.shape == (4, 16, 16)
    assert (mask[0] == 0).all()             # the top-left window holds one region
    last = mask[3]                          # the bottom-right window holds four regions
    assert (last != 0).sum() == 16 * 16 - 4 * 4 * 4
    assert shifted_window_mask((8, 8), (8, 8), (4, 4), (0, 0)) is None


@pytest.mark.parametrize('vertical', [True, False])
def test_cswin_stripes_with_padding_match_per_stripe_reference(vertical):
    torch.manual_seed(1)
    h, w, c, heads, width = 5, 7, 4, 2, 3
    branch = CSWinBranch(c, heads, 'S', stripe=(width, vertical)).double().eval()
    q, k, v = (torch.randn(1, h * w, c, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        out = branch(q, k, v, (h, w), None)[0]
        ref = torch.zeros(h * w, c, dtype=torch.float64)
        vm = v[0].T.reshape(1, c, h, w)
        n_stripes = -(-(w if vertical else h) // width)
        for s in range(n_stripes):
            lo, hi = s * width, min((s + 1) * width, w if vertical else h)
            cells = [(a, b) for a in range(h) for b in range(w)
                     if lo <= (b if vertical else a) < hi]
            idx = [a * w + b for a, b in cells]
            att = _softmax_rows(q[0, idx], k[0, idx], v[0, idx], heads)
            sub = vm[:, :, :, lo:hi] if vertical else vm[:, :, lo:hi, :]
            lepe = branch.get_v(sub)[0].reshape(c, -1).T       # zero padded at stripe borders
            ref[idx] = att + lepe
    torch.testing.assert_close(out, ref)


def test_global_inline_attention_matches_the_definition_with_residual():
    torch.manual_seed(2)
    h, w, c, heads = 5, 6, 8, 2
    attn = GlobalAttention(c, heads, 'I', num_prefix=1).double().eval()
    x = torch.randn(1, 1 + h * w, c, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x, (h, w))
        q, k, v = _qkv(attn, x)
        split = lambda t: t.view(-1, heads, c // heads).transpose(0, 1)[None]  # noqa
        ref = inline_attention_reference(split(q), split(k), split(v))[0].transpose(0, 1)
        ref = ref.reshape(-1, c)
        kernels = attn.mixer.residual(x.mean(1))
        res = local_residual_reference(v[1:].T.reshape(1, c, h, w), kernels)[0]
        ref[1:] += res.reshape(c, -1).T          # the cls token gets no local residual
        ref = attn.proj(ref)
    torch.testing.assert_close(out[0], ref)


def test_block_type_strings_expand_per_block():
    assert parse_block_types('IIMS2', [1, 2, 4, 2], 'x') == [
        ['I'], ['I', 'I'], ['I', 'I', 'S', 'S'], ['S', 'S']]
    assert parse_block_types('ISLS', [1, 1, 2, 1], 'x')[2] == ['L', 'L']


def test_a_letter_selects_a_mixer_class_in_one_table():
    assert MIXERS == {'I': InLineMixer, 'S': SoftmaxMixer, 'L': LinearMixer}
    assert mixer_class('L') is LinearMixer and mixer_class(SoftmaxMixer) is SoftmaxMixer
    assert InLineMixer.linear_in_tokens and LinearMixer.linear_in_tokens
    assert SoftmaxMixer.takes_bias and not InLineMixer.takes_bias and not LinearMixer.takes_bias
    # the layer shows its letter; the mixer is a registered child that owns its
    # parameters (in the module tree: named_modules, copies and mode changes reach it)
    attn = GlobalAttention(8, 2, 'I')
    assert attn.attn_type == 'I' and dict(attn.named_children())['mixer'] is attn.mixer
    assert [n for n, _ in attn.named_parameters() if 'residual' in n] == [
        'mixer.residual.0.weight', 'mixer.residual.0.bias', 'mixer.residual.2.weight',
        'mixer.residual.2.bias']
    assert 'mixer.residual.0' in dict(attn.named_modules())
    for other in (copy.deepcopy(attn), pickle.loads(pickle.dumps(attn))):
        assert dict(other.named_children())['mixer'] is other.mixer
        assert other.mixer.residual is not attn.mixer.residual
    assert not hasattr(GlobalAttention(8, 2, 'S').mixer, 'residual')
    assert GlobalAttention(8, 2, 'I', local_residual=False).mixer.residual is None
    assert GlobalAttention(8, 2, 'L').mixer.kernel == 'relu'           # its own default phi
    assert not attn.eval().mixer.training and attn.train().mixer.training


def test_block_type_letters_are_the_mixers():
    with pytest.raises(ValueError, match=r"\['X'\]; the letters are 'I' \(InLine\), "
                                         r"'S' \(softmax\), 'L' \(linear\) and 'M' \(mixed, "
                                         r"then a count\)"):
        parse_block_types('IXSS', [1, 1, 1, 1], 'x')
    with pytest.raises(ValueError, match=r"attn_type must be 'I' \(InLine\), 'S' \(softmax\) "
                                         r"or 'L' \(linear\)"):
        GlobalAttention(8, 2, 'X')


@pytest.mark.parametrize('kernel', ['identity', 'leakyrelu'])
def test_linear_attention_refuses_a_feature_map_that_can_zero_its_normaliser(kernel):
    with pytest.raises(ValueError, match=rf"kernel='{kernel}' can make zero or negative.*"
                                         r"\['relu', 'exp'\]"):
        GlobalAttention(8, 2, 'L', kernel=kernel)
    assert GlobalAttention(8, 2, 'L', kernel='exp').mixer.kernel == 'exp'


def test_window_attention_has_only_window_options():
    attn = WindowAttention(8, 2, 'S', window_size=3)
    for option in ('separate_q', 'sr_ratio', 'num_prefix'):
        assert not hasattr(attn, option)
    assert [n for n, _ in attn.named_parameters()] == [  # the released checkpoints' names
        'relative_position_bias_table', 'qkv.weight', 'qkv.bias', 'proj.weight', 'proj.bias']


def test_block_passes_its_input_only_to_attention_that_reads_it():
    torch.manual_seed(3)
    c, hw = 8, (3, 5)
    x = torch.randn(2, hw[0] * hw[1], c)
    seen = []

    class Probe(torch.nn.Module):  # no shortcut argument: must not receive one
        def forward(self, normed, hw):
            seen.append(normed.shape)
            return torch.zeros_like(normed)

    TransformerBlock(c, Probe())(x, hw)
    assert seen == [x.shape]
    cswin = CSWinAttention(c, 2, 'I').eval()
    block = TransformerBlock(c, cswin).eval()
    with torch.no_grad():
        out = block(x, hw)
        normed = block.norm1(x)
        expect = x + cswin(normed, hw, shortcut=x)
        expect = expect + block.mlp(block.norm2(expect))
        # the residual kernels read the block input, not the normed tokens
        assert not torch.allclose(cswin(normed, hw, shortcut=x), cswin(normed, hw))
    torch.testing.assert_close(out, expect)

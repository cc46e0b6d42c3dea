"""FLOP counting (mmplugin_inline.analysis.flops; tools/analysis_tools/get_flops.py) against
hand counts.

Convention, as in mmengine / fvcore and the papers' tables: one fused multiply-add
is one FLOP, i.e. every number here is a count of multiply-accumulates (MACs).
mmengine's own conventions for the non-matmul ops are used as they are: LayerNorm
with affine = 5 per element, bilinear upsampling = 4 per output element, convolution
= weight elements x output positions (bias not counted); element-wise ops are 0.

Hand counts of attention, per head with N tokens (M keys) and head width d
(C = heads x d channels):
- InLine: K^T V = N d^2, its mean correction K_mean^T V_mean = d^2, Q M = N d^2;
  local residual = depthwise 3x3 of V = 9 N C; kernel predictor on the mean token =
  Conv1d(C, C, groups=heads) + Conv1d(C, 9C, groups=heads) = 10 C d;
- softmax (SDPA): Q K^T = N M d and P V = N M d, i.e. 2 N^2 d per head when M = N.
"""
import math

import pytest
import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer

import mmplugin_inline  # noqa: F401  (registers the models)
from helpers.tool_configs import mask_rcnn_inline_pvt_t, tiny_sem_fpn
from mmplugin_inline.analysis import count_module
from mmplugin_inline.analysis import flops as flop_count
from mmplugin_inline.cli import get_flops as get_flops_tool
from mmplugin_inline.models.layers import GlobalAttention, WindowAttention
from mmplugin_inline.openmmlab import InLinePVT

PVT_T = InLinePVT.arch_settings['t']


# ---------------------------------------------------------------- hand counts (MACs)
def inline_attention_macs(n, c, heads, separate_q=True):
    """One InLine GlobalAttention module on n tokens: projections, kernel, residual."""
    d = c // heads
    projections = n * c * c + n * c * 2 * c + n * c * c          # q (or qkv), kv, proj
    kernel = n * c * d + n * c * d                 # heads x (N d^2 centred K^T V + N d^2 Q M)
    predictor = c * d + 9 * c * d                                 # two grouped 1x1 Conv1d
    local_residual = 9 * n * c
    return projections + kernel + predictor + local_residual


def softmax_core_macs(n, m, c):
    """SDPA of n queries over m keys, all heads: Q K^T + P V = 2 n m d per head."""
    return 2 * n * m * c


def pvt_sra_attention_macs(n, m, c, sr):
    """PVT's softmax spatial-reduction attention: q, sr conv + LN, kv, SDPA, proj."""
    return (n * c * c + m * c * c * sr * sr + 5 * m * c + m * c * 2 * c
            + softmax_core_macs(n, m, c) + n * c * c)


def pvt_backbone_macs(arch, block_types, hw, pretrain_img_size=224, out_norm=True):
    """The whole InLine-PVT backbone on an H x W input (H, W multiples of 32)."""
    h_in, w_in = hw
    total, c_prev = 0, 3
    for i, (c, heads, ratio, depth) in enumerate(zip(
            arch['embed_dims'], arch['num_heads'], arch['mlp_ratios'], arch['depths'])):
        stride, patch = 4 * 2 ** i, 4 if i == 0 else 2
        h, w = math.ceil(h_in / stride), math.ceil(w_in / stride)
        n = h * w
        total += n * c * c_prev * patch * patch + 5 * n * c         # patch conv + LN
        grid = pretrain_img_size // stride
        if (h, w) != (grid, grid):
            total += 4 * n * c                                      # pos-embed resize
        for _ in range(depth):
            total += 2 * 5 * n * c + 2 * n * c * int(c * ratio)    # 2 LNs + MLP
            if block_types[i] == 'I':
                total += inline_attention_macs(n, c, heads)
            else:
                sr = arch['sr_ratios'][i]
                m = (h // sr) * (w // sr)
                total += (pvt_sra_attention_macs(n, m, c, sr) if sr > 1 else
                          4 * n * c * c + softmax_core_macs(n, n, c))
        if out_norm:
            total += 5 * n * c                                      # the output's LN
        c_prev = c
    return total


class _OnMap(nn.Module):
    """Calls an attention module on [B, H*W, C] tokens of an H x W map."""

    def __init__(self, attn, hw):
        super().__init__()
        self.attn, self.hw = attn, hw

    def forward(self, x):
        return self.attn(x, self.hw)


# ---------------------------------------------------------------- single modules
def test_inline_kernel_can_be_traced():
    """FlopAnalyzer counts what torch.jit's tracer records: the kernel must trace."""
    from mmplugin_inline.core import inline_attention
    q, k, v = (torch.randn(1, 2, 15, 8) for _ in range(3))
    graph, _ = torch.jit._get_trace_graph(lambda a, b, c: inline_attention(a, b, c), (q, k, v))
    assert any(node.kind() != 'prim::Constant' for node in graph.nodes())


@pytest.mark.parametrize('batch', [1, 2])
def test_inline_attention_block_matches_hand_count(batch):
    hw, c, heads = (11, 13), 40, 4
    attn = GlobalAttention(c, heads, attn_type='I', separate_q=True).eval()
    counted = count_module(_OnMap(attn, hw), torch.randn(batch, hw[0] * hw[1], c))
    assert counted['unknown_ops'] == {}
    # the per-sample residual conv runs as one conv with groups = B * C: still B x 9 N C
    assert counted['flops'] == batch * inline_attention_macs(hw[0] * hw[1], c, heads)


@pytest.mark.parametrize('local_residual', [True, False])
def test_linear_attention_block_matches_hand_count(local_residual):
    """'L': InLine's count (K^T V and Q M, N d^2 each per head) plus the normaliser's
    product phi(Q) sum phi(K), N d per head; without the residual, neither the predictor
    nor the 3x3 convolution."""
    hw, c, heads = (11, 13), 40, 4
    n, d = hw[0] * hw[1], c // heads
    attn = GlobalAttention(c, heads, attn_type='L', separate_q=True,
                           local_residual=local_residual).eval()
    counted = count_module(_OnMap(attn, hw), torch.randn(1, n, c))
    assert counted['unknown_ops'] == {}
    residual = c * d + 9 * c * d + 9 * n * c
    expected = inline_attention_macs(n, c, heads) + n * c
    assert counted['flops'] == (expected if local_residual else expected - residual)


def test_softmax_block_counts_two_n_squared_d_per_head_where_mmengine_alone_counts_none():
    hw, c, heads = (9, 14), 48, 3
    n, d = hw[0] * hw[1], c // heads
    module = _OnMap(GlobalAttention(c, heads, attn_type='S').eval(), hw)
    x = torch.randn(1, n, c)
    counted = count_module(module, x)
    assert counted['unknown_ops'] == {}
    assert counted['analyzer'].by_operator()['scaled_dot_product_attention'] == \
        heads * 2 * n * n * d
    assert counted['flops'] == 4 * n * c * c + heads * 2 * n * n * d
    plain = FlopAnalyzer(module, (x, ))
    plain.unsupported_ops_warnings(False)
    assert plain.total() == counted['flops'] - heads * 2 * n * n * d   # what the handler adds


def test_shifted_window_softmax_with_mask_and_padding():
    hw, c, heads, ws = (10, 17), 32, 2, 5          # padded to 10 x 20: 2 x 4 windows
    attn = WindowAttention(c, heads, attn_type='S', window_size=ws, shift=True).eval()
    counted = count_module(_OnMap(attn, hw), torch.randn(1, hw[0] * hw[1], c))
    windows, n_win = 2 * 4, ws * ws
    assert counted['unknown_ops'] == {}
    assert counted['flops'] == (windows * n_win * c * 3 * c             # qkv on padded windows
                                + windows * softmax_core_macs(n_win, n_win, c)
                                + hw[0] * hw[1] * c * c)                # proj on cropped map


def test_baddbmm_and_autograd_function_handlers():
    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return torch.baddbmm(v.mean(1, keepdim=True), q, k.transpose(1, 2) @ v)

        @staticmethod
        def backward(ctx, grad):
            return grad, grad, grad

    class Opaque(torch.autograd.Function):   # body the tracer cannot see
        @staticmethod
        def forward(ctx, x):
            return torch.from_numpy(x.numpy() * 2)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Both(nn.Module):
        def forward(self, q, k, v):
            composite = torch.baddbmm(v.mean(1, keepdim=True), q, k.transpose(1, 2) @ v)
            return composite + Kernel.apply(q, k, v) + Opaque.apply(q)

    g, n, d = 3, 20, 8
    q, k, v = (torch.randn(g, n, d) for _ in range(3))
    counted = count_module(Both(), (q, k, v))
    assert counted['flops'] == 2 * (g * d * n * d + g * n * d * d)
    assert counted['unknown_ops'] == {'prim::PythonOp.Opaque': 1}


# ---------------------------------------------------------------- backbones and the tool
def test_inline_pvt_t_backbone_at_1333x800_matches_hand_count(tmp_path):
    result = flop_count.get_flops(mask_rcnn_inline_pvt_t(tmp_path), (800, 1333),
                                 backbone_only=True)
    # mmdet's data preprocessor pads to a multiple of 32: the backbone sees 800 x 1344
    assert result['input_shape'] == (3, 800, 1344)
    assert result['unknown_ops'] == {}
    (name, params, flops), = result['rows']
    analyzer = result['analyzer']
    for i, (c, heads) in enumerate(zip(PVT_T['embed_dims'], PVT_T['num_heads'])):
        n = (800 // (4 * 2 ** i)) * (1344 // (4 * 2 ** i))
        for j in range(PVT_T['depths'][i]):
            assert analyzer.total(f'stages.{i}.blocks.{j}.attn') == \
                inline_attention_macs(n, c, heads)
    assert flops == pvt_backbone_macs(PVT_T, 'IIII', (800, 1344))
    assert name == 'backbone' and 11.0e6 < params < 12.0e6
    report = flop_count.format_report(result)
    assert '800 x 1333' in report and '3 x 800 x 1344' in report
    assert f'{flops / 1e9:.2f}' in report and 'multiply-accumulates' in report


def test_pvt_softmax_sra_blocks_match_hand_count():
    arch = dict(embed_dims=[16, 32], num_heads=[1, 2], mlp_ratios=[2, 2], depths=[1, 2],
                sr_ratios=[2, 1])
    backbone = InLinePVT(arch=arch, block_types='SS', pretrain_img_size=64,
                         out_indices=(0, 1)).eval()
    counted = count_module(backbone, torch.randn(1, 3, 64, 96))
    assert counted['unknown_ops'] == {}
    assert counted['flops'] == pvt_backbone_macs(arch, 'SS', (64, 96), pretrain_img_size=64)


def test_whole_mask_rcnn_rows_and_backbone_figure(tmp_path, capsys):
    config = mask_rcnn_inline_pvt_t(tmp_path)
    result = flop_count.get_flops(config, (800, 1333))
    rows = {name: (params, flops) for name, params, flops in result['rows']}
    assert list(rows) == ['model', 'backbone', 'neck', 'rpn_head', 'roi_head']
    assert rows['backbone'][1] == pvt_backbone_macs(PVT_T, 'IIII', (800, 1344))
    assert rows['model'][1] == sum(f for name, (_, f) in rows.items() if name != 'model')
    assert rows['model'][0] == sum(p for name, (p, _) in rows.items() if name != 'model')
    assert result['unknown_ops'] == {}   # NMS / RoIAlign are uncounted by convention
    assert set(result['uncounted_ops']) >= {'prim::PythonOp.RoIAlignFunction'}
    get_flops_tool.main([config, '--shape', '64', '96', '--backbone-only', '--breakdown', '1'])
    out = capsys.readouterr().out
    assert '| backbone' in out and 'stages' in out and '3 x 64 x 96' in out


def test_segmentor_rows_and_no_unknown_ops(tmp_path):
    result = flop_count.get_flops(tiny_sem_fpn(tmp_path), (97, 131))
    assert [row[0] for row in result['rows']] == ['model', 'backbone', 'neck', 'decode_head']
    assert result['input_shape'] == (3, 97, 131)     # mmseg does not pad at test time
    assert result['unknown_ops'] == {}
    assert all(flops > 0 for _, _, flops in result['rows'])

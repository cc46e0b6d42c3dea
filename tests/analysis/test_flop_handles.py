"""The FLOP handler table of ``analysis.complexity``: the same counts as mmengine's own
table for the ops mmengine counts, autograd Functions counted from inside, mmcv's NMS /
RoIAlign kept out."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.analysis import FlopAnalyzer

from mmplugin_inline.analysis import FLOP_HANDLES, InLineFlopAnalyzer, count_module


class EveryDefaultOp(nn.Module):
    """One call of each op mmengine's FlopAnalyzer counts by default."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn, self.gn = nn.BatchNorm2d(4), nn.GroupNorm(2, 4)
        self.inorm, self.ln = nn.InstanceNorm2d(4, affine=True), nn.LayerNorm(7)
        self.fc = nn.Linear(7, 5)

    def forward(self, x):                                   # [2, 3, 6, 7]
        y = self.inorm(self.gn(self.bn(self.conv(x))))
        y = F.interpolate(y, scale_factor=2, mode='nearest')
        y = F.interpolate(y, size=(5, 7), mode='bilinear', align_corners=False)
        y = F.adaptive_avg_pool2d(y, (3, 7))
        grid = torch.zeros(2, 3, 7, 2)
        y = F.grid_sample(y, grid, align_corners=False)    # [2, 4, 3, 7]
        t = self.fc(self.ln(y.flatten(1, 2)))              # [2, 12, 5]
        m = t[0]                                            # [12, 5]
        out = torch.addmm(torch.zeros(12, 12), m, m.t()) + torch.mm(m, m.t())
        out = out + torch.matmul(m, m.t()) + torch.einsum('ij,kj->ik', m, m)
        return out.sum() + torch.bmm(t, t.transpose(1, 2)).sum()


def test_table_counts_mmengine_default_ops_as_mmengine_does():
    model, x = EveryDefaultOp().eval(), torch.randn(2, 3, 6, 7)
    with torch.no_grad():
        ours = InLineFlopAnalyzer(model, (x,)).unsupported_ops_warnings(False)
        theirs = FlopAnalyzer(model, (x,)).unsupported_ops_warnings(False)
        ours_by_op, theirs_by_op = dict(ours.by_operator()), dict(theirs.by_operator())
    assert len(theirs_by_op) == 15      # each of its 15 default handlers fired
    assert ours_by_op == theirs_by_op
    assert ours.flop_handles.keys() >= FLOP_HANDLES.keys()


def test_function_named_as_mmcv_nms_is_reported_not_counted():
    class NMSop(torch.autograd.Function):    # the name mmcv's NMS traces under
        @staticmethod
        def forward(ctx, x):
            return x @ x.transpose(-1, -2)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Counted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x @ x.transpose(-1, -2)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Model(nn.Module):
        def forward(self, x):
            return NMSop.apply(x).sum() + Counted.apply(x).sum()

    x = torch.randn(3, 5, 4)
    counted = count_module(Model(), x)
    assert counted['flops'] == 3 * 5 * 4 * 5            # Counted only
    assert counted['uncounted_ops']['prim::PythonOp.NMSop'] == 1
    assert counted['unknown_ops'] == {}


def test_op_without_handler_inside_a_function_is_reported_by_name():
    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.bmm(x, x.transpose(1, 2)) + torch.cdist(x, x)    # cdist: no handler

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Model(nn.Module):
        def forward(self, x):
            return Kernel.apply(x)

    x = torch.randn(2, 6, 3)
    counted = count_module(Model(), x)
    assert counted['flops'] == 2 * 6 * 3 * 6
    assert counted['unknown_ops'] == {'prim::PythonOp.Kernel/aten::cdist': 1}

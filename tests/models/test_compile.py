"""The backbones under torch.compile: one graph, no break in our modules, eager's results."""
import pytest
import torch

from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.registry import MODELS

# odd input sizes: padded patch embeddings, reduction cells, windows and stripes; Swin's
# InLine blocks in windows of 4, so its later stages run the masked kernel on padded windows
EXTRA = {'InLineSwinTransformer': dict(inline_window=4)}
INPUT = {'InLineDeiT': (2, 3, 64, 64)}


def _tiny(name, **kwargs):
    arch, extra, _ = TINY_BACKBONES[name]
    torch.manual_seed(0)
    return MODELS.build(dict(type=name, arch=arch, init_cfg=None, **extra,
                             **EXTRA.get(name, {}), **kwargs))


def _input(name):
    return torch.randn(*INPUT.get(name, (2, 3, 45, 61)), generator=torch.Generator().manual_seed(1))


# torch 2.8's dynamo breaks the training-mode graph at each stage ("step_unsupported" where
# a stage hands its tokens to the blocks; the stage loop before a stage became one call
# broke on 2.8 too); from 2.9 on it is one graph. The compiled results equal
# eager's on every supported torch (test_compiled_backbone_equals_eager_forward_and_backward)
ONE_GRAPH_FROM = (2, 9)


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split('.')[:2]) < ONE_GRAPH_FROM,
                    reason="torch 2.8's dynamo breaks the training graph at every stage")
@pytest.mark.parametrize('name', sorted(TINY_BACKBONES))
def test_backbone_traces_as_one_graph(name):
    # training mode with gradients: the kernel's autograd.Function, drop path and the
    # training branches are traced as well
    model, x = _tiny(name).train(), _input(name)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    reasons = [(b.reason, [f'{f.filename}:{f.lineno}' for f in b.user_stack[-2:]])
               for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons


@pytest.mark.slow  # 115 s here (loaded machine): inductor compiles forward and backward
def test_compiled_backbone_equals_eager_forward_and_backward():
    # no stochastic depth: the compiled graph draws its own random numbers
    name = 'InLineSwinTransformer'
    model, x = _tiny(name, drop_path_rate=0.0).train(), _input(name)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)

    def run(fn):
        model.zero_grad()
        outs = fn(x)
        sum((o * torch.linspace(-1, 1, o.shape[1])[:, None, None]).mean() for o in outs).backward()
        return [o.detach() for o in outs], {n: p.grad.clone() for n, p in model.named_parameters()}

    outs, grads = run(compiled)
    eager_outs, eager_grads = run(model)
    for out, ref in zip(outs, eager_outs):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for key in grads:
        torch.testing.assert_close(grads[key], eager_grads[key], rtol=1e-5, atol=1e-5, msg=key)


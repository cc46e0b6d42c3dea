"""The linear layers' CPU library (``core.matmul_backend``): the oneDNN form against
``F.linear`` forward and backward, when each form is taken, and that recomputation
(``with_cp='mlp'``) and graph capture see what they expect."""
import pytest
import torch
import torch.nn.functional as F

import mmplugin_inline  # noqa: F401  (registers the backbones)
from helpers.tiny_models import TINY_BACKBONES
from mmplugin_inline.core import matmul_backend, reference_paths
from mmplugin_inline.core.matmul_backend import (
    BACKEND_ENV,
    cpu_linear_backend,
    linear,
    linear_as_conv,
    onednn_linear_wanted,
    set_cpu_linear_backend,
)
from mmplugin_inline.models.layers import Linear
from mmplugin_inline.registry import MODELS

TOL64 = dict(rtol=1e-10, atol=1e-10)
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason='this torch has no oneDNN')


@pytest.fixture(autouse=True)
def restore_backend():
    """Every test leaves the library as it found it."""
    before = cpu_linear_backend()
    yield
    set_cpu_linear_backend(before)


@pytest.fixture
def onednn():
    set_cpu_linear_backend('onednn')


@pytest.fixture
def blas():
    set_cpu_linear_backend('blas')


def _inputs(shape, cin, cout, bias, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape[:-1], shape[-1] + 3, generator=g, dtype=dtype)[..., 1:cin + 1]
    w = torch.randn(cout, cin, generator=g, dtype=dtype)
    b = torch.randn(cout, generator=g, dtype=dtype) if bias else None
    return [t.requires_grad_() for t in (x, w, b) if t is not None], (x, w, b)


def _value_and_grads(fn, leaves):
    for t in leaves:
        t.grad = None
    out = fn()
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * weight).sum().backward()
    return out.detach(), [t.grad.clone() for t in leaves]


@pytest.mark.parametrize('shape,cout,bias', [
    ((5, 7), 3, True),            # [N, Cin]
    ((2, 13, 6), 11, True),       # [B, N, Cin]
    ((3, 4, 5, 9), 2, False),     # [B, H, W, Cin] without bias
    ((1, 1, 4), 1, True),         # one token, one output
])
def test_conv_form_equals_linear_forward_and_backward_in_fp64(shape, cout, bias):
    # x is a strided view (a slice of a wider tensor), as a qkv chunk would be
    leaves, (x, w, b) = _inputs(shape, shape[-1], cout, bias, torch.float64, seed=len(shape))
    assert not x.is_contiguous() or x.shape[:-1].numel() == 1
    ref = _value_and_grads(lambda: F.linear(x, w, b), leaves)
    got = _value_and_grads(lambda: linear_as_conv(x, w, b), leaves)
    assert got[0].shape == ref[0].shape
    torch.testing.assert_close(got[0], ref[0], **TOL64)
    for g_ref, g_got in zip(ref[1], got[1]):
        torch.testing.assert_close(g_got, g_ref, **TOL64)


@needs_onednn
def test_fp32_on_the_onednn_route_agrees_with_blas(onednn):
    leaves, (x, w, b) = _inputs((2, 50, 64), 64, 96, True, torch.float32, seed=3)
    assert onednn_linear_wanted(x)
    ref = _value_and_grads(lambda: F.linear(x, w, b), leaves)
    got = _value_and_grads(lambda: linear(x, w, b), leaves)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    for g_ref, g_got in zip(ref[1], got[1]):
        torch.testing.assert_close(g_got, g_ref, rtol=1e-4, atol=1e-4)


def test_the_backend_is_set_once_and_refuses_other_names(monkeypatch):
    assert set_cpu_linear_backend('blas') == 'blas' == cpu_linear_backend()
    assert not onednn_linear_wanted(torch.randn(3, 8))
    assert set_cpu_linear_backend(' oneDNN ') == cpu_linear_backend() == \
        ('onednn' if torch.backends.mkldnn.is_available() else 'blas')
    assert set_cpu_linear_backend('auto') in ('onednn', 'blas')
    with pytest.raises(ValueError, match="CPU linear library 'mkl': expected one of auto, "
                                         "onednn, blas"):
        set_cpu_linear_backend('mkl')
    # the variable is read at import only: set now, it changes nothing
    set_cpu_linear_backend('blas')
    monkeypatch.setenv(BACKEND_ENV, 'onednn')
    assert cpu_linear_backend() == 'blas' and not onednn_linear_wanted(torch.randn(3, 8))


def test_the_variable_decides_at_import_and_is_checked_there():
    """In a fresh interpreter: the variable chooses the library when the module is
    imported; an unknown value stops the import with a message naming the variable."""
    import os
    import subprocess
    import sys
    code = 'from mmplugin_inline.core import cpu_linear_backend; print(cpu_linear_backend())'
    for value, want in (('blas', 'blas'), ('onednn', 'onednn' if torch.backends.mkldnn
                                                     .is_available() else 'blas')):
        out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                             env=dict(os.environ, **{BACKEND_ENV: value}), timeout=120)
        assert out.returncode == 0 and out.stdout.split()[-1] == want, out.stderr[-2000:]
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         env=dict(os.environ, **{BACKEND_ENV: 'mkl'}), timeout=120)
    assert out.returncode != 0
    assert f"{BACKEND_ENV}='mkl': expected one of auto, onednn, blas" in out.stderr


def test_auto_takes_onednn_on_amd_only(monkeypatch):
    for vendor, want in (('AuthenticAMD', 'onednn'), ('GenuineIntel', 'blas'), ('', 'blas')):
        matmul_backend._auto_backend.cache_clear()
        monkeypatch.setattr(matmul_backend, '_cpu_vendor', lambda v=vendor: v)
        monkeypatch.setattr(matmul_backend.platform, 'machine', lambda: 'x86_64')
        expected = want if torch.backends.mkldnn.is_available() else 'blas'
        assert set_cpu_linear_backend('auto') == expected, vendor
    matmul_backend._auto_backend.cache_clear()


@needs_onednn
def test_the_conv_form_is_taken_only_where_it_is_meant_to_be(onednn):
    x = torch.randn(3, 8)
    assert onednn_linear_wanted(x)
    assert not onednn_linear_wanted(x.double())            # fp64: F.linear
    assert not onednn_linear_wanted(x.half())
    with reference_paths():                                  # the reference path
        assert not onednn_linear_wanted(x)
    with torch.autocast('cpu', dtype=torch.bfloat16):        # autocast decides the dtype
        assert not onednn_linear_wanted(x)


def test_blas_keeps_f_linear(blas, monkeypatch):
    calls = []
    monkeypatch.setattr(matmul_backend, 'linear_as_conv', lambda *a: calls.append(a))
    layer = Linear(8, 4)
    torch.testing.assert_close(layer(torch.ones(2, 8)), F.linear(torch.ones(2, 8), layer.weight,
                                                                 layer.bias))
    assert not calls


@needs_onednn
def test_traced_graphs_keep_the_linear_op(onednn):
    layer = Linear(8, 4)
    graph = torch.jit.trace(layer, torch.randn(2, 5, 8)).inlined_graph
    kinds = {node.kind() for node in graph.nodes()}
    assert 'aten::linear' in kinds and not any('conv' in k for k in kinds), kinds


@needs_onednn
@pytest.mark.parametrize('name', ['InLinePVT', 'InLineSwinTransformer'])
def test_a_tiny_backbone_is_the_same_on_both_libraries(name):
    arch, extra, _ = TINY_BACKBONES[name]
    torch.manual_seed(0)
    model = MODELS.build(dict(type=name, arch=dict(arch), drop_path_rate=0.0, **extra))
    x = torch.randn(2, 3, 45, 61)
    outs = {}
    for backend in ('blas', 'onednn'):
        set_cpu_linear_backend(backend)
        model.zero_grad()
        y = model(x)
        sum(o.square().mean() for o in y).backward()
        outs[backend] = [o.detach() for o in y], [p.grad.clone() for p in model.parameters()]
    for a, b in zip(outs['blas'][0], outs['onednn'][0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(outs['blas'][1], outs['onednn'][1]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@needs_onednn
def test_mlp_recomputation_redoes_the_same_products_on_either_library():
    # with_cp='mlp' saves the narrowing product's output (fc2) and recomputes fc1 in the
    # backward: the policy must know the convolution form of fc2 as well as addmm, or
    # the backward would run fc2 again on oneDNN
    from torch.utils.flop_counter import FlopCounterMode
    arch, extra, _ = TINY_BACKBONES['InLinePVT']
    torch.manual_seed(0)
    model = MODELS.build(dict(type='InLinePVT', arch=dict(arch), with_cp='mlp', **extra)).train()
    x = torch.randn(1, 3, 64, 64)

    def backward_flops(with_cp):
        model.with_cp = with_cp
        loss = sum(o.square().mean() for o in model(x))
        with FlopCounterMode(display=False) as counter:
            loss.backward()
        return counter.get_total_flops()
    flops = {}
    for backend in ('blas', 'onednn'):
        set_cpu_linear_backend(backend)
        flops[backend] = backward_flops('mlp') - backward_flops(False)
    assert flops['blas'] > 0  # fc1 is recomputed
    assert flops['onednn'] == flops['blas']

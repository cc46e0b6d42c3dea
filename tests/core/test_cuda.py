"""The GPU path, ready for a GPU: tests marked ``cuda`` skip without a CUDA device.

``make gpu-check`` (``scripts/gpu_check.py``) runs them with ``pytest -m cuda`` and
writes one JSON report; its behaviour without a GPU is tested here on the CPU.

- the kernel against the explicit N x N definition (fp64, same rounded inputs) on the
  GPU: fp32 to the tolerance tests/core/test_core.py uses, fp16 / bf16 within 3x the
  rounding floor (the bound of tests/core/test_core.py's low-precision tests), forward and
  backward;
- every backbone's training step under AMP (fp16 with ``torch.amp.GradScaler``, bf16):
  finite, loss and gradients within ``sqrt(2 L) u`` of fp32 (tests/core/test_amp.py's
  whole-backbone bound), a step taken, parameters finite after it;
- every backbone in the pad-aware mode under autocast, forward and backward, and the
  padded image's features equal to those of the image alone;
- three training steps of a Semantic FPN InLine-PVT-T (bf16 AMP, 512 x 512) and of a Mask
  R-CNN InLine-PVT-T (800 x 1024; needs mmcv's CUDA ops, ``gpu_check.py --cuda-ops``);
  each also runs on the CPU, which checks the tests themselves;
- the backbone benchmark tool on ``--device cuda`` for one case (skipped while the
  script does not exist).
"""
import json
import math
import os.path as osp
import shlex
import sys
import textwrap

import pytest
import torch
from test_amp import UNIT_ROUNDOFF, fp32_without_tf32, rounding_count, tiny_backbone

from helpers.runs import PYTHON, ok, run_tool
from helpers.tiny_models import REPO
from mmplugin_inline.core import FEATURE_MAPS, inline_attention, inline_attention_reference
from mmplugin_inline.registry import registered_families
from scripts import gpu_check

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason='needs a CUDA device')
FAMILIES = sorted(registered_families())


# -- the kernel on the GPU ----------------------------------------------------------------

@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16],
                         ids=['fp32', 'fp16', 'bf16'])
@pytest.mark.parametrize('kernel', sorted(FEATURE_MAPS))
@pytest.mark.parametrize('n,d', [(37, 13), (2048, 32)])
def test_kernel_matches_definition_on_cuda(dtype, kernel, n, d):
    g = torch.Generator().manual_seed(n + d)
    q, k, v = (torch.randn(2, 3, n, d, generator=g).to('cuda', dtype).requires_grad_()
               for _ in range(3))
    grad_out = torch.randn(2, 3, n, d, generator=g).to('cuda', dtype)
    with fp32_without_tf32():
        out = inline_attention(q, k, v, kernel=kernel)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = inline_attention_reference(q64, k64, v64, kernel=kernel)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    assert out.dtype == dtype and all(gr.dtype == dtype for gr in grads)
    for name, low, exact in zip(('out', 'dq', 'dk', 'dv'), (out,) + grads, (ref,) + ref_grads):
        assert torch.isfinite(low).all(), name
        if dtype == torch.float32:
            torch.testing.assert_close(low.double(), exact, rtol=2e-5, atol=2e-5)
            continue
        floor = (exact.to(dtype).double() - exact).abs().max()
        ratio = ((low.double() - exact).abs().max() / floor).item()
        assert ratio <= 3.0, f'{name}: error is {ratio:.2f}x the rounding floor'


# -- a training step of every backbone under AMP ------------------------------------------

def _loss(outs, targets):
    return sum((o.float() * t).mean() for o, t in zip(outs, targets))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('family', FAMILIES)
def test_backbone_training_step_under_amp(family, dtype):
    ref_model, model = tiny_backbone(family).cuda(), tiny_backbone(family).cuda()  # same seed
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 72, 104, generator=g).cuda()
    with torch.no_grad():
        targets = [torch.randn(o.shape, generator=g).cuda() for o in ref_model(x)]
    with fp32_without_tf32():
        ref_outs = ref_model(x)
        ref_loss = _loss(ref_outs, targets)
    # the loss (a sum of products of both signs) is compared on the scale of its terms
    loss_scale = sum((o * t).abs().mean() for o, t in zip(ref_outs, targets)).item()
    ref_loss.backward()
    ref_grads = torch.cat([p.grad.flatten() for p in ref_model.parameters()])

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler('cuda', enabled=dtype == torch.float16)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(8):  # a dynamic scale starts high: an overflowing step is skipped, halved
        optimizer.zero_grad()
        with torch.autocast('cuda', dtype=dtype):
            outs = model(x)
            loss = _loss(outs, targets)
        assert all(o.dtype == torch.float32 for o in outs)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.step(optimizer)
        scaler.update()
        if torch.isfinite(grads).all():
            break
        assert scaler.is_enabled() and scaler.get_scale() < scale, 'non-finite bf16 gradients'
    else:
        pytest.fail('no finite fp16 step in 8 tries of the GradScaler')
    u, count = UNIT_ROUNDOFF[dtype], rounding_count(model)
    bound = math.sqrt(2 * count) * u
    assert torch.isfinite(loss) and abs(loss.item() - ref_loss.item()) <= bound * loss_scale
    err = ((grads - ref_grads).norm() / ref_grads.norm()).item()
    assert err <= bound, f'gradients: error {err / u:.2f} u > {bound / u:.1f} u'
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before)), 'no step'


# -- pad-aware mode under autocast; whole models' training steps -----------------------------

_CUDA = [pytest.mark.cuda, needs_cuda]
#: (device, autocast dtype): both on CUDA; bf16 on the CPU, which checks the tests themselves
DEVICE_CASES = [pytest.param('cuda', torch.float16, id='cuda-fp16', marks=_CUDA),
                pytest.param('cuda', torch.bfloat16, id='cuda-bf16', marks=_CUDA),
                pytest.param('cpu', torch.bfloat16, id='cpu-bf16')]


@pytest.mark.parametrize('device,dtype', DEVICE_CASES)
@pytest.mark.parametrize('family', FAMILIES)
def test_pad_aware_backbone_forward_and_backward_under_autocast(family, device, dtype):
    """pad_aware=True on a padded batch under autocast: finite fp32 outputs and gradients;
    and (fp32, no TF32) the padded image's features are those of the image alone."""
    model = tiny_backbone(family, pad_aware=True).to(device)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 72, 104, generator=g)
    x[1, :, 56:], x[1, :, :, 80:] = 0, 0  # image 1 is 56 x 80, padded to 72 x 104
    x = x.to(device).requires_grad_()
    real_hw = [(72, 104), (56, 80)]
    with torch.autocast(device, dtype=dtype):
        outs = model(x, real_hw=real_hw)
        loss = sum(o.float().square().mean() for o in outs)
    loss.backward()
    assert all(o.dtype == torch.float32 and torch.isfinite(o).all() for o in outs)
    assert torch.isfinite(x.grad).all() and x.grad[1, :, 56:].abs().sum() == 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with fp32_without_tf32(), torch.no_grad():
        batch = model(x.detach(), real_hw=real_hw)
        alone = model(x.detach()[1:2, :, :56, :80])
    for b, a in zip(batch, alone):
        h, w = a.shape[-2:]
        err = (b[1:2, :, :h, :w] - a).abs().max() / a.abs().max()
        assert err < 1e-4, f'{family}: the padded image differs from itself alone by {err:.2e}'


def _mmcv_cuda_ops() -> bool:
    try:
        from mmcv.ops import get_compiling_cuda_version
        return get_compiling_cuda_version() not in ('', 'not available')
    except Exception:  # noqa: BLE001 - no ops at all: the environment check says why
        return False


def _train_steps(config, device, dtype, hw, steps=3):
    """``steps`` training steps of the config's whole model (no pretrained weights) through
    mmengine's ``train_step`` (AMP with ``dtype`` on CUDA), batch 2 of size ``hw``; returns
    the last step's log variables and whether the backbone's parameters moved."""
    from mmengine.config import Config
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    from mmengine.registry import DefaultScope

    from helpers.samples import build_codebase_model, det_sample, seg_sample
    cfg = Config.fromfile(osp.join(REPO, config))
    scope = cfg.default_scope
    if scope == 'mmdet':
        num_classes = cfg.model.roi_head.mask_head.num_classes
    else:
        num_classes = cfg.model.decode_head.num_classes
    cfg.model.backbone.init_cfg = None
    torch.manual_seed(0)
    model = build_codebase_model(cfg.model, scope).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    wrapper = (AmpOptimWrapper(optimizer=optimizer, dtype=dtype) if device == 'cuda'
               else OptimWrapper(optimizer))
    make = det_sample if scope == 'mmdet' else seg_sample
    before = [p.detach().clone() for p in model.backbone.parameters()]
    model.train()
    for step in range(steps):
        data = dict(inputs=[torch.randint(0, 256, (3, *hw), dtype=torch.uint8)
                            for _ in range(2)],
                    data_samples=[make(hw, num_classes, 2 * step + i) for i in range(2)])
        with DefaultScope.overwrite_default_scope(scope):
            log_vars = model.train_step(data, wrapper)
    moved = any(not torch.equal(p, b) for p, b in zip(model.backbone.parameters(), before))
    return log_vars, moved


@pytest.mark.parametrize('device,dtype,hw', [
    pytest.param('cuda', torch.bfloat16, (512, 512), id='cuda-bf16-512', marks=_CUDA),
    pytest.param('cpu', None, (96, 128), id='cpu-96x128')])
def test_semantic_fpn_training_step(device, dtype, hw):
    log_vars, moved = _train_steps('configs/inline_pvt/fpn_inline-pvt-t_8xb4-40k_ade20k-'
                                   '512x512.py', device, dtype, hw)
    assert 'loss' in log_vars and all(math.isfinite(float(v)) for v in log_vars.values())
    assert moved, 'the backbone did not change in three steps'


@pytest.mark.slow
@pytest.mark.parametrize('device,dtype,hw', [
    pytest.param('cuda', torch.bfloat16, (800, 1024), id='cuda-bf16-800x1024', marks=_CUDA),
    pytest.param('cpu', None, (96, 128), id='cpu-96x128')])
def test_mask_rcnn_training_step(device, dtype, hw):
    """Needs mmcv's ops for the device: on CUDA those of ``gpu_check.py --cuda-ops``."""
    if device == 'cuda' and not _mmcv_cuda_ops():
        pytest.skip("mmcv's ops are built without CUDA (gpu_check.py --cuda-ops builds them)")
    log_vars, moved = _train_steps('configs/inline_pvt/mask-rcnn_inline-pvt-t_fpn_1x_coco.py',
                                   device, dtype, hw)
    assert {'loss', 'loss_mask', 'loss_bbox'} <= log_vars.keys()
    assert all(math.isfinite(float(v)) for v in log_vars.values())
    assert moved, 'the backbone did not change in three steps'


# -- the backbone benchmark on the GPU ------------------------------------------------------

@pytest.mark.cuda
@needs_cuda
def test_backbone_benchmark_on_cuda(tmp_path):
    script = osp.join(REPO, gpu_check.BENCHMARK)
    if not osp.exists(script):
        pytest.skip(f'{gpu_check.BENCHMARK} does not exist yet')
    # one light case: gpu_check.py runs the whole benchmark (BENCHMARK_ARGS) itself
    light = '--device cuda --families pvt --sizes 512x512 --modes infer train --repeats 1 ' \
            '--no-plots --no-flops'
    rc, out, _ = run_tool([PYTHON, script] + shlex.split(light) + ['--out-dir', str(tmp_path)],
                          timeout=600)
    ok(rc, out)
    assert list(tmp_path.rglob('*.json')), f'no JSON result in {tmp_path}:\n{out[-3000:]}'


def test_the_gpu_benchmark_case_uses_options_the_benchmark_accepts():
    """Runs on CPU: the case make gpu-check runs parses with the tool's own parser, and is
    the paper's Fig. 3 on CUDA."""
    from mmplugin_inline.analysis.backbone_benchmark import FIG3_SIZES, FIG3_WINDOWS
    from mmplugin_inline.cli import benchmark_backbones as tool
    assert gpu_check.BENCHMARK == 'tools/analysis_tools/benchmark_backbones.py'
    args = tool.parse_args(shlex.split(gpu_check.BENCHMARK_ARGS))
    assert args.device == 'cuda' and args.paper_fig3 and args.precisions is None
    assert args.fig3_sizes == list(FIG3_SIZES) and {640, 1024} <= set(args.fig3_sizes)
    assert args.fig3_windows == list(FIG3_WINDOWS) == [7, 14, 28, 56]


# -- make gpu-check: its report, tested without a GPU -------------------------------------

@pytest.mark.skipif(HAS_CUDA, reason='this machine has a GPU: the no-GPU path does not run')
def test_gpu_check_without_a_gpu_refuses_before_anything_runs(tmp_path, capsys):
    """No GPU and no --cpu: exit 2 at once, saying there is no GPU; nothing runs."""
    assert gpu_check.main(['--out-dir', str(tmp_path)]) == gpu_check.REFUSED
    err = capsys.readouterr().err
    assert 'no GPU' in err and '--cpu' in err
    with open(tmp_path / 'gpu_check.json') as f:
        report = json.load(f)
    assert report['cuda_available'] is False and report['ok'] is False
    assert report['env_check']['status'] == 'not run'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['gpu_check.json', 'summary.txt']


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason='this machine has a GPU: the no-GPU path does not run')
def test_gpu_check_cpu_mode_says_so_writes_the_json_and_exits_0(tmp_path, capsys):
    # in-process (its environment check, smoke and collection run as subprocesses)
    assert gpu_check.main(['--out-dir', str(tmp_path), '--cpu']) == 0
    assert '--cpu' in capsys.readouterr().out
    with open(tmp_path / 'gpu_check.json') as f:
        report = json.load(f)
    assert report['cuda_available'] is False and report['ok'] is True
    assert report['torch'] == torch.__version__ and report['torch_cuda'] == torch.version.cuda
    assert 'no GPU on purpose' in report['note']
    assert report['env_check']['ok'] is True and 'mmcv' in report['env_check']['report']
    assert report['cpu_smoke']['ok'] is True
    assert report['cuda_collect']['ok'] is True and report['cuda_collect']['collected'] > 10
    assert 'cuda_tests' not in report and 'benchmark' not in report


def test_gpu_check_report_with_a_gpu(tmp_path, monkeypatch):
    """The GPU branch with the device faked: real pytest junit XML of a passing, a failing
    and a skipped test, a benchmark JSON; the report holds each and the run fails."""
    cases = tmp_path / 'cases'
    cases.mkdir()
    (cases / 'test_fake.py').write_text(textwrap.dedent('''
        import pytest
        def test_good(): pass
        def test_bad(): assert 1 == 2, 'wrong'
        def test_later(): pytest.skip('not now')
    '''))
    calls = []

    def fake_run(cmd, log_path, timeout, cwd=None):
        calls.append(cmd)
        if cmd[1:3] == ['-m', 'pytest']:
            assert cmd[3:5] == ['-m', 'cuda']
            junit = [a for a in cmd if a.startswith('--junitxml=')]
            rc, out, _ = run_tool([PYTHON, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                                   str(cases)] + junit, cwd=str(cases))
            return rc, out
        if '--out-dir' in cmd:  # the benchmark
            bench_dir = cmd[cmd.index('--out-dir') + 1]
            with open(osp.join(bench_dir, 'result.json'), 'w') as f:
                json.dump({'InLinePVT-t': {'fwd_ms': 1.5}}, f)
        return 0, 'fine'

    monkeypatch.setattr(gpu_check, 'run', fake_run)
    monkeypatch.setattr(gpu_check, 'device_info', lambda mmcv=True: dict(
        torch=torch.__version__, torch_cuda='12.4', cuda_available=True, device='Fake GPU',
        capability='9.0', cudnn=90100))
    monkeypatch.setattr(gpu_check, 'BENCHMARK', 'scripts/gpu_check.py')  # exists
    assert gpu_check.main(['--out-dir', str(tmp_path / 'out')]) == 1
    with open(tmp_path / 'out' / 'gpu_check.json') as f:
        report = json.load(f)
    assert report['device'] == 'Fake GPU' and report['ok'] is False
    outcomes = {c['test'].rsplit('::', 1)[1]: c['outcome'] for c in report['cuda_tests']['tests']}
    assert outcomes == {'test_good': 'passed', 'test_bad': 'failed', 'test_later': 'skipped'}
    assert report['cuda_tests']['counts'] == {'passed': 1, 'failed': 1, 'skipped': 1}
    bad = [c for c in report['cuda_tests']['tests'] if c['outcome'] == 'failed'][0]
    assert 'wrong' in bad['message']
    assert report['benchmark']['ok'] is True
    assert report['benchmark']['results'] == {'result.json': {'InLinePVT-t': {'fwd_ms': 1.5}}}
    assert calls[0][1:] == ['-m', 'mmplugin_inline.utils.env_check'] and len(calls) == 3
    assert sys.executable == calls[0][0]


def test_a_step_that_times_out_is_reported_so_without_its_partial_files(tmp_path, monkeypatch):
    """The benchmark runs past its limit after writing a partial JSON: the step reads
    'timed out', no result of it is read back, and the run fails."""
    def fake_run(cmd, log_path, timeout, cwd=None):
        if cmd[1:3] == ['-m', 'pytest']:
            junit = [a for a in cmd if a.startswith('--junitxml=')][0].split('=', 1)[1]
            with open(junit, 'w') as f:
                f.write('<testsuites><testsuite><testcase classname="t" name="a"/>'
                        '</testsuite></testsuites>')
            return 0, 'fine'
        if '--out-dir' in cmd:
            with open(osp.join(cmd[cmd.index('--out-dir') + 1], 'results.json'), 'w') as f:
                json.dump({'partial': True}, f)
            return 124, '[timed out after 5 s]'
        return 0, 'fine'

    monkeypatch.setattr(gpu_check, 'run', fake_run)
    monkeypatch.setattr(gpu_check, 'device_info', lambda mmcv=True: dict(
        torch=torch.__version__, torch_cuda='12.4', cuda_available=True, device='Fake GPU',
        capability='9.0', cudnn=90100))
    assert gpu_check.main(['--out-dir', str(tmp_path / 'out'), '--timeout', '5']) == 1
    report = json.loads((tmp_path / 'out' / 'gpu_check.json').read_text())
    assert report['cuda_tests']['status'] == 'ok'
    assert report['benchmark']['status'] == 'timed out' and report['benchmark']['results'] == {}
    assert 'benchmark: timed out' in (tmp_path / 'out' / 'summary.txt').read_text()

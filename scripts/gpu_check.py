"""Check the GPU path and write one JSON file a person can judge it from (``make gpu-check``).

    python scripts/gpu_check.py [--out-dir work_dirs/gpu_check] [--benchmark-args "..."]

Runs, in order: the environment check (``python -m mmplugin_inline.utils.env_check``),
the tests marked ``cuda`` (``pytest -m cuda``: the kernel against its definition on the
GPU in fp32 / fp16 / bf16, every backbone under autocast and its AMP training step, the
backbone benchmark on ``--device cuda``), and the backbone benchmark for one case.
Writes ``OUT_DIR/gpu_check.json``: device name, torch / CUDA / cuDNN versions, the
environment check, each cuda test's outcome, the benchmark's numbers. Exits 1 when a
step failed.

Without a CUDA device it says so, writes the JSON with that fact (and the environment
check) and exits 0: there is nothing to check, which is not an error.
"""
import argparse
import datetime
import glob
import json
import os
import os.path as osp
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
BENCHMARK = 'tools/analysis_tools/benchmark_backbones.py'
#: the one benchmark case: InLine-PVT-T against mmdet's PVT-T at 800 x 1344, inference and
#: a training step, three interleaved repeats (tests/core/test_cuda.py checks these are options
#: the benchmark accepts)
BENCHMARK_ARGS = ('--device cuda --families pvt --sizes 800x1344 --modes infer train '
                  '--repeats 3 --no-plots')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'gpu_check'),
                        help='where gpu_check.json (and the logs) go')
    parser.add_argument('--benchmark-args', default=BENCHMARK_ARGS,
                        help=f'options of {BENCHMARK} (default: %(default)r); '
                             '--out-dir is added')
    parser.add_argument('--pytest-args', default='',
                        help='more options for pytest -m cuda (e.g. "-x")')
    parser.add_argument('--timeout', type=int, default=1800,
                        help='seconds for each step (default: %(default)s)')
    return parser.parse_args(argv)


def device_info() -> dict:
    import torch
    info = dict(torch=torch.__version__, torch_cuda=torch.version.cuda,
                cuda_available=torch.cuda.is_available(), python=sys.version.split()[0])
    if info['cuda_available']:
        props = torch.cuda.get_device_properties(0)
        info.update(device_count=torch.cuda.device_count(), device=torch.cuda.get_device_name(0),
                    capability='.'.join(map(str, torch.cuda.get_device_capability(0))),
                    memory_gib=round(props.total_memory / 2 ** 30, 1),
                    cudnn=torch.backends.cudnn.version(),
                    bf16_supported=torch.cuda.is_bf16_supported())
    try:  # mmcv's compiled ops (RoIAlign, nms): built for CUDA, or CPU only?
        from mmcv.ops import get_compiling_cuda_version
        info['mmcv_ops_cuda'] = get_compiling_cuda_version()
    except Exception as exc:  # noqa: BLE001 - reported, the env check explains
        info['mmcv_ops_cuda'] = f'unavailable ({type(exc).__name__}: {exc})'
    return info


def run(cmd, log_path, timeout):
    """Run ``cmd`` in the repository; its output goes to ``log_path``. -> (rc, tail)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env=env)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = (exc.stdout or b'').decode(errors='replace') if isinstance(exc.stdout, bytes) \
            else (exc.stdout or '')
        out += f'\n[timed out after {timeout} s]'
    with open(log_path, 'w') as f:
        f.write(out)
    return rc, out[-3000:]


def env_check(out_dir, timeout) -> dict:
    rc, tail = run([sys.executable, '-m', 'mmplugin_inline.utils.env_check'],
                   osp.join(out_dir, 'env_check.log'), timeout)
    return dict(ok=rc == 0, returncode=rc, report=tail)


def junit_outcomes(path) -> list:
    """Each test case of a pytest junit XML: name, outcome, seconds, message."""
    cases = []
    for case in ET.parse(path).getroot().iter('testcase'):
        outcome, message = 'passed', ''
        for child in case:
            if child.tag in ('failure', 'error', 'skipped'):
                outcome = {'failure': 'failed', 'error': 'error'}.get(child.tag, 'skipped')
                message = (child.get('message') or '')[:500]
                break
        cases.append(dict(test=f"{case.get('classname')}::{case.get('name')}", outcome=outcome,
                          seconds=round(float(case.get('time') or 0), 3), message=message))
    return cases


def cuda_tests(out_dir, pytest_args, timeout) -> dict:
    xml = osp.join(out_dir, 'cuda_tests.xml')
    cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', '-q', '-rA', '-p', 'no:cacheprovider',
           f'--junitxml={xml}'] + shlex.split(pytest_args)
    rc, tail = run(cmd, osp.join(out_dir, 'cuda_tests.log'), timeout)
    cases = junit_outcomes(xml) if osp.exists(xml) else []
    counts = {}
    for c in cases:
        counts[c['outcome']] = counts.get(c['outcome'], 0) + 1
    # 0: all passed; 5: nothing collected (no cuda test) counts as a failure here too
    return dict(ok=rc == 0 and bool(cases), returncode=rc, counts=counts, tests=cases,
                log_tail=tail if rc else '')


def benchmark(out_dir, benchmark_args, timeout) -> dict:
    if not osp.exists(osp.join(REPO, BENCHMARK)):
        return dict(ok=None, skipped=f'{BENCHMARK} does not exist in this checkout')
    bench_dir = osp.join(out_dir, 'benchmark')
    os.makedirs(bench_dir, exist_ok=True)
    cmd = [sys.executable, BENCHMARK] + shlex.split(benchmark_args) + ['--out-dir', bench_dir]
    rc, tail = run(cmd, osp.join(out_dir, 'benchmark.log'), timeout)
    results = {}
    for path in sorted(glob.glob(osp.join(bench_dir, '**', '*.json'), recursive=True)):
        try:
            with open(path) as f:
                results[osp.relpath(path, bench_dir)] = json.load(f)
        except ValueError as exc:
            results[osp.relpath(path, bench_dir)] = f'unreadable: {exc}'
    return dict(ok=rc == 0, returncode=rc, command=' '.join(cmd[1:]), results=results,
                output_tail=tail)


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = osp.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    report = dict(date=datetime.datetime.now().isoformat(timespec='seconds'), **device_info())
    report['env_check'] = env_check(out_dir, args.timeout)
    if not report['cuda_available']:
        report['note'] = ('no CUDA device: torch sees no GPU, so the GPU checks (cuda tests, '
                          'GPU benchmark) were not run')
        ok = True
        print(f"gpu-check: no CUDA device (torch {report['torch']}, built for CUDA "
              f"{report['torch_cuda']}): nothing to check on the GPU.")
    else:
        print(f"gpu-check: {report['device']} (capability {report['capability']}), torch "
              f"{report['torch']}, CUDA {report['torch_cuda']}, cuDNN {report['cudnn']}")
        report['cuda_tests'] = cuda_tests(out_dir, args.pytest_args, args.timeout)
        print(f"gpu-check: cuda tests {report['cuda_tests']['counts']}")
        report['benchmark'] = benchmark(out_dir, args.benchmark_args, args.timeout)
        print('gpu-check: benchmark ' + ('ok' if report['benchmark']['ok'] else
                                         report['benchmark'].get('skipped', 'FAILED')))
        # a benchmark script this checkout lacks is reported, not counted as a failure
        ok = report['env_check']['ok'] and report['cuda_tests']['ok'] and \
            report['benchmark']['ok'] is not False
    report['ok'] = ok
    path = osp.join(out_dir, 'gpu_check.json')
    with open(path, 'w') as f:
        json.dump(report, f, indent=2)
    print(f'gpu-check: {"OK" if ok else "FAILED"}; wrote {path}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

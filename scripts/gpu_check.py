"""Check the GPU path and write one JSON file a person can judge it from (``make gpu-check``).

    python scripts/gpu_check.py [--out-dir work_dirs/gpu_check] [--cpu]
    python scripts/gpu_check.py --bundle dist/bundle --out-dir DIR [--cuda-ops [--arch 9.0]]

First it looks at the node, before it installs or builds anything, and refuses (exit 2,
nothing changed, every reason with what to do and the node's own packages named) when:

- the output folder is not empty (each run writes into a fresh folder, so no file of an
  earlier run can be read back as this run's);
- the bundle was made for another Python or CPU architecture than the node's;
- a package the node must provide is missing: torch, torchvision, numpy, opencv, scipy,
  matplotlib (the bundle holds none of them: the node's own builds are used);
- torch is older than the supported floor (``mmplugin_inline/utils/stacks.py``,
  ``TORCH_FLOOR``);
- torch sees no CUDA device, unless ``--cpu`` asks for the CPU smoke on purpose;
- the node already has OpenMMLab packages that conflict (two lines, or another line than
  the bundle's: then it names the bundle to make, ``make bundle BUNDLE_STACK=...``);
- mmcv must be compiled and there is no C++ compiler; with ``--cuda-ops``: torch is a
  CPU build, no ``nvcc`` is found, nvcc's CUDA major differs from torch's, or there is
  neither a visible GPU nor ``--arch`` to build for.

With ``--bundle`` (a GPU node without internet, docs/environments.md) it then installs the
offline bundle of ``scripts/make_bundle.py`` over the node's own packages: its wheels into
a temporary folder (``--target`` keeps them in a folder of yours) with no index, skipping
every package the node already has. A node whose OpenMMLab line is the bundle's keeps its
own packages (its mmcv with CUDA ops is what Mask R-CNN training needs): only the plugin
and what is missing are installed. Unless the node's mmcv has its ops, the bundle's mmcv
source is compiled against the node's torch with ``--jobs`` (default: the CPUs this
process may use, or SLURM_CPUS_PER_TASK), with ninja, patched for C++20 only where torch
needs it (2.10 and newer): its CPU ops, with the GPU hidden from the build, or with
``--cuda-ops`` also its CUDA ops for ``--arch`` (default: the visible GPU's). A wheel built
once is kept in ``--mmcv-cache`` (the cache scripts/setup_env.sh fills, same key) and
reused. A failed install or build stops the run there.

Then it runs, in order: the environment check (``python -m mmplugin_inline.utils.env_check``),
the tests marked ``cuda`` (``pytest -m cuda``: the kernels against their fp64 definition on
the GPU in fp32 / fp16 / bf16, forward and backward; every family forward and backward under
autocast, with the pad-aware mode; a training step of a Semantic FPN and, with mmcv's CUDA
ops, of a Mask R-CNN), and the backbone benchmark of the paper's Fig. 3 (``--paper-fig3``:
DeiT-T against InLine-DeiT-T from 224 to 1024, Swin-T against InLine-Swin-T at windows 7
to 56, fp32 and fp16 autocast, images/s, measured ratios beside the paper's). With
``--cpu`` (no GPU, on purpose) it runs the environment check, one backbone forward on the
CPU and the collection of the cuda tests (``pytest -m cuda --collect-only``) instead.
Writes ``OUT_DIR/gpu_check.json`` (node, install, each step with its status: ok, failed,
timed out or not run) and ``OUT_DIR/summary.txt``. Exits 0 when every step passed, 1 when
one failed, 2 when it refused to start. The temporary install is removed at the end.
"""
import argparse
import datetime
import glob
import importlib.util
import json
import os
import os.path as osp
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
BENCHMARK = 'tools/analysis_tools/benchmark_backbones.py'
#: the benchmark: the paper's Fig. 3 (DeiT-T / InLine-DeiT-T over sizes 224-1024, Swin-T /
#: InLine-Swin-T over windows 7-56; fp32 and fp16 autocast; images/s at a stated batch)
#: (tests/core/test_cuda.py checks these are options the benchmark accepts)
BENCHMARK_ARGS = '--paper-fig3 --device cuda --repeats 5 --no-plots'
#: where a built mmcv wheel is kept (scripts/setup_env.sh uses the same folder and keys)
MMCV_CACHE = osp.join(os.environ.get('MMPLUGIN_INLINE_CACHE') or
                      osp.join(osp.expanduser('~'), '.cache', 'mmplugin_inline'))
#: the backbone forward of the CPU mode (--cpu): the tiniest real preset, one image
CPU_SMOKE = ('import torch, mmplugin_inline; from mmplugin_inline.registry import MODELS; '
             "m = MODELS.build(dict(type='InLinePVT', arch='t')).eval(); "
             'outs = m(torch.randn(1, 3, 96, 128)); '
             "print('backbone forward:', [tuple(o.shape) for o in outs], "
             "all(bool(torch.isfinite(o).all()) for o in outs))")
#: what the node must provide (the bundle holds none of them): import name -> the
#: distributions that provide it (any one will do)
NODE_PROVIDES = {
    'torch': ('torch',), 'torchvision': ('torchvision',), 'numpy': ('numpy',),
    'cv2': ('opencv-python', 'opencv-python-headless', 'opencv-contrib-python',
            'opencv-contrib-python-headless'),
    'scipy': ('scipy',), 'matplotlib': ('matplotlib',)}
#: the exit status of a refusal (nothing installed or changed)
REFUSED = 2


def available_cpus() -> int:
    """The CPUs this process may use: its affinity mask (a SLURM job's cgroup, taskset),
    at most SLURM_CPUS_PER_TASK when that is set; not the machine's count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    slurm = os.environ.get('SLURM_CPUS_PER_TASK', '')
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    return max(1, cpus)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'gpu_check'),
                        help='where gpu_check.json, summary.txt and the logs go; must be '
                             'empty or not exist')
    parser.add_argument('--cpu', action='store_true',
                        help='no GPU, on purpose: the environment check, one backbone '
                             'forward on the CPU and the collection of the cuda tests')
    parser.add_argument('--benchmark-args', default=BENCHMARK_ARGS,
                        help=f'options of {BENCHMARK} (default: %(default)r); '
                             '--out-dir is added')
    parser.add_argument('--pytest-args', default='',
                        help='more options for pytest -m cuda (e.g. "-x")')
    parser.add_argument('--timeout', type=int, default=1800,
                        help='seconds for each step (default: %(default)s)')
    parser.add_argument('--bundle', help='install the offline bundle in this folder first '
                                         '(scripts/make_bundle.py, `make bundle`)')
    parser.add_argument('--target', help='with --bundle: install into this folder and keep '
                                         'it (default: a temporary folder, removed at the end)')
    parser.add_argument('--cuda-ops', action='store_true',
                        help="with --bundle: build mmcv's CUDA ops too (Mask R-CNN training "
                             'needs them; a longer build), for --arch')
    parser.add_argument('--arch', help="with --cuda-ops: the GPU architecture to build for, "
                                       "e.g. 9.0 (H100), 8.0 (A100); default: the visible "
                                       "GPU's (so a node without a visible GPU needs it)")
    parser.add_argument('--jobs', type=int, default=available_cpus(),
                        help='parallel compile jobs for mmcv (default: the CPUs this '
                             'process may use, %(default)s)')
    parser.add_argument('--mmcv-cache', default=MMCV_CACHE,
                        help='where built mmcv wheels are kept and looked up '
                             '(default: %(default)s)')
    args = parser.parse_args(argv)
    if args.arch and not re.fullmatch(r'\d+\.\d+(\+PTX)?', args.arch):
        parser.error(f'--arch {args.arch!r}: give a compute capability such as 9.0 or 8.6')
    if (args.cuda_ops or args.arch or args.target) and not args.bundle:
        parser.error('--cuda-ops, --arch and --target go with --bundle')
    return args


def load_stacks():
    """The checkout's ``mmplugin_inline/utils/stacks.py`` (the lines, their ranges, the torch
    floor), loaded by its path: importing the package needs what is not installed yet."""
    spec = importlib.util.spec_from_file_location(
        '_mmplugin_inline_stacks', osp.join(REPO, 'mmplugin_inline', 'utils', 'stacks.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def device_info(mmcv=True) -> dict:
    """torch, its CUDA build and the first device; with ``mmcv``, what mmcv's ops were
    compiled for."""
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
    if not mmcv:
        return info
    try:  # mmcv's compiled ops (RoIAlign, nms): built for CUDA, or CPU only?
        from mmcv.ops import get_compiling_cuda_version
        info['mmcv_ops_cuda'] = get_compiling_cuda_version()
    except Exception as exc:  # noqa: BLE001 - reported, the env check explains
        info['mmcv_ops_cuda'] = f'unavailable ({type(exc).__name__}: {exc})'
    return info


#: folders put before the repository on the path of every step (the bundle's target)
EXTRA_PATH = []


def step_env():
    """The environment of every step: the target before the repository on the path, its
    scripts (ninja, pytest) first on PATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        EXTRA_PATH + [REPO] +
        [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    bins = [osp.join(p, 'bin') for p in EXTRA_PATH if osp.isdir(osp.join(p, 'bin'))]
    env['PATH'] = os.pathsep.join(bins + [os.environ.get('PATH', '')])
    return env


def run(cmd, log_path, timeout, cwd=REPO):
    """Run ``cmd`` in ``cwd`` (the repository); its output goes to ``log_path``.
    -> (rc, tail); rc 124 when it ran past ``timeout``."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env=step_env())
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = (exc.stdout or b'').decode(errors='replace') if isinstance(exc.stdout, bytes) \
            else (exc.stdout or '')
        out += f'\n[timed out after {timeout} s]'
    with open(log_path, 'w') as f:
        f.write(out)
    return rc, out[-3000:]


def status_of(rc, ok):
    """A step's status word from its exit code and its own verdict."""
    if rc == 124:
        return 'timed out'
    return 'ok' if ok else 'failed'


# -- the node, before anything is installed ---------------------------------------------------

def _normalize(name):
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r'[-_.]+', '-', name).lower()


def _dist_of_wheel(filename):
    """(normalized distribution name, version) of a wheel file name."""
    name, version = osp.basename(filename).split('-')[:2]
    return _normalize(name), version


def _installed(dist):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def node_packages() -> dict:
    """What the node provides of :data:`NODE_PROVIDES`: ``{import name: 'dist version'}``,
    None for a missing one (found by its import spec and distribution; nothing imported)."""
    found = {}
    for module, dists in NODE_PROVIDES.items():
        have = [f'{d} {_installed(d)}' for d in dists if _installed(d) is not None]
        if not have and importlib.util.find_spec(module) is not None:
            have = [f'{module} (no pip metadata)']  # e.g. a conda or system package
        found[module] = ', '.join(have) if have else None
    return found


def nvcc_cuda():
    """(path of nvcc, its CUDA release 'X.Y') as torch's extension builder finds it
    (CUDA_HOME / CUDA_PATH, then PATH, then /usr/local/cuda); (None, None) without one."""
    candidates = [osp.join(os.environ[v], 'bin', 'nvcc') for v in ('CUDA_HOME', 'CUDA_PATH')
                  if os.environ.get(v)]
    candidates += [shutil.which('nvcc') or '', '/usr/local/cuda/bin/nvcc']
    for nvcc in candidates:
        if nvcc and osp.isfile(nvcc) and os.access(nvcc, os.X_OK):
            try:
                out = subprocess.run([nvcc, '--version'], capture_output=True, text=True,
                                     timeout=60).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            match = re.search(r'release (\d+\.\d+)', out)
            return nvcc, match.group(1) if match else None
    return None, None


def node_mmcv_ops(timeout=300):
    """Whether the node's own mmcv loads its compiled ops: None (no mmcv ops), 'cpu' or
    the CUDA release they were compiled with (a child interpreter: nothing is imported
    here)."""
    code = ('import mmcv._ext; from mmcv.ops import get_compiling_cuda_version as g; '
            'print("OPS", g())')
    try:
        proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                              timeout=timeout, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return None
    match = re.search(r'^OPS (.+)$', proc.stdout, re.M)
    if proc.returncode or not match:
        return None
    compiled = match.group(1).strip()
    return 'cpu' if compiled in ('', 'not available') else compiled


def bundle_command(stack, python):
    return f'make bundle BUNDLE_STACK={stack} BUNDLE_PYTHON={python}'


def preflight(args, manifest, torch_info) -> dict:
    """Look at the node before installing anything.

    Returns:
        dict: ``refusals`` (each a sentence: what is wrong, what to do), ``node`` (the
        node's packages), ``keep`` (the node's OpenMMLab distributions to use instead of
        the bundle's), ``build_mmcv`` (whether the bundle's mmcv must be compiled) and
        ``cuda_arch`` (the architecture of a ``--cuda-ops`` build).
    """
    stacks = load_stacks()
    refusals, notes = [], []
    python = '{}.{}'.format(*sys.version_info[:2])
    node = dict(python=f'{sys.version.split()[0]} ({sys.executable})',
                packages=node_packages())
    facts = dict(refusals=refusals, notes=notes, node=node, keep={}, build_mmcv=False,
                 cuda_arch=None)
    line = manifest['stack'] if manifest else None
    if manifest:
        if manifest['python_version'] != python:
            refusals.append(
                f"the bundle holds wheels for Python {manifest['python_version']}, this node "
                f'runs Python {python} ({sys.executable}). Make the bundle for this Python '
                f'where there is internet: `{bundle_command(line, python)}`.')
        if manifest.get('arch') and manifest['arch'] != platform.machine():
            refusals.append(
                f"the bundle is for {manifest['arch']}, this node is {platform.machine()}: "
                f'make it with `python scripts/make_bundle.py --arch {platform.machine()}`.')
    missing = [m for m, have in node['packages'].items() if have is None]
    if missing:
        names = {'cv2': 'opencv-python-headless'}
        have = ', '.join(f'{v}' for v in node['packages'].values() if v) or 'none of them'
        refusals.append(
            f"the node lacks {', '.join(names.get(m, m) for m in missing)}: the bundle holds "
            'no torch, torchvision, numpy, opencv, scipy or matplotlib (the node\'s own '
            f'builds are used; it has {have}). Load the cluster\'s PyTorch environment '
            '(module, conda env or container image) that has them, or install them into '
            'your venv where there is an index: `pip install '
            f"{' '.join(names.get(m, m) for m in missing)}`.")
    if torch_info.get('error'):
        refusals.append(f"torch does not import here ({torch_info['error']}): use the "
                        "cluster's PyTorch environment.")
        return facts
    torch_version = torch_info['torch']
    too_old = stacks.torch_problem(torch_version)
    if too_old:
        refusals.append(too_old)
    untested = stacks.torch_untested(torch_version)
    if untested:
        notes.append(untested)
    has_gpu = torch_info['cuda_available']
    if not has_gpu and not args.cpu:
        if torch_info.get('torch_cuda') is None:
            why = (f'torch {torch_version} is a CPU-only build (torch.version.cuda is None): '
                   'use a CUDA build of torch (the cluster\'s PyTorch module or image)')
        else:
            visible = os.environ.get('CUDA_VISIBLE_DEVICES')
            why = (f"torch {torch_version} (built for CUDA {torch_info['torch_cuda']}) sees "
                   'no CUDA device'
                   + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else '')
                   + ': run on a GPU node (SLURM: --gres=gpu:1 or --gpus=1), check '
                   '`nvidia-smi`; a driver older than torch\'s CUDA also shows no device')
        refusals.append(f'no GPU: {why}. To run the CPU smoke on purpose, add --cpu.')

    # OpenMMLab packages already on the node
    have = {c.module: stacks.installed_lines(c.module) for c in stacks.COMPONENTS}
    node['openmmlab'] = {stacks.COMPONENT[m].dists[ln]: v for m, found in have.items()
                         for ln, v in found.items()}
    for alias in stacks.ALIASES:
        if _installed(alias):
            node['openmmlab'][alias] = _installed(alias)
    node_line, problems = stacks.detect_line()
    listed = ', '.join(f'{d} {v}' for d, v in sorted(node['openmmlab'].items()))
    if problems:
        refusals.append(
            f'the node\'s own OpenMMLab packages conflict ({listed}): '
            + ' '.join(p.split(':')[0] + '.' for p in problems)
            + ' They belong to the node, so the check leaves them alone: run it from an '
            'environment without them (a venv over the cluster\'s torch) or ask the '
            'node\'s administrators.')
    elif node_line is not None and manifest and node_line != line:
        refusals.append(
            f'the node already has {stacks.LINE_NAMES[node_line]} ({listed}); this bundle '
            f'holds {stacks.LINE_NAMES[line]}, which would be installed over them. Use the '
            f"node's line: make its bundle where there is internet: "
            f'`{bundle_command(node_line, python)}`.')
    elif node_line is not None:
        out_of_range = []
        for module, found in have.items():
            if node_line not in found:
                continue
            comp = stacks.COMPONENT[module]
            low, high = comp.ranges[node_line]
            version = found[node_line]
            if not stacks.release(low) <= stacks.release(version) < stacks.release(high):
                out_of_range.append(f'{comp.dists[node_line]} {version} (supported: {low} '
                                    f'to below {high})')
            else:
                facts['keep'][comp.dists[node_line]] = version
        if out_of_range:
            refusals.append(
                f"the node's {', '.join(out_of_range)} lies outside the range mmplugin_inline "
                f'supports on {stacks.LINE_NAMES[node_line]}: the node\'s packages are left '
                'alone, so run from an environment without them, or ask for a supported '
                'version.')
    # mmcv: the node's own, when its ops load (with CUDA where --cuda-ops asks for it)
    mmcv_dist = manifest['mmcv']['dist'] if manifest else None
    if manifest and not refusals:
        if mmcv_dist in facts['keep']:
            ops = node_mmcv_ops()
            if ops is None or (args.cuda_ops and ops == 'cpu'):
                facts['keep'].pop(mmcv_dist)
                notes.append(f"the node's {mmcv_dist} {have['mmcv'][line]} has no "
                             f"{'CUDA ' if ops == 'cpu' else ''}ops: the bundle's is built "
                             'into the target, before it on the path')
            else:
                node['mmcv_ops'] = ops
        facts['build_mmcv'] = mmcv_dist not in facts['keep']
    if facts['build_mmcv']:
        if not (shutil.which('c++') or shutil.which('g++') or os.environ.get('CXX')):
            refusals.append('mmcv must be compiled, and no C++ compiler (c++, g++ or $CXX) '
                            'is on PATH: load the cluster\'s gcc module.')
    if args.cuda_ops and facts['build_mmcv']:
        torch_cuda = torch_info.get('torch_cuda')
        nvcc, nvcc_version = nvcc_cuda()
        node['nvcc'] = f'{nvcc} (CUDA {nvcc_version})' if nvcc else None
        if torch_cuda is None:
            refusals.append(f'--cuda-ops needs a CUDA build of torch; torch {torch_version} '
                            'is a CPU-only build.')
        elif nvcc is None:
            refusals.append(
                f'--cuda-ops needs nvcc of CUDA {torch_cuda} (torch\'s): none found in '
                '$CUDA_HOME/bin, on PATH or in /usr/local/cuda. Load the cluster\'s CUDA '
                f'module (CUDA {torch_cuda.split(".")[0]}.x) or set CUDA_HOME.')
        elif nvcc_version and nvcc_version.split('.')[0] != torch_cuda.split('.')[0]:
            refusals.append(
                f'--cuda-ops: {nvcc} is CUDA {nvcc_version}, torch {torch_version} was built '
                f'with CUDA {torch_cuda}; the major releases must match. Load CUDA '
                f'{torch_cuda.split(".")[0]}.x (module or CUDA_HOME).')
        elif nvcc_version and nvcc_version != torch_cuda:
            notes.append(f'nvcc is CUDA {nvcc_version}, torch is built with {torch_cuda} '
                         '(same major: accepted)')
        facts['cuda_arch'] = args.arch or torch_info.get('capability')
        if facts['cuda_arch'] is None:
            refusals.append('--cuda-ops without a visible GPU needs the architecture to '
                            'build for: add --arch (9.0 for H100/H200, 8.0 for A100, 8.6 '
                            'for RTX 30xx / A40, 8.9 for L40 / RTX 40xx).')
    elif args.cuda_ops and manifest and not refusals:
        notes.append(f"--cuda-ops: the node's {mmcv_dist} already has CUDA ops "
                     f"({node.get('mmcv_ops')}); nothing to build")
    return facts


# -- the offline bundle: install over the node's own packages, build mmcv ---------------------

def _pip(args, log, timeout, env=None):
    cmd = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '--no-input'] + args
    env = dict(os.environ if env is None else env, PIP_NO_INDEX='1', PIP_NO_BUILD_ISOLATION='0')
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    with open(log, 'a') as f:
        f.write('$ ' + ' '.join(cmd) + '\n' + proc.stdout + proc.stderr + '\n')
    if proc.returncode:
        raise RuntimeError(f'pip {args[0]} failed ({proc.returncode}): '
                           f'{(proc.stdout + proc.stderr)[-2000:]}')
    return time.time() - start


def install_bundle(bundle, manifest, target, keep, log, timeout) -> dict:
    """Install the bundle's wheels into ``target`` with no index: every distribution the
    node does not have yet (never torch or numpy: the bundle holds neither), and the
    plugin and the bundle's OpenMMLab packages unless the node's own are kept (``keep``:
    the node's line, :func:`preflight`). -> what was installed."""
    ours = {'mmplugin-inline'} | {_normalize(d) for d in manifest['codebases']}
    keep = {_normalize(d) for d in keep}
    install, kept = [], {}
    for entry in manifest['files']:
        if not entry['path'].startswith('wheels/'):
            continue
        dist, version = _dist_of_wheel(entry['path'])
        have = _installed(dist)
        if have is not None and (dist not in ours or dist in keep):
            kept[dist] = have
            continue
        install.append(osp.join(bundle, entry['path']))
    os.makedirs(target, exist_ok=True)
    seconds = _pip(['install', '--no-deps', '--no-compile', '--upgrade', '--target', target]
                   + install, log, timeout)
    return dict(target=target, stack=manifest['stack'], installed=sorted(
        osp.basename(w) for w in install), node_had=kept, seconds=round(seconds, 1))


def _mmcv_key(dist, version, cuda_arch):
    """The cache key of scripts/setup_env.sh
    (``DIST-VERSION-torch-T-CUDA-cpXY-MACHINE-ops-KIND``): torch's release, the CUDA it was
    built with (``cu124``, or ``cpu``), the Python, the machine, and the ops kind (``cpu``,
    or ``cudaARCH`` for a build with CUDA ops)."""
    import torch
    torch_cuda = 'cu' + torch.version.cuda.replace('.', '') if torch.version.cuda else 'cpu'
    return (f"{dist}-{version}-torch-{torch.__version__.split('+')[0]}-{torch_cuda}-"
            f'cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}-ops-'
            + (f'cuda{cuda_arch}' if cuda_arch else 'cpu'))


def needs_cxx20(torch_version) -> bool:
    """torch 2.10 and newer refuse to compile below C++20; mmcv hard-codes C++17 (older
    torch builds it as published: an older gcc may not know C++20)."""
    return load_stacks().release(torch_version)[:2] >= (2, 10)


def patch_cxx20(src_dir):
    """mmcv's setup.py with ``-std=c++17`` replaced by ``-std=c++20``."""
    path = osp.join(src_dir, 'setup.py')
    with open(path, encoding='utf-8') as f:
        text = f.read()
    patched = text.replace('-std=c++17', '-std=c++20')
    if 'c++20' not in patched:
        raise RuntimeError(f'could not patch the C++ standard in {path}')
    with open(path, 'w', encoding='utf-8') as f:
        f.write(patched)


def build_mmcv(bundle, manifest, target, cuda_arch, jobs, cache, log, timeout) -> dict:
    """mmcv from the bundle's source against the node's torch, installed into ``target``;
    a wheel in ``cache`` under the same key is reused instead. ``cuda_arch``: build its CUDA
    ops for that architecture (no visible GPU needed); None: CPU ops, the GPU hidden."""
    import torch
    mmcv = manifest['mmcv']
    key = _mmcv_key(mmcv['dist'], mmcv['version'], cuda_arch)
    cached = sorted(glob.glob(osp.join(cache, key, '*mmcv-*.whl')))
    result = dict(dist=mmcv['dist'], version=mmcv['version'], cuda_ops=bool(cuda_arch),
                  cuda_arch=cuda_arch, key=key, jobs=jobs)
    start = time.time()
    if cached:
        wheel = cached[0]
        result['built'] = False
    else:
        env = dict(step_env(), MMCV_WITH_OPS='1', MAX_JOBS=str(jobs),
                   CFLAGS='-O3 -DNDEBUG -fwrapv')  # no -g: several-fold faster, as fast
        env['PYTHONPATH'] = os.pathsep.join(  # the install (setuptools, wheel), not the checkout
            EXTRA_PATH + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
        if cuda_arch:
            env.update(FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST=cuda_arch)
        else:  # mmcv builds CUDA ops whenever torch sees a GPU: hide it from the build
            env.update(FORCE_CUDA='0', CUDA_VISIBLE_DEVICES='')
        if shutil.which('ninja', path=env['PATH']) is None:
            raise RuntimeError('ninja is neither on PATH nor in the bundle\'s install: the '
                               'build would compile one file at a time')
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(osp.join(bundle, mmcv['source'])) as tar:
                tar.extractall(tmp, filter='data')
            (src,) = [osp.join(tmp, d) for d in os.listdir(tmp)]
            result['cxx20'] = needs_cxx20(torch.__version__)
            if result['cxx20']:
                patch_cxx20(src)
            _pip(['wheel', '--no-deps', '--no-build-isolation', '-w', osp.join(tmp, 'dist'),
                  src], log, timeout, env=env)
            (built,) = glob.glob(osp.join(tmp, 'dist', '*.whl'))
            os.makedirs(osp.join(cache, key), exist_ok=True)
            wheel = shutil.copy2(built, osp.join(cache, key))
        result['built'] = True
    result['build_seconds'] = round(time.time() - start, 1)
    _pip(['install', '--no-deps', '--no-compile', '--upgrade', '--target', target, wheel],
         log, timeout)
    result['wheel'] = wheel
    return result


# -- the steps ----------------------------------------------------------------------------------

def cpu_smoke(out_dir, timeout) -> dict:
    """One backbone forward on the CPU from what is installed (the --cpu mode)."""
    rc, tail = run([sys.executable, '-c', CPU_SMOKE], osp.join(out_dir, 'cpu_smoke.log'),
                   timeout, cwd=out_dir)  # not the repository: the installed package runs
    line = next((text for text in tail.splitlines() if text.startswith('backbone forward:')),
                '')
    ok = rc == 0 and line.endswith('True')
    return dict(ok=ok, status=status_of(rc, ok), returncode=rc, output=line or tail[-1000:])


def env_check(out_dir, timeout) -> dict:
    # from out_dir, so that with --bundle the installed package is checked (from the
    # repository, ``-m`` would import the checkout's)
    rc, tail = run([sys.executable, '-m', 'mmplugin_inline.utils.env_check'],
                   osp.join(out_dir, 'env_check.log'), timeout, cwd=out_dir)
    return dict(ok=rc == 0, status=status_of(rc, rc == 0), returncode=rc, report=tail)


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


PYTEST = [sys.executable, '-m', 'pytest', '-m', 'cuda', '-p', 'no:cacheprovider']


def cuda_tests(out_dir, pytest_args, timeout) -> dict:
    xml = osp.join(out_dir, 'cuda_tests.xml')  # the folder was empty: no earlier run's file
    cmd = PYTEST + ['-q', '-rA', f'--junitxml={xml}'] + shlex.split(pytest_args)
    rc, tail = run(cmd, osp.join(out_dir, 'cuda_tests.log'), timeout)
    cases = junit_outcomes(xml) if rc != 124 and osp.exists(xml) else []
    counts = {}
    for c in cases:
        counts[c['outcome']] = counts.get(c['outcome'], 0) + 1
    # 0: all passed; 5: nothing collected (no cuda test) counts as a failure here too
    ok = rc == 0 and bool(cases)
    return dict(ok=ok, status=status_of(rc, ok), returncode=rc, counts=counts, tests=cases,
                log_tail=tail if rc else '')


def collect_cuda_tests(out_dir, timeout) -> dict:
    """``pytest -m cuda --collect-only``: every cuda test imports and is found (the --cpu
    mode's check that the bundle carries the test runner and what the tests import)."""
    rc, tail = run(PYTEST + ['--collect-only', '-q'],
                   osp.join(out_dir, 'cuda_collect.log'), timeout)
    match = re.search(r'(\d+)(?:/\d+)? tests? collected', tail)
    collected = int(match.group(1)) if match else 0
    ok = rc == 0 and collected > 0 and 'error' not in tail.lower().split('collected')[-1]
    return dict(ok=ok, status=status_of(rc, ok), returncode=rc, collected=collected,
                log_tail=tail[-1500:] if not ok else '')


def benchmark(out_dir, benchmark_args, timeout) -> dict:
    if not osp.exists(osp.join(REPO, BENCHMARK)):
        return dict(ok=None, status='not run', skipped=f'{BENCHMARK} does not exist in this '
                                                        'checkout')
    bench_dir = osp.join(out_dir, 'benchmark')
    os.makedirs(bench_dir)  # new: the out-dir was empty
    cmd = [sys.executable, BENCHMARK] + shlex.split(benchmark_args) + ['--out-dir', bench_dir]
    rc, tail = run(cmd, osp.join(out_dir, 'benchmark.log'), timeout)
    results = {}
    if rc != 124:  # a run cut short leaves a partial file: reported as timed out, not read
        for path in sorted(glob.glob(osp.join(bench_dir, '**', '*.json'), recursive=True)):
            try:
                with open(path) as f:
                    results[osp.relpath(path, bench_dir)] = json.load(f)
            except ValueError as exc:
                results[osp.relpath(path, bench_dir)] = f'unreadable: {exc}'
        for path in sorted(glob.glob(osp.join(bench_dir, '**', '*.md'), recursive=True)):
            with open(path) as f:  # the tables, as the tool writes them
                results[osp.relpath(path, bench_dir)] = f.read()
    return dict(ok=rc == 0, status=status_of(rc, rc == 0), returncode=rc,
                command=' '.join(cmd[1:]), results=results, output_tail=tail)


def summary_lines(report) -> list:
    """The short text summary (``summary.txt``) of a report."""
    verdict = {0: 'OK', 1: 'FAILED', REFUSED: 'REFUSED'}.get(report.get('exit'), 'FAILED')
    if 'exit' not in report:
        verdict = 'OK' if report['ok'] else 'FAILED'
    lines = [f"gpu-check {report['date']}: {verdict}",
             f"python {report.get('python')}, torch {report.get('torch')} "
             f"(CUDA {report.get('torch_cuda')})"]
    if report.get('cuda_available'):
        lines.append(f"device: {report.get('device')} (capability {report.get('capability')}, "
                     f"{report.get('memory_gib')} GiB)")
    for reason in report.get('refusals', []):
        lines.append(f'refused: {reason}')
    for note in report.get('notes', []):
        lines.append(f'note: {note}')
    if 'bundle' in report:
        b = report['bundle']
        if 'error' in b:
            lines.append(f"bundle: FAILED: {b['error'][:300]}")
        if 'installed' in b:
            lines.append(f"bundle: {len(b['installed'])} wheels into {b['target']} in "
                         f"{b['seconds']} s; kept the node's {len(b['node_had'])} packages")
        m = b.get('mmcv', {})
        if m.get('node'):
            lines.append(f"mmcv: the node's {m['node']}")
        elif m.get('dist'):
            ops = f"CUDA ops {m['cuda_arch']}" if m['cuda_ops'] else 'CPU ops'
            lines.append(f"mmcv: {m['dist']} {m['version']} "
                         f"{'built' if m.get('built') else 'from the cache'} "
                         f"({ops}) in {m.get('build_seconds')} s")
    names = dict(env_check='environment check', cpu_smoke='CPU backbone forward',
                 cuda_collect='cuda tests collected', cuda_tests='cuda tests',
                 benchmark='benchmark')
    for key, label in names.items():
        if key not in report:
            continue
        step = report[key]
        status = step.get('status') or ('ok' if step.get('ok') else 'failed')
        extra = ''
        if key == 'cuda_tests' and step.get('counts'):
            extra = f" {step['counts']}"
        if key == 'cuda_collect' and 'collected' in step:
            extra = f" ({step['collected']} tests)"
        if key == 'benchmark' and step.get('skipped'):
            extra = f" ({step['skipped']})"
        lines.append(f'{label}: {status}{extra}')
        if key == 'cuda_tests':
            lines += [f"  {c['outcome'].upper()} {c['test']}: {c['message'][:200]}"
                      for c in step.get('tests', []) if c['outcome'] in ('failed', 'error')]
        if key == 'benchmark':
            for name, res in step.get('results', {}).items():
                if name.endswith('.md'):
                    lines.append(res)
    if 'note' in report:
        lines.append(report['note'])
    return lines


def torch_facts() -> dict:
    """torch's version, CUDA build and device, or the error of its import."""
    try:
        return device_info(mmcv=False)
    except Exception as exc:  # noqa: BLE001 - the refusal names it
        return dict(error=f'{type(exc).__name__}: {exc}', torch=None, torch_cuda=None,
                    cuda_available=False, python=sys.version.split()[0])


def write_report(report, out_dir, start) -> int:
    """Write gpu_check.json and summary.txt; print the summary; -> the exit status."""
    report['seconds'] = round(time.time() - start, 1)
    path = osp.join(out_dir, 'gpu_check.json')
    with open(path, 'w') as f:
        json.dump(report, f, indent=2)
    summary = '\n'.join(summary_lines(report)) + '\n'
    with open(osp.join(out_dir, 'summary.txt'), 'w') as f:
        f.write(summary)
    print(summary, end='')
    word = {0: 'OK', 1: 'FAILED', REFUSED: 'REFUSED'}[report['exit']]
    print(f"gpu-check: {word} in {report['seconds']} s; wrote {path}")
    return report['exit']


def main(argv=None) -> int:
    args = parse_args(argv)
    out_dir = osp.abspath(args.out_dir)
    if osp.isdir(out_dir) and os.listdir(out_dir):
        print(f'gpu-check: refused: {out_dir} is not empty; each run writes into a fresh '
              'folder (so that no earlier result is read as this one). Give a new --out-dir '
              'or empty this one.', file=sys.stderr)
        return REFUSED
    os.makedirs(out_dir, exist_ok=True)
    start = time.time()
    report = dict(date=datetime.datetime.now().isoformat(timespec='seconds'),
                  mode='cpu' if args.cpu else 'gpu')
    manifest = None
    if args.bundle:
        path = osp.join(args.bundle, 'manifest.json')
        if not osp.isfile(path):
            print(f'gpu-check: refused: {path} does not exist: --bundle names the folder '
                  'that `make bundle` wrote (dist/bundle).', file=sys.stderr)
            return REFUSED
        with open(path) as f:
            manifest = json.load(f)
    info = torch_facts()
    report.update(info)
    facts = preflight(args, manifest, info)
    report.update(node=facts['node'], refusals=facts['refusals'], notes=facts['notes'])
    steps = ['env_check'] + (['cpu_smoke', 'cuda_collect'] if args.cpu else
                             ['cuda_tests', 'benchmark'])
    if facts['refusals']:
        print('gpu-check: refused before installing anything:', file=sys.stderr)
        for reason in facts['refusals']:
            print(f'  - {reason}', file=sys.stderr)
        report.update({s: dict(ok=None, status='not run') for s in steps}, ok=False,
                      exit=REFUSED)
        return write_report(report, out_dir, start)

    temporary = None
    try:
        if args.bundle:
            if args.target:
                target = osp.abspath(args.target)
            else:
                target = temporary = tempfile.mkdtemp(prefix='mmplugin_inline_site_')
            log = osp.join(out_dir, 'install.log')
            bundle = osp.abspath(args.bundle)
            try:
                report['bundle'] = install_bundle(bundle, manifest, target, facts['keep'],
                                                  log, args.timeout)
                EXTRA_PATH.insert(0, target)
                sys.path.insert(0, target)
                if facts['build_mmcv']:
                    report['bundle']['mmcv'] = build_mmcv(
                        bundle, manifest, target, facts['cuda_arch'] if args.cuda_ops
                        else None, args.jobs, args.mmcv_cache, log, args.timeout)
                else:
                    dist = manifest['mmcv']['dist']
                    report['bundle']['mmcv'] = dict(node=f"{dist} {facts['keep'][dist]} "
                                                    f"(ops: {facts['node'].get('mmcv_ops')})")
            except Exception as exc:  # noqa: BLE001 - reported; the run stops here
                report.setdefault('bundle', {})['error'] = f'{type(exc).__name__}: {exc}'
                print(f'gpu-check: the bundle\'s install FAILED (log: {log}); nothing more '
                      'runs', file=sys.stderr)
                report.update({s: dict(ok=None, status='not run') for s in steps}, ok=False,
                              exit=1)
                return write_report(report, out_dir, start)
            print(f'gpu-check: bundle installed into {target} (log: {log})')
        report.update(device_info())
        report['env_check'] = env_check(out_dir, args.timeout)
        if args.cpu:
            report['note'] = ('--cpu: no GPU on purpose; the GPU checks (cuda tests, GPU '
                              'benchmark) were not run')
            print(f"gpu-check: --cpu (torch {report['torch']}, CUDA device: "
                  f"{report['cuda_available']}): the CPU smoke only.")
            report['cpu_smoke'] = cpu_smoke(out_dir, args.timeout)
            report['cuda_collect'] = collect_cuda_tests(out_dir, args.timeout)
        else:
            print(f"gpu-check: {report['device']} (capability {report['capability']}), "
                  f"torch {report['torch']}, CUDA {report['torch_cuda']}, cuDNN "
                  f"{report['cudnn']}")
            report['cuda_tests'] = cuda_tests(out_dir, args.pytest_args, args.timeout)
            print(f"gpu-check: cuda tests {report['cuda_tests']['status']} "
                  f"{report['cuda_tests']['counts']}")
            report['benchmark'] = benchmark(out_dir, args.benchmark_args, args.timeout)
            print(f"gpu-check: benchmark {report['benchmark']['status']}")
        # a benchmark script this checkout lacks is reported, not counted as a failure
        ok = all(report[s]['ok'] is not False for s in steps) and \
            report['env_check']['ok'] is True
        report.update(ok=ok, exit=0 if ok else 1)
        return write_report(report, out_dir, start)
    finally:
        if temporary is not None:  # the report says where it was; nothing is left there
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())

"""Write the offline bundle for a GPU node without internet (``make bundle``).

    python scripts/make_bundle.py [--python-version 3.12] [--stack onedl] [--out dist/bundle]

Run where there is internet (the package index). The bundle holds no torch: the node's own
torch is used. It holds

- ``wheels/``: the plugin as a wheel; the OpenMMLab line's pure-Python packages as wheels
  (built here from their sdists where the index has no wheel); and the packages they need
  that a GPU node with torch may lack, as wheels for the node's Python (compiled ones such
  as pycocotools, shapely and regex for that Python's ABI);
- the test runner and what the cuda tests import beside the package (pytest, pluggy,
  iniconfig, hypothesis, sortedcontainers), and the build tools of mmcv's compile (ninja,
  setuptools, wheel): a GPU node's torch image often has none of them;
- ``src/``: mmcv's source (the line's distribution) as published. It is compiled on the
  node against the node's torch by ``scripts/gpu_check.py --bundle``, which patches its
  ``-std=c++17`` to C++20 only where that torch needs it (2.10 and newer; an older torch
  with an older gcc builds the sources as published);
- ``source.tar.gz``: this checkout's tracked files (tests, configs, tools, scripts), which
  the check runs its GPU tests from;
- ``manifest.json``: what is in it (files, sizes, sha256), for which Python and platform,
  what is deliberately left to the node (torch, numpy, opencv, scipy, matplotlib), and
  ``README.md``: how to use it.

The bundle is at most 60 MB; the script fails when it is larger.
"""
import argparse
import hashlib
import json
import os
import os.path as osp
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
MAX_BYTES = 60 * 2 ** 20

#: the pins of each line (the tested environments): versions of the line's own packages
PINS = {'official': 'requirements/pinned.txt', 'onedl': 'requirements/pinned-onedl.txt'}
#: per line: (the mmcv distribution, its pure-Python codebases and engine)
LINE = {
    'official': ('mmcv', ['mmengine', 'mmdet', 'mmsegmentation']),
    'onedl': ('onedl-mmcv', ['onedl-mmengine', 'onedl-mmdetection', 'onedl-mmsegmentation']),
}
#: what mmengine, mmcv, mmdet, mmseg and the plugin import that a node with torch may
#: lack (each as a wheel for the node's Python; pins from the line's pins file if there)
RUNTIME_DEPS = ['addict', 'yapf', 'platformdirs', 'termcolor', 'rich', 'markdown-it-py',
                'mdurl', 'pygments', 'pyyaml', 'packaging', 'pycocotools', 'shapely',
                'terminaltables', 'six', 'tqdm', 'ftfy', 'wcwidth', 'prettytable', 'regex',
                'timm', 'safetensors', 'huggingface-hub', 'filelock', 'fsspec',
                'typing-extensions', 'pillow', 'model-index', 'ordered-set', 'markdown', 'click',
                'tabulate']
#: the test runner and what the cuda tests import beside the package and RUNTIME_DEPS
#: (``pytest -m cuda`` on a node whose torch image has no test tools); exceptiongroup and
#: tomli are pytest's requirements below Python 3.11
TEST_TOOLS = ['pytest', 'pluggy', 'iniconfig', 'hypothesis', 'sortedcontainers']
TEST_TOOLS_BEFORE_311 = ['exceptiongroup', 'tomli']
#: what compiling mmcv needs beside torch and a compiler: ninja (without it torch's builder
#: compiles one file at a time), and setuptools / wheel (a Python 3.12 venv has neither)
BUILD_TOOLS = ['ninja', 'setuptools', 'wheel']
#: left to the node: its torch stack, and the large compiled packages every torch image
#: has (the check names any that is missing)
NODE_PROVIDES = ['torch', 'torchvision', 'numpy', 'opencv-python(-headless)', 'scipy',
                 'matplotlib']
#: pip's platform tags for a Linux x86_64 / aarch64 node
PLATFORMS = {'x86_64': ['manylinux_2_28_x86_64', 'manylinux_2_17_x86_64',
                        'manylinux2014_x86_64', 'linux_x86_64'],
             'aarch64': ['manylinux_2_28_aarch64', 'manylinux_2_17_aarch64',
                         'manylinux2014_aarch64', 'linux_aarch64']}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--python-version', type=python_version,
                        default='{}.{}'.format(*sys.version_info[:2]),
                        help="the node's Python as MAJOR.MINOR, e.g. 3.12 (default: this "
                             "one's, %(default)s)")
    parser.add_argument('--stack', choices=sorted(LINE), default='onedl',
                        help='the OpenMMLab line to bundle (default: %(default)s, the '
                             'maintained fork: numpy 2, current Python)')
    parser.add_argument('--arch', choices=sorted(PLATFORMS), default=platform.machine(),
                        help="the node's CPU architecture (default: %(default)s)")
    parser.add_argument('--out', default=osp.join(REPO, 'dist', 'bundle'),
                        help='the bundle folder, replaced (default: dist/bundle)')
    return parser.parse_args(argv)


def python_version(text):
    """``MAJOR.MINOR`` (``3.12``); a full version such as ``3.12.4`` (what Python's Docker
    images put into $PYTHON_VERSION) is refused, not turned into a tag ``cp3124``."""
    if not re.fullmatch(r'3\.\d{1,2}', text):
        raise argparse.ArgumentTypeError(f'{text!r}: give the Python as MAJOR.MINOR, e.g. 3.12')
    return text


def read_pins(path):
    pins = {}
    with open(osp.join(REPO, path), encoding='utf-8') as f:
        for line in f:
            line = line.split('#')[0].strip()
            if '==' in line:
                name, version = line.split('==')
                pins[normalize(name)] = version.strip()
    return pins


def normalize(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def pip(*args, cwd=None):
    cmd = [sys.executable, '-m', 'pip', '--disable-pip-version-check'] + list(args)
    print('[bundle] ' + ' '.join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True, cwd=cwd)


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def tracked_files():
    out = subprocess.run(['git', 'ls-files', '-z'], cwd=REPO, check=True,
                         capture_output=True).stdout.decode()
    return [p for p in out.split('\0') if p and not p.startswith('docs/')
            and osp.isfile(osp.join(REPO, p))]


def build_bundle(args):
    out = osp.abspath(args.out)
    if osp.exists(out):
        shutil.rmtree(out)
    wheels, src = osp.join(out, 'wheels'), osp.join(out, 'src')
    os.makedirs(wheels)
    os.makedirs(src)
    pins = read_pins(PINS[args.stack])
    mmcv_dist, codebases = LINE[args.stack]
    pyver = args.python_version
    abi = 'cp' + pyver.replace('.', '')
    target = ['--python-version', pyver, '--implementation', 'cp', '--abi', abi,
              '--abi', 'abi3', '--abi', 'none', '--only-binary=:all:']
    for plat in PLATFORMS[args.arch]:
        target += ['--platform', plat]

    with tempfile.TemporaryDirectory() as tmp:
        # 1. the plugin (its .mim: configs, tools, demo) and the line's pure-Python codebases
        pip('wheel', '--no-deps', '-w', wheels, REPO)
        sdists = osp.join(tmp, 'sdists')
        for dist in codebases:
            pip('download', '--no-deps', '-d', sdists, f'{dist}=={pins[normalize(dist)]}')
        for name in sorted(os.listdir(sdists)):
            path = osp.join(sdists, name)
            if name.endswith('.whl'):
                shutil.copy2(path, wheels)
            else:  # an sdist only (the fork's codebases): a py3-none-any wheel of it
                pip('wheel', '--no-deps', '-w', wheels, path)
        # 2. what they need that a node with torch may lack, for the node's Python
        extra = TEST_TOOLS_BEFORE_311 if tuple(map(int, pyver.split('.'))) < (3, 11) else []
        reqs = [f'{d}=={pins[d]}' if d in pins else d
                for d in RUNTIME_DEPS + TEST_TOOLS + extra + BUILD_TOOLS]
        pip('download', '--no-deps', '-d', wheels, *target, *reqs)
        # 3. mmcv's source as published (the check patches it where the node's torch
        # needs C++20)
        pip('download', '--no-deps', '--no-binary', mmcv_dist, '-d', src,
            f'{mmcv_dist}=={pins[normalize(mmcv_dist)]}')
        archive = [n for n in os.listdir(src) if n.endswith('.tar.gz')][0]
    # 4. this checkout's tracked files: the GPU tests, configs, tools, scripts
    with tarfile.open(osp.join(out, 'source.tar.gz'), 'w:gz') as tar:
        for rel in tracked_files():
            tar.add(osp.join(REPO, rel), arcname=osp.join('mmplugin_inline-src', rel))

    files = []
    for folder in ('wheels', 'src', '.'):
        for name in sorted(os.listdir(osp.join(out, folder))):
            path = osp.join(out, folder, name)
            if osp.isfile(path):
                files.append(dict(path=osp.normpath(osp.join(folder, name)),
                                  bytes=osp.getsize(path), sha256=sha256(path)))
    manifest = dict(
        stack=args.stack, python_version=pyver, arch=args.arch,
        plugin_version=_plugin_version(), mmcv=dict(dist=mmcv_dist,
                                                     version=pins[normalize(mmcv_dist)],
                                                     source=f'src/{archive}',
                                                     cxx20='patched on the node where torch '
                                                           '>= 2.10'),
        codebases={d: pins[normalize(d)] for d in codebases},
        node_provides=NODE_PROVIDES, test_tools=TEST_TOOLS, build_tools=BUILD_TOOLS,
        made_with_pip=version('pip'), files=files)
    with open(osp.join(out, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=2)
    with open(osp.join(out, 'README.md'), 'w') as f:
        f.write(README.format(**manifest, mmcv_dist=mmcv_dist))
    total = sum(f['bytes'] for f in files)
    print(f'[bundle] {out}: {len(files)} files, {total / 2 ** 20:.1f} MB '
          f'({args.stack} line, Python {pyver}, {args.arch})')
    if total > MAX_BYTES:
        raise SystemExit(f'bundle: {total / 2 ** 20:.1f} MB is over the 60 MB limit')
    return out


def _plugin_version():
    scope = {}
    with open(osp.join(REPO, 'mmplugin_inline', 'version.py'), encoding='utf-8') as f:
        exec(f.read(), scope)  # the package's own version file (not imported: no torch)
    return scope['__version__']


README = """# mmplugin_inline offline bundle ({stack} line, Python {python_version}, {arch})

For a GPU node without internet that has CUDA torch installed. Nothing here is torch:
the node's own torch is used, and so are its numpy, opencv, scipy and matplotlib.

On the node, from a copy of this folder (`dist/bundle`):

    tar xzf source.tar.gz                   # the plugin's checkout (tests, configs, tools)
    python mmplugin_inline-src/scripts/gpu_check.py --bundle . --out-dir gpu_check_out
    # or, with mmcv's CUDA ops (needed to train Mask R-CNN; a longer build):
    python mmplugin_inline-src/scripts/gpu_check.py --bundle . --out-dir gpu_check_out --cuda-ops

From a checkout of the plugin, `python scripts/gpu_check.py --bundle dist/bundle` does the
same. The check installs `wheels/` into a temporary folder with no index and no network,
over what the node has (a package the node already has is not installed again), compiles
`{mmcv_dist}` from `src/` against the node's torch with the CPUs the job was given (CPU
ops; `--cuda-ops` adds the CUDA ops for the GPU's architecture), then runs the GPU check and writes
`gpu_check_out/gpu_check.json` and `gpu_check_out/summary.txt`. `--target DIR` keeps the
installed packages in DIR for later use (`PYTHONPATH=DIR`).

Before it installs anything the check looks at the node and refuses, saying what to do,
when the Python is not {python_version}, a package the node must provide is missing
(torch, torchvision, numpy, opencv, scipy, matplotlib), torch is older than the supported
floor, there is no GPU (add `--cpu` to run the CPU smoke on purpose), or the node's own
OpenMMLab packages are of another line (then it names the bundle to make). A node that
has this line's packages keeps them; only the plugin and what is missing are installed.
`--cuda-ops` without a visible GPU needs `--arch` (e.g. `--arch 9.0`) and nvcc of
torch's CUDA. The output folder must be new or empty.

Contents: `manifest.json` lists every file with its sha256.
"""


def main(argv=None):
    build_bundle(parse_args(argv))
    return 0


if __name__ == '__main__':
    sys.exit(main())

"""Write the offline bundle for a GPU node without internet (``make bundle``).

    python scripts/make_bundle.py [--python-version 3.12] [--stack onedl] [--out dist/bundle]

Run where there is internet (the package index). The bundle holds no torch: the node's own
torch is used. It holds

- ``wheels/``: the plugin as a wheel; the OpenMMLab line's pure-Python packages as wheels
  (built here from their sdists where the index has no wheel); and the packages they need
  that a GPU node with torch may lack, as wheels for the node's Python (compiled ones such
  as pycocotools, shapely and regex for that Python's ABI);
- ``src/``: mmcv's source (the line's distribution), with ``-std=c++17`` already patched to
  C++20 (torch 2.10 and newer need it; older torch builds with it too). It is compiled on
  the node against the node's torch by ``scripts/gpu_check.py --bundle``;
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
                'typing-extensions', 'pillow', 'model-index', 'tabulate']
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
    parser.add_argument('--python-version', default='{}.{}'.format(*sys.version_info[:2]),
                        help="the node's Python, e.g. 3.12 (default: this one's, %(default)s)")
    parser.add_argument('--stack', choices=sorted(LINE), default='onedl',
                        help='the OpenMMLab line to bundle (default: %(default)s, the '
                             'maintained fork: numpy 2, current Python)')
    parser.add_argument('--arch', choices=sorted(PLATFORMS), default=platform.machine(),
                        help="the node's CPU architecture (default: %(default)s)")
    parser.add_argument('--out', default=osp.join(REPO, 'dist', 'bundle'),
                        help='the bundle folder, replaced (default: dist/bundle)')
    return parser.parse_args(argv)


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


def patch_cxx20(src_dir):
    """mmcv's setup.py hard-codes -std=c++17, which torch >= 2.10's headers refuse."""
    path = osp.join(src_dir, 'setup.py')
    with open(path, encoding='utf-8') as f:
        text = f.read()
    patched = text.replace('-std=c++17', '-std=c++20')
    if 'c++20' not in patched:
        raise SystemExit(f'bundle: could not patch the C++ standard in {path}')
    with open(path, 'w', encoding='utf-8') as f:
        f.write(patched)


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
        reqs = [f'{d}=={pins[d]}' if d in pins else d for d in RUNTIME_DEPS]
        pip('download', '--no-deps', '-d', wheels, *target, *reqs)
        # 3. mmcv's source, patched for C++20
        pip('download', '--no-deps', '--no-binary', mmcv_dist, '-d', tmp,
            f'{mmcv_dist}=={pins[normalize(mmcv_dist)]}')
        archive = [n for n in os.listdir(tmp) if n.endswith('.tar.gz')][0]
        with tarfile.open(osp.join(tmp, archive)) as tar:
            tar.extractall(osp.join(tmp, 'mmcv'), filter='data')
        (top,) = os.listdir(osp.join(tmp, 'mmcv'))
        patch_cxx20(osp.join(tmp, 'mmcv', top))
        with tarfile.open(osp.join(src, archive), 'w:gz') as tar:
            tar.add(osp.join(tmp, 'mmcv', top), arcname=top)
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
                                                     source=f'src/{archive}', cxx20=True),
        codebases={d: pins[normalize(d)] for d in codebases},
        node_provides=NODE_PROVIDES, made_with_pip=version('pip'), files=files)
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
`{mmcv_dist}` from `src/` against the node's torch with all cores (CPU ops; `--cuda-ops`
adds the CUDA ops for the local GPU's architecture), then runs the GPU check and writes
`gpu_check_out/gpu_check.json` and `gpu_check_out/summary.txt`. `--target DIR` keeps the
installed packages in DIR for later use (`PYTHONPATH=DIR`).

Contents: `manifest.json` lists every file with its sha256.
"""


def main(argv=None):
    build_bundle(parse_args(argv))
    return 0


if __name__ == '__main__':
    sys.exit(main())

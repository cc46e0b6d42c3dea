#!/usr/bin/env bash
# Create a virtual environment in the repository root and install one pinned OpenMMLab
# line into it (docs/environments.md has the matrix):
#
#   STACK=official (default)  .venv/        requirements/pinned.txt        mmcv 2.1 / mmdet 3.3
#                                            / mmseg 1.2 on torch 2.14
#   STACK=onedl               .venv-onedl/  requirements/pinned-onedl.txt  the maintained fork
#                                            (onedl-mmcv 2.3 / mmdet 3.5 / mmseg 1.4) on torch 2.8,
#                                            the lowest supported torch (setup.cfg)
#
# Idempotent: when the venv already holds exactly what its pins, setup.cfg, setup.py and
# this script ask for, it says so and returns in about a second.
#
# Neither line has a CPU wheel of mmcv with its ops on the package index, so mmcv is built
# from its sdist with the compiled ops (mmcv.ops.RoIAlign, nms, ... are needed by Mask
# R-CNN). The wheel is cached outside the repository, keyed by the mmcv distribution and
# version, torch and Python, so the build (7 to 15 minutes on 2 cores) happens once per
# machine.
#
# Environment knobs:
#   STACK                   official | onedl (default: official)
#   PYTHON                  interpreter used to create the venv (default: python3)
#   MMPLUGIN_INLINE_CACHE   wheel cache (default: ~/.cache/mmplugin_inline)
#   MAX_JOBS                parallel compile jobs for the mmcv build (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${STACK:-official}"
case "$STACK" in
    official) VENV="$ROOT/.venv";       PINS="$ROOT/requirements/pinned.txt"
              ENGINE_DIST=mmengine;       MMCV_DIST=mmcv;       MIM_DIST=openmim ;;
    onedl)    VENV="$ROOT/.venv-onedl"; PINS="$ROOT/requirements/pinned-onedl.txt"
              ENGINE_DIST=onedl-mmengine; MMCV_DIST=onedl-mmcv; MIM_DIST=onedl-mim ;;
    *) echo "setup: unknown STACK '$STACK' (official or onedl)" >&2; exit 2 ;;
esac
CACHE="${MMPLUGIN_INLINE_CACHE:-$HOME/.cache/mmplugin_inline}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.mmplugin_inline.stamp"

say() { printf '[setup:%s] %s\n' "$STACK" "$*"; }

pin() {  # pin NAME -> the exact version from requirements/pinned.txt
    local v
    v=$(sed -n "s/^$1==\([^ #]*\).*/\1/p" "$PINS")
    [ -n "$v" ] || { echo "setup: $1 is not pinned in $PINS" >&2; exit 1; }
    printf '%s' "$v"
}

want_stamp() {
    cat "$PINS" "$ROOT/setup.cfg" "$ROOT/setup.py" "$ROOT/scripts/setup_env.sh" \
        | sha256sum | cut -d' ' -f1
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want_stamp)" ] && [ -x "$VENV/bin/python" ]; then
    say "environment $(basename "$VENV")/ is up to date (delete it to rebuild it)"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $(basename "$VENV")/ with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check --progress-bar off)

TORCH=$(pin torch); TV=$(pin torchvision); MMCV=$(pin "$MMCV_DIST")
say "installing torch $TORCH and torchvision $TV (large; from local files when the machine has them)"
"${PIP[@]}" "torch==$TORCH" "torchvision==$TV" "numpy==$(pin numpy)"

say "installing build tools and mmengine"
"${PIP[@]}" "setuptools==$(pin setuptools)" "wheel==$(pin wheel)" "ninja==$(pin ninja)" \
    "$ENGINE_DIST==$(pin "$ENGINE_DIST")"

if "$PY" -c "import mmcv, mmcv._ext, sys; sys.exit(mmcv.__version__ != '$MMCV')" 2>/dev/null; then
    say "mmcv $MMCV with compiled ops is already installed"
else
    PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    # torch's CUDA build (cu124, or cpu) and the ops kind are part of the key:
    # scripts/gpu_check.py reads and writes the same cache (its _mmcv_key); a wheel built
    # here has CPU ops only, one built there with --cuda-ops ends in -ops-cudaARCH
    TORCH_CUDA=$("$PY" -c 'import torch; v = torch.version.cuda; print("cu" + v.replace(".", "") if v else "cpu")')
    KEY="$MMCV_DIST-$MMCV-torch-$TORCH-$TORCH_CUDA-$PYTAG-$(uname -m)-ops-cpu"
    WHEEL_DIR="$CACHE/$KEY"
    WHEEL=$(ls "$WHEEL_DIR"/*mmcv-*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$WHEEL" ]; then
        say "no cached mmcv wheel in $WHEEL_DIR: building $MMCV_DIST $MMCV with ops from source"
        say "this compiles ~100 C++ files and takes about 7-15 minutes on 2 cores (once per machine)"
        BUILD=$(mktemp -d)
        trap 'rm -rf "$BUILD"' EXIT
        "$PY" -m pip download --disable-pip-version-check --no-deps --no-binary "$MMCV_DIST" \
            -d "$BUILD" "$MMCV_DIST==$MMCV"
        tar -xzf "$BUILD"/*mmcv-"$MMCV".tar.gz -C "$BUILD"
        SRC=$(ls -d "$BUILD"/*mmcv-"$MMCV")
        # torch >= 2.10 headers require C++20 ('#error C++20 or later'); both lines' mmcv
        # hard-code c++17 (older torch keeps the sources as published).
        if "$PY" -c "import sys, torch; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 10))"; then
            sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
            grep -q 'c++20' "$SRC/setup.py" || { echo "setup: could not patch mmcv's C++ standard" >&2; exit 1; }
            say "patched $MMCV_DIST's setup.py for C++20 (torch $TORCH)"
        fi
        START=$(date +%s)
        # CFLAGS replaces Python's default flags (-g -O3 ...): no debug info, same optimisation.
        # That cuts the build several-fold and keeps the ops as fast.
        # CPU ops: mmcv's setup.py builds CUDA ops whenever torch sees a GPU, so the GPU is
        # hidden from the build (CUDA_VISIBLE_DEVICES='') as well as FORCE_CUDA=0.
        ( cd "$SRC" && MMCV_WITH_OPS=1 FORCE_CUDA=0 CUDA_VISIBLE_DEVICES='' \
            MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
            CFLAGS="-O3 -DNDEBUG -fwrapv" \
            "$PY" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps \
            -w "$BUILD/dist" . )
        mkdir -p "$WHEEL_DIR"
        cp "$BUILD"/dist/*mmcv-*.whl "$WHEEL_DIR/"
        WHEEL=$(ls "$WHEEL_DIR"/*mmcv-*.whl | head -n 1)
        say "built $(basename "$WHEEL") in $(( $(date +%s) - START )) s, cached in $WHEEL_DIR"
    else
        say "using cached mmcv wheel $WHEEL"
    fi
    "${PIP[@]}" --no-deps --force-reinstall "$WHEEL"
    # mmcv's own runtime requirements (its wheel was installed without them).
    "${PIP[@]}" addict packaging Pillow pyyaml yapf "opencv-python==$(pin opencv-python)"
fi

say "installing mmdet, mmsegmentation, timm, mim, test tools and the plugin (editable)"
# Every pin except those installed above; mmcv is already here, so pip only checks it.
# openmim is left out: its dependency opendatalab pins setuptools~=60.2 (which breaks
# torch), so it is installed alone with --no-deps; its real needs are pinned.
grep -v -E '^\s*(#|$)' "$PINS" | grep -v -E "^$MIM_DIST==" > "$VENV/.pins.txt"
"${PIP[@]}" -r "$VENV/.pins.txt"
"${PIP[@]}" --no-deps "$MIM_DIST==$(pin "$MIM_DIST")"
# setup.py links configs/, tools/, demo/ and model-index.yml into mmplugin_inline/.mim/.
# mim looks for them in <location of the dist-info>/mmplugin_inline/.mim, and an editable
# install keeps its dist-info in site-packages. So: the compat editable mode (a .pth that
# puts the repository root on sys.path, where the package is a regular one) and, in
# site-packages, a folder mmplugin_inline/ holding only the link .mim -> the repository's
# mmplugin_inline/.mim. Without an __init__.py that folder is at most a namespace portion,
# so `import mmplugin_inline` still finds the repository's package (found later on sys.path).
"${PIP[@]}" --no-deps --no-build-isolation --config-settings editable_mode=compat -e "$ROOT"
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/mmplugin_inline"
ln -sfn "$ROOT/mmplugin_inline/.mim" "$SITE/mmplugin_inline/.mim"
"$PY" - "$ROOT" <<'PYEOF'
import importlib.util, os.path as osp, sys
origin = importlib.util.find_spec('mmplugin_inline').origin
if origin is None or osp.dirname(osp.dirname(osp.realpath(origin))) != osp.realpath(sys.argv[1]):
    sys.exit(f'setup: import mmplugin_inline finds {origin}, not the package in {sys.argv[1]}')
PYEOF

say "checking the installed stack"
"$PY" -m mmplugin_inline.utils.env_check

want_stamp > "$STAMP"
say "done: activate with 'source $(basename "$VENV")/bin/activate'"

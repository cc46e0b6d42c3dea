# The two commands of the README: `make demo` and `make test`. Both set up the venv first
# (idempotent: seconds when it is already there).
#
# STACK picks the OpenMMLab line (docs/environments.md): official (default; .venv/, torch
# 2.14, mmcv 2.1 / mmdet 3.3 / mmseg 1.2) or onedl (.venv-onedl/, torch 2.8, the lowest
# supported torch; the maintained fork: onedl-mmcv 2.3 / mmdet 3.5 / mmseg 1.4). E.g. `make setup STACK=onedl`,
# `make test STACK=onedl`.
STACK ?= official
ifeq ($(STACK),onedl)
VENV := .venv-onedl
else ifeq ($(STACK),official)
VENV := .venv
else
$(error STACK must be official or onedl, not '$(STACK)')
endif
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
export STACK

.PHONY: setup demo demo-seg test test-fast test-e2e lint docs env gpu-check bundle clean

setup:
	bash scripts/setup_env.sh

env: setup
	$(PY) -m mmplugin_inline.utils.env_check

demo: setup
	bash tools/demo.sh det

demo-seg: setup
	bash tools/demo.sh seg

# everything (-m slow included), on two pytest-xdist workers (one torch thread each); the
# files that share a module fixture stay on one worker (--dist loadgroup)
test: setup
	$(PY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# the unit tier, to run after every change: no end-to-end runs (slow), no GPU tests
test-fast: setup
	$(PY) -m pytest -m "not slow and not cuda" $(PYTEST_ARGS)

# the end-to-end runs of a second environment in CI: train, resume (ours and the stock
# tools/train.py), test, the demo, DDP, whole-detector ONNX export and its runtime, mim,
# the timm face in smp and transformers
test-e2e: setup
	$(PY) -m pytest -n 2 --dist loadgroup -m "slow and not cuda" tests/e2e tests/engine \
		tests/deployment/test_onnx_whole.py tests/timm tests/docs/test_timm_page.py $(PYTEST_ARGS)

# ruff (pinned in requirements/pinned.txt, configured in pyproject.toml): pyflakes,
# pycodestyle, import order and the bugbear checks that fit; CI runs it before the tests
lint: setup
	$(PY) -m ruff check .

# the manual (Sphinx + MyST) -> docs/_build/html/index.html; any warning is an error
docs: setup
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# the GPU path (env check, pytest -m cuda, the paper's Fig. 3 benchmark) ->
# work_dirs/gpu_check/gpu_check.json; refuses (exit 2) without a GPU, and when that folder
# is not empty: GPU_CHECK_ARGS="--cpu" runs the CPU smoke on purpose. Not part of `make
# test`; no set-up step (a GPU machine may have its own CUDA mmcv): use
# `make gpu-check PY=python` for another environment.
GPU_CHECK_ARGS ?=
gpu-check:
	$(PY) scripts/gpu_check.py --out-dir work_dirs/gpu_check $(GPU_CHECK_ARGS)

# the offline bundle for a GPU node without internet (docs/environments.md, "GPU machines"):
# dist/bundle/ for BUNDLE_PYTHON (MAJOR.MINOR; default: this machine's) and BUNDLE_STACK
# (default: STACK when given, else onedl, the fork: numpy 2, current Python). Needs the
# package index, not a venv: any python3 with pip. (Not PYTHON_VERSION: Python's Docker
# images set it to a full version such as 3.12.4.)
BUNDLE_PYTHON ?= $(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ifneq ($(filter command line environment environment override,$(origin STACK)),)
BUNDLE_STACK ?= $(STACK)
else
BUNDLE_STACK ?= onedl
endif
bundle:
	python3 scripts/make_bundle.py --python-version $(BUNDLE_PYTHON) --stack $(BUNDLE_STACK) \
		--out dist/bundle

clean:
	rm -rf .venv .venv-onedl build *.egg-info .pytest_cache docs/_build docs/_generated

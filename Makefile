# The two commands of the README: `make demo` and `make test`. Both set up .venv/ first
# (idempotent: seconds when it is already there).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo demo-seg test env clean

setup:
	bash tools/setup_env.sh

env: setup
	$(PY) -m mmplugin_inline.utils.env_check

demo: setup
	bash tools/demo.sh det

demo-seg: setup
	bash tools/demo.sh seg

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache

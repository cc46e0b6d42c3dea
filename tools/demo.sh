#!/usr/bin/env bash
# The main job on the embedded demo data (`make demo` / `make demo-seg`).
# Until the demo training job lands, this runs a smoke check of the installed stack:
# the environment check, then every InLine backbone on an odd-sized image.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
$PY -m mmplugin_inline.utils.env_check
$PY tools/misc/smoke_backbones.py

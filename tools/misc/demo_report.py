"""Pictures and numbers after a demo run: a prediction grid, training curves, final metrics;
the options are in ``mmplugin_inline/cli/demo_report.py``."""
import sys

from mmplugin_inline.cli.demo_report import main

if __name__ == '__main__':
    sys.exit(0 if main() is not None else 1)

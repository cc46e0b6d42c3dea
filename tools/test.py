"""Test (and evaluate) a detector or segmentor checkpoint with mmengine's Runner;
the options are in ``mmplugin_inline/cli/test.py``."""
import sys

from mmplugin_inline.cli.test import main

if __name__ == '__main__':
    sys.exit(main())

"""Train a detector (mmdet config) or a segmentor (mmseg config) with mmengine's Runner;
the options are in ``mmplugin_inline/cli/train.py``."""
import sys

from mmplugin_inline.cli.train import main

if __name__ == '__main__':
    sys.exit(main())

"""Inference speed (images/s) and peak memory of an mmdet / mmseg model; the options are in
``mmplugin_inline/cli/benchmark.py``."""
from mmplugin_inline.cli.benchmark import main

if __name__ == '__main__':
    main()

"""Generate a deterministic synthetic dataset of coloured shapes;
the options are in ``mmplugin_inline/cli/make_shapes_dataset.py``."""
import sys

from mmplugin_inline.cli.make_shapes_dataset import main

if __name__ == '__main__':
    sys.exit(main())

"""Draw the ground truth of a config's training set: boxes and masks (mmdet) or label;
the options are in ``mmplugin_inline/cli/browse_dataset.py``."""
from mmplugin_inline.cli.browse_dataset import main

if __name__ == '__main__':
    main()

"""Predict on images and draw the results: boxes and masks (mmdet) or a segmentation overlay
(mmseg); the options are in ``mmplugin_inline/cli/image_demo.py``."""
from mmplugin_inline.cli.image_demo import main

if __name__ == '__main__':
    main()

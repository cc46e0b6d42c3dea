"""Parameters and FLOPs of an mmdet / mmseg model and of its backbone; the options are in
``mmplugin_inline/cli/get_flops.py``."""
from mmplugin_inline.cli.get_flops import main

if __name__ == '__main__':
    main()

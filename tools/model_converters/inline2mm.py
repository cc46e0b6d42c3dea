"""Convert an authors' released InLine checkpoint to this plugin's backbone format;
the options are in ``mmplugin_inline/cli/inline2mm.py``."""
import sys

from mmplugin_inline.cli.inline2mm import main

if __name__ == '__main__':
    sys.exit(main())

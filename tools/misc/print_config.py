"""Print the whole config (bases merged, ``--cfg-options`` applied), optionally save it;
the options are in ``mmplugin_inline/cli/print_config.py``."""
from mmplugin_inline.cli.print_config import main

if __name__ == '__main__':
    main()

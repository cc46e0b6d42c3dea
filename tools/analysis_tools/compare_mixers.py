"""Train one config in several attention variants and seeds and compare them; the options
are in ``mmplugin_inline/cli/compare_mixers.py``."""
from mmplugin_inline.cli.compare_mixers import main

if __name__ == '__main__':
    main()

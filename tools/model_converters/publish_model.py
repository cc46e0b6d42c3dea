"""Publish a checkpoint of a run: only its weights and meta, named by its hash;
the options are in ``mmplugin_inline/cli/publish_model.py``."""
import sys

from mmplugin_inline.cli.publish_model import main

if __name__ == '__main__':
    sys.exit(main())

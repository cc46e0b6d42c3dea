"""Show on real tensors that linear attention is not injective and InLine is; the
options are in ``mmplugin_inline/cli/injectivity.py``."""
from mmplugin_inline.cli.injectivity import main

if __name__ == '__main__':
    main()

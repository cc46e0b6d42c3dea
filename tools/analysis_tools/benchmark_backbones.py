"""Race the InLine backbones against the softmax backbones users would pick instead; the
options are in ``mmplugin_inline/cli/benchmark_backbones.py``."""
from mmplugin_inline.cli.benchmark_backbones import main

if __name__ == '__main__':
    main()

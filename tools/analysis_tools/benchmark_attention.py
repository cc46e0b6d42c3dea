"""Benchmark InLine attention against the authors' formulation, linear and softmax
attention; the options are in ``mmplugin_inline/cli/benchmark_attention.py``."""
from mmplugin_inline.cli.benchmark_attention import main

if __name__ == '__main__':
    main()

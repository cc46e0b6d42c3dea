"""Race whole models: our configs' detectors / segmentors against the softmax models a
user would otherwise train; the options are in ``mmplugin_inline/cli/benchmark_models.py``."""
from mmplugin_inline.cli.benchmark_models import main

if __name__ == '__main__':
    main()

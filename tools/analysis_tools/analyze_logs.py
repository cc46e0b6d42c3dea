"""Curves and training speed from the json logs of runs of ``tools/train.py``;
the options are in ``mmplugin_inline/cli/analyze_logs.py``."""
from mmplugin_inline.cli.analyze_logs import main

if __name__ == '__main__':
    main()

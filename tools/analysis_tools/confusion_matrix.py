"""Confusion matrix of a config's test set from the predictions ``tools/test.py --out`` saved;
the options are in ``mmplugin_inline/cli/confusion_matrix.py``."""
from mmplugin_inline.cli.confusion_matrix import main

if __name__ == '__main__':
    main()

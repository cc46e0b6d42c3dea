"""Where things are: the repository root, ``tests/`` and the test data, from any test
folder (the tests are laid out in subfolders of ``tests/`` like the package)."""
import os.path as osp

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
REPO = osp.dirname(TESTS)
DATA = osp.join(TESTS, 'data')

"""Fixtures shared by the test files; ``helpers`` (beside this file) holds the shared code."""
import pytest

from helpers.runs import make_shapes


@pytest.fixture(scope='module')
def shapes(tmp_path_factory):
    """A small shapes data set (COCO json + ADE20K-style maps): 4 training, 2 val images."""
    out = str(tmp_path_factory.mktemp('shapes'))
    assert make_shapes.main([out, '--train', '4', '--val', '2', '--min-size', '64',
                             '--max-size', '96', '--seed', '3']) == 0
    return out

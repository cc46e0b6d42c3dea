"""Sphinx configuration of the mmplugin_inline manual (``make docs``).

Markdown pages (MyST), the API reference from the docstrings (autodoc + napoleon for
their Google style), and the model zoo page generated at build time from the
metafiles (``_ext/model_zoo.py``). Nothing reaches the network.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '_ext'))
sys.path.insert(0, os.path.dirname(HERE))

from mmplugin_inline.version import __version__  # noqa: E402

project = 'mmplugin_inline'
author = 'the mmplugin_inline developers'
copyright = '2026, the mmplugin_inline developers'
version = release = __version__

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'model_zoo',
]
source_suffix = {'.md': 'markdown'}
root_doc = 'index'
exclude_patterns = ['_build', '_generated', 'Thumbs.db', '.DS_Store']

myst_heading_anchors = 3
myst_enable_extensions = ['colon_fence']

autodoc_member_order = 'bysource'
autodoc_typehints = 'description'
autodoc_default_options = {'members': True, 'show-inheritance': True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = 'furo'
html_title = f'mmplugin_inline {release}'
html_static_path = []

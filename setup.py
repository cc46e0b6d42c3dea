"""Packaging beyond setup.cfg: the mim extension (``mmplugin_inline/.mim/``).

OpenMMLab's ``mim`` looks for a package's configs, tools and model index in
``<package>/.mim/`` (``mim search`` reads ``.mim/model-index.yml``, ``mim train`` /
``mim test`` run ``.mim/tools/train.py`` / ``test.py`` and find configs under
``.mim/configs``). As in mmdet:

- a wheel (``pip install .``, ``python -m build``) gets copies of them, placed in the
  build directory (the source tree is left as it is);
- an editable install (``pip install -e .``) gets relative symlinks in the source tree,
  ``mmplugin_inline/.mim/configs -> ../../configs`` and so on (git-ignored), so edits show.

Everything else (name, version, dependencies) is in setup.cfg.
"""
import os
import os.path as osp
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = osp.dirname(osp.abspath(__file__))
PACKAGE = 'mmplugin_inline'
MIM_ITEMS = ('configs', 'tools', 'demo', 'model-index.yml')


def link_mim_extension(package_dir: str = osp.join(ROOT, PACKAGE)) -> None:
    """``<package_dir>/.mim/<item>`` as relative symlinks to the repository's items."""
    mim = osp.join(package_dir, '.mim')
    os.makedirs(mim, exist_ok=True)
    for item in MIM_ITEMS:
        src, dst = osp.join(ROOT, item), osp.join(mim, item)
        if not osp.exists(src):
            continue
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        os.symlink(osp.relpath(src, mim), dst)


def copy_mim_extension(package_dir: str) -> list:
    """Copy the items into ``<package_dir>/.mim/``; return the files copied."""
    mim = osp.join(package_dir, '.mim')
    if osp.lexists(mim):
        shutil.rmtree(mim) if osp.isdir(mim) and not osp.islink(mim) else os.remove(mim)
    os.makedirs(mim)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
    for item in MIM_ITEMS:
        src, dst = osp.join(ROOT, item), osp.join(mim, item)
        if osp.isdir(src):
            shutil.copytree(src, dst, ignore=ignore)
        elif osp.isfile(src):
            shutil.copy2(src, dst)
    return [osp.join(d, f) for d, _, files in os.walk(mim) for f in files]


class BuildPyWithMim(build_py):
    """build_py, then the mim extension: copied into the build, or linked for -e."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim_extension()
        else:
            self._mim_outputs = copy_mim_extension(osp.join(self.build_lib, PACKAGE))

    def get_outputs(self, *args, **kwargs):
        return super().get_outputs(*args, **kwargs) + getattr(self, '_mim_outputs', [])


if __name__ == '__main__':  # (also when pip's build backend runs this file)
    setup(cmdclass={'build_py': BuildPyWithMim})

"""Run a whole model exported to ONNX on images (``tools/deployment/onnx_inference.py``).

The work, and this tool's parser, are in :mod:`mmplugin_inline.deployment.runtime`, which
imports nothing but onnxruntime, numpy and OpenCV. The script loads that file by its
path, so it runs where torch, mmdet and mmseg are not installed; this module is the
in-package name of the same ``parse_args`` / ``main`` (tests, the manual's commands).
"""
from ..deployment.runtime import main, parse_args  # noqa: F401

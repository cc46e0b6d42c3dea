"""Necks for plain backbones."""
from .simple_fpn import SimpleFeaturePyramid

__all__ = ['SimpleFeaturePyramid']

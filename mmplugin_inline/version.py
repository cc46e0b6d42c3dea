"""Version of mmplugin_inline."""
__version__ = '0.1.0'

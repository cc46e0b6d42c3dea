"""Utilities that do not depend on the models: environment checks, the train / test
runner set-up, preflight (what the command-line tools share is ``mmplugin_inline.tools_common``)."""

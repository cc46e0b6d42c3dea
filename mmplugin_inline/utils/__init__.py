"""Utilities that do not depend on the models: the environment check (``env_check``).
What the command-line tools share is ``mmplugin_inline.tools_common``."""

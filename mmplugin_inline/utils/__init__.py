"""Utilities that do not depend on the models: environment checks, what the command-line
tools share (``tool_setup``)."""

"""Utilities that do not depend on the models: environment checks, run set-up, preflight."""

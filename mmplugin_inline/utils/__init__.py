"""Utilities that do not depend on the models: environment checks, safe loading."""

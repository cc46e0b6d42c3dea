"""Shared pieces of the test suite (not tests themselves): model shrinking, the authors'
reference fixtures, tool configs, tool runs and a loopback HTTP server."""

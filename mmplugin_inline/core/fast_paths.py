"""One switch between the fast paths and the reference paths they replace.

Every fast path of the package (the channels-last local residual, the grouped-product
kernel predictor, cached window masks, projecting before padding InLine windows, the
channels-last LePE) keeps the code it replaced beside it, and takes it while
:func:`reference_paths` is active. The tests compare the two, and
``tools/analysis_tools/benchmark_backbones.py --reference-paths`` races them in one
run, so that a speed-up is measured against what it replaced (timm's ``fused_attn``
switch, for the whole package).
"""
import contextlib
from typing import Iterator

_fast = True


def fast_paths_enabled() -> bool:
    """Whether the fast paths are in use (the default), not the reference ones."""
    return _fast


@contextlib.contextmanager
def reference_paths(enabled: bool = True) -> Iterator[None]:
    """Run the enclosed code on the reference paths (``enabled=False``: the fast ones).

    Not thread-safe: it sets a module-level switch, restored on exit.
    """
    global _fast
    previous, _fast = _fast, not enabled
    try:
        yield
    finally:
        _fast = previous

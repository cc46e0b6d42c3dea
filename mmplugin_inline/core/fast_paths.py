"""One switch between the fast paths and the reference paths they replace.

Two kernel-level choices stay switchable: the CPU library of the linear layers
(``core.matmul_backend``: oneDNN where it is the faster one) and the cache of window
masks built from sizes (``models.layers.window_attention.cached_mask``). Each keeps the
code it replaced beside it and takes it while :func:`reference_paths` is active (the
table is in ``core/README.md``). The tests compare the two, and
``tools/analysis_tools/benchmark_backbones.py --reference-paths`` races them in one
run, so that a speed-up is measured against what it replaced (timm's ``fused_attn``
switch, for the whole package). The other fast forms (the channels-last local residual,
the grouped-product kernel predictor, the channels-last LePE) replaced their old code in
the layers and are checked against ``core/reference.py`` and the tests.
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

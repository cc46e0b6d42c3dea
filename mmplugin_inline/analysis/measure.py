"""Timing and peak-memory measurement of a callable on CPU or CUDA: the one timing loop
(:func:`interleaved_times`), the one ``HxW`` size parser (:func:`parse_size`) and the one
skip rule (:func:`extrapolate`, :func:`over_budget`) of the benchmarks
(``analysis.model_benchmark``, ``backbone_benchmark``, ``attention_benchmark``,
``model_race``); their log-log plots are drawn by ``analysis.loglog``.
"""
import argparse
import ctypes
import ctypes.util
import gc
import math
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

# ---- The process's memory: glibc's allocator and the kernel's pages (CPU, Linux) -------
# The only code of the package that talks to libc (mallopt) or reads /proc/self/smaps.
# A benchmark needs it because a CPU call's time includes the page faults of the memory
# it allocates: with glibc's defaults, large freed blocks go back to the system and the
# next call faults fresh zeroed pages in again, a cost of the allocator, not of the code
# measured, and one that grows faster than the tensors; and with 4 KiB pages instead of
# 2 MiB ones, large maps pay TLB misses small ones do not. The benchmarks keep freed
# memory mapped (keep_freed_memory) and record whether huge pages are in use
# (huge_pages_in_use) and the faults per call (minor_page_faults).

# glibc's mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 1 << 30, trim_threshold: int = 1 << 31) -> bool:
    """Make glibc's malloc reuse freed memory instead of returning it to the system.

    By default glibc serves blocks above its mmap threshold (128 KiB, raised as blocks
    are freed, to at most 32 MiB) with fresh ``mmap`` pages and trims freed memory at
    the top of the heap, so a call that allocates a large tensor can pay a page fault
    per 4 KiB page for zeroed memory. That cost is not the measured code's and grows
    faster than the tensor. Raising the mmap and trim thresholds (what
    ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...``
    does at start-up) keeps the pages mapped. Returns whether it took effect (False off glibc).
    """
    name = ctypes.util.find_library('c')
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def huge_pages_in_use(numel: int = 4 << 20) -> bool:
    """Whether a fresh large CPU tensor lies in memory backed by transparent huge pages.

    torch puts its CPU blocks of 2 MiB and more on huge pages when the environment
    variable ``THP_MEM_ALLOC_ENABLE=1`` was set before it started (it reads it once),
    and the kernel allows it (``/sys/kernel/mm/transparent_hugepage/enabled`` is not
    ``never``). A working set of W bytes takes W / 4 KiB TLB entries and page faults
    with 4 KiB pages, W / 2 MiB with huge ones. Reads ``/proc/self/smaps``; False where
    that does not exist (not Linux).
    """
    x = torch.ones(numel)  # touched, so its pages exist
    addr = x.data_ptr()
    try:
        with open('/proc/self/smaps') as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if '-' in head and ':' not in head:  # a mapping's address range
                    start, end = (int(a, 16) for a in head.split('-'))
                    inside = start <= addr < end
                elif inside and head == 'AnonHugePages:':
                    return int(line.split()[1]) > 0
    except OSError:
        pass
    return False


def minor_page_faults() -> int:
    """Minor page faults of this process so far (first touches of fresh pages)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# ---- Timing and peak memory ----------------------------------------------------------
def synchronize(device) -> None:
    """Wait for queued CUDA work (no-op on CPU)."""
    if torch.device(device).type == 'cuda':
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], warmup: int, iters: int, device='cpu') -> List[float]:
    """Seconds of each of ``iters`` calls of ``fn()`` after ``warmup`` untimed calls
    (:func:`interleaved_times` with one call)."""
    return interleaved_times({'fn': fn}, iters, device, warmup=warmup).times['fn']


class SizeError(ValueError, argparse.ArgumentTypeError):
    """A size that is not ``HxW`` (or ``S``) of positive integers; as an
    ``ArgumentTypeError``, argparse shows its message for an option of ``type=parse_size``."""


def parse_size(text: str) -> Tuple[int, int]:
    """'HxW' -> (H, W); 'S' -> (S, S). The ``type`` of the benchmarks' size options.

    Raises:
        SizeError: for anything else (a ``ValueError``).
    """
    try:
        values = tuple(int(v) for v in str(text).lower().split('x'))
    except ValueError:
        values = ()
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or min(values) < 1:
        raise SizeError(f'sizes are HxW (or S for SxS), e.g. 1024x2048; got {text!r}')
    return values


@dataclass
class InterleavedTimes:
    """Seconds measured by :func:`interleaved_times`.

    Attributes:
        times: per call, its timed calls in round order; for a call in ``over_cap``, its
            first warm-up call only.
        reference: the reference call's time in each round (empty without one).
        over_cap: the calls whose first warm-up took longer than ``max_warmup_s``.
        counts: per call, the sum over its timed calls of what ``counter`` rose by
            (empty without a counter).
    """
    times: Dict[str, List[float]]
    reference: List[float] = field(default_factory=list)
    over_cap: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)


def interleaved_times(calls: Dict[str, Callable[[], object]], repeats: int, device='cpu',
                      reference: Optional[Callable[[], object]] = None, warmup: int = 1,
                      max_warmup_s: Optional[float] = None,
                      clock: Callable[[], float] = time.perf_counter,
                      counter: Optional[Callable[[], int]] = None,
                      rewarm: bool = False) -> InterleavedTimes:
    """Time several calls alternately, so that a change of machine load hits all alike.

    First ``warmup`` warm-up rounds: ``reference``, then each call in order; their times
    are not kept, except that a call whose first warm-up took longer than ``max_warmup_s``
    is not repeated: that warm-up is its one time (it is listed in ``over_cap``). Then
    ``repeats`` timed rounds, each timing ``reference`` (e.g. a large matrix product: the
    machine's rate in that round), then every remaining call, one after the other. Each
    call is timed alone, with queued CUDA work synchronised before and after.

    Args:
        calls: ``{name: fn}``; ``fn()`` is one measured call.
        repeats: timed rounds.
        device: where the calls queue their work ('cpu' or a CUDA device).
        reference: a call timed once per round beside ``calls`` (not capped).
        warmup: warm-up rounds before the timed ones.
        max_warmup_s: the cap on a call's first warm-up (so it needs ``warmup >= 1``),
            or None.
        clock: the timer (seconds).
        counter: read just before and after each timed call of ``calls`` (e.g.
            :func:`minor_page_faults`); the rises are summed per call into ``counts``.
        rewarm: run each call once more, untimed, right before each of its timed calls,
            so that it is timed with its own data as warm in the caches as it gets (not
            evicted by the calls before it).

    Returns:
        InterleavedTimes: the times per call, of the reference, and the calls over the cap.
    """
    if repeats < 1:
        raise ValueError(f'repeats must be at least 1, got {repeats}')

    def timed(fn, name=None):
        synchronize(device)
        before = counter() if counter is not None and name is not None else None
        start = clock()
        fn()
        synchronize(device)
        seconds = clock() - start
        if before is not None:
            result.counts[name] += counter() - before
        return seconds

    result = InterleavedTimes(times={name: [] for name in calls},
                              counts={name: 0 for name in calls} if counter else {})
    active = dict(calls)
    for i in range(warmup):
        if reference is not None:
            reference()
        for name, fn in list(active.items()):
            seconds = timed(fn)
            if i == 0 and max_warmup_s is not None and seconds > max_warmup_s:
                result.times[name].append(seconds)
                result.over_cap.append(name)
                del active[name]
    for _ in range(repeats):
        if reference is not None:
            result.reference.append(timed(reference))
        for name, fn in active.items():
            if rewarm:
                fn()
            result.times[name].append(timed(fn, name))
    return result


def extrapolate(points: Sequence[Tuple[float, float]], x: float, default_slope: float = 2.0,
                min_slope: float = 1.0) -> Optional[float]:
    """A cost at size ``x`` predicted from measured ``(size, cost)`` points (e.g. pixels,
    seconds): the line through the last two points on log-log axes, with a slope of at
    least ``min_slope``; ``default_slope`` when only one point (or one size) is known.
    None without points.
    """
    points = [(px, py) for px, py in points if py is not None and py > 0 and px > 0]
    if not points:
        return None
    last_x, last_y = points[-1]
    slope = default_slope
    if len(points) > 1 and points[-2][0] != last_x:
        prev_x, prev_y = points[-2]
        slope = max(min_slope, math.log(last_y / prev_y) / math.log(last_x / prev_x))
    return last_y * (x / last_x) ** slope


def over_budget(seconds: Optional[float], max_s: float, peak_mb: Optional[float] = None,
                max_mb: Optional[float] = None) -> Optional[str]:
    """Why a benchmark case is skipped, from its predicted call time (``seconds``, e.g.
    :func:`extrapolate`) and peak memory (MiB), against ``--max-call-s`` and
    ``--max-memory-gb`` (given in MiB); None when it is not (or nothing is predicted)."""
    if seconds is not None and seconds > max_s:
        return f'skipped: predicted {seconds:.0f} s a call > --max-call-s'
    if peak_mb is not None and max_mb is not None and peak_mb > max_mb:
        return f'skipped: predicted {peak_mb / 1024:.1f} GiB > --max-memory-gb'
    return None


def load_average() -> str:
    """The system's 1, 5 and 15-minute load averages as text ('unknown' where not known):
    how busy the machine was while a benchmark ran."""
    try:
        return ', '.join(f'{v:.1f}' for v in os.getloadavg())
    except (OSError, AttributeError):
        return 'unknown'


def peak_extra_memory(fn: Callable[[], object], device='cpu') -> int:
    """Peak bytes that tensors allocated during one call of ``fn()`` occupy at once.

    What was allocated before the call (weights, inputs) is not included. On CUDA:
    the allocator's peak over its level before the call. On CPU: torch's profiler
    (``profile_memory=True``) records each op's own allocations and frees; they are
    replayed in time order and the running maximum is taken. Memory outside torch's
    allocator (Python objects, libraries) is not counted on either device.
    """
    device = torch.device(device)
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile
    gc.collect()  # garbage of earlier work must not be freed (or counted) in the window
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    current = peak = 0
    for event in events:
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers."""
    return sum(t.numel() * t.element_size()
               for t in list(module.parameters()) + list(module.buffers()))

"""Which library runs the models' dense products (``nn.Linear``) on the CPU.

torch sends a CPU fp32 ``F.linear`` to its BLAS (MKL in the official wheels), which takes
its fast AVX-512 kernels on Intel processors only; oneDNN, torch's other CPU library (the
one behind its convolutions), does not make that distinction. The measured rates are in
``core/README.md`` and the benchmarks page; the backbone benchmark's ``--reference-paths``
races the two forms inside whole models.

:func:`linear` is ``F.linear`` with the product written as a 1x1 convolution over a
channels-last view of the tokens ([..., C] -> [1, C, N, 1], no copy), which torch
runs in oneDNN; the output comes back as a view as well. It is taken only where it
helps (:func:`onednn_linear_wanted`): a CPU fp32 tensor outside autocast, when the
library chosen is oneDNN, in eager mode (traced, scripted, compiled and exported graphs
keep ``F.linear``, the op their tools know), with the fast paths on
(:func:`~.fast_paths.reference_paths` restores ``F.linear`` everywhere). Autograd
differentiates the convolution as it is; the results equal ``F.linear``'s to fp32
rounding (tested forward and backward in fp64).

The library is decided once: when this module is imported, from the variable
``MMPLUGIN_INLINE_CPU_LINEAR`` ('auto' when unset), and again only by
:func:`set_cpu_linear_backend` (as timm's ``set_fused_attn``). On CUDA nothing changes:
cuBLAS runs ``F.linear``.
"""
import functools
import logging
import os
import platform
from typing import Optional

import torch
import torch.nn.functional as F

from .compat import is_exporting
from .fast_paths import fast_paths_enabled

#: environment variable that overrides the choice: 'onednn', 'blas' or 'auto' (default)
BACKEND_ENV = 'MMPLUGIN_INLINE_CPU_LINEAR'
BACKENDS = ('auto', 'onednn', 'blas')


def _cpu_vendor() -> str:
    """The x86 vendor string ('AuthenticAMD', 'GenuineIntel', ...), '' when unknown."""
    try:
        with open('/proc/cpuinfo', encoding='ascii', errors='replace') as f:
            for line in f:
                if line.startswith('vendor_id'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return ''


@functools.lru_cache(maxsize=None)
def _auto_backend() -> str:
    # oneDNN where MKL is known to leave AVX-512 unused (x86 processors not made by
    # Intel); elsewhere torch's own choice, which is MKL's home ground or not measured
    if not torch.backends.mkldnn.is_available():
        return 'blas'
    if platform.machine().lower() not in ('x86_64', 'amd64'):
        return 'blas'
    return 'onednn' if _cpu_vendor() == 'AuthenticAMD' else 'blas'


def set_cpu_linear_backend(name: str) -> str:
    """Choose the library of the CPU fp32 linear layers: 'onednn', 'blas', or 'auto'
    (oneDNN on AMD x86 processors, where MKL does not take its fast kernels; BLAS
    elsewhere).

    Returns the library now in use ('onednn' or 'blas'; 'blas' where this torch has no
    oneDNN) and logs it (``logging``, logger ``mmplugin_inline.core.matmul_backend``).

    Raises:
        ValueError: for another name, naming the accepted ones.
    """
    global _backend
    choice = str(name).strip().lower() or 'auto'
    if choice not in BACKENDS:
        raise ValueError(f'CPU linear library {name!r}: expected one of {", ".join(BACKENDS)} '
                         f'(set_cpu_linear_backend, or the variable {BACKEND_ENV} at import)')
    if choice == 'auto':
        library = _auto_backend()
    else:
        library = choice if torch.backends.mkldnn.is_available() else 'blas'
    _backend = library
    logging.getLogger(__name__).info('CPU linear layers: %s (%s asked)', library, choice)
    return library


def cpu_linear_backend() -> str:
    """'onednn' or 'blas': the library :func:`linear` uses for CPU fp32 products, as
    decided at import or by :func:`set_cpu_linear_backend`."""
    return _backend


def _in_graph_capture() -> bool:
    return (torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.compiler.is_compiling() or is_exporting())


def onednn_linear_wanted(x: torch.Tensor) -> bool:
    """Whether :func:`linear` takes the oneDNN form for input ``x`` (see the module)."""
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and x.dim() >= 2
            and fast_paths_enabled() and not torch.is_autocast_enabled('cpu')
            and not _in_graph_capture() and _backend == 'onednn')


def linear_as_conv(x: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as a 1x1 convolution on a channels-last view.

    ``x`` [..., Cin] is seen as a [1, Cin, N, 1] channels-last image (a view when its
    rows are contiguous) and the result [1, Cout, N, 1], channels-last as oneDNN returns
    it, is seen as [..., Cout]. Any device and dtype (the convolution decides where it
    runs); :func:`linear` calls it only where oneDNN runs it.
    """
    *lead, cin = x.shape
    cout = weight.shape[0]
    rows = x.reshape(1, -1, 1, cin).permute(0, 3, 1, 2)                 # [1, Cin, N, 1]
    # dilation has no effect on a 1x1 kernel; it is set because torch runs an undilated
    # 1x1 convolution with one thread and a batch under 16 in its own im2col + BLAS
    # path instead of oneDNN (measured: 3136 x 64 -> 512 at one thread, 2.0 ms either
    # way undilated, 0.87 ms dilated); with more threads it changes nothing
    out = F.conv2d(rows, weight.view(cout, cin, 1, 1), bias, dilation=2)
    return out.permute(0, 2, 3, 1).reshape(*lead, cout)


def linear(x: torch.Tensor, weight: torch.Tensor,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear``, in oneDNN for CPU fp32 tensors where that is faster (see the module)."""
    if onednn_linear_wanted(x) and x.shape[-1] == weight.shape[-1]:
        return linear_as_conv(x, weight, bias)
    return F.linear(x, weight, bias)


_backend = 'blas'
try:
    set_cpu_linear_backend(os.environ.get(BACKEND_ENV, 'auto'))
except ValueError as exc:  # the variable's name in the message, not the setter's
    raise ValueError(f'{BACKEND_ENV}={os.environ[BACKEND_ENV]!r}: expected one of '
                     f'{", ".join(BACKENDS)}') from exc

"""The dynamic depthwise local residual of InLine attention.

V, laid out as an image, is convolved with a 3x3 depthwise kernel that differs for
every sample and channel (predicted elsewhere from the mean token). Zero padding.

Three forms of the same convolution (``core/README.md``, "Local residual"):

- :func:`local_residual_nhwc`, the fast one the models use: tokens stay in their own
  channels-last layout ([B, H, W, C], a view of the value projection), the batch is
  folded into the channels, and one depthwise convolution runs on channels-last memory;
- :func:`local_residual`, the same on an NCHW map (``groups = B*C`` on ``[1, B*C, H, W]``);
- :func:`local_residual_reference`, a loop over samples (the check of both);

and :func:`local_residual_taps` / :func:`depthwise_conv_taps`, the convolution written
as its shifted multiply-adds, for graph exporters that cannot give a convolution a
size-dependent group count (:func:`local_residual_nhwc` takes the first while
``torch.export`` traces it).
"""
import torch
import torch.nn.functional as F

from .compat import is_exporting


def _check_weights(shape, weights: torch.Tensor, v_shape) -> None:
    if weights.shape != shape:
        b, c = shape[:2]
        raise ValueError(f'weights must be [B, C, 3, 3] = [{b}, {c}, 3, 3] for v_map of shape '
                         f'{tuple(v_shape)}, got {tuple(weights.shape)}')


def local_residual(v_map: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample depthwise 3x3 convolution of an NCHW map.

    Args:
        v_map (Tensor): values as an image, [B, C, H, W] (any H, W).
        weights (Tensor): one 3x3 kernel per sample and channel, [B, C, 3, 3].

    Returns:
        Tensor: [B, C, H, W].
    """
    b, c, h, w = v_map.shape
    _check_weights((b, c, 3, 3), weights, v_map.shape)
    # one group per (sample, channel): a batched depthwise conv in a single call
    out = F.conv2d(v_map.reshape(1, b * c, h, w), weights.reshape(b * c, 1, 3, 3).to(v_map.dtype),
                   padding=1, groups=b * c)
    return out.view(b, c, h, w)


def local_residual_nhwc(v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-sample depthwise 3x3 convolution of a channels-last map (the models' fast path).

    The values arrive as tokens, so channels-last is their own layout: the batch is
    folded into the channels (``[H, W, B*C]``, a view when B = 1) and one depthwise
    convolution runs on channels-last memory. On the CPU, oneDNN's channels-last
    depthwise kernel is faster than the NCHW grouped one, which also needs the tokens
    transposed into NCHW first (figures in the benchmarks page; the backbone benchmark's
    ``--reference-paths`` races the two inside whole models); cuDNN has NHWC depthwise
    kernels as well, and the layout copies it saves are the same on the GPU.

    Args:
        v (Tensor): values as a channels-last image, [B, H, W, C] (any strides, e.g. a
            view of the ``qkv`` projection's output).
        weights (Tensor): one 3x3 kernel per sample and channel, [B, C, 3, 3].

    Returns:
        Tensor: [B, H, W, C] (a view of channels-last memory, not always contiguous).
    """
    b, h, w, c = v.shape
    _check_weights((b, c, 3, 3), weights, v.shape)
    if is_exporting():
        # B*C groups are a symbolic count in a dynamic-batch export, which ONNX Conv
        # cannot take: the taps form, written on the tokens' own layout
        return local_residual_taps(v, weights)
    x = v.permute(1, 2, 0, 3).reshape(1, h, w, b * c).permute(0, 3, 1, 2)  # [1, B*C, H, W]
    x = x.contiguous(memory_format=torch.channels_last)
    out = F.conv2d(x, weights.reshape(b * c, 1, 3, 3).to(v.dtype), padding=1, groups=b * c)
    # whatever layout the backend returned, this is the same values as [B, H, W, C]
    return out.permute(0, 2, 3, 1).reshape(h, w, b, c).permute(2, 0, 1, 3)


def local_residual_taps(v: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`local_residual_nhwc` as the sum of its nine shifted multiply-adds.

    Only pads, slices, products and sums (what a graph exporter can write for any batch;
    slower than the convolution in eager mode).

    Args:
        v (Tensor): [B, H, W, C].
        weights (Tensor): [B, C, 3, 3].

    Returns:
        Tensor: [B, H, W, C].
    """
    b, h, w, c = v.shape
    _check_weights((b, c, 3, 3), weights, v.shape)
    padded = F.pad(v, (0, 0, 1, 1, 1, 1))                                # [B, H+2, W+2, C]
    taps = weights.to(v.dtype).permute(0, 2, 3, 1)                       # [B, 3, 3, C]
    return _sum_of_taps(padded, lambda i, j: taps[:, i:i + 1, j:j + 1], (h, w), (3, 3), 1)


def _sum_of_taps(padded, tap, out_hw, kernel_hw, h_dim):
    """``sum_ij padded[..., i:i+H, j:j+W, ...] * tap(i, j)``, the spatial dims at
    ``h_dim`` and ``h_dim + 1``: a stride-1 convolution as slices, products and sums."""
    out = None
    for i in range(kernel_hw[0]):
        for j in range(kernel_hw[1]):
            window = padded.narrow(h_dim, i, out_hw[0]).narrow(h_dim + 1, j, out_hw[1])
            term = window * tap(i, j)
            out = term if out is None else out + term
    return out


def depthwise_conv_taps(x: torch.Tensor, weight: torch.Tensor, padding=(1, 1)) -> torch.Tensor:
    """A stride-1 depthwise convolution of an NCHW map as the sum of its kernel taps.

    ``out = sum_ij pad(x)[:, :, i:i+H', j:j+W'] * weight[:, 0, i, j]``: only slices,
    products and sums, so an exporter can write it for any group count (ONNX ``Conv``
    takes a constant ``group``). Equal to ``F.conv2d(x, weight, padding=padding,
    groups=C)``.

    Args:
        x (Tensor): [N, C, H, W].
        weight (Tensor): [C, 1, kh, kw].
        padding (tuple[int, int]): zero padding (ph, pw). Default: (1, 1).

    Returns:
        Tensor: [N, C, H + 2 ph - kh + 1, W + 2 pw - kw + 1].
    """
    kh, kw = weight.shape[2], weight.shape[3]
    ph, pw = padding
    padded = F.pad(x, (pw, pw, ph, ph))
    h, w = padded.shape[2] - kh + 1, padded.shape[3] - kw + 1
    return _sum_of_taps(padded, lambda i, j: weight[:, 0, i, j].view(1, -1, 1, 1), (h, w),
                        (kh, kw), 2)


def local_residual_reference(v_map: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The same convolution as a loop over samples (the check of :func:`local_residual`)."""
    return torch.cat([
        F.conv2d(v_map[i:i + 1], weights[i].unsqueeze(1), padding=1, groups=v_map.shape[1])
        for i in range(v_map.shape[0])
    ])

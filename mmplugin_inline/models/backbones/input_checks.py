"""The checks of a backbone's input and of its intermediate values (``check_finite``),
with messages that say what to change."""
import torch


def check_input(name: str, in_channels: int, x) -> None:
    """``x`` must be a non-empty float batch ``[B, in_channels, H, W]`` (``name``: the
    backbone's, for the message). Reads only metadata."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{name} takes a tensor [B, {in_channels}, H, W], got '
                        f'{type(x).__name__}: stack the images into one float tensor (the '
                        "model's data preprocessor does this)")
    if x.dim() != 4:
        raise ValueError(f'{name} takes a 4-D batch [B, {in_channels}, H, W], got shape '
                         f'{tuple(x.shape)}' + (': add the batch dimension (x[None])'
                                                if x.dim() == 3 else ''))
    if x.shape[1] != in_channels:
        raise ValueError(f'{name} was built with in_channels={in_channels} (input '
                         f'[B, {in_channels}, H, W]) but the input has {x.shape[1]} '
                         f'channels (shape {tuple(x.shape)}): set '
                         f'in_channels={x.shape[1]} in the backbone config, or give '
                         f'{in_channels}-channel images')
    if not x.is_floating_point():
        raise TypeError(f'{name} takes floating-point images, got a {x.dtype} tensor: convert '
                        'it (x.float(), normalised as in training), or let the model\'s data '
                        'preprocessor (DetDataPreprocessor / SegDataPreprocessor) do it')
    if x.numel() == 0:
        raise ValueError(f'{name} got an empty input of shape {tuple(x.shape)}: '
                         + ('the batch holds no images; skip empty batches or check the data '
                            'loader (e.g. all images filtered out)' if x.shape[0] == 0 else
                            'an image with no pixels; check the resizing / cropping'))


def check_finite(name: str, x: torch.Tensor, stage: int, unit: str = 'stage') -> None:
    """Raise when ``x`` holds NaN / Inf, naming where they first appeared (``stage`` -1:
    the input, 0: the stem / patch embedding, k: ``unit`` k). Reads every value."""
    if torch.isfinite(x).all():
        return
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    counts = f'{nan} NaN and {inf} Inf of {x.numel()} values'
    if stage < 0:
        raise FloatingPointError(
            f'{name} (check_finite=True): the input holds non-finite values ({counts}): '
            'check the images and the data pipeline (e.g. a normalisation std of 0, or a '
            'corrupt image file)')
    where = 'the stem (patch embedding)' if stage == 0 else f'{unit} {stage}'
    before = 'the input was' if stage == 0 else 'the input and the earlier layers were'
    raise FloatingPointError(
        f'{name} (check_finite=True): non-finite values first appear in {where} ({counts}); '
        f'{before} finite. Usual causes: weights that diverged (lower the learning rate, '
        'clip gradients, check the loaded checkpoint) or fp16 overflow (train in fp32 or '
        'bf16)')

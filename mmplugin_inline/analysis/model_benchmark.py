"""Inference speed (images/s) and peak memory of an mmdet / mmseg model on random
batches; the tool is ``tools/analysis_tools/benchmark.py``
(:mod:`mmplugin_inline.cli.benchmark`), whose docstring says how they are measured.
"""
import statistics
from typing import Optional, Sequence

MODES = ('predict', 'tensor')


def benchmark(config, shape: Optional[Sequence[int]] = None, batch: int = 1, warmup: int = 5,
              iters: int = 20, device: str = 'cpu', mode: str = 'predict',
              cfg_options: Optional[dict] = None, model=None) -> dict:
    """Time ``iters`` inference iterations of the model of ``config`` and measure memory.

    Args:
        config: an mmdet / mmseg config (path, Config or dict).
        shape (Sequence[int], optional): (H, W) or (S,); defaults to 800 x 1333 for mmdet
            and 512 x 512 for mmseg.
        batch (int): images per iteration. Default: 1.
        warmup (int): untimed iterations first. Default: 5.
        iters (int): timed iterations. Default: 20.
        device (str): 'cpu' or 'cuda' (or 'cuda:N'). Default: 'cpu'.
        mode (str): 'predict' (with post-processing) or 'tensor'. Default: 'predict'.
        cfg_options (dict, optional): overrides merged into the config.
        model (nn.Module, optional): an already built model of this config.

    Returns:
        dict: ``codebase``, ``shape``, ``input_shape`` (after the preprocessor, C H W),
        ``batch``, ``device``, ``mode``, ``threads`` (CPU), ``times`` (s per iteration),
        ``images_per_s``, ``ms_per_image`` (median), ``peak_extra_mb`` and ``weights_mb``.
    """
    import torch

    from ..tools_common import fail
    from .measure import peak_extra_memory, tensor_bytes, time_calls
    from .model_and_batch import config_model_and_shape, dummy_data_batch
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    if batch < 1 or iters < 1 or warmup < 0:
        raise ValueError(f'need batch >= 1, iters >= 1, warmup >= 0; got {batch}, {iters}, '
                         f'{warmup}')
    if torch.device(device).type == 'cuda' and not torch.cuda.is_available():
        fail(f'--device {device} asked for, but CUDA is not available here')
    cfg, codebase, shape, model = config_model_and_shape(config, shape, device, cfg_options, model)

    def one_iteration():
        # a fresh batch each time: predict writes its results into the data samples
        data = dummy_data_batch(codebase, shape, batch)
        with torch.no_grad():
            if mode == 'predict':
                return model.test_step(data)
            data = model.data_preprocessor(data, False)
            return model(**data, mode='tensor')

    with torch.no_grad():
        processed = model.data_preprocessor(dummy_data_batch(codebase, shape, 1), False)
    times = time_calls(one_iteration, warmup, iters, device)
    peak = peak_extra_memory(one_iteration, device)
    return dict(codebase=codebase, shape=shape, input_shape=tuple(processed['inputs'].shape[1:]),
                batch=batch, device=str(device), mode=mode, threads=torch.get_num_threads(),
                times=times, images_per_s=batch * len(times) / sum(times),
                ms_per_image=1000 * statistics.median(times) / batch,
                peak_extra_mb=peak / 2 ** 20, weights_mb=tensor_bytes(model) / 2 ** 20)


def format_report(result: dict, config_name: str = '') -> str:
    """The lines the tool prints."""
    h, w = result['shape']
    c, ph, pw = result['input_shape']
    where = result['device'] + (f' ({result["threads"]} threads)'
                                if result['device'].startswith('cpu') else '')
    lines = ['=' * 72]
    if config_name:
        lines.append(f'Config: {config_name} ({result["codebase"]})')
    shape_line = f'Input: batch {result["batch"]} x 3 x {h} x {w}'
    if (ph, pw) != (h, w):
        shape_line += f' (padded by the data preprocessor to {ph} x {pw})'
    memory_source = ('CUDA allocator peak' if result['device'].startswith('cuda') else
                     'torch profiler, per-op allocations replayed')
    lines += [
        shape_line,
        f'Device: {where}; mode: {result["mode"]}; {len(result["times"])} timed iterations '
        'after warm-up',
        f'Throughput: {result["images_per_s"]:.2f} images/s '
        f'(median {result["ms_per_image"]:.1f} ms per image)',
        f'Peak memory: {result["peak_extra_mb"]:.1f} MiB allocated during one iteration on top '
        f'of {result["weights_mb"]:.1f} MiB of weights ({memory_source})',
        '=' * 72]
    return '\n'.join(lines)

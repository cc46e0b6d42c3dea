"""Parameters and FLOPs (multiply-accumulates) of an mmdet / mmseg model and of its
backbone, traced on one dummy image; the tool is ``tools/analysis_tools/get_flops.py``
(:mod:`mmplugin_inline.cli.get_flops`), whose docstring says how the counts are made.
"""
from functools import partial
from typing import Optional, Sequence

MAC_NOTE = ('FLOPs are counted as multiply-accumulates (one fused multiply-add = 1 FLOP), '
            'the mmengine / fvcore convention used in the papers\' tables; element-wise ops '
            '(additions, activations, softmax) are not counted.')


def get_flops(config, shape: Optional[Sequence[int]] = None, cfg_options: Optional[dict] = None,
              backbone_only: bool = False, device: str = 'cpu', model=None) -> dict:
    """Count the model of ``config`` (a path, Config or dict) on one H x W dummy image.

    Args:
        config: the mmdet / mmseg config.
        shape (Sequence[int], optional): (H, W) or (S,); defaults to 800 x 1333 for
            mmdet and 512 x 512 for mmseg.
        cfg_options (dict, optional): overrides merged into the config.
        backbone_only (bool): trace only ``model.backbone`` (faster; no whole-model row).
        device (str): where to trace. Default: 'cpu'.
        model (nn.Module, optional): an already built model of this config (skips building).

    Returns:
        dict: ``codebase``, ``model_type``, ``shape`` (requested H, W), ``input_shape``
        (after the data preprocessor: C, H, W), ``rows`` = [(name, params, flops)] with
        'model' (unless ``backbone_only``), then 'backbone' and the other top-level
        modules, ``unknown_ops`` (ops with no handler: not counted) and
        ``uncounted_ops`` (element-wise ops, not counted by convention) and
        ``analyzer`` (the mmengine FlopAnalyzer, for breakdowns).
    """
    import torch

    from .complexity import count_module
    from .model_and_batch import config_model_and_shape, preprocess_dummy
    cfg, codebase, shape, model = config_model_and_shape(config, shape, device, cfg_options, model)
    data = preprocess_dummy(model, codebase, shape)
    inputs = data['inputs']
    result = dict(codebase=codebase, model_type=cfg.model.get('type'), shape=shape,
                  input_shape=tuple(inputs.shape[1:]), rows=[])
    if backbone_only:
        counted = count_module(model.backbone, inputs)
        result['rows'].append(('backbone', counted['params'], counted['flops']))
    else:
        children = [name for name, _ in model.named_children() if name != 'data_preprocessor']
        had_own_forward = 'forward' in vars(model)
        plain_forward = model.forward
        # the tensor forward with the data samples bound, as mmdet's / mmseg's tools do
        model.forward = partial(plain_forward, data_samples=data['data_samples'], mode='tensor')
        try:
            with torch.no_grad():
                counted = count_module(model, inputs, submodules=children)
        finally:
            if had_own_forward:
                model.forward = plain_forward
            else:
                del model.forward  # back to the class's forward
        result['rows'].append(('model', counted['params'], counted['flops']))
        for name in children:
            params_flops = counted['sub'].get(name)
            if params_flops is not None:
                result['rows'].append((name, params_flops[1], params_flops[0]))
    result.update(unknown_ops=counted['unknown_ops'], uncounted_ops=counted['uncounted_ops'],
                  analyzer=counted['analyzer'])
    return result


def format_report(result: dict, config_name: str = '') -> str:
    """The table printed by the tool: params (M) and FLOPs (G) per row, the shapes, notes."""
    from .complexity import format_count
    h, w = result['shape']
    c, ph, pw = result['input_shape']
    lines = ['=' * 72]
    if config_name:
        lines.append(f'Config: {config_name} ({result["codebase"]}, {result["model_type"]})')
    shape_line = f'Input shape: {c} x {h} x {w} (H x W = {h} x {w})'
    if (ph, pw) != (h, w):
        shape_line += f'; padded by the data preprocessor to {c} x {ph} x {pw}'
    lines += [shape_line, '', f'| {"module":<16} | {"params (M)":>10} | {"FLOPs (G)":>10} |',
              f'|{"-" * 18}|{"-" * 12}|{"-" * 12}|']
    for name, params, flops in result['rows']:
        lines.append(f'| {name:<16} | {format_count(params, 1e6):>10} | '
                     f'{format_count(flops):>10} |')
    lines += ['', MAC_NOTE]
    uncounted = result.get('uncounted_ops', {})
    if uncounted:
        from .complexity import UNCOUNTED_SAMPLING_OPS
        sampling = [f'{op.split(".")[-1]} x{n}' for op, n in sorted(uncounted.items())
                    if op in UNCOUNTED_SAMPLING_OPS]
        plain = sum(n for op, n in uncounted.items() if op not in UNCOUNTED_SAMPLING_OPS)
        lines.append(f'Not counted by convention: {plain} element-wise / bookkeeping op calls'
                     + (f'; {", ".join(sampling)} (as mmdet\'s get_flops)' if sampling else ''))
    if result['unknown_ops']:
        ops = ', '.join(f'{op} x{n}' for op, n in sorted(result['unknown_ops'].items()))
        lines.append(f'WARNING: ops with no FLOP handler, NOT counted: {ops}')
    else:
        lines.append('Every matmul / conv / attention op of the trace was counted.')
    lines.append('=' * 72)
    return '\n'.join(lines)

"""Analysis behind ``tools/analysis_tools`` and ``demo``: complexity counts with attention
handlers (``complexity``, ``flops``), timing / memory measurement (``measure``: the one
interleaved timing loop, size parser and skip rule; ``loglog``: the plots), the model
and dummy batch of any mmdet or mmseg config (``model_and_batch``), the benchmarks
(``model_benchmark``, ``backbone_benchmark``, ``attention_benchmark``, the whole-model
race ``model_race``) and the reader of a run's ``scalars.json`` (``scalars``).
Imports mmengine (and mmdet / mmseg lazily), unlike ``core``.
"""
from .complexity import (
                       EXTRA_FLOP_HANDLES,
                       FLOP_HANDLES,
                       UNCOUNTED_ELEMENTWISE_OPS,
                       UNCOUNTED_OPS,
                       UNCOUNTED_SAMPLING_OPS,
                       ZERO_COST_OPS,
                       InLineFlopAnalyzer,
                       baddbmm_flop_jit,
                       count_module,
                       flop_analyzer,
                       format_count,
                       module_table,
                       sdpa_flop_jit,
                       unknown_ops,
)
from .measure import (
                       InterleavedTimes,
                       extrapolate,
                       huge_pages_in_use,
                       interleaved_times,
                       keep_freed_memory,
                       load_average,
                       minor_page_faults,
                       peak_extra_memory,
                       tensor_bytes,
                       time_calls,
)
from .model_and_batch import (
                       DEFAULT_SHAPES,
                       build_model,
                       dummy_data_batch,
                       dummy_train_batch,
                       parse_shape,
                       preprocess_dummy,
)

__all__ = [
    'DEFAULT_SHAPES', 'build_model', 'dummy_data_batch', 'dummy_train_batch', 'parse_shape',
    'preprocess_dummy',
    'EXTRA_FLOP_HANDLES', 'FLOP_HANDLES', 'InLineFlopAnalyzer', 'UNCOUNTED_ELEMENTWISE_OPS',
    'UNCOUNTED_OPS', 'UNCOUNTED_SAMPLING_OPS',
    'ZERO_COST_OPS', 'baddbmm_flop_jit',
    'count_module', 'flop_analyzer', 'format_count', 'module_table', 'sdpa_flop_jit',
    'unknown_ops', 'InterleavedTimes', 'extrapolate', 'huge_pages_in_use', 'interleaved_times',
    'keep_freed_memory', 'load_average', 'minor_page_faults', 'peak_extra_memory',
    'tensor_bytes', 'time_calls'
]

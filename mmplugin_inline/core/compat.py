"""What differs between the torch releases the plugin supports (setup.cfg states the range).

``torch.compiler.is_exporting`` is documented from torch 2.7; the forward passes ask it
(exported graphs take a few export-friendly forms). On older torch :func:`is_exporting`
answers with ``torch.compiler.is_compiling()``, which is true under ``torch.export`` there
(it traces with dynamo) and also under ``torch.compile``, where the export-friendly forms
give the same values.
"""
import torch

_IS_EXPORTING = getattr(torch.compiler, 'is_exporting', None)


def is_exporting() -> bool:
    """Whether the code runs inside a graph export (``torch.export``, the dynamo ONNX
    exporter); on torch before 2.7, whether it runs inside any dynamo capture."""
    if _IS_EXPORTING is not None:
        return _IS_EXPORTING()
    return torch.compiler.is_compiling()

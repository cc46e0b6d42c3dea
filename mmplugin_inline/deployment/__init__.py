"""Deployment: ONNX export (``onnx``; a detector's whole prediction path: ``detector``,
``detector_ops``), the module to export of a config (``build``), verification with
onnxruntime (``verify``, ``detector_check``), the preprocessing record (``metadata``) and
the torch-free runtime (``runtime``, ``coco_eval``)."""

"""Deployment: ONNX export and its verification with onnxruntime (``onnx``)."""

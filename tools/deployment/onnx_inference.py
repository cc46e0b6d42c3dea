"""Run a whole model exported by pytorch2onnx.py on images with onnxruntime, numpy and
OpenCV only (no torch, mmdet or mmseg); see ``mmplugin_inline/deployment/runtime.py``.

    python tools/deployment/onnx_inference.py MODEL.onnx IMAGE_OR_DIR --out-dir DIR

The runtime module is loaded by its file path: importing the ``mmplugin_inline`` package
would import torch.
"""
import importlib.util
import os.path as osp


def _runtime():
    here = osp.dirname(osp.abspath(__file__))
    spec = importlib.util.find_spec('mmplugin_inline')  # finds, does not import
    roots = list(spec.submodule_search_locations or []) if spec else []
    # the repository (tools/deployment/ -> ../../mmplugin_inline), or the installed package
    candidates = [osp.join(here, '..', '..', 'mmplugin_inline')] + roots
    for root in candidates:
        path = osp.join(root, 'deployment', 'runtime.py')
        if osp.isfile(path):
            module_spec = importlib.util.spec_from_file_location('_onnx_runtime', path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
            return module
    raise SystemExit('onnx_inference.py: mmplugin_inline/deployment/runtime.py not found')


if __name__ == '__main__':
    raise SystemExit(_runtime().main())

"""Export an InLine backbone, a whole mmseg segmentor or a whole mmdet detector to ONNX, and
verify the file with onnxruntime; see ``mmplugin_inline/cli/pytorch2onnx.py`` for the
options and ``mmplugin_inline/deployment/onnx.py`` for how."""
from mmplugin_inline.cli.pytorch2onnx import main

if __name__ == '__main__':
    raise SystemExit(main())

"""COCO mAP of a whole detector's ONNX file through onnxruntime; see
``mmplugin_inline/cli/onnx_coco_eval.py``."""
from mmplugin_inline.cli.onnx_coco_eval import main

if __name__ == '__main__':
    raise SystemExit(main())

"""The module to export of a config: the backbone, the segmentor in tensor mode (or its
label map), or a two-stage detector's whole prediction path."""
from .onnx import segmentor_labels, segmentor_tensor_mode


def build_export_module(cfg, codebase: str, backbone_only: bool, checkpoint=None,
                        allow_unsafe: bool = False, with_argmax: bool = False):
    """The module to export and the model it comes from: the backbone, the segmentor in
    tensor mode (its label map with ``with_argmax``), or a two-stage detector's whole
    prediction path (:class:`~.detector.TwoStageDetectorGraph`)."""
    from ..analysis import build_model
    if with_argmax and (backbone_only or codebase != 'mmseg'):
        raise ValueError('--with-argmax is for whole mmseg segmentors (not with --backbone-only '
                         f'or an {codebase} config)')
    model = build_model(cfg)
    if checkpoint is not None:
        from mmengine.runner import load_checkpoint

        from ..weights import mmengine_checkpoint_loading
        with mmengine_checkpoint_loading(allow_unsafe):
            load_checkpoint(model, checkpoint, map_location='cpu')
    model.eval()
    if backbone_only:
        return model.backbone.eval(), model
    if codebase == 'mmdet':
        from .detector import detector_graph
        return detector_graph(model).eval(), model
    if with_argmax:
        return segmentor_labels(model).eval(), model
    return segmentor_tensor_mode(model).eval(), model

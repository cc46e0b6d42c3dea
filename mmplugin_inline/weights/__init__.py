"""How every checkpoint file of the plugin is read: one policy, one package.

Two kinds of file, two rules:

* **Third-party weights** (the InLine authors' released files, a converted backbone,
  anything named by ``init_cfg=dict(type='Pretrained', checkpoint=...)`` or given to the
  converter) are read *as data only* (:func:`load_weights`, :mod:`.data_only`). Tensors
  and plain containers are rebuilt; every other object the file names (a yacs
  ``CfgNode``, an ``argparse.Namespace``, an optimizer's classes, ``os.system`` in a
  malicious file, ...) becomes an inert :class:`SetAside` placeholder
  (:mod:`.set_aside`). Nothing named in the file is imported or called, so the authors'
  training-format files (``{'model', 'optimizer', 'lr_scheduler', 'max_accuracy',
  'epoch', 'config'}``) load without yacs and without an opt-in.
* **The run's own mmengine checkpoints** (``--resume``, ``load_from``,
  ``tools/test.py``) are read with ``torch.load(weights_only=True)`` and an exact
  allow-list of what mmengine saves (:func:`mmengine_checkpoint_globals`,
  :mod:`.run_checkpoints`). Importing the package registers that allow-list with torch
  (:func:`register_mmengine_safe_globals`), so mmdet's and mmseg's own ``tools/train.py``
  resume plugin runs under torch >= 2.6. A file that needs more is refused
  (:class:`UnsafeCheckpointError`).

Full unpickling, which runs code from the file, happens only on the explicit opt-in
``allow_unsafe=True`` (``--allow-unsafe``). Before either rule, a damaged file (empty,
truncated, a web page saved under a ``.pth`` name) gets its own error
(:class:`DamagedCheckpointError`, :mod:`.files`), which never suggests ``allow_unsafe``.
So does any corruption found later: the file's pickle is first walked with nothing rebuilt
(:mod:`.pickle_walk`: a malformed pickle, a storage larger than its record; and
:mod:`.global_names`: a global that does not exist here, :func:`absent_global`), and any
exception while torch reads it is damage. ``http(s)://`` names are downloaded once into
the cache (:func:`cached_file`, :mod:`.download`). The errors are in :mod:`.errors`.

:mod:`.convert` turns a released checkpoint into a backbone's state dict: the generic
part (layouts, detecting the family, depths, the report); each family's own renames and
resizing are its backbone's ``checkpoint_filter`` hook.

What these checks need of torch's private API is read in one module,
:mod:`.torch_private`, which raises :class:`TorchInternalsChanged` when a torch release
changes it.

The modules import one way: errors <- files <- download; torch_private <- set_aside <-
pickle_walk, global_names; run_checkpoints <- data_only <- convert.
"""
from .convert import (
                      convert_checkpoint,
                      convert_state_dict,
                      depth_differences,
                      detect_family,
                      dropped_entries,
                      family_class,
                      family_signatures,
                      load_pretrained,
                      rename_keys,
                      split_checkpoint,
                      unwrap_state_dict,
)
from .data_only import load_weights
from .download import cache_dir, cached_file, is_url, probe_url, url_file_name
from .errors import (
                      CheckpointDownloadError,
                      CheckpointError,
                      DamagedCheckpointError,
                      UnsafeCheckpointError,
)
from .files import (
                      check_checkpoint_file,
                      damage_of,
                      published_sha256,
                      sha256_of,
                      verify_published_file,
)
from .global_names import absent_global
from .run_checkpoints import (
                      history_buffer_getattr,
                      load_run_checkpoint,
                      mmengine_checkpoint_globals,
                      mmengine_checkpoint_loading,
                      register_mmengine_safe_globals,
)
from .set_aside import SetAside
from .torch_private import TorchInternalsChanged

__all__ = [
    'CheckpointError', 'DamagedCheckpointError', 'UnsafeCheckpointError',
    'CheckpointDownloadError', 'TorchInternalsChanged', 'SetAside', 'load_weights',
    'load_run_checkpoint',
    'cached_file', 'cache_dir', 'url_file_name', 'probe_url', 'is_url',
    'mmengine_checkpoint_globals', 'register_mmengine_safe_globals',
    'mmengine_checkpoint_loading', 'check_checkpoint_file',
    'absent_global', 'published_sha256', 'sha256_of', 'verify_published_file', 'damage_of',
    'history_buffer_getattr', 'convert_checkpoint', 'convert_state_dict',
    'depth_differences', 'detect_family', 'dropped_entries', 'family_class',
    'family_signatures', 'load_pretrained', 'rename_keys', 'split_checkpoint',
    'unwrap_state_dict',
]

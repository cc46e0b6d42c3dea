"""Build our backbones from the reference fixtures' arch dicts (authors' argument names)."""
import os

import torch

import mmplugin_inline  # noqa: F401  (registers the families)
from mmplugin_inline.registry import registered_families

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data',
                    'reference')
# the fixtures are named after the released files: inline_<family>_mini.pt
_BY_FIXTURE_NAME = {cls.short_name.replace('inline_', '', 1): cls
                    for cls in registered_families().values()}
FAMILIES = tuple(sorted(_BY_FIXTURE_NAME))


def load_fixture(family):
    return torch.load(os.path.join(DATA, f'inline_{family}_mini.pt'), weights_only=True)


def backbone_cfg(family, arch, **overrides):
    """Our backbone config equivalent to the authors' constructor arguments ``arch``."""
    cls = _BY_FIXTURE_NAME[family]
    cfg = dict(type=cls.__name__, **cls.config_from_authors_args(arch))
    if 'out_blocks' in arch:  # the blocks whose outputs the fixture recorded (DeiT)
        cfg.update(out_indices=arch['out_blocks'])
    cfg.update(drop_path_rate=0.0)
    cfg.update(overrides)
    return cfg

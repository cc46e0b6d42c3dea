"""Reading the plugin's own files of release 0.1: the one legacy-key upgrade.

Release 0.1 kept the mixer outside the module tree (its parameters registered on the
attention layer: ``attn.residual.*``) and each family named its stages its own way
(``block1``, ``layers.0.blocks``, ``stage1``, ``blocks.0``, output norms ``norm0``). Today
every module is in the tree (``attn.mixer.residual.*``) and a backbone is a list of
stages (``stages.<i>.<downsample|cls_token|pos_embed|blocks|norm>``). Each family declares
its renames (``legacy_renames``); :meth:`InLineBackbone.upgrade_legacy_keys` applies them
together with :data:`MIXER_RENAMES`, on every ``load_state_dict`` and in each family's
``checkpoint_filter``. Keys that are new already are left as they are. Resuming a run
from such a file also needs its optimizer state in today's parameter order:
:mod:`mmplugin_inline.engine.legacy_resume`.
"""
import re

#: the key renames every family shares from the plugin's release 0.1 (and the authors'
#: files) to the module tree of today: the mixer is a registered child of its layer
MIXER_RENAMES = [(r'(?<!\.mixer)\.residual\.(\d+)\.', r'.mixer.residual.\1.')]


def stage_renames(renames) -> list:
    """``(regex, template)`` pairs as renames for ``rename_keys``: the template may
    write the regex's first group (a number) as ``{n}``, or shifted, ``{prev}`` (n - 1) and
    ``{next}`` (n + 1): release 0.1 counted some stages from 1 (``block1``) and put the
    downsampling after a stage (Swin's ``layers.0.downsample``)."""
    def rename(template):
        def repl(m):
            n = int(m.group(1)) if m.re.groups and m.group(1).isdigit() else 0
            return m.expand(template.format(n=n, prev=n - 1, next=n + 1))
        return repl
    return [(re.compile(pattern), rename(template)) for pattern, template in renames]

"""The Python blocks of "Use with timm, smp and transformers" run as shown, in a Python
where OpenMMLab cannot be imported (what the page promises). The file the blocks load,
``checkpoints/inline_pvt_t.pth``, is written first in the authors' released layout
(``{'model': state_dict}`` with a classifier of 1000 classes) from a fresh model."""
import os
import re

import pytest

from helpers.no_openmmlab import run_without_openmmlab
from helpers.paths import REPO

PAGE = os.path.join(REPO, 'docs', 'user_guides', 'timm.md')


def _python_blocks():
    with open(PAGE) as f:
        return re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)


def test_the_page_has_its_examples():
    blocks = _python_blocks()
    text = '\n'.join(blocks)
    assert len(blocks) >= 7
    for shown in ('features_only=True', 'smp.Unet', 'smp.FPN', 'UperNetForSemanticSegmentation',
                  'pretrained_cfg_overlay', "encoder_weights='imagenet'"):
        assert shown in text, shown


@pytest.mark.slow
def test_the_python_blocks_run_without_openmmlab(tmp_path):
    blocks = _python_blocks()
    code = f'''
import os
os.chdir({str(tmp_path)!r})
os.makedirs('checkpoints')
import timm, torch
import mmplugin_inline  # noqa: F401
fresh = timm.create_model('inline_pvt_tiny')
torch.save({{'model': fresh.state_dict(), 'epoch': 300}}, 'checkpoints/inline_pvt_t.pth')
BLOCKS = {blocks!r}
for i, block in enumerate(BLOCKS):
    scope = {{}}
    exec(compile(block, f'timm.md block {{i}}', 'exec'), scope)
    if 'maps' in scope and 'backbone' in scope:
        assert [tuple(m.shape[-2:]) for m in scope['maps']] == [(25, 32), (13, 16), (7, 8)]
    if 'pretrained=True' in block:  # the authors'-layout file was loaded
        for name, value in fresh.state_dict().items():
            assert torch.equal(scope['model'].state_dict()[name], value), name
    print('block', i, 'ran')
'''
    out = run_without_openmmlab(code)
    assert out.count(' ran') == len(blocks)

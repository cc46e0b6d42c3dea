"""The InLine encoders in the libraries people use them through, the real ones: smp's
``tu-`` encoders (Unet and FPN, UPerNet) and transformers' ``TimmBackbone`` under
``UperNetForSemanticSegmentation``, each training one step, in a Python where OpenMMLab
cannot be imported."""
import pytest

from helpers.no_openmmlab import run_without_openmmlab

# small presets, passed through the libraries' keyword arguments to timm.create_model
SMALL = {
    'inline_pvt_tiny': dict(arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                                      mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])),
    'inline_swin_tiny': dict(arch=dict(embed_dim=16, depths=[1, 1, 2, 1],
                                       num_heads=[1, 2, 2, 4])),
    'inline_cswin_tiny': dict(arch=dict(embed_dim=16, depths=[1, 1, 2, 1],
                                        num_heads=[1, 2, 2, 4])),
}

_TRAIN_STEP = '''
def train_step(model, x, loss_of):
    """One SGD step; the loss is finite and every trainable parameter got a gradient."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = loss_of(model, x)
    loss.backward()
    assert torch.isfinite(loss)
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, no_grad[:5]
    opt.step()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    return float(loss)
'''


@pytest.mark.slow
def test_smp_encoders_train_a_step():
    out = run_without_openmmlab(_TRAIN_STEP + f'''
import torch
import torch.nn.functional as F
import segmentation_models_pytorch as smp
import mmplugin_inline  # noqa: F401
torch.manual_seed(0)
for name, kwargs in {SMALL!r}.items():
    for decoder in (smp.Unet, smp.FPN, smp.UPerNet):
        model = decoder(f'tu-{{name}}', encoder_weights=None, classes=3, **kwargs)
        x = torch.randn(2, 3, 96, 128)  # smp asks for multiples of 32
        target = torch.randint(0, 3, (2, 96, 128))
        loss = train_step(model, x, lambda m, x: F.cross_entropy(m(x), target))
        print(name, decoder.__name__, tuple(model(x).shape))
''')
    for name in SMALL:
        for decoder in ('Unet', 'FPN', 'UPerNet'):
            assert f'{name} {decoder} (2, 3, 96, 128)' in out


@pytest.mark.slow
def test_transformers_upernet_trains_a_step():
    out = run_without_openmmlab(_TRAIN_STEP + f'''
import torch
from transformers import TimmBackboneConfig, UperNetConfig, UperNetForSemanticSegmentation
import mmplugin_inline  # noqa: F401
torch.manual_seed(0)
for name, kwargs in {SMALL!r}.items():
    backbone = TimmBackboneConfig(backbone=name, out_indices=(0, 1, 2, 3),
                                  use_pretrained_backbone=False)
    model = UperNetForSemanticSegmentation(UperNetConfig(
        backbone_config=backbone, num_labels=4, hidden_size=32, auxiliary_in_channels=None))
    x, labels = torch.randn(2, 3, 72, 100), torch.randint(0, 4, (2, 72, 100))
    train_step(model, x, lambda m, x: m(pixel_values=x, labels=labels).loss)
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    print(name, 'UperNet', tuple(logits.shape), model.backbone.channels)
''')
    assert "inline_pvt_tiny UperNet (2, 4, 72, 100) [64, 128, 320, 512]" in out
    assert "inline_swin_tiny UperNet (2, 4, 72, 100) [96, 192, 384, 768]" in out
    assert "inline_cswin_tiny UperNet (2, 4, 72, 100) [64, 128, 256, 512]" in out

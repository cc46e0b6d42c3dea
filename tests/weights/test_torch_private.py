"""What mmplugin_inline.weights reads of torch's private API (weights/torch_private.py) is
still what torch does: a torch release that changes it fails here, by name."""
import inspect
from collections import OrderedDict

import pytest
import torch

from mmplugin_inline.weights import torch_private
from mmplugin_inline.weights.pickle_walk import walk


def test_the_weights_only_allow_list_covers_what_torch_save_writes(tmp_path):
    """Every global that torch.save writes for tensors of every kind we read (fp32 / fp16 /
    bf16 / int64 / bool tensors, parameters, an OrderedDict state dict, a torch.Size)
    is in the allow-list we read from torch, and torch's own weights_only load agrees."""
    state = OrderedDict(w=torch.nn.Parameter(torch.ones(2, 3)), h=torch.ones(4).half(),
                        b=torch.ones(2, dtype=torch.bfloat16), i=torch.arange(3),
                        m=torch.zeros(2, dtype=torch.bool))
    path = tmp_path / 'state.pth'
    torch.save({'state_dict': state, 'shape': torch.Size([2, 3])}, path)
    allowed = torch_private.weights_only_globals()
    renames = torch_private.TORCH_MODULE_RENAMES
    named = {f'{renames.get(m, m)}.{n}' for m, n in walk(str(path)).named}
    assert 'torch._utils._rebuild_tensor_v2' in named and 'torch.BFloat16Storage' in named
    assert not named - set(allowed), named - set(allowed)
    assert allowed['collections.OrderedDict'] is OrderedDict
    assert allowed['torch._utils._rebuild_tensor_v2'] is torch._utils._rebuild_tensor_v2
    torch.load(path, weights_only=True)  # torch's own reading of the same file


@pytest.mark.parametrize('storage, size', [('FloatStorage', 4), ('HalfStorage', 2),
                                           ('BFloat16Storage', 2), ('LongStorage', 8),
                                           ('BoolStorage', 1), ('DoubleStorage', 8),
                                           ('ByteStorage', 1)])
def test_storage_element_sizes_are_torchs(storage, size):
    assert torch_private.storage_element_size(storage) == size


def test_an_unknown_storage_class_is_a_value_error():
    with pytest.raises(ValueError, match="'NoSuchStorage' is not a storage class"):
        torch_private.storage_element_size('NoSuchStorage')


def test_torchs_loader_still_renames_the_modules_we_mirror():
    source = inspect.getsource(torch.serialization)
    for old, new in torch_private.TORCH_MODULE_RENAMES.items():
        assert f'"{old}": "{new}"' in source, (old, new)


def test_a_changed_private_api_is_named_not_misread(monkeypatch):
    from torch import _weights_only_unpickler
    torch_private.weights_only_globals.cache_clear()
    monkeypatch.delattr(_weights_only_unpickler, '_get_allowed_globals')
    try:
        with pytest.raises(torch_private.TorchInternalsChanged,
                           match='_get_allowed_globals.*torch_private.py'):
            torch_private.weights_only_globals()
    finally:
        monkeypatch.undo()
        torch_private.weights_only_globals.cache_clear()
    assert 'collections.OrderedDict' in torch_private.weights_only_globals()

"""The loading policy against files we did not make: the authors' training-format
checkpoint, malicious pickles, damaged downloads, and weights served over real HTTP."""
import importlib.util
import logging
import os
import os.path as osp
import re
import subprocess
import sys
import zipfile

import pytest
import torch

from helpers.fidelity import DATA, backbone_cfg, load_fixture
from helpers.local_server import refused_port, serve_folder
from helpers.paths import REPO
from helpers.pickles import RunsCode, writes_marker
from mmplugin_inline.engine.preflight import checkpoint_problems
from mmplugin_inline.registry import MODELS
from mmplugin_inline.weights import (
    CheckpointDownloadError,
    CheckpointError,
    DamagedCheckpointError,
    SetAside,
    cache_dir,
    cached_file,
    load_run_checkpoint,
    load_weights,
    url_file_name,
)

ROOT = REPO
# written by the InLine authors' own utils.save_checkpoint_new (see
# tests/data/make_training_format_checkpoint.py): model, optimizer, lr_scheduler,
# max_accuracy, epoch and their yacs config
AUTHORS_MAX_ACC = osp.join(DATA, 'inline_deit_mini_max_acc.pth')


class _Logs(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def logs():
    from mmengine.logging import MMLogger
    handler = _Logs()
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def _deit(checkpoint, **overrides):
    fixture = load_fixture('deit')
    cfg = backbone_cfg('deit', fixture['arch'], **overrides)
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(checkpoint))
    model = MODELS.build(cfg)
    model.init_weights()
    return model.eval(), fixture


def _assert_reference_outputs(model, fixture):
    with torch.no_grad():
        outs = model(fixture['cases'][0]['input'])
    for ours, theirs in zip(outs, fixture['cases'][0]['stage_outputs']):
        assert (ours - theirs).abs().max() <= 1e-4


# --------------------------------------------------------------------------- authors' files

def test_the_authors_training_format_file_needs_yacs_for_a_full_unpickling():
    """The fixture is what users download: torch's own loaders cannot read it without yacs."""
    names = torch.serialization.get_unsafe_globals_in_checkpoint(AUTHORS_MAX_ACC)
    assert 'yacs.config.CfgNode' in names
    with pytest.raises(Exception, match='yacs'):
        torch.load(AUTHORS_MAX_ACC, weights_only=True)
    with pytest.raises(ModuleNotFoundError, match='yacs'):
        torch.load(AUTHORS_MAX_ACC, weights_only=False)


def test_authors_training_format_loads_as_data_without_yacs_or_opt_in(logs):
    assert importlib.util.find_spec('yacs') is None, 'this test needs an environment without yacs'
    obj = load_weights(AUTHORS_MAX_ACC)
    assert set(obj) == {'model', 'optimizer', 'lr_scheduler', 'max_accuracy', 'epoch', 'config'}
    assert isinstance(obj['config'], SetAside)
    assert obj['config'].pickled_as == 'yacs.config.CfgNode'
    assert obj['config'].items['MODEL'].items['NAME'] == 'inline_deit_tiny'  # kept as data
    assert obj['epoch'] == 300 and obj['max_accuracy'] == 72.5
    assert 'exp_avg' in next(iter(obj['optimizer']['state'].values()))
    assert 'yacs' not in sys.modules

    model, fixture = _deit(AUTHORS_MAX_ACC)
    _assert_reference_outputs(model, fixture)
    ignored = [line for line in logs if 'ignored (not weights)' in line]
    assert len(ignored) == 1
    for part in ('config (yacs.config.CfgNode)', 'optimizer', 'lr_scheduler', 'max_accuracy',
                 'epoch'):
        assert part in ignored[0]


def test_converter_reads_the_authors_training_format(tmp_path):
    dst = tmp_path / 'converted.pth'
    res = subprocess.run([sys.executable, 'tools/model_converters/inline2mm.py', AUTHORS_MAX_ACC,
                          str(dst)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert 'InLineDeiT checkpoint' in res.stdout
    assert 'ignored (not weights): ' in res.stdout and 'yacs.config.CfgNode' in res.stdout
    converted = torch.load(dst, weights_only=True)  # plain data now
    model, fixture = _deit(dst)
    _assert_reference_outputs(model, fixture)
    assert set(converted['state_dict']) <= set(model.state_dict()) | {'norm.weight', 'norm.bias'}


# --------------------------------------------------------------------------- malicious pickles

@pytest.mark.parametrize('how', ['os.system', 'exec', 'eval', 'subprocess'])
def test_a_pickle_that_would_run_code_loads_as_inert_data(how, tmp_path):
    marker = tmp_path / 'marker'
    payload = {
        'os.system': RunsCode(os.system, f'touch {marker}'),
        'exec': writes_marker(marker),
        'eval': RunsCode(eval, f'open({str(marker)!r}, "w").write("ran")'),
        'subprocess': RunsCode(subprocess.call, ['touch', str(marker)]),
    }[how]
    path = tmp_path / 'evil.pth'
    torch.save({'model': load_fixture('deit')['checkpoint']['model'], 'x': payload}, path)
    obj = load_weights(str(path))
    assert isinstance(obj['x'], SetAside) and not marker.exists()
    model, fixture = _deit(path)  # and the weights next to it still load
    _assert_reference_outputs(model, fixture)
    assert not marker.exists()


def test_nothing_named_in_the_file_is_imported(tmp_path, monkeypatch):
    """Importing the module a file names would run that module's code: it never happens."""
    marker = tmp_path / 'imported'
    (tmp_path / 'side_effect_module.py').write_text(
        f'open({str(marker)!r}, "w").write("imported")\n'
        'class Settings:\n    def __init__(self):\n        self.lr = 0.1\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    import side_effect_module
    torch.save({'model': {'w': torch.ones(1)}, 'x': side_effect_module.Settings()},
               tmp_path / 'f.pth')
    marker.unlink()
    code = ('import sys\n'
            'from mmplugin_inline.weights import load_weights\n'
            f'obj = load_weights({str(tmp_path / "f.pth")!r})\n'
            'print("side_effect_module" in sys.modules, obj["x"].pickled_as, obj["x"].state)\n')
    # the module is importable in the loading process too: only the policy keeps it out
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=f'{ROOT}:{tmp_path}'))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ['False', 'side_effect_module.Settings', "{'lr':", '0.1}']
    assert not marker.exists()


def test_a_pickled_module_is_an_error_saying_what_to_save_instead(tmp_path):
    path = tmp_path / 'whole_model.pth'
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(TypeError, match='pickled torch.nn.modules.linear.Linear object'):
        _deit(path)


# --------------------------------------------------------------------------- damaged files

def _released_file(tmp_path):
    path = tmp_path / 'released.pth'
    torch.save(load_fixture('deit')['checkpoint'], path)
    return path


def _damaged_files(tmp_path):
    good = _released_file(tmp_path).read_bytes()
    legacy = tmp_path / 'legacy.pth'
    torch.save(load_fixture('deit')['checkpoint'], legacy, _use_new_zipfile_serialization=False)
    files = {
        'empty': (b'', 'is empty'),
        'truncated': (good[:len(good) // 2], 'truncated or corrupt'),
        'truncated legacy': (legacy.read_bytes()[:len(legacy.read_bytes()) // 3],
                             'probably truncated or corrupt'),
        'html': (b'<!DOCTYPE html>\n<html><head><title>Tsinghua Cloud</title></head></html>',
                 'web page'),
        'text': (b'Access denied\n', 'neither a torch.save zip checkpoint nor a pickle'),
    }
    paths = {}
    for name, (data, _) in files.items():
        paths[name] = tmp_path / (name.replace(' ', '_') + '.pth')
        paths[name].write_bytes(data)
    return {name: (paths[name], files[name][1]) for name in files}


def test_damaged_files_get_their_own_error_everywhere(tmp_path):
    for name, (path, expected) in _damaged_files(tmp_path).items():
        loaders = {
            'weights': lambda: load_weights(str(path)),
            'run checkpoint': lambda: load_run_checkpoint(str(path)),
            'backbone init_cfg': lambda: _deit(path),
        }
        for where, load in loaders.items():
            with pytest.raises(DamagedCheckpointError) as info:
                load()
            message = str(info.value)
            assert expected in message, (name, where, message)
            assert str(path) in message and 'allow_unsafe' not in message, (name, where)
            if name != 'empty':
                assert f'{path.stat().st_size} bytes' in message or 'KiB' in message
        if name == 'html':
            assert '?dl=1' in message


def run_like_checkpoint():
    """A small checkpoint shaped like a run's: two tensors, an int and a nested config."""
    generator = torch.Generator().manual_seed(0)
    return {'meta': {'epoch': 3, 'cfg': {'model': {'type': 'MaskRCNN', 'depths': [2, 2]},
                                         'optim_wrapper': {'optimizer': {'lr': 0.01}}}},
            'state_dict': {'backbone.w': torch.randn(4, 3, generator=generator),
                           'backbone.b': torch.randn(3, generator=generator)},
            'iter': 12}


def test_every_one_byte_change_of_a_legacy_file_loads_or_is_a_checkpoint_error(tmp_path):
    """Corrupt bytes used to escape as IndexError, KeyError, TypeError, struct.error,
    AssertionError, AttributeError, MemoryError, ... Now a file that cannot be read is a
    damaged file, whose message names the file, its size and the underlying exception."""
    source = tmp_path / 'source.pth'
    torch.save(run_like_checkpoint(), source, _use_new_zipfile_serialization=False)
    data = source.read_bytes()
    path = tmp_path / 'changed.pth'
    outcomes = set()
    for position in range(len(data)):
        changed = bytearray(data)
        changed[position] ^= 0xff
        path.write_bytes(changed)
        for load in (load_weights, load_run_checkpoint):
            try:
                load(str(path))
                outcomes.add('loaded')
            except CheckpointError as exc:
                outcomes.add(type(exc).__name__)
                if isinstance(exc, DamagedCheckpointError):
                    message = str(exc)
                    assert str(path) in message and f'{len(data)} bytes' in message, message
                    if exc.__cause__ is not None:
                        assert type(exc.__cause__).__name__ in message, message
    assert 'DamagedCheckpointError' in outcomes and 'loaded' in outcomes


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_a_sound_file_saved_on_a_gpu_is_not_called_damaged(tmp_path):
    """Reading a file without a device it names is no damage: a plain CheckpointError."""
    source = tmp_path / 'source.pth'
    torch.save(run_like_checkpoint(), source, _use_new_zipfile_serialization=False)
    path = tmp_path / 'saved_on_gpu.pth'
    path.write_bytes(source.read_bytes().replace(b'X\x03\x00\x00\x00cpu',
                                                 b'X\x06\x00\x00\x00cuda:0'))
    with pytest.raises(CheckpointError, match="load it with map_location='cpu'") as info:
        load_run_checkpoint(str(path))
    assert not isinstance(info.value, DamagedCheckpointError)
    assert load_run_checkpoint(str(path), map_location='cpu')['iter'] == 12
    assert load_weights(str(path))['iter'] == 12  # map_location='cpu' by default


def test_a_zip_file_with_a_corrupt_directory_is_a_damaged_file(tmp_path):
    source = tmp_path / 'source.pth'
    torch.save(run_like_checkpoint(), source)
    data = bytearray(source.read_bytes())
    directory = data.index(b'PK\x01\x02')  # the first entry of the central directory
    data[directory + 6] = 0x80  # 'version needed to extract' 12.8: NotImplementedError
    data[directory + 46] = 0xb7  # its name is no longer UTF-8: UnicodeDecodeError
    path = tmp_path / 'directory.pth'
    path.write_bytes(data)
    for load in (load_weights, load_run_checkpoint):
        with pytest.raises(DamagedCheckpointError, match='truncated or corrupt'):
            load(str(path))


def _rewrite_zip(path, out, transform):
    """Copy the torch zip file ``path`` to ``out`` with ``data.pkl`` replaced by
    ``transform(data.pkl)``, its CRC-32 made right again."""
    with zipfile.ZipFile(path) as archive:
        records = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(out, 'w') as archive:
        for name, data in records:
            archive.writestr(name, transform(data) if name.endswith('/data.pkl') else data)


def _declaring(pickled: bytes, numel: int) -> bytes:
    """``pickled`` with the first storage record's element count (12, after its location
    'cpu' and the memo put) replaced by ``numel``."""
    changed, count = re.subn(rb'(X\x03\x00\x00\x00cpuq.)K\x0c',
                             lambda m: m.group(1) + b'\x8a\x05' + numel.to_bytes(5, 'little'),
                             pickled, count=1, flags=re.DOTALL)
    assert count == 1
    return changed


_UNDER_A_MEMORY_LIMIT = """
import resource, sys
from mmplugin_inline.weights import CheckpointError, load_run_checkpoint, load_weights
peak = int(open('/proc/self/status').read().split('VmPeak:')[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (peak + (1 << 30), peak + (1 << 30)))
for path in sys.argv[1:]:
    for load in (load_weights, load_run_checkpoint):
        try:
            load(path)
            print('loaded')
        except CheckpointError as exc:
            print(type(exc).__name__, str(exc).replace(chr(10), ' '))
        except MemoryError:
            print('MemoryError')
"""


def test_a_corrupt_size_is_found_before_anything_is_allocated(tmp_path):
    """A storage's element count, or a memo index, grown by a corrupt byte: the loaders find
    it before torch or the unpickler allocates for it. Run under an address-space limit of
    1 GiB above what the process uses, so a regression shows as a MemoryError instead of
    taking the machine's memory."""
    zipped, legacy = tmp_path / 'zipped.pth', tmp_path / 'legacy.pth'
    torch.save(run_like_checkpoint(), zipped)
    torch.save(run_like_checkpoint(), legacy, _use_new_zipfile_serialization=False)
    huge = 1 << 36  # 256 GiB of float32
    _rewrite_zip(zipped, tmp_path / 'zip_numel.pth', lambda data: _declaring(data, huge))
    (tmp_path / 'legacy_numel.pth').write_bytes(_declaring(legacy.read_bytes(), huge))
    # the main pickle's first memo put at index 2**32 - 1: C's unpickler would size its
    # memo table for 2**33 entries (64 GiB)
    data = legacy.read_bytes()
    start = data.index(b'\x80\x02}q\x00(', 30)  # the main pickle, after torch's header pickles
    (tmp_path / 'legacy_memo.pth').write_bytes(
        data[:start + 3] + b'r\xff\xff\xff\xff' + data[start + 5:])
    cases = {'zip_numel.pth': f'declares {huge * 4} bytes, but its record holds 48',
             'legacy_numel.pth': f'storages declare {huge * 4 + 12} bytes, more than the whole',
             'legacy_memo.pth': f'memo index {(1 << 32) - 1}, more than the pickle has bytes'}
    res = subprocess.run([sys.executable, '-c', _UNDER_A_MEMORY_LIMIT] +
                         [str(tmp_path / name) for name in cases], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert len(lines) == 2 * len(cases), res.stdout
    for (name, finding), outcomes in zip(cases.items(), zip(lines[::2], lines[1::2])):
        for line in outcomes:
            assert line.startswith('DamagedCheckpointError') and finding in line, (name, line)
            assert str(tmp_path / name) in line and 'probably truncated or corrupt' in line


def test_a_changed_byte_in_the_pickle_of_a_zip_file_is_found_by_its_crc(tmp_path):
    """The zip format keeps a CRC-32 of each record: a file whose data.pkl changed (here the
    epoch, 3 -> 4) would load with the wrong value; it is a damaged file."""
    path = tmp_path / 'changed.pth'
    torch.save(run_like_checkpoint(), path)
    data = bytearray(path.read_bytes())
    at = data.index(b'epochq')
    assert data[at + 7:at + 9] == b'K\x03'
    data[at + 8] = 4
    path.write_bytes(data)
    for load in (load_weights, load_run_checkpoint):
        with pytest.raises(DamagedCheckpointError, match=r'data.pkl cannot be read \(BadZipFile: '
                                                         'Bad CRC-32'):
            load(str(path))


def test_damage_to_the_records_torch_writes_itself_is_not_reported_as_unsafe(tmp_path):
    """Corrupt bytes that still make a pickle used to be refused as 'unsafe' by
    weights_only, pushing towards --allow-unsafe."""
    legacy = tmp_path / 'legacy.pth'
    torch.save(run_like_checkpoint(), legacy, _use_new_zipfile_serialization=False)
    data = legacy.read_bytes()
    end = data.index(b'e.', data.index(b'\x80\x02]q\x00('))  # the storage list's APPENDS
    (tmp_path / 'keys.pth').write_bytes(data[:end] + b'd' + data[end + 1:])  # -> DICT
    zipped = tmp_path / 'zipped.pth'
    torch.save(run_like_checkpoint(), zipped)
    data = bytearray(zipped.read_bytes())
    data[data.index(b'PK\x01\x02') + 38] = 0x10  # data.pkl's MS-DOS attributes: a folder
    (tmp_path / 'folder.pth').write_bytes(data)
    for name, finding in (('keys.pth', 'its list of storages is not a list of names'),
                          ('folder.pth', 'marks the record zipped/data.pkl as a folder')):
        for load in (load_weights, load_run_checkpoint):
            with pytest.raises(DamagedCheckpointError, match=finding):
                load(str(tmp_path / name))


def _renamed(data: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and data.count(old) >= 1
    return data.replace(old, new)


def test_a_name_that_does_not_exist_is_damage_not_unsafe(tmp_path):
    """A flipped byte in a global's name: weights_only refuses a name it does not know, but
    a name that does not exist cannot be a reason for --allow-unsafe."""
    legacy, zipped = tmp_path / 'legacy.pth', tmp_path / 'zipped.pth'
    torch.save(run_like_checkpoint(), legacy, _use_new_zipfile_serialization=False)
    torch.save(run_like_checkpoint(), zipped)
    flipped = (b'_rebuild_tensor_v2', b'_rebuild_tenWor_v2')
    (tmp_path / 'legacy_name.pth').write_bytes(_renamed(legacy.read_bytes(), *flipped))
    _rewrite_zip(zipped, tmp_path / 'zip_name.pth', lambda data: _renamed(data, *flipped))
    for name in ('legacy_name.pth', 'zip_name.pth'):
        for load in (load_weights, load_run_checkpoint):  # torch's names: both loaders
            with pytest.raises(DamagedCheckpointError) as info:
                load(str(tmp_path / name))
            assert ('names `torch._utils._rebuild_tenWor_v2`, which does not exist: the file '
                    'is probably corrupt') in str(info.value)
            assert 'allow_unsafe' not in str(info.value)
    (tmp_path / 'module.pth').write_bytes(
        _renamed(legacy.read_bytes(), b'collections\nOrderedDict', b'collectionr\nOrderedDict'))
    with pytest.raises(DamagedCheckpointError, match='but there is no module `collectionr`: the '
                                                     'file is probably corrupt'):
        load_run_checkpoint(str(tmp_path / 'module.pth'))


def test_a_run_checkpoint_naming_a_package_that_is_not_installed(tmp_path):
    """The authors' training-format file names yacs, which is not installed: no loader
    option can read it as a run checkpoint, and the message says how to use it."""
    assert importlib.util.find_spec('yacs') is None
    with pytest.raises(DamagedCheckpointError) as info:
        load_run_checkpoint(AUTHORS_MAX_ACC)
    message = str(info.value)
    assert 'names `yacs.config.CfgNode`, but there is no module `yacs`' in message
    assert "init_cfg=dict(type='Pretrained'" in message and 'allow_unsafe' not in message
    assert 'yacs' not in sys.modules


def test_deciding_whether_a_name_exists_imports_nothing(tmp_path, monkeypatch):
    """Importing a module runs its code: absent_global never imports what a file names,
    neither a module that is not imported yet nor a submodule of an imported package."""
    from mmplugin_inline.weights import absent_global
    marker = tmp_path / 'imported'
    code = f'open({str(marker)!r}, "a").write(__name__ + " ")\nclass Settings: pass\n'
    (tmp_path / 'lone_module.py').write_text(code)
    (tmp_path / 'side_package').mkdir()
    (tmp_path / 'side_package' / '__init__.py').write_text('')
    (tmp_path / 'side_package' / 'sub.py').write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    import side_package  # noqa: F401  (imported by someone else; its submodule is not)
    cases = {
        ('torch._utils', '_rebuild_tensor_v2'): None,
        ('torch._utils', '_rebuild_tenWor_v2'):
            'names `torch._utils._rebuild_tenWor_v2`, which does not exist',
        ('torch._utiXs', '_rebuild_tensor_v2'):
            'names `torch._utiXs._rebuild_tensor_v2`, but there is no module `torch._utiXs`',
        ('torcX._utils', '_rebuild_tensor_v2'):
            'names `torcX._utils._rebuild_tensor_v2`, but there is no module `torcX`',
        ('collections', 'OrderedDict'): None,
        ('mmengine.logging.history_buffer', 'HistoryBuffer.min'): None,  # a nested name
        ('torch._utils', '_rebuild\x00tensor'): "names 'torch._utils._rebuild\\x00tensor', "
                                                 'which is not a Python name',
        ('torch', 'no_such_name'): None,  # torch makes names on demand (__getattr__): unknown
        ('lone_module', 'Settings'): None,  # exists, not imported: left unknown
        ('lone_module.deeper', 'Settings'): None,
        ('side_package.sub', 'NoSuchClass'): None,
        ('side_package.nothing_here', 'Settings'):
            'names `side_package.nothing_here.Settings`, but there is no module '
            '`side_package.nothing_here`',
    }
    for (module, name), expected in cases.items():
        assert absent_global(module, name) == expected, (module, name)
    assert not marker.exists()
    assert 'lone_module' not in sys.modules and 'side_package.sub' not in sys.modules


def test_converter_reports_a_damaged_file_without_a_traceback(tmp_path):
    path, _ = _damaged_files(tmp_path)['truncated']
    res = subprocess.run([sys.executable, 'tools/model_converters/inline2mm.py', str(path),
                          str(tmp_path / 'o.pth')], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 1 and 'Traceback' not in res.stderr
    assert 'truncated' in res.stderr and '--allow-unsafe' not in res.stderr


# --------------------------------------------------------------------------- published files

def _published(directory, stem='model'):
    """A run-like checkpoint saved as ``STEM-<its sha256[:8]>.pth``; returns the path."""
    from mmplugin_inline.weights import sha256_of
    tmp = directory / 'unnamed.pth'
    torch.save(run_like_checkpoint(), tmp)
    path = directory / f'{stem}-{sha256_of(str(tmp))[:8]}.pth'
    tmp.rename(path)
    return path


def _one_float_changed(path):
    """Change one byte of the last tensor's data: the file still loads, with another value."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if '/data/' in i.filename),
                   key=lambda i: i.header_offset)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 1] ^= 0x01
    path.write_bytes(data)


def test_a_published_file_is_checked_against_the_hash_in_its_name(tmp_path):
    from mmplugin_inline.weights import sha256_of
    path = _published(tmp_path)
    expected = path.name[len('model-'):-len('.pth')]
    for load in (load_weights, load_run_checkpoint):
        assert load(str(path))['iter'] == 12
    _one_float_changed(path)
    found = sha256_of(str(path))
    for load in (load_weights, load_run_checkpoint):
        with pytest.raises(DamagedCheckpointError) as info:
            load(str(path))
        assert (f'expected sha256 {expected}..., the file has {found[:8]}...: the file changed '
                'after publishing, or the download is damaged; if the suffix is not a hash, '
                'rename the file or turn the check off') in str(info.value)
        assert str(path) in str(info.value) and 'allow_unsafe' not in str(info.value)
        assert load(str(path), verify_hash=False)['iter'] == 12  # the opt-out
    # a suffix that is not a hash (a date) gets the same message, and the same opt-out
    dated = tmp_path / 'run-20240105.pth'
    torch.save(run_like_checkpoint(), dated)
    with pytest.raises(DamagedCheckpointError, match='if the suffix is not a hash'):
        load_run_checkpoint(str(dated))
    assert load_run_checkpoint(str(dated), verify_hash=False)['iter'] == 12
    other = tmp_path / 'run_20240105.pth'  # no dash: not a published name
    dated.rename(other)
    assert load_weights(str(other))['iter'] == 12


def test_the_converter_checks_a_published_name_unless_told_not_to(tmp_path, capsys):
    from mmplugin_inline.cli import inline2mm as converter
    path = tmp_path / 'inline_deit_mini-0badc0de.pth'  # not its hash
    torch.save(load_fixture('deit')['checkpoint'], path)
    assert converter.main([str(path), str(tmp_path / 'out.pth')]) == 1
    assert 'expected sha256 0badc0de' in capsys.readouterr().err
    assert converter.main([str(path), str(tmp_path / 'out.pth'), '--no-verify-hash']) == 0
    assert 'InLineDeiT checkpoint' in capsys.readouterr().out


def test_the_hash_check_is_turned_off_by_config_keys(tmp_path):
    """init_cfg=dict(type='Pretrained', ..., verify_hash=False) for backbone weights; a
    top-level verify_hash = False reaches load_from / --resume through the runner guard."""
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmplugin_inline.weights import mmengine_checkpoint_loading
    fixture = load_fixture('deit')
    path = tmp_path / 'inline_deit_mini-0badc0de.pth'  # not its hash
    torch.save(fixture['checkpoint'], path)
    cfg = backbone_cfg('deit', fixture['arch'])
    cfg['init_cfg'] = dict(type='Pretrained', checkpoint=str(path))
    with pytest.raises(DamagedCheckpointError, match='expected sha256 0badc0de'):
        MODELS.build(cfg).init_weights()
    cfg['init_cfg']['verify_hash'] = False
    model = MODELS.build(cfg)
    model.init_weights()
    _assert_reference_outputs(model.eval(), fixture)
    with mmengine_checkpoint_loading(), pytest.raises(DamagedCheckpointError):
        _load_checkpoint(str(path), map_location='cpu')
    with mmengine_checkpoint_loading(verify_hash=False):
        assert 'model' in _load_checkpoint(str(path), map_location='cpu')



def test_mmengines_loader_is_ours_in_the_block_and_its_own_again_after_it(tmp_path):
    """mmengine_checkpoint_loading registers its loaders through mmengine's public
    register_scheme: an inner block's settings end with it, and after the outer block
    mmengine reads files with its own loader (torch's error for a cut file)."""
    from mmengine.runner.checkpoint import CheckpointLoader

    from helpers.runs import truncate
    from mmplugin_inline.weights import mmengine_checkpoint_loading
    published = tmp_path / 'run-0badc0de.pth'  # not its hash
    torch.save({'meta': {'iter': 3}, 'state_dict': {'w': torch.ones(2)}}, published)
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(published.read_bytes())
    truncate(cut)
    with mmengine_checkpoint_loading():
        with pytest.raises(DamagedCheckpointError, match='cut.pth is truncated'):
            CheckpointLoader.load_checkpoint(str(cut))
        with mmengine_checkpoint_loading(verify_hash=False):
            assert CheckpointLoader.load_checkpoint(str(published))['meta']['iter'] == 3
        with pytest.raises(DamagedCheckpointError, match='0badc0de'):  # the outer block's
            CheckpointLoader.load_checkpoint(str(published))
    with pytest.raises(Exception) as raw:
        CheckpointLoader.load_checkpoint(str(cut))
    assert not isinstance(raw.value, CheckpointError)  # mmengine's own loader: torch's error
    assert CheckpointLoader.load_checkpoint(str(published))['meta']['iter'] == 3

# --------------------------------------------------------------------------- URLs

@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """torch hub's cache (where URLs are downloaded) in a temporary folder."""
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / 'hub'))
    yield tmp_path / 'hub'
    torch.hub.set_dir(previous)


@pytest.fixture
def server(tmp_path):
    """A folder served on 127.0.0.1: one checkpoint, one HTML page, nothing else."""
    root = tmp_path / 'served'
    (root / 'f' / '2f3898b07e9247f3beb3').mkdir(parents=True)
    torch.save(load_fixture('deit')['checkpoint'],
               root / 'f' / '2f3898b07e9247f3beb3' / 'inline_deit_s.pth')
    (root / 'share').mkdir()
    (root / 'share' / 'landing.html').write_text('<!DOCTYPE html><html><body>Download</body>'
                                                  '</html>')
    with serve_folder(str(root)) as (base, requests):
        yield base, requests


@pytest.fixture
def refused_url():
    """A URL on 127.0.0.1 whose port refuses connections (held for the test)."""
    with refused_port() as port:
        yield f'http://127.0.0.1:{port}/weights.pth'


def test_a_refused_port_refuses_and_nobody_else_can_take_it():
    import socket
    with refused_port() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.settimeout(5)
            client.connect(('127.0.0.1', port))
        with socket.socket() as other, pytest.raises(OSError, match='in use'):
            other.bind(('127.0.0.1', port))


def test_url_file_names_come_from_the_path_not_the_query():
    assert url_file_name('https://cloud.tsinghua.edu.cn/f/2f3898b07e9247f3beb3/?dl=1') == \
        '2f3898b07e9247f3beb3.pth'
    assert url_file_name('https://host/x/swin_tiny.pth?raw=true') == 'swin_tiny.pth'


def test_weights_by_url_download_once_then_come_from_the_cache(server, hub_dir, logs):
    base, requests = server
    url = f'{base}/f/2f3898b07e9247f3beb3/?dl=1'
    model, fixture = _deit(url)
    _assert_reference_outputs(model, fixture)
    cached = hub_dir / 'checkpoints' / '2f3898b07e9247f3beb3.pth'
    assert cached.is_file() and cache_dir() == str(hub_dir / 'checkpoints')
    assert requests == ['/f/2f3898b07e9247f3beb3/?dl=1']
    assert any('Downloading' in line and url in line for line in logs)
    model, fixture = _deit(url)  # a repeat run: from the cache, no request
    _assert_reference_outputs(model, fixture)
    assert len(requests) == 1


def test_a_published_url_is_verified_once_after_the_download(server, hub_dir, tmp_path,
                                                             monkeypatch):
    from mmplugin_inline.weights import files
    base, requests = server
    served = tmp_path / 'served' / 'pub'
    served.mkdir()
    good = _published(served, 'good')
    torch.save(run_like_checkpoint(), served / 'bad-0badc0de.pth')
    hashed = []
    sha256_of = files.sha256_of
    monkeypatch.setattr(files, 'sha256_of', lambda path: hashed.append(path) or sha256_of(path))
    url = f'{base}/pub/{good.name}'
    assert load_weights(url)['iter'] == 12 and load_run_checkpoint(url)['iter'] == 12
    assert len(hashed) == 1 and requests == [f'/pub/{good.name}']  # once, after the download
    bad = f'{base}/pub/bad-0badc0de.pth'
    with pytest.raises(DamagedCheckpointError) as info:
        load_weights(bad)
    assert bad in str(info.value) and 'expected sha256 0badc0de...' in str(info.value)
    assert 'deleted from the cache' in str(info.value)
    assert sorted(os.listdir(hub_dir / 'checkpoints')) == [good.name]  # the bad one is gone
    assert load_weights(bad, verify_hash=False)['iter'] == 12


def test_bad_urls_get_clear_errors_naming_them(server, hub_dir, refused_url):
    base, _ = server
    cases = {f'{base}/f/missing/?dl=1': 'HTTP 404',
             f'{base}/share/': 'returned a web page',
             refused_url: 'could not connect'}
    for url, expected in cases.items():
        with pytest.raises(CheckpointDownloadError) as info:
            _deit(url)
        assert url in str(info.value) and expected in str(info.value)
    assert not os.listdir(hub_dir / 'checkpoints')  # nothing half-written in the cache
    with pytest.raises(CheckpointDownloadError, match=r'\?dl=1'):
        cached_file(f'{base}/share/')


def test_preflight_reports_unreachable_urls_before_anything_is_built(server, hub_dir,
                                                                    refused_url):
    from mmengine.config import Config
    base, requests = server
    good = f'{base}/f/2f3898b07e9247f3beb3/?dl=1'
    missing, page, refused = f'{base}/f/missing/?dl=1', f'{base}/share/', refused_url
    cfg = Config(dict(model=dict(backbone=dict(init_cfg=dict(type='Pretrained',
                                                             checkpoint=good))),
                      load_from=None))
    assert checkpoint_problems(cfg) == []
    assert not (hub_dir / 'checkpoints').exists()  # a probe downloads nothing
    for url, expected in ((missing, '404'), (page, 'web page'), (refused, 'could not connect')):
        cfg.model.backbone.init_cfg.checkpoint = url
        problems = checkpoint_problems(cfg)
        assert len(problems) == 1 and url in problems[0] and expected in problems[0]
        assert 'model.backbone.init_cfg.checkpoint' in problems[0]
    cfg.model.backbone.init_cfg.checkpoint = good
    cfg.load_from = missing
    problems = checkpoint_problems(cfg)
    assert len(problems) == 1 and 'load_from' in problems[0]


# RANK, LOCAL_RANK and WORLD_SIZE as a launcher sets them; the process group meets in a
# file (no port to find free and hand over)
_RANK_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group('gloo', init_method='file://' + sys.argv[3],
                        rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']))
from mmplugin_inline.weights import cached_file, load_weights
torch.hub.set_dir(sys.argv[2])
path = cached_file(sys.argv[1])
obj = load_weights(sys.argv[1])
print('rank', dist.get_rank(), path, len(obj['model']))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_under_a_distributed_launcher_only_local_rank_0_downloads(server, tmp_path):
    base, requests = server
    url = f'{base}/f/2f3898b07e9247f3beb3/?dl=1'
    procs = []
    for rank in range(2):
        env = dict(os.environ, PYTHONPATH=ROOT, RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE='2', OMP_NUM_THREADS='1')
        procs.append(subprocess.Popen([sys.executable, '-c', _RANK_SCRIPT, url,
                                       str(tmp_path / 'hub'), str(tmp_path / 'rendezvous')],
                                      env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    assert requests == ['/f/2f3898b07e9247f3beb3/?dl=1']  # one download for both ranks
    entries = len(load_fixture('deit')['checkpoint']['model'])
    for rank, (out, _) in enumerate(outs):
        assert f'rank {rank} ' in out and out.strip().endswith(str(entries))


@pytest.mark.slow
def test_train_stops_at_an_unreachable_weights_url_before_building_anything(server, tmp_path):
    from helpers.runs import DET_CONFIG, make_shapes, run_tool
    from helpers.tiny_models import det_run_config
    base, requests = server
    data = str(tmp_path / 'shapes')
    make_shapes.main([data, '--train', '2', '--val', '1', '--min-size', '64', '--max-size', '80'])
    url = f'{base}/f/missing/?dl=1'
    config = tmp_path / 'mask-rcnn_url.py'
    config.write_text(det_run_config(DET_CONFIG, data + '/') +
                      f'model.update(backbone=dict(model["backbone"], init_cfg=dict('
                      f'type="Pretrained", checkpoint={url!r})))\n')
    work = tmp_path / 'work'
    rc, out, err = run_tool([sys.executable, osp.join(ROOT, 'tools/train.py'), str(config),
                             '--work-dir', str(work)])
    assert rc == 1 and 'Traceback' not in out
    assert url in err and 'HTTP 404' in err and 'model.backbone.init_cfg.checkpoint' in err
    assert not work.exists()  # stopped before the runner made its work directory
    assert requests == ['/f/missing/?dl=1']  # one probe, no download


def test_load_from_a_url_goes_through_the_same_cache(server, hub_dir, tmp_path):
    """``load_from='https://...'`` in our tools: mmengine's URL scheme, our policy."""
    from mmengine.runner.checkpoint import _load_checkpoint

    from mmplugin_inline.weights import mmengine_checkpoint_loading
    base, requests = server
    (tmp_path / 'served' / 'runs').mkdir()
    torch.save({'meta': {'iter': 3}, 'state_dict': {'w': torch.ones(2)}},
               tmp_path / 'served' / 'runs' / 'iter_3.pth')
    url = f'{base}/runs/iter_3.pth?raw=1'
    with mmengine_checkpoint_loading():
        ckpt = _load_checkpoint(url, map_location='cpu')
        assert ckpt['meta']['iter'] == 3
        _load_checkpoint(url, map_location='cpu')  # from the cache
    assert (hub_dir / 'checkpoints' / 'iter_3.pth').is_file()
    assert requests == ['/runs/iter_3.pth?raw=1']
    with mmengine_checkpoint_loading(), pytest.raises(CheckpointDownloadError, match='404'):
        _load_checkpoint(f'{base}/runs/nothing.pth')

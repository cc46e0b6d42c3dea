"""Damaged checkpoints, property-based: real files mutated at random (seeded) by byte flips,
truncation, deleted, inserted and zeroed runs of bytes. Whatever the damage, each loader
either loads the file or raises a CheckpointError: no raw exception, no hang, and no code
from the file runs.

The files: a run's checkpoint as mmengine saves it (zip) and in torch's legacy format, the
authors' training-format file (tests/data), and a file holding an object whose unpickling
would write a marker file.
"""
import faulthandler
import os
import signal
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers.fidelity import DATA
from helpers.pickles import writes_marker
from mmplugin_inline.weights import (
    CheckpointError,
    DamagedCheckpointError,
    load_run_checkpoint,
    load_weights,
)

AUTHORS_MAX_ACC = os.path.join(DATA, 'inline_deit_mini_max_acc.pth')
SOURCES = ('run (zip, mmengine)', 'run (legacy)', 'authors (training format)',
           'marker (zip)', 'marker (legacy)')
LOAD_TIMEOUT_S = 20  # one load of these files takes milliseconds
TEST_TIMEOUT_S = 240  # past this the whole process stops (a load stuck in C code)


def _run_checkpoint() -> dict:
    """What a run's checkpoint holds, small: two tensors, ints, a nested config, a logged
    scalar (mmengine's HistoryBuffer, numpy arrays inside)."""
    from mmengine.logging import HistoryBuffer
    generator = torch.Generator().manual_seed(0)
    return {'meta': {'epoch': 3, 'iter': 12,
                     'cfg': {'model': {'type': 'MaskRCNN', 'depths': [2, 2]},
                             'optim_wrapper': {'optimizer': {'type': 'AdamW', 'lr': 1e-4}}}},
            'state_dict': OrderedDict([('backbone.w', torch.randn(4, 3, generator=generator)),
                                       ('backbone.b', torch.randn(3, generator=generator))]),
            'message_hub': {'log_scalars': {'train/loss': HistoryBuffer([0.5, 0.25], [1, 1])}}}


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """``(folder, marker path, {source name: bytes})``."""
    from mmengine.runner.checkpoint import save_checkpoint
    folder = tmp_path_factory.mktemp('damaged')
    marker = folder / 'marker'
    paths = {name: folder / f'source{i}.pth' for i, name in enumerate(SOURCES)
             if not name.startswith('authors')}
    save_checkpoint(_run_checkpoint(), str(paths['run (zip, mmengine)']))
    torch.save(_run_checkpoint(), paths['run (legacy)'], _use_new_zipfile_serialization=False)
    payload = {'state_dict': _run_checkpoint()['state_dict'], 'x': writes_marker(marker)}
    torch.save(payload, paths['marker (zip)'])
    torch.save(payload, paths['marker (legacy)'], _use_new_zipfile_serialization=False)
    sources = {name: path.read_bytes() for name, path in paths.items()}
    with open(AUTHORS_MAX_ACC, 'rb') as f:
        sources['authors (training format)'] = f.read()
    return folder, marker, sources


# where a mutation lands: near the start (the pickle of both formats), near the end (the
# zip directory), or anywhere (mostly tensor data in the larger files)
POSITIONS = st.one_of(st.tuples(st.just('start'), st.integers(0, 4095)),
                      st.tuples(st.just('end'), st.integers(1, 4096)),
                      st.tuples(st.just('anywhere'), st.floats(0, 1, exclude_max=True)))
MUTATIONS = st.tuples(st.sampled_from(['flip', 'truncate', 'delete', 'insert', 'zero']),
                      POSITIONS, st.integers(1, 64), st.binary(min_size=1, max_size=64))


def _mutate(data: bytes, mutation) -> bytes:
    kind, (where, at), length, noise = mutation
    position = {'start': lambda: at, 'end': lambda: len(data) - at,
                'anywhere': lambda: int(at * len(data))}[where]()
    position = min(max(position, 0), len(data) - 1)
    data = bytearray(data)
    if kind == 'flip':  # change up to 4 bytes from there
        for offset, value in enumerate(noise[:4]):
            if position + offset < len(data):
                data[position + offset] ^= value or 0xff
    elif kind == 'truncate':
        del data[max(position, 1):]
    elif kind == 'delete':
        del data[position:position + length]
    elif kind == 'insert':
        data[position:position] = noise
    else:
        data[position:position + length] = bytes(len(data[position:position + length]))
    return bytes(data)


class _Hang(Exception):
    pass


def _raise_hang(signum, frame):
    raise _Hang()


@pytest.fixture(scope='module')
def bounded_time():
    """A load that does not return within LOAD_TIMEOUT_S fails the test; a process stuck
    where Python's signal handler cannot run stops after TEST_TIMEOUT_S."""
    previous = signal.signal(signal.SIGALRM, _raise_hang)
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    signal.signal(signal.SIGALRM, previous)


def _outcome(load, path: str) -> str:
    signal.alarm(LOAD_TIMEOUT_S)
    try:
        load(path)
        return 'loaded'
    except _Hang:
        pytest.fail(f'{load.__name__} did not return within {LOAD_TIMEOUT_S} s')
    except CheckpointError as exc:
        if isinstance(exc, DamagedCheckpointError):
            assert path in str(exc) and 'allow_unsafe' not in str(exc), str(exc)
        return type(exc).__name__
    finally:
        signal.alarm(0)


@settings(max_examples=600, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(source=st.sampled_from(SOURCES), mutations=st.lists(MUTATIONS, min_size=1, max_size=3))
def test_a_damaged_file_loads_or_is_a_checkpoint_error(files, bounded_time, source, mutations):
    folder, marker, sources = files
    data = sources[source]
    for mutation in mutations:
        data = _mutate(data, mutation)
    path = folder / 'mutant.pth'
    path.write_bytes(data)
    for load in (load_weights, load_run_checkpoint):
        event(f'{source}: {load.__name__}: {_outcome(load, str(path))}')
        assert not marker.exists(), 'code from the file ran'


def test_the_sources_load_and_their_code_does_not_run(files):
    """Without damage: the run's files load with both loaders; the marker file's object is
    set aside (data only) or refused (the run's allow-list); nothing runs."""
    folder, marker, sources = files
    path = str(folder / 'intact.pth')
    for name, data in sources.items():
        with open(path, 'wb') as f:
            f.write(data)
        assert load_weights(path) is not None
        if name.startswith('run'):
            assert load_run_checkpoint(path)['meta']['iter'] == 12
        elif name.startswith('marker'):
            with pytest.raises(CheckpointError, match='exec'):
                load_run_checkpoint(path)
    assert not marker.exists()

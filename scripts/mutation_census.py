"""Mutation census of the checkpoint loaders: random damage, outcome by exception type.

A small run checkpoint (mmengine's save, zip) and the same in torch's legacy format are
mutated at random (byte flips, truncation, deleted / inserted / zeroed runs: the
mutations of ``tests/test_damaged_files.py``), and each mutant goes through
``load_weights`` and ``load_run_checkpoint``. Prints how many loads ended how: a load, a
``DamagedCheckpointError``, another ``CheckpointError``, or a raw exception (which the
loading policy must never let out).

    .venv/bin/python scripts/mutation_census.py [--mutants 300] [--seed 22]
"""
import argparse
import collections
import os
import random
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ('flip', 'truncate', 'delete', 'insert', 'zero')


def random_mutation(rng: random.Random):
    """One mutation in the form ``tests/test_damaged_files._mutate`` takes."""
    where = rng.choice(['start', 'end', 'anywhere'])
    at = rng.random() if where == 'anywhere' else rng.randint(where == 'end', 4095)
    noise = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return rng.choice(KINDS), (where, at), rng.randint(1, 64), noise


def census(mutants: int, seed: int) -> collections.Counter:
    import torch
    from mmengine.runner.checkpoint import save_checkpoint

    from mmplugin_inline.weights import (
        CheckpointError,
        DamagedCheckpointError,
        load_run_checkpoint,
        load_weights,
    )
    sys.path.insert(0, os.path.join(ROOT, 'tests'))
    from test_damaged_files import _mutate, _run_checkpoint
    folder = tempfile.mkdtemp(prefix='mutation_census_')
    sources = {'zip': os.path.join(folder, 'zip.pth'), 'legacy': os.path.join(folder, 'legacy.pth')}
    save_checkpoint(_run_checkpoint(), sources['zip'])
    torch.save(_run_checkpoint(), sources['legacy'], _use_new_zipfile_serialization=False)
    loaders = {'load_weights': load_weights, 'load_run_checkpoint': load_run_checkpoint}
    rng, counts = random.Random(seed), collections.Counter()
    for fmt, source in sources.items():
        with open(source, 'rb') as f:
            data = f.read()
        mutant_path = os.path.join(folder, f'mutant_{fmt}.pth')
        for _ in range(mutants):
            with open(mutant_path, 'wb') as f:
                f.write(_mutate(data, random_mutation(rng)))
            for name, load in loaders.items():
                try:
                    load(mutant_path)
                    outcome = 'loaded'
                except DamagedCheckpointError:
                    outcome = 'DamagedCheckpointError'
                except CheckpointError as exc:
                    outcome = type(exc).__name__
                except Exception as exc:  # what the policy must never let out
                    outcome = f'raw {type(exc).__name__}'
                counts[fmt, name, outcome] += 1
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--mutants', type=int, default=300, help='mutants per format')
    parser.add_argument('--seed', type=int, default=22)
    args = parser.parse_args(argv)
    counts = census(args.mutants, args.seed)
    print('| format | loader | outcome | loads |\n|---|---|---|---|')
    for (fmt, name, outcome), n in sorted(counts.items()):
        print(f'| {fmt} | {name} | {outcome} | {n} |')
    raw = sum(n for (_, _, outcome), n in counts.items() if outcome.startswith('raw'))
    print(f'{sum(counts.values())} loads, {raw} raw exceptions')
    return 1 if raw else 0


if __name__ == '__main__':
    sys.exit(main())

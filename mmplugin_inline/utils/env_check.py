"""Explain, in words, what is wrong with the installed OpenMMLab stack.

Run as a command::

    python -m mmplugin_inline.utils.env_check

It prints the versions it found and, for every problem, what it means and how to fix
it, and exits with status 1 when there is a problem. ``tools/*.py`` call
:func:`assert_environment` before they import mmdet / mmseg, so a broken install is
reported as one readable message instead of a stack trace from deep inside mmcv.
"""
import importlib
import sys
from typing import List, Optional, Tuple

# mmdet 3.x and mmsegmentation 1.x both refuse mmcv >= 2.2.0.
MMCV_MIN = '2.0.0rc4'
MMCV_MAX = '2.2.0'

SETUP_HINT = ('Run `make setup` (or `bash scripts/setup_env.sh`) in the mmplugin_inline '
              'checkout: it builds mmcv with its ops for this torch and caches the wheel. '
              'On a GPU machine install a CUDA build of mmcv instead, e.g. '
              '`pip install -U openmim && mim install "mmcv>=2.0.0,<2.2.0"`.')


def _version_tuple(version: str) -> Tuple:
    """Parse a version string with the same rules as mmengine (rc/post aware)."""
    from mmengine.utils import digit_version
    return digit_version(version)


def _try_import(name: str):
    try:
        return importlib.import_module(name), None
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
        return None, exc


def collect_problems() -> Tuple[List[str], List[str]]:
    """Inspect the installed stack.

    Returns:
        tuple[list[str], list[str]]: ``(found, problems)``; ``found`` lists
        ``name version`` lines, ``problems`` holds one explanatory message per problem.
    """
    found, problems = [], []
    torch, err = _try_import('torch')
    if torch is None:
        return found, [f'PyTorch does not import ({err}). {SETUP_HINT}']
    found.append(f'torch {torch.__version__} (CUDA available: {torch.cuda.is_available()})')

    mmengine, err = _try_import('mmengine')
    if mmengine is None:
        return found, [f'mmengine does not import ({err}). {SETUP_HINT}']
    found.append(f'mmengine {mmengine.__version__}')

    mmcv, err = _try_import('mmcv')
    if mmcv is None:
        problems.append(f'mmcv does not import ({err}). {SETUP_HINT}')
    else:
        found.append(f'mmcv {mmcv.__version__}')
        if not (_version_tuple(MMCV_MIN) <= _version_tuple(mmcv.__version__)
                < _version_tuple(MMCV_MAX)):
            problems.append(
                f'mmcv {mmcv.__version__} is installed, but mmdet 3.x and mmsegmentation 1.x '
                f'need {MMCV_MIN} <= mmcv < {MMCV_MAX}. {SETUP_HINT}')
        _, err = _try_import('mmcv._ext')
        if err is not None:
            if 'No module named' in str(err):
                why = ('mmcv is installed without its compiled ops (No module named '
                       "'mmcv._ext'): this is mmcv-lite or a source install built without "
                       'MMCV_WITH_OPS=1. Mask R-CNN needs mmcv.ops (RoIAlign, nms).')
            else:
                why = (f'mmcv\'s compiled ops fail to load ({err}): the mmcv binary was built '
                       'for another torch version. Rebuild it for the installed torch.')
            problems.append(f'{why} {SETUP_HINT}')

    for pkg, label in (('mmdet', 'mmdet'), ('mmseg', 'mmsegmentation')):
        mod, err = _try_import(pkg)
        if mod is None:
            if isinstance(err, ModuleNotFoundError) and err.name == pkg:
                found.append(f'{label} not installed')
            else:
                problems.append(f'{label} is installed but does not import ({err}). '
                                f'{SETUP_HINT}')
            continue
        found.append(f'{label} {mod.__version__}')
    return found, problems


def environment_report() -> Tuple[str, bool]:
    """Return ``(text, ok)``: a readable report and whether the stack is usable."""
    found, problems = collect_problems()
    lines = ['mmplugin_inline environment:'] + [f'  {f}' for f in found]
    if problems:
        lines.append('Problems:')
        lines += [f'  - {p}' for p in problems]
    else:
        lines.append('OK: torch, mmengine, mmcv (with ops), mmdet and mmseg are compatible.')
    return '\n'.join(lines), not problems


def assert_environment(stream=None) -> None:
    """Exit with a readable explanation when the stack is broken (used by tools/)."""
    text, ok = environment_report()
    if not ok:
        print(text, file=stream or sys.stderr)
        raise SystemExit(1)


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point: print the report, return 0 when usable."""
    text, ok = environment_report()
    print(text)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

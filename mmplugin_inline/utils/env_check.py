"""Explain, in words, what is wrong with the installed OpenMMLab stack.

Run as a command::

    python -m mmplugin_inline.utils.env_check

It prints the versions it found and, for every problem, what it means and how to fix
it, and exits with status 1 when there is a problem. ``tools/*.py`` call
:func:`assert_environment` before they import mmdet / mmseg, so a broken install is
reported as one readable message instead of a stack trace from deep inside mmcv.

Two OpenMMLab lines are supported (:mod:`.stacks`): the official releases and the
maintained fork (``onedl-*``). The check names the line it found, holds each package to
that line's own versions, and refuses a mix of the two, and a torch below the supported
floor (:data:`.stacks.TORCH_FLOOR`).
"""
import importlib
import sys
from typing import List, Optional, Tuple

from . import stacks

SETUP_HINTS = {
    stacks.OFFICIAL: (
        'Run `make setup` (or `bash scripts/setup_env.sh`) in the mmplugin_inline checkout: '
        'it builds mmcv with its ops for this torch and caches the wheel. On a GPU machine '
        'install a CUDA build of mmcv instead, e.g. `pip install -U openmim && mim install '
        '"mmcv>=2.0.0,<2.2.0"` (docs/environments.md).'),
    stacks.ONEDL: (
        'Run `make setup STACK=onedl` in the mmplugin_inline checkout: it builds onedl-mmcv '
        'with its ops for this torch and caches the wheel. On a GPU machine build it with '
        'FORCE_CUDA=1 (docs/environments.md).'),
}


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
    line, line_problems = stacks.detect_line()
    if line is not None:
        found.append(f'OpenMMLab line: {stacks.LINE_NAMES[line]}')
    problems += line_problems
    hint = SETUP_HINTS[line or stacks.OFFICIAL]
    torch, err = _try_import('torch')
    if torch is None:
        return found, problems + [f'PyTorch does not import ({err}). {hint}']
    found.append(f'torch {torch.__version__} (CUDA available: {torch.cuda.is_available()})')
    too_old = stacks.torch_problem(torch.__version__)
    if too_old is not None:
        problems.append(too_old)
    untested = stacks.torch_untested(torch.__version__)
    if untested is not None:
        found.append(f'note: {untested}')

    mmengine, err = _try_import('mmengine')
    if mmengine is None:
        return found, problems + [f'mmengine does not import ({err}). {hint}']
    found.append(f'mmengine {mmengine.__version__}')
    problems += _range_problems('mmengine', mmengine.__version__, line, hint)

    mmcv, err = _try_import('mmcv')
    if mmcv is None:
        problems.append(f'mmcv does not import ({err}). {hint}')
    else:
        found.append(f'mmcv {mmcv.__version__}')
        problems += _range_problems('mmcv', mmcv.__version__, line, hint)
        _, err = _try_import('mmcv._ext')
        if err is not None:
            if 'No module named' in str(err):
                why = ('mmcv is installed without its compiled ops (No module named '
                       "'mmcv._ext'): this is mmcv-lite or a source install built without "
                       'MMCV_WITH_OPS=1. Mask R-CNN needs mmcv.ops (RoIAlign, nms).')
            else:
                why = (f'mmcv\'s compiled ops fail to load ({err}): the mmcv binary was built '
                       'for another torch version. Rebuild it for the installed torch.')
            problems.append(f'{why} {hint}')

    for pkg, label in (('mmdet', 'mmdet'), ('mmseg', 'mmsegmentation')):
        mod, err = _try_import(pkg)
        if mod is None:
            if isinstance(err, ModuleNotFoundError) and err.name == pkg:
                found.append(f'{label} not installed')
            else:
                problems.append(f'{label} is installed but does not import ({err}). '
                                f'{hint}')
            continue
        found.append(f'{label} {mod.__version__}')
        problems += _range_problems(pkg, mod.__version__, line, hint)
    return found, problems


def _range_problems(module: str, version: str, line: Optional[str], hint: str) -> List[str]:
    """A problem when ``version`` of ``module`` lies outside its line's supported range.

    Without a known line (no distribution metadata, e.g. a source checkout on PYTHONPATH)
    a version is accepted when either line supports it.
    """
    comp = stacks.COMPONENT[module]
    lines = [line] if line is not None else list(comp.ranges)
    for candidate in lines:
        low, high = comp.ranges[candidate]
        if _version_tuple(low) <= _version_tuple(version) < _version_tuple(high):
            return []
    if line is None:
        need = ' or '.join(f'{low} <= {comp.label} < {high} ({stacks.LINE_NAMES[ln]})'
                           for ln, (low, high) in comp.ranges.items())
    else:
        low, high = comp.ranges[line]
        need = f'{low} <= {comp.label} < {high} for {stacks.LINE_NAMES[line]}'
    return [f'{comp.label} {version} is installed, but mmplugin_inline needs {need}. {hint}']


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
    """Exit with a readable explanation when the stack is broken (used by tools/).

    On a usable stack it also lets ``mmseg::`` / ``mmdet::`` config bases resolve on the
    installed line (:func:`.stacks.register_config_scopes`), before any config is read.
    """
    text, ok = environment_report()
    if not ok:
        print(text, file=stream or sys.stderr)
        raise SystemExit(1)
    stacks.register_config_scopes()


def main(argv: Optional[List[str]] = None) -> int:
    """Command-line entry point: print the report, return 0 when usable."""
    text, ok = environment_report()
    print(text)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

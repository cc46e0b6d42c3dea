"""The two OpenMMLab lines the plugin supports, and which one is installed.

OpenMMLab's own releases (``mmengine``, ``mmcv``, ``mmdet``, ``mmsegmentation``) stopped
in 2024; the maintained fork publishes the same import names (``mmengine``, ``mmcv``,
``mmdet``, ``mmseg``) under other distribution names (``onedl-mmengine``, ...). A line is
told by the *distribution* that provides each import, never by the import itself. Two
distributions of one import (``mmdet`` and ``onedl-mmdetection``, say) overwrite each
other's files, and a mix of the lines (official mmdet over the fork's mmcv) fails at run
time in ways far from the cause: both are reported by :mod:`.env_check`.

This module imports nothing of the package and no OpenMMLab code at import time.
"""
from dataclasses import dataclass
from importlib import metadata
from typing import Dict, List, Optional, Tuple

OFFICIAL = 'official'
ONEDL = 'onedl'


@dataclass(frozen=True)
class Component:
    """One import of the stack and its distribution and supported range in each line."""

    module: str
    label: str
    dists: Dict[str, str]  # line -> distribution name
    ranges: Dict[str, Tuple[str, str]]  # line -> (lowest supported, first refused)


# The ranges are what each line's codebases accept and what CI tests (the pins in
# requirements/pinned.txt and requirements/pinned-onedl.txt lie inside them).
COMPONENTS = (
    Component('mmengine', 'mmengine',
              {OFFICIAL: 'mmengine', ONEDL: 'onedl-mmengine'},
              {OFFICIAL: ('0.10.0', '1.0.0'), ONEDL: ('0.10.8', '1.0.0')}),
    # mmdet 3.x and mmsegmentation 1.x of the official line both refuse mmcv >= 2.2.0
    Component('mmcv', 'mmcv',
              {OFFICIAL: 'mmcv', ONEDL: 'onedl-mmcv'},
              {OFFICIAL: ('2.0.0rc4', '2.2.0'), ONEDL: ('2.2.0', '3.0.0')}),
    Component('mmdet', 'mmdet',
              {OFFICIAL: 'mmdet', ONEDL: 'onedl-mmdetection'},
              {OFFICIAL: ('3.0.0', '3.4.0'), ONEDL: ('3.4.0', '4.0.0')}),
    Component('mmseg', 'mmsegmentation',
              {OFFICIAL: 'mmsegmentation', ONEDL: 'onedl-mmsegmentation'},
              {OFFICIAL: ('1.0.0', '1.3.0'), ONEDL: ('1.3.0', '2.0.0')}),
)
COMPONENT = {c.module: c for c in COMPONENTS}

#: The supported torch range, on either line: the lowest release the plugin runs on (CI's
#: fork environment stands there, requirements/pinned-onedl.txt; setup.cfg states it) and
#: the newest one tested (the official environment, requirements/pinned.txt). A torch below
#: the floor is refused by the environment check and the GPU check; one above the tested
#: top is reported as untested, not refused.
TORCH_FLOOR = '2.8'
TORCH_TESTED = ('2.8.0', '2.14.1')


def release(version: str) -> Tuple[int, ...]:
    """The release numbers of a version string (``'2.6.0+cu124'`` -> ``(2, 6, 0)``), for
    comparing releases without any third-party parser (the GPU check runs this module
    before anything is installed)."""
    numbers = []
    for part in version.split('+')[0].split('.'):
        digits = ''
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):  # 0rc1, 1a0, 0.dev: the release ends here
            break
    return tuple(numbers)


def torch_problem(version: str) -> Optional[str]:
    """A message when torch ``version`` is below the supported floor, else None."""
    if release(version) >= release(TORCH_FLOOR):
        return None
    return (f'torch {version} is older than the lowest torch mmplugin_inline supports '
            f'({TORCH_FLOOR}; tested {TORCH_TESTED[0]} to {TORCH_TESTED[1]}): older torch '
            'fails in the ONNX export of whole models (its exporter lacks symbolic float '
            'ops and traces strictly by default). Use an environment with torch >= '
            f'{TORCH_FLOOR} (e.g. a newer cluster image or module, or a venv with '
            f'`pip install "torch>={TORCH_FLOOR}"`).')


def torch_untested(version: str) -> Optional[str]:
    """A note when torch ``version`` is newer than the newest tested release, else None."""
    if release(version)[:2] <= release(TORCH_TESTED[1])[:2]:
        return None
    return (f'torch {version} is newer than the newest tested release ({TORCH_TESTED[1]}); '
            'it is not refused, but untested.')
COMPONENT_BY_DIST = {dist: c for c in COMPONENTS for dist in c.dists.values()}
LINE_NAMES = {OFFICIAL: 'the official OpenMMLab releases',
              ONEDL: 'the maintained fork (onedl-* packages)'}
# mmcv-lite is the official line's mmcv without compiled ops: same line, same import
ALIASES = {'mmcv-lite': ('mmcv', OFFICIAL)}


def installed_version(dist: str) -> Optional[str]:
    """The installed version of a distribution, None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_lines(module: str) -> Dict[str, str]:
    """``{line: version}`` of every distribution installed for one import name."""
    comp = COMPONENT[module]
    found = {}
    for line, dist in comp.dists.items():
        version = installed_version(dist)
        if version is not None:
            found[line] = version
    for alias, (mod, line) in ALIASES.items():
        version = installed_version(alias)
        if mod == module and version is not None and line not in found:
            found[line] = version
    return found


def detect_line() -> Tuple[Optional[str], List[str]]:
    """Which line the installed distributions belong to.

    Returns:
        tuple[str | None, list[str]]: the line (``'official'`` / ``'onedl'``; None when
        no OpenMMLab distribution is installed, or they mix the lines) and one message per
        problem: two distributions of one import, or imports from both lines.
    """
    problems = []
    per_line: Dict[str, List[str]] = {OFFICIAL: [], ONEDL: []}
    for comp in COMPONENTS:
        found = installed_lines(comp.module)
        if len(found) > 1:
            names = ' and '.join(f'{comp.dists[line]} {v}' for line, v in sorted(found.items()))
            problems.append(
                f'{names} are both installed: they write the same package `{comp.module}` '
                'over each other. Keep one line: `pip uninstall -y '
                f'{comp.dists[OFFICIAL]} {comp.dists[ONEDL]}`, then install the one you '
                f'use (`pip install {comp.dists[ONEDL]}` for the fork).')
        for line in found:
            per_line[line].append(comp.dists[line])
    if per_line[OFFICIAL] and per_line[ONEDL]:
        if not problems:
            ours = OFFICIAL if len(per_line[OFFICIAL]) > len(per_line[ONEDL]) else ONEDL
            other = ONEDL if ours == OFFICIAL else OFFICIAL
            swap = ' '.join(
                f'{COMPONENT_BY_DIST[d].dists[ours]}' for d in per_line[other])
            problems.append(
                f'the stack mixes two OpenMMLab lines: {", ".join(per_line[OFFICIAL])} '
                f'from {LINE_NAMES[OFFICIAL]} with {", ".join(per_line[ONEDL])} from '
                f'{LINE_NAMES[ONEDL]}; they are not built against each other. Use one '
                f'line: `pip uninstall -y {" ".join(per_line[other])}`, then install '
                f'`{swap}` (or the other way round).')
        return None, problems
    if per_line[ONEDL]:
        return ONEDL, problems
    if per_line[OFFICIAL]:
        return OFFICIAL, problems
    return None, problems



def register_config_scopes() -> None:
    """Let ``mmseg::`` / ``mmdet::`` config bases resolve to the fork's distributions.

    mmengine finds the folder of an ``mmseg::`` base through the *distribution* named in
    its table (``mmseg`` -> ``mmsegmentation``); the fork installs ``onedl-mmsegmentation``,
    so every config with an ``mmseg::`` base fails there with "mmsegmentation is not
    installed". Where a codebase is installed only as the fork's distribution, the table
    entry is pointed at it (a change of mmengine's dict in memory, nothing on disk).
    Idempotent; a no-op on the official line and without mmengine.
    """
    try:
        from mmengine.config import utils as config_utils
    except ImportError:
        return
    table = getattr(config_utils, 'MODULE2PACKAGE', None)
    if table is None:
        table = getattr(config_utils, 'PKG2PROJECT', None)
    if table is None:
        return
    for comp in COMPONENTS:
        if comp.module not in table:
            continue
        found = installed_lines(comp.module)
        if ONEDL in found and OFFICIAL not in found:
            table[comp.module] = comp.dists[ONEDL]

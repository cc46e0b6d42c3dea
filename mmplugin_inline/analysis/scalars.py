"""The one reader of a run's json log: mmengine's ``LocalVisBackend`` writes one json
object per line to ``WORK_DIR/<timestamp>/vis_data/scalars.json`` (training lines with
``loss`` and ``lr``, validation lines with the metrics); a resumed run continues in a new
timestamped folder of the same work directory."""
import glob
import json
import os.path as osp
from typing import List

#: where a run's json log lies, relative to its work directory
SCALARS_PATTERN = osp.join('*', 'vis_data', 'scalars.json')


class ScalarsError(ValueError):
    """A line of a json log that is not json (``line``: its number, from 1)."""

    def __init__(self, path: str, line: int):
        super().__init__(f'{path}, line {line}, is not json')
        self.path, self.line = path, line


def scalars_files(work_dir: str) -> List[str]:
    """The json logs of the runs in ``work_dir``, oldest first."""
    return sorted(glob.glob(osp.join(work_dir, SCALARS_PATTERN)))


def read_scalars_file(path: str) -> List[dict]:
    """The json lines of one log, in order (blank lines skipped).

    Raises:
        ScalarsError: a line that is not json.
    """
    lines = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ScalarsError(path, number) from None
    return lines


def read_scalars(work_dir: str) -> List[dict]:
    """Every line logged by the runs in ``work_dir``, in order (empty without a log)."""
    return [line for path in scalars_files(work_dir) for line in read_scalars_file(path)]

"""Writes the model zoo tables from the metafiles when the manual is built.

The page ``model_zoo.md`` includes ``_generated/model_zoo_tables.md``, which this
extension writes from ``model-index.yml`` and the metafiles it imports (read, not
measured again), so the manual cannot disagree with them.
"""
import os
from typing import Dict, List

import yaml

TASKS = (('backbone', 'Backbones (the authors\' ImageNet-1k presets)'),
         ('Instance Segmentation', 'COCO instance segmentation (mmdet 3.x)'),
         ('Semantic Segmentation', 'Semantic segmentation (mmseg 1.x)'))


def read_models(root: str) -> List[dict]:
    """Every model entry of the metafiles that ``model-index.yml`` imports."""
    with open(os.path.join(root, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    models = []
    for rel in index['Import']:
        with open(os.path.join(root, rel)) as f:
            models += yaml.safe_load(f).get('Models', [])
    return models


def _task(model: dict) -> str:
    md = model.get('Metadata', {})
    if 'Task' in md:
        return md['Task']
    tasks = {r.get('Task') for r in model.get('Results') or [] if r.get('Task')}
    return tasks.pop() if len(tasks) == 1 else 'backbone'


def _num(value, unit: float) -> str:
    return f'{value / unit:.1f}' if isinstance(value, (int, float)) else ''


def model_zoo_tables(root: str) -> str:
    """One Markdown table per task, one row per model, from the metafiles."""
    by_task: Dict[str, List[dict]] = {}
    for model in read_models(root):
        by_task.setdefault(_task(model), []).append(model)
    out = []
    for task, title in TASKS + tuple((t, t) for t in sorted(by_task)
                                     if t not in dict(TASKS)):
        models = by_task.get(task)
        if not models:
            continue
        out += [f'## {title}', '',
                '| name | backbone | params M (model / backbone) | FLOPs G (model / backbone) '
                '| input | config or checkpoint file |', '|---|---|---|---|---|---|']
        for model in models:
            md = model.get('Metadata', {})
            params = ' / '.join(p for p in (_num(md.get('Parameters'), 1e6),
                                            _num(md.get('Backbone Parameters'), 1e6)) if p)
            flops = ' / '.join(p for p in (_num(md.get('FLOPs'), 1e9),
                                           _num(md.get('Backbone FLOPs'), 1e9)) if p)
            where = model.get('Config') or md.get('Checkpoint File') or ''
            backbone = md.get('Backbone', model.get('In Collection', ''))
            out.append(f"| {model['Name']} | {backbone} | {params} | "
                       f"{flops} | {md.get('Input Shape', '')} | `{where}` |")
        out.append('')
    return '\n'.join(out)


def _write(app):
    text = model_zoo_tables(os.path.dirname(app.srcdir))
    out_dir = os.path.join(app.srcdir, '_generated')
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, 'model_zoo_tables.md')
    old = open(path).read() if os.path.exists(path) else None
    if old != text:  # unchanged tables keep their time stamp (no needless rebuild)
        with open(path, 'w') as f:
            f.write(text)


def setup(app):
    app.connect('builder-inited', _write)
    return {'parallel_read_safe': True, 'parallel_write_safe': True}

"""Every command README and the manual show still works: the script or make target exists,
and its arguments parse with the tool's own parser, in this process.

Commands are collected from code blocks (fenced and indented) and inline code of
``README.md`` and ``docs/**/*.md``: lines that run ``python tools/...``,
``python demo/...``, ``python scripts/...``, ``bash tools/...`` or ``make ...``.
Synopses are read as a user would: an optional ``[--option ...]`` group is taken, a
placeholder group (``[train.py options]``, ``[...]``) and ``...`` are left out, a choice
``{a,b}`` takes its first value, and upper-case placeholders (``CONFIG``,
``WORK_DIR``, ...) become real files. The quick-start config of README is built and
run for one forward pass.
"""
import glob
import importlib
import os
import re
import shlex

import pytest
import torch

from helpers.paths import REPO

ROOT = REPO
PAGES = ['README.md'] + sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'),
                                         recursive=True))
DEMO_DET = 'configs/demo/mask-rcnn_inline-pvt-t_fpn_shapes-demo.py'
STARTS = re.compile(
    r'^(?:[A-Z_]+=\S+\s+)*(?:python\s+(?:tools|demo|scripts)/|bash\s+tools/|make\s)')

#: tool script -> the package module whose parse_args(argv) reads its arguments
CLI = {
    'tools/train.py': 'mmplugin_inline.cli.train',
    'tools/test.py': 'mmplugin_inline.cli.test',
    'demo/image_demo.py': 'mmplugin_inline.cli.image_demo',
    'scripts/gen_model_index.py': 'scripts.gen_model_index',
    'scripts/gpu_check.py': 'scripts.gpu_check',
}
#: shell launchers: script -> (tool module, how many leading positionals are the launcher's,
#: which of them the tool receives and how)
LAUNCHERS = {
    'tools/dist_train.sh': ('mmplugin_inline.cli.train', 2, lambda a: [a[0]]),
    'tools/dist_test.sh': ('mmplugin_inline.cli.test', 3, lambda a: [a[0], a[1]]),
    'tools/slurm_train.sh': ('mmplugin_inline.cli.train', 4,
                             lambda a: [a[2], f'--work-dir={a[3]}']),
    'tools/slurm_test.sh': ('mmplugin_inline.cli.test', 4, lambda a: [a[2], a[3]]),
}


def _cli_module(script: str) -> str:
    if script in CLI:
        return CLI[script]
    if script.startswith('tools/') and script.endswith('.py'):
        return 'mmplugin_inline.cli.' + os.path.splitext(os.path.basename(script))[0]
    raise AssertionError(f'no parser known for {script}: add it to CLI in this test')


def _code_lines(text: str):
    """Lines of fenced and indented code blocks, and inline code spans."""
    fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('```'):
            fence = not fence
            continue
        if fence or (line.startswith('    ') and stripped):
            yield stripped
        else:
            yield from re.findall(r'`([^`]+)`', line)


def collect_commands():
    """(page, command) for every command shown, continuation lines joined."""
    found = []
    for page in PAGES:
        with open(os.path.join(ROOT, page)) as f:
            lines = list(_code_lines(f.read()))
        i = 0
        while i < len(lines):
            line = lines[i]
            if STARTS.match(line):
                while line.endswith('\\') and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + ' ' + lines[i]
                found.append((os.path.relpath(os.path.join(ROOT, page), ROOT),
                              line.split(' #')[0].strip()))
            i += 1
    return found


COMMANDS = collect_commands()


def _synopsis_tokens(command: str):
    """The argument list a user would type for a synopsis (see the module docstring)."""
    tokens = shlex.split(command.replace('[', ' [ ').replace(']', ' ] '))
    out, stack = [], []  # stack: for each open group, whether it is kept
    for i, tok in enumerate(tokens):
        if tok == '[':
            nxt = tokens[i + 1] if i + 1 < len(tokens) else ''
            kept = (not stack or all(stack)) and (nxt.startswith('-') or bool(stack))
            stack.append(kept and nxt != '...')
            continue
        if tok == ']':
            stack.pop()
            continue
        if stack and not all(stack) or tok in ('...', '|'):
            continue
        m = re.fullmatch(r'\{([^,}]+),[^}]*\}', tok)
        out.append(m.group(1) if m else tok)
    return out


@pytest.fixture(scope='module')
def placeholders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('doc_commands')
    ckpt = tmp / 'ckpt.pth'
    torch.save({'state_dict': {}, 'meta': {}}, ckpt)
    log = tmp / 'scalars.json'
    log.write_text('{"loss": 1.0, "step": 1}\n')
    preds = tmp / 'preds.pkl'
    preds.write_bytes(b'')
    values = {
        'CONFIG': DEMO_DET, 'CKPT': str(ckpt), 'CHECKPOINT': str(ckpt), 'SRC': str(ckpt),
        'DST': str(tmp / 'published.pth'), 'WORK_DIR': str(tmp / 'work'), 'DIR': str(tmp),
        'SAVE_DIR': str(tmp / 'cm'), 'FILE': str(tmp / 'out.pkl'),
        'FILE.onnx': str(tmp / 'model.onnx'), 'MODEL.onnx': str(tmp / 'model.onnx'),
        'IMAGE_OR_DIR': 'demo/shapes.jpg', 'LOG.json': str(log), 'PREDICTIONS': str(preds),
        'INPUTS': 'demo/shapes.jpg', 'NUM_PROCS': '2', 'N': '2', 'PARTITION': 'gpu',
        'JOB_NAME': 'job', 'KEY=VALUE': 'train_cfg.max_iters=1', 'H': '64', 'W': '64',
        'S': '1', 'OUT': str(tmp / 'shapes'), 'PX': '64', 'NAME': 'InLinePVT', 'FRACTION': '0.5',
        'PATH': str(ckpt), 'URL': 'https://example.invalid/x.pth',
        # block types of compare_mixers.py's variants: real values, not placeholders
        'SSSS': 'SSSS', 'LLLL': 'LLLL', 'IIII': 'IIII',
    }
    return values


def _fill(tokens, values):
    filled = []
    for tok in tokens:
        if tok in values:
            filled.append(values[tok])
        elif re.fullmatch(r'[A-Z][A-Z_]+(\.[a-z]+)?', tok):
            raise AssertionError(f'placeholder {tok!r}: give it a real value in this test')
        else:
            filled.append(tok)
    return filled


def _make_targets():
    with open(os.path.join(ROOT, 'Makefile')) as f:
        return set(re.findall(r'^([A-Za-z][\w-]*):', f.read(), flags=re.M))


def _parse(module_name: str, argv):
    module = importlib.import_module(module_name)
    parse = getattr(module, 'parse_args', None)
    assert parse is not None, f'{module_name} has no parse_args(argv)'
    try:
        return parse(argv)
    except SystemExit as exc:  # argparse's error: name the command that broke
        raise AssertionError(f'{module_name} refused {argv}: exit {exc.code}') from exc


def test_the_pages_show_commands():
    pages = {page for page, _ in COMMANDS}
    assert len(COMMANDS) >= 40, COMMANDS
    assert 'README.md' in pages and 'docs/user_guides/tools.md' in pages


@pytest.mark.parametrize('page,command', COMMANDS, ids=[f'{p}:{c[:60]}' for p, c in COMMANDS])
def test_a_shown_command_exists_and_its_arguments_parse(page, command, placeholders,
                                                         monkeypatch):
    monkeypatch.chdir(ROOT)
    tokens = _synopsis_tokens(command)
    while tokens and re.fullmatch(r'[A-Z_]+=\S+', tokens[0]):
        tokens.pop(0)                                   # GPUS=16 bash tools/...
    runner, *rest = tokens
    if runner == 'make':
        missing = [t for t in rest if not t.startswith('-') and '=' not in t
                   and t not in _make_targets()]
        assert not missing, f'{page}: make target(s) {missing} not in the Makefile'
        return
    script, *args = rest
    assert os.path.isfile(os.path.join(ROOT, script)), f'{page}: {script} does not exist'
    args = _fill(args, placeholders)
    if script == 'tools/demo.sh':
        assert args[:1] in ([], ['det'], ['seg']), args
        return
    if script in LAUNCHERS:
        module, n, to_tool = LAUNCHERS[script]
        assert len(args) >= n, f'{page}: {script} takes {n} leading arguments: {args}'
        _parse(module, to_tool(args[:n]) + args[n:])
        return
    assert runner in ('python', 'bash'), command
    _parse(_cli_module(script), args)


def _quick_start_config() -> str:
    with open(os.path.join(ROOT, 'README.md')) as f:
        text = f.read()
    section = text[text.index('## Quick start'):]
    return re.search(r'```python\n(.*?)```', section, flags=re.S).group(1)


def test_the_quick_start_config_builds_and_runs_a_forward_pass(tmp_path):
    from mmengine.config import Config

    from mmplugin_inline.analysis.model_and_batch import build_model, preprocess_dummy
    path = tmp_path / 'my_config.py'
    path.write_text(_quick_start_config())
    cfg = Config.fromfile(str(path))
    assert cfg.model.backbone.type == 'InLinePVT'
    cfg.model.backbone.init_cfg = None  # no released weights on a test machine
    model = build_model(cfg).eval()
    batch = preprocess_dummy(model, 'mmdet', (96, 128))
    with torch.no_grad():
        feats = model.extract_feat(batch['inputs'])
        results = model.predict(batch['inputs'], batch['data_samples'])
    assert [f.shape[1] for f in feats] == [256] * 5
    assert len(results) == 1 and hasattr(results[0], 'pred_instances')


def test_synopses_are_read_as_a_user_would():
    assert _synopsis_tokens('python tools/train.py CONFIG [--work-dir DIR] [--amp] '
                            '[--resume [CHECKPOINT]] [--launcher {none,pytorch}] '
                            '[train.py options] [...]') == [
        'python', 'tools/train.py', 'CONFIG', '--work-dir', 'DIR', '--amp', '--resume',
        'CHECKPOINT', '--launcher', 'none']
    assert _synopsis_tokens('GPUS=16 bash tools/slurm_train.sh P J CONFIG W '
                            '[train.py options]') == [
        'GPUS=16', 'bash', 'tools/slurm_train.sh', 'P', 'J', 'CONFIG', 'W']

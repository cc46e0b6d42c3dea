"""The whole-model race's tables (:mod:`mmplugin_inline.analysis.model_race`): every case,
then whole against slide where both ran."""
from typing import List, Optional


def ratio(a, b) -> Optional[float]:
    """a / b, or None if either is missing or b is zero."""
    return a / b if a is not None and b else None


def fmt(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or '-' when it is None."""
    return '-' if value is None else format(value, spec)


def markdown(rows: List[dict], env: dict) -> str:
    """The race's tables: every case, then whole against slide where both ran."""
    header = (
        f"Device: {env['device']} ({env['threads']} threads), torch {env['torch']}; "
        f"{env['repeats']} interleaved repeat(s) after {env['warmup']} warm-up (medians); load "
        f"average {env['load_start']} at the start, {env.get('load_end', '?')} at the end. "
        'Random weights. Inference: batch 1, data preprocessor + test_step (predict).')
    if any(r['kind'] == 'train' for r in rows):
        header += (f" Training step: batch {env['train_batch']} with ground truth, forward "
                   'with losses + backward, no optimizer step.')
    header += ' Time per image; peak: extra memory during one call.'
    if env.get('detections'):
        header += (f" Detectors keep {env['detections']} detections per image (score "
                   'threshold 0).')
    lines = [
        header,
        '',
        '| pair | case | size | mode | ours s/img | peer s/img | speed-up (peer / ours) | '
        'ours / peer peak MiB | note |',
        '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        speed = ratio(r['peer_s'], r['ours_s'])
        lines.append(
            f"| {r['ours']} vs {r['peer']} | {r['kind']} | {r['size']} | {r['mode']} | "
            f"{fmt(r['ours_s'], '.3f')} | {fmt(r['peer_s'], '.3f')} | "
            f"{fmt(speed, '.2f')}{'x' if speed is not None else ''} | "
            f"{fmt(r['ours_peak_mb'], ',.0f')} / {fmt(r['peer_peak_mb'], ',.0f')} | "
            f"{r.get('note', '')} |")
    slides = [r for r in rows if r['mode'] == 'slide' and r['ours_s'] and r['peer_s']]
    pairs_of_modes = []
    for s in slides:
        whole = next((r for r in rows if r['pair'] == s['pair'] and r['size'] == s['size'] and
                      r['mode'] == 'whole' and r['ours_s'] and r['peer_s']), None)
        if whole is not None:
            pairs_of_modes.append((whole, s))
    if pairs_of_modes:
        lines += [
            '', 'Whole against slide (s/img; slide / whole > 1: one whole pass is cheaper; '
            'the last column: how much faster our whole pass is than the softmax model '
            'sliding):', '',
            '| pair | size | crops | ours whole | ours slide | ours slide / whole | '
            'peer whole | peer slide | peer slide / whole | peer slide / ours whole |',
            '|---|---|---|---|---|---|---|---|---|---|']
        for whole, s in pairs_of_modes:
            lines.append(
                f"| {whole['ours']} vs {whole['peer']} | {s['size']} | {s.get('crops', '-')} | "
                f"{whole['ours_s']:.3f} | {s['ours_s']:.3f} | "
                f"{ratio(s['ours_s'], whole['ours_s']):.2f} | {whole['peer_s']:.3f} | "
                f"{s['peer_s']:.3f} | {ratio(s['peer_s'], whole['peer_s']):.2f} | "
                f"{ratio(s['peer_s'], whole['ours_s']):.2f}x |")
    counts = [r for r in rows if r.get('ours_instances') is not None]
    if counts:
        lines += ['', 'Detections per image in the last timed call (the mask head and the '
                  'pasting of masks work on these): ' +
                  '; '.join(f"{r['size']}: ours {r['ours_instances']}, peer "
                            f"{r.get('peer_instances')}" for r in counts)]
    return '\n'.join(lines) + '\n'

"""Show the paper's point on real tensors: linear attention is not injective, InLine is.

Plain linear attention normalises by the sum, so queries that differ by a scale
(``q`` and ``c q`` under identity / ReLU / LeakyReLU kernels) or by a constant shift
under the exp kernel (``phi(q + c) = e^{0.2c} phi(q)``) get the *same* attention
distribution. InLine attention subtracts the mean score instead and keeps them apart.
Also draws the attention distributions of a few queries over a 2-D token map for
InLine, linear and softmax attention (PNG).

The distributions are the layers' own: each is the output of the backbones' mixer
('I', 'L', 'S', without local residual) for values V = I, whose rows are the attention
weights. Plain linear attention with the identity or LeakyReLU map, which the 'L' mixer
refuses (its normaliser can be zero), comes from the definition in
``mmplugin_inline.core.reference`` (``source`` in the JSON says which).

    python tools/analysis_tools/injectivity.py --out-dir work_dirs/injectivity
"""
import argparse
import json
import math
import os

import torch

from ..core import ATTENTION_WEIGHTS

#: the analysis' names of the attention functions -> the backbones' block letters
LETTERS = {'inline': 'I', 'linear': 'L', 'softmax': 'S'}


def layer_weights(name, q, k, kernel='identity'):
    """Attention weights [1, 1, Nq, N] as the backbones' mixer of ``name`` computes them
    (its output for V = I; no local residual), and where they came from: ``'layer'``, or
    ``'definition'`` (``core.reference``) for a feature map the mixer refuses."""
    from ..models.layers import build_mixer
    d, n = q.shape[-1], k.shape[-2]
    try:
        mixer = build_mixer(LETTERS[name], d, 1, kernel=None if name == 'softmax' else kernel,
                            local_residual=False)
    except ValueError:  # plain linear attention with a map that can zero its normaliser
        return ATTENTION_WEIGHTS[name](q, k, kernel=kernel), 'definition'
    with torch.no_grad():
        rows = mixer.to(q.dtype)(q[0], k[0], torch.eye(n, dtype=q.dtype)[None])
    return rows[None], 'layer'


def token_map(h, w, dim, seed=0):
    """Tokens with 2-D structure: sinusoidal position features mixed by a random
    projection, plus noise, then q / k projections (as an attention layer would)."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64),
                            torch.arange(w, dtype=torch.float64), indexing='ij')
    freqs = torch.arange(1, dim // 4 + 1, dtype=torch.float64) * math.pi / max(h, w)
    feats = torch.cat([torch.sin(ys.reshape(-1, 1) * freqs), torch.cos(ys.reshape(-1, 1) * freqs),
                       torch.sin(xs.reshape(-1, 1) * freqs), torch.cos(xs.reshape(-1, 1) * freqs)],
                      dim=1)
    x = feats @ torch.randn(feats.shape[1], dim, generator=g, dtype=torch.float64)
    x = x + 0.3 * torch.randn(h * w, dim, generator=g, dtype=torch.float64)
    wq = torch.randn(dim, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    wk = torch.randn(dim, dim, generator=g, dtype=torch.float64) / dim ** 0.5
    return (x @ wq)[None, None], (x @ wk)[None, None]  # [1, 1, N, d]


def distance(a, b):
    """Largest difference between two attention distributions (rows)."""
    return (a - b).abs().max().item()


def injectivity_cases(q, k):
    """Pairs of different queries and how far apart each attention maps their rows."""
    cases = []
    query = q[:, :, :1]
    for kernel, other, label in (('relu', 2 * query, 'q vs 2q, ReLU kernel'),
                                 ('identity', 2 * query, 'q vs 2q, identity kernel'),
                                 ('leakyrelu', 3 * query, 'q vs 3q, LeakyReLU kernel'),
                                 ('exp', query + 1.5, 'q vs q + 1.5, exp(0.2x) kernel')):
        pair = torch.cat([query, other], dim=2)
        row = dict(case=label, kernel=kernel)
        for name in ('linear', 'inline'):
            w, row[f'{name}_source'] = layer_weights(name, pair, k, kernel)
            row[name] = distance(w[..., 0, :], w[..., 1, :])
        cases.append(row)
    return cases


def draw(q, k, hw, queries, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = [('inline', 'InLine'), ('linear', 'linear (ReLU)'), ('softmax', 'softmax')]
    fig, axes = plt.subplots(len(names), len(queries), figsize=(3 * len(queries), 3 * len(names)))
    for r, (name, title) in enumerate(names):
        w, _ = layer_weights(name, q, k, kernel='relu' if name == 'linear' else 'identity')
        for c, (qy, qx) in enumerate(queries):
            ax = axes[r, c]
            ax.imshow(w[0, 0, qy * hw[1] + qx].reshape(hw).numpy(), cmap='viridis')
            ax.plot([qx], [qy], 'r+', markersize=12)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(title)
            if r == 0:
                ax.set_title(f'query at ({qy}, {qx})')
    fig.suptitle('attention of single queries over a 2-D token map')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, nargs=2, default=(14, 14), metavar=('H', 'W'))
    parser.add_argument('--dim', type=int, default=32)
    parser.add_argument('--out-dir', default='work_dirs/injectivity')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hw = tuple(args.size)
    q, k = token_map(*hw, args.dim)
    cases = injectivity_cases(q, k)
    print(f"{'queries':32s} {'linear attention':>18s} {'InLine attention':>18s}")
    for row in cases:
        note = '' if row['linear_source'] == 'layer' else '  (linear: the definition; ' \
            "the 'L' blocks refuse this kernel)"
        print(f"{row['case']:32s} {row['linear']:18.2e} {row['inline']:18.2e}{note}")
    print('(largest difference between the two queries\' attention distributions)')
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, 'injectivity.json'), 'w') as f:
        json.dump(cases, f, indent=1)
    queries = [(hw[0] // 4, hw[1] // 4), (hw[0] // 2, hw[1] // 2), (3 * hw[0] // 4, hw[1] - 2)]
    path = os.path.join(args.out_dir, 'attention_maps.png')
    draw(q, k, hw, queries, path)
    print(f'written: {path}')
    return cases


"""Build every InLine backbone preset and run it on one odd-sized image (CPU)."""
import argparse
import time

import torch

import mmplugin_inline  # noqa: F401  (registers the backbones)
from mmplugin_inline.registry import MODELS

PRESETS = [('InLinePVT', 't'), ('InLineSwinTransformer', 't'), ('InLineCSWinTransformer', 't'),
           ('InLineDeiT', 't')]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--shape', type=int, nargs=2, default=(225, 301), metavar=('H', 'W'))
    args = parser.parse_args()
    x = torch.randn(1, 3, *args.shape)
    for name, arch in PRESETS:
        model = MODELS.build(dict(type=name, arch=arch)).eval()
        params = sum(p.numel() for p in model.parameters()) / 1e6
        start = time.perf_counter()
        with torch.no_grad():
            outs = model(x)
        shapes = ', '.join('x'.join(map(str, o.shape[1:])) for o in outs)
        print(f'{name}-{arch}: {params:.1f}M params, input {args.shape[0]}x{args.shape[1]} -> '
              f'[{shapes}] in {time.perf_counter() - start:.2f}s')


if __name__ == '__main__':
    main()

"""The benchmarks' log-log figures (time or memory against input size) and the fitted
slope of such a curve (1: linear in the size, 2: quadratic)."""
import math
from typing import List, Optional, Sequence, Tuple


def fitted_slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of log y against log x over ``(x, y)`` points (None with fewer
    than two distinct x)."""
    pts = [(math.log(x), math.log(y)) for x, y in points]
    if len({p for p, _ in pts}) < 2:
        return None
    mx = sum(p for p, _ in pts) / len(pts)
    my = sum(t for _, t in pts) / len(pts)
    return sum((p - mx) * (t - my) for p, t in pts) / sum((p - mx) ** 2 for p, _ in pts)


def loglog_figure(panels: List[dict], path: str, figsize: Tuple[float, float],
                  legend_fontsize: Optional[float] = None, legend_first_only: bool = False,
                  dpi: int = 110) -> str:
    """Draw ``panels`` side by side on log-log axes and save the figure to ``path``
    (matplotlib's Agg backend: no window).

    Each panel is ``dict(lines=[(label, xs, ys, style)], xlabel=..., ylabel=None,
    title=...)``; ``style`` is a matplotlib format string ('-o'). A panel's legend is
    drawn when it has lines (only the first panel's with ``legend_first_only``).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(panels), figsize=figsize, squeeze=False)
    for i, (ax, panel) in enumerate(zip(axes[0], panels)):
        for label, xs, ys, style in panel['lines']:
            ax.loglog(xs, ys, style, label=label)
        ax.set_xlabel(panel['xlabel'])
        if panel.get('ylabel'):
            ax.set_ylabel(panel['ylabel'])
        ax.set_title(panel['title'])
        ax.grid(True, which='both', alpha=0.3)
        if (i == 0 or not legend_first_only) and ax.get_legend_handles_labels()[0]:
            ax.legend(**({} if legend_fontsize is None else dict(fontsize=legend_fontsize)))
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path

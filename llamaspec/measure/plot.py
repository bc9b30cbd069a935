"""A bar chart of a bench report's speed-ups (matplotlib, an optional dependency)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .report import BenchReport

PLOT_HINT = "--plot needs matplotlib: pip install 'llamaspec[plot]'"


def require_matplotlib() -> None:
    """ConfigError telling how to install matplotlib when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(PLOT_HINT) from None


def write_plot(report: BenchReport, path: Path) -> None:
    """Each strategy's speed-up over plain, grouped by prompt, and the copy-oracle bound, as PNG."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = [p.name for p in report.prompts]
    strategies = [s.name for s in report.strategies if s.name != "plain"] or ["plain"]
    speedup = {(r.prompt, r.strategy): r.speedup for r in report.rows}
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(prompts)), 4))
    for j, name in enumerate(strategies):
        xs = [i + (j - (len(strategies) - 1) / 2) * width for i in range(len(prompts))]
        ax.bar(xs, [speedup[(p, name)] for p in prompts], width, label=name)
    bounds = [p.copy_bound for p in report.prompts]
    ax.scatter(range(len(prompts)), bounds, marker="_", s=2000, color="black", label="copy-oracle bound", zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(prompts)))
    ax.set_xticklabels(prompts)
    ax.set_ylabel("decode speed-up over plain")
    ax.set_title(f"{Path(report.settings.model).name}, {report.settings.n_predict} tokens, "
                 f"{report.machine.threads} threads ({report.machine.backend})")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

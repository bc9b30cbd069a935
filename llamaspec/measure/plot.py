"""A bench report as a picture (matplotlib, an optional dependency): each strategy's speed-up per
prompt, and under it which draft sources supplied the tokens (stacked bars)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from ..errors import ConfigError
from .report import BenchReport, Row

PLOT_HINT = "--plot needs matplotlib: pip install 'llamaspec[plot]'"


def require_matplotlib() -> None:
    """ConfigError telling how to install matplotlib when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(PLOT_HINT) from None


def write_plot(report: BenchReport, path: Path) -> None:
    """Each strategy's speed-up over plain, grouped by prompt, and the copy-oracle bound; under it,
    the share of each strategy's generated tokens each draft source supplied (``accepted_shares``,
    stacked: what is left up to 1 the target chose itself), as PNG."""
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = [p.name for p in report.prompts]
    strategies = [s.name for s in report.strategies if s.name != "plain"] or ["plain"]
    rows = {(r.prompt, r.strategy): r for r in report.rows}
    width = 0.8 / len(strategies)
    fig, (ax, below) = plt.subplots(2, 1, figsize=(max(6.0, 1.8 * len(prompts)), 7), sharex=True,
                                    gridspec_kw={"height_ratios": [4, 3]})
    offsets = [(j - (len(strategies) - 1) / 2) * width for j in range(len(strategies))]
    for j, name in enumerate(strategies):
        ax.bar([i + offsets[j] for i in range(len(prompts))], [rows[(p, name)].speedup for p in prompts], width,
               label=name)
    bounds = [p.copy_bound for p in report.prompts]
    ax.scatter(range(len(prompts)), bounds, marker="_", s=2000, color="black", label="copy-oracle bound", zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("decode speed-up over plain")
    ax.set_title(f"{Path(report.settings.model).name}, {report.settings.n_predict} tokens, "
                 f"{report.machine.threads} threads ({report.machine.backend})")
    ax.legend(fontsize="small")

    shares = {key: accepted_shares(row) for key, row in rows.items()}
    sources = sorted({name for share in shares.values() for name in share})
    colours = plt.get_cmap("Set2")  # not the strategies' colours above: a source is not a strategy
    for j, name in enumerate(strategies):
        xs = [i + offsets[j] for i in range(len(prompts))]
        bottom = [0.0] * len(prompts)
        for k, source in enumerate(sources):
            heights = [shares[(p, name)].get(source, 0.0) for p in prompts]
            below.bar(xs, heights, width * 0.9, bottom=bottom, color=colours(k % 8),
                      label=source if j == 0 else None, edgecolor="white", linewidth=0.5)
            bottom = [b + h for b, h in zip(bottom, heights)]
        if len(strategies) > 1:
            for x in xs:
                below.text(x, 1.02, name, rotation=90, ha="center", va="bottom", fontsize="x-small")
    below.set_ylim(0, 1.25 if len(strategies) > 1 else 1.0)
    below.set_ylabel("generated tokens\nsupplied by a source")
    below.set_xticks(range(len(prompts)))
    below.set_xticklabels(prompts)
    if sources:
        below.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0), title="source")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def accepted_shares(row: Row) -> Dict[str, float]:
    """The share of a row's generated tokens each draft source supplied: its accepted tokens'
    part of all the sources' (a token two sources proposed counts for both there) times the
    accepted share of the tokens; the rest the target chose itself."""
    total = sum(s.accepted for s in row.sources.values())
    if not total or not row.n_predict:
        return {}
    accepted = row.n_accept / row.n_predict
    return {name: accepted * s.accepted / total for name, s in row.sources.items() if s.accepted}

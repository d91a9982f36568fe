"""Competition probes (issue 31): N* against context length, support against background.

Three panels, each reading one of the probes' long tables:

- ``fig_nstar_vs_length`` (``context_nstar``): N*_tau against the context length L on
  log-log axes, one line per tau (and ranking, scoring), bootstrap intervals as bars;
- ``fig_support_vs_background`` (``qa_support_summary``): one support statistic (mass,
  displacement, ...) against the background length, one line per split;
- ``fig_support_recall_map`` (``qa_support``): a layer x head map of support recall@64
  (or any statistic) at one background.
"""

from __future__ import annotations

import numpy as np

from attngeom.figures import style
from attngeom.figures._common import draw_layer_head_map, layer_head_grid, pick
from attngeom.figures.style import Drawn, styled

# axis labels: short enough for a 2.6-inch axis (the captions define each statistic)
STAT_LABELS = {
    "displacement": "support displacement",
    "mass": "support attention mass",
    "recall": "support recall@64",
    "outranking": "outranking probability",
}


def _yerr(rows, value: str, low: str, high: str):
    v, lo, hi = (rows[c].to_numpy(float) for c in (value, low, high))
    return np.vstack([np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)])


@styled
def fig_nstar_vs_length(context_nstar, *, model=None, corpus=None, scoring: str = "tail",
                        ranking: str | None = None, mode: str | None = None, ax=None,
                        legend: bool = True) -> Drawn:
    """N*_tau against the context length L (log-log), one line per (ranking, mode, tau).

    Reads ``length, tau, nstar, nstar_low, nstar_high, ranking, mode, scoring``.
    """
    ax = style.axes_or_new(ax)
    rows = pick(context_nstar, "context_nstar", model=model, corpus=corpus, scoring=scoring,
                ranking=ranking, mode=mode)
    drawn = Drawn(ax=ax)
    for i, ((rank, md, tau), sub) in enumerate(rows.groupby(["ranking", "mode", "tau"])):
        sub = sub.sort_values("length")
        key = f"{rank}/{md}, tau={tau:g}"
        bars = ax.errorbar(sub["length"].to_numpy(float), sub["nstar"].to_numpy(float),
                           yerr=_yerr(sub, "nstar", "nstar_low", "nstar_high"), marker="o",
                           color=style.color_cycle(i), capsize=2, label=key)
        drawn.lines[key] = bars.lines[0]
        drawn.data[key] = sub[["length", "nstar", "nstar_low", "nstar_high"]]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    style.plain_log_ticks(ax.yaxis)
    lengths = sorted(set(rows["length"].astype(int)))
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(v) for v in lengths])
    ax.set_xlabel("context length L (tokens)")
    ax.set_ylabel(f"N* ({scoring} scoring)")
    if legend:
        drawn.legend = ax.legend(frameon=False, fontsize="small")
    return drawn


@styled
def fig_support_vs_background(qa_support_summary, *, statistic: str = "mass",
                              score: str = "attention", model=None, ax=None,
                              splits=("all", "correct", "incorrect"),
                              legend: bool = True) -> Drawn:
    """One support statistic against the background length, a line per split.

    Reads ``background, statistic, score, split, mean, ci_low, ci_high``. Displacement
    is drawn on a log y axis (it grows with the number of competitors).
    """
    ax = style.axes_or_new(ax)
    rows = pick(qa_support_summary, "qa_support_summary", model=model, statistic=statistic,
                score=score)
    drawn = Drawn(ax=ax)
    for i, split in enumerate(splits):
        sub = rows[rows["split"] == split].dropna(subset=["mean"]).sort_values("background")
        if sub.empty:
            continue
        bars = ax.errorbar(sub["background"].to_numpy(float), sub["mean"].to_numpy(float),
                           yerr=_yerr(sub, "mean", "ci_low", "ci_high"), marker="o",
                           color="#6E6E6E" if split == "all" else style.color_cycle(i),
                           capsize=2, label=split)
        drawn.lines[split] = bars.lines[0]
        drawn.data[split] = sub[["background", "mean", "ci_low", "ci_high", "n_examples"]]
    if statistic == "displacement" and (rows["mean"] > 0).all():
        ax.set_yscale("log")
        style.plain_log_ticks(ax.yaxis)
    elif statistic in ("mass", "recall", "outranking"):  # shares: never below 0
        ax.set_ylim(0.0, max(ax.get_ylim()[1], 1e-3))
    # ticks at the backgrounds the probe ran (one background alone would otherwise get
    # matplotlib's +-0.04 around it)
    backgrounds = sorted({int(b) for b in rows["background"]})
    if backgrounds:
        ax.set_xticks(backgrounds)
        ax.set_xticklabels([str(b) for b in backgrounds])
        if len(backgrounds) == 1:
            half = max(backgrounds[0], 64) / 2
            ax.set_xlim(backgrounds[0] - half, backgrounds[0] + half)
    ax.set_xlabel("background (tokens)")
    ax.set_ylabel(STAT_LABELS.get(statistic, statistic))
    if legend and drawn.lines:
        drawn.legend = ax.legend(frameon=False, fontsize="small")
    return drawn


@styled
def fig_support_recall_map(qa_support, *, background: int = 0, statistic: str = "recall",
                           score: str = "attention", split: str = "all", model=None,
                           ax=None, colorbar: bool = True) -> Drawn:
    """Layer x head map of a support statistic (recall@64 by default) at one background.

    Reads ``layer, head, mean`` of the rows for ``background, statistic, score, split``.
    """
    ax = style.axes_or_new(ax)
    rows = pick(qa_support, "qa_support", model=model, background=background,
                statistic=statistic, score=score, split=split)
    grid, _, _ = layer_head_grid(rows, "mean")
    bounded = statistic in ("recall", "mass", "outranking")
    image, bar = draw_layer_head_map(ax, grid, cmap="viridis",
                                     colorbar_label=STAT_LABELS.get(statistic, statistic),
                                     colorbar=colorbar)
    if bounded:
        image.set_clim(0.0, 1.0)
    drawn = Drawn(ax=ax, images=[image], colorbar=bar)
    drawn.data["grid"] = rows[["layer", "head", "mean"]]
    ax.set_title(f"background {background} tokens", fontsize="small")
    return drawn

"""Interventions (method §9): pruning curves, the single-head scan, top-N restriction."""

from __future__ import annotations

import numpy as np
from matplotlib import patheffects
from matplotlib.colors import SymLogNorm

from attngeom.figures import style
from attngeom.figures._common import draw_layer_head_map, layer_head_grid, pick
from attngeom.figures.style import Drawn, styled

RANKER_ORDER = ("taxonomy", "magnitude", "entropy", "gradient", "sensitivity", "random")


def _ranker_key(ranker: str, order, multi_order: bool) -> str:
    order = "" if order is None or (isinstance(order, float) and np.isnan(order)) else str(order)
    return f"{ranker} [{order}]" if multi_order and order else ranker


@styled
def fig_pruning(pruning, *, model=None, corpus=None, ax=None, legend: bool = True) -> Drawn:
    """Perplexity against the fraction of heads kept, one line per ranker (and order).

    Reads ``ranker, seed, order, keep_fraction, perplexity``. A line is the mean
    over seeds; where a ranker has several seeds (``random``) the band spans their
    minimum to maximum. Log y scale; x runs from all heads kept (left) down.
    ``Drawn.lines`` / ``bands`` keyed by ranker, or ``"ranker [order]"`` for a ranker
    run with several orders.
    """
    ax = style.axes_or_new(ax)
    rows = pick(pruning, "pruning", model=model, corpus=corpus).copy()
    rows["order"] = rows["order"].fillna("").astype(str)
    rankers = [r for r in RANKER_ORDER if r in set(rows["ranker"])]
    rankers += sorted(set(rows["ranker"]) - set(rankers))
    drawn = Drawn(ax=ax)
    i = 0
    for ranker in rankers:
        sub = rows[rows["ranker"] == ranker]
        orders = sorted(sub["order"].unique())
        for order in orders:
            group = sub[sub["order"] == order]
            key = _ranker_key(ranker, order, len(orders) > 1)
            stats = group.groupby("keep_fraction")["perplexity"].agg(["mean", "min", "max"])
            stats["n_seeds"] = group.groupby("keep_fraction")["seed"].nunique()
            stats = stats.sort_index()
            x = stats.index.to_numpy(dtype=float)
            color = "#6E6E6E" if ranker == "random" else style.color_cycle(i)
            i += ranker != "random"
            (line,) = ax.plot(x, stats["mean"].to_numpy(), marker="o", color=color,
                              linestyle="--" if ranker == "random" else "-", label=key)
            drawn.lines[key] = line
            if (stats["n_seeds"] > 1).any():
                drawn.bands[key] = ax.fill_between(x, stats["min"].to_numpy(),
                                                   stats["max"].to_numpy(), color=color,
                                                   alpha=0.18, linewidth=0)
            drawn.data[key] = stats.reset_index()
    full = rows.loc[np.isclose(rows["keep_fraction"], 1.0), "perplexity"]
    if len(full):
        drawn.markers["baseline"] = ax.axhline(float(full.mean()), color="#000000",
                                               linewidth=0.7, linestyle=":",
                                               label="all heads kept")
    ax.set_xlabel("fraction of heads kept")
    ax.set_ylabel("perplexity (held-out windows)")
    positive = rows["perplexity"].to_numpy(float)
    if np.all(positive[np.isfinite(positive)] > 0):
        ax.set_yscale("log")
        style.plain_log_ticks(ax.yaxis)
    ax.invert_xaxis()
    if legend:
        drawn.legend = ax.legend(loc="best")
    return drawn


@styled
def fig_head_scan(head_scan, *, model=None, corpus=None, ax=None) -> Drawn:
    """Layer x head map of the relative delta-NLL when the head alone is removed.

    Symmetric-log colour scale (a few critical heads are orders of magnitude above
    the rest); critical heads are marked with a cross. ``Drawn.markers["critical"]``
    is the cross scatter, ``Drawn.data["grid"]`` the array drawn.
    """
    ax = style.axes_or_new(ax)
    rows = pick(head_scan, "head_scan", model=model, corpus=corpus)
    grid, _, _ = layer_head_grid(rows, "delta_nll_rel")
    finite = np.abs(grid[np.isfinite(grid)])
    top = float(finite.max()) if finite.size else 1.0
    top = max(top, 1e-6)
    linthresh = max(min(1e-3, top / 10), 1e-9)
    norm = SymLogNorm(linthresh=linthresh, vmin=-top, vmax=top, base=10)
    image, bar = draw_layer_head_map(ax, grid, cmap="RdBu_r", norm=norm,
                                     colorbar_label=r"relative $\Delta$NLL, head removed")
    drawn = Drawn(ax=ax, images=[image], colorbar=bar, data={"grid": grid})
    critical = rows[rows["critical"].astype(bool)]
    if len(critical):
        drawn.markers["critical"] = ax.scatter(critical["head"], critical["layer"], marker="x",
                                               s=16, color="#000000", linewidths=0.9,
                                               label="critical", path_effects=[
                                                   patheffects.withStroke(linewidth=2.2,
                                                                          foreground="white")])
        drawn.legend = ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.18),
                                 borderaxespad=0.0)
    ax.set_title("single-head removal")
    return drawn


@styled
def fig_restrict(restrict, nstar=None, *, model=None, corpus=None, ax=None,
                 legend: bool = True) -> Drawn:
    """Relative delta-NLL against N when attention keeps only its top-N entries.

    Model-scope rows of ``restrict.parquet`` (one line per ``renormalize``); a run
    with only per-layer or per-head restriction is drawn as the mean over those.
    With ``nstar`` (``restrict_nstar.parquet``), N*_tau is marked at height tau.
    ``Drawn.lines`` keyed ``"renormalised"`` / ``"not renormalised"`` (prefixed with
    the scope when it is not ``model``).
    """
    ax = style.axes_or_new(ax)
    rows = pick(restrict, "restrict", model=model, corpus=corpus)
    scope = "model" if "model" in set(rows["scope"]) else sorted(set(rows["scope"]))[0]
    rows = rows[rows["scope"] == scope]
    drawn = Drawn(ax=ax)
    for renorm, color, linestyle in ((True, "#0072B2", "-"), (False, "#D55E00", "--")):
        sub = rows[rows["renormalize"].astype(bool) == renorm]
        if sub.empty:
            continue
        key = "renormalised" if renorm else "not renormalised"
        if scope != "model":
            key = f"{key} (mean over {scope}s)"
        curve = sub.groupby("n")["delta_nll_rel"].mean().sort_index()
        (line,) = ax.plot(curve.index.to_numpy(dtype=float), curve.to_numpy(), marker="o",
                          color=color, linestyle=linestyle, label=key)
        drawn.lines[key] = line
        drawn.data[key] = curve.reset_index()
        if nstar is not None:
            ns = nstar[(nstar["scope"] == scope)
                       & (nstar["renormalize"].astype(bool) == renorm)]
            if model is not None:
                ns = ns[ns["model"] == model]
            ns = ns.groupby("tau")["n_star"].median().dropna()
            if len(ns):
                drawn.markers[f"n_star {key}"] = ax.scatter(
                    ns.to_numpy(dtype=float), ns.index.to_numpy(dtype=float), marker="D", s=18,
                    facecolors="white", edgecolors=color, zorder=4,
                    label=r"$N^*_\tau$ at height $\tau$" if not drawn.markers else None)
    style.set_n_axis(ax, rows["n"])
    ax.set_ylabel(r"relative $\Delta$NLL ($\Delta$NLL / NLL)")
    values = rows["delta_nll_rel"].to_numpy(float)
    values = values[np.isfinite(values)]
    if values.size and values.max() > 100 * max(np.median(np.abs(values)), 1e-6):
        ax.set_yscale("symlog", linthresh=max(float(np.median(np.abs(values))), 1e-4))
    ax.axhline(0.0, color="#000000", linewidth=0.5)
    if legend:
        drawn.legend = ax.legend(loc="best")
    return drawn

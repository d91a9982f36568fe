"""Interventions (method §9): pruning curves, the single-head scan, top-N restriction."""

from __future__ import annotations

import numpy as np
from matplotlib import patheffects
from matplotlib.colors import SymLogNorm

from attngeom.errors import ConfigError
from attngeom.figures import style
from attngeom.figures._common import draw_layer_head_map, layer_head_grid, pick
from attngeom.figures.style import Drawn, styled
from attngeom.names import RANKERS

# the registry's order, the seeded control last (drawn dashed, grey, behind the others)
RANKER_ORDER = tuple(sorted(RANKERS, key=lambda r: r == "random"))


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


_RANKING_COLORS = {"attention": ("#0072B2", "#D55E00"), "contribution": ("#009E73", "#CC79A7"),
                   "random": ("#6E6E6E", "#A0A0A0")}


@styled
def fig_restrict(restrict, nstar=None, *, model=None, corpus=None, ranking=None, ax=None,
                 legend: bool = True) -> Drawn:
    """Relative delta-NLL against N when each query keeps only its top-N entries.

    Model-scope rows of ``restrict.parquet`` (one line per ``renormalize``, and per
    ranking where there are several; ``ranking`` draws one); a run with only per-layer
    or per-head restriction is drawn as the mean over those. Every N the search tried
    is a point; the N axis is labelled at powers of two. With ``nstar``
    (``restrict_nstar.parquet``), N*_tau is marked at height tau.
    ``Drawn.lines`` keyed ``"renormalised"`` / ``"not renormalised"`` for the attention
    ranking, ``"contribution, renormalised"`` etc. for the others (prefixed with the
    scope when it is not ``model``).
    """
    ax = style.axes_or_new(ax)
    rows = pick(restrict, "restrict", model=model, corpus=corpus)
    scope = "model" if "model" in set(rows["scope"]) else sorted(set(rows["scope"]))[0]
    rows = rows[rows["scope"] == scope]
    if "ranking" not in rows.columns:
        rows = rows.assign(ranking="attention")
    if ranking is not None:
        rows = pick(rows, "restrict", ranking=ranking)
    rankings = [r for r in _RANKING_COLORS if r in set(rows["ranking"])]
    rankings += sorted(set(rows["ranking"]) - set(rankings))
    drawn = Drawn(ax=ax)
    for ranking in rankings:
        colors = _RANKING_COLORS.get(ranking, ("#000000", "#555555"))
        for renorm, color, linestyle in ((True, colors[0], "-"), (False, colors[1], "--")):
            sub = rows[(rows["renormalize"].astype(bool) == renorm)
                       & (rows["ranking"] == ranking)]
            if sub.empty:
                continue
            key = "renormalised" if renorm else "not renormalised"
            if ranking != "attention":
                key = f"{ranking}, {key}"
            if scope != "model":
                key = f"{key} (mean over {scope}s)"
            curve = sub.groupby("n")["delta_nll_rel"].mean().sort_index()
            (line,) = ax.plot(curve.index.to_numpy(dtype=float), curve.to_numpy(),
                              marker="o", markersize=3, color=color, linestyle=linestyle,
                              label=key)
            drawn.lines[key] = line
            drawn.data[key] = curve.reset_index()
            if nstar is None:
                continue
            ns = nstar[(nstar["scope"] == scope)
                       & (nstar["renormalize"].astype(bool) == renorm)]
            if "ranking" in ns.columns:
                ns = ns[ns["ranking"] == ranking]
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


def _local_rows(local, model, corpus, ranking, renormalize, n):
    rows = pick(local, "restrict_local", model=model, corpus=corpus)
    for column, wanted in (("ranking", ranking), ("renormalize", renormalize), ("n", n)):
        values = sorted(rows[column].unique().tolist())
        if wanted is None:
            wanted = "attention" if column == "ranking" and "attention" in values else \
                (False if column == "renormalize" and False in values else values[0])
        rows = pick(rows, "restrict_local", **{column: wanted})
    return rows


@styled
def fig_restrict_layers(local, *, model=None, corpus=None, ranking=None, renormalize=None,
                        n=None, ax=None) -> Drawn:
    """The localised layer scan: one bar per layer, the mean over windows of each
    window's relative NLL increase when only that layer keeps its top-N keys.

    One ranking, renormalisation and N of ``restrict_local.parquet`` (defaults: the
    attention ranking, deletion, the smallest N); the layers the head scan looked into
    are drawn dark. ``Drawn.bars["layers"]``, ``Drawn.data["layers"]``.
    """
    ax = style.axes_or_new(ax)
    rows = _local_rows(local, model, corpus, ranking, renormalize, n)
    layers = rows[rows["scope"] == "layer"].sort_values("layer")
    scanned = set(rows.loc[rows["scope"] == "head", "layer"])
    colors = ["#0072B2" if layer in scanned else "#9ECAE1" for layer in layers["layer"]]
    drawn = Drawn(ax=ax)
    drawn.bars["layers"] = ax.bar(layers["layer"].to_numpy(), layers["mean_doc_delta_rel"],
                                  color=colors, width=0.8)
    drawn.data["layers"] = layers[["layer", "mean_doc_delta_rel", "delta_nll_rel"]]
    ax.axhline(0.0, color="#000000", linewidth=0.5)
    ax.set_xlabel("layer restricted alone")
    ax.set_ylabel("mean relative NLL increase")
    r = layers.iloc[0]
    ax.set_title(f"top-{int(r['n'])} by {r['ranking']} in one layer"
                 + (", renormalised" if bool(r["renormalize"]) else ""))
    return drawn


@styled
def fig_restrict_heads(local, *, model=None, corpus=None, ranking=None, renormalize=None,
                       n=None, ax=None) -> Drawn:
    """The localised head scan as a layer x head map of each head's mean relative NLL
    increase (blank: layers the scan did not look into). ``Drawn.data["grid"]``."""
    ax = style.axes_or_new(ax)
    rows = _local_rows(local, model, corpus, ranking, renormalize, n)
    heads = rows[rows["scope"] == "head"]
    if heads.empty:
        raise ConfigError("restrict_local: expected head-scope rows (restrict --scope head), "
                          "got layer rows only")
    num_layers = int(rows["layer"].max()) + 1
    frame = heads.assign(layer=heads["layer"].astype(int))
    grid, _, _ = layer_head_grid(frame, "mean_doc_delta_rel")
    if grid.shape[0] < num_layers:
        grid = np.vstack([grid, np.full((num_layers - grid.shape[0], grid.shape[1]), np.nan)])
    finite = np.abs(grid[np.isfinite(grid)])
    top = max(float(finite.max()) if finite.size else 1.0, 1e-6)
    norm = SymLogNorm(linthresh=max(min(1e-3, top / 10), 1e-9), vmin=-top, vmax=top, base=10)
    image, bar = draw_layer_head_map(ax, grid, cmap="RdBu_r", norm=norm,
                                     colorbar_label="mean relative NLL increase")
    r = heads.iloc[0]
    ax.set_title(f"top-{int(r['n'])} by {r['ranking']} in one head")
    return Drawn(ax=ax, images=[image], colorbar=bar, data={"grid": grid})

"""Sink geometry by layer and head (method §6), from ``sink.parquet``.

``sink.parquet`` has one row per (layer, head, n); the value-norm statistics do
not depend on n, so the heat maps average over the n rows of a head (which are
equal in a well-formed table).
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm, TwoSlopeNorm

from attngeom.figures import style
from attngeom.figures._common import draw_layer_head_map, layer_head_grid, pick
from attngeom.figures.style import Drawn, styled

SPLIT_COLUMNS = {
    "f_full_sink_selected": ("#0072B2", "-", "sink in universe, sink selected"),
    "f_full_sink_unselected": ("#0072B2", "--", "sink in universe, not selected"),
    "f_nosink_sink_selected": ("#D55E00", "-", "sink excluded, sink would be selected"),
    "f_nosink_sink_unselected": ("#D55E00", "--", "sink excluded, not selected"),
}


@styled
def fig_sink_norm_ratio(sink, *, model=None, corpus=None, ax=None) -> Drawn:
    """Layer x head map of ``norm_ratio`` = mean non-sink value norm / sink value norm.

    Log colour scale centred on nothing: the paper reports ratios of 3-10.
    ``Drawn.data["grid"]`` is the (layers, heads) array drawn.
    """
    ax = style.axes_or_new(ax)
    rows = pick(sink, "sink", model=model, corpus=corpus)
    grid, _, _ = layer_head_grid(rows, "norm_ratio")
    positive = grid[np.isfinite(grid) & (grid > 0)]
    norm = None
    if positive.size and positive.max() > positive.min():
        norm = LogNorm(vmin=positive.min(), vmax=positive.max())
    image, bar = draw_layer_head_map(
        ax, np.where(grid > 0, grid, np.nan), cmap="viridis", norm=norm,
        colorbar_label=r"$\overline{\|v_j\|}_{j\geq1}\;/\;\|v_0\|$ (ratio)")
    if bar is not None and norm is not None:
        style.plain_log_ticks(bar.ax.yaxis)
    ax.set_title("sink value-norm ratio")
    return Drawn(ax=ax, images=[image], colorbar=bar, data={"grid": grid})


@styled
def fig_sink_cosine(sink, *, column: str = "sink_cos_mean", model=None, corpus=None,
                    ax=None) -> Drawn:
    """Layer x head map of the sink's cosine with the other values (diverging at 0).

    ``column`` is ``sink_cos_mean`` (cosine of v_0 with the mean non-sink value) or
    ``sink_cos_pairwise`` (mean of the pairwise cosines).
    """
    ax = style.axes_or_new(ax)
    rows = pick(sink, "sink", model=model, corpus=corpus)
    grid, _, _ = layer_head_grid(rows, column)
    finite = grid[np.isfinite(grid)]
    bound = float(np.max(np.abs(finite))) if finite.size else 1.0
    bound = max(bound, 1e-6)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound)
    label = (r"$\cos(v_0, \overline{v}_{j\geq1})$" if column == "sink_cos_mean"
             else r"mean $\cos(v_0, v_j)$")
    image, bar = draw_layer_head_map(ax, grid, cmap="RdBu_r", norm=norm, colorbar_label=label)
    ax.set_title("sink value cosine")
    return Drawn(ax=ax, images=[image], colorbar=bar, data={"grid": grid})


@styled
def fig_sink_split(sink, *, model=None, corpus=None, ax=None, legend: bool = True) -> Drawn:
    """F_N against N with and without the sink, split by whether the sink was selected.

    Mean over heads (NaN-skipping: a head that never selects the sink has no
    "selected" value) of the four ``f_*_sink_*`` columns of ``sink.parquet``.
    ``Drawn.lines`` keyed by column name.
    """
    ax = style.axes_or_new(ax)
    rows = pick(sink, "sink", model=model, corpus=corpus)
    drawn = Drawn(ax=ax)
    for column, (color, linestyle, label) in SPLIT_COLUMNS.items():
        per_n = rows.groupby("n")[column].agg(["mean", "count"]).sort_index()
        per_n = per_n[per_n["count"] > 0]
        if per_n.empty:
            continue
        (line,) = ax.plot(per_n.index.to_numpy(dtype=float), per_n["mean"].to_numpy(),
                          color=color, linestyle=linestyle, marker="o", label=label)
        drawn.lines[column] = line
        drawn.data[column] = per_n.reset_index()
    style.set_n_axis(ax, rows["n"])
    ax.set_ylabel("F-score $F_N$ (mean over heads)")
    ax.set_ylim(-0.02, 1.04)
    if legend and drawn.lines:
        drawn.legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2,
                                 borderaxespad=0.0)
    return drawn

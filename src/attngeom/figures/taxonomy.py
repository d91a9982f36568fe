"""Head taxonomy (method §7) from ``taxonomy.parquet``: regimes and source-winner fractions.

Columns read: ``layer, head, regime`` (Retriever | Mixer | Reset | none),
``stability`` (label stability, where present) and ``f_self, f_sink, f_other``.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from attngeom.figures import style
from attngeom.figures._common import draw_layer_head_map, pick
from attngeom.figures.style import Drawn, styled
from attngeom.names import NO_REGIME, REGIMES, STABLE

REGIME_CODES = {name: i for i, name in enumerate((*REGIMES, NO_REGIME))}


def _regimes_present(rows) -> list[str]:
    present = set(rows["regime"].astype(str))
    return [r for r in REGIME_CODES if r in present]


@styled
def fig_regime_map(taxonomy, *, model=None, corpus=None, ax=None, legend: bool = True,
                   stable: float = STABLE) -> Drawn:
    """Layer x head map coloured by regime; uncertain labels faded and hatched.

    A head whose label stability (the share of window-bootstrap resamples keeping its
    label, column ``stability``) is below ``stable`` is drawn faded with a hatch, so an
    unstable label never looks like a firm one. ``Drawn.data["grid"]`` holds the codes
    drawn (``REGIME_CODES``; NaN for a head missing from the table),
    ``Drawn.data["unstable"]`` the (layer, head) pairs drawn as uncertain.
    """
    ax = style.axes_or_new(ax)
    rows = pick(taxonomy, "taxonomy", model=model, corpus=corpus)
    n_layers, n_heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    grid = np.full((n_layers, n_heads), np.nan)
    for layer, head, regime in rows[["layer", "head", "regime"]].itertuples(index=False):
        grid[int(layer), int(head)] = REGIME_CODES.get(str(regime), REGIME_CODES[NO_REGIME])
    cmap = ListedColormap([style.REGIME_COLORS[r] for r in REGIME_CODES])
    norm = BoundaryNorm(np.arange(-0.5, len(REGIME_CODES)), cmap.N)
    image, _ = draw_layer_head_map(ax, grid, cmap=cmap, norm=norm, colorbar=False)
    unstable = []
    if "stability" in rows.columns:
        weak = rows[rows["stability"].astype(float) < stable]
        for layer, head in weak[["layer", "head"]].itertuples(index=False):
            unstable.append((int(layer), int(head)))
            ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, facecolor="white",
                                   alpha=0.55, edgecolor="0.25", hatch="////", linewidth=0))
    drawn = Drawn(ax=ax, images=[image], data={"grid": grid, "unstable": unstable})
    if legend:
        handles = [Patch(facecolor=style.REGIME_COLORS[r], label=r) for r in _regimes_present(rows)]
        if unstable:
            handles.append(Patch(facecolor="white", edgecolor="0.25", hatch="////",
                                 label=f"stability < {stable:g}"))
        drawn.legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                                 borderaxespad=0.0)
    ax.set_title("head regime")
    return drawn


@styled
def fig_regime_shares(taxonomy, *, model=None, corpus=None, ax=None,
                      legend: bool = True) -> Drawn:
    """Share of heads in each regime, by layer (stacked bars summing to 1).

    ``Drawn.bars`` keyed by regime; ``Drawn.data["shares"]`` is the layer x regime
    table drawn.
    """
    ax = style.axes_or_new(ax)
    rows = pick(taxonomy, "taxonomy", model=model, corpus=corpus)
    counts = rows.assign(regime=rows["regime"].astype(str)).groupby(
        ["layer", "regime"]).size().unstack(fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    shares = shares[[r for r in REGIME_CODES if r in shares.columns]].sort_index()
    drawn = Drawn(ax=ax, data={"shares": shares})
    bottom = np.zeros(len(shares))
    x = shares.index.to_numpy()
    for regime in shares.columns:
        values = shares[regime].to_numpy()
        drawn.bars[regime] = ax.bar(x, values, bottom=bottom, width=0.85, linewidth=0,
                                    color=style.REGIME_COLORS[regime], label=regime)
        bottom = bottom + values
    ax.set_xlabel("layer")
    ax.set_ylabel("share of heads")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="x", visible=False)
    if legend:
        drawn.legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return drawn


@styled
def fig_source_fractions(taxonomy, *, model=None, corpus=None, ax=None,
                         legend: bool = True) -> Drawn:
    """f_self / f_sink / f_other of every head as stacked bars, heads ordered by layer.

    Heads run along x in (layer, head) order, with a tick at the first head of each
    layer. ``Drawn.bars`` keyed by column (``f_self``, ``f_sink``, ``f_other``).
    """
    ax = style.axes_or_new(ax, width=style.PAGE_WIDTH)
    rows = pick(taxonomy, "taxonomy", model=model, corpus=corpus).sort_values(["layer", "head"])
    x = np.arange(len(rows))
    drawn = Drawn(ax=ax, data={"fractions": rows[["layer", "head", "f_self", "f_sink",
                                                  "f_other"]].reset_index(drop=True)})
    bottom = np.zeros(len(rows))
    for column in ("f_self", "f_sink", "f_other"):
        values = np.nan_to_num(rows[column].to_numpy(dtype=float))
        drawn.bars[column] = ax.bar(x, values, bottom=bottom, width=1.0, linewidth=0,
                                    color=style.SOURCE_COLORS[column],
                                    label=style.SOURCE_LABELS[column])
        bottom = bottom + values
    layers = rows["layer"].to_numpy()
    starts = np.flatnonzero(np.r_[True, layers[1:] != layers[:-1]])
    step = max(1, int(np.ceil(len(starts) / 16)))
    ax.set_xticks(x[starts][::step] - 0.5, [str(layers[s]) for s in starts[::step]])
    for s in starts[1:]:
        ax.axvline(s - 0.5, color="white", linewidth=0.6)
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylim(0, 1)
    ax.set_xlabel("head, grouped by layer (tick = first head of the layer)")
    ax.set_ylabel("share of queries won by")
    ax.grid(False)
    if legend:
        drawn.legend = ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0),
                                 borderaxespad=0.0, title="winner")
    return drawn

"""The head atlas beside the regimes (issue 32), from ``pipeline.atlas.head_atlas``'s tables.

``fig_atlas_contingency``: regime x head type heat map of the share of each regime's
heads that are of each type (the count written in each cell), from
``atlas_contingency``. ``fig_atlas_depth``: per layer, the share of heads of each head
type (lines) and, where the table has them, of each regime (dashed), from
``atlas_depth``.
"""

from __future__ import annotations

import matplotlib as mpl
import numpy as np

from attngeom.errors import ConfigError
from attngeom.figures import style
from attngeom.figures.style import REGIME_COLORS, Drawn, styled

TYPE_COLORS = {
    "previous_token": "#0072B2", "duplicate_token": "#56B4E9", "induction": "#D55E00",
    "echo": "#CC79A7", "sink": "#E69F00", "streaming": "#999999", "retrieval": "#009E73",
    "(none)": "#000000",
}


def _need(df, table: str, columns: tuple[str, ...]) -> None:
    if df is None or len(df) == 0:
        raise ConfigError(f"expected rows in the {table} table, got none")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"expected columns {missing} in the {table} table")


def unmeasured_types(head_scores) -> tuple[str, ...]:
    """Head types no head has a score for (e.g. retrieval when no needle was recovered):
    left out of the figures, where their zero heads would read as measured."""
    if head_scores is None or not len(head_scores):
        return ()
    finite = head_scores.groupby("score", sort=False)["value"].apply(lambda v: v.notna().any())
    return tuple(str(k) for k, ok in finite.items() if not ok)


@styled
def fig_atlas_contingency(contingency, *, exclude=(), ax=None) -> Drawn:
    """Regimes (rows) x head types (columns): share of the regime's heads of each type.

    ``Drawn.data["share"]`` is the (regimes, types) array drawn, ``data["count"]`` the
    head counts written in the cells; a head can be of several types or none. Types in
    ``exclude`` (not measured: ``unmeasured_types``) are not drawn.
    """
    _need(contingency, "atlas_contingency", ("regime", "head_type", "count", "share_of_regime"))
    contingency = contingency[~contingency["head_type"].isin(list(exclude))]
    ax = style.axes_or_new(ax, height=2.4)
    regimes = list(dict.fromkeys(contingency["regime"]))
    types = list(dict.fromkeys(contingency["head_type"]))
    share = contingency.pivot(index="regime", columns="head_type", values="share_of_regime")
    count = contingency.pivot(index="regime", columns="head_type", values="count")
    share = share.reindex(index=regimes, columns=types).to_numpy(dtype=float)
    count = count.reindex(index=regimes, columns=types).to_numpy(dtype=float)
    image = ax.imshow(np.ma.masked_invalid(share), cmap="Blues", vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
    for (i, j), c in np.ndenumerate(count):
        if np.isfinite(c):
            ax.text(j, i, f"{int(c)}", ha="center", va="center", fontsize=7,
                    color="white" if share[i, j] > 0.6 else "black")
    ax.set_xticks(range(len(types)), [t.replace("_", " ") for t in types], rotation=35,
                  ha="right")
    ax.set_yticks(range(len(regimes)), regimes)
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("share of the regime's heads")
    ax.set_title("head types by regime (heads in cells)")
    return Drawn(ax=ax, images=[image], colorbar=bar,
                 data={"share": share, "count": count, "regimes": regimes, "types": types})


@styled
def fig_atlas_depth(depth, *, exclude=(), ax=None) -> Drawn:
    """Share of heads of each head type (solid) and regime (dashed) against depth; head
    types in ``exclude`` (not measured) are not drawn."""
    _need(depth, "atlas_depth", ("layer", "kind", "name", "share"))
    depth = depth[~((depth["kind"] == "head_type") & depth["name"].isin(list(exclude)))]
    ax = style.axes_or_new(ax)
    lines = {}
    for (kind, name), grp in depth.groupby(["kind", "name"], sort=False):
        grp = grp.sort_values("layer")
        if kind == "regime":
            color, dash = REGIME_COLORS.get(name, "#666666"), "--"
        else:
            color, dash = TYPE_COLORS.get(name, "#666666"), "-"
        label = name.replace("_", " ")
        (line,) = ax.plot(grp["layer"], grp["share"], dash, color=color, label=label,
                          marker="o", markersize=2.5)
        lines[label] = line
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
    ax.set_ylabel("share of the layer's heads")
    ax.set_ylim(-0.02, 1.02)
    legend = ax.legend(fontsize=6, ncol=2, frameon=False)
    ax.set_title("head types and regimes by depth")
    return Drawn(ax=ax, lines=lines, legend=legend, data={"depth": depth})

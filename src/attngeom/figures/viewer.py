"""One head's selection at one query, drawn (the geometry viewer's notebook figure).

Takes a ``viewer.HeadView`` (numpy arrays only, so figures stays free of torch) and
draws three panels: the geometry, where key u sits at its exact distance D_u to the
aggregate s_N (the radius) and at the angle of its contribution in the plane of the
contributions' first two principal axes, so that rho_max and rho_min are circles;
and the bars of alpha and alpha ||v|| of the leading keys with their text.

Marks: selected keys filled, intruders (unselected with D <= rho_max) and stragglers
(selected with D >= rho_min) ringed in red, the sink a square, the current token a
triangle, the random set of the same size as grey rings (the ghost), the head output
z a diamond and s_N the centre. On long contexts the keys not drawn one by one are a
radial density (shaded rings, darker = more keys).
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Circle, Wedge

from attngeom.figures import style
from attngeom.figures.style import Drawn, styled

SELECTED = "#0072B2"
UNSELECTED = "#9A9A9A"
OFFENDER = "#D55E00"
GHOST = "#6E6E6E"
RHO_MAX = "#0072B2"
RHO_MIN = "#009E73"
BARS = 24  # keys in the bar panels


def _short(text: str, width: int = 14) -> str:
    text = repr(text)[1:-1] if text.strip() != text or "\n" in text else text
    return text if len(text) <= width else text[: width - 1] + "\u2026"


@styled
def fig_head_view(view, *, n: int, ranking: str | None = None, distance: str | None = None,
                  axes=None) -> Drawn:
    """The geometry and the bars of one ``HeadView`` at N = ``n``.

    ``axes``: three axes (geometry, alpha bars, alpha ||v|| bars), or None for a new
    figure. Returns a ``Drawn`` on the geometry axes; ``data`` holds the numbers drawn
    (``radius`` and ``angle`` of the keys drawn, ``rho_max``, ``rho_min``, the metrics,
    and the counts of the keys drawn as a density).
    """
    ranking = ranking or view.ranking
    distance = distance or view.distance
    geo = view.views[(ranking, distance)]
    i = geo.at(n)
    if axes is None:
        fig, _ = style.new_figure(style.PAGE_WIDTH, 4.2)
        fig.clear()
        grid = fig.add_gridspec(1, 3, width_ratios=(1.6, 0.7, 0.7))
        axes = (fig.add_subplot(grid[0]), fig.add_subplot(grid[1]), fig.add_subplot(grid[2]))
    ax, ax_a, ax_c = axes
    radius = geo.distances[i]
    shown = view.shown
    rest = np.setdiff1d(np.arange(view.keys.size), shown)
    theta = view.angle
    x, y = radius * np.cos(theta), radius * np.sin(theta)
    sel, intr, strag = geo.selected[i], geo.intruders[i], geo.stragglers[i]
    ghost = view.ghosts[distance]
    ghost_sel = ghost.selected[ghost.at(n)]
    rho_max, rho_min = float(geo.rho_max[i]), float(geo.rho_min[i])
    extent = max(float(radius[shown].max()), rho_min, rho_max,
                 float(view.output_distance[(ranking, distance)][i]), 1e-12) * 1.08
    drawn = Drawn(ax=ax)
    # the keys not drawn one by one: a radial density of their distances
    density = None
    if rest.size:
        counts, edges = np.histogram(radius[rest], bins=40, range=(0.0, extent))
        top = max(int(counts.max()), 1)
        for c, lo, hi in zip(counts, edges[:-1], edges[1:], strict=True):
            if c:
                ax.add_patch(Wedge((0, 0), hi, 0, 360, width=hi - lo, facecolor=UNSELECTED,
                                   alpha=0.12 + 0.5 * c / top, linewidth=0))
        density = {"counts": counts, "edges": edges,
                   "inside_rho_max": int(intr[rest].sum())}
    if distance == "euclidean":
        s_norm = float(geo.aggregate_norm[i])
        ax.add_patch(Circle((0, 0), s_norm, fill=False, linestyle=":", color="0.55",
                            linewidth=0.7, label=r"$\|s_N\|$ (zero contribution)"))
    ax.add_patch(Circle((0, 0), rho_max, fill=False, color=RHO_MAX, linewidth=1.2,
                        label=r"$\rho_{max}$"))
    ax.add_patch(Circle((0, 0), rho_min, fill=False, color=RHO_MIN, linewidth=1.2,
                        linestyle="--", label=r"$\rho_{min}$"))
    un = shown[~sel[shown]]
    se = shown[sel[shown]]
    drawn.markers["unselected"] = ax.scatter(x[un], y[un], s=9, color=UNSELECTED,
                                             linewidths=0, label="unselected", zorder=3)
    drawn.markers["selected"] = ax.scatter(x[se], y[se], s=22, color=SELECTED, linewidths=0,
                                           label=f"selected (N = {n})", zorder=4)
    bad = shown[(intr | strag)[shown]]
    drawn.markers["offenders"] = ax.scatter(
        x[bad], y[bad], s=60, facecolors="none", edgecolors=OFFENDER, linewidths=1.0,
        label="inside $\\rho_{max}$ / outside $\\rho_{min}$", zorder=5)
    gh = shown[ghost_sel[shown]]
    drawn.markers["ghost"] = ax.scatter(x[gh], y[gh], s=90, facecolors="none",
                                        edgecolors=GHOST, linewidths=0.7, linestyle="--",
                                        label="random set (ghost)", zorder=2)
    where = {int(k): j for j, k in enumerate(view.keys.tolist())}
    for pos, marker, label in ((0, "s", "sink (t = 0)"), (view.query, "^", "current token")):
        if pos in where:
            j = where[pos]
            ax.scatter([x[j]], [y[j]], s=70, marker=marker, facecolors="none",
                       edgecolors="black", linewidths=0.9, label=label, zorder=6)
    zr = float(view.output_distance[(ranking, distance)][i])
    ax.scatter([zr * np.cos(view.output_angle)], [zr * np.sin(view.output_angle)], s=60,
               marker="D", color="#CC79A7", label="head output z", zorder=6)
    gr = float(view.ghost_distance[(ranking, distance)][i])
    ga = float(view.ghost_angles[distance][ghost.at(n)])
    ax.scatter([gr * np.cos(ga)], [gr * np.sin(ga)], s=45, marker="D", facecolors="none",
               edgecolors=GHOST, label="random set's aggregate", zorder=6)
    ax.scatter([0], [0], s=80, marker="+", color="black", label="$s_N$", zorder=7)
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
    ax.set_aspect("equal")
    ax.set_xlabel(f"D to $s_N$ ({distance}) along the PCA angle of $y$")
    m = geo.metrics(n)
    gm = ghost.metrics(n)
    r = view.regime
    ax.set_title(
        f"L{view.layer} H{view.head}, t = {view.query} {_short(view.token(view.query))!r}: "
        f"{r.get('regime')}, winner t = {view.winner}\n"
        f"{ranking} top-{n}: P {m['precision']:.2f}  R {m['recall']:.2f}  "
        f"F {m['f_score']:.2f}\nmargin {m['margin']:.3g}  inversions {int(m['inversions'])}"
        f"  (random set: F {gm['f_score']:.2f})", loc="left", fontsize=7)
    drawn.legend = ax.legend(loc="upper left", fontsize=5, ncols=2,
                             bbox_to_anchor=(0.0, -0.16))
    # bars: the leading keys under the ranking, alpha and alpha ||v||
    score = view.alpha if ranking == "attention" else view.contribution
    lead = np.lexsort((view.keys, -score))[: min(BARS, view.keys.size)]
    labels = [f"{int(view.keys[j])} {_short(view.token(int(view.keys[j])))}" for j in lead]
    colors = [SELECTED if sel[j] else UNSELECTED for j in lead]
    ypos = np.arange(lead.size)[::-1]
    drawn.bars["alpha"] = ax_a.barh(ypos, view.alpha[lead], color=colors)
    drawn.bars["contribution"] = ax_c.barh(ypos, view.contribution[lead], color=colors)
    ax_a.set_yticks(ypos, labels, fontsize=5)
    ax_c.set_yticks(ypos, [""] * lead.size)
    ax_a.set_xlabel(r"$\alpha$")
    ax_c.set_xlabel(r"$\alpha\,\|v\|$")
    ax_a.set_title(f"top {lead.size}\nby {ranking}", loc="left", fontsize=7)
    drawn.data = {"radius": radius[shown], "angle": theta[shown], "rho_max": rho_max,
                  "rho_min": rho_min, "metrics": m, "ghost_metrics": gm, "density": density,
                  "bars": view.keys[lead]}
    return drawn

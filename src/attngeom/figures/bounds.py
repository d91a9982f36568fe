"""Measured separability beside its certified bounds and the constant-norm envelope (method §8).

Reads ``bounds.parquet`` (``n``, ``<m>_measured``, ``<m>_envelope``,
``largest_certified_n`` per layer and head) and, where given, ``metrics.parquet``
(``<m>_bound`` and ``<m>_inv_bound`` per window, layer and head; the attention
rule, full universe, Euclidean rows, where the bounds are defined).
"""

from __future__ import annotations

import numpy as np

from attngeom.errors import ConfigError
from attngeom.figures import style
from attngeom.figures._common import pick
from attngeom.figures.style import Drawn, styled

PREFIX = {"precision": "precision", "recall": "recall", "f_score": "f"}


@styled
def fig_bounds(bounds, metrics=None, *, metric: str = "f_score", model=None, corpus=None,
               layer: int | None = None, ax=None, legend: bool = True) -> Drawn:
    """``metric`` against N: measured, certified bound, inversion bound and envelope.

    Each curve is the mean over heads (of ``layer`` only, when given); the band
    around the measurement is the interquartile range over heads. A dotted vertical
    line marks the median over heads of ``largest_certified_n``. For F the inversion
    bound is the harmonic mean of the precision and recall inversion bounds (method §4:
    F is increasing in both). ``Drawn.lines`` keys:
    ``measured``, ``envelope``, ``certified`` and ``inversion`` (the last two only
    with ``metrics`` holding non-NaN bound columns).
    """
    if metric not in PREFIX:
        raise ConfigError(f"expected metric in {sorted(PREFIX)}, got {metric!r}")
    ax = style.axes_or_new(ax)
    prefix = PREFIX[metric]
    rows = pick(bounds, "bounds", model=model, corpus=corpus, layer=layer)
    drawn = Drawn(ax=ax)
    measured = rows.groupby("n")[f"{prefix}_measured"]
    q = measured.quantile([0.25, 0.75]).unstack()
    n = q.index.to_numpy(dtype=float)
    _line(ax, drawn, "measured", n, measured.mean().to_numpy(), color="#000000", linestyle="-",
          label="measured (attention top-N)")
    drawn.bands["measured"] = ax.fill_between(n, q[0.25].to_numpy(), q[0.75].to_numpy(),
                                              color="#000000", alpha=0.12, linewidth=0)
    envelope = rows.groupby("n")[f"{prefix}_envelope"].mean()
    _line(ax, drawn, "envelope", envelope.index.to_numpy(dtype=float), envelope.to_numpy(),
          color="#CC79A7", linestyle=":", label="constant-norm envelope")

    if metrics is not None:
        sub = pick(metrics, "metrics", model=model, corpus=corpus, layer=layer,
                   rule="attention", variant="full", distance="euclidean")
        if metric == "f_score" and {"precision_inv_bound", "recall_inv_bound"} <= set(sub):
            # F is increasing in P and R, so the harmonic mean of the two inversion
            # bounds bounds F from below row by row (0 where both are 0).
            p, r = sub["precision_inv_bound"], sub["recall_inv_bound"]
            total = p + r
            sub = sub.assign(f_inv_bound=(2 * p * r / total.where(total > 0)).where(
                total > 0, 0.0).where(p.notna() & r.notna()))
        for key, column, color, linestyle, label in (
            ("certified", f"{prefix}_bound", "#0072B2", "--", "certified bound (angles)"),
            ("inversion", f"{prefix}_inv_bound", "#E69F00", "-.", "inversion bound"),
        ):
            if column not in sub.columns or not np.isfinite(sub[column].to_numpy(float)).any():
                continue
            per_head = sub.groupby(["layer", "head", "n"])[column].mean()
            curve = per_head.groupby(level="n").mean()
            _line(ax, drawn, key, curve.index.to_numpy(dtype=float), curve.to_numpy(),
                  color=color, linestyle=linestyle, label=label)

    largest = rows.groupby(["layer", "head"])["largest_certified_n"].first().to_numpy(float)
    largest = largest[np.isfinite(largest)]
    if largest.size and np.median(largest) > 0:
        drawn.markers["largest_certified_n"] = ax.axvline(
            float(np.median(largest)), color="#6E6E6E", linestyle=":", linewidth=0.9,
            label="median largest certified $N$")
    style.set_n_axis(ax, rows["n"])
    ax.set_ylabel(style.METRIC_LABELS[metric])
    ax.set_ylim(-0.02, 1.04)
    if legend:
        drawn.legend = ax.legend(loc="best")
    return drawn


def _line(ax, drawn: Drawn, key, x, y, **kw):
    (line,) = ax.plot(x, y, marker="o", **kw)
    drawn.lines[key] = line
    drawn.data[key] = {"n": np.asarray(x), "value": np.asarray(y, dtype=float)}

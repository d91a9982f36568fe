"""The per-query top-N metrics, each declared once (method §4): the registry.

A metric is a function of the exact quantities of one row and N, which the geometry
(``core/geometry.py``) computes for every rule, variant and distance:

- ``cmin`` / ``cmax`` (float64): the smallest closeness score of a selected key and
  the largest of an unselected one (closeness: ``g = ||s_N||^2 - D^2`` for the
  Euclidean distance, the cosine similarity for the cosine one; larger is nearer);
- ``intruders`` (int64): unselected keys at least as close as the farthest selected
  one; ``clears``: selected keys closer than every unselected one; ``inversions``:
  pairs (i selected, j unselected) with D[j] <= D[i];
- ``s2`` (float64): ``||s_N||^2``; ``n``: N; ``size``: |U| (float64);
- and the count of every metric declared with a per-key ``count`` (below).

A **count-based** metric is one ``value`` function of these. A **per-key** metric
adds a ``count``: a function of the closeness scores of every key of the row
(:class:`KeyScores`) returning one exact integer count per row and N; the counting
kernels (``core/kernels.py``) call it in both their plain and their fused, compiled
forms, and for the sink-excluded universe read off the full one; its ``value`` then
reads the count under the metric's name (``counts["name"]``).

Declaring one is ``register_metric(Metric(...))``: ``names.METRICS``, the geometry's
result (``TopNMetrics.metric(name)``), the accumulators, the tables and the tests'
contract (which asks ``tests/reference_geometry.py`` for a reference definition)
pick it up. ``docs/extending.md`` ("A new per-query metric") walks through one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from attngeom.errors import ConfigError
from attngeom.names import METRICS

KINDS = ("fraction", "signed", "count")  # in [0, 1]; a signed score; a count of pairs


class KeyScores(NamedTuple):
    """What a per-key count sees of R rows (one per row and N of the grid).

    ``unselected`` (R, NN, T): each key's closeness score where it is in the universe
    and not selected, else -inf (so a ``>=`` test against a finite score fails);
    ``selected`` (R, NN, N_max): the scores of the first N_max keys in rule order where
    selected, else +inf; ``cmin`` / ``cmax`` (R, NN) as in the module docstring.
    Counts must be exact (comparisons and sums of booleans): the plain, fused and
    compiled kernels then agree bit for bit.
    """

    unselected: Tensor
    selected: Tensor
    cmin: Tensor
    cmax: Tensor


class RowCounts:
    """The exact quantities of rows and N (module docstring), (..., NN) each.

    Attributes hold the built-in counts as they come (``intruders``, ``clears``,
    ``inversions`` int64; ``cmin``, ``cmax``, ``s2`` float64); ``n`` and ``size`` are
    float64 broadcastable to them; ``counts[name]`` reads any count by name, those of
    per-key metrics included. ``distance`` is the distance they were measured with.
    """

    def __init__(self, counts: dict[str, Tensor], grid: tuple[int, ...], distance: str):
        self.counts = counts
        self.distance = distance
        s2 = counts["s2"]
        self.dtype = s2.dtype
        self.n = torch.tensor(grid, device=s2.device, dtype=torch.int64).to(
            s2.dtype)[None, None, :]
        self.cmin, self.cmax, self.s2 = counts["cmin"], counts["cmax"], s2
        self.intruders, self.clears = counts["intruders"], counts["clears"]
        self.inversions = counts["inversions"]

    @property
    def size(self) -> Tensor:
        """|U| of each row, float64 (..., 1)."""
        return self.counts["size"].to(self.dtype)[..., None]


@dataclass(frozen=True)
class Metric:
    """One per-query metric: its name and how it is computed, tested and shown.

    ``value(RowCounts) -> Tensor`` float64 of every row and N (NaN where N is out of
    range is put in by the caller); ``count(KeyScores) -> Tensor`` int64 (R, NN), for a
    per-key metric only. ``kind`` (``KINDS``) says its range; ``tolerance`` is the
    absolute difference allowed against the float64 loop reference of the tests;
    ``exact``: the value is a function of exact counts alone (equal bit for bit however
    the rows are chunked or computed), else (a ratio of rounded inner products, e.g.
    the margin) it may move in its last bits; ``cosine``: defined for the cosine
    distance (else NaN there). (The figures' axis labels are theirs:
    ``figures/style.METRIC_LABELS``, where a metric without one is shown by its name.)
    """

    name: str
    value: Callable[[RowCounts], Tensor]
    kind: str = "fraction"
    tolerance: float = 0.0
    exact: bool = True
    cosine: bool = True
    count: Callable[[KeyScores], Tensor] | None = None
    doc: str = ""


# ----------------------------------------------------------------------- the built-ins


def precision(c: RowCounts) -> Tensor:
    """P_N = N / (N + #{j not in I : D[j] <= rho_max})."""
    return c.n / (c.n + c.intruders.to(c.dtype))


def recall(c: RowCounts) -> Tensor:
    """R_N = #{i in I : D[i] < rho_min} / N."""
    return c.clears.to(c.dtype) / c.n


def f_score(c: RowCounts) -> Tensor:
    """F_N, the harmonic mean of P_N and R_N (0 where both are 0)."""
    p, r = precision(c), recall(c)
    denom = p + r
    return torch.where(denom > 0, 2 * p * r / denom.clamp_min(1e-300), 0.0)


def margin(c: RowCounts) -> Tensor:
    """gamma_N = rho_min - rho_max; Euclidean: normalised by rho_min + rho_max and taken
    from the closeness scores, without subtracting two nearly equal distances."""
    if c.distance != "euclidean":
        return c.cmin - c.cmax
    rho_min = (c.s2 - c.cmax).clamp_min(0).sqrt()
    rho_max = (c.s2 - c.cmin).clamp_min(0).sqrt()
    spread = rho_min + rho_max
    return torch.where(spread > 0, (c.cmin - c.cmax) / spread.clamp_min(1e-300), 0.0)


def inversions(c: RowCounts) -> Tensor:
    """#{(i, j) : i in I, j not in I, D[j] <= D[i]}."""
    return c.inversions.to(c.dtype)


BUILT_IN = (
    Metric("precision", precision, doc=precision.__doc__),
    Metric("recall", recall, doc=recall.__doc__),
    Metric("f_score", f_score, tolerance=1e-12, doc=f_score.__doc__),
    # the reference's margin is sqrt(rho_min^2) - sqrt(rho_max^2) from exact squares;
    # the fast one a ratio of rounded inner products
    Metric("margin", margin, kind="signed", tolerance=1e-5, exact=False, doc=margin.__doc__),
    Metric("inversions", inversions, kind="count", doc=inversions.__doc__),
)

def register_metric(metric: Metric) -> Metric:
    """Declare ``metric``: it joins ``names.METRICS`` (after those declared before) and
    every result, table and test from then on. One clear error on a taken name or an
    unknown kind."""
    if not metric.name.isidentifier():
        raise ConfigError(f"metric: expected a new identifier, got {metric.name!r}")
    if metric.kind not in KINDS:
        raise ConfigError(f"metric {metric.name}: kind must be one of {', '.join(KINDS)}, "
                          f"got {metric.kind!r}")
    return METRICS.register(metric.name, metric)


def unregister_metric(name: str) -> None:
    """Take a metric registered at run time out again (a test's clean-up); the built-in
    ones stay."""
    METRICS.unregister(name)


def metrics() -> tuple[Metric, ...]:
    """Every registered metric, in ``names.METRICS`` order."""
    return tuple(METRICS[name] for name in METRICS)


def metric(name: str) -> Metric:
    return METRICS[name]


def key_counts() -> tuple[tuple[str, Callable[[KeyScores], Tensor]], ...]:
    """(name, count) of every per-key metric, for the counting kernels (hashable: a
    compiled kernel keys its graphs on it)."""
    return tuple((m.name, m.count) for m in metrics() if m.count is not None)


def metric_values(counts: dict[str, Tensor], grid: tuple[int, ...], distance: str
                  ) -> dict[str, Tensor]:
    """Every registered metric (float64) of rows and N from their exact counts."""
    c = RowCounts(counts, grid, distance)
    out = {}
    for m in metrics():
        value = m.value(c)
        if distance == "cosine" and not m.cosine:
            value = torch.full_like(value, float("nan"))
        out[m.name] = value
    return out


for _m in BUILT_IN:
    register_metric(_m)

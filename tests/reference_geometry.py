"""Slow reference for the top-N geometric metrics (SPEC 2), written from the definition.

Everything here is a plain loop over heads, query rows, repeats and N, with no
shared work between N values and no algebraic shortcuts: the point is to be
obviously correct, so that the fast path (``attngeom.core.geometry.topn_metrics``,
which works from the value Gram matrix as SPEC 8 describes) can be compared with
it on generated inputs.

Arithmetic:
- Euclidean distance: every comparison is exact. The float inputs are turned into
  ``fractions.Fraction`` (exactly, float32 or float64), the contributions, the
  aggregate and the squared distances are computed as fractions, and the metrics
  compare squared distances (the square root is monotone). Only the margin is a
  float: ``sqrt(rho_min^2) - sqrt(rho_max^2)`` evaluated in float64 from the exact
  squares.
- Cosine distance: float64 throughout, ``1 - <y_u, s> / (|y_u| |s| + 1e-12)``.
- Contribution rule scores: ``alpha_j * sqrt(sum_c v_jc^2)`` in float64, ties to the
  smaller position, as the fast path defines them.
- Random rule: the draws r_i come from ``attngeom.core.random_control.uniform_draws``
  (the control's random numbers) for one (head, t) at a time; the shuffle is done
  here, in full and by the textbook: the list of the universe's keys with position 0
  put back, swapping entries i and i + r_i for i = 0, 1, ..., then position 0 taken
  out again where the universe lacks it.

Shapes follow the fast path: metrics ``(K, H, Q, NN)`` float64 with NaN where
undefined, ``valid`` bool of the same shape, ``trivial`` ``(NN,)``, ``nonfinite``
``(H, Q)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from attngeom.core.metrics import metric as declared_metric
from attngeom.core.random_control import row_states, uniform_draws
from attngeom.names import METRICS

RULES = ("attention", "contribution", "random")
DISTANCES = ("euclidean", "cosine")
COSINE_EPS = 1e-12


@dataclass
class ReferenceTopN:
    """Reference result; the same fields and shapes as the fast path's ``TopNMetrics``:
    every registered metric (``names.METRICS``) by attribute or ``metric(name)``."""

    metrics: dict[str, np.ndarray]
    valid: np.ndarray
    trivial: np.ndarray
    nonfinite: np.ndarray

    def metric(self, name: str) -> np.ndarray:
        return self.metrics[name]

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name == "metrics":
            raise AttributeError(name)
        try:
            return self.metrics[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class RowFacts:
    """One selected set I = order[:n] of a row, with every key's distance: what a metric's
    reference definition reads. ``dist`` maps each universe key to its distance (exact
    squares for the Euclidean distance), ``margin_of(rho_min, rho_max)`` turns the two
    radii into the reported margin."""

    n: int
    selected: list[int]
    rest: list[int]
    dist: dict
    margin_of: Callable

    @property
    def rho_max(self):
        return max(self.dist[i] for i in self.selected)

    @property
    def rho_min(self):
        return min(self.dist[j] for j in self.rest)

    @property
    def size(self) -> int:
        """|U|."""
        return len(self.selected) + len(self.rest)


def _outside_close(r: RowFacts) -> int:
    return sum(1 for j in r.rest if r.dist[j] <= r.rho_max)


def _inside_clear(r: RowFacts) -> int:
    return sum(1 for i in r.selected if r.dist[i] < r.rho_min)


def _f_score(r: RowFacts) -> Fraction:
    p, q = REFERENCE["precision"](r), REFERENCE["recall"](r)
    return Fraction(0) if p + q == 0 else 2 * p * q / (p + q)


# Each metric's definition, written from SPEC 2 by loops over the keys. A metric
# registered without an entry here fails the reference tests (``MissingReference``).
REFERENCE: dict[str, Callable[[RowFacts], Fraction | float | int]] = {
    "precision": lambda r: Fraction(r.n, r.n + _outside_close(r)),
    "recall": lambda r: Fraction(_inside_clear(r), r.n),
    "f_score": _f_score,
    "margin": lambda r: r.margin_of(r.rho_min, r.rho_max),
    "inversions": lambda r: sum(1 for i in r.selected for j in r.rest
                                if r.dist[j] <= r.dist[i]),
}


class MissingReference(AssertionError):
    """A registered metric with no definition in ``REFERENCE``."""


class RowMetrics:
    """Every registered metric of one selected set, before conversion to float."""

    def __init__(self, values: dict) -> None:
        self.values = values
        for name, value in values.items():
            setattr(self, name, value)


def reference_value(name: str, facts: RowFacts):
    """The reference definition of metric ``name`` at one row and N."""
    if name not in REFERENCE:
        raise MissingReference(
            f"metric {name!r} is registered but has no reference definition: add one to "
            "REFERENCE in tests/reference_geometry.py")
    return REFERENCE[name](facts)


def _as_numpy64(x) -> np.ndarray:
    """Float64 numpy copy of a tensor or array (float32 -> float64 is exact)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def universe_of_row(visible_row: Sequence[bool], exclude_sink: bool) -> list[int]:
    """Positions in the row's universe: the visible keys, minus position 0 if excluded."""
    universe = []
    for j, seen in enumerate(visible_row):
        if not seen:
            continue
        if exclude_sink and j == 0:
            continue
        universe.append(j)
    return universe


def shuffled(universe: list[int], draws: np.ndarray) -> list[int]:
    """The random order: Fisher-Yates over the universe with position 0 put back."""
    keys = sorted(set(universe) | {0})
    for i in range(len(keys)):
        j = i + int(draws[i])
        assert i <= j < len(keys), (i, j, len(keys))
        keys[i], keys[j] = keys[j], keys[i]
    return [j for j in keys if j in set(universe)]


def random_draws(seed, window, layer, head: int, t: int, repeats: int,
                 universe: list[int]) -> np.ndarray:
    """(repeats, |U with 0|) the control's draws for one row, every step of the shuffle."""
    size = len(set(universe) | {0})
    states = row_states(seed, window, layer, torch.tensor([head]), torch.tensor([t]), repeats)
    sizes = torch.full((repeats, 1, 1), size, dtype=torch.int64)
    return uniform_draws(states, sizes, size)[:, 0, 0].numpy()


def order_universe(
    rule: str,
    universe: list[int],
    alpha_row: np.ndarray,
    values_kv: np.ndarray,
    draws_row: np.ndarray | None,
) -> list[int]:
    """The universe in the order of the selection rule; ties go to the smaller position."""
    if rule == "attention":
        return sorted(universe, key=lambda j: (-float(alpha_row[j]), j))
    if rule == "contribution":
        scores = {}
        for j in universe:
            squares = 0.0
            for x in values_kv[j]:
                squares += float(x) * float(x)
            scores[j] = float(alpha_row[j]) * math.sqrt(squares)
        return sorted(universe, key=lambda j: (-scores[j], j))
    if rule == "random":
        return shuffled(universe, draws_row)
    raise ValueError(f"expected rule in {RULES}, got {rule!r}")


def metrics_from_distances(order: list[int], n: int, dist: dict, margin_of) -> RowMetrics:
    """SPEC 2 metrics (every registered one) of I = order[:n] from any totally ordered
    distances ``dist[u]``.

    ``margin_of(rho_min, rho_max)`` turns the two radii into the reported margin
    (for squared Euclidean distances it takes the square roots).
    """
    facts = RowFacts(n, order[:n], order[n:], dist, margin_of)
    return RowMetrics({name: reference_value(name, facts) for name in METRICS})


def euclidean_row(order: list[int], n: int, alpha_row: np.ndarray, values_kv: np.ndarray):
    """Exact Euclidean metrics of I = order[:n] (squared distances as fractions)."""
    dim = values_kv.shape[1]
    y = {}
    for u in order:
        a = Fraction(float(alpha_row[u]))
        y[u] = [a * Fraction(float(values_kv[u, c])) for c in range(dim)]
    s = [Fraction(0)] * dim
    for i in order[:n]:
        for c in range(dim):
            s[c] += y[i][c]
    dist2 = {}
    for u in order:
        total = Fraction(0)
        for c in range(dim):
            diff = y[u][c] - s[c]
            total += diff * diff
        dist2[u] = total

    def margin_of(rho_min2, rho_max2):
        return math.sqrt(float(rho_min2)) - math.sqrt(float(rho_max2))

    return metrics_from_distances(order, n, dist2, margin_of)


def cosine_row(order: list[int], n: int, alpha_row: np.ndarray, values_kv: np.ndarray):
    """Float64 cosine-distance metrics of I = order[:n]."""
    dim = values_kv.shape[1]
    y = {}
    for u in order:
        y[u] = [float(alpha_row[u]) * float(values_kv[u, c]) for c in range(dim)]
    s = [0.0] * dim
    for i in order[:n]:
        for c in range(dim):
            s[c] += y[i][c]
    s_norm = math.sqrt(sum(x * x for x in s))
    dist = {}
    for u in order:
        dot = sum(y[u][c] * s[c] for c in range(dim))
        y_norm = math.sqrt(sum(x * x for x in y[u]))
        dist[u] = 1.0 - dot / (y_norm * s_norm + COSINE_EPS)
    return metrics_from_distances(order, n, dist, lambda lo, hi: lo - hi)


def row_metrics(
    order: list[int], n: int, alpha_row: np.ndarray, values_kv: np.ndarray, distance: str
) -> RowMetrics:
    """Metrics of the first ``n`` keys of ``order`` (1 <= n < len(order) is the caller's job)."""
    if distance == "euclidean":
        return euclidean_row(order, n, alpha_row, values_kv)
    if distance == "cosine":
        return cosine_row(order, n, alpha_row, values_kv)
    raise ValueError(f"expected distance in {DISTANCES}, got {distance!r}")


def reference_topn(
    alpha,
    values,
    n_grid: Sequence[int],
    *,
    rule: str = "attention",
    distance: str = "euclidean",
    visible=None,
    exclude_sink: bool = False,
    query_positions=None,
    repeats: int = 1,
    seed: int = 0,
    window: int = 0,
    layer: int = 0,
) -> ReferenceTopN:
    """SPEC 2 top-N metrics by brute force; arguments as ``topn_metrics``.

    alpha (H, Q, T), values (G, T, d), visible (H or 1, Q, T) bool or None (causal
    with respect to ``query_positions``), query_positions (Q,) or None (the last Q).
    """
    alpha = _as_numpy64(alpha)
    values = _as_numpy64(values)
    num_heads, num_queries, num_keys = alpha.shape
    num_kv = values.shape[0]
    group = num_heads // num_kv
    if query_positions is None:
        positions = list(range(num_keys - num_queries, num_keys))
    else:
        positions = [int(t) for t in torch.as_tensor(query_positions).tolist()]
    if visible is None:
        vis = np.zeros((1, num_queries, num_keys), dtype=bool)
        for q, t in enumerate(positions):
            for j in range(num_keys):
                vis[0, q, j] = j <= t
    else:
        vis = torch.as_tensor(visible).cpu().numpy().astype(bool)
    grid = [int(n) for n in n_grid]
    num_repeats = repeats if rule == "random" else 1

    shape = (num_repeats, num_heads, num_queries, len(grid))
    out = {name: np.full(shape, np.nan) for name in METRICS}
    valid = np.zeros(shape, dtype=bool)
    nonfinite = np.zeros((num_heads, num_queries), dtype=bool)
    trivial = np.array([distance == "euclidean" and n == 1 for n in grid], dtype=bool)

    for h in range(num_heads):
        kv = h // group
        for q in range(num_queries):
            vis_row = vis[h if vis.shape[0] > 1 else 0, q]
            universe = universe_of_row(vis_row, exclude_sink)
            alpha_row = alpha[h, q]
            if any(not math.isfinite(float(alpha_row[j])) for j in universe):
                nonfinite[h, q] = True
                continue
            keys = None
            if rule == "random":
                keys = random_draws(seed, window, layer, h, int(positions[q]), num_repeats,
                                    universe)
            for k in range(num_repeats):
                draws_row = None if keys is None else keys[k]
                order = order_universe(rule, universe, alpha_row, values[kv], draws_row)
                for c, n in enumerate(grid):
                    if not 1 <= n < len(universe):
                        continue
                    res = row_metrics(order, n, alpha_row, values[kv], distance)
                    for name, value in res.values.items():
                        out[name][k, h, q, c] = float(value)
                    valid[k, h, q, c] = True
    return ReferenceTopN(metrics=out, valid=valid, trivial=trivial, nonfinite=nonfinite)


METRIC_FIELDS = tuple(METRICS)  # the metrics registered when the tests were collected


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_matches_reference(fast, ref: ReferenceTopN) -> None:
    """Fast result equals the reference: shapes, flags, NaN pattern, and every registered
    metric within the tolerance its declaration gives (``Metric.tolerance``)."""
    for name in ("valid", "trivial", "nonfinite"):
        got, want = _np(getattr(fast, name)), getattr(ref, name)
        assert got.dtype == np.bool_, f"{name}: expected bool, got {got.dtype}"
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        mismatch = np.argwhere(got != want)
        assert mismatch.size == 0, f"{name} differs at {mismatch[:5].tolist()}: got {got}"
    for name in METRICS:
        got, want = _np(fast.metric(name)), ref.metric(name)
        assert got.dtype == np.float64, f"{name}: expected float64, got {got.dtype}"
        assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
        nan_diff = np.argwhere(np.isnan(got) != np.isnan(want))
        assert nan_diff.size == 0, (
            f"{name}: NaN pattern differs at {nan_diff[:5].tolist()}\ngot  {got}\nwant {want}"
        )
        both = ~np.isnan(want)
        assert np.array_equal(np.isnan(want), ~ref.valid), f"reference {name} NaN != ~valid"
        tol = declared_metric(name).tolerance
        bad = np.argwhere(both & ~(np.abs(got - want) <= tol))
        assert bad.size == 0, (
            f"{name} differs at (k, h, q, n) {bad[:5].tolist()}: "
            f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"
        )

"""The geometry of one head and one query, key by key (method §4, computed as §11 says).

The run's tables hold aggregates; the viewer shows where every key of one query row
sits. For a selection rule, a distance and each N it computes, over the row's
universe U (the visible keys), in float64:

- the closeness score of every key to the aggregate ``s_N = sum_{k<N} y_sigma(k)``:
  ``g_u = 2 alpha_u <v_u, s_N> - alpha_u^2 ||v_u||^2`` for the Euclidean distance
  (``D_u^2 = ||s_N||^2 - g_u``, and every comparison is one of g, never of D), the
  cosine similarity of ``y_u`` to ``s_N`` for the cosine distance (``D_u = 1 - cos``);
- the radii ``rho_max`` (farthest selected key) and ``rho_min`` (nearest unselected
  key), and the keys that break the picture: *intruders*, unselected keys with
  ``D <= rho_max`` (each costs Precision), and *stragglers*, selected keys with
  ``D >= rho_min`` (each costs Recall);
- P, R, F, margin and inversions counted from those per-key scores.

The arithmetic is that of ``attngeom.geometry.topn_metrics``'s direct path, step for
step (the aggregates as a cumulative sum of the selected value rows in rule order,
``<v_u, s_N>`` as one product ``V s_N``, the same cancellation guard for the cosine
distance), so the numbers the viewer prints are the ones the run's tables average;
``tests/viewer`` checks that they are equal, not merely close. Orders come from
``select_order`` itself, the random ghost from the control's own draws (repeat 0 of
the seeded control, so its sets are nested in N).

The picture places key u at radius ``D_u`` (exact) and at the angle of its
contribution ``y_u`` in the plane of the first two principal axes of the
contributions (uncentred: the right singular vectors of the matrix of y), so that the
radii are exact and ``rho_max``, ``rho_min`` are circles; only the angle is a
projection. Nothing here imports anything but torch, numpy and the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import ValueStats
from attngeom.core.geometry import COSINE_EPS, select_order
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, RULES

# the cosine cancellation guard of the core (an aggregate that cancels to rounding noise
# counts as zero), the same constant
_CANCEL = 16 * torch.finfo(torch.float64).eps


@dataclass
class SelectionGeometry:
    """One rule and distance of one query row, for every N of ``ns``.

    Keys are listed by ``keys`` (the universe's positions, ascending, shape (U,)). Per N
    (first axis, (K,) or (K, U)): ``close`` the closeness scores (larger = nearer),
    ``distance`` D of every key to s_N, ``selected`` membership of I_N, ``intruders``
    (unselected, D <= rho_max) and ``stragglers`` (selected, D >= rho_min), the radii,
    ``aggregate_norm`` ||s_N||, and the metrics exactly as ``topn_metrics`` gives them.
    ``order`` holds the rule's first ``max(ns)`` keys (positions).
    """

    rule: str
    distance: str
    ns: np.ndarray
    keys: np.ndarray
    order: np.ndarray
    close: np.ndarray
    distances: np.ndarray
    selected: np.ndarray
    intruders: np.ndarray
    stragglers: np.ndarray
    rho_max: np.ndarray
    rho_min: np.ndarray
    aggregate_norm: np.ndarray
    aggregates: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f_score: np.ndarray
    margin: np.ndarray
    inversions: np.ndarray

    def at(self, n: int) -> int:
        """Index of N = ``n`` in ``ns`` (``ConfigError`` naming the N available)."""
        hits = np.flatnonzero(self.ns == int(n))
        if hits.size == 0:
            raise ConfigError(f"n: expected one of {self.ns.tolist()}, got {n!r}")
        return int(hits[0])

    def metrics(self, n: int) -> dict[str, float]:
        """P, R, F, margin, inversions, rho_max and rho_min at N = ``n``."""
        i = self.at(n)
        return {name: float(getattr(self, name)[i]) for name in (
            "precision", "recall", "f_score", "margin", "inversions", "rho_max", "rho_min")}


def check_ns(ns: Sequence[int], universe_size: int) -> np.ndarray:
    """The valid N of ``ns`` (1 <= N < |U|), sorted and unique; ``ConfigError`` if none."""
    try:
        values = sorted({int(n) for n in ns})
    except (TypeError, ValueError):
        raise ConfigError(f"n_grid: expected integers, got {ns!r}") from None
    valid = [n for n in values if 1 <= n < universe_size]
    if not valid:
        raise ConfigError(f"n_grid: expected N in [1, {universe_size - 1}] for a query with "
                          f"{universe_size} visible keys, got {values}")
    return np.asarray(valid, dtype=np.int64)


def selection_order(alpha: Tensor, values: Tensor, universe: Tensor, rule: str, width: int, *,
                    query: int, seed: int = 0, window: int = 0, layer: int = 0,
                    head: int = 0) -> Tensor:
    """(width,) int64: the first ``width`` keys of the row under ``rule``, as the core
    orders them (ties to the smaller position; the random rule is repeat 0 of the
    seeded control of (seed, window, layer, head, query))."""
    RULES.check(rule, "ranking")
    norms = ValueStats(values[None]).norms  # (1, T) float64, as the core computes them
    return select_order(alpha.to(torch.float64)[None, None], norms, universe[None, None], rule,
                        width, query_positions=torch.tensor([int(query)]), seed=seed,
                        window=window, layer=layer,
                        head_index=torch.tensor([int(head)]))[0, 0, 0]


def selection_geometry(alpha: Tensor, values: Tensor, universe: Tensor, ns: Sequence[int], *,
                       rule: str = "attention", distance: str = "euclidean", query: int,
                       seed: int = 0, window: int = 0, layer: int = 0, head: int = 0
                       ) -> SelectionGeometry:
    """Every key's distance to s_N, the radii, the offenders and the metrics (module doc).

    ``alpha`` (T,) the query row's probabilities (float32 as captured), ``values`` (T, d)
    the value states of the kv head serving the query head, ``universe`` (T,) bool the
    keys the row sees; ``ns`` the set sizes (each 1 <= N < |U|). ``seed``, ``window``,
    ``layer`` and ``head`` seed the random rule as the run's control does.
    """
    if distance not in DISTANCES:
        raise ConfigError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r}")
    universe = universe.to(torch.bool)
    if not bool(torch.isfinite(alpha[universe]).all()) or not bool(
            torch.isfinite(values[universe]).all()):
        raise ConfigError("the query row has non-finite attention or value states; the "
                          "metrics skip such rows and the viewer cannot draw them")
    size = int(universe.sum())
    grid = check_ns(ns, size)
    # the keys up to the last visible one, as the core's chunks cut them (a causal row
    # sees a prefix; keys past it are in no universe and change nothing)
    tk = int(torch.nonzero(universe).max()) + 1
    alpha64 = alpha[:tk].to(torch.float64)
    univ = universe[:tk]
    vals = values[:tk].to(torch.float32)
    nmax = int(grid.max())
    top = selection_order(alpha[:tk], vals, univ, rule, nmax, query=query, seed=seed,
                          window=window, layer=layer, head=head)
    stats = ValueStats(vals[None])
    close, s, s2 = _closeness(alpha64, stats, top, grid, distance)
    keys = torch.nonzero(univ).flatten()
    close_u = close[:, keys].numpy()
    s2n = s2.numpy()
    keys_np = keys.numpy()
    top_np = top.numpy()
    # membership of I_N, per N, over the universe's keys
    rank = np.full(tk, np.iinfo(np.int64).max, dtype=np.int64)
    rank[top_np] = np.arange(nmax)
    selected = rank[keys_np][None, :] < grid[:, None]
    big = np.inf
    cmin = np.where(selected, close_u, big).min(-1)  # the farthest selected key's score
    cmax = np.where(selected, -big, close_u).max(-1)  # the nearest unselected key's score
    intruders = ~selected & (close_u >= cmin[:, None])
    stragglers = selected & (close_u <= cmax[:, None])
    inversions = np.array([
        int((close_u[c][~selected[c]][None, :] >= close_u[c][selected[c]][:, None]).sum())
        for c in range(len(grid))], dtype=np.int64)
    m = _metric_values(grid, intruders.sum(-1), (selected & ~stragglers).sum(-1), cmin, cmax,
                       s2n, inversions, size, distance)
    if distance == "euclidean":
        dist = np.sqrt(np.maximum(s2n[:, None] - close_u, 0.0))
    else:
        dist = 1.0 - close_u
    # the radii from the very distances drawn (the same operations on the same scores,
    # so the farthest selected key lies exactly on rho_max, whatever sqrt rounds to)
    rho_max = np.where(selected, dist, -np.inf).max(-1)
    rho_min = np.where(selected, np.inf, dist).min(-1)
    return SelectionGeometry(
        rule=rule, distance=distance, ns=grid, keys=keys_np, order=top_np,
        close=close_u, distances=dist, selected=selected, intruders=intruders,
        stragglers=stragglers, rho_max=rho_max, rho_min=rho_min,
        aggregate_norm=np.sqrt(np.maximum(s2n, 0.0)), aggregates=s.numpy(),
        precision=m["precision"], recall=m["recall"], f_score=m["f_score"],
        margin=m["margin"], inversions=inversions.astype(np.float64))


def _closeness(alpha64: Tensor, stats: ValueStats, top: Tensor, grid: np.ndarray,
               distance: str) -> tuple[Tensor, Tensor, Tensor]:
    """(K, tk) closeness scores of every key to each aggregate, the (K, d) aggregates and
    their (K,) squared norms, with the core's direct path's arithmetic: the aggregates a
    cumulative sum of the selected rows in rule order, ``<v_u, s_N>`` one product."""
    v64, sq, norms = stats.values64[0], stats.sq_norms[0], stats.norms[0]
    nmax, tk = int(grid.max()), alpha64.shape[0]
    a_top = alpha64.gather(0, top)
    partial = torch.cumsum(a_top[:, None] * v64.index_select(0, top), dim=0)
    s = partial.index_select(0, torch.tensor([n - 1 for n in grid.tolist()]))  # (K, d)
    d = v64.shape[-1]
    inner = torch.matmul(s.reshape(1, -1, d), v64.transpose(-1, -2)[None]).reshape(
        len(grid), tk)
    s2 = (s * s).sum(-1)
    a = alpha64[None, :]
    if distance == "euclidean":
        return 2.0 * a * inner - a * a * sq[None, :], s, s2
    lengths = a_top * norms.gather(0, top)
    kmask = (torch.arange(nmax)[:, None] < torch.as_tensor(grid)[None, :]).to(torch.float64)
    scale = (lengths[None, :] * kmask.T).sum(-1)
    limit = _CANCEL * torch.as_tensor(grid, dtype=torch.float64) * scale * scale
    degenerate = s2 <= limit
    s2 = s2.masked_fill(degenerate, 0.0)
    inner = inner.masked_fill(degenerate[:, None], 0.0)
    root = s2.clamp_min(0).sqrt()
    close = (a * inner) / ((a * norms[None, :]) * root[:, None] + COSINE_EPS)
    return close, s, s2


def _metric_values(n: np.ndarray, intruders: np.ndarray, clears: np.ndarray, cmin: np.ndarray,
                   cmax: np.ndarray, s2: np.ndarray, inversions: np.ndarray, size: int,
                   distance: str) -> dict[str, np.ndarray]:
    """Every registered metric from the row's exact counts, by the core's own functions
    (``core.metrics.metric_values``): the viewer prints what the tables average."""
    from attngeom.core.metrics import metric_values

    t = torch.from_numpy
    counts = {"cmin": t(cmin), "cmax": t(cmax), "s2": t(s2),
              "intruders": t(intruders.astype(np.int64)), "clears": t(clears.astype(np.int64)),
              "inversions": t(inversions.astype(np.int64)),
              "size": torch.full(cmin.shape, int(size), dtype=torch.int64)}
    grid = tuple(int(x) for x in n)
    return {name: value.reshape(-1).numpy()
            for name, value in metric_values(counts, grid, distance).items()}


def vector_distance(a: np.ndarray, b: np.ndarray, distance: str) -> float:
    """D(a, b) of two vectors in float64, by the metric's own definition (method §4)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if distance == "euclidean":
        return float(np.linalg.norm(a - b))
    return float(1.0 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + COSINE_EPS))


def principal_angles(contributions: np.ndarray, *extra: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """Angles of the contributions (U, d) in the plane of their first two principal axes.

    Uncentred (right singular vectors of the contribution matrix), float64; each axis
    signed so that the key with the largest contribution has a non-negative coordinate
    on it. Returns (angles (U,), axes (2, d), the angles of the ``extra`` vectors).
    """
    y = np.asarray(contributions, np.float64)
    d = y.shape[1]
    axes = np.zeros((2, d))
    if np.any(y):
        _, _, vt = np.linalg.svd(y, full_matrices=False)
        axes[: min(2, vt.shape[0])] = vt[:2]
    lead = int(np.argmax(np.linalg.norm(y, axis=1)))
    for k in range(2):
        if y[lead] @ axes[k] < 0:
            axes[k] = -axes[k]
    xy = y @ axes.T
    angles = np.arctan2(xy[:, 1], xy[:, 0])
    others = [float(np.arctan2(*(np.asarray(e, np.float64) @ axes.T)[::-1])) for e in extra]
    return angles, axes, others

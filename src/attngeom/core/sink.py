"""Sink geometry (SPEC 3): the first token's value, its attention mass, its rank.

The paper reports the sink's value norm several times smaller than the other tokens'
and systematically negatively aligned with them, while it soaks up much of the
attention. This module measures that per (layer, head) from the attention rows, the
value norms and the value Gram matrix only (SPEC 8), and also looks for *other* sink
positions (e.g. BERT's [SEP]) instead of assuming position 0 is the only one.

Per window w and head h (kv head g serving h, positions j >= 1 of the window):

- ``norm_ratio``        = mean_j ||v_j|| / ||v_0||              (NaN if ||v_0|| = 0)
- ``sink_cos_mean``     = cos(v_0, mean_j v_j) = mean_j G[0, j] / (||v_0|| sqrt(mean_{j,k} G[j, k]))
- ``sink_cos_pairwise`` = mean_j cos(v_0, v_j)
- ``sink_mass``         = mean of alpha[t, 0] over analysed queries that see >= 2 keys
- ``sink_in_top_n``     = share of analysed queries with 1 <= N < |U_t| whose attention-rule
  top-N set holds the sink: ties go to the smaller position, so the sink is in it iff
  ``#{j in U_t : alpha[t, j] > alpha[t, 0]} < N``; a query that cannot see the sink
  (a sliding window) counts as "not in the top N".

A cosine with a zero vector is 0. Each statistic is a mean over the window's queries,
then a plain mean over the windows where it is defined (``n_windows`` = windows of
that layer analysed). The four ``f_*`` separability columns of table ``sink`` come from
the geometry pass and are not produced here.

Other sinks (table ``sink_positions``): pooled over all analysed queries (>= 2 visible
keys) of a layer, position j >= 1 is reported when its mean attention
``mass_share = sum_t alpha[t, j] / #{t : j visible}`` is at least ``min_share`` (default
0.1) and at least ``min_ratio`` (default 5) times what uniform attention would give it
over the same queries, ``sum_t alpha[t, j] / sum_t 1 / |U_t|``. Pooled sums (rather than
per-window means) keep the state O(H T) per layer; with one query per window, or
equal-length windows in ``all`` mode, they equal the per-window mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.bounds import SINK, check_n_grid, finite_rows, safe_cos
from attngeom.errors import ConfigError

SINK_COLUMNS = (
    "layer", "head", "n", "sink_position", "norm_ratio", "sink_cos_mean", "sink_cos_pairwise",
    "sink_mass", "sink_in_top_n", "n_windows",
)
SINK_POSITION_COLUMNS = ("layer", "head", "position", "mass_share", "n_windows")


def sink_value_stats(stats: ValueStats) -> dict[str, Tensor]:
    """Value-side sink statistics of one window per kv head (SPEC 3).

    Shapes: stats of values (G, T, d) -> ``norm_ratio``, ``sink_cos_mean``,
    ``sink_cos_pairwise`` each (G,) float64 (NaN when T < 2; ``norm_ratio`` NaN when the
    sink's value is zero).

    >>> v = torch.tensor([[[-1.0, 0.0], [2.0, 0.0], [0.0, 2.0]]])
    >>> {k: round(float(x[0]), 4) for k, x in sink_value_stats(ValueStats(v)).items()}
    {'norm_ratio': 2.0, 'sink_cos_mean': -0.7071, 'sink_cos_pairwise': -0.5}
    """
    norms, gram = stats.norms, stats.gram
    g, t = norms.shape
    if t < 2:
        nan = torch.full((g,), float("nan"), dtype=torch.float64, device=norms.device)
        return {"norm_ratio": nan, "sink_cos_mean": nan.clone(), "sink_cos_pairwise": nan.clone()}
    n0 = norms[:, SINK]
    mean_rest = norms[:, 1:].mean(-1)
    ok = n0 > 0
    norm_ratio = torch.where(ok, mean_rest / torch.where(ok, n0, 1.0), float("nan"))
    g0 = gram[:, SINK, 1:]
    mean_sq = gram[:, 1:, 1:].mean(dim=(-1, -2)).clamp_min(0.0)
    sink_cos_mean = safe_cos(g0.mean(-1), n0 * mean_sq.sqrt())
    pairwise = safe_cos(g0, n0[:, None] * norms[:, 1:]).mean(-1)
    return {"norm_ratio": norm_ratio, "sink_cos_mean": sink_cos_mean,
            "sink_cos_pairwise": pairwise}


def sink_query_stats(
    alpha: Tensor, universe: Tensor, n_grid: Sequence[int]
) -> dict[str, Tensor]:
    """Query-side sink statistics of a chunk of rows (SPEC 3).

    Shapes: alpha (H, Q, T), universe (H, Q, T) bool -> ``sink_mass`` (H, Q) float64,
    ``mass_valid`` (H, Q) bool (>= 2 visible keys), ``in_top_n`` and ``top_valid``
    (H, Q, NN) bool (valid: 1 <= N < |U_t|). Rows with a non-finite alpha on their
    universe are invalid throughout.

    >>> a = torch.tensor([[[0.3, 0.3, 0.4, 0.0]]])
    >>> u = torch.tensor([[[True, True, True, False]]])
    >>> s = sink_query_stats(a, u, [1, 2, 3])
    >>> s["in_top_n"][0, 0].tolist(), s["top_valid"][0, 0].tolist()
    ([False, True, True], [True, True, False])
    """
    grid = check_n_grid(n_grid)
    universe = universe.to(torch.bool)
    alpha = torch.where(universe, alpha, torch.zeros((), dtype=alpha.dtype, device=alpha.device))
    usize = universe.sum(-1)
    a0 = alpha[..., SINK]
    beats = ((alpha > a0[..., None]) & universe).sum(-1)
    n = torch.tensor(grid, dtype=torch.int64, device=alpha.device)
    in_top = universe[..., SINK, None] & (beats[..., None] < n)
    ok = finite_rows(alpha, universe)
    return {
        "sink_mass": a0.to(torch.float64),
        "mass_valid": (usize >= 2) & ok,
        "in_top_n": in_top,
        "top_valid": (n < usize[..., None]) & ok[..., None],
    }


class _SinkWindow:
    """Per (layer, window): value statistics once, query sums over its chunks."""

    def __init__(self, value: dict[str, np.ndarray], num_heads: int, nn: int) -> None:
        self.value = value
        self.mass_sum = np.zeros(num_heads)
        self.mass_count = np.zeros(num_heads)
        self.top_sum = np.zeros((num_heads, nn))
        self.top_count = np.zeros((num_heads, nn))


def _nanmean(x: np.ndarray, axis: int = 0) -> np.ndarray:
    ok = ~np.isnan(x)
    cnt = ok.sum(axis)
    tot = np.where(ok, x, 0.0).sum(axis)
    return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


class SinkAccumulator:
    """Streaming sink statistics for tables ``sink`` and ``sink_positions`` (SPEC 3).

    ``update`` accepts query chunks of one (window, layer) in any number and order (the
    value statistics are taken once per window); ``merge`` adds a shard with disjoint
    windows, exactly. ``compute()`` gives table ``sink`` (rows ordered by layer, head,
    n), ``compute_positions()`` table ``sink_positions`` (layer, head, position).
    """

    table = "sink"

    def __init__(
        self, n_grid: Sequence[int], *, min_share: float = 0.1, min_ratio: float = 5.0
    ) -> None:
        self.n_grid = check_n_grid(n_grid)
        if not 0.0 <= min_share <= 1.0:
            raise ConfigError(f"min_share: expected a value in [0, 1], got {min_share!r}")
        if min_ratio < 0:
            raise ConfigError(f"min_ratio: expected a value >= 0, got {min_ratio!r}")
        self.min_share = float(min_share)
        self.min_ratio = float(min_ratio)
        self._windows: dict[tuple[int, int], _SinkWindow] = {}
        self._heads: dict[int, int] = {}
        # per layer, pooled over queries: sum alpha[t, j], sum 1/|U_t|, #{t : j visible}
        self._pos: dict[int, list[np.ndarray]] = {}

    def _check_heads(self, layer: int, num_heads: int) -> None:
        known = self._heads.setdefault(layer, num_heads)
        if known != num_heads:
            raise ConfigError(f"layer {layer}: expected {known} heads, got {num_heads}")

    def update(self, batch: AttentionBatch) -> None:
        """Add one query chunk of one (window, layer)."""
        h = batch.num_heads
        self._check_heads(batch.layer, h)
        key = (batch.layer, batch.window)
        win = self._windows.get(key)
        if win is None:
            kv = batch.kv_of_head.cpu()
            value = {k: v.cpu()[kv].numpy() for k, v in sink_value_stats(batch.stats).items()}
            win = self._windows[key] = _SinkWindow(value, h, len(self.n_grid))
        universe = batch.universe()
        q = sink_query_stats(batch.alpha, universe, self.n_grid)
        mv = q["mass_valid"]
        win.mass_sum += torch.where(mv, q["sink_mass"], 0.0).sum(-1).cpu().numpy()
        win.mass_count += mv.sum(-1).cpu().numpy()
        tv = q["top_valid"]
        win.top_sum += (q["in_top_n"] & tv).sum(1).cpu().numpy()
        win.top_count += tv.sum(1).cpu().numpy()
        u = universe & mv[..., None]
        alpha = torch.where(u, batch.alpha, 0.0).to(torch.float64)
        inv = 1.0 / universe.sum(-1).clamp_min(1).to(torch.float64)
        parts = [alpha.sum(1), (u * inv[..., None]).sum(1), u.sum(1).to(torch.float64)]
        self._add_pos(batch.layer, [p.cpu().numpy() for p in parts])

    def _add_pos(self, layer: int, parts: list[np.ndarray]) -> None:
        old = self._pos.get(layer)
        if old is None:
            self._pos[layer] = [p.copy() for p in parts]
            return
        width = max(old[0].shape[1], parts[0].shape[1])
        pad = lambda x: np.pad(x, ((0, 0), (0, width - x.shape[1])))  # noqa: E731
        self._pos[layer] = [pad(a) + pad(b) for a, b in zip(old, parts, strict=True)]

    def merge(self, other: SinkAccumulator) -> SinkAccumulator:
        """Add another shard's state (disjoint windows); returns self."""
        if not isinstance(other, SinkAccumulator):
            raise ConfigError(f"expected a SinkAccumulator, got {type(other).__name__}")
        mine = (self.n_grid, self.min_share, self.min_ratio)
        theirs = (other.n_grid, other.min_share, other.min_ratio)
        if mine != theirs:
            raise ConfigError(
                f"expected equal n_grid, min_share, min_ratio, got {mine} and {theirs}"
            )
        overlap = self._windows.keys() & other._windows.keys()
        if overlap:
            raise ConfigError(f"expected disjoint windows across shards, got (layer, window) "
                              f"{sorted(overlap)[0]} in both")
        for layer, h in other._heads.items():
            self._check_heads(layer, h)
        for key, win in other._windows.items():
            copy = _SinkWindow(dict(win.value), 0, 0)
            for name in ("mass_sum", "mass_count", "top_sum", "top_count"):
                setattr(copy, name, getattr(win, name).copy())
            self._windows[key] = copy
        for layer, parts in other._pos.items():
            self._add_pos(layer, parts)
        return self

    def _n_windows(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for layer, _ in self._windows:
            out[layer] = out.get(layer, 0) + 1
        return out

    def compute(self) -> dict[str, np.ndarray]:
        """Columns of table ``sink`` (without ``model``, ``corpus`` and the ``f_*`` columns)."""
        cols: dict[str, list[np.ndarray]] = {c: [] for c in SINK_COLUMNS}
        nn = len(self.n_grid)
        grid = np.asarray(self.n_grid, dtype=np.int64)
        for layer in sorted(self._heads):
            wins = [w for (lay, _), w in sorted(self._windows.items()) if lay == layer]
            h = self._heads[layer]
            value = {k: _nanmean(np.stack([w.value[k] for w in wins])) for k in wins[0].value}
            mass = _nanmean(np.stack([_ratio(w.mass_sum, w.mass_count) for w in wins]))
            top = _nanmean(np.stack([_ratio(w.top_sum, w.top_count) for w in wins]))
            rep = lambda x: np.repeat(np.asarray(x), nn)  # noqa: E731
            cols["layer"].append(np.full(h * nn, layer, dtype=np.int64))
            cols["head"].append(rep(np.arange(h, dtype=np.int64)))
            cols["n"].append(np.tile(grid, h))
            cols["sink_position"].append(np.full(h * nn, SINK, dtype=np.int64))
            for name in ("norm_ratio", "sink_cos_mean", "sink_cos_pairwise"):
                cols[name].append(rep(value[name]))
            cols["sink_mass"].append(rep(mass))
            cols["sink_in_top_n"].append(top.reshape(-1))
            cols["n_windows"].append(np.full(h * nn, len(wins), dtype=np.int64))
        return {c: _cat(v, c) for c, v in cols.items()}

    def compute_positions(self) -> dict[str, np.ndarray]:
        """Columns of table ``sink_positions``: detected sinks at positions j >= 1."""
        cols: dict[str, list[np.ndarray]] = {c: [] for c in SINK_POSITION_COLUMNS}
        n_windows = self._n_windows()
        for layer in sorted(self._pos):
            mass, uniform, count = self._pos[layer]
            share = _ratio(mass, count)
            rel = _ratio(mass, uniform)
            hit = (share >= self.min_share) & (rel >= self.min_ratio)
            hit[:, : SINK + 1] = False
            heads, positions = np.nonzero(hit)
            cols["layer"].append(np.full(heads.size, layer, dtype=np.int64))
            cols["head"].append(heads.astype(np.int64))
            cols["position"].append(positions.astype(np.int64))
            cols["mass_share"].append(share[heads, positions])
            cols["n_windows"].append(np.full(heads.size, n_windows.get(layer, 0), dtype=np.int64))
        return {c: _cat(v, c) for c, v in cols.items()}

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        """``{"sink": compute(), "sink_positions": compute_positions()}``."""
        return {"sink": self.compute(), "sink_positions": self.compute_positions()}


def _cat(parts: list[np.ndarray], name: str) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    floats = {"norm_ratio", "sink_cos_mean", "sink_cos_pairwise", "sink_mass", "sink_in_top_n",
              "mass_share"}
    return np.zeros(0, dtype=np.float64 if name in floats else np.int64)

"""Sink geometry (method §6): the first token's value, its attention mass, its rank.

The paper reports the sink's value norm several times smaller than the other tokens'
and systematically negatively aligned with them, while it soaks up much of the
attention. This module measures that per (layer, head) from the attention rows and
O(T d) value statistics (no T x T matrix, method §11), and also looks for *other* sinks
(a separator inside the window, the first "." or newline, BERT's [SEP]) by token
identity instead of assuming position 0 is the only one.

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

Other sinks (table ``sink_tokens``), by **token identity**: pooling by absolute
position would report recency as a sink (with ``final`` queries the last positions of
every window always get mass) and miss a separator that sits at a different position
in every window. A (query t, key j) pair counts when the key is visible, the row sees
>= 2 keys with finite alphas, and the query is at least ``min_distance`` (16) positions
from the key, ``|t - j| >= 16`` (so local, previous-token attention is never a sink).
An **occurrence** is one key (window, j) with >= 1 counted pair; its ``share`` is the
mean alpha[t, j] over its counted pairs. Per (layer, head) and token id x, over the
occurrences of x at j >= 1: ``occurrences``, ``windows`` (distinct windows holding one),
``pairs``; pooled over the pairs, ``mean_share`` (mean alpha[t, j]) and
``uniform_share`` (mean 1/|U_t|, what uniform attention would give); over the
occurrences, the nearest-rank quartiles of the share ``share_q1``, ``median_share``,
``share_q3`` (the ceil(p n)-th smallest of n), ``share_held`` (the fraction of
occurrences with share >= ``min_share``) and ``lift = median_share / uniform_share``.

A sink **recurs** (SPEC 3): x is ``detected`` only with occurrences >= ``min_occurrences``
(5), windows >= ``min_windows`` (3), median_share >= ``min_share`` (0.1) and lift >=
``min_lift`` (5). Without recurrence one final query attending once to a content word
(retrieval, not a sink) was listed as a sink in a dozen heads of SmolLM2.

Why the median is kept exact with bounded state: a median needs the per-occurrence
shares, and a run's occurrences grow as windows x layers x heads x T (all keys of every
window). Only shares >= ``min_share`` can decide detection, so the state keeps those
(with ``final`` queries at most 1/min_share per window and head, as a row gives that
much to at most 1/min_share keys; with more queries a kept key must average it over
every query that sees it) plus exact counts of all occurrences. The median
and quartiles are nearest-rank order statistics (the ceil(p n)-th smallest), never an
average of two middle values, so each is exact whenever it is >= ``min_share``; below
it, the value is unknown and reported NaN (the token is then not detected, which is
exact too). The ids of ``report_ids`` and position 0 keep every share, so their lines
are always complete. Counts and pooled sums merge by addition over disjoint windows and
the kept shares by concatenation, so a merge of shards equals one run.

Position 0 gets its own line per head, computed the same way whatever its token (its
occurrences are windows; it is the sink by construction, so its ``detected`` tests the
share alone, as before recurrence was required), and so does every id of
``report_ids`` (the special tokens: BOS, [SEP], separators are the usual suspects) that
occurred, detected or not, so their numbers are on record either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.bounds import finite_rows, grid_of, safe_cos
from attngeom.core.protocol import Accumulator, check_disjoint
from attngeom.errors import ConfigError
from attngeom.names import SINK

SINK_COLUMNS = (
    "layer", "head", "n", "sink_position", "norm_ratio", "sink_cos_mean", "sink_cos_pairwise",
    "sink_mass", "sink_in_top_n", "n_windows",
)
SINK_TOKEN_COLUMNS = (
    "layer", "head", "position", "token_id", "occurrences", "windows", "pairs", "mean_share",
    "uniform_share", "share_q1", "median_share", "share_q3", "share_held", "lift", "detected",
    "n_windows",
)
MIN_SINK_DISTANCE = 16
MIN_SINK_OCCURRENCES = 5
MIN_SINK_WINDOWS = 3
QUARTILES = ((1, 4), (1, 2), (3, 4))  # p as a fraction: nearest-rank q1, median, q3
ANY_POSITION = -1  # the ``position`` of a by-token row (any position j >= 1)
MIXED_TOKEN = -1  # the ``token_id`` of the position-0 line when windows start differently


def sink_value_stats(stats: ValueStats) -> dict[str, Tensor]:
    """Value-side sink statistics of one window per kv head (method §6).

    Shapes: stats of values (G, T, d) -> ``norm_ratio``, ``sink_cos_mean``,
    ``sink_cos_pairwise`` each (G,) float64 (NaN when T < 2; ``norm_ratio`` NaN when the
    sink's value is zero).

    >>> v = torch.tensor([[[-1.0, 0.0], [2.0, 0.0], [0.0, 2.0]]])
    >>> {k: round(float(x[0]), 4) for k, x in sink_value_stats(ValueStats(v)).items()}
    {'norm_ratio': 2.0, 'sink_cos_mean': -0.7071, 'sink_cos_pairwise': -0.5}
    """
    norms = stats.norms
    g, t = norms.shape
    if t < 2:
        nan = torch.full((g,), float("nan"), dtype=torch.float64, device=norms.device)
        return {"norm_ratio": nan, "sink_cos_mean": nan.clone(), "sink_cos_pairwise": nan.clone()}
    n0 = norms[:, SINK]
    mean_rest = norms[:, 1:].mean(-1)
    ok = n0 > 0
    norm_ratio = torch.where(ok, mean_rest / torch.where(ok, n0, 1.0), float("nan"))
    v = stats.values64
    g0 = (v[:, 1:] * v[:, SINK : SINK + 1]).sum(-1)  # <v_0, v_b>, b >= 1
    mean_v = v[:, 1:].mean(1)  # the mean of the Gram block is ||mean v_b||^2: O(T d)
    sink_cos_mean = safe_cos(g0.mean(-1), n0 * mean_v.norm(dim=-1))
    pairwise = safe_cos(g0, n0[:, None] * norms[:, 1:]).mean(-1)
    return {"norm_ratio": norm_ratio, "sink_cos_mean": sink_cos_mean,
            "sink_cos_pairwise": pairwise}


def sink_query_stats(
    alpha: Tensor, universe: Tensor, n_grid: Sequence[int]
) -> dict[str, Tensor]:
    """Query-side sink statistics of a chunk of rows (method §6).

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
    grid = grid_of(n_grid)
    universe = universe.to(torch.bool)
    alpha = torch.where(universe, alpha, 0.0)
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


def sink_pair_sums(
    alpha: Tensor, universe: Tensor, query_positions: Tensor, *,
    min_distance: int = MIN_SINK_DISTANCE,
) -> dict[str, Tensor]:
    """Per key, the sums behind the by-token sink detector (method §6, "other sinks").

    A (t, j) pair counts when j is in row t's universe, the row sees >= 2 keys with
    finite alphas and ``|t - j| >= min_distance``. Shapes: alpha, universe (H, Q, T),
    query_positions (Q,) -> ``share``, ``uniform`` (H, T) float64 (sums of alpha[t, j]
    and 1/|U_t| over the counted pairs of key j) and ``pairs`` (H, T) int64.

    >>> a = torch.zeros(1, 2, 20); a[0, :, 1] = 0.5; a[0, :, 2] = 0.5
    >>> s = sink_pair_sums(a, a > 0, torch.tensor([18, 19]))
    >>> s["pairs"][0, :3].tolist(), s["share"][0, 1].item()
    ([0, 2, 2], 1.0)
    """
    universe = universe.to(torch.bool)
    t = alpha.shape[-1]
    keys = torch.arange(t, device=alpha.device)
    qpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    far = (qpos[:, None] - keys[None, :]).abs() >= min_distance  # (Q, T)
    usize = universe.sum(-1)
    ok = (usize >= 2) & finite_rows(alpha, universe)
    pair = universe & far[None] & ok[..., None]
    a = torch.where(pair, alpha, 0.0)
    inv = 1.0 / usize.clamp_min(1).to(torch.float64)
    return {
        "share": a.to(torch.float64).sum(1),
        "uniform": (pair * inv[..., None]).sum(1),
        "pairs": pair.sum(1),
    }


class _TokenSums:
    """Per layer, sums by token id: sorted ``ids`` (U,) and (H, U) arrays, merged lazily."""

    def __init__(self, num_heads: int, names: tuple[str, ...] = ("share", "uniform", "pairs")
                 ) -> None:
        self.num_heads = num_heads
        self.ids = np.zeros(0, dtype=np.int64)
        self.sums = {k: np.zeros((num_heads, 0)) for k in names}
        self.pending: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []

    def add(self, ids: np.ndarray, sums: dict[str, np.ndarray]) -> None:
        self.pending.append((ids, sums))
        if len(self.pending) >= 64:
            self.consolidate()

    def consolidate(self) -> None:
        if not self.pending:
            return
        ids = np.unique(np.concatenate([self.ids, *(p[0] for p in self.pending)]))
        out = {k: np.zeros((self.num_heads, ids.size)) for k in self.sums}
        for part_ids, part in [(self.ids, self.sums), *self.pending]:
            where = np.searchsorted(ids, part_ids)  # each part's ids are distinct
            for k in out:
                out[k][:, where] += part[k]
        self.ids, self.sums, self.pending = ids, out, []

    def add_all(self, other: _TokenSums) -> None:
        """Add another shard's sums (copies: ``other`` stays its own)."""
        other.consolidate()
        self.add(other.ids.copy(), {k: v.copy() for k, v in other.sums.items()})


def _by_token(x: np.ndarray, inverse: np.ndarray, count: int) -> np.ndarray:
    """(H, T') values per position summed by token: (H, ``count``), ``inverse`` (T',) each
    position's token index. Each head's entries go to bins of their own, in position
    order: the sums ``np.add.at`` makes (same order, so the same bits), about 9x faster."""
    h = x.shape[0]
    bins = (inverse.reshape(1, -1) + count * np.arange(h)[:, None]).reshape(-1)
    return np.bincount(bins, weights=x.astype(np.float64).reshape(-1),
                       minlength=h * count).reshape(h, count)


class _Occurrences:
    """One layer's folded occurrences: counts by token (``_TokenSums`` of ``occurrences``
    and ``windows``), position 0's counts (H,) and every position-0 share (a list of (H,)
    arrays, NaN where the window's key 0 had no counted pair), and the kept shares of the
    other keys as parallel arrays (head, token id, share)."""

    def __init__(self, num_heads: int) -> None:
        self.counts = _TokenSums(num_heads, ("occurrences", "windows"))
        self.occ0 = np.zeros(num_heads)
        self.shares0: list[np.ndarray] = []
        self.heads: list[np.ndarray] = []
        self.ids: list[np.ndarray] = []
        self.shares: list[np.ndarray] = []

    def add_window(self, share: np.ndarray, pairs: np.ndarray, tokens: np.ndarray,
                   floor: float, keep_ids: np.ndarray) -> None:
        """Fold one finished (layer, window): ``share`` (H, T) summed alphas and ``pairs``
        (H, T) counted pairs per key, ``tokens`` (T,)."""
        seen = pairs > 0
        occ = np.where(seen, share / np.maximum(pairs, 1), np.nan)
        self.occ0 += seen[:, SINK]
        self.shares0.append(occ[:, SINK].copy())
        ids, inverse = np.unique(tokens[1:], return_inverse=True)
        counts = _by_token(seen[:, 1:], inverse, ids.size)
        self.counts.add(ids, {"occurrences": counts, "windows": (counts > 0).astype(float)})
        rest = occ[:, 1:]
        keep = seen[:, 1:] & ((rest >= floor) | np.isin(tokens[1:], keep_ids)[None, :])
        heads, pos = np.nonzero(keep)
        self.heads.append(heads.astype(np.int64))
        self.ids.append(tokens[1:][pos].astype(np.int64))
        self.shares.append(rest[heads, pos])

    def add_all(self, other: _Occurrences) -> None:
        """Add another shard's occurrences (copies: ``other`` stays its own)."""
        self.counts.add_all(other.counts)
        self.occ0 = self.occ0 + other.occ0
        self.shares0 += [x.copy() for x in other.shares0]
        self.heads += [x.copy() for x in other.heads]
        self.ids += [x.copy() for x in other.ids]
        self.shares += [x.copy() for x in other.shares]


def _cat_or_empty(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def nearest_rank(sorted_top: np.ndarray, n: int, num: int, den: int) -> float:
    """The ceil(p n)-th smallest of n values (p = num / den), from their ``sorted_top``
    (ascending), the k largest of them; NaN when that rank is not among the k.

    >>> nearest_rank(np.array([0.2, 0.5, 0.9]), 5, 1, 2), nearest_rank(np.array([0.9]), 4, 1, 2)
    (0.2, nan)
    """
    if n <= 0:
        return float("nan")
    rank = max(1, -(-n * num // den))
    i = rank - 1 - (n - sorted_top.size)
    return float(sorted_top[i]) if i >= 0 else float("nan")


def _share_spread(sorted_top: np.ndarray, n: int, min_share: float) -> list[float]:
    """q1, median, q3 (nearest rank) and the share of occurrences >= ``min_share``."""
    qs = [nearest_rank(sorted_top, n, a, b) for a, b in QUARTILES]
    held = float((sorted_top >= min_share).sum()) / n if n > 0 else float("nan")
    return [*qs, held]


class SinkAccumulator(Accumulator):
    """Streaming sink statistics for tables ``sink`` and ``sink_tokens`` (method §6).

    ``update`` accepts query chunks of one (window, layer) in any number and order (the
    value statistics are taken once per window); ``merge`` adds a shard with disjoint
    windows, exactly. ``compute()`` gives table ``sink`` (rows ordered by layer, head,
    n), ``compute_tokens()`` table ``sink_tokens`` (the position-0 line and every
    detected or listed token per head).
    """

    tables = ("sink", "sink_tokens")

    def __init__(
        self, n_grid: Sequence[int], *, min_share: float = 0.1, min_lift: float = 5.0,
        min_distance: int = MIN_SINK_DISTANCE, min_occurrences: int = MIN_SINK_OCCURRENCES,
        min_windows: int = MIN_SINK_WINDOWS, report_ids: Sequence[int] = (),
    ) -> None:
        self.n_grid = grid_of(n_grid)
        self.report_ids = tuple(sorted({int(i) for i in report_ids}))
        if not 0.0 <= min_share <= 1.0:
            raise ConfigError(f"min_share: expected a value in [0, 1], got {min_share!r}")
        if min_lift < 0:
            raise ConfigError(f"min_lift: expected a value >= 0, got {min_lift!r}")
        for name, value in (("min_distance", min_distance),
                            ("min_occurrences", min_occurrences), ("min_windows", min_windows)):
            if int(value) != value or value < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {value!r}")
        self.min_share = float(min_share)
        self.min_lift = float(min_lift)
        self.min_distance = int(min_distance)
        self.min_occurrences = int(min_occurrences)
        self.min_windows = int(min_windows)
        self._windows: dict[tuple[int, int], _SinkWindow] = {}
        self._heads: dict[int, int] = {}
        self._tokens: dict[int, _TokenSums] = {}
        # per (layer, window) updated here: (H, T) summed alphas and counted pairs per key
        # (over the window's chunks, which may come in any order), and window tokens;
        # ``merge`` folds another shard's into ``_occ`` (occurrence counts and the kept
        # shares), so a run's merged state does not grow as windows x T
        self._key_sums: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._window_tokens: dict[int, np.ndarray] = {}
        self._occ: dict[int, _Occurrences] = {}  # per layer, folded occurrences
        self._firsts: set[int] = set()  # position 0's token ids of the folded windows
        self._folded: set[tuple[int, int]] = set()  # (layer, window)s merged in
        # per layer, position 0 alone: share, uniform, pairs sums (H,)
        self._zero: dict[int, dict[str, np.ndarray]] = {}

    def _check_heads(self, layer: int, num_heads: int) -> None:
        known = self._heads.setdefault(layer, num_heads)
        if known != num_heads:
            raise ConfigError(f"layer {layer}: expected {known} heads, got {num_heads}")

    def __setstate__(self, state: dict) -> None:
        """A shard pickled before the per-occurrence shares existed cannot give medians."""
        if "_key_sums" not in state:
            raise ConfigError("sink shard: written by an older attngeom without "
                              "per-occurrence shares; rerun the analysis without --resume")
        self.__dict__.update(state)

    def update(self, batch: AttentionBatch) -> None:
        """Add one query chunk of one (window, layer)."""
        h = batch.num_heads
        self._check_heads(batch.layer, h)
        key = (batch.layer, batch.window)
        if key in self._folded:
            raise ConfigError(f"window {batch.window}, layer {batch.layer}: it came from "
                              "another shard through merge; every chunk of a window's layer "
                              "goes to one accumulator")
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
        if batch.tokens is not None:
            self._add_tokens(batch, universe)

    def _add_tokens(self, batch: AttentionBatch, universe: Tensor) -> None:
        layer, h = batch.layer, batch.num_heads
        sums = sink_pair_sums(batch.alpha, universe, batch.query_positions,
                              min_distance=self.min_distance)
        sums = {k: v.cpu().numpy() for k, v in sums.items()}
        tokens = batch.tokens.detach().cpu().to(torch.int64).numpy()
        known = self._window_tokens.setdefault(batch.window, tokens)
        if not np.array_equal(known, tokens):
            raise ConfigError(f"window {batch.window}: expected the same tokens in every layer")
        key = (layer, batch.window)
        ks = self._key_sums.get(key)
        if ks is None:
            self._key_sums[key] = {"share": sums["share"].copy(),
                                   "pairs": sums["pairs"].astype(np.int64)}
        else:
            ks["share"] += sums["share"]
            ks["pairs"] += sums["pairs"]
        zero = self._zero.setdefault(layer, {k: np.zeros(h) for k in ("share", "uniform",
                                                                         "pairs")})
        for k in zero:
            zero[k] += sums[k][:, SINK]
        ids, inverse = np.unique(tokens[1:], return_inverse=True)
        part = {k: _by_token(v[:, 1:], inverse, ids.size) for k, v in sums.items()}
        self._tokens.setdefault(layer, _TokenSums(h)).add(ids, part)

    def merge(self, other: SinkAccumulator) -> SinkAccumulator:
        """Add another shard's state (disjoint windows); returns self."""
        self._check_mergeable(other, n_grid=self.n_grid, min_share=self.min_share,
                              min_lift=self.min_lift, min_distance=self.min_distance,
                              min_occurrences=self.min_occurrences,
                              min_windows=self.min_windows, report_ids=self.report_ids)
        check_disjoint(self._windows, other._windows)
        for layer, h in other._heads.items():
            self._check_heads(layer, h)
        for key, win in other._windows.items():
            copy = _SinkWindow(dict(win.value), 0, 0)
            for name in ("mass_sum", "mass_count", "top_sum", "top_count"):
                setattr(copy, name, getattr(win, name).copy())
            self._windows[key] = copy
        for layer, ts in other._tokens.items():
            self._tokens.setdefault(layer, _TokenSums(ts.num_heads)).add_all(ts)
        for layer, zero in other._zero.items():
            mine_zero = self._zero.setdefault(layer, {k: np.zeros_like(v)
                                                      for k, v in zero.items()})
            for k, v in zero.items():
                mine_zero[k] += v
        for (layer, window), ks in other._key_sums.items():  # complete: disjoint windows
            self._layer_occ(layer, ks["share"].shape[0]).add_window(
                ks["share"], ks["pairs"], other._window_tokens[window], self.min_share,
                np.asarray(self.report_ids, dtype=np.int64))
        for layer, occ in other._occ.items():
            self._layer_occ(layer, occ.occ0.size).add_all(occ)
        self._firsts |= other._firsts | {int(t[SINK]) for t in other._window_tokens.values()}
        self._folded |= other._folded | set(other._windows)
        return self

    def _layer_occ(self, layer: int, num_heads: int) -> _Occurrences:
        return self._occ.setdefault(layer, _Occurrences(num_heads))

    def _n_windows(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for layer, _ in self._windows:
            out[layer] = out.get(layer, 0) + 1
        return out

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Tables ``sink`` (without the ``f_*`` columns, which the geometry pass gives) and
        ``sink_tokens``."""
        return {"sink": self._sink_columns(), "sink_tokens": self._token_columns()}

    def _sink_columns(self) -> dict[str, np.ndarray]:
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

    def _all_occurrences(self, layer: int, h: int) -> _Occurrences:
        """The layer's folded occurrences plus those of its windows not folded yet (a
        fresh object: computing never changes the state)."""
        out = _Occurrences(h)
        if layer in self._occ:
            out.add_all(self._occ[layer])
        keep_ids = np.asarray(self.report_ids, dtype=np.int64)
        for (lay, window), ks in sorted(self._key_sums.items()):
            if lay == layer:
                out.add_window(ks["share"], ks["pairs"], self._window_tokens[window],
                               self.min_share, keep_ids)
        return out

    def _recurs(self, median, uniform, occurrences, windows, *, recur: bool = True
                ) -> np.ndarray:
        """SPEC 3's rule: recurring (occurrences, windows) and a median share that holds.
        Position 0 (``recur=False``) is the sink by construction, one occurrence per
        window: only its share is tested, as before recurrence was required."""
        median = np.asarray(median, dtype=np.float64)
        enough = ((np.asarray(occurrences) >= self.min_occurrences)
                  & (np.asarray(windows) >= self.min_windows)) if recur else True
        with np.errstate(invalid="ignore"):
            return (enough & (median >= self.min_share)
                    & (median >= self.min_lift * np.asarray(uniform)))

    def _token_columns(self) -> dict[str, np.ndarray]:
        """Table ``sink_tokens``: per head the position-0 line, then each detected or
        listed token (``position`` -1), by token id."""
        cols: dict[str, list[np.ndarray]] = {c: [] for c in SINK_TOKEN_COLUMNS}
        n_windows = self._n_windows()
        firsts = {int(t[SINK]) for t in self._window_tokens.values()} | self._firsts
        first_id = firsts.pop() if len(firsts) == 1 else MIXED_TOKEN
        for layer in sorted(self._tokens):
            ts = self._tokens[layer]
            ts.consolidate()
            h = ts.num_heads
            occ = self._all_occurrences(layer, h)
            occ.counts.consolidate()
            where = np.searchsorted(ts.ids, occ.counts.ids)  # folded ids are among ts.ids
            n_occ = np.zeros((h, ts.ids.size))
            n_occ[:, where] = occ.counts.sums["occurrences"]
            n_win = np.zeros((h, ts.ids.size))
            n_win[:, where] = occ.counts.sums["windows"]
            heads = _cat_or_empty(occ.heads, np.int64)
            slots = np.searchsorted(ts.ids, _cat_or_empty(occ.ids, np.int64))
            shares = _cat_or_empty(occ.shares, np.float64)
            order = np.lexsort((shares, slots, heads))
            heads, slots, shares = heads[order], slots[order], shares[order]
            group = heads * ts.ids.size + slots
            kept = np.bincount(group, minlength=h * ts.ids.size).reshape(h, -1)
            starts = np.concatenate([[0], np.cumsum(kept.reshape(-1))])
            uniform = _ratio(ts.sums["uniform"], ts.sums["pairs"])
            # the nearest-rank median is >= min_share only if it is among the kept shares
            n_int = n_occ.astype(np.int64)
            median_kept = kept >= n_int - np.maximum(1, -(-n_int // 2)) + 1
            maybe = median_kept & (n_occ >= self.min_occurrences) & (n_win >= self.min_windows)
            listed = np.isin(ts.ids, self.report_ids)[None, :] & (ts.sums["pairs"] > 0)
            rows_h, rows_s = np.nonzero(maybe | listed)
            spread = np.array([
                _share_spread(shares[starts[g]:starts[g + 1]], int(n_int[hh, ss]),
                              self.min_share)
                for hh, ss in zip(rows_h, rows_s, strict=True)
                for g in [hh * ts.ids.size + ss]
            ]).reshape(-1, 4)
            hit = self._recurs(spread[:, 1], uniform[rows_h, rows_s], n_occ[rows_h, rows_s],
                               n_win[rows_h, rows_s])
            keep = hit | listed[rows_h, rows_s]
            heads, slots, spread, hit = rows_h[keep], rows_s[keep], spread[keep], hit[keep]

            share0 = np.stack(occ.shares0) if occ.shares0 else np.zeros((0, h))
            spread0 = np.array([_share_spread(np.sort(col[~np.isnan(col)]),
                                              int((~np.isnan(col)).sum()), self.min_share)
                                for col in share0.T]).reshape(-1, 4)
            uniform0 = _ratio(self._zero[layer]["uniform"], self._zero[layer]["pairs"])
            hit0 = self._recurs(spread0[:, 1], uniform0, occ.occ0, occ.occ0, recur=False)

            rows_head = np.concatenate([np.arange(h), heads])
            order = np.argsort(rows_head, kind="stable")
            k = h + heads.size
            zero = self._zero[layer]

            def both(zero_part, token_part, order=order):
                return np.concatenate([np.asarray(zero_part), np.asarray(token_part)])[order]

            cols["layer"].append(np.full(k, layer, dtype=np.int64))
            cols["head"].append(rows_head[order].astype(np.int64))
            cols["position"].append(both(np.full(h, SINK), np.full(heads.size, ANY_POSITION))
                                    .astype(np.int64))
            cols["token_id"].append(both(np.full(h, first_id), ts.ids[slots]).astype(np.int64))
            cols["occurrences"].append(both(occ.occ0, n_occ[heads, slots]).astype(np.int64))
            cols["windows"].append(both(occ.occ0, n_win[heads, slots]).astype(np.int64))
            cols["pairs"].append(both(zero["pairs"], ts.sums["pairs"][heads, slots])
                                 .astype(np.int64))
            cols["mean_share"].append(both(_ratio(zero["share"], zero["pairs"]),
                                           _ratio(ts.sums["share"], ts.sums["pairs"])
                                           [heads, slots]))
            cols["uniform_share"].append(both(uniform0, uniform[heads, slots]))
            for i, name in enumerate(("share_q1", "median_share", "share_q3", "share_held")):
                cols[name].append(both(spread0[:, i], spread[:, i]))
            cols["lift"].append(both(_ratio(spread0[:, 1], uniform0),
                                     _ratio(spread[:, 1], uniform[heads, slots])))
            cols["detected"].append(both(hit0, hit).astype(bool))
            cols["n_windows"].append(np.full(k, n_windows.get(layer, 0), dtype=np.int64))
        return {c: _cat(v, c) for c, v in cols.items()}


def _cat(parts: list[np.ndarray], name: str) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    floats = {"norm_ratio", "sink_cos_mean", "sink_cos_pairwise", "sink_mass", "sink_in_top_n",
              "mean_share", "uniform_share", "lift", "share_q1", "median_share", "share_q3",
              "share_held"}
    if name == "detected":
        return np.zeros(0, dtype=bool)
    return np.zeros(0, dtype=np.float64 if name in floats else np.int64)

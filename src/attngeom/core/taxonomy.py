"""Head taxonomy by source winner (method §7): Retriever, Mixer, Reset.

For each counted query t >= 1 the winner is the key with the largest contribution,
``w_t = argmax_{j in U_t} alpha[t, j] ||v_j||`` (ties to the smaller position), classed
``self`` (w_t = t), ``sink`` (w_t = 0) or ``other``. The regime is a **single-source
plurality**: with n_self, n_sink and n_top, the count of the most frequent single
other source (one relative offset t - w_t or one absolute position w_t, whichever is
larger), a head is a **Retriever** if n_self is the largest, a **Mixer** if n_sink
is, a **Reset** otherwise (ties in that order; no fitted threshold). Lumping every
other position into one class (``rule="lumped"``, kept for comparison) lets "other"
win by sheer count. A head without any counted query gets regime ``none``.

Counted queries: every analysed query in ``final`` mode; only t >= T/2 in ``all`` and
``stride`` modes (``counted="half"``), since early queries choose among few keys.
Beside each label: the winning and runner-up shares, the most frequent other source
(kind ``offset`` or ``position``; a previous-token head reads ``offset 1``) with its
share, and the **label stability**, the share of window-bootstrap resamples in which
the head keeps its label (in ``final`` mode a label rests on one winner per window).

The geometric signature uses the head output ``z_t = sum_j alpha[t, j] v_j`` only
through inner products, read off the Gram matrix (method §11):
``<z_t, v_0> = sum_j alpha_j G[j, 0]``, ``<z_t, v_t> = sum_j alpha_j G[j, t]`` and
``||z_t||^2 = alpha^T G alpha``. The last costs O(T^2) per row; when the head dimension
d is smaller than T it is computed as ``||alpha V||^2`` instead (O(T d), the same number
in exact arithmetic, and still no d-dimensional output is kept). A cosine with a zero
vector is 0. ``offset_entropy`` is the Shannon entropy, in nats (natural log), of the
distribution of winner offsets ``t - w_t`` (negative offsets occur in encoders).

Statistics are sums and counts over the counted queries of a layer, plus each
window's winner counts (for the stability bootstrap), so query chunks and shards with
disjoint windows merge exactly.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.bounds import finite_rows, safe_cos
from attngeom.core.protocol import Accumulator, check_disjoint
from attngeom.errors import ConfigError
from attngeom.names import NO_REGIME, REGIME_RULES, REGIMES, SINK

COUNTED_QUERIES = ("final", "half")
TAXONOMY_COLUMNS = (
    "layer", "head", "n_queries", "f_self", "f_sink", "f_other", "offset_entropy",
    "sink_alignment", "self_alignment", "mean_output_norm", "regime", "regime_rule",
    "winning_share", "runner_up_share", "top_source_kind", "top_source", "top_source_share",
    "stability",
)
_INT_COLUMNS = ("layer", "head", "n_queries", "top_source")
_TEXT_COLUMNS = ("regime", "regime_rule", "top_source_kind")


def _grouped(x: Tensor, num_kv: int) -> Tensor:
    """(H, Q, ...) -> (G, H/G, Q, ...): the heads of each kv group side by side."""
    return x.reshape(num_kv, x.shape[0] // num_kv, *x.shape[1:])


def _check_kv(kv_of_head: Tensor, h: int, g: int) -> None:
    expected = torch.arange(h, device=kv_of_head.device) // (h // g)
    if h % g != 0 or not torch.equal(kv_of_head.to(torch.int64), expected):
        raise ConfigError(f"kv_of_head: expected h // (H / G) for H={h}, G={g}, got "
                          f"{kv_of_head.tolist()}")


def source_winners(alpha: Tensor, norms: Tensor, universe: Tensor) -> Tensor:
    """Winner key per row, ``argmax_{j in U} alpha_j ||v_j||`` with ties to the smaller j.

    Shapes: alpha (H, Q, T), norms (H, T) float64 (of each head's kv head), universe
    (H, Q, T) bool -> (H, Q) int64 (T where the universe is empty).

    >>> a = torch.tensor([[[0.2, 0.4, 0.4]]])
    >>> source_winners(a, torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 1, 3, dtype=torch.bool))
    tensor([[1]])
    """
    t = alpha.shape[-1]
    contrib = alpha.to(torch.float64) * norms[:, None, :]
    contrib = torch.where(universe, contrib, -torch.inf)
    best = contrib.amax(-1, keepdim=True)
    pos = torch.arange(t, device=alpha.device)
    hit = universe & (contrib == best)
    return torch.where(hit, pos, t).amin(-1)


def output_inner_products(
    alpha: Tensor, stats: ValueStats, kv_of_head: Tensor, query_positions: Tensor
) -> dict[str, Tensor]:
    """``<z_t, v_0>``, ``<z_t, v_t>`` and ``||z_t||^2`` of each head output (method §7).

    Shapes: alpha (H, Q, T), query_positions (Q,) -> ``z_sink``, ``z_self``, ``z_sq``
    each (H, Q) float64.
    """
    h, q, t = alpha.shape
    g = stats.num_kv_heads
    _check_kv(kv_of_head, h, g)
    a = _grouped(torch.where(torch.isfinite(alpha), alpha, 0.0).to(torch.float64), g)
    tpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    # the outputs themselves: one (rows x T) @ (T x d) product, then O(d) per row
    v = stats.values64.to(alpha.device)
    z = (a.reshape(g, -1, t) @ v).reshape(g, h // g, q, -1)
    z_sink = (z * v[:, None, None, SINK, :]).sum(-1)
    z_self = (z * v[:, tpos][:, None]).sum(-1)
    z_sq = (z * z).sum(-1)
    return {
        "z_sink": z_sink.reshape(h, q),
        "z_self": z_self.reshape(h, q),
        "z_sq": z_sq.reshape(h, q).clamp_min(0.0),
    }


def taxonomy_rows(batch: AttentionBatch) -> dict[str, Tensor]:
    """Per analysed row: validity, winner, class, offset, alignments, output norm (method §7).

    Shapes: -> ``valid`` (H, Q) bool (t >= 1, a non-empty universe, finite alphas),
    ``winner`` (H, Q) int64, ``cls`` (H, Q) int64 (0 self, 1 sink, 2 other), ``offset`` (H, Q) int64
    ``t - w_t``, ``sink_alignment``, ``self_alignment``, ``output_norm`` (H, Q) float64.
    """
    universe = batch.universe()
    kv = batch.kv_of_head
    norms = batch.stats.norms.to(batch.alpha.device)[kv]
    winner = source_winners(batch.alpha, norms, universe)
    tpos = batch.query_positions.to(device=batch.alpha.device, dtype=torch.int64)
    valid = (tpos >= 1)[None, :] & universe.any(-1) & finite_rows(batch.alpha, universe)
    cls = torch.where(winner == tpos[None, :], 0, torch.where(winner == SINK, 1, 2))
    alpha = torch.where(universe, batch.alpha, 0.0)
    ip = output_inner_products(alpha, batch.stats, kv, tpos)
    znorm = ip["z_sq"].sqrt()
    n0 = norms[:, SINK][:, None]
    nt = norms.gather(-1, tpos[None, :].expand(norms.shape[0], -1))
    return {
        "valid": valid,
        "winner": winner,
        "cls": cls,
        "offset": tpos[None, :] - winner,
        "sink_alignment": safe_cos(ip["z_sink"], znorm * n0),
        "self_alignment": safe_cos(ip["z_self"], znorm * nt),
        "output_norm": znorm,
    }


def classify_regime(n_self: np.ndarray, n_sink: np.ndarray, n_third: np.ndarray) -> np.ndarray:
    """Regime per head from the three source scores; ties Retriever > Mixer > Reset (method §7).

    ``n_third`` is ``n_top`` (the count of the most frequent single other source) under
    the single-source rule, or ``n_other`` (every other winner) under the lumped rule.

    >>> classify_regime(np.array([2, 1, 0, 1, 0]), np.array([2, 2, 0, 0, 0]),
    ...                 np.array([0, 2, 3, 1, 0])).tolist()
    ['Retriever', 'Mixer', 'Reset', 'Retriever', 'none']
    """
    n_self, n_sink, n_third = (np.asarray(x) for x in (n_self, n_sink, n_third))
    total = n_self + n_sink + n_third
    out = np.where(
        (n_self >= n_sink) & (n_self >= n_third), REGIMES[0],
        np.where(n_sink >= n_third, REGIMES[1], REGIMES[2]),
    ).astype(object)
    out[total == 0] = NO_REGIME
    return out


def _scores_order(n_self: np.ndarray, n_sink: np.ndarray, n_third: np.ndarray):
    """(winning score, runner-up score): the largest and second largest of the three."""
    scores = np.sort(np.stack([n_self, n_sink, n_third], -1).astype(np.float64), -1)
    return scores[..., 2], scores[..., 1]


class _TaxLayer:
    """One layer's pooled sums and its per-window winner counts (for stability)."""

    SUMS = ("n", "n_self", "n_sink", "n_other", "sink_alignment", "self_alignment",
            "output_norm")

    def __init__(self, num_heads: int) -> None:
        self.num_heads = num_heads
        self.sums = {k: np.zeros(num_heads) for k in self.SUMS}
        self.offsets_pos = np.zeros((num_heads, 0))  # every winner's offset 0, 1, 2, ...
        self.offsets_neg = np.zeros((num_heads, 0))  # offsets -1, -2, ...
        # window -> {"n_self", "n_sink", "n": (H,), "other": [(head, kind, key, count)]}
        self.windows: dict[int, dict] = {}

    def add_offsets(self, pos: np.ndarray, neg: np.ndarray) -> None:
        self.offsets_pos = _add_padded(self.offsets_pos, pos)
        self.offsets_neg = _add_padded(self.offsets_neg, neg)

    def window(self, index: int) -> dict:
        rec = self.windows.get(index)
        if rec is None:
            z = np.zeros(self.num_heads)
            rec = self.windows[index] = {"n": z.copy(), "n_self": z.copy(),
                                         "n_sink": z.copy(), "other": []}
        return rec


def _add_padded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    w = max(a.shape[1], b.shape[1])
    return np.pad(a, ((0, 0), (0, w - a.shape[1]))) + np.pad(b, ((0, 0), (0, w - b.shape[1])))


def _entropy(counts: np.ndarray) -> np.ndarray:
    total = counts.sum(-1, keepdims=True)
    p = np.where(total > 0, counts / np.maximum(total, 1), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.where(total[..., 0] > 0, terms.sum(-1), np.nan)


_INT32 = np.iinfo(np.int32)


def _compact(rows: np.ndarray) -> np.ndarray:
    """(S, 4) source rows as kept per window: int32 where they fit (heads, offsets,
    positions and one window's counts do), half the bytes of int64; sums are taken in
    int64. Rows that do not fit (a caller feeding a corpus as one window) stay int64."""
    if rows.size and (rows.min() < _INT32.min or rows.max() > _INT32.max):
        return rows.astype(np.int64)
    return rows.astype(np.int32)


def _other_sources(records: list[np.ndarray]) -> np.ndarray:
    """(S, 4) int64 rows (head, kind, key, count) summed over identical sources."""
    if not records:
        return np.zeros((0, 4), dtype=np.int64)
    rows = np.concatenate(records, dtype=np.int64)
    keys, inverse = np.unique(rows[:, :3], axis=0, return_inverse=True)
    counts = np.bincount(inverse.reshape(-1), weights=rows[:, 3], minlength=len(keys))
    return np.concatenate([keys, counts.astype(np.int64)[:, None]], 1)


def _best_source(sources: np.ndarray, num_heads: int):
    """Per head the most frequent single other source (method §7): count, kind, key.

    An offset (kind 0) wins a tie against a position (kind 1); among offsets the
    smallest |offset| then the smaller one wins, among positions the smaller one.
    Heads without other winners get count 0, kind -1, key -1.
    """
    best_n = np.zeros(num_heads, dtype=np.int64)
    best_kind = np.full(num_heads, -1, dtype=np.int64)
    best_key = np.full(num_heads, -1, dtype=np.int64)
    if len(sources):
        head, kind, key, count = sources.T
        # sort so that the winner of each head comes first
        order = np.lexsort((key, np.abs(key), kind, -count, head))
        first = order[np.r_[True, head[order][1:] != head[order][:-1]]]
        best_n[head[first]] = count[first]
        best_kind[head[first]] = kind[first]
        best_key[head[first]] = key[first]
    return best_n, best_kind, best_key


_RESAMPLE_ELEMENTS = 2**22  # (resamples x source rows) products held at once: 32 MB


def _resampled_top(sources_w: list[tuple[int, np.ndarray]], weights: np.ndarray,
                   num_heads: int, chunk: int = 128) -> np.ndarray:
    """(B, H) count of the most frequent other source in each window resample.

    ``sources_w`` pairs each window's column in ``weights`` (B, W) with its (S, 4) rows
    (head, kind, key, count); a resample's count of a source is the weighted sum of
    the windows' counts, its n_top the largest over offsets and positions. The rows go
    through in blocks (a whole corpus of ``all`` queries has millions), so memory holds
    ``chunk`` x (distinct sources) sums and ``_RESAMPLE_ELEMENTS`` products; the sums
    are of integers (multiplicities times counts), exact in float64 in any order.
    """
    b = weights.shape[0]
    out = np.zeros((b, num_heads))
    if not sources_w:
        return out
    cols = np.concatenate([np.full(len(r), w, dtype=np.int64) for w, r in sources_w])
    rows = np.concatenate([r for _, r in sources_w])
    if not len(rows):
        return out
    keys, inverse = np.unique(rows[:, :3], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    head_of_key = keys[:, 0]
    sorted_keys = inverse[order]
    block = max(1, _RESAMPLE_ELEMENTS // chunk)
    for s in range(0, b, chunk):
        w = weights[s : s + chunk]
        per_key = np.zeros((w.shape[0], len(keys)))  # (b', K)
        for r in range(0, len(order), block):
            o, k = order[r : r + block], sorted_keys[r : r + block]
            firsts = np.r_[0, np.flatnonzero(np.diff(k)) + 1]  # each key's first row here
            vals = w[:, cols[o]] * rows[o, 3][None, :]
            per_key[:, k[firsts]] += np.add.reduceat(vals, firsts, axis=1)
        best = np.zeros((per_key.shape[0], num_heads))
        np.maximum.at(best.T, head_of_key, per_key.T)
        out[s : s + chunk] = best
    return out


class TaxonomyAccumulator(Accumulator):
    """Streaming head taxonomy for table ``taxonomy`` (method §7); merge exact.

    ``counted``: ``"final"`` counts every analysed query (one per window in ``final``
    mode), ``"half"`` only queries t >= T/2 (``all`` and ``stride`` modes: early
    queries choose among few keys and inflate f_sink). ``rule``: ``"single"``
    (plurality of self, sink and the most frequent single other source) or
    ``"lumped"`` (every other position in one class). Label stability is the share of
    ``n_boot`` window-bootstrap resamples (seeded by ``seed``, the same resamples as
    the metric summary) giving the head its full-data label.
    """

    tables = ("taxonomy",)

    def __init__(self, *, counted: str = "final", rule: str = "single", n_boot: int = 1000,
                 seed: int = 0) -> None:
        if counted not in COUNTED_QUERIES:
            raise ConfigError(f"counted: expected one of {', '.join(COUNTED_QUERIES)}, "
                              f"got {counted!r}")
        if rule not in REGIME_RULES:
            raise ConfigError(f"regime_rule: expected one of {', '.join(REGIME_RULES)}, "
                              f"got {rule!r}")
        if int(n_boot) != n_boot or n_boot < 0:
            raise ConfigError(f"n_boot: expected an integer >= 0, got {n_boot!r}")
        self.counted, self.rule, self.n_boot, self.seed = counted, rule, int(n_boot), int(seed)
        self._layers: dict[int, _TaxLayer] = {}

    def _layer(self, layer: int, num_heads: int) -> _TaxLayer:
        return self._layer_state(layer, num_heads, _TaxLayer)

    def update(self, batch: AttentionBatch) -> None:
        """Add one query chunk."""
        st = self._layer(batch.layer, batch.num_heads)
        rows = taxonomy_rows(batch)
        t = batch.alpha.shape[-1]
        tpos = batch.query_positions.to(rows["valid"].device)
        v = rows["valid"]
        if self.counted == "half":
            v = v & (2 * tpos >= t)[None, :]
        f = v.to(torch.float64)
        cls = rows["cls"]
        add = {
            "n": f,
            "n_self": f * (cls == 0),
            "n_sink": f * (cls == 1),
            "n_other": f * (cls == 2),
            "sink_alignment": torch.where(v, rows["sink_alignment"], 0.0),
            "self_alignment": torch.where(v, rows["self_alignment"], 0.0),
            "output_norm": torch.where(v, rows["output_norm"], 0.0),
        }
        per_head = {k: x.sum(-1).cpu().numpy() for k, x in add.items()}
        for k, x in per_head.items():
            st.sums[k] += x
        rec = st.window(int(batch.window))
        for k in ("n", "n_self", "n_sink"):
            rec[k] += per_head[k]
        h = batch.num_heads
        off = rows["offset"]
        head = torch.arange(h, device=off.device)[:, None].expand_as(off)
        width = 2 * t - 1  # offsets -(T-1) .. T-1
        flat = head[v] * width + (off[v] + t - 1)
        hist = torch.bincount(flat, minlength=h * width).reshape(h, width)
        hist = hist.to(torch.float64).cpu().numpy()
        st.add_offsets(hist[:, t - 1 :], hist[:, : t - 1][:, ::-1])
        other = v & (cls == 2)
        if bool(other.any()):
            oh = head[other].cpu().numpy()
            ooff = off[other].cpu().numpy()
            opos = rows["winner"][other].cpu().numpy()
            both = np.concatenate([
                np.stack([oh, np.zeros_like(oh), ooff], 1),
                np.stack([oh, np.ones_like(oh), opos], 1),
            ]).astype(np.int64)
            keys, counts = np.unique(both, axis=0, return_counts=True)
            rec["other"].append(_compact(np.concatenate([keys, counts[:, None]], 1)))

    def merge(self, other: TaxonomyAccumulator) -> TaxonomyAccumulator:
        """Add another shard's state (disjoint windows); returns self."""
        self._check_mergeable(other, counted=self.counted, rule=self.rule, n_boot=self.n_boot,
                              seed=self.seed)
        for layer, ost in other._layers.items():
            st = self._layer(layer, ost.num_heads)
            check_disjoint(((layer, w) for w in st.windows), ((layer, w) for w in ost.windows))
            for k in st.sums:
                st.sums[k] = st.sums[k] + ost.sums[k]
            st.add_offsets(ost.offsets_pos, ost.offsets_neg)
            for w, rec in ost.windows.items():
                # a merged window is finished: its chunks' sources summed into one array
                other_rows = [_compact(_other_sources(rec["other"]))] if rec["other"] else []
                st.windows[w] = {"n": rec["n"].copy(), "n_self": rec["n_self"].copy(),
                                 "n_sink": rec["n_sink"].copy(), "other": other_rows}
        return self

    def _stability(self, st: _TaxLayer, labels: np.ndarray) -> np.ndarray:
        from attngeom.core.stats import bootstrap_indices

        h = st.num_heads
        windows = sorted(st.windows)
        if self.n_boot == 0 or not windows:
            return np.full(h, np.nan)
        w = len(windows)
        idx = bootstrap_indices(w, self.n_boot, self.seed)
        weights = np.zeros((self.n_boot, w))
        np.add.at(weights, (np.arange(self.n_boot)[:, None], idx), 1.0)
        per = {k: np.stack([st.windows[x][k] for x in windows]) for k in ("n_self", "n_sink",
                                                                           "n")}
        n_self = weights @ per["n_self"]
        n_sink = weights @ per["n_sink"]
        if self.rule == "single":
            third = _resampled_top(
                [(i, _other_sources(st.windows[x]["other"])) for i, x in enumerate(windows)],
                weights, h)
        else:
            third = weights @ (per["n"] - per["n_self"] - per["n_sink"])
        resampled = classify_regime(n_self, n_sink, third)
        same = (resampled == labels[None, :]).mean(0)
        return np.where(labels == NO_REGIME, np.nan, same)

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Table ``taxonomy``: one row per (layer, head)."""
        cols: dict[str, list[np.ndarray]] = {c: [] for c in TAXONOMY_COLUMNS}
        for layer in sorted(self._layers):
            st = self._layers[layer]
            s = st.sums
            n = s["n"]
            h = st.num_heads

            def ratio(x: np.ndarray, n: np.ndarray = n) -> np.ndarray:
                return np.where(n > 0, x / np.maximum(n, 1), np.nan)

            sources = _other_sources([r for rec in st.windows.values() for r in rec["other"]])
            n_top, kind, key = _best_source(sources, h)
            third = n_top if self.rule == "single" else s["n_other"]
            regime = classify_regime(s["n_self"], s["n_sink"], third)
            win, runner = _scores_order(s["n_self"], s["n_sink"], third)
            cols["layer"].append(np.full(h, layer, dtype=np.int64))
            cols["head"].append(np.arange(h, dtype=np.int64))
            cols["n_queries"].append(n.astype(np.int64))
            cols["f_self"].append(ratio(s["n_self"]))
            cols["f_sink"].append(ratio(s["n_sink"]))
            cols["f_other"].append(ratio(s["n_other"]))
            cols["offset_entropy"].append(
                _entropy(np.concatenate([st.offsets_pos, st.offsets_neg], -1)))
            cols["sink_alignment"].append(ratio(s["sink_alignment"]))
            cols["self_alignment"].append(ratio(s["self_alignment"]))
            cols["mean_output_norm"].append(ratio(s["output_norm"]))
            cols["regime"].append(regime)
            cols["regime_rule"].append(np.full(h, self.rule, dtype=object))
            cols["winning_share"].append(ratio(win))
            cols["runner_up_share"].append(ratio(runner))
            cols["top_source_kind"].append(
                np.array(["offset", "position", "none"], dtype=object)[np.where(kind < 0, 2,
                                                                                kind)])
            cols["top_source"].append(key.astype(np.int64))
            cols["top_source_share"].append(ratio(n_top.astype(np.float64)))
            cols["stability"].append(self._stability(st, regime))
        out = {}
        for c, parts in cols.items():
            if parts:
                out[c] = np.concatenate(parts)
            else:
                out[c] = np.zeros(0, dtype=np.int64 if c in _INT_COLUMNS else
                                  object if c in _TEXT_COLUMNS else np.float64)
        return {"taxonomy": out}

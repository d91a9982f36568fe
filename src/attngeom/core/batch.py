"""What every analysis of one (window, layer) sees: attention rows and value statistics.

method §11: every quantity of method §4-§8 follows from the attention rows of the analysed
queries and the value states of each kv head. ``ValueStats`` holds one (window, layer)'s
values and computes, lazily and once, what the analyses read: float64 norms, the value
Gram matrix (only where many query rows make it pay), the window's coherence and a
fixed sample of pair cosines (``pairs.py``); it is shared by every query chunk and every
accumulator of that layer. ``AttentionBatch`` pairs it with one chunk of attention rows.

Shapes (one window, no batch dimension):
    alpha            (H, Q, T) float32 post-softmax probabilities of the analysed rows
    visible          (H or 1, Q, T) bool, keys the mask lets each row see
    query_positions  (Q,) int64, the position t of each analysed row
    values           (G, T, d) float32 value states per kv head (H % G == 0)
    tokens           (T,) int64 token ids of the window (optional: sinks by token)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from attngeom.core.pairs import max_abs_cosine, sampled_pair_cosines
from attngeom.errors import ConfigError


class ValueStats:
    """Value states of one (window, layer) with cached float64 norms and Gram matrix."""

    def __init__(self, values: Tensor, dtype: torch.dtype = torch.float64, *,
                 queries: int | None = None) -> None:
        if values.dim() != 3:
            raise ConfigError(f"values: expected shape (G, T, d), got {tuple(values.shape)}")
        self.values = values
        self.dtype = dtype
        # analysed query rows of the whole window (all chunks): decides how the metrics
        # compute <v_u, s_N>, so that query chunking never changes a table (geometry.py)
        self.queries = int(values.shape[1]) if queries is None else int(queries)
        self._norms: Tensor | None = None
        self._sq_norms: Tensor | None = None
        self._gram: Tensor | None = None
        self._whole_gram: Tensor | None = None  # a key prefix's: its window's Gram matrix
        self._coherence: Tensor | None = None
        self._pairs: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self._values64: Tensor | None = None
        self._sink_cos: Tensor | None = None
        self._parts: list[ValueStats] = []  # set by ``stack``: caches live in the parts

    @classmethod
    def stack(cls, parts: list[ValueStats]) -> ValueStats:
        """Several windows' stats as one, kv heads concatenated; caches are reused."""
        if len(parts) == 1:
            return parts[0]
        out = cls(torch.cat([p.values for p in parts]), parts[0].dtype,
                  queries=parts[0].queries)
        out._parts = list(parts)
        return out

    def key_prefix(self, num_keys: int, *, with_gram: bool = False) -> ValueStats:
        """The same stats restricted to keys ``0 .. num_keys - 1`` (for query rows that
        see no later key), cut from this window's cached norms (and Gram matrix with
        ``with_gram``), so that every entry is the one the whole window would give."""
        if num_keys >= self.num_keys:
            return self
        out = ValueStats(self.values[:, :num_keys], self.dtype, queries=self.queries)
        out._sq_norms = self.sq_norms[:, :num_keys]
        out._norms = self.norms[:, :num_keys]
        if self._values64 is not None:
            out._values64 = self._values64[:, :num_keys]
        if with_gram:
            out._whole_gram = self.whole_gram
            out._gram = out._whole_gram[:, :num_keys, :num_keys]
        return out

    @property
    def num_kv_heads(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_keys(self) -> int:
        return int(self.values.shape[1])

    @property
    def values64(self) -> Tensor:
        """(G, T, d) the values in the stats' dtype (float64), cast once per window."""
        if self._values64 is None:
            self._values64 = self.values.to(self.dtype)
        return self._values64

    @property
    def gram(self) -> Tensor:
        """(G, T, T) inner products <v_a, v_b> per kv head."""
        if self._gram is None and self._parts:
            self._gram = self._stacked_gram()
        if self._gram is None:
            v = self.values64
            self._gram = v @ v.transpose(-1, -2)
        return self._gram

    def _stacked_gram(self) -> Tensor:
        """The parts' Gram matrices as one tensor, held once: the parts' own are views of
        it, so the next stack of the same parts (the next query chunk of the layer)
        finds it again instead of copying, and nothing is held twice. Each part's block
        is the product its own ``gram`` would compute (same shapes, same rounding)."""
        grams = [p._gram for p in self._parts]
        base = grams[0]._base if grams[0] is not None else None
        if base is not None and base.shape[0] == self.num_kv_heads and all(
                g is not None and g._base is base and g.data_ptr() == base[i].data_ptr()
                for g, i in zip(grams, self._part_starts(), strict=True)):
            return base
        if any(g is not None for g in grams):
            return torch.cat([p.gram for p in self._parts])
        v = self._parts[0].values64
        whole = torch.empty((self.num_kv_heads, self.num_keys, self.num_keys),
                            dtype=v.dtype, device=v.device)
        for p, start in zip(self._parts, self._part_starts(), strict=True):
            block = whole[start : start + p.num_kv_heads]
            torch.matmul(p.values64, p.values64.transpose(-1, -2), out=block)
            p._gram = block
        return whole

    def _part_starts(self) -> list[int]:
        starts, at = [], 0
        for p in self._parts:
            starts.append(at)
            at += p.num_kv_heads
        return starts

    @property
    def whole_gram(self) -> Tensor:
        """(G, T_window, T_window) the window's whole Gram matrix, also for a key prefix
        (whose ``gram`` is a view of its corner): contiguous rows, read by
        ``kernels.gram_sums`` at the prefix's columns."""
        return self.gram if self._whole_gram is None else self._whole_gram

    @property
    def sq_norms(self) -> Tensor:
        """(G, T) squared norms ||v_j||^2 in float64, from the values (no Gram needed)."""
        if self._sq_norms is None:
            if self._parts:
                self._sq_norms = torch.cat([p.sq_norms for p in self._parts])
            else:
                v = self.values64
                self._sq_norms = (v * v).sum(-1)
        return self._sq_norms

    def nonsink_coherence(self) -> Tensor:
        """(G,) float64 upper bound on max |cos(v_a, v_b)| over non-sink pairs a != b with
        non-zero vectors (``pairs.max_abs_cosine``), cached for the window."""
        if self._coherence is None:
            if self._parts:
                self._coherence = torch.cat([p.nonsink_coherence() for p in self._parts])
            else:
                keep = self.norms > 0
                keep[:, 0] = False
                self._coherence = max_abs_cosine(self.values, keep)
        return self._coherence

    def sampled_pairs(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Non-sink pairs a < b (all, or the fixed sample of ``pairs.pair_sample``) with
        their float64 cosines (G, P) and whether both vectors are non-zero (G, P)."""
        if self._pairs is None:
            self._pairs = sampled_pair_cosines(self.values64, self.norms)
        return self._pairs

    def sink_cosines(self) -> Tensor:
        """(G, T-1) float64 cos(v_0, v_b) for b >= 1 (0 where either vector is zero),
        cached for the window."""
        if self._sink_cos is None:
            v = self.values64
            dots = (v[:, 1:] * v[:, :1]).sum(-1)
            denom = self.norms[:, :1] * self.norms[:, 1:]
            ok = denom > 0
            self._sink_cos = torch.where(ok, dots / torch.where(ok, denom, 1.0),
                                         0.0).clamp(-1.0, 1.0)
        return self._sink_cos

    @property
    def norms(self) -> Tensor:
        """(G, T) value norms ||v_j||, the square roots of ``sq_norms``."""
        if self._norms is None:
            self._norms = self.sq_norms.clamp_min(0).sqrt()
        return self._norms


@dataclass
class AttentionBatch:
    """One chunk of analysed query rows of one (window, layer), plus its value stats."""

    window: int
    layer: int
    alpha: Tensor
    visible: Tensor
    query_positions: Tensor
    stats: ValueStats
    tokens: Tensor | None = None
    _kv_of_head: Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.alpha.dim() != 3:
            raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(self.alpha.shape)}")
        h, q, t = self.alpha.shape
        g = self.stats.num_kv_heads
        if h % g != 0:
            raise ConfigError(f"expected query heads divisible by kv heads, got H={h}, G={g}")
        if self.stats.num_keys != t:
            raise ConfigError(f"alpha has {t} keys but values have {self.stats.num_keys}")
        if self.visible.dim() != 3 or self.visible.shape[1:] != (q, t):
            raise ConfigError(
                f"visible: expected shape (H or 1, {q}, {t}), got {tuple(self.visible.shape)}"
            )
        if self.query_positions.shape != (q,):
            raise ConfigError(
                f"query_positions: expected shape ({q},), got {tuple(self.query_positions.shape)}"
            )
        if self.tokens is not None and tuple(self.tokens.shape) != (t,):
            raise ConfigError(f"tokens: expected shape ({t},), got {tuple(self.tokens.shape)}")

    @property
    def num_heads(self) -> int:
        return int(self.alpha.shape[0])

    @property
    def kv_of_head(self) -> Tensor:
        """(H,) index of the kv head serving each query head (h // (H / G))."""
        if self._kv_of_head is None:
            group = self.num_heads // self.stats.num_kv_heads
            self._kv_of_head = torch.arange(self.num_heads, device=self.alpha.device) // group
        return self._kv_of_head

    def universe(self, exclude_sink: bool = False) -> Tensor:
        """(H, Q, T) bool: the keys of each row's universe (method §4)."""
        u = self.visible.expand(self.num_heads, -1, -1).clone()
        if exclude_sink:
            u[..., 0] = False
        return u

"""What every analysis of one (window, layer) sees: attention rows and value statistics.

method §11: every quantity of method §4-§8 follows from the attention rows of the analysed
queries, the value norms and the value Gram matrix of each kv head. ``ValueStats``
computes the norms and the Gram matrix once per (window, layer), in float64, and is
shared by every query chunk and every accumulator of that layer; ``AttentionBatch``
pairs it with one chunk of attention rows.

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
        self._cosines: Tensor | None = None
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

    @property
    def num_kv_heads(self) -> int:
        return int(self.values.shape[0])

    @property
    def num_keys(self) -> int:
        return int(self.values.shape[1])

    @property
    def values64(self) -> Tensor:
        return self.values.to(self.dtype)

    @property
    def gram(self) -> Tensor:
        """(G, T, T) inner products <v_a, v_b> per kv head."""
        if self._gram is None and self._parts:
            self._gram = torch.cat([p.gram for p in self._parts])
        if self._gram is None:
            v = self.values64
            self._gram = v @ v.transpose(-1, -2)
        return self._gram

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

    @property
    def cosines(self) -> Tensor:
        """(G, T, T) cos(v_a, v_b) from the Gram matrix (0 for zero vectors), cached: the
        bounds, their fit and the diagnostics all read it. Do not modify in place."""
        if self._cosines is None and self._parts:
            # computed (and cached) per window, so the per-window accumulators reuse them
            self._cosines = torch.cat([p.cosines for p in self._parts])
        if self._cosines is None:
            norms = self.norms
            inv = torch.where(norms > 0, 1.0 / torch.where(norms > 0, norms, 1.0), 0.0)
            self._cosines = (self.gram * inv[:, :, None] * inv[:, None, :]).clamp_(-1.0, 1.0)
        return self._cosines

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

"""Window-wide statistics over pairs of value vectors, without a T x T float64 matrix.

The bounds (method §8) and their diagnostics read two kinds of pair statistic of the
non-sink value vectors of a window (positions 1..T-1, per kv head):

- the largest ``|cos(v_a, v_b)|`` over all pairs a != b (the window's coherence mu),
  which must not be underestimated: it is found exactly in one blocked float32 pass
  over the pairs a < b (about T^2 d / 2 multiply-adds per kv head, half the cost of
  one head's attention scores, in blocks of rows so that memory stays O(block x T));
  where it must not be low (the bounds' mu) it is raised by the float32 rounding
  bound ``4 d eps_32`` (a dot product of two unit vectors in d dimensions is off by
  at most about ``d eps_32``);
- distributions of the cosines (the |cos| histogram behind the fitted mu, the mean
  cosine by distance behind the decay fit, the share of negative cosines), which are
  estimates anyway: they are computed in float64 on at most ``PAIR_SAMPLE`` pairs:
  all pairs when there are no more (T <= 363), else every pair among a fixed random
  subset of 362 positions (one small Gram matrix; positions uniform, so distances are
  sampled as in a full census). The subset depends only on T, so every window, layer
  and head of a run uses the same pairs, and a resumed or data-parallel run draws
  exactly what a single run draws.

Pairs with a zero vector have cosine 0 and are flagged, so callers can leave them out.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

PAIR_SAMPLE = 65_536
_BLOCK_BYTES = 64 * 2**20
_BLOCK_ROWS = 256
_SAMPLE_SEED = 0x5EED_CA75


def num_pairs(t: int) -> int:
    """Unordered pairs a < b among the non-sink positions 1..T-1."""
    m = max(t - 1, 0)
    return m * (m - 1) // 2


def subset_size(limit: int = PAIR_SAMPLE) -> int:
    """The largest m with m (m - 1) / 2 <= ``limit`` (362 for 65,536)."""
    m = int(((8 * limit + 1) ** 0.5 + 1) / 2)
    while m * (m - 1) // 2 > limit:
        m -= 1
    return m


@functools.lru_cache(maxsize=16)
def _sample_cpu32(t: int, limit: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_sample_cpu``'s tensors, cached per T in int32 (half the bytes: a cache entry
    stays for the process, 0.75 MB for the full sample)."""
    m = subset_size(limit)
    if t - 1 <= m:
        positions = torch.arange(1, max(t, 1))
    else:
        gen = torch.Generator().manual_seed(_SAMPLE_SEED ^ t)
        positions = torch.sort(torch.randperm(t - 1, generator=gen)[:m] + 1).values
    ia, ib = torch.triu_indices(positions.numel(), positions.numel(), offset=1)
    out = (positions, positions[ia], positions[ib], ia * positions.numel() + ib)
    return tuple(x.to(torch.int32) for x in out)


def _sample_cpu(t: int, limit: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The subset's positions (m,), the pairs' positions a < b (P,) each, and each
    pair's entry i * m + j in the subset's flattened m x m matrices (P,): fresh int64
    tensors (T < 2^31, so int32 holds them exactly)."""
    return tuple(x.to(torch.int64) for x in _sample_cpu32(t, limit))


def pair_sample(t: int, limit: int = PAIR_SAMPLE, device=None) -> tuple[Tensor, Tensor]:
    """Two (P,) int64 tensors a < b of non-sink positions: all pairs, or every pair of a
    fixed random subset of positions (uniform over positions, so over distances too, and
    one small matrix product to compute; the subset depends only on T).

    >>> [x.tolist() for x in pair_sample(4)]
    [[1, 1, 2], [2, 3, 3]]
    """
    _, a, b, _ = _sample_cpu(int(t), int(limit))
    return a.to(device), b.to(device)  # fresh, never cached


def sampled_pair_cosines(values: Tensor, norms: Tensor, limit: int = PAIR_SAMPLE
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``pair_sample`` of the window's T with float64 cosines (G, P) and whether both
    vectors are non-zero (G, P); ``values`` (G, T, d) float64, ``norms`` (G, T)."""
    dev = values.device
    # the cached int32 positions and entries index directly (read, never handed out);
    # the pairs' positions are the caller's own int64 copies
    positions, a, b, entry = (x.to(dev) for x in _sample_cpu32(int(values.shape[1]),
                                                             int(limit)))
    a, b = a.to(torch.int64), b.to(torch.int64)
    g = values.shape[0]
    sub = values.index_select(1, positions)  # (G, m, d)
    n = norms.index_select(1, positions)
    # the pairs read off the flattened m x m products (one index, not two: several
    # times faster than indexing rows and columns at once), by ``gather`` with the
    # index expanded over the kv heads (on CPU about 5x faster than ``index_select``
    # along the last dimension, which copies element by element)
    entry = entry.to(torch.int64)[None].expand(g, -1)
    dots = (sub @ sub.transpose(-1, -2)).reshape(g, -1).gather(1, entry)
    denom = (n[:, :, None] * n[:, None, :]).reshape(g, -1).gather(1, entry)
    ok = denom > 0
    cos = torch.where(ok, dots / torch.where(ok, denom, 1.0), 0.0).clamp(-1.0, 1.0)
    return a, b, cos, ok


def coherence_slack(dim: int) -> float:
    """The float32 rounding bound added to ``max_abs_cosine`` where it must not be low."""
    return 4.0 * dim * float(torch.finfo(torch.float32).eps)


def max_abs_cosine(values: Tensor, keep: Tensor) -> Tensor:
    """(G,) float64 ``max |cos(v_a, v_b)|`` over a != b, both kept, in float32.

    ``values`` (G, T, d), ``keep`` (G, T) bool (the positions that take part; a zero
    vector should not be kept). Exact up to float32 rounding (within
    ``coherence_slack(d)`` of the float64 maximum); 0 when fewer than two are kept.

    >>> v = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]])
    >>> round(float(max_abs_cosine(v, torch.ones(1, 3, dtype=torch.bool))[0]), 4)
    0.7071
    """
    g, t, d = values.shape
    v = values.to(torch.float32)
    n = v.norm(dim=-1, keepdim=True)
    unit = torch.where(keep[..., None] & (n > 0), v / n.clamp_min(1e-30), 0.0)
    # pairs a < b only (the matrix is symmetric): each block of rows against itself and
    # the later keys, about half the products of the full matrix; small blocks keep the
    # temporaries in cache (at T = 4096 three times faster than 1024-row blocks)
    rows = max(1, min(_BLOCK_ROWS, _BLOCK_BYTES // max(1, 4 * g * t)))
    best = torch.zeros(g, dtype=torch.float32, device=values.device)
    for s in range(0, t, rows):
        e = min(s + rows, t)
        block = unit[:, s:e] @ unit[:, s:].transpose(-1, -2)  # (G, B, T - s)
        block[:, :, : e - s] = block[:, :, : e - s].triu(1)  # drop a >= b
        best = torch.maximum(best, torch.maximum(block.amax(dim=(-1, -2)),
                                                 -block.amin(dim=(-1, -2))))
    enough = keep.sum(-1) >= 2
    return torch.where(enough, best.to(torch.float64).clamp_max(1.0), 0.0)

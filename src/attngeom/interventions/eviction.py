"""The causal simulation of a greedy KV-cache policy (h2o, tova): which keys each row keeps.

A greedy policy holds at most n keys. At query row q (the simulation needs Q = T,
every earlier row) the row's own key (position q) and the ``recent`` latest visible
keys enter the cache, the keys the row cannot see leave it, and while it holds more
than n keys the unprotected key (not among the ``recent`` latest) of smallest score
leaves, ties to the larger position (the smaller one stays). The scores are the
policy's (``score``, read once per row before any eviction); ``after`` sees the kept
keys (h2o accumulates attention there). A row with at most n
visible keys keeps exactly those.

The batch and the heads are vectorised; the rows are looped over, as eviction needs.
The key columns run in reverse inside the loops (column k holds position T - 1 - k), so
that ``argmin``'s first minimum is the largest position, the tie rule, with no flip a
row; the callbacks read their rows in that order (``reversed_rows``) and the kept mask
is flipped back once. Two loops compute the same thing:

- ``_evict_growing``: masks where each row sees what the previous one saw plus at most
  its own key (causal, with left padding), as every causal LM's mask is. Nothing ever
  leaves but the evicted key, the cache is full from the first row that sees n + 1
  keys on, and exactly one key leaves per row after it: no counting, no visibility
  pass, about ten tensor operations a row.
- ``_evict_any``: any mask (sliding windows, keys seen, hidden, seen again), counting
  the cache at every row.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attngeom.errors import ConfigError

Score = Callable[[int, int, torch.Tensor], torch.Tensor]
After = Callable[[int, int, torch.Tensor], None]


def latest(visible: torch.Tensor, m: int) -> torch.Tensor:
    """Bool (…, T): the m latest visible keys of each row (all of them where fewer).

    >>> latest(torch.tensor([True, False, True, True, True]), 2).tolist()
    [False, False, False, True, True]
    """
    running = visible.cumsum(-1, dtype=torch.int32)
    return visible & (running[..., -1:] - running < m)


def reversed_rows(x: torch.Tensor, dtype: torch.dtype, block: int = 128,
                  ) -> Callable[[int], torch.Tensor]:
    """q -> ``x[:, :, q]`` with its last axis reversed, in ``dtype``: the rows in the
    loops' column order, converted ``block`` rows at a time (one pass, not one a row,
    and not a copy of the whole (B, H, Q, T) tensor at once)."""
    held: dict[str, object] = {"start": -1}

    def row(q: int) -> torch.Tensor:
        start = q - q % block
        if held["start"] != start:
            held["start"] = start
            held["rows"] = x[:, :, start:start + block].flip(-1).to(dtype)
        return held["rows"][:, :, q - start]

    return row


def evict_greedily(visible: torch.Tensor, n: int, state_heads: int, recent: int,
                   score: Score, after: After | None = None) -> torch.Tensor:
    """(B, state_heads, Q, T) bool: the keys each row keeps (see the module docstring).

    ``visible`` (B, 1 or state_heads, Q, T) with Q = T; ``recent``: how many of the
    latest visible keys never leave (h2o's recent window; 0 for tova). The callbacks
    see the row's columns ``start:`` (reversed positions ``T - 1 - start`` down to 0):
    ``score(q, start, cache)`` returns (B, state_heads, T - start) scores, ``cache``
    the row's candidates there (bool, reversed); ``after(q, start, cache)`` sees the
    kept keys.
    """
    b, _, q_len, t = visible.shape
    if q_len != t:
        raise ConfigError(f"expected one query row per key for a greedy policy (its cache "
                          f"is built from every earlier row), got {q_len} rows for {t} keys")
    run = _evict_growing if _grows(visible) else _evict_any
    return run(visible, n, state_heads, recent, score, after).flip(-1)


def _grows(visible: torch.Tensor) -> bool:
    """True where each row sees what the row before it saw and at most its own key:
    the first row sees at most key 0, no key is lost, and row q gains only key q."""
    if bool(visible[:, :, 0, 1:].any()):
        return False
    earlier, later = visible[:, :, :-1], visible[:, :, 1:]
    if bool(torch.gt(earlier, later).any()):  # a key seen, then not
        return False
    gained = torch.gt(later, earlier)
    return int(gained.sum()) == int(gained.diagonal(1, -2, -1).sum())


def _evict_growing(visible: torch.Tensor, n: int, state_heads: int, recent: int,
                   score: Score, after: After | None) -> torch.Tensor:
    """The loop for masks that grow by the row's own key at most (see the module);
    columns reversed."""
    b, _, q_len, t = visible.shape
    arrives = visible.diagonal(dim1=-2, dim2=-1)  # (B, 1|H, Q): the row's own key
    # a cache of n keys takes one more: it holds n + 1, one leaves
    over = (visible.sum(-1) > n) & arrives
    flat = lambda x: x.flatten(0, 1)  # noqa: E731
    all_arrive, any_arrive = flat(arrives).all(0).tolist(), flat(arrives).any(0).tolist()
    all_over, any_over = flat(over).all(0).tolist(), flat(over).any(0).tolist()
    # the keys that may leave at row q: those before the row's ``recent`` latest visible
    # keys, positions [0, lo) (the row sees the keys that arrived by q)
    arrived = arrives.cumsum(-1, dtype=torch.int32)  # (B, 1|H, Q = T)
    lo = torch.searchsorted(arrived.contiguous(), (arrived - recent).contiguous(), right=True)
    lo = torch.minimum(lo, torch.arange(1, t + 1, device=visible.device))  # within the row
    lo_low, lo_high = flat(lo).amin(0).tolist(), flat(lo).amax(0).tolist()
    position = torch.arange(t - 1, -1, -1, device=visible.device)  # of each column
    cache = torch.zeros((b, state_heads, t), dtype=torch.bool, device=visible.device)
    keep = torch.zeros((b, state_heads, q_len, t), dtype=torch.bool, device=visible.device)
    for q in range(q_len):
        start = t - 1 - q  # the row's columns: positions q down to 0
        c = cache[..., start:]
        if all_arrive[q]:
            c[..., 0] = True
        elif any_arrive[q]:
            c[..., 0] = arrives[:, :, q]
        if any_over[q]:
            m = lo_high[q]  # candidates: positions below m, the last m columns
            tail = c[..., q + 1 - m:]
            candidates = tail
            if lo_low[q] != m:  # rows whose recent keys start at different positions
                candidates = tail & (position[t - m:] < lo[:, :, q, None])
            s = torch.where(candidates, score(q, start, c)[..., q + 1 - m:], math.inf)
            j = s.argmin(-1, keepdim=True)  # the first minimum: the largest position
            if all_over[q]:
                tail.scatter_(-1, j, False)
            else:
                tail.scatter_(-1, j, tail.gather(-1, j) & ~over[:, :, q, None])
        keep[:, :, q, start:] = c
        if after is not None:
            after(q, start, c)
    return keep


def _evict_any(visible: torch.Tensor, n: int, state_heads: int, recent: int,
               score: Score, after: After | None) -> torch.Tensor:
    """The loop for any mask, columns reversed: columns past a row's last visible key
    (over the batch) are never read, and the cache is counted at every row."""
    b, _, q_len, t = visible.shape
    seen = visible.flip(-1)
    guard = seen & (seen.cumsum(-1, dtype=torch.int32) <= recent)  # the recent keys
    cache = torch.zeros((b, state_heads, t), dtype=torch.bool, device=visible.device)
    keep = torch.zeros((b, state_heads, q_len, t), dtype=torch.bool, device=visible.device)
    positions = torch.arange(t, device=visible.device)
    reaches = (torch.where(visible, positions, -1).amax(-1).amax(1).amax(0) + 1).tolist()
    counts = visible.sum(-1)  # (B, 1|H, Q)
    few = counts <= n
    all_few, any_few = few.flatten(0, 1).all(0).tolist(), few.flatten(0, 1).any(0).tolist()
    low = t  # the cache holds no key in a column below this one
    for q in range(q_len):
        start = t - reaches[q]  # the row's columns: its reach - 1 down to position 0
        if start > low:  # keys past the row's reach are invisible to it: they leave
            cache[..., low:start] = False
        low = start
        if start == t:  # no key visible anywhere in this row
            continue
        c = cache[..., start:]
        v = seen[:, :, q, start:]
        if all_few[q]:
            c.copy_(v.expand_as(c))
        else:
            g = guard[:, :, q, start:]
            c |= g
            if t - 1 - q >= start:  # the row's own key
                c[..., t - 1 - q - start] = True
            c &= v
            count = c.sum(-1)
            over = count > n
            if bool(over.any()):
                s = torch.where(c & ~g, score(q, start, c), math.inf)
                while True:
                    j = s.argmin(-1, keepdim=True)  # the first minimum: the largest position
                    c.scatter_(-1, j, c.gather(-1, j) & ~over[..., None])
                    s.scatter_(-1, j, math.inf)
                    count -= over.to(count.dtype)
                    over = count > n
                    if not bool(over.any()):
                        break
            if any_few[q]:
                c.copy_(torch.where(few[:, :, q, None], v, c))
        keep[:, :, q, start:] = c
        if after is not None:
            after(q, start, c)
    return keep

"""Counter-based randomness for the random-selection control (method §4).

The control must be reproducible bit for bit from the seed and must not depend on
the order in which windows, layers, heads or queries are processed (so that shards
of a data-parallel run merge into the tables of a single run). A stateful
``torch.Generator`` per (seed, window, layer, head, t, k) would need a Python loop
over heads and queries; instead every key position j gets a 63-bit pseudo-random
sort key that is a pure function of (seed, window, layer, head, t, k, j). Sorting
the keys of a query's universe gives a uniformly random permutation of it, the
"permutation drawn from a generator seeded by (seed, window, layer, head, t, k)".

The hash is Chris Wellons' ``lowbias32`` integer finaliser, evaluated in int64 with
every product kept below 2**63 (no reliance on signed overflow), chained over the
coordinates; two independent chains give the high and low halves of the key. The
chain up to the repeat is computed once per row; the last link, over the keys, is the
hot part and runs in ``core/kernels.py`` (compiled where that is on; integer
operations only, so compiled and plain give the same keys).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from attngeom.core.kernels import _M32, combine, compiled, hashed_positions, key_chain


def _fold(value: int) -> int:
    """Fold an arbitrary Python int (negative or wider than 32 bits) into 32 bits."""
    value = int(value) & ((1 << 64) - 1)
    return (value ^ (value >> 32)) & _M32


def _fold_coord(values: Tensor, device) -> Tensor:
    """``_fold`` of every entry of a tensor of non-negative indices."""
    v = values.to(device=device, dtype=torch.int64)
    return (v ^ (v >> 32)) & _M32


@functools.lru_cache(maxsize=8)
def _hashed_positions(num_keys: int, device: str) -> Tensor:
    return hashed_positions(torch.arange(num_keys, dtype=torch.int64, device=device))


def permutation_keys(
    seed: int,
    window: int | Tensor,
    layer: int,
    heads: Tensor,
    positions: Tensor,
    repeats: int,
    num_keys: int,
) -> Tensor:
    """Sort keys of the random control, shape (repeats, len(heads), len(positions), num_keys).

    ``heads`` are query-head indices and ``positions`` the query positions t; ``window``
    is one window index, or one per entry of ``heads`` when rows of several windows are
    stacked along the head dimension (the keys are the same either way). Sorting
    a row's keys ascending (over the keys in its universe) gives repeat k's random
    order; its first N entries are the random set of size N, so sets are nested in N.

    >>> k = permutation_keys(0, 0, 0, torch.tensor([0]), torch.tensor([4]), 1, 5)
    >>> sorted(torch.argsort(k[0, 0, 0]).tolist())
    [0, 1, 2, 3, 4]
    """
    device = heads.device
    heads = heads.to(torch.int64).reshape(1, -1, 1, 1)
    positions = positions.to(device=device, dtype=torch.int64).reshape(1, 1, -1, 1)
    ks = torch.arange(repeats, dtype=torch.int64, device=device).reshape(-1, 1, 1, 1)
    js = _hashed_positions(num_keys, str(device))
    rows = []
    for salt in (0x243F6A88, 0x85A308D3):  # one state per row, then the keys (the hot part)
        state = torch.tensor(_fold(seed) ^ salt, dtype=torch.int64, device=device)
        state = combine(state, _fold_coord(window, device).reshape(1, -1, 1, 1)
                        if isinstance(window, Tensor) else
                        torch.tensor(_fold(window), dtype=torch.int64, device=device))
        state = combine(state, torch.tensor(_fold(layer), dtype=torch.int64, device=device))
        state = combine(state, heads & _M32)
        state = combine(state, positions & _M32)
        state = combine(state, ks)
        rows.append(state.expand(repeats, heads.shape[1], positions.shape[2], 1).contiguous())
    return compiled(key_chain)(rows[0], rows[1], js)

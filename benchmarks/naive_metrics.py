"""The naive baseline of the benchmark: loops over heads, queries and N, materialising y.

This is how a one-off script computes SPEC 2: for every (head, query, N) build the
contributions y = alpha v of the visible keys, sum the selected ones, take every
distance and count. It computes F_N (attention rule, Euclidean) in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor


def naive_topn(alpha: Tensor, values: Tensor, grid, visible: Tensor) -> Tensor:
    """(H, Q, NN) F_N by loops; NaN where N is out of range."""
    h_count, q_count, _t = alpha.shape
    group = h_count // values.shape[0]
    out = torch.full((h_count, q_count, len(grid)), float("nan"), dtype=torch.float64)
    vis = visible.expand(h_count, -1, -1)
    for h in range(h_count):
        v = values[h // group].double()
        for q in range(q_count):
            keys = torch.nonzero(vis[h, q]).flatten()
            a = alpha[h, q, keys].double()
            y = a[:, None] * v[keys]
            order = torch.sort(a, descending=True, stable=True).indices
            for j, n in enumerate(grid):
                if not 1 <= n < keys.numel():
                    continue
                sel = torch.zeros(keys.numel(), dtype=torch.bool)
                sel[order[:n]] = True
                s = y[sel].sum(0)
                d2 = ((y - s) ** 2).sum(-1)
                rho_max = d2[sel].max()
                rho_min = d2[~sel].min()
                p = n / (n + int((d2[~sel] <= rho_max).sum()))
                r = int((d2[sel] < rho_min).sum()) / n
                out[h, q, j] = 0.0 if p + r == 0 else 2 * p * r / (p + r)
    return out

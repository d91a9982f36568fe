"""The top-N geometry of a given set of keys: what a selection keeps (method §4, issue 39).

Every metric of method §4 is a function of the selected set I alone (its aggregate
s = sum_{i in I} alpha_i v_i and every key's distance to it), never of an order inside
it; the geometry reads I as the first N keys of a rule's order only because the rules
are orders. A sparse-attention policy's kept set (``interventions.policies``) is no rule's
prefix, so this measures any set, row by row:

- the metrics of I = the row's kept keys, with N = |I| (a policy may keep fewer keys than
  its budget: Quest counts pages whole), in the universe of the row's visible keys; a row
  is valid where 1 <= |I| < |U| (method §4's validity), NaN otherwise;
- its random control: the first |I| keys of the analysis' random order of the row
  (``core/random_control.py``: the same draws as ``analyze``'s ``random`` rule for the
  same seed, window, layer, head and position; ``repeats`` of them), so a policy's set is
  compared with a random set of its own size, as the attention rule's top-N is;
- ``overlap``: |I ∩ O| / n for the oracle's set O at budget n.

The counts come from the geometry's own kernels (``exact_counts.chunk_metrics``, the
direct path), one call per distinct set size: rows of equal size share it.

Shapes: alpha (H, Q, T), values (G, T, d) with H % G == 0, kept (H, Q, T) bool, visible
(H or 1, Q, T) bool; results (H, Q), the random control's (K, H, Q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attngeom.core.batch import ValueStats
from attngeom.core.exact_counts import chunk_metrics
from attngeom.core.selection import causal_visibility, random_first_keys
from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, METRICS


@dataclass
class KeptMetrics:
    """The metrics of each row's kept set and of its random control.

    ``size`` (H, Q) int64 |I|; ``valid`` (H, Q) bool, 1 <= |I| < |U| and every key of the
    universe finite; ``metrics`` name -> (H, Q) float64 for every registered metric (NaN
    where not valid); ``random`` name -> (K, H, Q) float64, the random sets of size |I|.
    """

    size: Tensor
    valid: Tensor
    metrics: dict[str, Tensor]
    random: dict[str, Tensor]


def overlap(kept: Tensor, oracle: Tensor, n: int) -> Tensor:
    """|kept ∩ oracle| / n per row: (…, T) bool each -> (…) float64.

    >>> overlap(torch.tensor([[True, True, False, True]]),
    ...         torch.tensor([[True, False, True, True]]), 3).tolist()
    [0.6666666666666666]
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n: expected an integer >= 1, got {n!r}")
    return (kept & oracle).sum(-1).to(torch.float64) / n


def kept_metrics(alpha: Tensor, values: Tensor, kept: Tensor, *, visible: Tensor | None = None,
                 query_positions: Tensor | None = None, repeats: int = 16, seed: int = 0,
                 window: int = 0, layer: int = 0, distance: str = "euclidean",
                 ) -> KeptMetrics:
    """Every registered metric of each row's kept set, and of its random control.

    ``alpha`` (H, Q, T) probabilities, ``values`` (G, T, d), ``kept`` (H, Q, T) bool (a
    subset of the visible keys), ``visible`` (H or 1, Q, T) bool (default: causal from
    ``query_positions``, which default to the last Q positions). The random control's
    orders are drawn as the ``random`` rule draws them for (``seed``, ``window``,
    ``layer``, head, position); ``repeats`` K of them.

    >>> a = torch.tensor([[[0.25, 0.5, 0.25]]])  # one head, query t = 2, T = 3
    >>> v = torch.tensor([[[1.0], [1.0], [-1.0]]])
    >>> r = kept_metrics(a, v, torch.tensor([[[True, True, False]]]), repeats=2)
    >>> r.size.tolist(), r.metrics["precision"].tolist(), r.random["f_score"].shape
    ([[2]], [[1.0]], torch.Size([2, 1, 1]))
    """
    if alpha.dim() != 3 or kept.shape != alpha.shape or kept.dtype != torch.bool:
        raise ConfigError(f"kept: expected a bool mask of alpha's shape (H, Q, T) = "
                          f"{tuple(alpha.shape)}, got {kept.dtype} {tuple(kept.shape)}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats: expected an integer >= 1, got {repeats!r}")
    if distance not in DISTANCES:
        raise ConfigError(f"distance: expected one of {', '.join(DISTANCES)}, got {distance!r}")
    h, q, t = alpha.shape
    device = alpha.device
    stats = ValueStats(values.to(device=device, dtype=torch.float32), queries=q)
    if h % stats.num_kv_heads or stats.num_keys != t:
        raise ConfigError(f"values (G={stats.num_kv_heads}, T={stats.num_keys}) do not fit "
                          f"alpha (H={h}, T={t}): expected H divisible by G and equal T")
    positions = (torch.arange(t - q, t, device=device) if query_positions is None
                 else query_positions.to(device=device, dtype=torch.int64))
    light = (causal_visibility(positions, t) if visible is None
             else visible.to(device=device, dtype=torch.bool))
    universe = light.expand(h, q, t).contiguous()
    if bool((kept & ~universe).any()):
        raise ConfigError("kept: expected only visible keys in the kept sets, got a key "
                          "outside a row's universe")
    group = h // stats.num_kv_heads
    norms = stats.norms[torch.arange(h, device=device) // group]  # (H, T)
    finite = (torch.isfinite(alpha) | ~universe).all(-1) & (
        torch.isfinite(norms)[:, None, :] | ~universe).all(-1)
    alpha64 = torch.where(torch.isfinite(alpha), alpha.to(torch.float64), 0.0)
    if not bool(torch.isfinite(stats.values).all()):
        stats = ValueStats(torch.nan_to_num(stats.values, nan=0.0, posinf=0.0, neginf=0.0),
                           queries=q)
    size = kept.sum(-1)
    valid = (size >= 1) & (size < universe.sum(-1)) & finite
    names = tuple(METRICS)
    metrics = {m: torch.full((h, q), float("nan"), dtype=torch.float64, device=device)
               for m in names}
    random = {m: torch.full((repeats, h, q), float("nan"), dtype=torch.float64, device=device)
              for m in names}
    sizes = sorted({int(s) for s in size[valid].tolist()})
    if not sizes:
        return KeptMetrics(size, valid, metrics, random)
    # each row's kept keys first, in position order (the set is all the metrics read)
    order = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)
    # the random orders' first keys are nested in their number: one draw serves every size
    drawn = random_first_keys({"u": light}, max(sizes), seed=seed, window=window,
                              layer=layer, heads=torch.arange(h, device=device),
                              positions=positions, repeats=repeats)["u"]
    for m in sizes:
        rows = valid & (size == m)
        own, _ = chunk_metrics(alpha64, order[None, ..., :m].contiguous(), universe, stats,
                               group, (m,), m, distance, False)
        ctrl, _ = chunk_metrics(alpha64, drawn[..., :m].contiguous(), universe, stats, group,
                                (m,), m, distance, False)
        for name in names:
            metrics[name] = torch.where(rows, own[name][0, ..., 0], metrics[name])
            random[name] = torch.where(rows, ctrl[name][..., 0], random[name])
    return KeptMetrics(size, valid, metrics, random)

"""Intervention sweeps: pruning by ranker, single-head scan, top-N restriction (method §9).

Each sweep is a list of *settings* (a set of removed heads, or a restriction), a
per-batch kernel that measures the summed next-token NLL of one batch of windows
under every setting, and a table builder; the run's pipeline streams the window
batches through the kernel (with progress, shards and resume), and the one-call
functions here do the same in a loop for notebooks. The tables carry the columns of
``docs/internals.md`` less ``model`` and ``corpus``, which the pipeline adds:

- ``pruning`` (``ranker, seed, order, keep_fraction, heads_kept, nll, perplexity,
  delta_nll_rel``) and ``rankings`` (``ranker, seed, order, rank, layer, head, score``);
- ``head_scan`` (``layer, head, nll, delta_nll_rel, critical, threshold``);
- ``restrict`` (``scope, layer, head, n, renormalize, nll, perplexity, delta_nll_rel``)
  and ``restrict_nstar`` (``scope, layer, head, renormalize, tau, n_star,
  n_star_status``).

``delta_nll_rel`` is always ``(nll - base) / base`` against the unmodified model on
the same evaluation windows. Argument values are checked by the configurations
(``attngeom.config``); these functions check shapes only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor, nn

from attngeom.capture import model_layout
from attngeom.errors import ConfigError
from attngeom.interventions.gates import remove_heads
from attngeom.interventions.perplexity import (
    NLLResult,
    batch_nll_sum,
    check_windows,
    head_removal_nll,
    relative_delta,
)
from attngeom.interventions.rankers import HeadRanking

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "NSTAR_COLUMNS",
    "PRUNING_COLUMNS",
    "RANKINGS_COLUMNS",
    "RESTRICT_COLUMNS",
    "SCAN_COLUMNS",
    "RemovedHeads",
    "Restriction",
    "heads_to_keep",
    "n_star",
    "nll_sums",
    "prune_settings",
    "prune_sweep",
    "pruning_tables",
    "restrict_settings",
    "restrict_sweep",
    "removed_heads",
    "restrict_tables",
    "scan_heads",
    "scan_table",
]

PRUNING_COLUMNS = (
    "ranker", "seed", "order", "keep_fraction", "heads_kept", "nll", "perplexity", "delta_nll_rel",
)  # fmt: skip
RANKINGS_COLUMNS = ("ranker", "seed", "order", "rank", "layer", "head", "score")
SCAN_COLUMNS = ("layer", "head", "nll", "delta_nll_rel", "critical", "threshold")
RESTRICT_COLUMNS = (
    "scope", "layer", "head", "n", "renormalize", "nll", "perplexity", "delta_nll_rel",
)  # fmt: skip
NSTAR_COLUMNS = ("scope", "layer", "head", "renormalize", "tau", "n_star", "n_star_status")
WITHIN_GRID, ABOVE_GRID = "within_grid", "above_grid"


def heads_to_keep(keep_fraction: float, total_heads: int) -> int:
    """Global budget of method §9: keep ``round(keep_fraction * total_heads)`` heads."""
    return int(round(keep_fraction * total_heads))


def n_star(ns: Sequence[int], deltas: Sequence[float], tau: float) -> float:
    """Smallest N of the grid with relative delta-NLL <= tau; NaN if none (method §9 N*_tau).

    NaN here means "above the largest N tried" (``n_star_status`` says so in the table).
    """
    ok = [n for n, d in zip(ns, deltas, strict=True) if d <= tau]
    return float(min(ok)) if ok else math.nan


def _batches(ids: Tensor, batch_size: int):
    for start in range(0, ids.shape[0], batch_size):
        yield ids[start : start + batch_size]


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Restriction:
    """One top-N restriction setting: scope target, N and renormalisation."""

    scope: str
    layer: int
    head: int
    n: int
    renormalize: bool

    def context(self, model: nn.Module):
        from attngeom.interventions.restriction import restrict_topn

        kwargs: dict = {}
        if self.head >= 0:
            kwargs["heads"] = [(self.layer, self.head)]
        elif self.layer >= 0:
            kwargs["layers"] = [self.layer]
        return restrict_topn(model, self.n, renormalize=self.renormalize, **kwargs)


@dataclass(frozen=True)
class RemovedHeads:
    """A pruning or scan setting: the heads removed (``frozenset`` of (layer, head))."""

    heads: frozenset

    def context(self, model: nn.Module):
        return remove_heads(model, sorted(self.heads))


def removed_heads(heads) -> RemovedHeads:
    return RemovedHeads(frozenset(tuple(h) for h in heads))


def restrict_settings(model: nn.Module, n_grid: Sequence[int], *, scopes=("model",),
                      renormalize=(True, False), layers: Iterable[int] | None = None,
                      heads: Iterable | None = None) -> list[Restriction]:
    """Every restriction of the sweep, in table order: scope target, then flag, then N.

    Scopes: ``model`` restricts every head of every layer at once (layer = head = -1);
    ``layer`` all heads of one layer (head = -1), for each of ``layers``; ``head`` one
    head, for each of ``heads`` given as (layer, head) pairs (default: every head of
    ``layers``).
    """
    layout = model_layout(model)
    layer_list = list(range(layout.num_layers)) if layers is None else list(layers)
    for layer in layer_list:
        if not 0 <= layer < layout.num_layers:
            raise ConfigError(f"layers: expected layers in [0, {layout.num_layers}) for "
                              f"{layout.model_class}, got {layer}")
    if heads is None:
        head_list = [(l, h) for l in layer_list for h in range(layout.num_heads)]
    else:
        head_list = [tuple(x) for x in heads]
        bad = [x for x in head_list if not (0 <= x[0] < layout.num_layers
                                            and 0 <= x[1] < layout.num_heads)]
        if bad:
            raise ConfigError(f"heads: expected layer in [0, {layout.num_layers}) and head in "
                              f"[0, {layout.num_heads}) for {layout.model_class}, got {bad[0]}")
    targets: list[tuple[str, int, int]] = []
    for scope in dict.fromkeys([scopes] if isinstance(scopes, str) else scopes):
        if scope == "model":
            targets.append(("model", -1, -1))
        elif scope == "layer":
            targets.extend(("layer", l, -1) for l in layer_list)
        else:
            targets.extend(("head", l, h) for l, h in head_list)
    flags = [renormalize] if isinstance(renormalize, bool) else list(renormalize)
    ns = sorted({int(n) for n in n_grid})
    return [Restriction(scope, layer, head, n, flag)
            for scope, layer, head in targets for flag in dict.fromkeys(flags) for n in ns]


def prune_settings(model: nn.Module, rankings: Sequence[HeadRanking],
                   keep_fractions: Sequence[float]):
    """The distinct removed-head sets of the sweep (first appearance first) and, per
    (ranking, fraction) row, the index of its set and the number of heads kept."""
    layout = model_layout(model)
    total = layout.num_layers * layout.num_heads
    index: dict[frozenset, int] = {frozenset(): 0}
    sets = [frozenset()]
    rows = []
    for ranking in rankings:
        for f in keep_fractions:
            kept = heads_to_keep(f, total)
            key = frozenset(ranking.heads[: total - kept])
            if key not in index:
                index[key] = len(sets)
                sets.append(key)
            rows.append((ranking, float(f), kept, index[key]))
    return [RemovedHeads(s) for s in sets], rows


# --------------------------------------------------------------------------- the kernel


def nll_sums(model: nn.Module, batch: Tensor, settings: Sequence) -> tuple[float, np.ndarray]:
    """Summed NLL of ``batch`` (B, T) with the model as it is, and under each setting.

    A setting is anything with ``context(model)`` (a restriction, a set of removed
    heads); an empty removal is measured once, as the base.
    """
    base = batch_nll_sum(model, batch)
    out = np.empty(len(settings), dtype=np.float64)
    for i, setting in enumerate(settings):
        if isinstance(setting, RemovedHeads) and not setting.heads:
            out[i] = base
            continue
        with setting.context(model):
            out[i] = batch_nll_sum(model, batch)
    return base, out


# --------------------------------------------------------------------------- tables


def pruning_tables(rows, base: NLLResult, nll: Sequence[float], rankings):
    """``(pruning, rankings)`` from the per-setting mean NLL ``nll`` (index of each row's
    removed set, as ``prune_settings`` returns it)."""
    import pandas as pd

    out = []
    for ranking, f, kept, i in rows:
        result = NLLResult(nll=float(nll[i]), perplexity=math.exp(nll[i]), n_tokens=0)
        out.append((ranking.ranker, ranking.seed, ranking.order, f, kept, result.nll,
                    result.perplexity, relative_delta(result.nll, base.nll)))
    pruning = pd.DataFrame(out, columns=list(PRUNING_COLUMNS))
    pruning = pruning.astype({"seed": "int64", "heads_kept": "int64"})
    ranks = pd.concat([r.to_frame() for r in rankings], ignore_index=True)
    return pruning, ranks[list(RANKINGS_COLUMNS)]


def scan_table(base: NLLResult, nll: Tensor, threshold: float):
    """``head_scan`` from the (L, H) mean NLL with each head removed alone."""
    import pandas as pd

    num_layers, num_heads = nll.shape
    delta = ((nll - base.nll) / base.nll).numpy().ravel()
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers, dtype=np.int64), num_heads),
            "head": np.tile(np.arange(num_heads, dtype=np.int64), num_layers),
            "nll": nll.numpy().ravel(),
            "delta_nll_rel": delta,
            "critical": delta > float(threshold),
            "threshold": float(threshold),
        }
    )


def restrict_tables(settings: Sequence[Restriction], base: NLLResult, nll: Sequence[float],
                    taus: Sequence[float]):
    """``(restrict, restrict_nstar)`` from the per-setting mean NLL."""
    import pandas as pd

    rows = [(s.scope, s.layer, s.head, s.n, s.renormalize, float(x), math.exp(x),
             relative_delta(float(x), base.nll)) for s, x in zip(settings, nll, strict=True)]
    restrict = pd.DataFrame(rows, columns=list(RESTRICT_COLUMNS))
    restrict = restrict.astype({"layer": "int64", "head": "int64", "n": "int64"})
    nstar_rows = []
    keys = ["scope", "layer", "head", "renormalize"]
    for key, group in restrict.groupby(keys, sort=False):
        for tau in taus:
            value = n_star(group["n"].tolist(), group["delta_nll_rel"].tolist(), tau)
            status = ABOVE_GRID if math.isnan(value) else WITHIN_GRID
            nstar_rows.append((*key, float(tau), value, status))
    nstar = pd.DataFrame(nstar_rows, columns=list(NSTAR_COLUMNS))
    nstar = nstar.astype({"layer": "int64", "head": "int64"})
    return restrict, nstar


# --------------------------------------------------------------------------- one call each


def _measure(model: nn.Module, eval_ids: Tensor, settings, batch_size: int):
    """Mean NLL per predicted token of the base and of every setting over ``eval_ids``."""
    eval_ids = check_windows(model, eval_ids, what="eval_ids")
    n_tokens = eval_ids.shape[0] * (eval_ids.shape[1] - 1)
    base_total, totals = 0.0, np.zeros(len(settings))
    was_training = model.training
    model.eval()
    try:
        for batch in _batches(eval_ids, batch_size):
            base, sums = nll_sums(model, batch, settings)
            base_total += base
            totals = totals + sums
    finally:
        model.train(was_training)
    return NLLResult.from_sum(base_total, n_tokens), totals / n_tokens


def prune_sweep(model: nn.Module, rankings: Sequence[HeadRanking], eval_ids: Tensor, *,
                keep_fractions: Sequence[float] = (1.0, 0.9, 0.75, 0.5, 0.25),
                batch_size: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prune heads in each ranking's order and measure held-out NLL (method §9 sweep).

    For every ranking (``rankers.rank_heads``) and keep fraction f, the first
    ``L*H - round(f*L*H)`` heads are removed (global budget) and the mean NLL is
    measured on ``eval_ids`` (N, T), windows disjoint from those the rankers read.

    >>> from attngeom.interventions.rankers import rank_heads
    >>> pruning, ranks = prune_sweep(model, [rank_heads("magnitude", model)], ids,
    ...                              keep_fractions=(1.0, 0.5))
    >>> pruning["heads_kept"].tolist()
    [40, 20]
    """
    settings, rows = prune_settings(model, rankings, keep_fractions)
    base, nll = _measure(model, eval_ids, settings, batch_size)
    return pruning_tables(rows, base, nll, rankings)


def scan_heads(model: nn.Module, eval_ids: Tensor, *, threshold: float = 0.05,
               batch_size: int = 8) -> pd.DataFrame:
    """Remove each head alone and report its relative delta-NLL (method §9 single-head scan).

    A head is ``critical`` when its relative delta-NLL exceeds ``threshold`` (the paper's
    Gemma-7B layer 0 head 12 breaks the model alone).
    """
    base, nll = head_removal_nll(model, eval_ids, batch_size=batch_size)
    return scan_table(base, nll, threshold)


def restrict_sweep(model: nn.Module, eval_ids: Tensor, n_grid: Iterable[int], *,
                   scopes=("model",), renormalize=(True, False), taus=(0.01, 0.05, 0.10),
                   layers=None, heads=None,
                   batch_size: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Top-N restriction over a grid of N, per scope, and the effective set size N* (method §9).

    See ``restrict_settings`` for the scopes; returns ``(restrict, restrict_nstar)``.
    """
    settings = restrict_settings(model, list(n_grid), scopes=scopes, renormalize=renormalize,
                                 layers=layers, heads=heads)
    base, nll = _measure(model, eval_ids, settings, batch_size)
    return restrict_tables(settings, base, nll, taus)

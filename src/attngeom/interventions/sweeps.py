"""Intervention sweeps: pruning by ranker, single-head scan, top-N restriction (SPEC 6).

Each sweep validates every argument before any model work (a bad keep fraction
fails in milliseconds, not after an hour of ranking), then returns long, tidy
tables with the columns of ``docs/internals.md`` less ``model`` and ``corpus``,
which the pipeline adds:

- :func:`prune_sweep` -> ``pruning`` (``ranker, seed, order, keep_fraction,
  heads_kept, nll, perplexity, delta_nll_rel``) and ``rankings`` (``ranker, seed,
  order, rank, layer, head, score``);
- :func:`scan_heads` -> ``head_scan`` (``layer, head, nll, delta_nll_rel,
  critical, threshold``);
- :func:`restrict_sweep` -> ``restrict`` (``scope, layer, head, n, renormalize,
  nll, perplexity, delta_nll_rel``) and ``restrict_nstar`` (``scope, layer, head,
  renormalize, tau, n_star``).

``delta_nll_rel`` is always ``(nll - base) / base`` against the unmodified model
on the same evaluation windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor, nn

from attngeom.capture import model_layout
from attngeom.errors import ConfigError
from attngeom.interventions.gates import remove_heads
from attngeom.interventions.perplexity import (
    NLLResult,
    check_batch_size,
    check_windows,
    evaluate_nll,
    head_removal_nll,
    relative_delta,
)
from attngeom.interventions.rankers import (
    ALL_ORDERS,
    DEFAULT_ORDER,
    HeadRanking,
    check_ranker,
    check_taxonomy_table,
    parse_order,
    rank_heads,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_KEEP_FRACTIONS",
    "PRUNING_COLUMNS",
    "RANKINGS_COLUMNS",
    "RESTRICT_COLUMNS",
    "NSTAR_COLUMNS",
    "SCAN_COLUMNS",
    "SCOPES",
    "heads_to_keep",
    "n_star",
    "prune_sweep",
    "restrict_sweep",
    "scan_heads",
]

DEFAULT_KEEP_FRACTIONS = (1.0, 0.9, 0.75, 0.5, 0.25)
DATA_RANKERS = ("entropy", "gradient", "sensitivity")
SCOPES = ("model", "layer", "head")
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
    """Global budget of SPEC 6: keep ``round(keep_fraction * total_heads)`` heads."""
    return int(round(keep_fraction * total_heads))


# --------------------------------------------------------------------------- validation


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _names(rankers: Sequence[str] | str) -> list[str]:
    items = [rankers] if isinstance(rankers, str) else list(rankers)
    if not items:
        raise ConfigError("rankers: expected at least one ranker name, got none")
    for name in items:
        check_ranker(name)
    return list(dict.fromkeys(items))


def _keep_fractions(values: Iterable[float]) -> list[float]:
    out = []
    for f in values:
        if not _is_real(f) or not (0.0 < float(f) <= 1.0):
            raise ConfigError(f"keep_fractions: expected values in (0, 1], got {f!r}")
        out.append(float(f))
    if not out:
        raise ConfigError("keep_fractions: expected at least one fraction, got none")
    return list(dict.fromkeys(out))


def _window_ids(ids: Iterable[int], rows: int | None, what: str) -> list[int]:
    out = list(ids)
    for w in out:
        if not _is_int(w):
            raise ConfigError(f"{what}: expected integer window ids, got {w!r}")
    if rows is not None and len(out) != rows:
        raise ConfigError(f"{what}: expected one window id per row ({rows}), got {len(out)}")
    return [int(w) for w in out]


def _orders(orders: Sequence[Sequence[str] | str] | str | None) -> list[tuple[str, str, str]]:
    if orders is None:
        return [DEFAULT_ORDER]
    if orders == "all":
        return list(ALL_ORDERS)
    if isinstance(orders, str):
        return [parse_order(orders)]
    items = list(orders)
    if items and all(isinstance(o, str) and ">" not in o for o in items) and len(items) == 3:
        # a single order written as a tuple of three regime names
        return [parse_order(items)]
    if not items:
        raise ConfigError("orders: expected None, 'all' or a list of regime orders, got []")
    return list(dict.fromkeys(parse_order(o) for o in items))


# --------------------------------------------------------------------------- pruning


def prune_sweep(
    model: nn.Module,
    rank_ids: Tensor | None,
    eval_ids: Tensor,
    *,
    rank_windows: Sequence[int],
    eval_windows: Sequence[int],
    rankers: Sequence[str] | str,
    keep_fractions: Sequence[float] = DEFAULT_KEEP_FRACTIONS,
    seeds: Sequence[int] = (0, 1, 2),
    taxonomy: pd.DataFrame | None = None,
    orders: Sequence[Sequence[str] | str] | str | None = None,
    batch_size: int = 8,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prune heads in each ranker's order and measure held-out NLL (SPEC 6 sweep).

    For every ranking (one per ranker; one per seed for ``random``; one per regime
    order for ``taxonomy``) and every keep fraction f, the first
    ``L*H - round(f*L*H)`` heads of the ordering are removed (global budget) and
    the mean NLL is measured on ``eval_ids``.

    Args:
        model: a causal LM.
        rank_ids: (Nr, T) windows the data rankers (entropy, gradient, sensitivity)
            rank on; may be None when no data ranker is asked for.
        eval_ids: (Ne, T) held-out windows the NLL is measured on.
        rank_windows, eval_windows: the corpus window id of each row of ``rank_ids``
            and ``eval_ids``; they must not overlap (SPEC 6: evaluation windows are
            disjoint from those used to rank).
        rankers: names from :data:`attngeom.interventions.rankers.RANKERS`.
        keep_fractions: fractions of heads kept, each in (0, 1].
        seeds: the random ranker's seeds (others get seed -1).
        taxonomy: per-head table (``layer, head, regime, mean_output_norm``) for
            the taxonomy ranker.
        orders: taxonomy regime orders: None (Mixer, Reset, Retriever), ``"all"``
            (all six, so that the data decide), or a list of orders.
        batch_size: windows per forward call.

    Returns:
        ``(pruning, rankings)`` DataFrames (columns: module docstring); the pipeline
        adds ``model`` and ``corpus``.

    Raises:
        ConfigError: for any bad argument, before any model work.

    Example:
        >>> pruning, rankings = prune_sweep(  # doctest: +SKIP
        ...     model, ids[:8], ids[8:], rank_windows=range(8), eval_windows=range(8, 16),
        ...     rankers=["random", "magnitude"], keep_fractions=(1.0, 0.5))
    """
    import pandas as pd

    names = _names(rankers)
    fractions = _keep_fractions(keep_fractions)
    batch_size = check_batch_size(batch_size)
    layout = model_layout(model)
    eval_ids = check_windows(model, eval_ids, what="eval_ids")
    needs_data = [n for n in names if n in DATA_RANKERS]
    if rank_ids is not None:
        rank_ids = check_windows(model, rank_ids, what="rank_ids")
    elif needs_data:
        raise ConfigError(f"rank_ids: rankers {needs_data} need ranking windows (N, T), got None")
    rank_w = _window_ids(rank_windows, None if rank_ids is None else rank_ids.shape[0],
                         "rank_windows")  # fmt: skip
    eval_w = _window_ids(eval_windows, eval_ids.shape[0], "eval_windows")
    overlap = sorted(set(rank_w) & set(eval_w))
    if overlap:
        raise ConfigError(
            f"eval_windows: expected no window shared with rank_windows, got {len(overlap)} "
            f"shared (first {overlap[:5]}); ranking and evaluation windows must be disjoint"
        )
    seed_list = [int(s) for s in seeds] if all(_is_int(s) for s in seeds) else None
    if seed_list is None or ("random" in names and not seed_list):
        raise ConfigError(f"seeds: expected a non-empty list of integers, got {seeds!r}")
    order_list = _orders(orders)
    if "taxonomy" in names:
        if taxonomy is None:
            raise ConfigError("taxonomy: the taxonomy ranker needs the per-head table, got None")
        check_taxonomy_table(taxonomy, layout.num_layers, layout.num_heads)

    rankings: list[HeadRanking] = []
    for name in names:
        if name == "taxonomy":
            for order in order_list:
                rankings.append(rank_heads(name, model, taxonomy=taxonomy, order=order))
        elif name == "random":
            for seed in dict.fromkeys(seed_list):
                rankings.append(rank_heads(name, model, seed=seed))
        else:
            rankings.append(rank_heads(name, model, rank_ids, batch_size=batch_size))

    total = layout.num_layers * layout.num_heads
    base = evaluate_nll(model, eval_ids, batch_size=batch_size)
    cache: dict[frozenset[tuple[int, int]], NLLResult] = {frozenset(): base}
    rows = []
    for ranking in rankings:
        for f in fractions:
            kept = heads_to_keep(f, total)
            removed = ranking.heads[: total - kept]
            key = frozenset(removed)
            if key not in cache:
                with remove_heads(model, removed):
                    cache[key] = evaluate_nll(model, eval_ids, batch_size=batch_size)
            result = cache[key]
            rows.append(
                (ranking.ranker, ranking.seed, ranking.order, f, kept, result.nll,
                 result.perplexity, relative_delta(result.nll, base.nll))
            )  # fmt: skip
    pruning = pd.DataFrame(rows, columns=list(PRUNING_COLUMNS))
    pruning = pruning.astype({"seed": "int64", "heads_kept": "int64"})
    ranks = pd.concat([r.to_frame() for r in rankings], ignore_index=True)
    return pruning, ranks[list(RANKINGS_COLUMNS)]


# --------------------------------------------------------------------------- single-head scan


def scan_heads(
    model: nn.Module, eval_ids: Tensor, *, threshold: float = 0.05, batch_size: int = 8
) -> pd.DataFrame:
    """Remove each head alone and report its relative delta-NLL (SPEC 6 single-head scan).

    A head is ``critical`` when its relative delta-NLL ``(nll - base) / base`` exceeds
    ``threshold`` (the paper's Gemma-7B layer 0 head 12 breaks the model alone).

    Args:
        eval_ids: (N, T) evaluation windows.
        threshold: critical threshold on the relative delta-NLL, finite and >= 0.

    Returns:
        One row per head: ``layer, head, nll, delta_nll_rel, critical, threshold``.
    """
    import pandas as pd

    if not _is_real(threshold) or not math.isfinite(float(threshold)) or threshold < 0:
        raise ConfigError(f"threshold: expected a finite number >= 0, got {threshold!r}")
    base, nll = head_removal_nll(model, eval_ids, batch_size=batch_size)
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


# --------------------------------------------------------------------------- top-N restriction


def _n_grid(n_grid: Iterable[int]) -> list[int]:
    out = list(n_grid)
    for n in out:
        if not _is_int(n) or n < 1:
            raise ConfigError(f"n_grid: expected integers >= 1, got {n!r}")
    if not out:
        raise ConfigError("n_grid: expected at least one N, got none")
    return sorted({int(n) for n in out})


def _indices(values: Iterable[int] | None, size: int, what: str) -> list[int]:
    if values is None:
        return list(range(size))
    out = list(values)
    for v in out:
        if not _is_int(v) or not 0 <= v < size:
            raise ConfigError(f"{what}: expected integers in [0, {size}), got {v!r}")
    return sorted({int(v) for v in out})


def n_star(ns: Sequence[int], deltas: Sequence[float], tau: float) -> float:
    """Smallest N of the grid with relative delta-NLL <= tau; NaN if none (SPEC 6 N*_tau).

    NaN here means "above the largest N tried" (``n_star_status`` says so in the table).
    """
    ok = [n for n, d in zip(ns, deltas, strict=True) if d <= tau]
    return float(min(ok)) if ok else math.nan


def format_n_star(value: float, status: str, largest: int) -> str:
    """``"16"``, or ``"> 64"`` when no N of the grid (largest 64) qualified."""
    return f"> {largest}" if status == ABOVE_GRID else f"{value:.0f}"


def restrict_sweep(
    model: nn.Module,
    eval_ids: Tensor,
    n_grid: Iterable[int],
    *,
    scopes: Sequence[str] = ("model",),
    renormalize: Sequence[bool] | bool = (True, False),
    taus: Sequence[float] = (0.01, 0.05, 0.10),
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    batch_size: int = 8,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Top-N restriction over a grid of N, per scope, and the effective set size N* (SPEC 6).

    Scopes: ``model`` restricts every head of every layer at once (layer = head = -1);
    ``layer`` restricts all heads of one layer (head = -1), for each of ``layers``;
    ``head`` restricts one head, for each of ``layers`` x ``heads``. ``layers`` and
    ``heads`` (default: all) choose the targets of the layer and head scopes.

    Returns:
        ``(restrict, nstar)``: one row per scope target, renormalize flag and N
        (``scope, layer, head, n, renormalize, nll, perplexity, delta_nll_rel``), and
        per scope target, flag and tau the smallest N with ``delta_nll_rel <= tau``
        (NaN if no N of the grid qualifies).

    Raises:
        ConfigError: for any bad argument, before any model work.
    """
    import pandas as pd

    from attngeom.interventions.restriction import restrict_topn

    ns = _n_grid(n_grid)
    scope_list = [scopes] if isinstance(scopes, str) else list(scopes)
    if not scope_list or any(s not in SCOPES for s in scope_list):
        raise ConfigError(f"scopes: expected a non-empty subset of {SCOPES}, got {scopes!r}")
    flags = [renormalize] if isinstance(renormalize, bool) else list(renormalize)
    if not flags or any(not isinstance(r, bool) for r in flags):
        raise ConfigError(
            f"renormalize: expected True, False or a list of them, got {renormalize!r}"
        )
    tau_list = list(taus)
    if not tau_list or any(
        not _is_real(t) or not math.isfinite(float(t)) or t < 0 for t in tau_list
    ):
        raise ConfigError(f"taus: expected a non-empty list of finite numbers >= 0, got {taus!r}")
    batch_size = check_batch_size(batch_size)
    layout = model_layout(model)
    eval_ids = check_windows(model, eval_ids, what="eval_ids")
    layer_list = _indices(layers, layout.num_layers, "layers")
    head_list = _indices(heads, layout.num_heads, "heads")

    targets: list[tuple[str, int, int]] = []
    for scope in dict.fromkeys(scope_list):
        if scope == "model":
            targets.append(("model", -1, -1))
        elif scope == "layer":
            targets.extend(("layer", l, -1) for l in layer_list)
        else:
            targets.extend(("head", l, h) for l in layer_list for h in head_list)

    base = evaluate_nll(model, eval_ids, batch_size=batch_size)
    rows = []
    for scope, layer, head in targets:
        kwargs: dict = {}
        if head >= 0:
            kwargs["heads"] = [(layer, head)]
        elif layer >= 0:
            kwargs["layers"] = [layer]
        for flag in dict.fromkeys(flags):
            for n in ns:
                with restrict_topn(model, n, renormalize=flag, **kwargs):
                    result = evaluate_nll(model, eval_ids, batch_size=batch_size)
                rows.append(
                    (scope, layer, head, n, flag, result.nll, result.perplexity,
                     relative_delta(result.nll, base.nll))
                )  # fmt: skip
    restrict = pd.DataFrame(rows, columns=list(RESTRICT_COLUMNS))
    restrict = restrict.astype({"layer": "int64", "head": "int64", "n": "int64"})

    nstar_rows = []
    keys = ["scope", "layer", "head", "renormalize"]
    for key, group in restrict.groupby(keys, sort=False):
        for tau in tau_list:
            value = n_star(group["n"].tolist(), group["delta_nll_rel"].tolist(), tau)
            status = ABOVE_GRID if math.isnan(value) else WITHIN_GRID
            nstar_rows.append((*key, float(tau), value, status))
    nstar = pd.DataFrame(nstar_rows, columns=list(NSTAR_COLUMNS))
    nstar = nstar.astype({"layer": "int64", "head": "int64"})
    return restrict, nstar

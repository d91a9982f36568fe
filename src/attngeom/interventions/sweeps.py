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
- ``restrict`` (``scope, layer, head, n, renormalize, nll, perplexity, delta_nll_rel,
  ranking, on_grid, passes``: every N tried) and ``restrict_nstar`` (``scope, layer,
  head, renormalize, tau, n_star, n_star_status, ranking, grid_n_star, n_star_low,
  n_star_high, n_evaluated, search, monotone, note, window_length``), from the adaptive
  search of ``interventions.nstar``;
- ``restrict_local`` (``scope, layer, head, ranking, renormalize, n, nll,
  delta_nll_rel, mean_doc_delta_rel, rank, n_windows``): the localised scan;
- ``restrict_alone`` (``layer, head, ranking, renormalize, tau, n, nll, delta_nll_rel,
  mean_doc_delta_rel, status, n_windows``): each head restricted alone, under every
  ranking, at the attention oracle's whole-model N*_tau (``alone_settings``).

A ranking whose own rule holds a fixed part of the budget (``names.RANKINGS``' ``fixed``:
StreamingLLM's four sinks, Quest's page) is not defined below it: an N* search counts
such an N as failing without running it, so its N* is the smallest N at or above the
fixed part within tau.

``delta_nll_rel`` is always ``(nll - base) / base`` against the unmodified model on
the same evaluation windows. Argument values are checked by the configurations
(``attngeom.config``); these functions check shapes only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor, nn

from attngeom.capture import model_layout
from attngeom.errors import ConfigError
from attngeom.interventions.gates import remove_heads
from attngeom.interventions.nstar import NStarSearch, bootstrap_nstar, both_rules, search_rounds
from attngeom.interventions.perplexity import (
    NLLResult,
    batch_nll_sum,
    check_windows,
    head_removal_nll,
    relative_delta,
)
from attngeom.interventions.rankers import HeadRanking
from attngeom.names import ORACLE, RANKINGS, STEPS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALONE_COLUMNS",
    "LOCAL_COLUMNS",
    "NSTAR_COLUMNS",
    "PRUNING_COLUMNS",
    "RANKINGS_COLUMNS",
    "RESTRICT_COLUMNS",
    "SCAN_COLUMNS",
    "RemovedHeads",
    "Restriction",
    "alone_scan",
    "alone_settings",
    "fixed_part",
    "head_targets",
    "heads_to_keep",
    "local_scan",
    "mean_doc_delta",
    "n_star",
    "nll_rows",
    "restrict_local",
    "restrict_search",
    "nll_sums",
    "prune_settings",
    "prune_sweep",
    "pruning_tables",
    "restrict_settings",
    "restrict_sweep",
    "removed_heads",
    "search_tables",
    "window_measure",
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
    "ranking", "on_grid", "passes",
)  # fmt: skip
NSTAR_COLUMNS = (
    "scope", "layer", "head", "renormalize", "tau", "n_star", "n_star_status", "ranking",
    "grid_n_star", "n_star_low", "n_star_high", "n_evaluated", "search", "monotone", "note",
    "window_length", "n_star_bisect", "n_star_interpolate", "oracle_n_star", "ratio",
    "ratio_low", "ratio_high",
)  # fmt: skip
LOCAL_COLUMNS = (
    "scope", "layer", "head", "ranking", "renormalize", "n", "nll", "delta_nll_rel",
    "mean_doc_delta_rel", "rank", "n_windows",
)  # fmt: skip
ALONE_COLUMNS = (
    "layer", "head", "ranking", "renormalize", "tau", "n", "nll", "delta_nll_rel",
    "mean_doc_delta_rel", "status", "n_windows",
)  # fmt: skip
# restrict_alone's status: run; N at or past the window (the identity: nothing runs,
# delta 0); N below the ranking's fixed part (undefined: NaN)
MEASURED, IDENTITY, BELOW_FIXED = "measured", "identity", "below_fixed"
# n_star_status: found by the search (adaptive), the smallest grid N passing (grid), or
# nothing shorter than the window passes: N* is the window length (endpoint)
SEARCHED, WITHIN_GRID, ENDPOINT = "search", "within_grid", "endpoint"


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
    ranking: str = "attention"
    seed: int = 0

    @property
    def variant(self) -> tuple:
        """Everything but N: the settings one N* search runs over."""
        return (self.scope, self.layer, self.head, self.ranking, self.renormalize)

    def at(self, n: int) -> Restriction:
        return replace(self, n=int(n))

    def context(self, model: nn.Module, windows=None):
        from attngeom.interventions.restriction import restrict_topn

        kwargs: dict = {}
        if self.head >= 0:
            kwargs["heads"] = [(self.layer, self.head)]
        elif self.layer >= 0:
            kwargs["layers"] = [self.layer]
        return restrict_topn(model, self.n, renormalize=self.renormalize,
                             ranking=self.ranking, seed=self.seed, windows=windows, **kwargs)


@dataclass(frozen=True)
class RemovedHeads:
    """A pruning or scan setting: the heads removed (``frozenset`` of (layer, head))."""

    heads: frozenset

    def context(self, model: nn.Module, windows=None):
        return remove_heads(model, sorted(self.heads))


def removed_heads(heads) -> RemovedHeads:
    return RemovedHeads(frozenset(tuple(h) for h in heads))


def restrict_settings(model: nn.Module, n_grid: Sequence[int], *, scopes=("model",),
                      renormalize=(True, False), layers: Iterable[int] | None = None,
                      heads: Iterable | None = None, rankings=("attention",),
                      seed: int = 0) -> list[Restriction]:
    """Every restriction of the sweep, in table order: scope target, then ranking, then
    flag, then N.

    Scopes: ``model`` restricts every head of every layer at once (layer = head = -1);
    ``layer`` all heads of one layer (head = -1), for each of ``layers``; ``head`` one
    head, for each of ``heads`` given as (layer, head) pairs (default: every head of
    ``layers``).
    """
    layer_list, head_list = head_targets(model, layers, heads)
    targets: list[tuple[str, int, int]] = []
    for scope in dict.fromkeys([scopes] if isinstance(scopes, str) else scopes):
        if scope == "model":
            targets.append(("model", -1, -1))
        elif scope == "layer":
            targets.extend(("layer", l, -1) for l in layer_list)
        else:
            targets.extend(("head", l, h) for l, h in head_list)
    flags = [renormalize] if isinstance(renormalize, bool) else list(renormalize)
    ranks = [rankings] if isinstance(rankings, str) else list(rankings)
    ns = sorted({int(n) for n in n_grid})
    return [Restriction(scope, layer, head, n, flag, ranking, int(seed))
            for scope, layer, head in targets for ranking in dict.fromkeys(ranks)
            for flag in dict.fromkeys(flags) for n in ns]


def head_targets(model: nn.Module, layers: Iterable[int] | None = None,
                 heads: Iterable | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """``(layers, heads)``: the layers (default every one) and the (layer, head) pairs
    (default every head of those layers) a layer or head scope restricts, checked
    against the model (one line naming the valid range)."""
    layout = model_layout(model)
    layer_list = list(range(layout.num_layers)) if layers is None else list(layers)
    for layer in layer_list:
        if not 0 <= layer < layout.num_layers:
            raise ConfigError(f"layers: expected layers in [0, {layout.num_layers}) for "
                              f"{layout.model_class}, got {layer}")
    if heads is None:
        return layer_list, [(l, h) for l in layer_list for h in range(layout.num_heads)]
    head_list = [(int(x[0]), int(x[1])) for x in heads]
    bad = [x for x in head_list if not (0 <= x[0] < layout.num_layers
                                        and 0 <= x[1] < layout.num_heads)]
    if bad:
        raise ConfigError(f"heads: expected layer in [0, {layout.num_layers}) and head in "
                          f"[0, {layout.num_heads}) for {layout.model_class}, got {bad[0]}")
    return layer_list, head_list


def fixed_part(ranking: str) -> int:
    """The keys a ranking's own rule holds at its default parameters (``names.RANKINGS``'
    ``fixed``: 4 for ``window``, 16 for ``quest``, 0 for a score): a smaller N is not
    defined for it."""
    return int((RANKINGS.meta(ranking) or {}).get("fixed", 0))


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


def nll_sums(model: nn.Module, batch: Tensor, settings: Sequence,
             windows: Sequence[int] | None = None) -> tuple[float, np.ndarray]:
    """Summed NLL of ``batch`` (B, T) with the model as it is, and under each setting.

    A setting is anything with ``context(model, windows)`` (a restriction, a set of
    removed heads); an empty removal is measured once, as the base. ``windows``: the
    batch rows' window indices (the random ranking's order depends on them).
    """
    base = batch_nll_sum(model, batch)
    out = np.empty(len(settings), dtype=np.float64)
    for i, setting in enumerate(settings):
        if isinstance(setting, RemovedHeads) and not setting.heads:
            out[i] = base
            continue
        with setting.context(model, windows):
            out[i] = batch_nll_sum(model, batch)
    return base, out


def nll_rows(model: nn.Module, batch: Tensor, settings: Sequence,
             windows: Sequence[int] | None = None, *, base: bool = True):
    """``nll_sums`` with each window's own sum beside: ``(base_sum, base_rows, sums,
    rows)``, the rows (B,) and (len(settings), B) float64; the base pair is ``(nan,
    None)`` with ``base=False`` (a later search round reuses the first's base).

    The sums are computed exactly as ``nll_sums`` computes them (the same tensor summed
    on its device), so pooled tables are bit for bit those of ``nll_sums``.
    """
    import torch

    from attngeom.interventions.perplexity import window_nll

    def measure() -> tuple[float, np.ndarray]:
        with torch.no_grad():
            per = window_nll(model, batch)
            return float(per.sum()), per.cpu().numpy()

    base_sum, base_rows = measure() if base else (math.nan, None)
    sums = np.empty(len(settings), dtype=np.float64)
    rows = np.empty((len(settings), batch.shape[0]), dtype=np.float64)
    for i, setting in enumerate(settings):
        with setting.context(model, windows):
            sums[i], rows[i] = measure()
    return base_sum, base_rows, sums, rows


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


# --------------------------------------------------------------------------- N* search

# ``measure(round, settings)`` -> ``(base_nll, base_docs, nll, docs)``: the mean NLL per
# predicted token of the unmodified model and its (D,) per-window values (needed from
# round 0 only), then (S,) and (S, D) for the settings; see ``pipeline.interventions``.
Measure = Callable[[int, list], tuple[float, "np.ndarray | None", np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class SearchResult:
    """One N* search: its setting (any N), what the search found, and per N tried the
    mean NLL and each window's."""

    setting: Restriction
    search: NStarSearch
    nll: dict
    docs: dict
    rules: dict = field(default_factory=dict)  # step -> {tau: N*} (``nstar.both_rules``)


def restrict_search(templates: Sequence[Restriction], measure: Measure, *, length: int,
                    taus: Sequence[float], grid: Sequence[int], adaptive: bool = True,
                    refine: int = 3, step: str = "interpolate",
                    ) -> tuple[float, np.ndarray, list[SearchResult]]:
    """Run the N* search of every template (a restriction; its N is ignored) in lockstep.

    Each round gathers every search's next Ns into one list of settings and measures
    them in one pass over the windows (``measure``); round 0 is the grid (every ``grid``
    N below ``length``) with the base. Delta is the relative delta-NLL of pooled means,
    as in the tables; an N below a template's ``fixed_part`` is not measured and fails
    (``results[i].nll`` holds the measured Ns only). Returns ``(base_nll, base_docs,
    results)``.
    """
    nll: dict[int, dict] = {i: {} for i in range(len(templates))}
    docs: dict[int, dict] = {i: {} for i in range(len(templates))}
    base: list = [math.nan, None]
    floors = [fixed_part(t.ranking) for t in templates]

    def round_of(rnd: int, pairs: list) -> dict:
        # an N below the ranking's fixed part fails without a forward (it is undefined)
        new = [(i, n) for i, n in dict.fromkeys(pairs) if n not in nll[i] and n >= floors[i]]
        if new or rnd == 0:  # round 0 measures the base too
            b, b_docs, got, got_docs = measure(rnd, [templates[i].at(n) for i, n in new])
            if rnd == 0:
                base[:] = [float(b), np.asarray(b_docs, dtype=np.float64)]
            for k, (i, n) in enumerate(new):
                nll[i][n] = float(got[k])
                docs[i][n] = np.asarray(got_docs[k], dtype=np.float64)
        return {(i, n): (math.inf if n < floors[i] else relative_delta(nll[i][n], base[0]))
                for i, n in pairs}

    def make(i: int, rule: str):
        return search_rounds(taus, length=length, grid=grid, adaptive=adaptive, refine=refine,
                             step=rule)

    done, rules = both_rules(make, list(range(len(templates))), round_of, step)
    return base[0], base[1], [SearchResult(templates[i], done[i], nll[i], docs[i], rules[i])
                              for i in range(len(templates))]


def _number(n: int | None) -> float:
    """An N* as a float column value: NaN where none was found."""
    return math.nan if n is None else float(n)


def _passes(delta: float, taus: Sequence[float]) -> str:
    return ",".join(f"{t:g}" for t in taus if delta <= t)


def search_tables(results: Sequence[SearchResult], base: float, base_docs: np.ndarray,
                  taus: Sequence[float], *, length: int, adaptive: bool = True,
                  bootstrap: int = 1000, seed: int = 0, level: float = 0.95,
                  beyond: Sequence[int] = (), step: str = "interpolate"):
    """``(restrict, restrict_nstar)`` from the searches: every N tried with its
    delta-NLL and the taus it passes; per search and tau the integer N*, the grid
    estimate, the document-bootstrap interval (``bootstrap`` replicates, none at 0)
    and the non-monotone notes. ``beyond``: grid N at or past the window length, not
    run (they restrict nothing) and recorded with the base NLL, delta 0."""
    import pandas as pd

    rows, nstar_rows = [], []
    oracle = _oracle_ratios(results, base_docs, taus, length=length, bootstrap=bootstrap,
                            seed=seed, level=level)
    for r in results:
        s, found = r.setting, r.search
        measured = dict(r.nll)
        measured.update({int(n): base for n in beyond if n >= length})
        for n in sorted(measured):
            x = measured[n]
            delta = relative_delta(x, base)
            rows.append((s.scope, s.layer, s.head, n, s.renormalize, x, math.exp(x), delta,
                         s.ranking, n in found.grid or n >= length, _passes(delta, taus)))
        ci = (bootstrap_nstar(base_docs, r.docs, taus, length=length, replicates=bootstrap,
                              seed=seed, level=level) if bootstrap > 0 else {})
        for tau in taus:
            value = found.nstar[float(tau)]
            grid_value = found.grid_nstar[float(tau)]
            status = (ENDPOINT if value == length and length not in found.evaluations
                      else SEARCHED if adaptive else WITHIN_GRID)
            note = "; ".join(x for x in found.notes if x.startswith(f"tau={tau:g}:"))
            low, high = ci.get(float(tau), (math.nan, math.nan))
            nstar_rows.append((s.scope, s.layer, s.head, s.renormalize, float(tau),
                               math.nan if value is None else float(value), status, s.ranking,
                               math.nan if grid_value is None else float(grid_value), low, high,
                               len(r.nll), step if adaptive else "grid",
                               found.monotone, note, int(length),
                               *(_number(r.rules.get(rule, found.nstar).get(float(tau)))
                                 for rule in STEPS),
                               *oracle.get((id(r), float(tau)), (math.nan,) * 4)))
    restrict = pd.DataFrame(rows, columns=list(RESTRICT_COLUMNS))
    restrict = restrict.astype({"layer": "int64", "head": "int64", "n": "int64"})
    nstar = pd.DataFrame(nstar_rows, columns=list(NSTAR_COLUMNS))
    nstar = nstar.astype({"layer": "int64", "head": "int64", "n_evaluated": "int64",
                          "window_length": "int64"})
    return restrict, nstar


def _oracle_ratios(results: Sequence[SearchResult], base_docs: np.ndarray, taus, *,
                   length: int, bootstrap: int, seed: int, level: float) -> dict:
    """(id(result), tau) -> (oracle N*, ratio, ratio_low, ratio_high): each ranking's N*
    over the attention ranking's (the top-N oracle: it keeps the largest probabilities)
    of the same scope, target and treatment, with a paired document-bootstrap interval
    (the same draws for both searches, so each replicate gives one ratio). The oracle's
    own rows read 1; without an attention search, nothing."""
    from attngeom.interventions.nstar import nstar_replicates

    oracles = {(r.setting.scope, r.setting.layer, r.setting.head, r.setting.renormalize): r
               for r in results if r.setting.ranking == ORACLE}
    out: dict = {}
    for r in results:
        key = (r.setting.scope, r.setting.layer, r.setting.head, r.setting.renormalize)
        o = oracles.get(key)
        if o is None:
            continue
        reps = ({} if bootstrap < 1 else
                (nstar_replicates(base_docs, r.docs, taus, length=length, replicates=bootstrap,
                                  seed=seed),
                 nstar_replicates(base_docs, o.docs, taus, length=length, replicates=bootstrap,
                                  seed=seed)))
        for tau in taus:
            mine, theirs = r.search.nstar[float(tau)], o.search.nstar[float(tau)]
            ratio = (math.nan if mine is None or not theirs else mine / theirs)
            low = high = math.nan
            if reps:
                q = reps[0][float(tau)] / reps[1][float(tau)]
                if np.isfinite(q).any():
                    low, high = (float(x) for x in np.nanquantile(
                        q, [(1 - level) / 2, (1 + level) / 2]))
            out[(id(r), float(tau))] = (_number(theirs), ratio, low, high)
    return out


# --------------------------------------------------------------------------- localised scan


def mean_doc_delta(docs: np.ndarray, base_docs: np.ndarray) -> float:
    """The follow-up's localised score: the mean over windows (documents) of each one's
    relative NLL increase, not the relative increase of the pooled means."""
    docs = np.asarray(docs, dtype=np.float64)
    return float(np.mean((docs - base_docs) / base_docs))


def local_scan(templates: Sequence[Restriction], measure: Measure, *, layers: Sequence[int],
               num_heads: int, heads: bool, top_layers: int = 2):
    """The localised scan: each template (ranking, renormalisation, N) restricted in one
    layer alone for every layer of ``layers``; with ``heads``, then in one head alone
    for every head of the ``top_layers`` layers of largest score (ties to the smaller
    layer), per template. Returns ``restrict_local`` (``LOCAL_COLUMNS``)."""
    import pandas as pd

    settings = [replace(t, scope="layer", layer=int(l), head=-1) for t in templates
                for l in layers]
    base, base_docs, nll, docs = measure(0, settings)
    base_docs = np.asarray(base_docs, dtype=np.float64)
    scored = [(s, float(nll[k]), np.asarray(docs[k])) for k, s in enumerate(settings)]
    if heads:
        chosen = []
        for t in templates:
            mine = [(mean_doc_delta(d, base_docs), s.layer) for s, _, d in scored
                    if replace(s, scope=t.scope, layer=t.layer, head=t.head) == t]
            top = [layer for _, layer in sorted(mine, key=lambda x: (-x[0], x[1]))[:top_layers]]
            chosen += [replace(t, scope="head", layer=l, head=h) for l in top
                       for h in range(num_heads)]
        _, _, nll2, docs2 = measure(1, chosen)
        scored += [(s, float(nll2[k]), np.asarray(docs2[k])) for k, s in enumerate(chosen)]
    rows = [(s.scope, s.layer, s.head, s.ranking, s.renormalize, s.n, x,
             relative_delta(x, base), mean_doc_delta(d, base_docs), 0, len(base_docs))
            for s, x, d in scored]
    table = pd.DataFrame(rows, columns=list(LOCAL_COLUMNS))
    table = table.astype({"layer": "int64", "head": "int64", "n": "int64", "rank": "int64",
                          "n_windows": "int64"})
    # rank 1 = the largest increase within its scope, ranking, renormalisation and N
    keys = ["scope", "ranking", "renormalize", "n"]
    order = table.sort_values(keys + ["mean_doc_delta_rel", "layer", "head"],
                              ascending=[True] * 4 + [False, True, True], kind="stable")
    table.loc[order.index, "rank"] = order.groupby(keys, sort=False).cumcount().to_numpy() + 1
    return table


# --------------------------------------------------------------------------- heads alone


def alone_settings(results: Sequence[SearchResult], tau: float, heads: Sequence, *,
                   length: int) -> list[tuple[Restriction, str]]:
    """Each head of ``heads`` ((layer, head) pairs) restricted alone under every ranking
    and treatment the whole-model searches ran, at N = the attention oracle's
    whole-model N*_tau of the same treatment: one budget for every ranking, so that
    their delta-NLL compare at the set size the oracle needs (issue 39's atlas join).

    Returns ``(setting, status)`` pairs, heads first, then ranking and treatment in the
    searches' order. Only ``measured`` settings are run; ``identity`` (N at or past the
    window ``length``: nothing is restricted, delta 0) and ``below_fixed`` (N below the
    ranking's ``fixed_part``: undefined, NaN) are recorded without a forward. A search
    without its oracle is one line.
    """
    searched = [r for r in results if r.setting.scope == "model"]
    budgets = {r.setting.renormalize: r.search.nstar[float(tau)] for r in searched
               if r.setting.ranking == ORACLE}
    variants = list(dict.fromkeys((r.setting.ranking, r.setting.renormalize, r.setting.seed)
                                  for r in searched))
    missing = [flag for _, flag, _ in variants if budgets.get(flag) is None]
    if missing:
        raise ConfigError(f"alone_tau: restricting each head alone reads the {ORACLE} "
                          f"oracle's whole-model N*; add {ORACLE} to the rankings (no "
                          f"oracle N* for renormalize={missing[0]})")
    out = []
    for layer, head in heads:
        for ranking, flag, seed in variants:
            n = int(budgets[flag])
            status = (IDENTITY if n >= length else BELOW_FIXED if n < fixed_part(ranking)
                      else MEASURED)
            out.append((Restriction("head", int(layer), int(head), n, flag, ranking, seed),
                        status))
    return out


def alone_scan(results: Sequence[SearchResult], measure: Measure, tau: float, heads: Sequence,
               *, length: int):
    """``restrict_alone`` (``ALONE_COLUMNS``): the ``alone_settings`` measured in one round
    of ``measure`` (with the base, on the same windows as the searches) and recorded with
    the delta-NLL of pooled means (``delta_nll_rel``) and the mean of each window's
    relative increase (``mean_doc_delta_rel``, the localised scan's score)."""
    import pandas as pd

    pairs = alone_settings(results, tau, heads, length=length)
    run = [s for s, status in pairs if status == MEASURED]
    base, base_docs, nll, docs = measure(0, run)
    base_docs = np.asarray(base_docs, dtype=np.float64)
    rows, k = [], 0
    for s, status in pairs:
        if status == MEASURED:
            x, mean_doc = float(nll[k]), mean_doc_delta(docs[k], base_docs)
            k += 1
        elif status == IDENTITY:
            x, mean_doc = base, 0.0
        else:
            x = mean_doc = math.nan
        rows.append((s.layer, s.head, s.ranking, s.renormalize, float(tau), s.n, x,
                     relative_delta(x, base) if status != IDENTITY else 0.0, mean_doc,
                     status, len(base_docs)))
    table = pd.DataFrame(rows, columns=list(ALONE_COLUMNS))
    return table.astype({"layer": "int64", "head": "int64", "n": "int64",
                         "n_windows": "int64"})


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


def window_measure(model: nn.Module, eval_ids: Tensor, batch_size: int = 8) -> Measure:
    """The ``Measure`` of ``restrict_search`` and ``local_scan`` over ``eval_ids`` (N, T):
    window i is window index i of the random ranking."""
    eval_ids = check_windows(model, eval_ids, what="eval_ids")
    per_window = eval_ids.shape[1] - 1
    n_tokens = eval_ids.shape[0] * per_window

    def measure(rnd: int, settings):
        base_total, totals = 0.0, np.zeros(len(settings))
        base_rows, rows = [], []
        was_training = model.training
        model.eval()
        try:
            for start in range(0, eval_ids.shape[0], batch_size):
                batch = eval_ids[start : start + batch_size]
                ids = list(range(start, start + batch.shape[0]))
                b, b_rows, sums, r = nll_rows(model, batch, settings, ids, base=rnd == 0)
                base_total += b
                totals = totals + sums
                base_rows.append(b_rows)
                rows.append(r)
        finally:
            model.train(was_training)
        docs = np.concatenate(rows, axis=1) / per_window
        base_docs = np.concatenate(base_rows) / per_window if rnd == 0 else None
        return base_total / n_tokens, base_docs, totals / n_tokens, docs

    return measure


def restrict_sweep(model: nn.Module, eval_ids: Tensor, n_grid: Iterable[int], *,
                   scopes=("model",), renormalize=(True, False), taus=(0.01, 0.05, 0.10),
                   layers=None, heads=None, rankings=("attention",), seed: int = 0,
                   search: str = "adaptive", bootstrap: int = 1000,
                   batch_size: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Top-N restriction and the integer N*_tau per scope target, ranking and
    renormalisation (method §9; the follow-up's adaptive search, ``search="grid"`` for
    the grid alone). ``n_grid`` is the first round's Ns (those below the window length).

    See ``restrict_settings`` for the scopes; returns ``(restrict, restrict_nstar)``.
    """
    if search not in ("adaptive", "grid"):
        raise ConfigError(f"search: expected adaptive or grid, got {search!r}")
    grid = sorted({int(n) for n in n_grid})
    templates = restrict_settings(model, grid[:1] or [1], scopes=scopes,
                                  renormalize=renormalize, layers=layers, heads=heads,
                                  rankings=rankings, seed=seed)
    length = int(eval_ids.shape[1])
    base, base_docs, results = restrict_search(
        templates, window_measure(model, eval_ids, batch_size), length=length, taus=taus,
        grid=grid, adaptive=search == "adaptive")
    return search_tables(results, base, base_docs, taus, length=length,
                         adaptive=search == "adaptive", bootstrap=bootstrap, seed=seed,
                         beyond=grid)


def restrict_local(model: nn.Module, eval_ids: Tensor, *, scope: str = "head", n=(16,),
                   rankings=("attention",), renormalize=(False,), layers=None,
                   top_layers: int = 2, seed: int = 0, batch_size: int = 8) -> pd.DataFrame:
    """The localised scan (the follow-up's App. E.3) in one call: ``restrict_local``."""
    layout = model_layout(model)
    layers = list(range(layout.num_layers)) if layers is None else list(layers)
    templates = [Restriction("layer", 0, -1, int(k), bool(f), r, int(seed))
                 for r in rankings for f in renormalize for k in n]
    return local_scan(templates, window_measure(model, eval_ids, batch_size), layers=layers,
                      num_heads=layout.num_heads, heads=scope == "head", top_layers=top_layers)

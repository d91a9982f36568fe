"""How N* grows with context: nested windows of several lengths (follow-up Sec. 3.2, B.3).

Each document gives one window of the longest length L_max by the fixed-length
protocol (``attngeom.corpora.documents.fixed_windows``: the initial token and
L_max - 1 content tokens at a hashed offset). A shorter length L keeps the initial token
and the last L - 1 content tokens of that window, so every length ends at the same token
and the final targets are the same text at every L:

    window_L = [initial] + window_Lmax[L_max - L + 1 :]

Two scorings of one forward: ``tail`` (the final 128 targets, "tail128", the paper's
primary view: the same tokens at every L) and ``all`` (every one of the L - 1 targets).
A document's NLL is the mean over its scored targets; the corpus NLL is the mean over
documents; the delta is relative, (NLL(M_N) - NLL(M)) / NLL(M). The full-model
baseline is computed once per L and reused by every selection and N.

N*_tau per L comes from the adaptive integer search (``attngeom.interventions.nstar``),
with every power of two below L on the grid and L as the exact no-op endpoint; both
scorings and all taus share the restricted forwards. The document bootstrap draws one
set of document indices per replicate and uses it for every L, selection, scoring and
tau, so each replicate gives a whole N*(L) curve: its log-log OLS slope (log N* on log
L) gives the slope's interval. Replicate N* values are read from the evaluated Ns only
(the smallest passing one, else L): the model is not run again.

On the engine (``prepare_context`` before the model loads, ``run_context`` after): stage
``context`` is the baseline, one unit per (length, block of ``batch_size`` documents);
stages ``context-search-1``, ``-2``, ... are the lockstep rounds of every (length,
selection, scoring) search (``interventions.nstar.lockstep``), each restricted setting
evaluated once for both scorings. A killed run resumes from its finished units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attngeom.capture import input_device
from attngeom.engine.runner import RunContext, Unit
from attngeom.errors import ConfigError
from attngeom.interventions.nstar import both_rules, search_rounds, stable_nstar
from attngeom.interventions.selection import Selection, restriction
from attngeom.names import STEPS

TAIL = 128
SCORINGS = ("tail", "all")
_CHUNK = 256  # positions per float64 log-softmax


def check_lengths(lengths: Sequence[int], tail: int = TAIL) -> list[int]:
    """Sorted distinct lengths, each longer than the tail (one line otherwise)."""
    out = sorted({int(x) for x in lengths})
    if not out or any(x <= tail for x in out):
        raise ConfigError(f"expected context lengths above the tail of {tail} targets, "
                          f"got {list(lengths)}")
    return out


def nested_suffixes(windows: Sequence[torch.Tensor], lengths: Sequence[int]
                    ) -> dict[int, torch.Tensor]:
    """length -> (D, L) windows: the initial token and the last L - 1 tokens of each.

    ``windows``: D windows of one length L_max >= every length (initial token first).
    """
    if not windows:
        raise ConfigError("expected at least one document window, got none")
    longest = {int(w.shape[0]) for w in windows}
    if len(longest) != 1:
        raise ConfigError(f"expected windows of one length, got {sorted(longest)}")
    top = longest.pop()
    out = {}
    for length in lengths:
        if length > top:
            raise ConfigError(f"a nested window of {length} tokens needs windows of at "
                              f"least that length, got {top}")
        out[int(length)] = torch.stack([torch.cat([w[:1], w[top - length + 1:]])
                                        for w in windows])
    return out


def sweep_windows(documents: Sequence[str], tokenizer, lengths: Sequence[int], *,
                  n_documents: int, seed: int, dataset: str, model_id: str,
                  config_bos: int | None = None, tail: int = TAIL):
    """Nested windows of every length from the fixed-length protocol at the longest one.

    Returns ``(length -> (D, L) ids, DocumentProtocol record)``.
    """
    from attngeom.corpora.documents import fixed_windows

    lengths = check_lengths(lengths, tail)
    windows, record = fixed_windows(documents, tokenizer, lengths[-1],
                                    n_documents=n_documents, seed=seed, dataset=dataset,
                                    model_id=model_id, config_bos=config_bos)
    return nested_suffixes([w.input_ids for w in windows], lengths), record


@torch.no_grad()
def document_nll(model, ids: torch.Tensor, *, tail: int = TAIL, batch_size: int = 4
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(D,) mean NLL of every window over all its targets and over its last ``tail``."""
    device = input_device(model)
    all_nll, tail_nll = [], []
    for start in range(0, ids.shape[0], batch_size):
        batch = ids[start: start + batch_size].to(device)
        logits = model(input_ids=batch, use_cache=False).logits
        targets = batch[:, 1:]
        nll = torch.empty(targets.shape, dtype=torch.float64, device=device)
        for a in range(0, targets.shape[1], _CHUNK):
            b = min(a + _CHUNK, targets.shape[1])
            chunk = logits[:, a:b].to(torch.float64)
            nll[:, a:b] = F.cross_entropy(chunk.transpose(1, 2), targets[:, a:b],
                                          reduction="none")
        all_nll.append(nll.mean(1).cpu().numpy())
        tail_nll.append(nll[:, -tail:].mean(1).cpu().numpy())
    return np.concatenate(all_nll), np.concatenate(tail_nll)


def _relative(values: np.ndarray, base: np.ndarray) -> float:
    return float((values.mean() - base.mean()) / base.mean())


def _replicate_nstar(base: np.ndarray, per_n: Mapping[int, np.ndarray], tau: float,
                     length: int, draws: np.ndarray) -> np.ndarray:
    """(R,) N* of each bootstrap replicate: smallest evaluated passing N, else ``length``."""
    ns = sorted(per_n)
    if not ns:
        return np.full(draws.shape[0], float(length))
    mean_base = base[draws].mean(axis=1)
    table = np.stack([per_n[n] for n in ns])  # (len(ns), D)
    delta = (table[:, draws].mean(axis=2) - mean_base) / mean_base  # (len(ns), R)
    ok = delta <= tau
    first = np.asarray(ns, dtype=np.float64)[np.argmax(ok, axis=0)]
    return np.where(ok.any(axis=0), first, float(length))


def loglog_slope(lengths: Sequence[float], nstar: Sequence[float]) -> float:
    """OLS slope of log N* on log L (NaN with fewer than two finite points)."""
    x, y = np.log(np.asarray(lengths, float)), np.log(np.asarray(nstar, float))
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return math.nan
    x, y = x[ok], y[ok]
    return float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())


@dataclass(frozen=True)
class ContextInputs:
    """What ``prepare_context`` built: length -> (D, L) nested windows, their documents'
    protocol record, the corpus label and the selections."""

    windows: dict[int, torch.Tensor]
    record: object
    corpus: str
    selections: tuple[Selection, ...]


def corpus_documents(ctx: RunContext) -> tuple[list[str], str, int | None]:
    """The probe corpus's documents, its label and the model configuration's BOS id (the
    fixed protocol's initial token where the tokenizer has none), read before the model
    loads."""
    from attngeom.corpora.documents import probe_corpus, probe_documents

    docs, corpus = probe_documents(probe_corpus(ctx.config.corpus))
    if ctx.model is not None:
        config_bos = getattr(ctx.model.config, "bos_token_id", None)
    else:
        from attngeom.capture.loading import inspect_model

        config_bos = (inspect_model(ctx.config.model) or {}).get("bos_token_id")
    return docs, corpus, config_bos


def prepare_context(ctx: RunContext) -> ContextInputs:
    """The nested windows of every length, cut before the model loads (tokenizer only):
    too few eligible documents, or a length past the model's positions, is one line."""
    cfg = ctx.config
    docs, corpus, config_bos = corpus_documents(ctx)
    limit = ctx.shape.max_positions if ctx.shape is not None else None
    windows, record = sweep_windows(docs, ctx.tokenizer, cfg.context_lengths(limit),
                                    n_documents=cfg.n_documents, seed=cfg.seed,
                                    dataset=corpus, model_id=ctx.model_label,
                                    config_bos=config_bos, tail=cfg.tail)
    if limit is not None and max(windows) > limit:
        raise ConfigError(f"lengths: a context of {max(windows)} tokens is longer than the "
                          f"model's {limit} positions; ask for shorter lengths")
    selections = tuple(Selection(r, bool(f)) for r in cfg.rankings for f in cfg.renormalize)
    return ContextInputs(windows=windows, record=record, corpus=corpus, selections=selections)


def context_record(inputs: ContextInputs) -> dict:
    """What the manifest records of the documents the sweep read."""
    out = {"lengths": sorted(inputs.windows),
           "documents": int(next(iter(inputs.windows.values())).shape[0]),
           "corpus": inputs.corpus}
    if inputs.record is not None and hasattr(inputs.record, "to_dict"):
        out["document_protocol"] = inputs.record.to_dict()
    return out


def _units(inputs: ContextInputs, size: int) -> list[Unit]:
    """Per length, consecutive blocks of ``size`` documents (``ids``: length, documents)."""
    units = []
    for length in sorted(inputs.windows):
        d = int(inputs.windows[length].shape[0])
        for start in range(0, d, size):
            idx = tuple(range(start, min(d, start + size)))
            units.append(Unit(len(units), (length, idx), ids=(length, *idx)))
    return units


def run_context(ctx: RunContext) -> dict:
    """The context tables: the baseline of every length, then the N* searches of every
    (length, selection, scoring) in lockstep rounds, each a stage of resumable units."""
    cfg, inputs, model = ctx.config, ctx.inputs, ctx.model
    tail, taus = cfg.tail, cfg.effective_taus
    lengths = check_lengths(inputs.windows, tail)
    n_docs = int(inputs.windows[lengths[0]].shape[0])
    units = _units(inputs, cfg.batch_size)

    def ids_of(unit: Unit) -> torch.Tensor:
        length, idx = unit.windows
        return inputs.windows[length][list(idx)]

    def gather(stage: str, process, desc: str, weight) -> dict:
        """Per (length, key) the documents' (all, tail) NLL, units concatenated in order."""
        got: dict[tuple, list] = {}
        for unit, part in zip(units, ctx.run_units(stage, units, process, desc=desc,
                                                   unit="pass", weight=weight), strict=True):
            for key, value in part.items():
                got.setdefault((unit.windows[0], key), []).append(value)
        return {k: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v]))
                for k, v in got.items()}

    base_parts = gather("context", lambda u: {"base": document_nll(model, ids_of(u), tail=tail,
                                                                   batch_size=cfg.batch_size)},
                        f"context: baseline ({n_docs} documents x {len(lengths)} lengths)",
                        lambda u: 1)
    base = {L: dict(zip(("all", "tail"), base_parts[(L, "base")], strict=True))
            for L in lengths}
    cache: dict[tuple, dict[str, np.ndarray]] = {}  # (length, selection, n) -> scoring -> (D,)

    def measure(rnd: int, pairs: list) -> dict:
        need = sorted({(L, s, n) for (L, s, _), n in pairs if (L, s, n) not in cache})
        if need:
            def process(unit: Unit) -> dict:
                out = {}
                for L, s, n in need:
                    if unit.windows[0] != L:
                        continue
                    sel = inputs.selections[s]
                    with restriction(model, int(n), ranking=sel.ranking,
                                     renormalize=sel.renormalize, seed=cfg.seed):
                        out[(s, n)] = document_nll(model, ids_of(unit), tail=tail,
                                                   batch_size=cfg.batch_size)
                return out

            parts = gather(f"context-search-{rnd + 1}", process,
                           f"context: N* search round {rnd + 1} ({len(need)} settings)",
                           lambda u: sum(1 for L, _, _ in need if u.windows[0] == L))
            for L, s, n in need:
                a, t_ = parts[(L, (s, n))]
                cache[(L, s, n)] = {"all": a, "tail": t_}
        return {((L, s, scoring), n): _relative(cache[(L, s, n)][scoring], base[L][scoring])
                for (L, s, scoring), n in pairs}

    keys = [(L, s, scoring) for L in lengths for s in range(len(inputs.selections))
            for scoring in SCORINGS]
    found, rules = both_rules(lambda key, rule: search_rounds(taus, length=key[0],
                                                              grid_max=key[0], refine=3,
                                                              step=rule),
                              keys, measure, cfg.step)
    ctx.counts["context_lengths"] = len(lengths)
    return _context_tables(cfg, inputs, lengths, base, cache, found, rules)


def _context_tables(cfg, inputs: ContextInputs, lengths, base, cache, found, rules) -> dict:
    import pandas as pd

    taus, n_boot = cfg.effective_taus, cfg.bootstrap
    n_docs = int(inputs.windows[lengths[0]].shape[0])
    draws = np.random.default_rng(np.random.SeedSequence([int(cfg.seed) & 0xFFFFFFFF, 0xC0])
                                  ).integers(0, n_docs, size=(int(n_boot), n_docs))
    common = {"n_documents": n_docs}
    rows_nll = [{**common, "length": L, "scoring": scoring, "nll": float(base[L][scoring].mean())}
                for L in lengths for scoring in SCORINGS]
    rows_curve, rows_nstar = [], []
    replicates: dict[tuple, dict[int, np.ndarray]] = {}
    for L in lengths:
        for s, sel in enumerate(inputs.selections):
            for scoring in SCORINGS:
                result = found[(L, s, scoring)]
                keys = {**common, "length": L, "ranking": sel.ranking, "mode": sel.mode,
                        "scoring": scoring}
                # every N the searches of this (length, selection) evaluated, by either
                # scoring (the other rule's searches of non-monotone curves aside)
                tried = set(found[(L, s, "tail")].evaluations) | set(
                    found[(L, s, "all")].evaluations)
                per_n = {n: cache[(L, s, n)][scoring] for n in sorted(tried)}
                deltas = {n: _relative(v, base[L][scoring]) for n, v in per_n.items()}
                rows_curve += [{**keys, "n": n, "delta_rel": d} for n, d in deltas.items()]
                for tau in taus:
                    rep = _replicate_nstar(base[L][scoring], per_n, float(tau), L, draws)
                    replicates.setdefault((sel.ranking, sel.mode, scoring, float(tau)),
                                          {})[L] = rep
                    low, high = (np.quantile(rep, [0.025, 0.975]) if rep.size
                                 else (math.nan, math.nan))
                    rows_nstar.append({**keys, "tau": float(tau),
                                       "nstar": min(result.nstar[float(tau)],
                                                    _smallest(per_n, base[L][scoring], tau, L)),
                                       "grid_nstar": result.grid_nstar[float(tau)],
                                       "nstar_stable": stable_nstar(deltas, float(tau), L),
                                       "nstar_low": float(low), "nstar_high": float(high),
                                       "evaluations": len(per_n), "search": cfg.step,
                                       **{f"nstar_{rule}": rules[(L, s, scoring)][rule][
                                           float(tau)] for rule in STEPS},
                                       "monotone": result.monotone,
                                       "notes": " | ".join(result.notes)})
    nstar = pd.DataFrame(rows_nstar)
    return {"context_nll": pd.DataFrame(rows_nll), "context_curve": pd.DataFrame(rows_curve),
            "context_nstar": nstar,
            "context_slope": _slope_rows(nstar, replicates, common)}


def _slope_rows(nstar, replicates: dict, common: dict):
    """Per (selection, scoring, tau): the log-log slope of N* on L and its interval from
    the replicates' whole N*(L) curves."""
    import pandas as pd

    rows = []
    for (ranking, mode, scoring, tau), by_length in replicates.items():
        sub = nstar[(nstar.ranking == ranking) & (nstar["mode"] == mode)
                    & (nstar.scoring == scoring) & (nstar.tau == tau)].sort_values("length")
        slope = loglog_slope(sub["length"], sub["nstar"])
        ls = sorted(by_length)
        reps = np.stack([by_length[L] for L in ls], axis=1)  # (R, n_lengths)
        boot = (np.array([loglog_slope(ls, r) for r in reps]) if len(ls) > 1 and len(reps)
                else np.array([math.nan]))
        low, high = (np.nanquantile(boot, [0.025, 0.975]) if np.isfinite(boot).any()
                     else (math.nan, math.nan))
        rows.append({**common, "ranking": ranking, "mode": mode, "scoring": scoring,
                     "tau": tau, "slope": slope, "slope_low": float(low),
                     "slope_high": float(high), "n_lengths": len(ls),
                     "lengths": ",".join(str(x) for x in ls)})
    return pd.DataFrame(rows)


def _smallest(per_n: Mapping[int, np.ndarray], base: np.ndarray, tau: float,
              length: int) -> int:
    """The smallest evaluated N passing ``tau`` (the paper's "smallest tested pass")."""
    passing = [n for n, v in per_n.items() if _relative(v, base) <= tau]
    return min(passing) if passing else length

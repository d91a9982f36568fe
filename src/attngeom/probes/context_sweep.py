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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attngeom.capture import input_device
from attngeom.errors import ConfigError
from attngeom.interventions.selection import check_ranking, restriction
from attngeom.probes.qa import stable_nstar
from attngeom.probes.qa_probe import Selection

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


def context_sweep(model, windows: Mapping[int, torch.Tensor], *,
                  selections: Sequence[Selection] = (Selection(),),
                  taus: Sequence[float] = (0.01, 0.05, 0.10), tail: int = TAIL,
                  refine: int = 3, n_boot: int = 1000, seed: int = 0, batch_size: int = 4,
                  model_name: str = "model", corpus: str = "corpus", progress=None) -> dict:
    """N*_tau at every length of ``windows`` (length -> (D, L) ids), both scorings.

    Returns long tables ``context_nll`` (baseline per L and scoring), ``context_curve``
    (every N tried), ``context_nstar`` (N*_tau with its bootstrap interval) and
    ``context_slope`` (log-log slope of N* on L with its interval).
    """
    import pandas as pd

    from attngeom.interventions.nstar import search_nstar

    lengths = check_lengths(windows, tail)
    d = {int(windows[L].shape[0]) for L in lengths}
    if len(d) != 1:
        raise ConfigError(f"expected the same documents at every length, got counts {d}")
    for sel in selections:
        check_ranking(sel.ranking)
    say = progress or (lambda _m: None)
    n_docs = d.pop()
    draws = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, 0xC0])
                                  ).integers(0, n_docs, size=(int(n_boot), n_docs))
    common = {"model": model_name, "corpus": corpus, "n_documents": n_docs}
    rows_nll, rows_curve, rows_nstar = [], [], []
    replicates: dict[tuple, dict[int, np.ndarray]] = {}
    for length in lengths:
        ids = windows[length]
        say(f"context: L={length}, full model")
        base = dict(zip(("all", "tail"), document_nll(model, ids, tail=tail,
                                                      batch_size=batch_size), strict=True))
        for scoring in SCORINGS:
            rows_nll.append({**common, "length": length, "scoring": scoring,
                             "nll": float(base[scoring].mean())})
        for sel in selections:
            cache: dict[int, dict[str, np.ndarray]] = {}

            def fill(ns, sel=sel, cache=cache, ids=ids, length=length):
                for n in ns:
                    if n not in cache:
                        say(f"context: L={length}, {sel.label}, N={n}")
                        with restriction(model, int(n), ranking=sel.ranking,
                                         renormalize=sel.renormalize):
                            a, t = document_nll(model, ids, tail=tail, batch_size=batch_size)
                        cache[n] = {"all": a, "tail": t}

            for scoring in ("tail", "all"):
                def evaluate(ns, scoring=scoring, cache=cache, base=base, fill=fill):
                    fill(ns)
                    return [_relative(cache[n][scoring], base[scoring]) for n in ns]

                result = search_nstar(evaluate, taus, length=length, grid_max=length,
                                      refine=refine)
                keys = {**common, "length": length, "ranking": sel.ranking,
                        "mode": sel.mode, "scoring": scoring}
                # the search may have read Ns another scoring evaluated: all count
                per_n = {n: cache[n][scoring] for n in sorted(cache)}
                for n, values in per_n.items():
                    rows_curve.append({**keys, "n": n,
                                       "delta_rel": _relative(values, base[scoring])})
                for tau in taus:
                    rep = _replicate_nstar(base[scoring], per_n, float(tau), length, draws)
                    replicates.setdefault((sel.ranking, sel.mode, scoring, float(tau)),
                                          {})[length] = rep
                    low, high = np.quantile(rep, [0.025, 0.975])
                    rows_nstar.append({**keys, "tau": float(tau),
                                       "nstar": min(result.nstar[float(tau)],
                                                    _smallest(per_n, base[scoring], tau,
                                                              length)),
                                       "grid_nstar": result.grid_nstar[float(tau)],
                                       "nstar_stable": stable_nstar(
                                           {n: _relative(v, base[scoring])
                                            for n, v in per_n.items()}, float(tau), length),
                                       "nstar_low": float(low), "nstar_high": float(high),
                                       "evaluations": len(per_n),
                                       "monotone": result.monotone,
                                       "notes": " | ".join(result.notes)})
    nstar = pd.DataFrame(rows_nstar)
    rows_slope = []
    for (ranking, mode, scoring, tau), by_length in replicates.items():
        sub = nstar[(nstar.ranking == ranking) & (nstar["mode"] == mode)
                    & (nstar.scoring == scoring) & (nstar.tau == tau)].sort_values("length")
        slope = loglog_slope(sub["length"], sub["nstar"])
        ls = sorted(by_length)
        reps = np.stack([by_length[L] for L in ls], axis=1)  # (R, n_lengths)
        boot = np.array([loglog_slope(ls, r) for r in reps]) if len(ls) > 1 else \
            np.array([math.nan])
        low, high = (np.nanquantile(boot, [0.025, 0.975]) if np.isfinite(boot).any()
                     else (math.nan, math.nan))
        rows_slope.append({**common, "ranking": ranking, "mode": mode, "scoring": scoring,
                           "tau": tau, "slope": slope, "slope_low": float(low),
                           "slope_high": float(high), "n_lengths": len(ls),
                           "lengths": ",".join(str(x) for x in ls)})
    return {"context_nll": pd.DataFrame(rows_nll), "context_curve": pd.DataFrame(rows_curve),
            "context_nstar": nstar, "context_slope": pd.DataFrame(rows_slope)}


def _smallest(per_n: Mapping[int, np.ndarray], base: np.ndarray, tau: float,
              length: int) -> int:
    """The smallest evaluated N passing ``tau`` (the paper's "smallest tested pass")."""
    passing = [n for n, v in per_n.items() if _relative(v, base) <= tau]
    return min(passing) if passing else length

"""Run the qa1 probe on a model: answers, support statistics, N* (issue 31).

``qa_probe(model, tokenizer, examples_by_background, ...)`` returns long tables:

- ``qa_answers``: per background, accuracy (Wilson interval) and mean answer loss
  (bootstrap interval over examples), the competence screen (accuracy >= 1/6 + 0.05 and
  loss <= log 6 - 0.05; reported for every background, the paper's screen is the one at
  no background, and it never hides a row), the scoring rule and the prompt format;
- ``qa_examples``: one row per example and background (loss, prediction, sizes);
- ``qa_support``: per background, score (attention or contribution), statistic, split
  (all, correct, incorrect), layer and head: the mean over examples and its bootstrap
  interval; ``qa_support_summary`` the same averaged over every layer and head of an
  example first (equal weight per head, then per example: the paper's aggregation);
- ``qa_curve``: per background and selection, every N tried and the mean answer-loss
  increase over examples with its bootstrap interval;
- ``qa_nstar``: N*_tau per background and selection (tau in nats), from the adaptive
  search of ``attngeom.interventions.nstar``; its bootstrap interval over examples.

The support statistics come from the capture path (``capture_attention`` at the answer
query only, one row per layer), computed layer by layer and dropped: no attention matrix
of the prompt is kept. One forward per example gives both the answer and the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attngeom.capture import capture_attention, input_device, model_layout
from attngeom.core.stats import bootstrap_mean_ci
from attngeom.core.support import STATISTICS, contribution_scores, support_statistics
from attngeom.errors import ConfigError
from attngeom.interventions.selection import check_ranking, restriction
from attngeom.probes.qa import (
    Candidates,
    QAExample,
    answer_loss,
    candidate_prefix,
    candidate_scores,
    candidate_tokens,
    screen,
    stable_nstar,
)

SCORES = ("attention", "contribution")
SPLITS = ("all", "correct", "incorrect")


@dataclass(frozen=True)
class Selection:
    """One way of keeping N keys: a ranking and deletion or renormalisation."""

    ranking: str = "attention"
    renormalize: bool = False

    @property
    def mode(self) -> str:
        return "renormalisation" if self.renormalize else "deletion"

    @property
    def label(self) -> str:
        return f"{self.ranking}/{self.mode}"


@dataclass
class FullPass:
    """The unmodified model on a set of examples."""

    loss: np.ndarray  # (E,)
    predicted: np.ndarray  # (E,) candidate index
    correct: np.ndarray  # (E,) bool
    support: dict[str, np.ndarray]  # "<score>/<statistic>" -> (E, L, H)


def _answer_index(example: QAExample, candidates: Candidates) -> int:
    try:
        return candidates.names.index(example.answer)
    except ValueError:
        raise ConfigError(f"answer {example.answer!r} is not one of the candidates "
                          f"{list(candidates.names)}") from None


def full_pass(model, examples: Sequence[QAExample], candidates: Candidates, *,
              scores: Sequence[str] = SCORES) -> FullPass:
    """Answers and support statistics of the unmodified model, one forward per example."""
    layout = model_layout(model)
    device = input_device(model)
    e, n_layers, n_heads = len(examples), layout.num_layers, layout.num_heads
    support = {f"{s}/{stat}": np.full((e, n_layers, n_heads), np.nan)
               for s in scores for stat in STATISTICS}
    loss = np.empty(e)
    predicted = np.empty(e, dtype=np.int64)
    for i, ex in enumerate(examples):
        length = ex.length

        def consume(cap, i=i, ex=ex, length=length) -> None:
            alpha = cap.alpha[0, :, 0, :length].detach().to(torch.float64)  # (H, T)
            for s in scores:
                r = alpha if s == "attention" else contribution_scores(
                    alpha, cap.values[0, :, :length])
                stats = support_statistics(r, list(ex.support), list(ex.context), alpha=alpha)
                for stat, value in stats.as_dict().items():
                    support[f"{s}/{stat}"][i, cap.layer] = value.cpu().numpy()

        with torch.no_grad(), capture_attention(model, consume, query_rows=[length - 1]):
            values = candidate_scores(model, ex, candidates, device)
        loss[i], predicted[i] = answer_loss(values, _answer_index(ex, candidates))
    answers = np.array([_answer_index(ex, candidates) for ex in examples])
    return FullPass(loss=loss, predicted=predicted, correct=predicted == answers,
                    support=support)


def restricted_losses(model, examples: Sequence[QAExample], candidates: Candidates, n: int,
                      selection: Selection) -> tuple[np.ndarray, np.ndarray]:
    """(E,) answer loss and (E,) bool correctness with N keys kept per query row."""
    device = input_device(model)
    out = np.empty(len(examples))
    correct = np.empty(len(examples), dtype=bool)
    with torch.no_grad(), restriction(model, n, ranking=selection.ranking,
                                      renormalize=selection.renormalize):
        for i, ex in enumerate(examples):
            values = candidate_scores(model, ex, candidates, device)
            answer = _answer_index(ex, candidates)
            out[i], predicted = answer_loss(values, answer)
            correct[i] = predicted == answer
    return out, correct


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _search():
    try:
        from attngeom.interventions.nstar import search_nstar
    except ImportError:  # the adaptive search is another helper's module
        raise ConfigError("N* needs attngeom.interventions.nstar.search_nstar, which this "
                          "attngeom lacks; run with nstar=False") from None
    return search_nstar


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float, int]:
    m, lo, hi, n = bootstrap_mean_ci(np.asarray(values, dtype=np.float64)[None, :],
                                     n_boot=n_boot, seed=seed)
    return float(m[0]), float(lo[0]), float(hi[0]), int(n[0])


def _split_mask(split: str, correct: np.ndarray) -> np.ndarray:
    if split == "all":
        return np.ones_like(correct, dtype=bool)
    return correct if split == "correct" else ~correct


def qa_probe(model, tokenizer, examples: Mapping[int, Sequence[QAExample]], *,
             selections: Sequence[Selection] = (Selection(),),
             positional: bool = True, taus: Sequence[float] = (0.10, 0.20),
             nstar: bool = True, grid_max: int = 256, refine: int = 3,
             extend: bool = True, scores: Sequence[str] = SCORES, n_boot: int = 1000,
             seed: int = 0, model_name: str = "model", progress=None) -> dict:
    """The qa1 probe over backgrounds; returns the tables named in the module docstring.

    ``examples``: background (tokens) -> its examples (``build_examples`` or
    ``load_babilong``). ``selections``: the restrictions N* is searched for;
    ``positional`` adds the positional control (deletion). ``extend``: past the grid
    bisect up to the longest prompt (the paper's adaptive extensions; the prompt length
    passes by definition); otherwise "> grid_max" (``nstar`` empty) when nothing passes.
    """
    import pandas as pd

    if not examples or any(len(v) == 0 for v in examples.values()):
        raise ConfigError("expected examples for at least one background, got an empty "
                          "episode set")
    for s in scores:
        if s not in SCORES:
            raise ConfigError(f"expected scores in {list(SCORES)}, got {s!r}")
    chosen = list(selections) + ([Selection("positional", False)] if positional else [])
    for sel in chosen:
        check_ranking(sel.ranking)
    fmt = sorted({ex.prompt_format for v in examples.values() for ex in v})
    if len(fmt) != 1:
        raise ConfigError(f"expected examples of one prompt format, got {fmt}")
    openings = sorted({ex.answer_prefix for v in examples.values() for ex in v})
    if len(openings) > 1:
        raise ConfigError(f"expected one answer prefix for every example, got {openings}")
    candidates = candidate_tokens(tokenizer, prefix=candidate_prefix(fmt[0], openings[0]))
    rows_answers, rows_examples, rows_support, rows_summary = [], [], [], []
    rows_curve, rows_nstar = [], []
    common = {"model": model_name, "prompt_format": ",".join(fmt)}
    for background in sorted(examples):
        exs = list(examples[background])
        say = progress or (lambda _m: None)
        say(f"qa: background {background}, {len(exs)} examples, full model")
        base = full_pass(model, exs, candidates, scores=scores)
        n = len(exs)
        k = int(base.correct.sum())
        lo, hi = wilson(k, n)
        loss_m, loss_lo, loss_hi, _ = _mean_ci(base.loss, n_boot, seed)
        rows_answers.append({**common, "background": background, "n_examples": n,
                             "accuracy": k / n, "accuracy_low": lo, "accuracy_high": hi,
                             "loss": loss_m, "loss_low": loss_lo, "loss_high": loss_hi,
                             "screen": screen(k / n, loss_m, len(candidates.names)),
                             "scoring": candidates.rule,
                             "candidate_prefix": repr(candidates.prefix),
                             "prompt_tokens": float(np.mean([e.length for e in exs])),
                             "background_tokens": float(np.mean([e.background_tokens
                                                                 for e in exs]))})
        for i, ex in enumerate(exs):
            rows_examples.append({**common, "background": background, "episode": ex.episode,
                                  "answer": ex.answer,
                                  "predicted": candidates.names[base.predicted[i]],
                                  "correct": bool(base.correct[i]), "loss": base.loss[i],
                                  "prompt_tokens": ex.length, "support_tokens": len(ex.support),
                                  "nonsupport_tokens": len(ex.context) - len(ex.support),
                                  "background_tokens": ex.background_tokens})
        _support_rows(base, background, common, n_boot, seed, rows_support, rows_summary)
        if not nstar:
            continue
        length = max(e.length for e in exs)
        for sel in chosen:
            say(f"qa: background {background}, N* for {sel.label}")
            curve, found = _nstar_rows(model, exs, candidates, base.loss, sel, taus,
                                       length=length, grid_max=grid_max, refine=refine,
                                       extend=extend, n_boot=n_boot, seed=seed)
            extra = {**common, "background": background}
            rows_curve.extend({**extra, **r} for r in curve)
            rows_nstar.extend({**extra, **r} for r in found)
    frames = {
        "qa_answers": pd.DataFrame(rows_answers),
        "qa_examples": pd.DataFrame(rows_examples),
        "qa_support": pd.DataFrame(rows_support),
        "qa_support_summary": pd.DataFrame(rows_summary),
        "qa_curve": pd.DataFrame(rows_curve),
        "qa_nstar": pd.DataFrame(rows_nstar),
    }
    return frames


def _nstar_rows(model, exs, candidates, base_loss, sel: Selection, taus, *, length: int,
                grid_max: int, refine: int, extend: bool, n_boot: int, seed: int):
    """The adaptive search for one selection: (curve rows, N* rows)."""
    search_nstar = _search()
    per_n: dict[int, np.ndarray] = {}
    right: dict[int, np.ndarray] = {}

    def evaluate(ns):
        out = []
        for size in ns:
            losses, ok = restricted_losses(model, exs, candidates, int(size), sel)
            per_n[int(size)], right[int(size)] = losses, ok
            out.append(float(np.mean(losses - base_loss)))
        return out

    # N >= the longest prompt restricts nothing (a pass by definition); within the grid
    # that endpoint is the paper's too, past it only with ``extend``
    endpoint = extend or length <= grid_max
    result = search_nstar(evaluate, taus, length=length, grid_max=grid_max, refine=refine,
                          endpoint=endpoint)
    keys = {"ranking": sel.ranking, "mode": sel.mode}
    curve = []
    for size in sorted(per_n):
        m, lo, hi, _ = _mean_ci(per_n[size] - base_loss, n_boot, seed)
        curve.append({**keys, "n": size, "delta_loss": m, "delta_low": lo, "delta_high": hi,
                      "accuracy": float(np.mean(right[size]))})
    intervals = _nstar_intervals(base_loss, per_n, taus, length if endpoint else None,
                                 n_boot, seed)
    found = [{**keys, "tau": float(tau), "nstar": _number(result.nstar[float(tau)]),
              "grid_nstar": _number(result.grid_nstar[float(tau)]),
              "nstar_stable": _number(stable_nstar(result.evaluations, float(tau),
                                                   length if endpoint else None)),
              "nstar_low": intervals[float(tau)][0], "nstar_high": intervals[float(tau)][1],
              "evaluations": len(result.evaluations), "prompt_tokens_max": length,
              "monotone": result.monotone, "notes": " | ".join(result.notes)}
             for tau in taus]
    return curve, found


def _number(n: int | None) -> float:
    """An N* as a float column value: NaN where nothing tried passed ("> grid_max")."""
    return math.nan if n is None else float(n)


def _nstar_intervals(base: np.ndarray, per_n: Mapping[int, np.ndarray], taus,
                     length: int | None, n_boot: int, seed: int) -> dict:
    from attngeom.interventions.nstar import bootstrap_nstar

    if not per_n:
        return {float(t): (math.nan, math.nan) for t in taus}
    return bootstrap_nstar(base, per_n, taus, length=length, relative=False,
                           replicates=n_boot, seed=seed)


def _support_rows(base: FullPass, background: int, common: dict, n_boot: int, seed: int,
                  rows: list, summary: list) -> None:
    for key, values in base.support.items():
        score, statistic = key.split("/")
        e, n_layers, n_heads = values.shape
        for split in SPLITS:
            mask = _split_mask(split, base.correct)
            masked = np.where(mask[:, None, None], values, np.nan)  # (E, L, H)
            grid = masked.reshape(e, -1).T  # (L*H, E)
            m, lo, hi, cnt = bootstrap_mean_ci(grid, n_boot=n_boot, seed=seed)
            for idx in range(n_layers * n_heads):
                rows.append({**common, "background": background, "score": score,
                             "statistic": statistic, "split": split,
                             "layer": idx // n_heads, "head": idx % n_heads,
                             "mean": m[idx], "ci_low": lo[idx], "ci_high": hi[idx],
                             "n_examples": int(cnt[idx])})
            # equal weight per head within an example, then per example
            per_example = np.where(mask, values.reshape(e, -1).mean(axis=1), np.nan)
            sm, slo, shi, scnt = bootstrap_mean_ci(per_example[None, :], n_boot=n_boot,
                                                   seed=seed)
            summary.append({**common, "background": background, "score": score,
                            "statistic": statistic, "split": split, "mean": float(sm[0]),
                            "ci_low": float(slo[0]), "ci_high": float(shi[0]),
                            "n_examples": int(scnt[0])})

"""The qa1 probe on the engine: answers, support statistics, N* (issue 31, 37).

``prepare_qa(ctx)`` builds every prompt before the model loads (tokenizer only: a
background that does not fit the model's positions is one line then); ``run_qa(ctx)``
computes the tables as resumable units (``RunContext.run_units``):

- stage ``qa``: per background, blocks of ``batch_size`` examples: the unmodified
  model's answers and support statistics (one forward per example, the support rows
  captured at the answer query only);
- stages ``qa-search-1``, ``qa-search-2``, ...: the N* searches of every (background,
  selection) in lockstep (``interventions.nstar.lockstep``), one stage per round; a
  round's unit is one block of examples, restricted under every (selection, N) its
  background asked for in the round;
- stage ``qa-budgets``: every selection at the budgets (``--budgets``) and at its N*,
  where the searches did not evaluate them already (issue 39).

Every restricted evaluation also reads, through a ``restriction.KeptRow``, the keys the
restriction keeps at the answer query of every layer, before the deletion: the support
recall of the kept set.

A killed run resumes from its finished units with the same command and ends with the
same tables; under ``torchrun`` the processes share the units. The tables:

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
- ``qa_nstar``: N*_tau per background and selection (tau in nats), its bootstrap
  interval over examples, and the search rule that ran;
- ``qa_budget``: per background, selection and N (each budget, each tau's N*): accuracy,
  answer-loss increase and the support recall of the kept set at the answer query (the
  share of the support tokens kept, averaged over layers and heads, then over examples),
  each with its interval over examples.
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
from attngeom.engine.runner import RunContext, Unit
from attngeom.errors import ConfigError, RunDirError
from attngeom.interventions.nstar import both_rules, search_rounds, stable_nstar
from attngeom.interventions.restriction import WindowIds
from attngeom.interventions.selection import Selection, restriction
from attngeom.names import MODEL_RULES, RANKINGS, STEPS
from attngeom.probes import qa
from attngeom.probes.qa import Candidates, QAExample, answer_loss, candidate_scores, screen

SCORES = MODEL_RULES  # the support statistics rank keys by attention and by contribution
SPLITS = ("all", "correct", "incorrect")


@dataclass(frozen=True)
class QAInputs:
    """What ``prepare_qa`` built: the examples of every background, the candidates, the
    prompt format chosen and what the manifest records of them."""

    examples: dict[int, list[QAExample]]
    candidates: Candidates
    prompt_format: str
    corpus: str
    selections: tuple[Selection, ...]
    record: dict


@dataclass
class FullPass:
    """The unmodified model on a set of examples."""

    loss: np.ndarray  # (E,)
    predicted: np.ndarray  # (E,) candidate index
    correct: np.ndarray  # (E,) bool
    support: dict[str, np.ndarray]  # "<score>/<statistic>" -> (E, L, H)

    @classmethod
    def concat(cls, parts: Sequence[FullPass]) -> FullPass:
        """The passes of consecutive blocks of examples as one."""
        return cls(loss=np.concatenate([p.loss for p in parts]),
                   predicted=np.concatenate([p.predicted for p in parts]),
                   correct=np.concatenate([p.correct for p in parts]),
                   support={k: np.concatenate([p.support[k] for p in parts])
                            for k in parts[0].support})


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


@dataclass
class Restricted:
    """The examples under one selection at one N: answer loss, correctness and the
    support recall of the kept set at the answer query (mean over layers and heads)."""

    loss: np.ndarray  # (E,)
    correct: np.ndarray  # (E,) bool
    recall: np.ndarray  # (E,)

    @classmethod
    def concat(cls, parts: Sequence[Restricted]) -> Restricted:
        """The evaluations of consecutive blocks of examples as one."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("loss", "correct", "recall")))


class _SupportKept:
    """The consumer of a ``KeptRow`` at one example's answer query: per layer and head, the
    share of the support tokens the selection keeps (batch row 0: a scoring batch's rows
    share the prompt, so their kept sets at its last position are the same)."""

    def __init__(self, support: Sequence[int], layers: int, heads: int) -> None:
        self.support = torch.as_tensor(list(support), dtype=torch.long)
        # a layer the restriction never reports restricted nothing: every visible key, the
        # support among them (it precedes the question), is kept
        self.shares = np.ones((layers, heads))

    def __call__(self, layer: int, keep: torch.Tensor) -> None:
        kept = keep[0].index_select(-1, self.support.to(keep.device))  # (H, k)
        self.shares[layer] = kept.to(torch.float64).mean(-1).cpu().numpy()


def restricted_losses(model, examples: Sequence[QAExample], candidates: Candidates, n: int,
                      selection: Selection, *, seed: int = 0) -> Restricted:
    """The examples with N keys kept per query row (the random ranking's order seeded by
    ``seed`` and each example's episode): answer loss, correctness, and the support recall
    of the kept set at the answer query (the restriction's own keep mask there, read by a
    ``KeptRow`` before the deletion), averaged over layers and heads (the support
    statistics' aggregation)."""
    from attngeom.interventions.restriction import KeptRow

    device = input_device(model)
    layout = model_layout(model)
    out = np.empty(len(examples))
    correct = np.empty(len(examples), dtype=bool)
    recall = np.empty(len(examples))
    ids = WindowIds()
    for i, ex in enumerate(examples):
        ids.set([ex.episode])
        kept = _SupportKept(ex.support, layout.num_layers, layout.num_heads)
        with torch.no_grad(), restriction(model, n, ranking=selection.ranking,
                                          renormalize=selection.renormalize, seed=seed,
                                          windows=ids, observe=KeptRow(kept, ex.length - 1)):
            values = candidate_scores(model, ex, candidates, device)
        answer = _answer_index(ex, candidates)
        out[i], predicted = answer_loss(values, answer)
        correct[i] = predicted == answer
        recall[i] = float(kept.shares.mean())
    return Restricted(out, correct, recall)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def _mean_ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float, int]:
    m, lo, hi, n = bootstrap_mean_ci(np.asarray(values, dtype=np.float64)[None, :],
                                     n_boot=n_boot, seed=seed)
    return float(m[0]), float(lo[0]), float(hi[0]), int(n[0])


def _split_mask(split: str, correct: np.ndarray) -> np.ndarray:
    if split == "all":
        return np.ones_like(correct, dtype=bool)
    return correct if split == "correct" else ~correct


def prepare_qa(ctx: RunContext) -> QAInputs:
    """Every prompt of the run, tokenised and checked against the model's positions
    before the model loads (``ctx.shape``); the examples are the same whoever runs them."""
    from attngeom.corpora.documents import probe_corpus, probe_documents

    cfg = ctx.config
    fmt = cfg.prompt_format
    has_template = bool(getattr(ctx.tokenizer, "chat_template", None))
    if fmt == "chat" and not has_template:
        raise ConfigError(f"prompt_format: chat asked, but {ctx.model_label}'s tokenizer "
                          "has no chat template (use plain or auto)")
    if fmt == "auto":
        fmt = "chat" if has_template else "plain"
    limit = ctx.shape.max_positions if ctx.shape is not None else None
    record: dict = {}
    if cfg.babilong is not None:
        rows, dropped = qa.load_babilong(ctx.tokenizer, source=cfg.babilong,
                                         prompt_format=fmt, n=cfg.n_episodes,
                                         max_positions=limit, answer_prefix=cfg.answer_prefix)
        examples = {rows[0].background: rows}
        corpus = f"BABILong {cfg.babilong}"
        record["babilong_left_out"] = dropped
    else:
        episodes = qa.generate_episodes(cfg.n_episodes, facts=tuple(cfg.facts), seed=cfg.seed)
        wanted = cfg.backgrounds or cfg.DEFAULT_BACKGROUNDS
        sentences, corpus = [], "none"
        if any(b > 0 for b in wanted):
            docs, corpus = probe_documents(probe_corpus(cfg.corpus))
            sentences = qa.background_sentences(docs)
        examples = {}
        for b in wanted:
            try:
                examples[int(b)] = qa.build_examples(
                    episodes, ctx.tokenizer, int(b), sentences=sentences, prompt_format=fmt,
                    seed=cfg.seed, max_positions=limit, answer_prefix=cfg.answer_prefix)
            except ConfigError:
                if cfg.backgrounds is not None:  # asked for: its one line stands
                    raise
                record.setdefault("backgrounds_left_out", []).append(int(b))
        if not examples:
            raise ConfigError(f"backgrounds: no default background fits the model's {limit} "
                              "positions; pass --backgrounds")
    candidates = qa.candidate_tokens(ctx.tokenizer,
                                     prefix=qa.candidate_prefix(fmt, cfg.answer_prefix))
    selections = tuple(Selection(r, bool(f)) for r in cfg.rankings for f in cfg.renormalize)
    if cfg.positional and Selection("positional", False) not in selections:
        selections += (Selection("positional", False),)
    record.update({
        "backgrounds": sorted(examples), "episodes": {str(b): len(v) for b, v in
                                                      sorted(examples.items())},
        "prompt_tokens_max": {str(b): max(e.length for e in v)
                              for b, v in sorted(examples.items())},
        "background_tokens_mean": {str(b): float(np.mean([e.background_tokens for e in v]))
                                   for b, v in sorted(examples.items())},
        "background_corpus": corpus, "prompt_format": fmt})
    return QAInputs(examples=examples, candidates=candidates, prompt_format=fmt,
                    corpus=corpus, selections=selections, record=record)


def _blocks(inputs: QAInputs, size: int) -> list[Unit]:
    """The probe's units: per background, consecutive blocks of ``size`` examples
    (``windows`` holds (background, example indices); ``ids`` names them in the shard)."""
    units = []
    for b in sorted(inputs.examples):
        n = len(inputs.examples[b])
        for start in range(0, n, size):
            idx = tuple(range(start, min(n, start + size)))
            units.append(Unit(len(units), (b, idx), ids=(b, *idx)))
    return units


def run_qa(ctx: RunContext) -> dict:
    """The qa tables (module docstring) from the prepared inputs, unit by unit."""

    cfg, inputs = ctx.config, ctx.inputs
    model, cands = ctx.model, inputs.candidates
    units = _blocks(inputs, cfg.batch_size)

    def examples_of(unit: Unit) -> list[QAExample]:
        b, idx = unit.windows
        return [inputs.examples[b][i] for i in idx]

    parts: dict[int, list[FullPass]] = {b: [] for b in inputs.examples}
    for unit, part in zip(units, ctx.run_units(
            "qa", units, lambda u: full_pass(model, examples_of(u), cands),
            desc=f"qa: answers and support ({sum(map(len, inputs.examples.values()))} "
                 "prompts)", unit="prompt", weight=lambda u: len(u.windows[1])), strict=True):
        parts[unit.windows[0]].append(part)
    base = {b: FullPass.concat(p) for b, p in parts.items()}
    ctx.counts["qa_examples"] = sum(len(v) for v in inputs.examples.values())
    frames = _answer_tables(inputs, base, cfg.bootstrap, cfg.seed)
    evals = _Evaluations(ctx, units, examples_of)
    found: dict = {}
    if cfg.nstar:
        searched, found = _search_tables(ctx, evals, base)
        frames.update(searched)
    frames.update(_budget_table(ctx, evals, base, found))
    return frames


def _answer_tables(inputs: QAInputs, base: Mapping[int, FullPass], n_boot: int,
                   seed: int) -> dict:
    import pandas as pd

    rows_answers, rows_examples, rows_support, rows_summary = [], [], [], []
    cands = inputs.candidates
    common = {"prompt_format": inputs.prompt_format}
    for background in sorted(inputs.examples):
        exs, full = inputs.examples[background], base[background]
        n, k = len(exs), int(full.correct.sum())
        lo, hi = wilson(k, n)
        loss_m, loss_lo, loss_hi, _ = _mean_ci(full.loss, n_boot, seed)
        rows_answers.append({**common, "background": background, "n_examples": n,
                             "accuracy": k / n, "accuracy_low": lo, "accuracy_high": hi,
                             "loss": loss_m, "loss_low": loss_lo, "loss_high": loss_hi,
                             "screen": screen(k / n, loss_m, len(cands.names)),
                             "scoring": cands.rule, "candidate_prefix": repr(cands.prefix),
                             "prompt_tokens": float(np.mean([e.length for e in exs])),
                             "background_tokens": float(np.mean([e.background_tokens
                                                                 for e in exs]))})
        for i, ex in enumerate(exs):
            rows_examples.append({**common, "background": background, "episode": ex.episode,
                                  "answer": ex.answer,
                                  "predicted": cands.names[full.predicted[i]],
                                  "correct": bool(full.correct[i]), "loss": full.loss[i],
                                  "prompt_tokens": ex.length, "support_tokens": len(ex.support),
                                  "nonsupport_tokens": len(ex.context) - len(ex.support),
                                  "background_tokens": ex.background_tokens})
        _support_rows(full, background, common, n_boot, seed, rows_support, rows_summary)
    return {"qa_answers": pd.DataFrame(rows_answers),
            "qa_examples": pd.DataFrame(rows_examples),
            "qa_support": pd.DataFrame(rows_support),
            "qa_support_summary": pd.DataFrame(rows_summary)}


class _Evaluations:
    """Every (background, selection, N) evaluated on every example, shared by the N*
    searches and the budgets: ``run(stage, asked)`` evaluates what is not known yet as one
    stage of units (a unit: one block of examples under every (selection, N) its
    background asked for), ``at(b, s, n)`` reads it back."""

    def __init__(self, ctx: RunContext, units: list[Unit], examples_of) -> None:
        self.ctx, self.units, self.examples_of = ctx, units, examples_of
        self.known: dict[tuple[int, int, int], Restricted] = {}

    def floor(self, s: int) -> int:
        """The smallest N selection ``s`` can keep: its ranking's fixed part (``window``'s
        sinks, ``quest``'s page, ``snapkv``'s observation window), 1 otherwise."""
        ranking = self.ctx.inputs.selections[s].ranking
        return max(1, int((RANKINGS.meta(ranking) or {}).get("fixed", 0)))

    def run(self, stage: str, desc: str, asked: Sequence[tuple[int, int, int]]) -> None:
        asked = sorted({a for a in asked if a not in self.known})
        if not asked:
            return
        ctx, inputs = self.ctx, self.ctx.inputs

        def process(unit: Unit) -> dict:
            b = unit.windows[0]
            exs = self.examples_of(unit)
            mine = [(s, n) for bb, s, n in asked if bb == b]
            out = {"asked": mine}
            for s, n in mine:
                out[(s, n)] = restricted_losses(ctx.model, exs, inputs.candidates, n,
                                                inputs.selections[s], seed=ctx.config.seed)
            return out

        got: dict[tuple, list] = {}
        for unit, part in zip(self.units, ctx.run_units(
                stage, self.units, process, unit="prompt", desc=f"{desc} ({len(asked)} "
                "settings)", weight=lambda u: len(u.windows[1]) * sum(
                    1 for b, _, _ in asked if b == u.windows[0])), strict=True):
            b = unit.windows[0]
            if part["asked"] != [(s, n) for bb, s, n in asked if bb == b]:
                raise RunDirError(f"{stage}: a shard holds other settings than this run "
                                  "asks; rerun with --overwrite")
            for s, n in part["asked"]:
                got.setdefault((b, s, n), []).append(part[(s, n)])
        for key, chunks in got.items():
            self.known[key] = Restricted.concat(chunks)

    def at(self, b: int, s: int, n: int) -> Restricted:
        return self.known[(b, s, n)]

    def losses(self, b: int, s: int) -> dict[int, np.ndarray]:
        """N -> (E,) answer losses of every N evaluated for (background, selection)."""
        return {n: r.loss for (bb, ss, n), r in sorted(self.known.items())
                if (bb, ss) == (b, s)}


def _search_tables(ctx: RunContext, evals: _Evaluations, base) -> tuple[dict, dict]:
    """The N* searches of every (background, selection), in lockstep rounds of units; an N
    below a selection's fixed part (``_Evaluations.floor``) is no size it can keep: it
    fails every tau without a forward and is left out of the curve. Returns the tables
    and each (background, selection)'s search."""
    import pandas as pd

    cfg, inputs = ctx.config, ctx.inputs
    taus = cfg.effective_taus
    length = {b: max(e.length for e in v) for b, v in inputs.examples.items()}
    keys = [(b, s) for b in sorted(inputs.examples) for s in range(len(inputs.selections))]

    def measure(rnd: int, pairs: list) -> dict:
        evals.run(f"qa-search-{rnd + 1}", f"qa: N* search round {rnd + 1}",
                  [(b, s, n) for (b, s), n in pairs if n >= evals.floor(s)])
        return {((b, s), n): float(np.mean(evals.at(b, s, n).loss - base[b].loss))
                if n >= evals.floor(s) else math.inf for (b, s), n in pairs}

    def make(key: tuple, rule: str):
        return search_rounds(taus, length=length[key[0]], grid_max=cfg.grid_max, refine=3,
                             step=rule)

    found, rules = both_rules(make, keys, measure, cfg.step)
    rows_curve, rows_nstar = [], []
    for (b, s), result in found.items():
        sel = inputs.selections[s]
        keys = {"prompt_format": inputs.prompt_format, "background": b,
                "ranking": sel.ranking, "mode": sel.mode}
        per_n = evals.losses(b, s)
        for n, loss in per_n.items():
            m, lo, hi, _ = _mean_ci(loss - base[b].loss, cfg.bootstrap, cfg.seed)
            rows_curve.append({**keys, "n": n, "delta_loss": m, "delta_low": lo,
                               "delta_high": hi,
                               "accuracy": float(np.mean(evals.at(b, s, n).correct))})
        intervals = _nstar_intervals(base[b].loss, per_n, taus, length[b], cfg.bootstrap,
                                     cfg.seed)
        for tau in taus:
            rows_nstar.append({
                **keys, "tau": float(tau), "nstar": _number(result.nstar[float(tau)]),
                "grid_nstar": _number(result.grid_nstar[float(tau)]),
                "nstar_stable": _number(stable_nstar(result.evaluations, float(tau),
                                                     length[b])),
                "nstar_low": intervals[float(tau)][0], "nstar_high": intervals[float(tau)][1],
                "evaluations": sum(1 for n in result.evaluations if n >= evals.floor(s)),
                "prompt_tokens_max": length[b],
                "search": cfg.step, "monotone": result.monotone,
                **{f"nstar_{rule}": _number(rules[(b, s)][rule][float(tau)]) for rule in STEPS},
                "notes": " | ".join(result.notes)})
    return ({"qa_curve": pd.DataFrame(rows_curve), "qa_nstar": pd.DataFrame(rows_nstar)},
            found)


def _budget_table(ctx: RunContext, evals: _Evaluations, base, found: Mapping) -> dict:
    """``qa_budget``: every selection at every budget N (``--budgets``) and at each tau's
    N*, per background: accuracy, answer-loss increase and the support recall of the kept
    set at the answer query, each with its interval over examples. The Ns the N* search
    evaluated are read back, the others run as one stage of units (``qa-budgets``); a
    budget below a selection's fixed part is left out (an explicit one is refused before
    the model loads)."""
    import pandas as pd

    cfg, inputs = ctx.config, ctx.inputs
    plan: dict[tuple[int, int], dict[int, list[str]]] = {}
    for b in sorted(inputs.examples):
        for s in range(len(inputs.selections)):
            roles = plan.setdefault((b, s), {})
            for n in cfg.budgets:
                if n >= evals.floor(s):
                    roles.setdefault(int(n), []).append("budget")
            search = found.get((b, s))
            for tau in cfg.effective_taus if search is not None else ():
                n = search.nstar[float(tau)]
                if n is not None:
                    roles.setdefault(int(n), []).append(f"nstar {tau:g}")
    evals.run("qa-budgets", "qa: budgets and N*", [(b, s, n) for (b, s), roles in
                                                    plan.items() for n in roles])
    rows = []
    for (b, s), roles in plan.items():
        sel = inputs.selections[s]
        for n in sorted(roles):
            got = evals.at(b, s, n)
            k, e = int(got.correct.sum()), len(got.correct)
            lo, hi = wilson(k, e)
            d, d_lo, d_hi, _ = _mean_ci(got.loss - base[b].loss, cfg.bootstrap, cfg.seed)
            r, r_lo, r_hi, _ = _mean_ci(got.recall, cfg.bootstrap, cfg.seed)
            rows.append({"prompt_format": inputs.prompt_format, "background": b,
                         "ranking": sel.ranking, "mode": sel.mode, "n": n,
                         "budget": "budget" in roles[n],
                         "nstar_taus": ",".join(x.split()[1] for x in roles[n]
                                                if x.startswith("nstar")),
                         "n_examples": e, "accuracy": k / e, "accuracy_low": lo,
                         "accuracy_high": hi, "delta_loss": d, "delta_low": d_lo,
                         "delta_high": d_hi, "support_recall": r, "recall_low": r_lo,
                         "recall_high": r_hi})
    return {"qa_budget": pd.DataFrame(rows)}


def _number(n: int | None) -> float:
    """An N* as a float column value: NaN where nothing tried passed ("> grid_max")."""
    return math.nan if n is None else float(n)


def _nstar_intervals(base: np.ndarray, per_n: Mapping[int, np.ndarray], taus,
                     length: int | None, n_boot: int, seed: int) -> dict:
    from attngeom.interventions.nstar import bootstrap_nstar

    if not per_n or n_boot < 1:
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

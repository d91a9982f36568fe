"""``competition --probe kept``: the geometry of what each selection keeps (issue 39, item 4).

The follow-up measures how separable the top-N oracle's set is (F_N against a random
set); this asks the same of the sets practical selections keep. On corpus windows (the
fixed-length document protocol at each of ``--lengths``, nested as the context probe
cuts them), at each window's final query, per layer and head, for every ranking of
``--rankings`` (the oracle, ``attention``, always joins) and every N of ``--budgets``:

- the kept set I: the keys the ranking keeps at budget N, exactly as ``restrict_topn``
  keeps them at that row of an *unrestricted* layer (``final_keep``: the same scores,
  policies and tie rules). The greedy policies (h2o, tova) and snapkv read every earlier
  row's probabilities, and they see the model's own, unrestricted ones: the cache a policy
  deployed on this model would have built while it read the window (its own evictions
  change what it holds, not the attention it observes); quest and knorm read the call's
  query and key states. Nothing is restricted: the forward is the model's own;
- overlap |I ∩ Top_N| / N with the oracle's top-N;
- P_N, R_N, F_N of I (``core.kept``, N = |I|) and F_N of its random control, the first
  |I| keys of the analysis' random order of the row (``REPEATS`` draws, as ``analyze``
  draws for final queries), in the full universe with the Euclidean distance.

On the engine: ``prepare_kept`` cuts the windows before the model loads; stage ``kept``
has one unit per (length, block of ``batch_size`` documents), one forward each, so a
killed run resumes from its finished units. Tables: ``kept_geometry`` (per length,
layer, head, ranking, N: means over windows) and ``kept_summary`` (per length, ranking,
N: each window's mean over layers and heads, then the mean over windows with a
bootstrap interval over windows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attngeom.capture import AttentionCall, input_device, override_attention, repeat_kv
from attngeom.core.kept import kept_metrics, overlap
from attngeom.core.stats import bootstrap_mean_ci
from attngeom.engine.runner import RunContext, Unit
from attngeom.interventions.policies import POLICIES, policy_keep
from attngeom.interventions.restriction import contribution_scores, random_scores, topn_keep
from attngeom.interventions.selection import Selection, positional_keep
from attngeom.names import ORACLE, RANKINGS
from attngeom.probes.context_sweep import ContextInputs, _units, corpus_documents, sweep_windows

REPEATS = 16  # the random control's draws: ``analyze``'s default for final queries
MEASURES = ("kept", "overlap", "precision", "recall", "f_score", "f_random")


def reads_rows(ranking: str) -> bool:
    """Whether ``ranking`` reads earlier query rows' probabilities (h2o, tova and snapkv
    do: their caches are built from them), so the final row alone cannot give its set."""
    return ranking in POLICIES and "probs" in POLICIES[ranking].needs


def final_keep(ranking: str, n: int, *, probs: torch.Tensor, visible: torch.Tensor,
               query: torch.Tensor, key: torch.Tensor, values: torch.Tensor, layer: int,
               seed: int = 0, windows: Sequence[int] | None = None) -> torch.Tensor:
    """(B, H, T) bool: the keys ``ranking`` keeps at budget ``n`` at the final query row, as
    ``restrict_topn(model, n, ranking=...)`` keeps them there in an unrestricted layer.

    ``probs`` (B, H, Q, T) float32 and ``visible`` (B, 1|H, Q, T): every row (Q = T) for a
    ranking that ``reads_rows``, else at least the final one; ``query`` (B, H, Q', d) with
    the final row last, ``key`` and ``values`` (B, G, T, d); ``layer``, ``seed`` and the
    batch rows' window indices ``windows`` order the random ranking.
    """
    b, h, _, t = probs.shape
    p_last, v_last = probs[:, :, -1:], visible[:, :, -1:].expand(b, h, 1, t)
    if ranking in POLICIES:
        if reads_rows(ranking):
            keep = policy_keep(ranking, n, visible=visible, probs=probs, query=query,
                               key=key, final_only=True)
        else:  # a rule of the row alone: the final row's inputs only
            keep = policy_keep(ranking, n, visible=visible[:, :, -1:], query=query[:, :, -1:],
                               key=key, final_only=True)
        return keep[:, :, -1] & v_last[:, :, 0]
    if ranking == "positional":
        return positional_keep(v_last, n)[:, :, 0]
    if ranking == "attention":
        score = p_last
    elif ranking == "contribution":
        score = contribution_scores(p_last, repeat_kv(values, h // values.shape[1]))
    else:  # random: the restriction's own order words for the final position
        ids = list(range(b)) if windows is None else [int(w) for w in windows]
        score = random_scores(seed, ids, layer, h, 1, t, probs.device, order=True)
    return topn_keep(score, v_last, n)[:, :, 0]


def prepare_kept(ctx: RunContext) -> ContextInputs:
    """The windows of every length, cut before the model loads (the context probe's nested
    windows, with no tail to leave room for: any length >= 2 within the model's positions)."""
    cfg = ctx.config
    docs, corpus, config_bos = corpus_documents(ctx)
    limit = ctx.shape.max_positions if ctx.shape is not None else None
    lengths = cfg.lengths if cfg.lengths is not None else tuple(
        n for n in cfg.DEFAULT_LENGTHS if limit is None or n <= limit)
    windows, record = sweep_windows(docs, ctx.tokenizer, lengths, n_documents=cfg.n_documents,
                                    seed=cfg.seed, dataset=corpus, model_id=ctx.model_label,
                                    config_bos=config_bos, tail=1)
    rankings = tuple(dict.fromkeys((ORACLE, *cfg.rankings)))
    return ContextInputs(windows=windows, record=record, corpus=corpus,
                         selections=tuple(Selection(r) for r in rankings))


def budgets_of(ranking: str, budgets: Sequence[int], length: int) -> list[int]:
    """The budgets a ranking is measured at in windows of ``length`` tokens: those at or
    above its fixed part and below the length (at N >= T every key is kept)."""
    fixed = int((RANKINGS.meta(ranking) or {}).get("fixed", 0))
    return [int(n) for n in budgets if fixed <= n < length]


def kept_window_block(model, ids: torch.Tensor, documents: Sequence[int],
                      rankings: Sequence[str], budgets: Sequence[int], *, seed: int,
                      repeats: int = REPEATS) -> dict:
    """One forward of a block of windows (B, T): ``(ranking, n) -> measure -> (B, L, H)``
    float64 arrays (``MEASURES``; NaN where the row has no valid set)."""
    from attngeom.capture import model_layout

    layout = model_layout(model)
    b, t = ids.shape
    plan = {r: budgets_of(r, budgets, t) for r in rankings}
    out = {(r, n): {m: np.full((b, layout.num_layers, layout.num_heads), np.nan)
                    for m in MEASURES} for r, ns in plan.items() for n in ns}
    every_row = any(reads_rows(r) for r, ns in plan.items() if ns)
    last = torch.tensor([t - 1])

    def handler(call: AttentionCall):
        if call.previous_is_eager and not call.nested:
            result = call.eager_float32()
            output, probs = result[:2], result[2]
        else:
            output = call.previous()
            probs = call.eager_float32(None if every_row else last.to(call.query.device),
                                       output=False)[2]
        visible = call.visible(None if every_row else last.to(call.query.device))
        values = call.value.to(torch.float32)
        p_last = probs[:, :, -1:]
        v_last = visible[:, :, -1:]
        for n in sorted({n for ns in plan.values() for n in ns}):
            oracle = topn_keep(p_last, v_last.expand_as(p_last), n)[:, :, 0]
            for r in (r for r, ns in plan.items() if n in ns):
                keep = final_keep(r, n, probs=probs, visible=visible, query=call.query,
                                  key=call.key, values=values, layer=call.layer, seed=seed,
                                  windows=documents)
                into = out[(r, n)]
                for i in range(b):
                    km = kept_metrics(p_last[i], values[i], keep[i][:, None],
                                      visible=v_last[i], query_positions=last, repeats=repeats,
                                      seed=seed, window=int(documents[i]), layer=call.layer)
                    row = {"kept": km.size[:, 0].to(torch.float64),
                           "overlap": overlap(keep[i], oracle[i], n),
                           "precision": km.metrics["precision"][:, 0],
                           "recall": km.metrics["recall"][:, 0],
                           "f_score": km.metrics["f_score"][:, 0],
                           "f_random": km.random["f_score"][:, :, 0].mean(0)}
                    ok = km.valid[:, 0]
                    for m, value in row.items():
                        into[m][i, call.layer] = torch.where(ok, value, float("nan")).cpu().numpy()
        return output

    device = input_device(model)
    with torch.no_grad(), override_attention(model, handler):
        model(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device))
    return out


def run_kept(ctx: RunContext) -> dict:
    """The kept tables (module docstring), unit by unit."""
    cfg, inputs = ctx.config, ctx.inputs
    rankings = [s.ranking for s in inputs.selections]
    units = _units(inputs, cfg.batch_size)

    def process(unit: Unit) -> dict:
        length, idx = unit.windows
        return kept_window_block(ctx.model, inputs.windows[length][list(idx)], idx, rankings,
                                 cfg.budgets, seed=cfg.seed)

    parts: dict[int, list[dict]] = {}
    for unit, part in zip(units, ctx.run_units(
            "kept", units, process, desc="kept: final queries of every window", unit="window",
            weight=lambda u: len(u.windows[1])), strict=True):
        parts.setdefault(unit.windows[0], []).append(part)
    ctx.counts["kept_windows"] = sum(len(u.windows[1]) for u in units)
    return kept_tables(parts, cfg.bootstrap, cfg.seed)


def kept_tables(parts: dict[int, list[dict]], n_boot: int, seed: int) -> dict:
    """``kept_geometry`` and ``kept_summary`` from each length's unit results (in unit
    order: the tables are the same whichever process computed which unit)."""
    import pandas as pd

    per_head, summary = [], []
    for length in sorted(parts):
        joined = {key: {m: np.concatenate([p[key][m] for p in parts[length]])
                        for m in MEASURES} for key in parts[length][0]}
        for (ranking, n), arrays in joined.items():
            w, n_layers, n_heads = arrays["f_score"].shape
            count = np.isfinite(arrays["f_score"]).sum(0)
            means = {m: _finite_mean(a, 0) for m, a in arrays.items()}
            for layer in range(n_layers):
                for head in range(n_heads):
                    per_head.append({"length": length, "layer": layer, "head": head,
                                     "ranking": ranking, "n": n,
                                     **{m: float(means[m][layer, head]) for m in MEASURES},
                                     "n_windows": int(count[layer, head])})
            # each window's mean over its valid layers and heads, then over windows
            gap = arrays["f_score"] - arrays["f_random"]
            rows = {m: _finite_mean(a.reshape(w, -1), 1)
                    for m, a in {**arrays, "f_gap": gap}.items()}
            stats = {m: bootstrap_mean_ci(v[None, :], n_boot=n_boot, seed=seed)
                     for m, v in rows.items()}
            entry = {"length": length, "ranking": ranking, "n": n,
                     "n_windows": int(stats["f_score"][3][0])}
            for m, (mean, low, high, _) in stats.items():
                entry[m] = float(mean[0])
                if m in ("overlap", "f_score", "f_random", "f_gap"):
                    entry[f"{m}_low"], entry[f"{m}_high"] = float(low[0]), float(high[0])
            summary.append(entry)
    return {"kept_geometry": pd.DataFrame(per_head), "kept_summary": pd.DataFrame(summary)}


def _finite_mean(values: np.ndarray, axis: int) -> np.ndarray:
    """The mean of the finite entries along ``axis`` (NaN where there is none)."""
    ok = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok, values, 0.0).sum(axis) / ok.sum(axis)

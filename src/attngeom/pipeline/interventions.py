"""``prune``, ``scan-heads`` and ``restrict``: perplexity under interventions (method §9).

Each command streams batches of evaluation windows through ``sweeps.nll_sums`` (the
summed NLL of a batch with the model as it is and under every setting) and adds the
batches in order, so the numbers equal one pass over all windows. ``prune`` first
ranks the heads on its ranking windows (the first ``n_rank_windows``; the evaluation
windows follow them, disjoint). Progress counts forward passes: one window batch
under one setting.
"""

from __future__ import annotations

import numpy as np
import torch

from attngeom.config import AnalysisConfig
from attngeom.interventions import sweeps
from attngeom.interventions.perplexity import NLLResult
from attngeom.interventions.rankers import DEFAULT_ORDER, RANKERS, add_stats
from attngeom.pipeline.runner import Command, RunContext, units_of


def _stack(windows) -> torch.Tensor:
    return torch.stack([w.input_ids for w in windows])


def measure(ctx: RunContext, windows, settings, stage: str, desc: str):
    """Mean NLL per predicted token of the base model and of every setting over
    ``windows``, a batch of windows per unit, batches added in order."""
    model = ctx.model
    n_tokens = len(windows) * (len(windows[0]) - 1)

    def process(unit):
        with torch.no_grad():
            return sweeps.nll_sums(model, _stack(unit.windows), settings)

    base_total, totals = 0.0, np.zeros(len(settings))
    for base, sums in ctx.run_units(
            stage, units_of(windows, ctx.config.batch_size), process, unit="pass",
            weight=lambda u: len(settings) + 1,
            desc=f"{desc} ({len(windows)} windows x {len(settings) + 1} settings)"):
        base_total += base
        totals = totals + sums
    return NLLResult.from_sum(base_total, n_tokens), totals / n_tokens


def _split(ctx: RunContext, n_rank: int):
    rank, ev = ctx.windows[:n_rank], ctx.windows[n_rank : n_rank + ctx.config.n_eval_windows]
    ctx.corpus_extra.update({"rank_windows": [w.index for w in rank],
                             "eval_windows": [w.index for w in ev]})
    return rank, ev


class ScanHeads(Command):
    """Remove each head alone; relative delta-NLL and critical heads."""

    def run(self, ctx: RunContext) -> dict:
        _, ev = _split(ctx, 0)
        layout = ctx.layout
        heads = [(layer, head) for layer in range(layout.num_layers)
                 for head in range(layout.num_heads)]
        settings = [sweeps.removed_heads([h]) for h in heads]
        base, nll = measure(ctx, ev, settings, "scan", "scan-heads")
        table = torch.from_numpy(np.asarray(nll)).reshape(layout.num_layers, layout.num_heads)
        return {"head_scan": sweeps.scan_table(base, table, ctx.config.threshold)}


class Restrict(Command):
    """Keep only the top-N attention entries per query; delta-NLL and N*_tau."""

    def run(self, ctx: RunContext) -> dict:
        cfg = ctx.config
        _, ev = _split(ctx, 0)
        settings = sweeps.restrict_settings(
            ctx.model, cfg.n_grid, scopes=cfg.scopes, renormalize=cfg.renormalize,
            layers=cfg.layers, heads=cfg.heads)
        base, nll = measure(ctx, ev, settings, "restrict", "restrict")
        restrict, nstar = sweeps.restrict_tables(settings, base, nll, cfg.taus)
        return {"restrict": restrict, "restrict_nstar": nstar}


class Prune(Command):
    """Rank heads on the ranking windows, then prune by keep fraction on the others."""

    def run(self, ctx: RunContext) -> dict:
        from attngeom.pipeline.analyze import analyze_windows

        cfg = ctx.config
        rank, ev = _split(ctx, cfg.n_rank_windows)
        tables = {}
        taxonomy = None
        if any(RANKERS[r].needs_taxonomy for r in cfg.rankers):
            # the taxonomy of the ranking windows, counted queries as in analyze --query-mode all
            acfg = AnalysisConfig(
                model=cfg.model, corpus=cfg.corpus, window_length=cfg.window_length,
                n_windows=len(rank), seed=cfg.seed, device=cfg.device, dtype=cfg.dtype,
                text_column=cfg.text_column, separator=cfg.separator,
                doc_boundary=cfg.doc_boundary, boundary_token=cfg.boundary_token,
                analyses=("taxonomy",), query_mode="all", model_label=cfg.model_label,
                corpus_label=cfg.corpus_label)
            frames, *_ = analyze_windows(ctx, acfg, rank, stage="taxonomy",
                                         desc="prune: taxonomy")
            taxonomy = tables["taxonomy"] = frames["taxonomy"]
        stats = {}
        data = [r for r in cfg.rankers if RANKERS[r].batch_stats is not None]
        if data:
            ctx.model.eval()

            def process(unit):
                batch = _stack(unit.windows)
                return {name: RANKERS[name].batch_stats(ctx.model, batch) for name in data}

            for part in ctx.run_units("rank", units_of(rank, cfg.batch_size), process,
                                      unit="pass", weight=lambda u: len(data),
                                      desc=f"prune: rank ({len(rank)} windows)"):
                for name in data:
                    stats[name] = add_stats(stats.get(name), part[name])
        rankings = []
        orders = cfg.orders or (DEFAULT_ORDER,)
        for name in cfg.rankers:
            spec = RANKERS[name]
            variants = ([{"seed": s} for s in cfg.seeds] if spec.seeded
                        else [{"order": o} for o in orders] if spec.ordered else [{}])
            for extra in variants:
                rankings.append(spec.make(ctx.model, stats=stats.get(name), taxonomy=taxonomy,
                                          **extra))
        settings, rows = sweeps.prune_settings(ctx.model, rankings, cfg.keep_fractions)
        base, nll = measure(ctx, ev, settings, "evaluate", "prune: evaluate")
        pruning, rankings_table = sweeps.pruning_tables(rows, base, nll, rankings)
        return {"pruning": pruning, "rankings": rankings_table, **tables}

"""``prune``, ``scan-heads`` and ``restrict``: perplexity under interventions (method §9).

Each command streams batches of evaluation windows through ``sweeps.nll_sums`` (the
summed NLL of a batch with the model as it is and under every setting) and adds the
batches in order, so the numbers equal one pass over all windows. ``prune`` first
ranks the heads on its ranking windows (the first ``n_rank_windows``; the evaluation
windows follow them, disjoint). Progress counts forward passes: one window batch
under one setting.

``restrict`` runs in rounds (``sweeps.restrict_search``): the grid of N for every
ranking, renormalisation and scope target, then each round of the adaptive N* search
for all of them at once, one pass over the windows per round (its own resumable
stage, ``restrict`` then ``restrict-2``, ...), keeping each window's NLL for the
document bootstrap. ``--alone-tau`` then restricts each head alone at the attention
oracle's N*_tau under every ranking (one more stage, ``restrict-alone``: the
``restrict_alone`` table). ``--scope layer|head`` runs the localised scan instead (stages
``restrict-layers`` and ``restrict-heads``).
"""

from __future__ import annotations

import numpy as np
import torch

from attngeom.config import AnalysisConfig
from attngeom.engine.runner import Command, RunContext, units_of
from attngeom.errors import ConfigError
from attngeom.interventions import sweeps
from attngeom.interventions.perplexity import NLLResult
from attngeom.interventions.rankers import DEFAULT_ORDER, add_stats
from attngeom.names import RANKERS


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


def measure_rows(ctx: RunContext, windows, stage, desc: str) -> sweeps.Measure:
    """The ``sweeps.Measure`` of ``restrict``: round k of the settings runs as stage
    ``stage`` (k = 0; with the base) or ``stage-{k+1}`` (or ``stage[k]`` for a tuple
    of names) over ``windows`` in unit batches; the pooled sums add up batch by batch
    as ``measure`` adds them."""
    model = ctx.model
    per_window = len(windows[0]) - 1
    n_tokens = len(windows) * per_window

    def run(rnd: int, settings):
        first = rnd == 0

        def process(unit):
            ids = [w.index for w in unit.windows]
            with torch.no_grad():
                return sweeps.nll_rows(model, _stack(unit.windows), settings, ids, base=first)

        name = (stage[rnd] if isinstance(stage, tuple)
                else stage if first else f"{stage}-{rnd + 1}")
        base_total, totals, base_rows, rows = 0.0, np.zeros(len(settings)), [], []
        for b, b_rows, sums, r in ctx.run_units(
                name, units_of(windows, ctx.config.batch_size), process, unit="pass",
                weight=lambda u: len(settings) + first,
                desc=f"{desc} round {rnd + 1} ({len(windows)} windows x "
                     f"{len(settings) + first} settings)"):
            base_total += b
            totals = totals + sums
            base_rows.append(b_rows)
            rows.append(r)
        docs = np.concatenate(rows, axis=1) / per_window
        base_docs = np.concatenate(base_rows) / per_window if first else None
        return base_total / n_tokens, base_docs, totals / n_tokens, docs

    return run


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
    """Keep only the top-N entries per query; delta-NLL, integer N*_tau, localised scan."""

    def run(self, ctx: RunContext) -> dict:
        cfg = ctx.config
        _, ev = _split(ctx, 0)
        length = len(ev[0])
        if cfg.scope != "model":
            layout = ctx.layout
            layers = list(range(layout.num_layers)) if cfg.layers is None else list(cfg.layers)
            outside = [layer for layer in layers if layer >= layout.num_layers]
            if outside:
                raise ConfigError(f"layers: expected layers in [0, {layout.num_layers}) for "
                                  f"{layout.model_class}, got {outside[0]}")
            templates = [sweeps.Restriction("layer", 0, -1, n, flag, ranking, cfg.seed)
                         for ranking in cfg.rankings for flag in cfg.renormalize
                         for n in cfg.scan_n]
            scan = measure_rows(ctx, ev, ("restrict-layers", "restrict-heads"), "restrict scan")
            local = sweeps.local_scan(templates, scan, layers=layers,
                                      num_heads=layout.num_heads, heads=cfg.scope == "head",
                                      top_layers=min(cfg.scan_top_layers, len(layers)))
            return {"restrict_local": local}
        templates = sweeps.restrict_settings(
            ctx.model, cfg.n_grid[:1], scopes=cfg.scopes, renormalize=cfg.renormalize,
            layers=cfg.layers, heads=cfg.heads, rankings=cfg.rankings, seed=cfg.seed)
        adaptive = cfg.search == "adaptive"
        base, base_docs, results = sweeps.restrict_search(
            templates, measure_rows(ctx, ev, "restrict", "restrict"), length=length,
            taus=cfg.taus, grid=cfg.n_grid, adaptive=adaptive, refine=cfg.refine,
            step=cfg.step)
        restrict, nstar = sweeps.search_tables(results, base, base_docs, cfg.taus,
                                               length=length, adaptive=adaptive,
                                               bootstrap=cfg.bootstrap, seed=cfg.seed,
                                               beyond=cfg.n_grid, step=cfg.step)
        tables = {"restrict": restrict, "restrict_nstar": nstar}
        if cfg.alone_tau is not None:
            _, heads = sweeps.head_targets(ctx.model, cfg.layers, cfg.heads)
            tables["restrict_alone"] = sweeps.alone_scan(
                results, measure_rows(ctx, ev, "restrict-alone", "restrict: each head alone"),
                cfg.alone_tau, heads, length=length)
        return tables


class Prune(Command):
    """Rank heads on the ranking windows, then prune by keep fraction on the others."""

    def run(self, ctx: RunContext) -> dict:
        from attngeom.engine.analyze import analyze_windows

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

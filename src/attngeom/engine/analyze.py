"""``attngeom analyze``: stream the windows through the model into the registered analyses."""

from __future__ import annotations

import time

from attngeom.engine.analyses import AnalysisContext, AnalysisSet
from attngeom.engine.progress import say
from attngeom.engine.runner import Command, RunContext, units_of
from attngeom.engine.stream import StreamStats, grid_report, stream_windows


def special_ids(tokenizer, policy) -> tuple[int, ...]:
    """The token ids the sink-by-token table always reports: the tokenizer's special
    tokens and the window frame and boundary tokens."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set(policy.prefix) | set(policy.suffix)
    if policy.token_id is not None:
        ids.add(policy.token_id)
    return tuple(sorted(int(i) for i in ids))


def analyze_windows(ctx: RunContext, config, windows, *, stage: str = "analyze",
                    desc: str = "analyze"):
    """The tables of ``config``'s analyses over ``windows`` (labelled with the run's names).

    Each batch of windows is one unit: a fresh set of accumulators streams it, and the
    units' states are merged in window order (``RunContext.run_units``).
    """
    context = AnalysisContext(tokenizer=ctx.tokenizer,
                              special_ids=special_ids(ctx.tokenizer, ctx.policy))
    tokens = int(windows[0].input_ids.shape[-1])

    def process(unit):
        part = AnalysisSet.create(config, context)
        # the windows this process streams in the stage (not resumed, its own units)
        stream = stream_windows(ctx.model, ctx.layout, list(unit.windows), config, part,
                                run_windows=ctx.pending)
        return {"accumulators": part.items, "stream": stream}

    analyses = AnalysisSet.create(config, context)
    total = StreamStats()
    for payload in ctx.run_units(stage, units_of(windows, config.batch_size), process,
                                 desc=f"{desc} ({tokens} tok/window)"):
        analyses.merge_items(payload["accumulators"])
        total.add(payload["stream"])
    t = time.perf_counter()
    boot = getattr(config, "bootstrap", 0)
    say(ctx.progress if ctx.dist.is_main else False,
        f"{desc}: aggregating the tables"
        + (f" ({boot} window-bootstrap replicates)" if boot else "") + " ...")
    frames = analyses.frames(model=ctx.model_label, corpus=ctx.corpus_label)
    return frames, analyses, total, time.perf_counter() - t


class Analyze(Command):
    """Top-N geometry, sink, taxonomy, bounds and assumptions (method §2-§8)."""

    def run(self, ctx: RunContext) -> dict:
        cfg = ctx.config
        grid = grid_report(cfg.n_grid, cfg.window_length, cfg.query_mode, ctx.layout.is_causal)
        frames, analyses, stream, aggregate_s = analyze_windows(ctx, cfg, ctx.windows)
        ctx.timings["stream_s"] = stream.seconds
        ctx.timings["aggregate_s"] = aggregate_s
        ctx.counts.update({
            "windows": stream.windows,
            "tokens": stream.tokens,
            "nonfinite_rows": analyses.nonfinite_rows,
            "never_valid_n": grid["never_valid_n"],
            "largest_universe": grid["largest_universe"],
            "skipped_entries": int(frames["metrics"]["n_skipped"].sum())
            if "metrics" in frames else 0,
        })
        return frames


def run_analysis(config, out=None, **kwargs):
    """``execute(Analyze(), config, out, ...)``: an analysis run from a configuration."""
    from attngeom.engine.runner import execute

    return execute(Analyze(), config, out, **kwargs)

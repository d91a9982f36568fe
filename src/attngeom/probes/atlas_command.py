"""``attngeom atlas``: the head atlas of issue 32 as a run (``probes/atlas.py`` does the
scoring).

One run computes, on the same corpus windows, the analysis' taxonomy and head-level
F_N (``analyze_windows`` with the ``metrics`` and ``taxonomy`` analyses, as ``prune``
computes its taxonomy) and then every head score (``atlas.head_atlas``, its own
forward over the windows, the repeated-token prompts and the needle trials), so the
regime x head type tables always compare one model on one set of windows; no other
run has to be found first. It writes ``head_scores``, ``atlas_contingency``,
``atlas_kappa``, ``atlas_depth``, ``atlas_fn`` and the ``taxonomy`` and ``summary``
tables they were computed from.

The taxonomy's windows are resumable units (``run_units``); the head scores run in
one piece after them (a killed run computes them again).
"""

from __future__ import annotations

from dataclasses import fields

from attngeom.config import AnalysisConfig, RunConfig
from attngeom.engine.progress import say
from attngeom.engine.runner import Command, RunContext
from attngeom.errors import ConfigError
from attngeom.names import HEAD_TYPES


def analysis_config(cfg) -> AnalysisConfig:
    """The analysis the atlas runs beside its scores: the run's windows and options,
    the metrics (F_N of each head against its random control) and the taxonomy."""
    shared = {f.name: getattr(cfg, f.name) for f in fields(RunConfig)}
    return AnalysisConfig(**shared, n_windows=cfg.n_windows, n_grid=cfg.n_grid,
                          query_mode=cfg.query_mode, analyses=("metrics", "taxonomy"),
                          variants=("full",), distances=("euclidean",),
                          bootstrap=cfg.bootstrap, regime_rule=cfg.regime_rule)


def with_thresholds(head_scores, thresholds: tuple[str, ...]):
    """``head_scores`` with its ``threshold`` and ``is_type`` columns recomputed for the
    thresholds given as ``NAME=VALUE`` (the others keep the published ones)."""
    from attngeom.core.head_scores import below

    if not thresholds:
        return head_scores
    given = dict(item.split("=", 1) for item in thresholds)
    for name in given:
        HEAD_TYPES.check(name, "thresholds")
    df = head_scores.copy()
    for name, value in given.items():
        df.loc[df["score"] == name, "threshold"] = float(value)
    low = df["score"].map(below)
    df["is_type"] = ((low & (df["value"] <= df["threshold"]))
                     | (~low & (df["value"] >= df["threshold"]))) & df["value"].notna()
    return df


class Atlas(Command):
    """Head scores of every head and the regime x head type tables (issue 32)."""

    def run(self, ctx: RunContext) -> dict:
        from attngeom.engine.analyze import analyze_windows
        from attngeom.probes.atlas import head_atlas, side_by_side

        cfg = ctx.config
        if not ctx.layout.is_causal:
            raise ConfigError(f"{ctx.layout.model_class} is not a causal LM: the atlas's "
                              "induction and retrieval scores decode with one")
        frames, *_ = analyze_windows(ctx, analysis_config(cfg), ctx.windows, stage="taxonomy",
                                     desc="atlas: taxonomy")
        say(ctx.progress, f"atlas: head scores ({len(ctx.windows)} windows, "
                          f"{cfg.n_repeats} repeated prompts, {cfg.n_needles} needles) ...")
        tables = head_atlas(
            ctx.model, ctx.tokenizer, ctx.windows, seed=cfg.seed,
            query_stride=cfg.query_stride, streaming_window=cfg.streaming_window,
            n_repeats=cfg.n_repeats, repeat_length=cfg.repeat_length,
            n_needles=cfg.n_needles, needle_length=cfg.needle_length,
            context_lengths=cfg.needle_contexts, recovered_share=cfg.recovered_share,
            batch_size=cfg.batch_size, model_label=ctx.model_label,
            corpus_label=ctx.corpus_label)
        scores = with_thresholds(tables["head_scores"], cfg.thresholds)
        out = {"head_scores": scores,
               **side_by_side(scores, frames["taxonomy"], frames["summary"])}
        ctx.counts["heads"] = int(len(frames["taxonomy"]))
        ctx.counts["head_types"] = int(scores.loc[scores["is_type"], ["layer", "head"]]
                                       .drop_duplicates().shape[0])
        return {**out, "taxonomy": frames["taxonomy"], "summary": frames["summary"]}

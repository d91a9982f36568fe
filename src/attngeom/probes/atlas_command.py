"""``attngeom atlas``: the head atlas of issue 32 as a run of resumable units.

One run computes, on the same corpus windows and in one forward per batch, the
analysis' taxonomy, head-level F_N and the corpus head scores (``analyze_windows`` with
the ``metrics``, ``taxonomy`` and ``head_scores`` analyses: the head scores' strided rows
ride the taxonomy's pass), then the repeated-token prompts (stage ``atlas-repeats``, a
unit per block of prompts) and the needle trials (stage ``atlas-needles``, a unit per
block of trials of one length), so a killed run resumes from its finished units and the
regime x head type tables always compare one model on one set of windows. The prompts
and needles are built before the model loads (``prepare``): a needle that does not fit
its context is one line then. It writes ``head_scores``, ``atlas_contingency``,
``atlas_kappa``, ``atlas_depth``, ``atlas_fn`` and the ``taxonomy`` and ``summary``
tables they were computed from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from attngeom.config import AnalysisConfig, RunConfig
from attngeom.engine.runner import Command, RunContext, Unit
from attngeom.errors import ConfigError
from attngeom.names import HEAD_TYPES


def analysis_config(cfg) -> AnalysisConfig:
    """The analysis the atlas runs on its windows: the metrics (F_N of each head against
    its random control), the taxonomy and the corpus head scores, with the run's options."""
    shared = {f.name: getattr(cfg, f.name) for f in fields(RunConfig)}
    return AnalysisConfig(**shared, n_windows=cfg.n_windows, n_grid=cfg.n_grid,
                          query_mode=cfg.query_mode,
                          analyses=("metrics", "taxonomy", "head_scores"),  # subset of ANALYSES
                          variants=("full",), distances=("euclidean",),
                          bootstrap=cfg.bootstrap, regime_rule=cfg.regime_rule,
                          head_stride=cfg.query_stride,
                          streaming_window=cfg.streaming_window)


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
    low = df["score"].map(below).astype(bool)
    df["is_type"] = ((low & (df["value"] <= df["threshold"]))
                     | (~low & (df["value"] >= df["threshold"]))) & df["value"].notna()
    return df


@dataclass(frozen=True)
class AtlasInputs:
    """The synthetic prompts of one atlas run, built before the model loads."""

    repeats: object  # (n_repeats, 1 + 2 x repeat_length) token ids
    trials: tuple  # NeedleTrial objects
    contexts: tuple[int, ...]


def _blocks(count: int, size: int, key=lambda i: 0) -> list[Unit]:
    """Consecutive blocks of at most ``size`` items sharing ``key`` (one shape each)."""
    units, start = [], 0
    while start < count:
        stop = start + 1
        while stop < count and stop - start < size and key(stop) == key(start):
            stop += 1
        units.append(Unit(len(units), tuple(range(start, stop)), ids=tuple(range(start, stop))))
        start = stop
    return units


class Atlas(Command):
    """Head scores of every head and the regime x head type tables (issue 32)."""

    def prepare(self, ctx: RunContext) -> None:
        import torch

        from attngeom.probes.atlas import make_needles, repeat_prompts

        cfg = ctx.config
        if ctx.shape is not None and not ctx.shape.is_causal:
            raise ConfigError(f"{ctx.shape.name} is not a causal LM: the atlas's induction "
                              "and retrieval scores decode with one")
        vocab = len(ctx.tokenizer)
        if ctx.model is not None:
            vocab = min(vocab, int(getattr(ctx.model.config, "vocab_size", vocab) or vocab))
        win = torch.stack([w.input_ids for w in ctx.windows])
        repeats = repeat_prompts(ctx.tokenizer, vocab, int(win[0, 0]), n_repeats=cfg.n_repeats,
                                 repeat_length=cfg.repeat_length, seed=cfg.seed)
        contexts = cfg.effective_needle_contexts
        # trials of one length are decoded together: order them by length, seeds unchanged
        trials = make_needles(ctx.tokenizer, win, vocab, n_needles=cfg.n_needles,
                              needle_length=cfg.needle_length, context_lengths=contexts,
                              seed=cfg.seed)
        ctx.inputs = AtlasInputs(repeats=repeats, trials=tuple(trials), contexts=contexts)
        ctx.corpus_extra["atlas"] = {
            "windows": len(ctx.windows), "query_stride": cfg.query_stride,
            "repeated_prompts": int(repeats.shape[0]), "repeat_length": cfg.repeat_length,
            "needles": len(trials), "needle_contexts": list(contexts)}

    def run(self, ctx: RunContext) -> dict:
        from attngeom.engine.analyze import analyze_windows
        from attngeom.probes import atlas

        cfg, inputs, model = ctx.config, ctx.inputs, ctx.model
        model.eval()
        frames, *_ = analyze_windows(ctx, analysis_config(cfg), ctx.windows, stage="taxonomy",
                                     desc="atlas: taxonomy and corpus head scores")
        repeats = atlas._Sums.empty()
        units = _blocks(int(inputs.repeats.shape[0]), cfg.batch_size)
        for part in ctx.run_units(
                "atlas-repeats", units,
                lambda u: atlas.repeat_sums(model, inputs.repeats[list(u.windows)],
                                            cfg.repeat_length),
                desc=f"atlas: repeated tokens ({inputs.repeats.shape[0]} prompts)",
                unit="prompt"):
            repeats.merge(part)
        trials = inputs.trials
        units = _blocks(len(trials), cfg.batch_size,
                        key=lambda i: (trials[i].prompt.numel(), trials[i].needle.numel()))
        decoded = []
        for part in ctx.run_units(
                "atlas-needles", units,
                lambda u: atlas.decode_trials(model, [trials[i] for i in u.windows]),
                desc=f"atlas: needles ({len(trials)} trials)", unit="trial"):
            decoded.extend(part)
        retrieval, n_ok, _ = atlas.retrieval_from(decoded, trials,
                                                  recovered_share=cfg.recovered_share)
        layout = ctx.layout
        inputs_text = {
            "corpus": frames["head_scores"]["inputs"].iloc[0],
            "repeats": (f"{inputs.repeats.shape[0]} prompts of 1 + 2 x {cfg.repeat_length} "
                        f"random tokens, seed {cfg.seed}"),
            "needles": (f"{len(trials)} needles of {cfg.needle_length} tokens, contexts "
                        f"{'/'.join(map(str, inputs.contexts))}, seeded depths, seed "
                        f"{cfg.seed}, {n_ok} recovered"),
        }
        scores = atlas.head_score_rows(frames["head_scores"], repeats, retrieval, n_ok,
                                       num_layers=layout.num_layers,
                                       num_heads=layout.num_heads, inputs=inputs_text,
                                       seed=cfg.seed)
        scores = with_thresholds(scores, cfg.thresholds)
        ctx.counts["heads"] = int(len(frames["taxonomy"]))
        ctx.counts["head_types"] = int(scores.loc[scores["is_type"], ["layer", "head"]]
                                       .drop_duplicates().shape[0])
        ctx.counts["needles_recovered"] = int(n_ok)
        return {"head_scores": scores,
                **atlas.side_by_side(scores, frames["taxonomy"], frames["summary"]),
                "taxonomy": frames["taxonomy"], "summary": frames["summary"]}

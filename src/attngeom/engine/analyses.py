"""The registry of analyses: what each one computes, from what, and which tables it writes.

One ``Analysis`` registered in ``names.ANALYSES`` per analysis (its tables are declared in
``results.schemas``): its accumulator factory and the step that turns its raw columns
into the run's tables (joins with other analyses' tables included); what an analysis
needs is declared with its name (``ANALYSES.meta``), which the configuration enforces.
``AnalysisSet`` is the running set of one run's accumulators; ``attngeom analyze`` and
the taxonomy ranker of ``attngeom prune`` both stream windows into one. Adding an analysis is one
``register`` call here plus its accumulator in ``core`` (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from attngeom.core.batch import AttentionBatch
from attngeom.core.protocol import Accumulator
from attngeom.engine import tables as tb
from attngeom.names import ANALYSES


@dataclass(frozen=True)
class AnalysisContext:
    """What a factory or a finishing step may need beyond the configuration."""

    tokenizer: object = None
    special_ids: tuple[int, ...] = ()  # token ids the sink-by-token table always reports


@dataclass(frozen=True)
class Analysis:
    """One analysis: ``make(config, context)`` builds its accumulator; ``finish(frames,
    config, context)`` edits the run's DataFrames in place after every accumulator has
    computed (``frames`` holds every analysis' tables, internal ones included)."""

    name: str
    make: Callable[..., Accumulator]
    finish: Callable[..., None] | None = None
    internal: tuple[str, ...] = ()  # tables computed for other analyses, never written
    # the query rows it reads, as a query mode of the configuration (default: the run's
    # ``query_mode``); the stream captures the union of every analysis' rows once
    rows: Callable[..., str] | None = None

    def query_mode(self, config) -> str:
        return self.rows(config) if self.rows is not None else config.query_mode

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables it writes (declared in ``results/schemas.py``)."""
        from attngeom.results.schemas import analysis_tables

        return analysis_tables(self.name)


def register(analysis: Analysis) -> Analysis:
    return ANALYSES.register(analysis.name, analysis)


# --------------------------------------------------------------------------- the five


def _make_metrics(config, context):
    from attngeom.core.accumulators import TopNAccumulator, TopNConfig

    return TopNAccumulator(TopNConfig(
        n_grid=tuple(config.n_grid), rules=tuple(config.rules),
        distances=tuple(config.distances), variants=tuple(config.variants),
        repeats=config.effective_repeats, seed=config.seed,
        bounds="bounds" in config.analyses,
    ))


def _finish_metrics(frames, config, context) -> None:
    frames["summary"] = tb.summarize(frames["metrics"], n_boot=config.bootstrap,
                                     seed=config.seed)


def _make_sink(config, context):
    from attngeom.core.sink import SinkAccumulator

    return SinkAccumulator(tuple(config.n_grid), report_ids=context.special_ids,
                           min_occurrences=config.sink_min_occurrences,
                           min_windows=config.sink_min_windows)


def _finish_sink(frames, config, context) -> None:
    frames["sink"] = tb.sink_table(frames["sink"], frames.get("sink_effect"))
    if context.tokenizer is not None:
        frames["sink_tokens"] = tb.with_token_text(frames["sink_tokens"], context.tokenizer)


def _make_taxonomy(config, context):
    from attngeom.core.taxonomy import TaxonomyAccumulator

    return TaxonomyAccumulator(
        counted="final" if config.query_mode == "final" else "half",
        rule=config.regime_rule, n_boot=config.bootstrap, seed=config.seed,
    )


def _make_bounds(config, context):
    from attngeom.core.bounds import BoundsAccumulator

    return BoundsAccumulator(tuple(config.n_grid))


def _finish_bounds(frames, config, context) -> None:
    frames["bounds"] = tb.bounds_table(frames["bounds"], frames.get("summary"))


def _make_assumptions(config, context):
    from attngeom.core.assumptions import AssumptionsAccumulator

    return AssumptionsAccumulator()


register(Analysis("metrics", _make_metrics, finish=_finish_metrics, internal=("sink_effect",)))
register(Analysis("sink", _make_sink, finish=_finish_sink))
register(Analysis("taxonomy", _make_taxonomy))
register(Analysis("bounds", _make_bounds, finish=_finish_bounds))
register(Analysis("assumptions", _make_assumptions))


def _make_head_scores(config, context):
    from attngeom.core.head_scores import HeadScoreAccumulator

    return HeadScoreAccumulator(config.streaming_window)


def _finish_head_scores(frames, config, context) -> None:
    frames["head_scores"] = tb.head_score_table(
        frames["head_scores"], inputs=f"corpus rows every {config.head_stride} (the final "
        f"one included), streaming W = {config.streaming_window}", seed=config.seed)


# the corpus head types (previous-token, duplicate-token, sink, streaming) ride the
# analysis' own forward, at rows every ``head_stride`` positions back from the final one
register(Analysis("head_scores", _make_head_scores, finish=_finish_head_scores,
                  rows=lambda config: f"stride:{config.head_stride}"))


# --------------------------------------------------------------------------- one run's set


@dataclass
class AnalysisSet:
    """The accumulators of one run, by analysis name, in registry order."""

    config: object
    context: AnalysisContext = field(default_factory=AnalysisContext)
    items: dict[str, Accumulator] = field(default_factory=dict)

    @classmethod
    def create(cls, config, context: AnalysisContext | None = None) -> AnalysisSet:
        context = context or AnalysisContext()
        names = [n for n in ANALYSES if n in config.analyses]
        return cls(config, context, {n: ANALYSES[n].make(config, context) for n in names})

    def query_modes(self) -> dict[str, list[str]]:
        """Query mode -> the analyses that read its rows (most runs: one mode)."""
        out: dict[str, list[str]] = {}
        for name in self.items:
            out.setdefault(ANALYSES[name].query_mode(self.config), []).append(name)
        return out

    def update_many(self, batches: list[AttentionBatch], mode: str | None = None) -> None:
        """The windows of one forward batch at one layer, to every accumulator (those that
        read ``mode``'s rows when it is given)."""
        for name, acc in self.items.items():
            if mode is None or ANALYSES[name].query_mode(self.config) == mode:
                acc.update_many(batches)

    def merge(self, other: AnalysisSet) -> AnalysisSet:
        return self.merge_items(other.items)

    def merge_items(self, items: dict[str, Accumulator]) -> AnalysisSet:
        """Add another unit's accumulators (disjoint windows), by analysis name."""
        for name, acc in self.items.items():
            acc.merge(items[name])
        return self

    def frames(self, *, model: str, corpus: str) -> dict:
        """Every table of the run as a DataFrame (identifying columns first), joined."""
        frames = {}
        for acc in self.items.values():
            for name, cols in acc.compute().items():
                frames[name] = tb.frame(cols, model=model, corpus=corpus)
        internal = set()
        for name in self.items:
            spec = ANALYSES[name]
            internal |= set(spec.internal)
            if spec.finish is not None:
                spec.finish(frames, self.config, self.context)
        return {k: df for k, df in frames.items() if k not in internal}

    @property
    def nonfinite_rows(self) -> int:
        acc = self.items.get("metrics")
        return int(acc.nonfinite_rows) if acc is not None else 0

"""``attngeom competition --probe qa|context|kept``: retrieval under competition (issue 31).

The probes are a registry (``names.PROBES``): each entry is a ``Probe`` with
``prepare(ctx)`` (its inputs built and checked before the model loads), ``run(ctx)`` (its
tables, as resumable units on the engine) and ``settings(ctx)`` (what
``competition_settings`` and the manifest record of what it read). Registered here:

- ``qa``: generated bAbI qa1 episodes (``probes/qa.py``) with corpus background, or real
  BABILong rows; the answers, the competence screen, the support statistics at the
  answer query and N* per selection (``probes/qa_probe.py``);
- ``context``: nested windows of several lengths from the fixed-length document
  protocol, N* per length under tail128 and all-token scoring, the document bootstrap
  and the log-log slope (``probes/context_sweep.py``);
- ``kept``: the same windows' final queries: the overlap of each ranking's kept set with
  the oracle's top-N and its F_N against a random set of its size (``probes/kept.py``).

A probe takes the run's configuration (``CompetitionConfig``) and nothing else, so every
default is written once, in the configuration. ``docs/extending.md`` registers a toy one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attngeom.engine.runner import Command, RunContext
from attngeom.errors import ConfigError
from attngeom.names import PROBES
from attngeom.probes import context_sweep, kept, qa_probe


@dataclass(frozen=True)
class Probe:
    """One probe of ``attngeom competition``: how it prepares, runs and describes itself."""

    prepare: Callable[[RunContext], object]
    run: Callable[[RunContext], dict]
    settings: Callable[[RunContext], dict]
    record: Callable[[object], dict] = lambda inputs: {}  # what the manifest keeps of them


def _search_settings(ctx: RunContext) -> dict:
    cfg = ctx.config
    if not cfg.nstar:
        return {"nstar": False}
    return {"taus": ",".join(f"{t:g}" for t in cfg.effective_taus), "search": cfg.step,
            "refine": 3}


def _qa_settings(ctx: RunContext) -> dict:
    cfg, inputs = ctx.config, ctx.inputs
    out = {"prompt_format": inputs.prompt_format,
           "candidate_scoring": inputs.candidates.rule,
           "candidate_prefix": repr(inputs.candidates.prefix),
           "answer_prefix": repr(cfg.answer_prefix), "corpus": inputs.corpus,
           "n_episodes": cfg.n_episodes, "facts": f"{cfg.facts[0]}-{cfg.facts[1]}",
           "backgrounds": ",".join(str(b) for b in sorted(inputs.examples)),
           "selections": ",".join(s.label for s in inputs.selections),
           **_search_settings(ctx)}
    if cfg.nstar:
        out.update(taus_nats=out.pop("taus"), grid_max=cfg.grid_max, extend_past_grid=True)
    if "babilong_left_out" in inputs.record:
        out["babilong_left_out"] = inputs.record["babilong_left_out"]
    return out


def _context_settings(ctx: RunContext) -> dict:
    cfg, inputs = ctx.config, ctx.inputs
    return {"corpus": inputs.corpus,
            "lengths": ",".join(str(x) for x in sorted(inputs.windows)),
            "n_documents": int(next(iter(inputs.windows.values())).shape[0]),
            "tail": cfg.tail, "selections": ",".join(s.label for s in inputs.selections),
            "document_protocol": "fixed (follow-up App. B.2) at the longest length, nested "
                                 "suffixes for the shorter ones",
            "initial_token_id": inputs.record.initial_token_id, **_search_settings(ctx)}


PROBES.register("qa", Probe(qa_probe.prepare_qa, qa_probe.run_qa, _qa_settings,
                            record=lambda inputs: inputs.record))
PROBES.register("context", Probe(context_sweep.prepare_context, context_sweep.run_context,
                                 _context_settings, record=context_sweep.context_record))


def _kept_settings(ctx: RunContext) -> dict:
    cfg, inputs = ctx.config, ctx.inputs
    return {"corpus": inputs.corpus,
            "lengths": ",".join(str(x) for x in sorted(inputs.windows)),
            "n_documents": int(next(iter(inputs.windows.values())).shape[0]),
            "rankings": ",".join(s.ranking for s in inputs.selections),
            "budgets": ",".join(str(n) for n in cfg.budgets), "query": "final",
            "random_repeats": kept.REPEATS, "distance": "euclidean", "universe": "full",
            "policy_inputs": "the unrestricted model's probabilities, queries and keys"}


PROBES.register("kept", Probe(kept.prepare_kept, kept.run_kept, _kept_settings,
                              record=context_sweep.context_record))


def _settings_frame(values: dict):
    import pandas as pd

    return pd.DataFrame({"setting": list(values), "value": [str(v) for v in values.values()]})


class Competition(Command):
    """The configured probe (``names.PROBES``) on the engine; its tables labelled with the
    run's model and corpus, and ``competition_settings``."""

    def prepare(self, ctx: RunContext) -> None:
        cfg = ctx.config
        if ctx.shape is not None and not ctx.shape.is_causal:
            raise ConfigError(f"{ctx.shape.name} is not a causal LM: the {cfg.probe} probe "
                              "scores next tokens")
        probe = PROBES[cfg.probe]
        ctx.inputs = probe.prepare(ctx)
        ctx.corpus_extra["probe"] = {"name": cfg.probe, **probe.record(ctx.inputs)}

    def run(self, ctx: RunContext) -> dict:
        cfg = ctx.config
        probe = PROBES[cfg.probe]
        frames = probe.run(ctx)
        settings = {"probe": cfg.probe, "model": ctx.model_label, "seed": cfg.seed,
                    **probe.settings(ctx)}
        frames["competition_settings"] = _settings_frame(settings)
        recorded = ctx.corpus_extra["probe"]
        recorded.update({k: v for k, v in settings.items()
                         if k not in ("model", "probe") and k not in recorded})
        out = {}
        for name, df in frames.items():
            if df is None or df.empty:
                continue  # no N* searched (nstar false): no curve, no N* table
            df = df.copy()
            for column in ("corpus", "model"):
                if column in df.columns:
                    df = df.drop(columns=column)
            df.insert(0, "corpus", ctx.corpus_label)
            df.insert(0, "model", ctx.model_label)
            out[name] = df
        return out

"""``attngeom competition --probe qa|context``: the probes of issue 31 as a run.

A thin adapter over ``pipeline.competition.competition``: the run's configuration
gives its options (rankings x renormalisation are the selections), the run's model
and tokenizer are passed in, and the tables come back labelled with the run's model
and corpus. The corpus is the background (qa) or the documents (context); the
bundled WikiText-2 test split is read by article, as ``competition`` reads it by
default, and any other corpus with the default document separator. The probe runs in
one piece (a killed run starts it again). ``competition_settings`` records what the
probe used (the prompt format chosen by ``auto``, the candidate scoring rule, ...).
"""

from __future__ import annotations

from attngeom.corpora.documents import probe_corpus
from attngeom.engine.progress import say
from attngeom.engine.runner import Command, RunContext
from attngeom.errors import ConfigError


def selections(cfg) -> tuple:
    from attngeom.probes.qa_probe import Selection

    return tuple(Selection(r, bool(f)) for r in cfg.rankings for f in cfg.renormalize)


class Competition(Command):
    """The qa or context probe; tables as ``competition`` returns them, labelled."""

    def run(self, ctx: RunContext) -> dict:
        from attngeom.probes.competition import competition

        cfg = ctx.config
        if not ctx.layout.is_causal:
            raise ConfigError(f"{ctx.layout.model_class} is not a causal LM: the "
                              f"{cfg.probe} probe scores next tokens")
        if cfg.probe == "qa" and cfg.prompt_format == "chat" and not getattr(
                ctx.tokenizer, "chat_template", None):
            raise ConfigError(f"prompt_format: chat asked, but {ctx.model_label}'s tokenizer "
                              "has no chat template (use plain or auto)")
        taus = cfg.effective_taus
        frames = competition(
            ctx.model, cfg.probe, tokenizer=ctx.tokenizer,
            corpus=probe_corpus(cfg.corpus), model_name=ctx.model_label, seed=cfg.seed,
            selections=selections(cfg), backgrounds=cfg.backgrounds,
            n_episodes=cfg.n_episodes, facts=tuple(cfg.facts),
            prompt_format=cfg.prompt_format, answer_prefix=cfg.answer_prefix,
            babilong=cfg.babilong,
            positional=cfg.positional, qa_taus=taus, grid_max=cfg.grid_max,
            lengths=cfg.lengths, n_documents=cfg.n_documents, context_taus=taus,
            tail=cfg.tail, nstar=cfg.nstar, n_boot=cfg.bootstrap,
            progress=lambda text: say(ctx.progress, text))
        out = {}
        for name, df in frames.items():
            if df is None or df.empty:
                continue  # no N* searched (nstar false): no curve, no N* table
            df = df.copy()
            if "model" in df.columns:
                df["model"] = ctx.model_label
                if "corpus" not in df.columns:
                    df.insert(1, "corpus", ctx.corpus_label)
                else:
                    df["corpus"] = ctx.corpus_label
            out[name] = df
        if "qa_answers" in out:
            ctx.counts["qa_examples"] = int(out["qa_answers"]["n_examples"].sum())
        if "context_nll" in out:
            ctx.counts["context_lengths"] = int(out["context_nll"]["length"].nunique())
        return out

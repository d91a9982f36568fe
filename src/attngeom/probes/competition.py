"""``competition(model, probe=...)``: the two probes of issue 31 as long tables.

- ``probe="qa"``: generated bAbI qa1 episodes (``attngeom.probes.qa``) with 0 / 256 /
  512 / 1024 tokens of corpus background (or real BABILong rows from ``babilong``), the
  answers, the competence screen, the support statistics at the answer query and N*
  per selection (``attngeom.probes.qa_probe``);
- ``probe="context"``: nested windows of several lengths from the fixed-length document
  protocol, N* per length under tail128 and all-token scoring, the document bootstrap
  and the log-log slope (``attngeom.probes.context_sweep``).

Both return ``{table name: DataFrame}`` plus ``competition_settings`` (one row per
setting: the prompt format actually used, the candidate scoring rule, the corpus, the
seed, ...), which is what a manifest records.
"""

from __future__ import annotations

from collections.abc import Sequence

from attngeom.corpora.documents import probe_documents
from attngeom.errors import ConfigError
from attngeom.names import PROBES
from attngeom.probes.qa_probe import Selection

DEFAULT_SELECTIONS = (Selection("attention", False),)


def _model(model, tokenizer):
    if isinstance(model, str):
        from attngeom.capture import load_model

        return (*load_model(model, tokenizer=tokenizer), model)
    if tokenizer is None:
        raise ConfigError("expected a tokenizer with a loaded model (tokenizer=...)")
    return model, tokenizer, type(model).__name__


def _settings(**values) -> object:
    import pandas as pd

    return pd.DataFrame({"setting": list(values), "value": [str(v) for v in values.values()]})


def competition(model, probe: str = "qa", *, tokenizer=None, corpus: str | None = None,
                model_name: str | None = None, seed: int = 2027,
                selections: Sequence[Selection] = DEFAULT_SELECTIONS,
                # qa
                backgrounds: Sequence[int] = (0, 256, 512, 1024), n_episodes: int = 60,
                facts: tuple[int, int] = (2, 6), prompt_format: str = "auto",
                answer_prefix: str = "",
                babilong: str | None = None, positional: bool = True,
                qa_taus: Sequence[float] = (0.10, 0.20), grid_max: int = 256,
                extend: bool = True,
                # context
                lengths: Sequence[int] = (256, 512, 1024, 2048), n_documents: int = 50,
                context_taus: Sequence[float] = (0.01, 0.05, 0.10), tail: int = 128,
                nstar: bool = True, n_boot: int = 1000, progress=None) -> dict:
    """Run one competition probe; returns ``{table: DataFrame}`` (module docstring).

    ``model``: a loaded model (with ``tokenizer``) or a path / hub id / asset path.
    ``prompt_format``: ``"plain"``, ``"chat"``, or ``"auto"`` (chat where the tokenizer
    has a template); the one used is in ``competition_settings``. ``corpus``: the
    background (qa) or document (context) corpus, WikiText-2's test articles by default.
    """
    PROBES.check(probe)
    model, tokenizer, name = _model(model, tokenizer)
    name = model_name or name
    from attngeom.capture import model_layout

    layout = model_layout(model)
    if probe == "qa":
        return _qa(model, tokenizer, name, layout, corpus=corpus, seed=seed,
                   selections=selections, backgrounds=backgrounds, n_episodes=n_episodes,
                   facts=facts, prompt_format=prompt_format, answer_prefix=answer_prefix,
                   babilong=babilong,
                   positional=positional, taus=qa_taus, grid_max=grid_max, extend=extend,
                   nstar=nstar, n_boot=n_boot, progress=progress)
    from attngeom.probes.context_sweep import context_sweep, sweep_windows

    docs, corpus_name = probe_documents(corpus)
    windows, record = sweep_windows(docs, tokenizer, lengths, n_documents=n_documents,
                                    seed=seed, dataset=corpus_name, model_id=name,
                                    config_bos=getattr(model.config, "bos_token_id", None),
                                    tail=tail)
    top = max(windows)
    if layout.max_positions and top > layout.max_positions:
        raise ConfigError(f"a context of {top} tokens is longer than the model's "
                          f"{layout.max_positions} positions; ask for shorter lengths")
    frames = context_sweep(model, windows, selections=selections, taus=context_taus,
                           tail=tail, n_boot=n_boot, seed=seed, model_name=name,
                           corpus=corpus_name, progress=progress)
    frames["competition_settings"] = _settings(
        probe="context", model=name, corpus=corpus_name, seed=seed,
        lengths=",".join(str(x) for x in sorted(windows)), n_documents=n_documents,
        tail=tail, selections=",".join(s.label for s in selections),
        document_protocol="fixed (follow-up App. B.2) at the longest length, nested "
                          "suffixes for the shorter ones",
        initial_token_id=record.initial_token_id)
    return frames


def _qa(model, tokenizer, name, layout, *, corpus, seed, selections, backgrounds,
        n_episodes, facts, prompt_format, answer_prefix, babilong, positional, taus,
        grid_max, extend, nstar, n_boot, progress) -> dict:
    from attngeom.probes import qa
    from attngeom.probes.qa_probe import qa_probe

    if prompt_format == "auto":
        prompt_format = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    extra: dict = {}
    if babilong is not None:
        rows, dropped = qa.load_babilong(tokenizer, source=babilong,
                                         prompt_format=prompt_format, n=n_episodes,
                                         max_positions=layout.max_positions,
                                         answer_prefix=answer_prefix)
        examples = {rows[0].background: rows}
        corpus_name = f"BABILong {babilong}"
        extra["babilong_left_out"] = dropped
    else:
        episodes = qa.generate_episodes(n_episodes, facts=facts, seed=seed)
        sentences, corpus_name = [], "none"
        if any(b > 0 for b in backgrounds):
            docs, corpus_name = probe_documents(corpus)
            sentences = qa.background_sentences(docs)
        examples = {int(b): qa.build_examples(episodes, tokenizer, int(b), sentences=sentences,
                                              prompt_format=prompt_format, seed=seed,
                                              max_positions=layout.max_positions,
                                              answer_prefix=answer_prefix)
                    for b in backgrounds}
    frames = qa_probe(model, tokenizer, examples, selections=selections,
                      positional=positional, taus=taus, nstar=nstar, grid_max=grid_max,
                      extend=extend, n_boot=n_boot, seed=seed, model_name=name,
                      progress=progress)
    cands = qa.candidate_tokens(tokenizer,
                                prefix=qa.candidate_prefix(prompt_format, answer_prefix))
    frames["competition_settings"] = _settings(
        probe="qa", model=name, prompt_format=prompt_format, candidate_scoring=cands.rule,
        candidate_prefix=repr(cands.prefix), answer_prefix=repr(answer_prefix),
        corpus=corpus_name, seed=seed, n_episodes=n_episodes, facts=f"{facts[0]}-{facts[1]}",
        backgrounds=",".join(str(b) for b in sorted(examples)),
        selections=",".join(s.label for s in selections) + (",positional/deletion"
                                                            if positional else ""),
        taus_nats=",".join(f"{t:g}" for t in taus), grid_max=grid_max,
        extend_past_grid=extend, **extra)
    return frames

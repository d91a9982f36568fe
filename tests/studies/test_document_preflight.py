"""A study (or a single run) that asks more documents than its corpus holds fails in
one line before any model loads, naming how many the corpus has (issue 30, Bad input)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attngeom.capture import load_tokenizer
from attngeom.config import CompetitionContextConfig
from attngeom.corpora.documents import check_documents
from attngeom.errors import CorpusError
from attngeom.studies import reproduce as reproduce_module
from attngeom.studies.study import load_study

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "studies" / "followup-small.toml"


def _too_many(tmp_path: Path) -> Path:
    """followup-small with the WikiText restriction asking 500 documents: the
    TinyStories cells come first in the plan, so a late check would run them."""
    text = SMALL.read_text(encoding="utf-8")
    text = text.replace('[corpora.wikitext-2]\ncorpus = "asset:wikitext-2-test"\n'
                        'separator = "wikitext-articles"\nn_documents = 8',
                        '[corpora.wikitext-2]\ncorpus = "asset:wikitext-2-test"\n'
                        'separator = "wikitext-articles"\nn_documents = 500')
    assert "n_documents = 500" in text
    path = tmp_path / "too-many.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_study_fails_before_the_first_model_loads(tmp_path, monkeypatch):
    loads = []
    monkeypatch.setattr(reproduce_module, "_load", lambda *a, **k: loads.append(a))
    study = load_study(_too_many(tmp_path))
    assert any(c.corpus == "wikitext-2" for c in study.cells)
    out = tmp_path / "out"
    with pytest.raises(CorpusError, match=r"has \d+ eligible documents.*n_documents=500"):
        reproduce_module.reproduce(study, out, progress=False)
    assert loads == []  # no model was loaded, no cell ran
    assert not any((out / c.directory / "manifest.json").exists() for c in study.cells)


def test_a_context_sweep_is_checked_at_its_longest_length():
    tok = load_tokenizer(str(ROOT / "src" / "attngeom" / "data" / "stories260K-hf"))
    from attngeom.assets import asset

    cfg = CompetitionContextConfig(model=asset("stories260K"), corpus=asset("wikitext-2-test"),
                                   lengths=[64, 128], n_documents=4, tail=32)
    check_documents(cfg, tok)  # enough documents: nothing raised
    with pytest.raises(CorpusError, match=r"has \d+ eligible documents.*n_documents=5000"):
        check_documents(cfg.with_(n_documents=5000), tok)

"""Published reference values: well-formed, traceable, filterable."""

from __future__ import annotations

import json
import math

import pytest

from attngeom.errors import ConfigError
from attngeom.studies import references as refs
from attngeom.studies.presets import PRESETS
from attngeom.studies.references import QUANTITIES, REFERENCES, UNAVAILABLE, Reference


def _ref(**kw) -> Reference:
    # a made-up entry for exercising the code; never a published value
    base = dict(source="test", where="Table 0", model="gpt2", corpus="wikitext-103",
                quantity="f_score", value=0.5, params=(("n", 8), ("rule", "attention")),
                quote="a test fixture, not a published number")
    base.update(kw)
    return Reference(**base)


def test_every_reference_is_well_formed():
    # a loop, not parametrize: the table may be empty (see UNAVAILABLE) without a skip
    for ref in REFERENCES:
        assert ref.model in PRESETS, ref
        assert ref.quantity in QUANTITIES, ref
        assert ref.source.strip() and ref.where.strip() and ref.quote.strip(), ref
        assert len(ref.quote.split()) <= refs.MAX_QUOTE_WORDS, ref
        assert math.isfinite(ref.value), ref
        assert all(k in refs.PARAM_KEYS for k, _ in ref.params), ref


def test_a_paper_without_values_says_why():
    quoted = {r.source for r in REFERENCES}
    for source in (refs.GEOMETRY_PAPER, refs.FOLLOW_UP):
        assert source in quoted or UNAVAILABLE.get(source, "").strip(), source
    assert not quoted & set(UNAVAILABLE), "a source is both quoted and marked unavailable"


def test_the_vocabulary_covers_what_combine_measures():
    # combine._measured looks these up; a rename here would silently show NaN there
    assert {"f_score", "precision", "recall", "n_star", "spearman_f_dnll"} <= set(QUANTITIES)


@pytest.mark.parametrize("bad", [
    {"model": "llama-2"}, {"quantity": "accuracy"}, {"value": math.nan}, {"value": True},
    {"where": " "}, {"quote": ""}, {"source": ""}, {"quote": "word " * 21},
    {"params": (("n", 8), ("n", 4))}, {"params": (("window", 8),)},
    {"params": (("rule", "attn"),)},
])
def test_malformed_references_fail_on_construction(bad):
    with pytest.raises(ConfigError):
        _ref(**bad)


@pytest.fixture
def fixtures(monkeypatch):
    table = (
        _ref(),
        _ref(model="gemma-7b", quantity="recall"),
        _ref(corpus="OpenWebText", quantity="precision", params=(("n", 4),)),
    )
    monkeypatch.setattr(refs, "REFERENCES", table)
    return table


def test_filtering(fixtures):
    assert refs.references() == list(fixtures)
    assert refs.references(model="gemma-7b") == [fixtures[1]]
    assert refs.references(corpus="openwebtext") == [fixtures[2]]
    assert refs.references(model="gpt2", quantity="f_score") == [fixtures[0]]
    assert refs.references(model="llama-2-7b") == []


def test_frame_has_one_row_per_reference(fixtures):
    df = refs.references_frame()
    assert len(df) == len(fixtures)
    assert list(df.columns) == list(refs.FRAME_COLUMNS)
    assert json.loads(df["params"].iloc[0]) == {"n": 8, "rule": "attention"}


def test_frame_of_the_real_table():
    df = refs.references_frame()
    assert len(df) == len(REFERENCES)
    assert list(df.columns) == list(refs.FRAME_COLUMNS)

"""The follow-up's fixed-length document protocol (corpora/documents.py).

Golden hashes by hand, properties of the pure functions with ``hypothesis`` against a
slow reference written from the paper's text (App. B.2), then the real stories260K
tokenizer on the TinyStories and WikiText-2 assets, and the runner's wiring.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.assets import asset
from attngeom.config import AnalysisConfig, RestrictConfig
from attngeom.corpora.corpus import read_documents
from attngeom.corpora.documents import (
    MASK63,
    document_order,
    eligible,
    fixed_windows,
    initial_token,
    protocol_hash,
    window_offset,
)
from attngeom.errors import ConfigError, CorpusError

STORIES = Path(asset("stories260K"))
TINYSTORIES = Path(asset("tinystories"))
WIKI = Path(asset("wikitext-2-test"))


# --------------------------------------------------------------------------- golden


def test_protocol_hash_golden_values():
    """Worked by hand with hashlib, the paper's recipe step by step:

    >>> d = hashlib.sha256(b"2027|openwebtext|0").digest()
    >>> d[:8].hex()            # top bit 0: the mask changes nothing
    '7a9926fac48830cb'
    >>> int.from_bytes(d[:8], "big")
    8834135002544877771
    >>> d = hashlib.sha256(b"2027|wikitext-103|abc").digest()
    >>> d[:8].hex()            # top bit 1: the mask clears it
    'f7745f2c42836a65'
    >>> int.from_bytes(d[:8], "big"), int.from_bytes(d[:8], "big") - 2**63
    (17830981468365744741, 8607609431510968933)
    """
    assert protocol_hash(2027, "openwebtext", "0") == 8834135002544877771
    assert protocol_hash(2027, "wikitext-103", "abc") == 8607609431510968933
    # str() of each argument: an int and its decimal string hash alike
    assert protocol_hash(2027, "wikitext-103", "abc") == protocol_hash("2027", "wikitext-103",
                                                                       "abc")
    # offset of a 1500-token document at L = 1024: H(...) mod (1500 - 1024 + 2)
    h = int.from_bytes(hashlib.sha256(b"2027|m|d|x|1024").digest()[:8], "big") & MASK63
    assert window_offset(2027, "m", "d", "x", 1024, 1500) == h % 478


def test_the_mask_keeps_63_bits():
    for args in [(0,), ("a", "b"), (2027, "wikitext-103", "abc")]:
        assert 0 <= protocol_hash(*args) <= MASK63


# --------------------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5000), L=st.integers(2, 2048), doc=st.text(max_size=12),
       seed=st.integers(-5, 10**6))
def test_offset_in_range_and_window_exact(n, L, doc, seed):
    if not eligible(n, L):
        assert n < L - 1
        with pytest.raises(ValueError):
            window_offset(seed, "m", "d", doc, L, n)
        return
    o = window_offset(seed, "m", "d", doc, L, n)
    assert 0 <= o <= n - L + 1
    content = list(range(n))
    assert len(content[o : o + L - 1]) == L - 1  # + the initial token: exactly L


@settings(max_examples=100, deadline=None)
@given(ids=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=30, unique=True),
       seed=st.integers(0, 10**6), data=st.data())
def test_order_is_a_stable_sort_by_hash(ids, seed, data):
    order = document_order(seed, "ds", ids)
    assert sorted(order) == list(range(len(ids)))
    keys = [protocol_hash(seed, "ds", ids[i]) for i in order]
    assert keys == sorted(keys)
    shuffled = data.draw(st.permutations(ids))
    # the same ids in another order come out in the same hash order
    assert [shuffled[i] for i in document_order(seed, "ds", shuffled)] == \
        [ids[i] for i in order]


class WordTokenizer:
    """One token per whitespace word (its length + 10), BOS 1: enough to check the rule."""

    bos_token_id = 1

    def __call__(self, texts, add_special_tokens=False, **_):
        assert add_special_tokens is False
        return {"input_ids": [[len(w) + 10 for w in t.split()] for t in texts]}

    def convert_ids_to_tokens(self, i):
        return f"<{i}>"


def _reference(docs, L, K, seed, dataset, model_id):
    """The paper's B.2 written out plainly: dedupe, sort by H, skip short, offset, slice."""
    seen, unique = set(), []
    for d in docs:
        h = hashlib.sha256(d.encode()).hexdigest()
        if h not in seen:
            seen.add(h)
            unique.append((h, d))
    unique.sort(key=lambda x: protocol_hash(seed, dataset, x[0]))
    out = []
    for doc_id, d in unique:
        content = [len(w) + 10 for w in d.split()]
        if len(content) < L - 1:
            continue
        o = protocol_hash(seed, model_id, dataset, doc_id, L) % (len(content) - L + 2)
        out.append([1, *content[o : o + L - 1]])
        if len(out) == K:
            break
    return out


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=25),
       L=st.integers(2, 20), K=st.integers(1, 8), seed=st.integers(0, 99))
def test_fixed_windows_match_the_reference(lengths, L, K, seed):
    docs = [" ".join("w" * (1 + (i + j) % 5) for j in range(n)) + f" d{i}"
            for i, n in enumerate(lengths)]
    docs += docs[:2]  # identical copies: kept once
    want = _reference(docs, L, K, seed, "ds", "m")
    if len(want) < K:
        with pytest.raises(CorpusError, match=f"has {len(want)} eligible documents"):
            fixed_windows(docs, WordTokenizer(), L, n_documents=K, seed=seed, dataset="ds",
                          model_id="m")
        return
    windows, record = fixed_windows(docs, WordTokenizer(), L, n_documents=K, seed=seed,
                                    dataset="ds", model_id="m")
    assert [w.input_ids.tolist() for w in windows] == want
    assert [w.index for w in windows] == list(range(K))
    assert all(len(w) == L and w.special.tolist() == [True] + [False] * (L - 1)
               for w in windows)
    assert record.duplicates == min(2, len(lengths))
    assert record.tokenized - record.too_short == K
    # the first K of K + 1 documents are the same windows (stable order, no reshuffle)
    if len(_reference(docs, L, K + 1, seed, "ds", "m")) == K + 1:
        more, _ = fixed_windows(docs, WordTokenizer(), L, n_documents=K + 1, seed=seed,
                                dataset="ds", model_id="m")
        assert [w.input_ids.tolist() for w in more[:K]] == want


def test_skip_rule_is_exactly_L_minus_one():
    docs = ["a " * 3, "b " * 4, "c " * 5]  # 3, 4 and 5 content tokens
    windows, record = fixed_windows(docs, WordTokenizer(), 5, n_documents=2, seed=0,
                                    dataset="ds", model_id="m")
    assert sorted(w.input_ids[1:].tolist()[0] for w in windows) == [11, 11]  # b, c
    assert record.too_short == (record.tokenized - 2)
    with pytest.raises(CorpusError, match="has 2 eligible documents .* asks n_documents=3"):
        fixed_windows(docs, WordTokenizer(), 5, n_documents=3, seed=0, dataset="ds",
                      model_id="m")


def test_initial_token_rule():
    assert initial_token(5, None) == (5, "tokenizer")
    assert initial_token(None, 7) == (7, "config")
    assert initial_token(3, 3) == (3, "tokenizer")
    with pytest.raises(ConfigError, match="disagree"):
        initial_token(3, 4)
    with pytest.raises(ConfigError, match="neither"):
        initial_token(None, None)


def test_no_bos_takes_the_configs():
    tok = WordTokenizer()
    tok.bos_token_id = None
    windows, record = fixed_windows(["x y z"], tok, 3, n_documents=1, seed=0, dataset="d",
                                    model_id="m", config_bos=42)
    assert windows[0].input_ids[0].item() == 42 and record.initial_source == "config"


# --------------------------------------------------------------------------- real tokenizer


@pytest.fixture(scope="module")
def stories_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(STORIES))


@pytest.mark.parametrize("corpus, separator, L", [(TINYSTORIES, None, 64),
                                                   (WIKI, "wikitext-articles", 256)])
def test_real_tokenizer_windows_are_slices_of_one_document(stories_tok, corpus, separator, L):
    docs, info = read_documents(str(corpus), separator=separator)
    windows, record = fixed_windows(docs, stories_tok, L, n_documents=20, seed=2027,
                                    dataset=info.name, model_id="stories260K")
    by_id = {hashlib.sha256(d.encode()).hexdigest(): d for d in docs}
    assert len(windows) == 20 and len({c[0] for c in record.chosen}) == 20
    for w, (doc_id, n, o) in zip(windows, record.chosen, strict=True):
        assert len(w) == L and w.input_ids[0].item() == stories_tok.bos_token_id == 1
        content = stories_tok(by_id[doc_id], add_special_tokens=False)["input_ids"]
        assert len(content) == n >= L - 1 and 0 <= o <= n - L + 1
        assert w.input_ids[1:].tolist() == content[o : o + L - 1]
    # another model gets other offsets of the same documents, in the same order
    other, rec2 = fixed_windows(docs, stories_tok, L, n_documents=20, seed=2027,
                                dataset=info.name, model_id="another-model")
    assert [c[0] for c in rec2.chosen] == [c[0] for c in record.chosen]
    assert any(not torch.equal(a.input_ids, b.input_ids)
               for a, b in zip(windows, other, strict=True))


def test_the_wikitext_assets_eligible_count_is_in_the_error(stories_tok):
    docs, info = read_documents(str(WIKI), separator="wikitext-articles")
    with pytest.raises(CorpusError, match=r"corpus wiki\.test\.lf has \d+ eligible documents"):
        fixed_windows(docs, stories_tok, 4096, n_documents=len(docs), seed=2027,
                      dataset=info.name, model_id="stories260K", name=info.name)


# --------------------------------------------------------------------------- config, runner


def test_config_options():
    cfg = RestrictConfig(model=str(STORIES), corpus=str(TINYSTORIES),
                         document_protocol="fixed", n_documents=12)
    assert cfg.document_protocol == "fixed" and cfg.n_documents == 12
    with pytest.raises(ConfigError, match="document_protocol"):
        RestrictConfig(model="m", corpus="c", document_protocol="hashed")
    with pytest.raises(ConfigError, match="n_documents"):
        RestrictConfig(model="m", corpus="c", n_documents=0)
    with pytest.raises(ConfigError, match="drop windows_per_document and sample_documents"):
        AnalysisConfig(model="m", corpus="c", document_protocol="fixed", sample_documents=4)


def test_runner_uses_the_protocol_and_records_it(stories_tok):
    from attngeom.corpora.documents import load_windows

    cfg = AnalysisConfig(model=str(STORIES), corpus=str(TINYSTORIES), window_length=48,
                         document_protocol="fixed", n_documents=6, n_windows=0, seed=2027,
                         corpus_label="tinystories", model_label="stories260K")
    windows, info, policy = load_windows(cfg, stories_tok)
    direct, record = fixed_windows(read_documents(str(TINYSTORIES))[0], stories_tok, 48,
                                   n_documents=6, seed=2027, dataset="tinystories",
                                   model_id="stories260K")
    assert [w.input_ids.tolist() for w in windows] == [w.input_ids.tolist() for w in direct]
    meta = info.to_dict()["document_protocol"]
    assert meta["kind"] == "fixed" and meta["n_documents"] == 6 and meta["seed"] == 2027
    assert meta["initial_source"] == "tokenizer" and len(meta["windows"]) == 6
    assert policy.kind == "initial" and policy.token_id == 1
    # shards slice the same windows
    part, _, _ = load_windows(cfg, stories_tok, n_windows=2, start_window=3)
    assert [w.index for w in part] == [3, 4]
    assert torch.equal(part[0].input_ids, windows[3].input_ids)
    too_many = cfg.with_(n_documents=5000)
    with pytest.raises(CorpusError, match="eligible documents"):
        load_windows(too_many, stories_tok)

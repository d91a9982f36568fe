"""Hub corpora offline, WikiText articles and seeded document samples (method §10).

No test reaches the network: sockets are blocked where the hub path runs, and the
``datasets`` cache is either an empty tmp folder, a monkeypatched ``load_dataset``
or a real cache folder built here from a local Parquet file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attngeom.assets import asset
from attngeom.corpora.corpus import (
    WIKITEXT_ARTICLES,
    CorpusInfo,
    document_sha256,
    read_documents,
    sample_documents,
    split_wikitext_articles,
)
from attngeom.errors import ConfigError, CorpusError

INFO_KEYS = ["name", "path", "sha256", "n_documents", "n_characters"]


def _wikitext_2_test() -> Path:
    return Path(asset("wikitext-2-test", "--corpus"))  # bundled: always there


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection or resolve a name, recorded and refused."""
    attempts: list[tuple] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty ``datasets`` cache, named both by the environment and the live config."""
    import datasets.config

    cache = tmp_path / "hf-datasets"
    cache.mkdir()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def _fake_hub(monkeypatch, rows: list[str], fingerprint_of: list | None = None):
    """``datasets.load_dataset`` answering every WikiText/OWT id with ``rows``, offline only."""
    import datasets

    calls = []

    def fake_load(repo, config, split):
        import datasets.config as dc

        assert dc.HF_HUB_OFFLINE is True
        calls.append((repo, config, split))
        ds = datasets.Dataset.from_dict({"text": rows})
        if fingerprint_of is not None:
            fingerprint_of.append(ds._fingerprint)
        return ds

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    return calls


# --------------------------------------------------------------------------- offline error


@pytest.mark.parametrize(
    ("spec", "repo", "config", "split"),
    [
        ("wikitext-103", "Salesforce/wikitext", "wikitext-103-raw-v1", "test"),
        ("wikitext-2:validation", "Salesforce/wikitext", "wikitext-2-raw-v1", "validation"),
        ("openwebtext", "Skylion007/openwebtext", None, "train"),
    ],
)
def test_absent_offline_is_one_line_with_cache_and_fetch_hint(
    spec, repo, config, split, empty_cache, no_network
):
    import datasets  # noqa: F401 - imported outside the timing

    t0 = time.perf_counter()
    with pytest.raises(CorpusError) as e:
        read_documents(spec)
    assert time.perf_counter() - t0 < 10
    assert no_network == []
    msg = str(e.value)
    assert "\n" not in msg
    named = f", config {config}" if config else ""
    alias = spec.partition(":")[0]
    assert msg.startswith(f"dataset {alias!r} (hub id {repo}{named}, split {split}) is not "
                          "available offline; pass a local .txt, .jsonl or .parquet file")
    assert f"the datasets cache {empty_cache} holds no copy" in msg
    # the fetch hint is a runnable command that loads exactly this split
    code = re.search(r'python -c "([^"]+)"', msg).group(1)
    call = ast.parse(code).body[1].value
    assert ast.unparse(call.func) == "datasets.load_dataset"
    assert [a.value for a in call.args] == [repo, *([config] if config else [])]
    assert [(k.arg, k.value.value) for k in call.keywords] == [("split", split)]
    assert "HF_DATASETS_CACHE" in msg


def test_absent_offline_names_the_cache_from_hf_home(tmp_path):
    """In a fresh process the cache path comes from HF_HOME, as ``datasets`` derives it."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_DATASETS_CACHE", "HF_HOME")}
    env["HF_HOME"] = str(tmp_path / "home")
    code = ("from attngeom.corpora.corpus import read_documents\n"
            "try:\n    read_documents('wikitext-103')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.startswith("CorpusError dataset 'wikitext-103'"), out.stderr[-2000:]
    assert f"the datasets cache {tmp_path / 'home' / 'datasets'} holds no copy" in out.stdout


# --------------------------------------------------------------------------- article split


def test_article_split_keeps_sections_and_tokens():
    text = ("\n\n \n = Alpha = \n The alpha @-@ beta text , 2 @,@ 000 .\n = = History = = \n"
            " More alpha .\n = = = Early = = = \n Earliest .\n = Beta = \n Beta 3 @.@ 5 .\n")
    assert split_wikitext_articles(text) == [
        "= Alpha = \n The alpha @-@ beta text , 2 @,@ 000 .\n = = History = = \n More alpha ."
        "\n = = = Early = = = \n Earliest .",
        "= Beta = \n Beta 3 @.@ 5 .",
    ]
    # CRLF is normalised, text before the first title is kept as its own document
    crlf = "Preface line .\r\n = Alpha = \r\n a .\r\n = Beta = \r\n b .\r\n"
    assert split_wikitext_articles(crlf) == ["Preface line .", "= Alpha = \n a .",
                                             "= Beta = \n b ."]
    assert split_wikitext_articles(" \n \n") == []
    assert split_wikitext_articles(" no title at all \n") == ["no title at all"]


@pytest.mark.parametrize(
    ("line", "title"),
    [(" = Robert Boulter = \n", True), ("= T =", True), (" = A = B = ", True),
     (" = = Career = = ", False), (" = = = 2000 = = = ", False), (" = T", False),
     ("=T=", False), (" = = ", False), ("= = =", False), ("a = b =", False)],
)
def test_only_level_one_headings_start_articles(line, title):
    text = f" = Before = \n x .\n{line}\n y .\n"
    assert len(split_wikitext_articles(text)) == (2 if title else 1)


def test_blank_line_markup_keeps_heading_shaped_lines_inside():
    """WikiText frames titles with blank lines; a formula line inside a paragraph is no title."""
    marked = (" \n = Filter = \n \n The cut @-@ off frequency of wc \n = 1 rad / s and k = \n"
              " 1 ohm .\n \n = = Design = = \n \n Text .\n \n = Next = \n \n More .\n")
    docs = split_wikitext_articles(marked)
    assert len(docs) == 2
    assert docs[0].startswith("= Filter =") and "\n = 1 rad / s and k = \n 1 ohm ." in docs[0]
    assert "= = Design = =" in docs[0] and docs[1] == "= Next = \n \n More ."
    # the same text without its blank lines can only go by the shape (module docstring)
    bare = "".join(line for line in marked.splitlines(keepends=True) if line.strip())
    assert [d.split("\n")[0] for d in split_wikitext_articles(bare)] == [
        "= Filter = ", "= 1 rad / s and k = ", "= Next = "]


def test_separator_wikitext_articles_on_a_local_file(tmp_path):
    p = tmp_path / "wiki.raw"
    p.write_bytes(b" = A = \r\n a @-@ a .\r\n = = S = = \r\n s .\r\n = B = \r\n b .\r\n")
    docs, info = read_documents(str(p), separator=WIKITEXT_ARTICLES)
    assert docs == ["= A = \n a @-@ a .\n = = S = = \n s .", "= B = \n b ."]
    assert info.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert list(info.to_dict()) == INFO_KEYS
    assert read_documents(str(p))[0] == [docs[0] + "\n " + docs[1]]  # default: one stream


def test_real_wikitext_2_articles():
    path = _wikitext_2_test()
    stream, _ = read_documents(str(path))
    docs, info = read_documents(str(path), separator=WIKITEXT_ARTICLES)
    # 60 articles; this copy has no blank lines, so two formula lines of "Constant k
    # filter" that have a title's shape start documents too (module docstring)
    assert info.n_documents == len(docs) == 62
    assert docs[0].startswith("= Robert Boulter = \n Robert Boulter is an English film")
    assert docs[-1].startswith("= The Hustler ( film ) =")
    assert sum(d.startswith(("= 1 rad / s", "= 1 henry")) for d in docs) == 2
    assert all(d.startswith("= ") for d in docs)
    assert sum("\n = = " in d for d in docs) >= 55  # sections stay inside their article
    assert sum(d.count("@-@") for d in docs) == stream[0].count("@-@") > 0
    assert "".join("".join(d.split()) for d in docs) == "".join(stream[0].split())


# --------------------------------------------------------------------------- sampling


DOCS = [f"document {i} text" for i in range(40)]


def _rank(seed: int, text: str) -> bytes:
    digest = hashlib.sha256(text.encode()).digest()
    return hashlib.sha256(b"attngeom-sample-v1\0" + str(seed).encode() + b"\0" + digest).digest()


def test_sample_is_the_documented_hash_ranking():
    for seed in (0, 1, -7, 2**70):
        expected = sorted(range(len(DOCS)), key=lambda i: (_rank(seed, DOCS[i]), i))
        assert sample_documents(DOCS, len(DOCS), seed) == expected
    assert sample_documents(["a", "b", "c", "d", "e"], 5, seed=0) == [2, 3, 0, 1, 4]


def test_sample_deterministic_seeded_prefix_stable():
    first = sample_documents(DOCS, 10, seed=3)
    assert first == sample_documents(iter(DOCS), 10, seed=3)  # any iterable, streamed
    assert len(set(first)) == 10
    assert len({tuple(sample_documents(DOCS, 10, seed=s)) for s in range(5)}) == 5
    full = sample_documents(DOCS, len(DOCS), seed=3)
    assert sorted(full) == list(range(len(DOCS)))  # k = n: every document, drawn order
    for k in range(1, len(DOCS) + 1):
        assert sample_documents(DOCS, k, seed=3) == full[:k]


def test_sample_ignores_reading_order_and_takes_hashes():
    shuffled = DOCS[:]
    random.Random(5).shuffle(shuffled)
    picked = [DOCS[i] for i in sample_documents(DOCS, 7, seed=11)]
    assert [shuffled[i] for i in sample_documents(shuffled, 7, seed=11)] == picked
    hexes = (document_sha256(d) for d in DOCS)  # no text held
    assert sample_documents(hexes, 7, seed=11, hashed=True) == sample_documents(DOCS, 7, 11)
    raw = [hashlib.sha256(d.encode()).digest() for d in DOCS]
    assert sample_documents(raw, 7, seed=11, hashed=True) == sample_documents(DOCS, 7, 11)


def test_sample_same_in_another_process():
    code = ("from attngeom.corpora.corpus import sample_documents\n"
            f"print(sample_documents({DOCS!r}, 12, seed=42))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(sample_documents(DOCS, 12, seed=42)), out.stderr[-2000:]


def test_sample_errors():
    with pytest.raises(CorpusError) as e:
        sample_documents(DOCS, 41, seed=0)
    assert str(e.value) == ("cannot sample 41 documents from the documents given: it holds "
                            "only 40; pass sample <= 40")
    for k in (0, -1, True, 1.5, None):
        with pytest.raises(ConfigError, match=r"^sample: expected a positive integer"):
            sample_documents(DOCS, k, seed=0)
    for seed in (1.0, "1", None, False):
        with pytest.raises(ConfigError, match=r"^seed: expected an integer"):
            sample_documents(DOCS, 2, seed=seed)
    with pytest.raises(ConfigError, match=r"documents\[1\]: expected str"):
        sample_documents(["a", b"b"], 1)
    with pytest.raises(ConfigError, match=r"documents\[0\]: expected a sha256"):
        sample_documents(["not a digest"], 1, hashed=True)


# --------------------------------------------------------------------------- read_documents


@pytest.fixture
def jsonl(tmp_path) -> Path:
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"row {i} \r\nline two"}) for i in range(20)))
    return p


def test_read_documents_sample_jsonl(jsonl):
    every, base = read_documents(str(jsonl))
    assert read_documents(str(jsonl), sample=None, seed=9) == (every, base)
    assert list(base.to_dict()) == INFO_KEYS  # unsampled: as before
    docs, info = read_documents(str(jsonl), sample=5, seed=3)
    assert docs == [every[i] for i in sample_documents(every, 5, seed=3)]
    assert (info.sample, info.seed, info.source_documents) == (5, 3, 20)
    assert info.source_sha256 == base.sha256 and info.sha256 != base.sha256
    assert (info.name, info.path, info.n_documents) == (base.name, base.path, 5)
    assert info.n_characters == sum(map(len, docs))
    assert list(info.to_dict()) == [*INFO_KEYS, "sample", "seed", "source_sha256",
                                    "source_documents"]
    assert read_documents(str(jsonl), sample=5, seed=3) == (docs, info)
    ids = {read_documents(str(jsonl), sample=k, seed=s)[1].sha256
           for k, s in ((5, 3), (5, 4), (6, 3), (20, 3))}
    assert len(ids) == 4  # the identification follows the sample
    assert read_documents(str(jsonl), sample=6, seed=3)[0][:5] == docs


def test_read_documents_sample_limits(jsonl):
    with pytest.raises(CorpusError) as e:
        read_documents(str(jsonl), sample=21)
    assert str(e.value) == ("cannot sample 21 documents from corpus rows: it holds only 20; "
                            "pass sample <= 20")
    with pytest.raises(CorpusError, match=r"corpus rows read with max_documents=4: it holds "
                                          r"only 4"):
        read_documents(str(jsonl), sample=5, max_documents=4)
    first, _ = read_documents(str(jsonl), max_documents=8)
    docs, info = read_documents(str(jsonl), sample=3, seed=1, max_documents=8)
    assert docs == [first[i] for i in sample_documents(first, 3, seed=1)]
    assert info.source_documents == 8
    with pytest.raises(ConfigError, match="^sample: expected a positive integer"):
        read_documents(str(jsonl), sample=0)
    with pytest.raises(ConfigError, match="^seed: expected an integer"):
        read_documents(str(jsonl), sample=2, seed="x")


def test_read_documents_sample_real_wikitext_2():
    path = _wikitext_2_test()
    articles, base = read_documents(str(path), separator=WIKITEXT_ARTICLES)
    docs, info = read_documents(str(path), separator=WIKITEXT_ARTICLES, sample=10, seed=0)
    assert docs == [articles[i] for i in sample_documents(articles, 10, seed=0)]
    assert (info.source_documents, info.source_sha256) == (62, base.sha256)
    assert all(d.startswith("= ") for d in docs) and len(set(docs)) == 10
    assert read_documents(str(path), separator=WIKITEXT_ARTICLES, sample=11, seed=0)[0][:10] \
        == docs


# --------------------------------------------------------------------------- hub path


# rows as the hub stores WikiText: a line a row, "" for each blank line around titles
HUB_ROWS = ["", " = Filter = \n", "", " The cut @-@ off of wc \n", " = 1 rad / s and k = \n",
            " 1 ohm .\n", "", " = = Design = = \n", "", " Text .\n", "", " = Next = \n", "",
            " More .\n", "", " = Third = \n", "", " Last .\n"]
HUB_ARTICLES = ["= Filter = \n The cut @-@ off of wc \n = 1 rad / s and k = \n 1 ohm .\n"
                " = = Design = = \n Text .", "= Next = \n More .", "= Third = \n Last ."]


def _without_blank_lines(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if line.strip())


def test_hub_wikitext_103_articles_and_sample(monkeypatch, no_network):
    prints: list[str] = []
    calls = _fake_hub(monkeypatch, HUB_ROWS, prints)
    docs, info = read_documents("wikitext-103")
    assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "test")]
    assert docs == HUB_ARTICLES
    assert info == CorpusInfo("wikitext-103", "Salesforce/wikitext/wikitext-103-raw-v1:test",
                              prints[-1], 3, sum(map(len, docs)))
    # the same rows as a raw text file (blank lines kept there) give the same articles
    raw = "".join(row or " \n" for row in HUB_ROWS)
    assert [_without_blank_lines(d) for d in split_wikitext_articles(raw)] == docs
    sampled, sinfo = read_documents("wikitext-103", sample=2, seed=1)
    assert sampled == [docs[i] for i in sample_documents(docs, 2, seed=1)]
    assert (sinfo.source_sha256, sinfo.source_documents, sinfo.sample) == (prints[-1], 3, 2)
    with pytest.raises(CorpusError, match="from corpus wikitext-103: it holds only 3"):
        read_documents("wikitext-103", sample=4)
    assert no_network == []


def test_hub_wikitext_2_stays_one_stream_unless_asked(monkeypatch):
    _fake_hub(monkeypatch, HUB_ROWS)
    stream, _ = read_documents("wikitext-2")
    assert stream == ["".join(HUB_ROWS).strip()]
    articles, _ = read_documents("wikitext-2", separator=WIKITEXT_ARTICLES)
    assert articles == read_documents("wikitext-103")[0] and len(articles) == 3
    owt, _ = read_documents("openwebtext", sample=2, seed=0)  # a document a row
    rows = [r.strip() for r in HUB_ROWS if r.strip()]
    assert owt == [rows[i] for i in sample_documents(rows, 2, seed=0)]


def test_hub_rows_of_the_real_file_match_the_local_split(monkeypatch):
    path = _wikitext_2_test()
    text = path.read_text(encoding="utf-8")
    _fake_hub(monkeypatch, text.splitlines(keepends=True))
    local, _ = read_documents(str(path), separator=WIKITEXT_ARTICLES)
    assert read_documents("wikitext-103")[0] == local


def _relocated_cache(tmp_path: Path, rows: list[str]) -> Path:
    """A real ``datasets`` cache holding ``rows`` as Salesforce/wikitext's 103 test split.

    Built offline: a local Parquet file is prepared by ``load_dataset`` into a scratch
    cache, then moved to the folder and names a hub download would have.
    """
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": rows}), tmp_path / "rows.parquet")
    scratch = tmp_path / "scratch"
    datasets.load_dataset("parquet", data_files={"test": str(tmp_path / "rows.parquet")},
                          cache_dir=str(scratch))
    built = next(scratch.rglob("dataset_info.json")).parent
    cache = tmp_path / "copied-cache"
    target = cache / "Salesforce___wikitext" / "wikitext-103-raw-v1" / "0.0.0" / built.name
    shutil.copytree(built, target)
    for arrow in target.glob("parquet-*.arrow"):
        arrow.rename(target / arrow.name.replace("parquet-", "wikitext-", 1))
    info = json.loads((target / "dataset_info.json").read_text())
    info.update(config_name="wikitext-103-raw-v1", dataset_name="wikitext")
    for split in info["splits"].values():
        split["dataset_name"] = "wikitext"
    (target / "dataset_info.json").write_text(json.dumps(info))
    return cache


def test_hub_path_reads_a_copied_datasets_cache(tmp_path, monkeypatch, no_network):
    """The fix the error names: a datasets cache made elsewhere, copied here, is found."""
    import datasets.config

    cache = _relocated_cache(tmp_path, HUB_ROWS)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    docs, info = read_documents("wikitext-103", sample=3, seed=0)
    assert docs == [HUB_ARTICLES[i] for i in sample_documents(HUB_ARTICLES, 3, seed=0)]
    assert info.path == "Salesforce/wikitext/wikitext-103-raw-v1:test" and info.source_sha256
    assert no_network == []

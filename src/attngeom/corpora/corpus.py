"""Corpora as lists of documents (method §10): local text, JSONL and Parquet, or ``datasets``.

``read_documents`` turns a corpus spec into documents plus a ``CorpusInfo`` that
identifies it (sha256 of the file bytes, or the dataset's fingerprint). Documents
are normalised the same way whatever the source: CRLF (and lone CR) become LF,
whitespace at both ends is dropped, and empty documents are left out.

- ``.txt`` / ``.text`` / ``.raw``: documents are separated by ``separator`` (a string,
  usually on a line of its own, such as ``<|endoftext|>``); when ``separator`` is
  None and the text contains ``<|endoftext|>`` that is used; otherwise documents
  are the blocks between blank lines. (So ``wiki.test.raw``, which has no blank
  line, is one document: the standard concatenated WikiText stream.) The special
  value ``separator="wikitext-articles"`` (``WIKITEXT_ARTICLES``) splits a WikiText
  raw file into its articles instead (below).
- ``.jsonl`` / ``.ndjson``: one JSON object a line, text in ``text_column``.
- ``.parquet`` / ``.pq``: text in column ``text_column``.
- a directory: every such file in it, in name order, as one corpus.
- ``wikitext-103`` (the raw test split, a document an article, as the follow-up
  paper counts WikiText-103 documents), ``wikitext-2`` (the raw test split, whose
  rows are joined into one document exactly as in ``wiki.test.raw``; pass
  ``separator="wikitext-articles"`` for its articles) and ``openwebtext`` (train
  split, a document a row), optionally ``NAME:SPLIT``: loaded through ``datasets``
  from its local cache only (``datasets.config.HF_DATASETS_CACHE``), never the
  network; otherwise one ``CorpusError`` line at once that names the hub id, config,
  split and the cache searched, and how to fetch it where there is a network.

**WikiText articles** (``split_wikitext_articles``; the hub rows and local files go
through the same rule). WikiText's raw text is a stream of lines in which every
article starts with a level-1 heading `` = Title = `` (exactly one ``=`` on each side;
`` = = Section = = `` and deeper headings stay inside their article). An article is
its heading line and every line up to the next level-1 heading; text before the
first heading, if any, is a document of its own. Nothing inside the text changes
(``@-@`` and the other WikiText tokens stay). Some lines inside paragraphs have the
heading's shape too (split formulas, table legends: the test split's "Constant k
filter" holds `` = 1 rad / s and a nominal impedance k = ``). WikiText frames real
titles with blank lines (the hub's empty rows), so once one heading shows blank lines
on both sides only headings framed so start articles. A copy with its blank lines
removed, such as the shared ``wiki.test.raw``, can only be split on the shape: it
gives 62 documents for the test split's 60 articles.

**Sampling** (``sample_documents``; ``read_documents(..., sample=k, seed=s)``). Each
document is ranked by ``sha256("attngeom-sample-v1", seed, sha256(document))`` and
the k lowest ranks are taken, in rank order (ties, only between identical documents,
by position). So a sample depends on the documents' contents and the seed alone, not
on the reading order, the process or the platform; the sample of k is the first k
of the sample of k + 1; and only the k best documents are held while reading, or
none when the documents' sha256 are given instead (``hashed=True``). Asking for more
documents than the corpus holds is a ``CorpusError``, never a silent shorter sample.
A sampled corpus's ``CorpusInfo`` records ``sample``, ``seed``, the source's
``source_sha256`` and ``source_documents``, and its ``sha256`` becomes the hash of
the source's sha256, the seed, k and the sampled documents' sha256 in order, so it
differs whenever the sample does. Without ``sample`` nothing changes.

Windows are cut from the documents by ``make_windows`` (``attngeom.corpora.windows``,
re-exported here).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from attngeom.corpora.windows import Window, make_windows, window_fingerprint
from attngeom.errors import ConfigError, CorpusError

__all__ = [
    "DATASETS",
    "AUTO_SEPARATORS",
    "WIKITEXT_ARTICLES",
    "CorpusInfo",
    "Window",
    "document_sha256",
    "make_windows",
    "read_documents",
    "sample_documents",
    "split_wikitext_articles",
    "window_fingerprint",
]

TEXT_SUFFIXES = (".txt", ".text", ".raw")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES

# Document separators recognised in text files when none is given.
AUTO_SEPARATORS = ("<|endoftext|>",)
# The ``separator`` value that splits WikiText raw text into articles.
WIKITEXT_ARTICLES = "wikitext-articles"
# Versions the sampling rank, so a changed rule can never pass for the old one.
_SAMPLE_TAG = b"attngeom-sample-v1"


@dataclass(frozen=True)
class _DatasetSpec:
    repos: tuple[str, ...]  # hub ids to try, newest name first (cache dirs follow the id)
    config: str | None
    split: str
    join_rows: bool  # rows are lines of one text (WikiText), not documents
    articles: bool = False  # with join_rows: a document an article, not the whole stream


DATASETS: dict[str, _DatasetSpec] = {
    "wikitext-103": _DatasetSpec(("Salesforce/wikitext", "wikitext"), "wikitext-103-raw-v1",
                                 "test", True, articles=True),
    "wikitext-2": _DatasetSpec(("Salesforce/wikitext", "wikitext"), "wikitext-2-raw-v1",
                               "test", True),
    "openwebtext": _DatasetSpec(("Skylion007/openwebtext", "openwebtext"), None, "train",
                                False),
}


@dataclass(frozen=True)
class CorpusInfo:
    """What identifies a corpus: its name, where it came from, and a content hash.

    ``sha256`` is the hash of the file's bytes (for a directory: of its files' names
    and hashes), or the ``datasets`` fingerprint of the split. ``n_documents`` and
    ``n_characters`` count the documents returned (after ``max_documents``).

    A sample (``read_documents(..., sample=k)``) sets ``sample`` and ``seed``, keeps
    the unsampled hash in ``source_sha256`` and the number of documents sampled from
    in ``source_documents``, and ``sha256`` identifies the sample (module docstring).
    ``to_dict`` leaves these four out when there is no sample, so unsampled manifests
    stay as they were.
    """

    name: str
    path: str
    sha256: str
    n_documents: int
    n_characters: int
    sample: int | None = None
    seed: int | None = None
    source_sha256: str | None = None
    source_documents: int | None = None
    documents_too_short: int | None = None  # windows_per_document: gave no window
    document_protocol: dict | None = None  # the fixed-length protocol's record

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.sample is None:
            for key in ("sample", "seed", "source_sha256", "source_documents"):
                del d[key]
        if self.documents_too_short is None:
            del d["documents_too_short"]
        if self.document_protocol is None:
            del d["document_protocol"]
        return d


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _documents(texts: Iterable[str], max_documents: int | None) -> Iterator[str]:
    """The normalised non-empty documents of ``texts``, at most ``max_documents``."""
    n = 0
    for t in texts:
        if max_documents is not None and n >= max_documents:
            return
        t = _normalise(t)
        if t:
            n += 1
            yield t


def _take(texts, max_documents: int | None) -> list[str]:
    return list(_documents(texts, max_documents))


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- text


_BLANK_LINES = re.compile(r"\n[ \t\f\v]*\n\s*")
_LINES = re.compile(r"[^\n]*\n|[^\n]+\Z")


def _is_article_heading(line: str) -> bool:
    """A WikiText level-1 heading `` = Title = ``: one ``=`` a side, so not ``= = S = =``."""
    s = line.strip()
    if len(s) < 5 or not (s.startswith("= ") and s.endswith(" =")):
        return False
    title = s[2:-2].strip()
    return bool(title) and not title.startswith("=") and not title.endswith("=")


def _wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """Articles of a WikiText line stream (lines keep their ends), not normalised.

    WikiText puts a blank line before and after each title, and heading-shaped lines
    inside a paragraph (split formulas, legends) have text on both sides. So once
    one heading has shown blank lines on both sides, only headings framed by blank
    lines (or the stream's ends) start articles; in a text with no such heading
    (blank lines removed) the shape alone decides. A generator with one line of
    look-ahead, so a hub split of any size is cut while it streams.
    """
    article: list[str] = []
    marked = False
    prev: str | None = None
    it = iter(lines)
    line = next(it, None)
    while line is not None:
        after = next(it, None)
        if _is_article_heading(line):
            blank_before = prev is not None and not prev.strip()
            blank_after = after is not None and not after.strip()
            marked = marked or (blank_before and blank_after)
            framed = (prev is None or blank_before) and (after is None or blank_after)
            if (framed or not marked) and any(x.strip() for x in article):
                yield "".join(article)
                article = []
        article.append(line)
        prev, line = line, after
    if article:
        yield "".join(article)


def split_wikitext_articles(text: str) -> list[str]:
    """WikiText raw text as its articles, normalised like every document.

    Each article is a level-1 heading line `` = Title = `` and the lines up to the
    next one (module docstring); deeper headings stay inside, text is untouched.

    >>> split_wikitext_articles(" = A = \\n x \\n = = S = = \\n y \\n = B = \\n z \\n")
    ['= A = \\n x \\n = = S = = \\n y', '= B = \\n z']
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    # lines end at LF only: str.splitlines would also cut at U+2028, form feeds, ...
    return _take(_wikitext_articles(_LINES.findall(text)), None)


def _split_text(text: str, separator: str | None) -> list[str]:
    """Documents of one text file: on ``separator``, an auto-detected one, or blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if separator == WIKITEXT_ARTICLES:
        return split_wikitext_articles(text)
    if separator is None:
        separator = next((s for s in AUTO_SEPARATORS if s in text), None)
    if separator is not None:
        return text.split(separator)
    return _BLANK_LINES.split(text)


def _read_text(path: Path, separator: str | None) -> Iterator[str]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CorpusError(
            f"corpus file {path} is not UTF-8 text (invalid byte at offset {e.start})"
        ) from None
    yield from _split_text(text, separator)


def _read_jsonl(path: Path, text_column: str) -> Iterator[str]:
    with path.open("r", encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"line {lineno} of {path} is not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise CorpusError(
                    f"line {lineno} of {path}: expected a JSON object, got {type(row).__name__}"
                )
            if text_column not in row:
                fields = ", ".join(map(str, list(row)[:10])) or "none"
                raise CorpusError(
                    f"line {lineno} of {path} has no text column {text_column!r} "
                    f"(fields: {fields}); pass the right text_column (--text-column NAME)"
                )
            value = row[text_column]
            if value is None:
                continue
            if not isinstance(value, str):
                raise CorpusError(
                    f"line {lineno} of {path}: column {text_column!r} holds "
                    f"{type(value).__name__}, expected text"
                )
            yield value


def _read_parquet(path: Path, text_column: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(
            f"cannot read {path}: not a valid Parquet file ({_one_line(e)})"
        ) from None
    names = pf.schema_arrow.names
    if text_column not in names:
        raise CorpusError(
            f"{path} has no text column {text_column!r} "
            f"(columns: {', '.join(names[:10]) or 'none'}); "
            "pass the right text_column (--text-column NAME)"
        )
    field = pf.schema_arrow.field(text_column)
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)
            or pa.types.is_string_view(field.type)):
        raise CorpusError(f"{path}: column {text_column!r} is {field.type}, expected text")
    for batch in pf.iter_batches(batch_size=4096, columns=[text_column]):
        for value in batch.column(0).to_pylist():
            if value is not None:
                yield value


def _read_file(path: Path, text_column: str, separator: str | None) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _read_text(path, separator)
    if suffix in JSONL_SUFFIXES:
        return _read_jsonl(path, text_column)
    if suffix in PARQUET_SUFFIXES:
        return _read_parquet(path, text_column)
    raise CorpusError(
        f"corpus file {path} has unknown extension {path.suffix or '(none)'!r}: "
        f"expected one of {', '.join(SUFFIXES)}"
    )


# --------------------------------------------------------------------------- datasets


@contextlib.contextmanager
def _hub_offline():
    """Force ``datasets`` and ``huggingface_hub`` offline for the block, then restore.

    Both libraries read ``HF_HUB_OFFLINE`` once, at import; without this a missing
    dataset would be looked up on the network (and hang without one). Reversible:
    the previous values are put back on exit.
    """
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst

    flags = [(m, a) for m, a in ((dconfig, "HF_HUB_OFFLINE"), (dconfig, "HF_DATASETS_OFFLINE"),
                                  (hconst, "HF_HUB_OFFLINE")) if hasattr(m, a)]
    saved = [getattr(m, a) for m, a in flags]
    for m, a in flags:
        setattr(m, a, True)
    try:
        yield
    finally:
        for (m, a), value in zip(flags, saved, strict=True):
            setattr(m, a, value)


def _fetch_command(repo: str, config: str | None, split: str) -> str:
    """The shell line that puts ``repo`` into the datasets cache where there is a network."""
    args = ", ".join([repr(repo), *([repr(config)] if config else []), f"split={split!r}"])
    return f'python -c "import datasets; datasets.load_dataset({args})"'


def _not_cached(alias: str, spec: _DatasetSpec, split: str) -> CorpusError:
    """One line: what is missing, the cache that was searched, and how to fill it.

    Offline, ``datasets`` only looks in its own cache (the prepared Arrow files under
    ``HF_DATASETS_CACHE``), not in the hub's download cache, so the hint is a
    ``load_dataset`` call, whose result is that cache.
    """
    import datasets.config as dconfig

    cache = str(dconfig.HF_DATASETS_CACHE)
    repo = spec.repos[0]
    config = f", config {spec.config}" if spec.config else ""
    return CorpusError(
        f"dataset {alias!r} (hub id {repo}{config}, split {split}) is not available offline; "
        f"pass a local .txt, .jsonl or .parquet file, or fetch it: the datasets cache {cache} "
        f"holds no copy (looked for {' and '.join(spec.repos)} without the network); on a "
        f"machine with network run {_fetch_command(repo, spec.config, split)}, then copy "
        f"its datasets cache (HF_DATASETS_CACHE, default ~/.cache/huggingface/datasets) to "
        f"{cache} or set HF_DATASETS_CACHE (or HF_HOME) to the copy"
    )


def _read_dataset(alias: str, split: str | None, text_column: str, separator: str | None,
                  max_documents: int | None) -> tuple[Iterator[str], str, str]:
    """A cached dataset as ``(documents, fingerprint, 'repo/config:split')``.

    The documents stream (normalised, at most ``max_documents``), so a sample of a
    large split holds only what it keeps.
    """
    spec = DATASETS[alias]
    split = split or spec.split
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"dataset {alias!r} needs the 'datasets' package (pip install attngeom[datasets]); "
            "or pass a local .txt, .jsonl or .parquet file"
        ) from None
    ds = None
    with _hub_offline():
        for repo in spec.repos:
            try:
                ds = datasets.load_dataset(repo, spec.config, split=split)
                where = f"{repo}/{spec.config}" if spec.config else repo
                break
            except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
                continue
    if ds is None:
        raise _not_cached(alias, spec, split) from None
    if text_column not in ds.column_names:
        raise CorpusError(
            f"dataset {alias!r} has no text column {text_column!r} "
            f"(columns: {', '.join(ds.column_names)})"
        )

    def rows(keep_empty: bool = False) -> Iterator[str]:
        for batch in ds.iter(batch_size=1024):
            yield from (t for t in batch[text_column] if t or (keep_empty and t is not None))

    if not spec.join_rows:
        texts: Iterable[str] = rows()
    elif spec.articles or separator == WIKITEXT_ARTICLES:
        # the empty rows are WikiText's blank lines, which mark the titles
        texts = _wikitext_articles(rows(keep_empty=True))
    else:
        texts = ["".join(rows())]
    fingerprint = str(getattr(ds, "_fingerprint", "") or "")
    return _documents(texts, max_documents), fingerprint, f"{where}:{split}"


# --------------------------------------------------------------------------- sampling


def document_sha256(text: str) -> str:
    """The sha256 (hex) of a document's UTF-8 text: what sampling ranks it by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
    return value


def _integer_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed: expected an integer, got {seed!r}")
    return seed


def _digest(item, hashed: bool, position: int) -> bytes:
    """The raw sha256 of ``item``: hashed from a text, or read from a given digest."""
    if not hashed:
        if not isinstance(item, str):
            raise ConfigError(
                f"documents[{position}]: expected str, got {type(item).__name__} "
                "(pass hashed=True for sha256 digests)"
            )
        return hashlib.sha256(item.encode("utf-8")).digest()
    if isinstance(item, bytes) and len(item) == 32:
        return item
    if isinstance(item, str) and len(item) == 64:
        with contextlib.suppress(ValueError):
            return bytes.fromhex(item)
    raise ConfigError(
        f"documents[{position}]: expected a sha256 (64 hex digits or 32 bytes), got "
        f"{type(item).__name__} {str(item)[:70]!r}"
    )


def _rank(seed: int, digest: bytes) -> bytes:
    """A document's place in the draw for ``seed`` (lowest first): content and seed only."""
    return hashlib.sha256(_SAMPLE_TAG + b"\0" + str(seed).encode() + b"\0" + digest).digest()


def _draw(items: Iterable[tuple[bytes, object]], k: int,
          seed: int) -> tuple[list[tuple[int, bytes, object]], int]:
    """The ``k`` lowest-ranked ``(index, digest, payload)`` and the number of items.

    ``heapq.nsmallest`` keeps only ``k`` items while it reads; the index breaks ties,
    which only identical documents can have.
    """
    count = 0

    def ranked():
        nonlocal count
        for index, (digest, payload) in enumerate(items):
            count = index + 1
            yield _rank(seed, digest), index, digest, payload

    best = heapq.nsmallest(k, ranked(), key=lambda r: (r[0], r[1]))
    return [(index, digest, payload) for _, index, digest, payload in best], count


def _too_few(k: int, n: int, what: str) -> CorpusError:
    return CorpusError(
        f"cannot sample {k} documents from {what}: it holds only {n}; pass sample <= {n}"
    )


def sample_documents(documents: Iterable[str | bytes], k: int, seed: int = 0, *,
                     hashed: bool = False) -> list[int]:
    """Indices of ``k`` of ``documents`` drawn by ``seed``, in draw order.

    Each document is ranked by a hash of the seed and its sha256 (module docstring),
    so the draw is the same in every run and process, whatever order the documents
    come in, and the first k of the draw of k + 1 are the draw of k. ``documents``
    are texts or, with ``hashed=True``, their ``document_sha256`` (64 hex digits or
    32 bytes), so the texts need not be held. Raises ``CorpusError`` when there are
    fewer than ``k`` documents and ``ConfigError`` for a bad ``k``, ``seed`` or item.

    >>> docs = ["alpha", "beta", "gamma", "delta"]
    >>> sample_documents(docs, 2, seed=1) == sample_documents(docs, 3, seed=1)[:2]
    True
    >>> hashes = [document_sha256(d) for d in docs]
    >>> sample_documents(hashes, 2, seed=1, hashed=True) == sample_documents(docs, 2, seed=1)
    True
    """
    k = _positive("sample", k)
    seed = _integer_seed(seed)
    items = ((_digest(d, hashed, i), None) for i, d in enumerate(documents))
    best, n = _draw(items, k, seed)
    if n < k:
        raise _too_few(k, n, "the documents given")
    return [index for index, _, _ in best]


def _sampled(docs: Iterable[str], k: int, seed: int,
             what: str) -> tuple[list[str], list[bytes], int]:
    """``(documents in draw order, their raw sha256, number read)``; reads all of ``docs``."""
    best, n = _draw(((_digest(d, False, i), d) for i, d in enumerate(docs)), k, seed)
    if 0 < n < k:
        raise _too_few(k, n, what)
    return [d for _, _, d in best], [digest for _, digest, _ in best], n


def _sample_sha256(source: str, seed: int, k: int, digests: list[bytes]) -> str:
    """What identifies a sample: the source, the seed, k and the documents drawn, in order."""
    h = hashlib.sha256(_SAMPLE_TAG + b"\n" + f"{source}\n{seed}\n{k}\n".encode())
    for digest in digests:
        h.update(digest.hex().encode() + b"\n")
    return h.hexdigest()


def _finish(docs: Iterable[str], name: str, path: str, digest: str, empty: str,
            sample: int | None, seed: int, limit: int | None) -> tuple[list[str], CorpusInfo]:
    """The documents to return and their ``CorpusInfo``, sampled when ``sample`` is set.

    ``limit`` is ``max_documents``, named in the error when it leaves too few.
    """
    if sample is None:
        docs = list(docs)
        if not docs:
            raise CorpusError(empty)
        return docs, CorpusInfo(name, path, digest, len(docs), sum(map(len, docs)))
    what = f"corpus {name}" + (f" read with max_documents={limit}" if limit else "")
    picked, digests, n = _sampled(docs, sample, seed, what)
    if not picked:
        raise CorpusError(empty)
    info = CorpusInfo(name, path, _sample_sha256(digest, seed, sample, digests), len(picked),
                      sum(map(len, picked)), sample=sample, seed=seed, source_sha256=digest,
                      source_documents=n)
    return picked, info


# --------------------------------------------------------------------------- public


def _read_directory(path: Path, text_column: str, separator: str | None):
    """(texts of every corpus file in ``path``, in name order; the folder's digest: each
    file's name and SHA-256)."""
    files = sorted((p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                    and p.suffix.lower() in SUFFIXES), key=lambda p: p.name)
    if not files:
        raise CorpusError(f"corpus directory {path} holds no {', '.join(SUFFIXES)} file")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\t{_sha256_file(f)}\n".encode())
    return (t for f in files for t in _read_file(f, text_column, separator)), h.hexdigest()


def read_documents(
    spec: str,
    *,
    text_column: str = "text",
    separator: str | None = None,
    max_documents: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> tuple[list[str], CorpusInfo]:
    """Read corpus ``spec`` (a file, a directory, or a dataset name) as documents.

    See the module docstring for the formats and how documents are split. Returns
    the documents (normalised: LF line ends, stripped, none empty), at most
    ``max_documents`` of them, and their ``CorpusInfo``. With ``sample=k`` it returns
    the ``k`` documents ``sample_documents`` draws with ``seed`` from those (the first
    ``max_documents``, if given), in draw order; more than the corpus holds is a
    ``CorpusError``. ``sample=None`` (the default) reads exactly as before.

    Raises ``CorpusError``, one line naming the thing, for a missing file, an unknown
    extension, a missing text column, a corpus with no text, and a dataset that is
    not in the local ``datasets`` cache (it never touches the network).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "two.txt"
    >>> _ = p.write_text("First doc.\\r\\nStill first.\\r\\n\\r\\nSecond doc.\\r\\n")
    >>> docs, info = read_documents(str(p))
    >>> docs, info.n_documents, info.name
    (['First doc.\\nStill first.', 'Second doc.'], 2, 'two')
    """
    if max_documents is not None and (
        isinstance(max_documents, bool) or not isinstance(max_documents, int) or max_documents < 1
    ):
        raise ConfigError(
            f"max_documents: expected a positive integer or None, got {max_documents!r}"
        )
    if sample is not None:
        sample = _positive("sample", sample)
        seed = _integer_seed(seed)
    spec_str = str(spec)
    if spec_str.startswith("asset:"):  # a bundled corpus (one line naming the known ones)
        from attngeom.assets import asset

        spec_str = asset(spec_str.split(":", 1)[1], "--corpus")
    path = Path(spec_str).expanduser()

    alias, _, split = spec_str.partition(":")
    if alias.lower() in DATASETS and not path.exists():
        docs, digest, where = _read_dataset(alias.lower(), split or None, text_column,
                                            separator, max_documents)
        name = spec_str.lower()
        return _finish(docs, name, where, digest, f"corpus {name} holds no text", sample, seed,
                       max_documents)

    if not path.exists():
        if path.suffix.lower() in SUFFIXES or "/" in spec_str or "\\" in spec_str:
            raise CorpusError(f"corpus file {path} does not exist")
        raise CorpusError(
            f"unknown corpus {spec_str!r}: no such file, and not one of the datasets "
            f"{', '.join(DATASETS)}"
        )

    if path.is_dir():
        texts, digest = _read_directory(path, text_column, separator)
        name = path.name
    else:
        texts = _read_file(path, text_column, separator)
        digest = _sha256_file(path)
        name = path.name[: -len(path.suffix)] if path.suffix else path.name
    return _finish(_documents(texts, max_documents), name, str(path.resolve()), digest,
                   f"corpus {path} holds no text (no non-empty document)", sample, seed,
                   max_documents)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."

"""Corpora as lists of documents (method §10): local text, JSONL and Parquet, or ``datasets``.

``read_documents`` turns a corpus spec into documents plus a ``CorpusInfo`` that
identifies it (sha256 of the file bytes, or the dataset's fingerprint). Documents
are normalised the same way whatever the source: CRLF (and lone CR) become LF,
whitespace at both ends is dropped, and empty documents are left out.

- ``.txt`` / ``.text`` / ``.raw``: documents are separated by ``separator`` (a string,
  usually on a line of its own, such as ``<|endoftext|>``); when ``separator`` is
  None and the text contains ``<|endoftext|>`` that is used; otherwise documents
  are the blocks between blank lines. (So ``wiki.test.raw``, which has no blank
  line, is one document: the standard concatenated WikiText stream.)
- ``.jsonl`` / ``.ndjson``: one JSON object a line, text in ``text_column``.
- ``.parquet`` / ``.pq``: text in column ``text_column``.
- a directory: every such file in it, in name order, as one corpus.
- ``wikitext-103``, ``wikitext-2`` (the raw test split, whose rows are joined into
  one document exactly as in ``wiki.test.raw``) and ``openwebtext`` (train split, a
  document a row), optionally ``NAME:SPLIT``: loaded through ``datasets`` from its
  local cache only, never the network; otherwise ``CorpusError`` at once.

Windows are cut from the documents by ``make_windows`` (``attngeom.pipeline.windows``,
re-exported here).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from attngeom.errors import ConfigError, CorpusError
from attngeom.pipeline.windows import Window, make_windows, window_fingerprint

__all__ = [
    "DATASETS",
    "AUTO_SEPARATORS",
    "CorpusInfo",
    "Window",
    "make_windows",
    "read_documents",
    "window_fingerprint",
]

TEXT_SUFFIXES = (".txt", ".text", ".raw")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES

# Document separators recognised in text files when none is given.
AUTO_SEPARATORS = ("<|endoftext|>",)


@dataclass(frozen=True)
class _DatasetSpec:
    repos: tuple[str, ...]  # hub ids to try, newest name first (cache dirs follow the id)
    config: str | None
    split: str
    join_rows: bool  # rows are lines of one text (WikiText), not documents


DATASETS: dict[str, _DatasetSpec] = {
    "wikitext-103": _DatasetSpec(("Salesforce/wikitext", "wikitext"), "wikitext-103-raw-v1",
                                 "test", True),
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
    """

    name: str
    path: str
    sha256: str
    n_documents: int
    n_characters: int

    def to_dict(self) -> dict:
        return asdict(self)


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _take(texts, max_documents: int | None) -> list[str]:
    docs: list[str] = []
    for t in texts:
        if max_documents is not None and len(docs) >= max_documents:
            break
        t = _normalise(t)
        if t:
            docs.append(t)
    return docs


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- text


_BLANK_LINES = re.compile(r"\n[ \t\f\v]*\n\s*")


def _split_text(text: str, separator: str | None) -> list[str]:
    """Documents of one text file: on ``separator``, an auto-detected one, or blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
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


def _read_dataset(alias: str, split: str | None, text_column: str, max_documents):
    spec = DATASETS[alias]
    split = split or spec.split
    where = f"{spec.repos[-1]}/{spec.config}" if spec.config else spec.repos[-1]
    unavailable = CorpusError(
        f"dataset {alias!r} ({where}, split {split}) is not available offline; "
        f"pass a local .txt, .jsonl or .parquet file instead"
    )
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
        raise unavailable from None
    if text_column not in ds.column_names:
        raise CorpusError(
            f"dataset {alias!r} has no text column {text_column!r} "
            f"(columns: {', '.join(ds.column_names)})"
        )

    def rows() -> Iterator[str]:
        for batch in ds.iter(batch_size=1024):
            yield from (t for t in batch[text_column] if t)

    texts = ["".join(rows())] if spec.join_rows else rows()
    docs = _take(texts, max_documents)
    info_path = f"{where}:{split}"
    return docs, str(getattr(ds, "_fingerprint", "") or ""), info_path


# --------------------------------------------------------------------------- public


def read_documents(
    spec: str,
    *,
    text_column: str = "text",
    separator: str | None = None,
    max_documents: int | None = None,
) -> tuple[list[str], CorpusInfo]:
    """Read corpus ``spec`` (a file, a directory, or a dataset name) as documents.

    See the module docstring for the formats and how documents are split. Returns
    the documents (normalised: LF line ends, stripped, none empty), at most
    ``max_documents`` of them, and their ``CorpusInfo``.

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
    spec_str = str(spec)
    path = Path(spec_str).expanduser()

    alias, _, split = spec_str.partition(":")
    if alias.lower() in DATASETS and not path.exists():
        docs, digest, where = _read_dataset(alias.lower(), split or None, text_column,
                                            max_documents)
        name = spec_str.lower()
        if not docs:
            raise CorpusError(f"corpus {name} holds no text")
        return docs, CorpusInfo(name, where, digest, len(docs), sum(map(len, docs)))

    if not path.exists():
        if path.suffix.lower() in SUFFIXES or "/" in spec_str or "\\" in spec_str:
            raise CorpusError(f"corpus file {path} does not exist")
        raise CorpusError(
            f"unknown corpus {spec_str!r}: no such file, and not one of the datasets "
            f"{', '.join(DATASETS)}"
        )

    if path.is_dir():
        files = sorted(
            (p for p in path.iterdir()
             if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in SUFFIXES),
            key=lambda p: p.name,
        )
        if not files:
            raise CorpusError(
                f"corpus directory {path} holds no {', '.join(SUFFIXES)} file"
            )
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}\t{_sha256_file(f)}\n".encode())
        digest = h.hexdigest()
        texts = (t for f in files for t in _read_file(f, text_column, separator))
        name = path.name
    else:
        texts = _read_file(path, text_column, separator)
        digest = _sha256_file(path)
        name = path.name[: -len(path.suffix)] if path.suffix else path.name
    docs = _take(texts, max_documents)
    if not docs:
        raise CorpusError(f"corpus {path} holds no text (no non-empty document)")
    info = CorpusInfo(name, str(path.resolve()), digest, len(docs), sum(map(len, docs)))
    return docs, info


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."

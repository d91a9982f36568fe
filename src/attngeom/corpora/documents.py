"""The follow-up's fixed-length document protocol (arXiv 2609.37879, App. B.2).

One window per document, never two documents in one window:

1. ``protocol_hash(*args)``: the ``str`` of every argument joined with ``"|"``, encoded
   as UTF-8, hashed with SHA-256; the first 8 bytes read big-endian, masked with
   ``2**63 - 1`` (a non-negative 63-bit integer). The paper's ``H``.
2. Documents are ordered by ``H(seed, dataset, doc_id)`` (``document_order``).
3. Each is tokenised without special tokens; one with fewer than ``L - 1`` content
   tokens is skipped; the first ``K`` eligible ones in hash order are taken.
4. Document ``x`` with ``T_x`` content tokens gets the offset
   ``o = H(seed, model_id, dataset, doc_id, L) mod (T_x - L + 2)`` (``window_offset``),
   so ``o`` ranges over every start that leaves ``L - 1`` tokens; its window is the
   initial token followed by ``content[o : o + L - 1]``: exactly ``L`` tokens.
5. The initial token is the tokenizer's BOS, else the model configuration's
   ``bos_token_id``; both present and different, or neither present, is an error
   (``initial_token``).

The string forms are attngeom's choice (the paper leaves them open; docs/choices.md):
``dataset`` is the corpus label, ``doc_id`` the sha256 (hex) of the document's
normalised text, and ``model_id`` the model label. A content hash makes a document's
place and offset independent of where it sits in the file; identical documents share
one id, so only the first copy is kept (the paper dropped duplicate rows too).

The pure functions come first (no tokenizer); ``fixed_windows`` applies them to
documents with a tokenizer and returns ``Window`` objects and a record for the
manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attngeom.corpora.windows import Window
from attngeom.errors import ConfigError, CorpusError

__all__ = [
    "DocumentProtocol", "eligible", "document_order", "fixed_windows", "initial_token",
    "protocol_hash", "window_offset",
]

MASK63 = (1 << 63) - 1
_TOKENIZE_BATCH = 32  # documents handed to the tokenizer at once, in hash order


def protocol_hash(*args: object) -> int:
    """The paper's ``H``: SHA-256 of ``"|".join(map(str, args))``, first 8 bytes, 63 bits.

    >>> protocol_hash(2027, "openwebtext", "0")
    8834135002544877771
    """
    digest = hashlib.sha256("|".join(str(a) for a in args).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & MASK63


def document_order(seed: int, dataset: str, doc_ids: Sequence[str]) -> list[int]:
    """Positions of ``doc_ids`` sorted by ``H(seed, dataset, doc_id)`` (ties by position,
    which only equal ids can have)."""
    keys = [(protocol_hash(seed, dataset, d), i) for i, d in enumerate(doc_ids)]
    return [i for _, i in sorted(keys)]


def eligible(n_content: int, window_length: int) -> bool:
    """Whether a document of ``n_content`` tokens gives a window of ``window_length``
    (the initial token plus ``window_length - 1`` content tokens)."""
    return n_content >= window_length - 1


def window_offset(seed: int, model_id: str, dataset: str, doc_id: str, window_length: int,
                  n_content: int) -> int:
    """Where the window's content starts: ``H(seed, model_id, dataset, doc_id, L)`` modulo
    the ``n_content - L + 2`` possible starts. Raises ``ValueError`` for a document too
    short for one window."""
    if not eligible(n_content, window_length):
        raise ValueError(f"a document of {n_content} tokens is too short for a window of "
                         f"{window_length}")
    h = protocol_hash(seed, model_id, dataset, doc_id, window_length)
    return h % (n_content - window_length + 2)


def initial_token(tokenizer_bos: int | None, config_bos: int | None) -> tuple[int, str]:
    """The window's initial token id and where it came from (``tokenizer`` or ``config``).

    One line (``ConfigError``) when the two disagree or neither exists.
    """
    tok = int(tokenizer_bos) if isinstance(tokenizer_bos, int) else None
    cfg = int(config_bos) if isinstance(config_bos, int) else None
    if tok is not None and cfg is not None and tok != cfg:
        raise ConfigError(f"document_protocol 'fixed': the tokenizer's BOS id {tok} and the "
                          f"model configuration's bos_token_id {cfg} disagree; the initial "
                          "token is ambiguous")
    if tok is not None:
        return tok, "tokenizer"
    if cfg is not None:
        return cfg, "config"
    raise ConfigError("document_protocol 'fixed': neither the tokenizer nor the model "
                      "configuration has a BOS token, so no window can start with one")


@dataclass(frozen=True)
class DocumentProtocol:
    """What the fixed-length protocol did, for the manifest (``to_dict``)."""

    seed: int
    dataset: str
    model_id: str
    window_length: int
    n_documents: int
    initial_token_id: int
    initial_source: str
    documents: int  # distinct documents in the corpus
    duplicates: int  # identical copies left out
    tokenized: int  # documents tokenised (hash order) until K eligible were found
    too_short: int  # of those, skipped for fewer than L - 1 content tokens
    chosen: tuple = field(default_factory=tuple)  # (doc_id, n_content, offset) per window

    def to_dict(self) -> dict:
        return {
            "kind": "fixed", "hash": "sha256('|'.join(map(str, args)))[:8] big-endian "
            "& (2**63 - 1)", "order": "H(seed, dataset, doc_id)",
            "offset": "H(seed, model_id, dataset, doc_id, L) mod (T_x - L + 2)",
            "doc_id": "sha256 of the document's normalised UTF-8 text",
            "seed": self.seed, "dataset": self.dataset, "model_id": self.model_id,
            "window_length": self.window_length, "n_documents": self.n_documents,
            "initial_token_id": self.initial_token_id, "initial_source": self.initial_source,
            "documents": self.documents, "duplicates": self.duplicates,
            "tokenized": self.tokenized, "too_short": self.too_short,
            "windows": [{"doc_id": d, "n_content": n, "offset": o} for d, n, o in self.chosen],
        }


def _content_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    out = tokenizer(texts, add_special_tokens=False, verbose=False,
                    return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    return [list(ids) for ids in out]


def fixed_windows(documents: Sequence[str], tokenizer, window_length: int, *,
                  n_documents: int, seed: int, dataset: str, model_id: str,
                  config_bos: int | None = None,
                  name: str | None = None) -> tuple[list[Window], DocumentProtocol]:
    """The first ``n_documents`` eligible documents' windows, in hash order (module
    docstring), numbered 0..K-1, and the record of how they were chosen.

    Raises ``CorpusError`` (one line, with the number of eligible documents) when the
    corpus has fewer than ``n_documents`` eligible documents, ``ConfigError`` for the
    initial token or bad arguments. Each window's first position is marked special.
    """
    if isinstance(documents, (str, bytes)):
        raise ConfigError("documents: expected a list of strings, got a single string")
    if isinstance(n_documents, bool) or not isinstance(n_documents, int) or n_documents < 1:
        raise ConfigError(f"n_documents: expected a positive integer, got {n_documents!r}")
    if window_length < 2:
        raise ConfigError(f"window_length: expected at least 2, got {window_length}")
    start, source = initial_token(getattr(tokenizer, "bos_token_id", None), config_bos)
    first: dict[str, int] = {}
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise ConfigError(f"documents[{i}]: expected str, got {type(doc).__name__}")
        first.setdefault(hashlib.sha256(doc.encode("utf-8")).hexdigest(), i)
    ids = list(first)
    order = document_order(seed, dataset, ids)
    chosen: list[tuple[str, int, int]] = []
    windows: list[Window] = []
    tokenized = short = 0
    for b in range(0, len(order), _TOKENIZE_BATCH):
        batch = order[b : b + _TOKENIZE_BATCH]
        encoded = _content_ids(tokenizer, [documents[first[ids[j]]] for j in batch])
        for j, content in zip(batch, encoded, strict=True):
            tokenized += 1
            if not eligible(len(content), window_length):
                short += 1
                continue
            doc_id = ids[j]
            o = window_offset(seed, model_id, dataset, doc_id, window_length, len(content))
            tokens = [start, *content[o : o + window_length - 1]]
            special = torch.zeros(window_length, dtype=torch.bool)
            special[0] = True
            windows.append(Window(len(windows), torch.tensor(tokens, dtype=torch.long),
                                  special))
            chosen.append((doc_id, len(content), o))
            if len(windows) == n_documents:
                break
        if len(windows) == n_documents:
            break
    if len(windows) < n_documents:
        label = f"corpus {name}" if name else "the corpus"
        raise CorpusError(
            f"{label} has {len(windows)} eligible documents (at least {window_length - 1} "
            f"content tokens, of {len(ids)} distinct documents); the fixed-length protocol "
            f"asks n_documents={n_documents}")
    record = DocumentProtocol(
        seed=seed, dataset=dataset, model_id=model_id, window_length=window_length,
        n_documents=n_documents, initial_token_id=start, initial_source=source,
        documents=len(ids), duplicates=len(documents) - len(ids), tokenized=tokenized,
        too_short=short, chosen=tuple(chosen))
    return windows, record


def protocol_windows(config, tokenizer, docs: Sequence[str], info, *, n_windows=None,
                     start_window=None):
    """A run's windows under ``document_protocol = "fixed"``: ``(windows, info, policy)``.

    The documents ``read_documents`` gave, the corpus label as ``dataset``, the model
    label as ``model_id``, ``config.seed`` and ``config.n_documents``; the model's
    configuration is read (not its weights) for its ``bos_token_id``. ``start_window``
    and ``n_windows`` slice the ``n_documents`` windows (shards); ``info`` gains the
    protocol's record (``CorpusInfo.document_protocol``) for the manifest.
    """
    from attngeom.capture.loading import inspect_model
    from attngeom.corpora.labels import label_of
    from attngeom.corpora.windows import BoundaryPolicy

    shape = inspect_model(config.model) or {}
    dataset = config.corpus_label or label_of(config.corpus)
    model_id = config.model_label or label_of(config.model)
    windows, record = fixed_windows(
        docs, tokenizer, config.window_length, n_documents=config.n_documents,
        seed=config.seed, dataset=dataset, model_id=model_id,
        config_bos=shape.get("bos_token_id"), name=getattr(info, "name", None))
    start = config.start_window if start_window is None else start_window
    n = config.windows_needed if n_windows is None else n_windows
    stop = None if n is None else start + n
    windows = windows[start:stop]
    if not windows:
        raise CorpusError(f"document_protocol 'fixed' gives {config.n_documents} windows; "
                          f"none is left from window {start} on")
    token = record.initial_token_id
    policy = BoundaryPolicy(
        "initial", token, str(tokenizer.convert_ids_to_tokens(token)), True, (), (),
        f"document_protocol 'fixed': one window per document, initial token from the "
        f"{record.initial_source}")
    return windows, dataclasses.replace(info, document_protocol=record.to_dict()), policy


def config_documents(config):
    """``(documents, CorpusInfo)`` of a run's corpus, read with the run's options."""
    from attngeom.corpora.corpus import read_documents

    return read_documents(config.corpus, text_column=config.text_column,
                          separator=config.separator, sample=config.sample_documents,
                          seed=config.seed)


def probe_documents(corpus: str | None) -> tuple[list[str], str]:
    """The competition probes' documents and corpus label: WikiText-2's test articles
    (the bundled asset, split at article headings) for ``None``, else the corpus as
    ``read_documents`` reads it."""
    from attngeom.corpora.corpus import WIKITEXT_ARTICLES, read_documents

    if corpus is None:
        from attngeom.assets import asset

        corpus = asset("wikitext-2-test", "--corpus")
        docs, _ = read_documents(corpus, separator=WIKITEXT_ARTICLES)
        return docs, "wikitext-2-test"
    docs, info = read_documents(corpus)
    return docs, info.name


def probe_corpus(corpus: str) -> str | None:
    """``None`` (the probes' default, WikiText-2's test articles) for the bundled asset,
    else the corpus path."""
    from attngeom.assets import asset

    try:
        bundled = Path(asset("wikitext-2-test", "--corpus")).resolve()
    except ConfigError:
        return corpus
    return None if Path(corpus).expanduser().resolve() == bundled else corpus


def check_documents(config, tokenizer) -> None:
    """Fail in one line, before any model loads, when a run asks more eligible documents
    than its corpus has: a fixed-protocol run (``document_protocol = "fixed"``) or a
    context sweep (``probe = "context"``, eligible at its longest length). The corpus is
    read and tokenised up to the ``n_documents``-th eligible document, as the run will;
    the ``CorpusError`` names how many the corpus has. Other runs pass untouched."""
    if getattr(config, "document_protocol", "stream") == "fixed":
        docs, info = config_documents(config)
        protocol_windows(config, tokenizer, docs, info)
        return
    if getattr(config, "probe", None) != "context":
        return
    from attngeom.capture.loading import inspect_model
    from attngeom.corpora.labels import label_of

    docs, name = probe_documents(probe_corpus(config.corpus))
    shape = inspect_model(config.model) or {}
    lengths = config.context_lengths(shape.get("max_positions"))
    if not lengths:
        return  # the configuration's own check says so, in one line
    fixed_windows(docs, tokenizer, max(lengths), n_documents=config.n_documents,
                  seed=config.seed, dataset=name, model_id=config.model_label
                  or label_of(config.model), config_bos=shape.get("bos_token_id"),
                  name=name)


def load_windows(config, tokenizer, *, n_windows=None, start_window=None):
    """Read the corpus and cut it into windows of ``config.window_length`` tokens.

    Returns ``(windows, corpus_info, policy)``; ``policy`` is the document-boundary
    policy (method §10) the windows follow.
    """
    from attngeom.corpora.windows import boundary_policy, document_windows, make_windows

    policy = boundary_policy(tokenizer, config.doc_boundary, config.boundary_token)
    docs, info = config_documents(config)
    if getattr(config, "document_protocol", "stream") == "fixed":
        return protocol_windows(config, tokenizer, docs, info, n_windows=n_windows,
                                start_window=start_window)
    n = config.windows_needed if n_windows is None else n_windows
    start = config.start_window if start_window is None else start_window
    name = getattr(info, "name", None)
    if config.windows_per_document:
        windows, short = document_windows(
            docs, tokenizer, config.window_length, config.windows_per_document,
            n_windows=n, start_window=start, policy=policy, name=name)
        info = dataclasses.replace(info, documents_too_short=short)
    else:
        windows = make_windows(docs, tokenizer, config.window_length, n_windows=n,
                               start_window=start, policy=policy, name=name)
    if not windows:
        raise CorpusError(
            f"corpus {config.corpus} gives no window of {config.window_length} tokens "
            f"from window {config.start_window} on"
        )
    return windows, info, policy

"""Token windows of exactly T tokens cut from a list of documents (method §10).

Document boundaries follow the model's own training convention, decided from its
tokenizer (``boundary_policy``), because a token the model never saw between
documents becomes a sink the corpus invented (llama2.c models never saw EOS):

- ``bos``: the tokenizer puts BOS in front of every text (Llama, Mistral, Gemma,
  llama2.c models). BOS starts every document, including documents that start
  inside a window, and every window starts with BOS: the document's own where a
  document begins at the window's first token, an inserted one otherwise.
- ``eos``: the tokenizer adds nothing and the vocabulary has an end-of-text token
  (``<|endoftext|>``, else the EOS token): GPT-2, GPT-NeoX/Pythia, Qwen, SmolLM2. It
  goes between documents. Where it is also the tokenizer's BOS (GPT-2, Pythia) it
  starts every window as above; otherwise (SmolLM2, whose declared BOS is the chat
  token ``<|im_start|>``) the model has no document-start token and position 0 is
  whatever token starts the window.
- ``sep``: encoders (the tokenizer closes a text with ``[SEP]``). Every window is
  framed ``[CLS] ... [SEP]`` and documents inside a window are joined with
  ``[SEP]``, the segment boundary BERT was trained on.
- ``none``: nothing between documents (a tokenizer with no such token).

``doc_boundary`` overrides the choice (``--doc-boundary``) and ``boundary_token``
the token (``--boundary-token``; it must be in the vocabulary). The policy goes to
the manifest (``BoundaryPolicy.to_dict``).

Each document is tokenised on its own, without special tokens, and the stream of
documents and boundary tokens is cut into consecutive windows of ``T`` tokens
(documents longer than ``MAX_PIECE_CHARS`` characters are tokenised in pieces cut
at a line break or space, which bounds memory). The incomplete last window is
dropped. Window ``i`` is always the same tokens for the same documents, tokenizer,
policy and ``T``, so shards (``start_window``/``n_windows``) and resumed runs agree
with a single run, and ``window_fingerprint`` can prove it. Each window also marks
its **special** positions (frame and boundary tokens): queries are content
positions (method §4), so analyses skip them as queries while keeping them as keys.
Tokenising stops as soon as the requested windows are complete.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from attngeom.errors import ConfigError, CorpusError
from attngeom.names import DOC_BOUNDARIES
from attngeom.validate import boundary_options

__all__ = [
    "BoundaryPolicy", "Window", "boundary_policy", "make_windows",
    "special_token_frame", "window_fingerprint",
]

MAX_PIECE_CHARS = 1 << 22  # 4 Mi characters
_BATCH_CHARS = 1 << 18  # characters handed to the tokenizer per call
_PROBES = ("Hello world", "a", "0", "The")
END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True, eq=False)
class Window:
    """One window: its global index in the corpus, its ``T`` token ids and special mask.

    ``input_ids`` is a 1-D ``torch.int64`` tensor of shape (T,); ``special`` (T,) bool
    marks frame and document-boundary tokens (never analysed as queries), ``None``
    when unknown (every position is content). Compare windows with
    ``torch.equal(a.input_ids, b.input_ids)`` (``==`` is identity).
    """

    index: int
    input_ids: torch.Tensor
    special: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __repr__(self) -> str:
        return f"Window(index={self.index}, T={len(self)})"


@dataclass(frozen=True)
class BoundaryPolicy:
    """How documents are joined and windows framed (module docstring).

    ``token_id`` goes at every document boundary (``None``: nothing); with
    ``window_start`` it also starts every window (and every document, the first
    included). ``prefix`` / ``suffix`` frame every window's content (the tokenizer's
    own special tokens less the merged start token). ``reason`` says why.
    """

    kind: str
    token_id: int | None
    token: str | None
    window_start: bool
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    reason: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "token_id": self.token_id, "token": self.token,
                "window_start": self.window_start, "prefix": list(self.prefix),
                "suffix": list(self.suffix), "reason": self.reason}


def _ids(encoding) -> list[int]:
    ids = encoding["input_ids"]
    return list(ids)


def special_token_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The ids ``(prefix, suffix)`` the tokenizer itself puts around one text.

    Found generically: a probe text is encoded with and without special tokens and
    the content's position in the first locates the prefix and suffix; the count is
    checked against ``tokenizer.num_special_tokens_to_add()`` where it exists (the
    transformers 5 fast tokenizers have no ``build_inputs_with_special_tokens``).
    """
    expected = None
    if hasattr(tokenizer, "num_special_tokens_to_add"):
        try:
            expected = int(tokenizer.num_special_tokens_to_add())
        except (TypeError, ValueError, NotImplementedError):
            expected = None
    for probe in _PROBES:
        full = _ids(tokenizer(probe, add_special_tokens=True))
        content = _ids(tokenizer(probe, add_special_tokens=False))
        if not content:
            continue
        k = len(content)
        at = next((i for i in range(len(full) - k + 1) if full[i : i + k] == content), None)
        if at is None:
            continue
        prefix, suffix = full[:at], full[at + k :]
        if expected is not None and len(prefix) + len(suffix) != expected:
            continue
        return [int(i) for i in prefix], [int(i) for i in suffix]
    raise ConfigError(
        f"cannot tell which special tokens {type(tokenizer).__name__} adds: encoding "
        f"{_PROBES[0]!r} with and without add_special_tokens does not differ by "
        f"{expected if expected is not None else 'a'} prefix/suffix"
    )


def _token_id(tokenizer, token: str) -> int | None:
    """The id of ``token`` if the vocabulary (added tokens included) holds it."""
    vocab = tokenizer.get_vocab()
    value = vocab.get(token)
    return int(value) if isinstance(value, int) else None


def _token_text(tokenizer, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    return str(tokenizer.convert_ids_to_tokens(int(token_id)))


def _end_of_text(tokenizer) -> int | None:
    eot = _token_id(tokenizer, END_OF_TEXT)
    if eot is not None:
        return eot
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(eos) if isinstance(eos, int) else None


def boundary_policy(
    tokenizer, doc_boundary: str = "auto", boundary_token: str | None = None
) -> BoundaryPolicy:
    """Decide how documents are joined and windows framed for this tokenizer.

    ``doc_boundary="auto"`` follows the module docstring's rules; ``bos``, ``eos``,
    ``sep`` or ``none`` force a policy, with ``boundary_token`` (a token string the
    vocabulary must hold) in place of the tokenizer's own. Raises ``ConfigError``
    naming the token for an unknown ``boundary_token``, or a forced policy the
    tokenizer has no token for.

    >>> boundary_policy(tokenizer).kind, boundary_policy(tokenizer).token
    ('bos', '<s>')
    """
    boundary_options(doc_boundary, boundary_token, DOC_BOUNDARIES)
    name = type(tokenizer).__name__
    prefix, suffix = special_token_frame(tokenizer)
    bos = getattr(tokenizer, "bos_token_id", None)
    bos = int(bos) if isinstance(bos, int) else None
    forced = None
    if boundary_token is not None:
        forced = _token_id(tokenizer, boundary_token)
        if forced is None:
            raise ConfigError(
                f"boundary_token: {boundary_token!r} is not a token of {name}'s vocabulary; "
                "pass a token the tokenizer knows (e.g. its EOS or BOS token)"
            )
    kind = doc_boundary
    if kind == "auto":
        if suffix:
            kind, why = "sep", "the tokenizer closes every text (an encoder): [CLS] ... [SEP]"
        elif prefix and bos is not None and prefix == [bos]:
            kind, why = "bos", "the tokenizer prepends BOS to every text"
        elif _end_of_text(tokenizer) is not None:
            kind, why = "eos", "the tokenizer adds no special token; end-of-text between documents"
        else:
            kind, why = "none", "the tokenizer adds no special token and has no end-of-text token"
    else:
        why = f"doc_boundary={doc_boundary!r} given"

    if kind == "bos":
        token_id = forced if forced is not None else bos
        if token_id is None:
            raise ConfigError(f"doc_boundary 'bos': {name} has no BOS token; pass --boundary-token")
        # the tokenizer's own BOS prefix is the merged window-start token
        frame_prefix = prefix[1:] if prefix[:1] == [token_id] else prefix
        return BoundaryPolicy("bos", token_id, _token_text(tokenizer, token_id), True,
                              tuple(frame_prefix), tuple(suffix), why)
    if kind == "eos":
        token_id = forced if forced is not None else _end_of_text(tokenizer)
        if token_id is None:
            raise ConfigError(
                f"doc_boundary 'eos': {name} has no end-of-text or EOS token; pass "
                "--boundary-token"
            )
        start = not prefix and bos is not None and bos == token_id
        if start:
            why += "; it is also the BOS, so it starts every window"
        elif not prefix:
            why += "; no document-start token, so position 0 is whatever token starts the window"
        return BoundaryPolicy("eos", token_id, _token_text(tokenizer, token_id), start,
                              tuple(prefix), tuple(suffix), why)
    if kind == "sep":
        sep = getattr(tokenizer, "sep_token_id", None)
        token_id = forced if forced is not None else (int(sep) if isinstance(sep, int) else None)
        if token_id is None:
            raise ConfigError(f"doc_boundary 'sep': {name} has no SEP token; pass --boundary-token")
        return BoundaryPolicy("sep", token_id, _token_text(tokenizer, token_id), False,
                              tuple(prefix), tuple(suffix), why)
    return BoundaryPolicy("none", None, None, False, tuple(prefix), tuple(suffix), why)


def _pieces(doc: str, limit: int) -> Iterator[str]:
    """``doc`` in pieces of at most ``limit`` characters, cut after a newline or space."""
    while len(doc) > limit:
        cut = doc.rfind("\n", 0, limit)
        if cut <= 0:
            cut = doc.rfind(" ", 0, limit)
        cut = limit if cut <= 0 else cut + 1
        yield doc[:cut]
        doc = doc[cut:]
    if doc:
        yield doc


def _stream(documents: Iterable[str], tokenizer, policy: BoundaryPolicy, need: int | None,
            piece_chars: int) -> tuple[list[int], list[int]]:
    """Token stream and the stream indices of its boundary tokens, stopping at ``need``.

    A boundary token goes before every document but the first, and before the first
    too when it starts windows (``policy.window_start``).
    """
    stream: list[int] = []
    marks: list[int] = []
    batch: list[tuple[bool, str]] = []  # (starts a new document, text)
    chars = 0
    token = policy.token_id

    def flush() -> None:
        texts = [t for _, t in batch]
        encoded = tokenizer(
            texts, add_special_tokens=False, verbose=False,
            return_attention_mask=False, return_token_type_ids=False,
        )["input_ids"]
        for (starts_doc, _), ids in zip(batch, encoded, strict=True):
            if starts_doc and token is not None and (stream or policy.window_start):
                marks.append(len(stream))
                stream.append(token)
            stream.extend(ids)
        batch.clear()

    for d, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise ConfigError(f"documents[{d}]: expected str, got {type(doc).__name__}")
        if not doc:
            continue
        for p, piece in enumerate(_pieces(doc, piece_chars)):
            batch.append((p == 0, piece))
            chars += len(piece)
            if chars >= _BATCH_CHARS:
                flush()
                chars = 0
                if need is not None and len(stream) >= need:
                    return stream, marks
    if batch:
        flush()
    return stream, marks


def _cut(stream: torch.Tensor, mark: torch.Tensor, policy: BoundaryPolicy, content: int,
         stop: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive windows' (content ids, boundary mask), at most ``stop`` of them.

    Without a window-start token the windows are consecutive chunks of ``content``
    tokens. With one, a window whose first stream token is a document's own boundary
    token takes ``content`` stream tokens; any other gets the token inserted and takes
    ``content - 1`` (so every window starts with it and none holds it twice in a row).
    """
    n = int(stream.numel())
    out = []
    p = 0
    token = policy.token_id
    while stop is None or len(out) < stop:
        insert = policy.window_start and p < n and not bool(mark[p])
        if insert:
            take = content - 1
            if p + take > n:
                break
            ids = torch.cat([torch.tensor([token], dtype=torch.long), stream[p : p + take]])
            flags = torch.cat([torch.ones(1, dtype=torch.bool), mark[p : p + take]])
        else:
            take = content
            if p + take > n:
                break
            ids, flags = stream[p : p + take], mark[p : p + take]
        out.append((ids, flags))
        p += take
    return out


def make_windows(
    documents: Iterable[str],
    tokenizer,
    window_length: int,
    *,
    n_windows: int | None = None,
    start_window: int = 0,
    policy: BoundaryPolicy | None = None,
    name: str | None = None,
) -> list[Window]:
    """Windows ``start_window .. start_window + n_windows - 1`` of ``window_length`` tokens.

    Follows ``policy`` (default: ``boundary_policy(tokenizer)``, see the module
    docstring); indices are global, so window ``i`` is the same whatever range is
    asked for. ``n_windows=None`` returns every complete window from ``start_window``
    on; fewer than ``n_windows`` come back when the corpus ends first, and none when
    ``start_window`` is past its end. ``name`` (e.g. ``CorpusInfo.name``) only labels
    errors.

    Raises ``CorpusError`` when the corpus cannot fill one window, ``ConfigError``
    for bad arguments.

    Shapes: each ``Window.input_ids`` is (window_length,) int64.

    >>> w = make_windows(["Once upon a time."] * 50, tokenizer, 64, n_windows=2)
    >>> [x.index for x in w], w[0].input_ids[0].item() == tokenizer.bos_token_id
    ([0, 1], True)
    """
    if isinstance(documents, (str, bytes)):
        raise ConfigError("documents: expected a list of strings, got a single string")

    policy = boundary_policy(tokenizer) if policy is None else policy
    prefix, suffix = list(policy.prefix), list(policy.suffix)
    n_special = len(prefix) + len(suffix) + int(policy.window_start)
    content = window_length - len(prefix) - len(suffix)
    if content - int(policy.window_start) < 1:
        raise ConfigError(
            f"window_length: expected more than the {n_special} special tokens "
            f"{type(tokenizer).__name__} adds, got {window_length}"
        )
    need = None if n_windows is None else (start_window + n_windows) * content
    stream_list, marks = _stream(documents, tokenizer, policy, need, MAX_PIECE_CHARS)
    stream = torch.tensor(stream_list, dtype=torch.long)
    mark = torch.zeros(stream.numel(), dtype=torch.bool)
    if marks:
        mark[torch.tensor(marks, dtype=torch.long)] = True
    stop = None if n_windows is None else start_window + n_windows
    chunks = _cut(stream, mark, policy, content, stop)
    if not chunks:
        label = f"corpus {name}" if name else "the corpus"
        extra = f" ({window_length} with {n_special} special tokens)" if n_special else ""
        raise CorpusError(
            f"{label} has {len(stream_list)} tokens; one window needs "
            f"{window_length - n_special}{extra}"
        )
    pre = torch.tensor(prefix, dtype=torch.long)
    suf = torch.tensor(suffix, dtype=torch.long)
    pre_m = torch.ones(len(prefix), dtype=torch.bool)
    suf_m = torch.ones(len(suffix), dtype=torch.bool)
    return [
        Window(i, torch.cat([pre, ids, suf]), torch.cat([pre_m, flags, suf_m]))
        for i, (ids, flags) in enumerate(chunks)
        if i >= start_window
    ]


def document_windows(
    documents: Iterable[str],
    tokenizer,
    window_length: int,
    per_document: int,
    *,
    n_windows: int | None = None,
    start_window: int = 0,
    policy: BoundaryPolicy | None = None,
    name: str | None = None,
) -> tuple[list[Window], int]:
    """Windows cut from each document alone: its first ``per_document`` windows.

    Each document is framed and cut exactly as a one-document corpus would be
    (``make_windows([doc], ...)``), so every window starts at a document's start and
    never spans two documents; a document too short for one window gives none.
    Windows are numbered across documents in document order (``start_window`` and
    ``n_windows`` count those numbers). Returns the windows and how many documents
    were too short.
    """
    if isinstance(per_document, bool) or not isinstance(per_document, int) or per_document < 1:
        raise ConfigError(f"windows_per_document: expected a positive integer, got "
                          f"{per_document!r}")
    policy = boundary_policy(tokenizer) if policy is None else policy
    stop = None if n_windows is None else start_window + n_windows
    out: list[Window] = []
    short, index = 0, 0
    for doc in documents:
        if stop is not None and index >= stop:
            break
        try:
            cut = make_windows([doc], tokenizer, window_length, n_windows=per_document,
                               policy=policy, name=name)
        except CorpusError:
            short += 1
            continue
        for w in cut:
            if stop is not None and index >= stop:
                break
            if index >= start_window:
                out.append(Window(index, w.input_ids, w.special))
            index += 1
    return out, short


def window_fingerprint(windows: Iterable[Window]) -> str:
    """sha256 (hex) of the windows' indices and token ids, in the order given.

    Two runs that cut the same windows get the same fingerprint, whatever machine.
    """
    h = hashlib.sha256()
    for w in windows:
        ids = w.input_ids.detach().to("cpu", torch.int64).contiguous()
        h.update(struct.pack("<qq", int(w.index), int(ids.numel())))
        h.update(ids.numpy().astype("<i8", copy=False).tobytes())
    return h.hexdigest()

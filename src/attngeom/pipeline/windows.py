"""Token windows of exactly T tokens cut from a list of documents (SPEC 7).

Window policy, and why:

1. **Frame.** Every window is ``prefix + content + suffix``, where prefix and suffix
   are the special tokens the tokenizer itself puts around one sequence, found by
   encoding a probe text with and without ``add_special_tokens`` (the transformers 5
   fast tokenizers no longer have ``build_inputs_with_special_tokens``): ``<s>`` first
   for Llama-style tokenizers, ``[CLS] ... [SEP]`` for BERT. SPEC 7 asks for BOS at
   position 0 "where the tokenizer has one", so with ``add_bos=None`` a tokenizer
   that defines a BOS token but does not add it (GPT-2, GPT-NeoX/Pythia) gets it
   prepended as well; ``add_bos=False`` keeps exactly the tokenizer's own frame.
   Position 0 is then the same token in every window, which is what SPEC 3's sink
   analysis compares across windows.
2. **Stream.** Each document is tokenised on its own, without special tokens, and
   the documents' tokens are concatenated in order with one separator token
   between consecutive documents (the EOS token by default, else the tokenizer's
   SEP token, else nothing). This is how causal LMs are trained on packed text
   (GPT-2's ``<|endoftext|>``, Llama's ``</s>``), it wastes no tokens on padding,
   and, for tokenizers whose BOS differs from EOS (Llama), it keeps BOS out of the
   middle of a window, where it could create a second sink. Where BOS and EOS are
   one token (GPT-2, Pythia) the separator is that token, as in those models'
   training data; ``sink_positions`` then reports any mid-window sink it creates.
   Documents longer than ``MAX_PIECE_CHARS`` characters are tokenised in
   pieces cut at a line break (or a space), which bounds memory; the cut depends on
   the text alone.
3. **Cut.** The stream is cut into consecutive, non-overlapping chunks of
   ``L = T - len(prefix) - len(suffix)`` tokens: window ``i`` holds stream tokens
   ``[i*L, (i+1)*L)``. A window may start or end inside a document. The incomplete
   last chunk is dropped, so every window has exactly ``T`` tokens.

Because a document's tokens never depend on the other documents or on how they
were batched, window ``i`` is always the same tokens for the same documents,
tokenizer and ``T``: shards (``start_window``/``n_windows``) and resumed runs agree
with a single run (ROADMAP), and ``window_fingerprint`` can prove it. Tokenising
stops as soon as the requested windows are complete.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from attngeom.errors import ConfigError, CorpusError

__all__ = ["Window", "make_windows", "special_token_frame", "window_fingerprint"]

MAX_PIECE_CHARS = 1 << 22  # 4 Mi characters
_BATCH_CHARS = 1 << 18  # characters handed to the tokenizer per call
_PROBES = ("Hello world", "a", "0", "The")


@dataclass(frozen=True, eq=False)
class Window:
    """One window: its global index in the corpus and its ``T`` token ids.

    ``input_ids`` is a 1-D ``torch.int64`` tensor of shape (T,). Compare windows
    with ``torch.equal(a.input_ids, b.input_ids)`` (``==`` is identity).
    """

    index: int
    input_ids: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __repr__(self) -> str:
        return f"Window(index={self.index}, T={len(self)})"


def _ids(encoding) -> list[int]:
    ids = encoding["input_ids"]
    return list(ids)


def special_token_frame(tokenizer, *, add_bos: bool | None = None) -> tuple[list[int], list[int]]:
    """The ids ``(prefix, suffix)`` a window's content is framed with (policy 1).

    Found generically: a probe text is encoded with and without special tokens and
    the content's position in the first locates the prefix and suffix; the count is
    checked against ``tokenizer.num_special_tokens_to_add()`` where it exists.
    ``add_bos=None`` prepends ``tokenizer.bos_token_id`` when the tokenizer defines it
    but does not put it first itself; ``True`` requires a BOS token; ``False`` keeps
    the tokenizer's own special tokens only.
    """
    expected = None
    if hasattr(tokenizer, "num_special_tokens_to_add"):
        try:
            expected = int(tokenizer.num_special_tokens_to_add())
        except (TypeError, ValueError, NotImplementedError):
            expected = None
    frame = None
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
        frame = (prefix, suffix)
        break
    if frame is None:
        raise ConfigError(
            f"cannot tell which special tokens {type(tokenizer).__name__} adds: encoding "
            f"{_PROBES[0]!r} with and without add_special_tokens does not differ by "
            f"{expected if expected is not None else 'a'} prefix/suffix"
        )
    prefix, suffix = frame
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos is True and bos is None:
        raise ConfigError(
            f"add_bos=True: expected a tokenizer with a BOS token, got "
            f"{type(tokenizer).__name__} without one"
        )
    if add_bos is not False and bos is not None and prefix[:1] != [int(bos)]:
        prefix = [int(bos), *prefix]
    return [int(i) for i in prefix], [int(i) for i in suffix]


def _default_separator(tokenizer) -> int | None:
    for attr in ("eos_token_id", "sep_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return None


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


def _stream(documents: Iterable[str], tokenizer, separator: int | None, need: int | None,
            piece_chars: int) -> list[int]:
    """Content-token stream of policy 2, stopping once it holds ``need`` tokens."""
    stream: list[int] = []
    batch: list[tuple[bool, str]] = []  # (starts a new document, text)
    chars = 0
    first = True

    def flush() -> None:
        texts = [t for _, t in batch]
        encoded = tokenizer(
            texts, add_special_tokens=False, verbose=False,
            return_attention_mask=False, return_token_type_ids=False,
        )["input_ids"]
        for (starts_doc, _), ids in zip(batch, encoded, strict=True):
            if starts_doc and stream and separator is not None:
                stream.append(separator)
            stream.extend(ids)
        batch.clear()

    for d, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise ConfigError(f"documents[{d}]: expected str, got {type(doc).__name__}")
        if not doc:
            continue
        for p, piece in enumerate(_pieces(doc, piece_chars)):
            batch.append((p == 0 and not first, piece))
            chars += len(piece)
            if chars >= _BATCH_CHARS:
                flush()
                chars = 0
                if need is not None and len(stream) >= need:
                    return stream
        first = False
    if batch:
        flush()
    return stream


def make_windows(
    documents: Iterable[str],
    tokenizer,
    window_length: int,
    *,
    n_windows: int | None = None,
    start_window: int = 0,
    add_bos: bool | None = None,
    separator_id: int | None | str = "auto",
    name: str | None = None,
) -> list[Window]:
    """Windows ``start_window .. start_window + n_windows - 1`` of ``window_length`` tokens.

    Follows the module's window policy (tokenizer's frame, documents packed with a
    separator token, cut into consecutive chunks); indices are global, so window
    ``i`` is the same whatever range is asked for. ``n_windows=None`` returns every
    complete window from ``start_window`` on; fewer than ``n_windows`` come back when
    the corpus ends first, and none when ``start_window`` is past its end.
    ``separator_id="auto"`` joins documents with EOS (else SEP, else nothing); pass
    an id or None to choose. ``name`` (e.g. ``CorpusInfo.name``) only labels errors.

    Raises ``CorpusError`` when the corpus cannot fill one window, ``ConfigError``
    for bad arguments.

    Shapes: each ``Window.input_ids`` is (window_length,) int64.

    >>> from transformers import AutoTokenizer                      # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained("shared/assets/stories260K-hf")  # doctest: +SKIP
    >>> w = make_windows(["Once upon a time."] * 50, tok, 64, n_windows=2)  # doctest: +SKIP
    >>> [x.index for x in w], w[0].input_ids[0].item() == tok.bos_token_id  # doctest: +SKIP
    ([0, 1], True)
    """
    for arg, value, low in (("window_length", window_length, 2), ("start_window", start_window, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{arg}: expected an integer >= {low}, got {value!r}")
    if n_windows is not None and (
        isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1
    ):
        raise ConfigError(f"n_windows: expected a positive integer or None, got {n_windows!r}")
    if isinstance(documents, (str, bytes)):
        raise ConfigError("documents: expected a list of strings, got a single string")

    prefix, suffix = special_token_frame(tokenizer, add_bos=add_bos)
    n_special = len(prefix) + len(suffix)
    content = window_length - n_special
    if content < 1:
        raise ConfigError(
            f"window_length: expected more than the {n_special} special tokens "
            f"{type(tokenizer).__name__} adds, got {window_length}"
        )
    if separator_id == "auto":
        separator = _default_separator(tokenizer)
    elif separator_id is None or (
        isinstance(separator_id, int) and not isinstance(separator_id, bool)
    ):
        separator = separator_id
    else:
        raise ConfigError(
            f"separator_id: expected 'auto', a token id or None, got {separator_id!r}"
        )

    need = None if n_windows is None else (start_window + n_windows) * content
    stream = _stream(documents, tokenizer, separator, need, MAX_PIECE_CHARS)
    available = len(stream) // content
    if available == 0:
        extra = f" ({window_length} with {n_special} special tokens)" if n_special else ""
        label = f"corpus {name}" if name else "the corpus"
        raise CorpusError(
            f"{label} has {len(stream)} tokens; one window needs {content}{extra}"
        )
    stop = available if n_windows is None else min(available, start_window + n_windows)
    ids = torch.tensor(stream[: stop * content], dtype=torch.long)
    pre = torch.tensor(prefix, dtype=torch.long)
    suf = torch.tensor(suffix, dtype=torch.long)
    return [
        Window(i, torch.cat([pre, ids[i * content : (i + 1) * content], suf]))
        for i in range(start_window, stop)
    ]


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

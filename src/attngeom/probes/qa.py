"""A bAbI qa1 probe under competition: episodes, background, prompts, spans, scoring.

The follow-up paper (arXiv 2609.37879, Sec. 3.3 and App. D) asks where a model's
retrieval goes when the facts it needs are buried in background text. This module
builds that test from scratch, so nothing has to be downloaded:

- **episodes** (``generate_episodes``): bAbI qa1 stories written here. People move
  between the six locations ("Mary went to the kitchen."), 2-6 facts, the question
  "Where is Mary?" about someone who moved; the answer is that person's last location
  and the supporting sentence, known by construction, is their last move. A person
  never "moves" to where they already are and no fact repeats the supporting sentence,
  so the support occurs exactly once.
- **background** (``background_sentences``, ``build_examples``): sentences from any
  corpus (documents split at ``.``, ``!``, ``?``), a contiguous run starting at a seeded
  place, as many as fit the target token count; sentences that name one of the people
  are skipped so that the answer stays the constructed one. The facts go in order into
  seeded gaps between background sentences. The runs are nested: an episode's 512-token
  background extends its 256-token one.
- **prompts** (``PROMPT_FORMATS``): ``"plain"`` is the paper's (an instruction line,
  "Context:" and the input, "Question: ...", "Answer:", blank lines between the blocks,
  one initial token prepended, the rest tokenised without special tokens); ``"chat"``
  puts the same instruction, context and question into one user turn of the model's chat
  template and opens the assistant turn.
- **spans**: token j belongs to the character span [a, b) iff b_j > a, a_j < b and
  b_j > a_j (fast-tokenizer offsets), shifted by one for a prepended initial token. The
  support S is the supporting sentence's tokens, the context T_x every token of the
  input field.
- **answers**: the six candidates are scored by the final prompt position's logit of
  the first token of " " + candidate (plain; in a chat prompt the candidate opens the
  assistant turn, so without the space); answer loss = cross-entropy over the six (float64
  log-sum-exp); the prediction is the arg max, ties to the first in sorted order. When
  two candidates share a first token each is scored instead by the mean log-probability
  of its whole continuation, and the result says so (``Candidates.rule``).

Real BABILong data (``load_babilong``) is read from local files or the local
``datasets`` cache only; its support sentence is mapped as for the generated episodes:
the asked person's last movement sentence, which has to occur exactly once and name the
target.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attngeom.errors import ConfigError, CorpusError

NAMES = ("Mary", "John", "Daniel", "Sandra")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
VERBS = ("went to", "journeyed to", "travelled to", "moved to", "went back to")
INSTRUCTION = "Read the context and answer the question. Return only the short answer."
PROMPT_FORMATS = ("plain", "chat")
_SEED_TAG = 0x0A1  # mixes the probe's seeds apart from other streams of the same seed
_MOVE = re.compile(r"\b(" + "|".join(NAMES) + r") (?:went back|went|journeyed|travelled|moved)"
                   r" to the (\w+)\.")


# --------------------------------------------------------------------------- episodes


@dataclass(frozen=True)
class Episode:
    """One qa1 story: its facts in order, the question, the answer and the support."""

    facts: tuple[str, ...]
    person: str
    answer: str
    support: int  # index of the supporting fact (the person's last move)

    @property
    def question(self) -> str:
        return f"Where is {self.person}?"

    @property
    def support_sentence(self) -> str:
        return self.facts[self.support]


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([_SEED_TAG, *[int(k) & 0xFFFFFFFF
                                                                      for k in keys]]))


def generate_episodes(n: int, *, facts: tuple[int, int] = (2, 6), seed: int = 0,
                      ) -> list[Episode]:
    """``n`` qa1 episodes with ``facts[0]..facts[1]`` facts each, reproducible from ``seed``.

    >>> e = generate_episodes(1, seed=3)[0]
    >>> e.facts[e.support].startswith(e.person), e.support_sentence.endswith(e.answer + ".")
    (True, True)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"expected at least one episode, got n={n!r}")
    low, high = facts
    if not (1 <= low <= high):
        raise ConfigError(f"expected facts as (min, max) with 1 <= min <= max, got {facts!r}")
    out = []
    for index in range(n):
        rng = _rng(seed, index)
        while True:
            episode = _draw_episode(rng, int(rng.integers(low, high + 1)))
            if episode is not None:
                out.append(episode)
                break
    return out


def _draw_episode(rng: np.random.Generator, n_facts: int) -> Episode | None:
    where: dict[str, str] = {}
    sentences, movers = [], []
    for _ in range(n_facts):
        person = NAMES[int(rng.integers(len(NAMES)))]
        choices = [loc for loc in LOCATIONS if loc != where.get(person)]
        location = choices[int(rng.integers(len(choices)))]
        verb = VERBS[int(rng.integers(len(VERBS)))]
        where[person] = location
        sentences.append(f"{person} {verb} the {location}.")
        movers.append(person)
    asked = sorted(set(movers))[int(rng.integers(len(set(movers))))]
    support = max(i for i, p in enumerate(movers) if p == asked)
    if sentences.count(sentences[support]) != 1:
        return None  # the support must occur exactly once: draw again
    return Episode(facts=tuple(sentences), person=asked, answer=where[asked], support=support)


# --------------------------------------------------------------------------- background

_SPLIT = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after ``.``, ``!`` or ``?`` followed by white space,
    inner white space collapsed; fragments of fewer than three words are dropped."""
    flat = " ".join(text.split())
    return [s for s in _SPLIT.split(flat) if len(s.split()) >= 3]


def background_sentences(documents: Sequence[str]) -> list[str]:
    """Every sentence of ``documents`` in order (``split_sentences`` of each)."""
    return [s for doc in documents for s in split_sentences(doc)]


def _names_in(sentence: str, names: Sequence[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", sentence) for n in names)


class _Background:
    """Token counts of corpus sentences, computed once each as they are needed."""

    def __init__(self, sentences: Sequence[str], tokenizer) -> None:
        self.sentences = list(sentences)
        if not self.sentences:
            raise CorpusError("the background corpus holds no sentence of three or more words")
        self.tokenizer = tokenizer
        self._lengths: dict[int, int] = {}

    def length(self, i: int) -> int:
        if i not in self._lengths:
            ids = self.tokenizer(" " + self.sentences[i], add_special_tokens=False)["input_ids"]
            self._lengths[i] = len(ids)
        return self._lengths[i]

    def run(self, start: int, target: int, avoid: Sequence[str]) -> tuple[list[str], int]:
        """Sentences from ``start`` on (cyclically) while their tokens stay <= ``target``."""
        chosen, total = [], 0
        n = len(self.sentences)
        for step in range(n):
            i = (start + step) % n
            if _names_in(self.sentences[i], avoid):
                continue
            size = self.length(i)
            if total + size > target:
                return chosen, total
            chosen.append(self.sentences[i])
            total += size
        if total < target:  # every sentence is in and the target is not reached
            raise CorpusError(
                f"the background corpus is too short: {n} sentences hold {total} tokens "
                f"without the episode's names, {target} requested; pass a longer corpus")
        return chosen, total


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class QAExample:
    """One tokenised prompt with its support and context positions (token indices).

    ``input_ids`` include the initial token; ``support`` and ``context`` are sorted
    position lists; ``background`` the background tokens requested and ``background_tokens``
    those placed (sum of the sentences' own token counts).
    """

    episode: int
    background: int
    background_tokens: int
    prompt: str
    input_ids: tuple[int, ...]
    support: tuple[int, ...]
    context: tuple[int, ...]
    answer: str
    question: str
    support_sentence: str
    prompt_format: str
    answer_prefix: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def length(self) -> int:
        return len(self.input_ids)


def token_span(offsets: Sequence[tuple[int, int]], start: int, stop: int,
               shift: int = 0) -> list[int]:
    """Token indices j with b_j > start, a_j < stop and b_j > a_j, plus ``shift``."""
    return [j + shift for j, (a, b) in enumerate(offsets) if b > start and a < stop and b > a]


def initial_token_id(tokenizer, config_bos: int | None = None) -> int:
    """The tokenizer's BOS id, else the model configuration's; ``ConfigError`` if neither
    or if they disagree."""
    tok = getattr(tokenizer, "bos_token_id", None)
    if tok is not None and config_bos is not None and int(tok) != int(config_bos):
        raise ConfigError(f"the tokenizer's BOS id {tok} differs from the model "
                          f"configuration's {config_bos}; expected one initial token")
    chosen = tok if tok is not None else config_bos
    if chosen is None:
        raise ConfigError("expected a BOS token id from the tokenizer or the model "
                          "configuration for the initial token, found none")
    return int(chosen)


def _body(context: str, question: str) -> tuple[str, int]:
    """The instruction, context and question blocks, and where the context starts."""
    head = f"{INSTRUCTION}\n\nContext:\n"
    return f"{head}{context}\n\nQuestion: {question}", len(head)


def render_prompt(context: str, question: str, prompt_format: str, tokenizer,
                  answer_prefix: str) -> tuple[str, int]:
    """The prompt text and the character where the context starts in it.

    ``plain``: body + "\\n\\nAnswer:" (the initial token is added at tokenisation);
    ``chat``: the body as one user turn of the tokenizer's chat template with the
    assistant turn opened. A tokenizer without a chat template is a ``ConfigError``.
    ``answer_prefix``: words that open the answer (after "Answer: " in a plain prompt,
    at the start of the assistant turn in a chat one), ``{person}`` replaced by the
    asked person (the question's last word): "{person} is in the" makes an instruct
    model name a place at the scored position instead of opening a sentence.
    """
    body, at = _body(context, question)
    opening = _answer_opening(answer_prefix, question)
    if prompt_format == "plain":
        return f"{body}\n\nAnswer:" + (f" {opening}" if opening else ""), at
    if prompt_format != "chat":
        raise ConfigError(f"expected prompt_format in {list(PROMPT_FORMATS)}, got "
                          f"{prompt_format!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"prompt_format 'chat' needs a chat template, and the tokenizer "
                          f"{type(tokenizer).__name__} has none; use prompt_format='plain'")
    text = tokenizer.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                         add_generation_prompt=True)
    where = text.find(body)
    if where < 0 or text.find(body, where + 1) >= 0:
        raise ConfigError("the chat template does not keep the user turn verbatim; "
                          "use prompt_format='plain'")
    return text + opening, where + at


def asked_person(question: str) -> str:
    """The person a qa1 question asks about: its last word ("Where is Mary?")."""
    words = question.split()
    return words[-1].rstrip("?") if words else ""


def _answer_opening(answer_prefix: str, question: str) -> str:
    if not answer_prefix:
        return ""
    if answer_prefix != answer_prefix.strip():
        raise ConfigError(f"answer_prefix: expected no leading or trailing spaces (the "
                          f"candidates bring their own), got {answer_prefix!r}")
    try:
        return answer_prefix.format(person=asked_person(question))
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(f"answer_prefix: only {{person}} may be filled in, got "
                          f"{answer_prefix!r} ({error})") from None


def _tokenise(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"expected a fast tokenizer (character offsets), got "
                          f"{type(tokenizer).__name__}")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def make_example(facts: Sequence[str], support: int, question: str, answer: str,
                 tokenizer, *, background: Sequence[str] = (), gaps: Sequence[int] = (),
                 prompt_format: str = "plain", initial_id: int | None = None,
                 max_positions: int | None = None, episode: int = 0,
                 background_target: int = 0, background_tokens: int = 0,
                 answer_prefix: str) -> QAExample:
    """Tokenise one prompt: ``facts`` inserted before ``background[gaps[i]]`` in order."""
    pieces: list[str] = []
    fact_at = {}
    order = sorted(range(len(facts)), key=lambda i: (gaps[i] if gaps else 0, i))
    insert: dict[int, list[int]] = {}
    for i in order:
        insert.setdefault(gaps[i] if gaps else 0, []).append(i)
    for gap in range(len(background) + 1):
        for i in insert.get(gap, []):
            fact_at[i] = len(pieces)
            pieces.append(facts[i])
        if gap < len(background):
            pieces.append(background[gap])
    context = " ".join(pieces)
    prompt, ctx_start = render_prompt(context, question, prompt_format, tokenizer,
                                      answer_prefix)
    s_char = ctx_start + sum(len(p) + 1 for p in pieces[: fact_at[support]])
    sentence = facts[support]
    if prompt.count(sentence) != 1:
        raise ConfigError(f"the supporting sentence {sentence!r} occurs "
                          f"{prompt.count(sentence)} times in the prompt, expected once")
    assert prompt[s_char: s_char + len(sentence)] == sentence
    ids, offsets = _tokenise(tokenizer, prompt)
    shift = 0
    if prompt_format == "plain":
        first = initial_token_id(tokenizer) if initial_id is None else int(initial_id)
        ids, shift = [first, *ids], 1
    if max_positions is not None and len(ids) > max_positions:
        raise ConfigError(f"a prompt of {len(ids)} tokens (background {background_target}) "
                          f"is longer than the model's {max_positions} positions; ask for "
                          "less background")
    s_tokens = token_span(offsets, s_char, s_char + len(sentence), shift)
    x_tokens = token_span(offsets, ctx_start, ctx_start + len(context), shift)
    return QAExample(episode=episode, background=background_target,
                     background_tokens=background_tokens, prompt=prompt,
                     input_ids=tuple(ids), support=tuple(s_tokens), context=tuple(x_tokens),
                     answer=answer, question=question, support_sentence=sentence,
                     prompt_format=prompt_format, answer_prefix=answer_prefix)


def build_examples(episodes: Sequence[Episode], tokenizer, background: int, *,
                   sentences: Sequence[str] = (), prompt_format: str = "plain",
                   seed: int = 0, max_positions: int | None = None,
                   initial_id: int | None = None, answer_prefix: str = "",
                   ) -> list[QAExample]:
    """Every episode as a prompt with about ``background`` tokens of corpus sentences.

    ``sentences``: the background corpus (``background_sentences``); a background of 0
    needs none. Raises ``ConfigError`` for an empty episode set, a prompt longer than
    ``max_positions`` or a chat template the tokenizer lacks, ``CorpusError`` for a
    corpus too short for the background.
    """
    if not episodes:
        raise ConfigError("expected at least one episode, got an empty episode set")
    if isinstance(background, bool) or not isinstance(background, int) or background < 0:
        raise ConfigError(f"expected background as a token count >= 0, got {background!r}")
    if prompt_format not in PROMPT_FORMATS:
        raise ConfigError(f"expected prompt_format in {list(PROMPT_FORMATS)}, got "
                          f"{prompt_format!r}")
    bank = _Background(sentences, tokenizer) if background > 0 else None
    if prompt_format == "plain" and initial_id is None:
        initial_id = initial_token_id(tokenizer)
    out = []
    for index, ep in enumerate(episodes):
        chosen, placed = [], 0
        gaps: list[int] = [0] * len(ep.facts)
        if bank is not None:
            start = int(_rng(seed, index, 1).integers(len(bank.sentences)))
            chosen, placed = bank.run(start, background, NAMES)
            gaps = sorted(int(g) for g in _rng(seed, index, 2, background)
                          .integers(0, len(chosen) + 1, size=len(ep.facts)))
        out.append(make_example(ep.facts, ep.support, ep.question, ep.answer, tokenizer,
                                background=chosen, gaps=gaps, prompt_format=prompt_format,
                                initial_id=initial_id, max_positions=max_positions,
                                episode=index, background_target=background,
                                background_tokens=placed, answer_prefix=answer_prefix))
    return out


# --------------------------------------------------------------------------- BABILong


def _babilong_rows(source: str | Path | None, length: str, task: str) -> list[dict]:
    if source is not None:
        path = Path(source).expanduser()
        if not path.exists():
            raise CorpusError(f"BABILong file {path} does not exist")
        if path.suffix == ".json":
            rows = json.loads(path.read_text())
        elif path.suffix in (".jsonl", ".ndjson"):
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            raise CorpusError(f"BABILong file {path}: expected .json or .jsonl, got "
                              f"{path.suffix or '(none)'}")
        return list(rows)
    try:
        import datasets

        from attngeom.corpora.corpus import _hub_offline
    except ImportError:
        raise CorpusError("BABILong needs the 'datasets' package or a local .jsonl file"
                          ) from None
    with _hub_offline():
        try:
            ds = datasets.load_dataset("RMT-team/babilong-1k-samples", length, split=task)
        except Exception:  # noqa: BLE001 - any failure means "not in the local cache"
            raise CorpusError(
                f"BABILong (RMT-team/babilong-1k-samples, {length}, {task}) is not in the "
                "local datasets cache and is never downloaded here; pass a local .jsonl "
                "file with input, question and target") from None
    return [dict(r) for r in ds]


def load_babilong(tokenizer, *, source: str | Path | None = None, length: str = "0k",
                  task: str = "qa1", prompt_format: str = "plain", n: int | None = None,
                  max_positions: int | None = None, answer_prefix: str = "",
                  ) -> tuple[list[QAExample], int]:
    """Real BABILong qa1 rows as examples, and how many were left out.

    Rows need ``input``, ``question`` and ``target``. The support is the asked person's
    last movement sentence in the input; a row where that sentence is missing, occurs
    more than once, or names another place than the target is left out (counted).
    """
    rows = _babilong_rows(source, length, task)
    if n is not None:
        rows = rows[:n]
    if not rows:
        raise ConfigError("expected at least one BABILong row, got an empty episode set")
    out, dropped = [], 0
    for i, row in enumerate(rows):
        try:
            text, question, target = row["input"], row["question"], row["target"]
        except KeyError as error:
            raise CorpusError(f"BABILong row {i}: expected keys input, question, target; "
                              f"missing {error}") from None
        person = asked_person(question)
        moves = [m for m in _MOVE.finditer(text) if m.group(1) == person]
        if not moves or moves[-1].group(2) != target or text.count(moves[-1].group(0)) != 1:
            dropped += 1
            continue
        sentence = moves[-1].group(0)
        before = text[: moves[-1].start()]
        pieces = [before.rstrip(), sentence, text[moves[-1].end():].lstrip()]
        out.append(_example_from_text(pieces, question, target, tokenizer, prompt_format,
                                      max_positions, i, length, answer_prefix))
    if not out:
        raise ConfigError(f"no BABILong row of {len(rows)} has a unique support sentence")
    return out, dropped


def _example_from_text(pieces, question, target, tokenizer, prompt_format, max_positions,
                       index, length, answer_prefix: str) -> QAExample:
    facts = [p for p in pieces if p]
    support = facts.index(pieces[1])
    return make_example(facts, support, question, target, tokenizer, background=(),
                        gaps=(), prompt_format=prompt_format, max_positions=max_positions,
                        episode=index, background_target=_k_tokens(length),
                        answer_prefix=answer_prefix)


def _k_tokens(length: str) -> int:
    m = re.fullmatch(r"(\d+)k", length)
    return int(m.group(1)) * 1024 if m else 0


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidates:
    """The answer candidates (sorted) and how each is scored.

    ``rule`` is ``"first-token logit"`` when the first tokens of " " + candidate are all
    distinct, else ``"mean continuation log-probability"`` (the paper's fallback).
    """

    names: tuple[str, ...]
    first: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]
    rule: str
    prefix: str = " "

    @property
    def collide(self) -> bool:
        return self.rule != "first-token logit"


def candidate_prefix(prompt_format: str, answer_prefix: str) -> str:
    """What precedes a candidate: " " after the plain prompt's "Answer:" (the paper's
    rule) or after an answer prefix; nothing at the start of an opened chat turn."""
    return "" if prompt_format == "chat" and not answer_prefix else " "


def candidate_tokens(tokenizer, names: Sequence[str] = LOCATIONS, *,
                     prefix: str = " ") -> Candidates:
    """Tokenise ``prefix`` + each candidate without special tokens; say how they are
    scored."""
    names = tuple(sorted(set(names)))
    if len(names) < 2:
        raise ConfigError(f"expected at least two answer candidates, got {list(names)}")
    tokens = tuple(tuple(tokenizer(prefix + a, add_special_tokens=False)["input_ids"])
                   for a in names)
    if any(not t for t in tokens):
        raise ConfigError("a candidate tokenises to nothing; expected non-empty candidates")
    first = tuple(t[0] for t in tokens)
    rule = ("first-token logit" if len(set(first)) == len(first)
            else "mean continuation log-probability")
    return Candidates(names=names, first=first, tokens=tokens, rule=rule, prefix=prefix)


def answer_loss(scores: torch.Tensor, answer: int) -> tuple[float, int]:
    """Cross-entropy of the ``answer`` over the candidate ``scores`` (float64), and the
    prediction (arg max, ties to the first)."""
    s = scores.to(torch.float64)
    loss = float(torch.logsumexp(s, 0) - s[answer])
    best = float(s.max())
    predicted = int((s == best).nonzero()[0, 0])
    return loss, predicted


def _forward_logits(model, ids: torch.Tensor, keep: int | None) -> torch.Tensor:
    kwargs = {"use_cache": False}
    if keep is not None:
        try:
            return model(input_ids=ids, logits_to_keep=keep, **kwargs).logits
        except TypeError:  # a family without logits_to_keep
            pass
    logits = model(input_ids=ids, **kwargs).logits
    return logits if keep is None else logits[:, -keep:]


@torch.no_grad()
def candidate_scores(model, example: QAExample, candidates: Candidates,
                     device: torch.device) -> torch.Tensor:
    """(C,) float64 candidate scores for one prompt (see ``Candidates.rule``)."""
    ids = torch.tensor([example.input_ids], device=device)
    if not candidates.collide:
        logits = _forward_logits(model, ids, 1)[0, -1].to(torch.float32)
        return logits[list(candidates.first)].to(torch.float64)
    longest = max(len(t) for t in candidates.tokens)
    pad = candidates.tokens[0][0]
    batch = torch.tensor([list(example.input_ids) + list(t) + [pad] * (longest - len(t))
                          for t in candidates.tokens], device=device)
    # causal: padding after a continuation cannot change the logits before it
    logits = _forward_logits(model, batch, longest + 1).to(torch.float64)
    logp = torch.log_softmax(logits, -1)
    scores = []
    for c, t in enumerate(candidates.tokens):
        target = torch.tensor(t, device=device)
        scores.append(logp[c, torch.arange(len(t), device=device), target].mean())
    return torch.stack(scores).cpu()


def screen(accuracy: float, loss: float, n_candidates: int = len(LOCATIONS)) -> bool:
    """The competence screen: accuracy >= 1/C + 0.05 and loss <= log C - 0.05."""
    return accuracy >= 1.0 / n_candidates + 0.05 and loss <= math.log(n_candidates) - 0.05

"""The head atlas: the field's head types scored on a model, beside the regimes (issue 32).

The scores come from three kinds of input (``docs/method.md``, "Head types"):

- **corpus windows**: previous-token, duplicate-token, sink-head and streaming scores, at
  rows every ``head_stride`` positions back from the final one. They ride the analysis'
  own forward over the windows (the ``head_scores`` analysis of ``engine/analyses.py``:
  the stream captures the taxonomy's rows and these at once), so the atlas costs no
  forward of its own there;
- **repeated random tokens** (``repeat_prompts``): prompts of the window-start token then
  a random block R of ``repeat_length`` tokens twice (seeded; special tokens never
  drawn), rows on the second copy: induction and echo scores (``repeat_sums`` per block
  of prompts);
- **needles in a haystack** (Wu et al. 2024, ``make_needles``): a haystack cut from the
  corpus windows, a needle of ``needle_length`` random word tokens introduced by a cue
  (" The secret code is") at a seeded depth, the cue again at the end, then greedy
  decoding (``decode_trials``, teacher-forced while the model copies the needle, with a
  key-value cache after): the retrieval score (``retrieval_from``).

The atlas command (``probes/atlas_command.py``) builds the prompts before the model loads
and runs each kind as resumable units; ``head_score_rows`` joins them into table
``head_scores``, and ``side_by_side`` cross-tabulates the head types with a taxonomy of
the same windows: ``atlas_contingency`` (regime x head type: counts and the share of each
type per regime), ``atlas_kappa`` (Cohen's kappa of each binary type against each
regime's indicator), ``atlas_depth`` (per layer, the share of heads of each type and
regime) and, with the run's ``summary``, ``atlas_fn`` (F_N of each head type's heads
against their random control)."""

from __future__ import annotations

import inspect
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from attngeom.capture import capture_attention, input_device
from attngeom.core import head_scores as hs
from attngeom.core.agreement import cohens_kappa
from attngeom.errors import ConfigError
from attngeom.names import HEAD_TYPES, REGIMES

CUE = " The secret code is"
NO_TYPE = "(none)"


@dataclass
class _Sums:  # the repeated-token scores' row sums
    """Per score, per layer: (H,) summed row scores and row counts."""

    sums: dict[str, dict[int, torch.Tensor]]
    counts: dict[str, dict[int, torch.Tensor]]

    @classmethod
    def empty(cls) -> _Sums:
        return cls({}, {})

    def add(self, name: str, layer: int, score: torch.Tensor, valid: torch.Tensor) -> None:
        s, c = hs.row_sums(score, valid)
        mine = self.sums.setdefault(name, {})
        mine[layer] = mine.get(layer, 0) + s
        cnt = self.counts.setdefault(name, {})
        cnt[layer] = cnt.get(layer, 0) + c

    def merge(self, other: _Sums) -> _Sums:
        """Add another block's sums (other prompts), score by score and layer by layer."""
        for name, layers in other.sums.items():
            for layer, s in layers.items():
                mine = self.sums.setdefault(name, {})
                mine[layer] = mine.get(layer, 0) + s
                cnt = self.counts.setdefault(name, {})
                cnt[layer] = cnt.get(layer, 0) + other.counts[name][layer]
        return self

    def means(self, name: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return {layer: (hs.mean_over_rows(self.sums[name][layer], self.counts[name][layer])
                        .numpy(), self.counts[name][layer].numpy())
                for layer in sorted(self.sums.get(name, {}))}


def _content_ids(tokenizer, vocab_size: int) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)
    if ids.size < 2:
        raise ConfigError("tokenizer: expected at least two non-special tokens")
    return ids


def _vocab_size(model, tokenizer) -> int:
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return min(int(size), len(tokenizer)) if size else len(tokenizer)


def _word_ids(tokenizer, content: np.ndarray) -> np.ndarray:
    """Tokens that read as a space and 3+ letters (needle words); all content if none."""
    texts = tokenizer.convert_ids_to_tokens(content.tolist())
    words = [i for i, s in zip(content.tolist(), texts, strict=True)
             if isinstance(s, str) and len(s) >= 4 and s[0] in " \u0120\u2581"
             and s[1:].isalpha() and s[1:].isascii()]
    return np.array(words, dtype=np.int64) if len(words) >= 8 else content


@dataclass(frozen=True)
class NeedleTrial:
    """One needle-in-a-haystack prompt: its token ids, the needle's span and tokens."""

    prompt: torch.Tensor
    span: tuple[int, int]
    needle: torch.Tensor
    depth: float


def make_needles(tokenizer, haystack: torch.Tensor, vocab_size: int, *, n_needles: int,
                 needle_length: int, context_lengths: Sequence[int], seed: int
                 ) -> list[NeedleTrial]:
    """Seeded needle trials: context length cycled from ``context_lengths``, depth drawn
    uniformly in [0.1, 0.9], needle words drawn from the vocabulary. The prompt is
    haystack[0] (the window-start token), haystack text, cue + needle + ".", more
    haystack, and the cue: exactly the context length in tokens."""
    cue = list(tokenizer(CUE, add_special_tokens=False)["input_ids"])
    dot = list(tokenizer(".", add_special_tokens=False)["input_ids"])
    words = _word_ids(tokenizer, _content_ids(tokenizer, vocab_size))
    rng = random.Random(int(seed))
    trials = []
    for i in range(n_needles):
        length = int(context_lengths[i % len(context_lengths)])
        fixed = 1 + 2 * len(cue) + needle_length + len(dot)
        if needle_length < 1 or length - fixed < 2:
            most = length - fixed + needle_length - 2
            valid = (f"valid needle_length: 1..{most}" if most >= 1 else
                     f"valid context: >= {fixed - needle_length + 3} tokens")
            raise ConfigError(f"needle: {needle_length} tokens with the cue need "
                              f"{fixed + 2} tokens of context, got a context of {length} "
                              f"({valid})")
        hay = haystack[i % haystack.shape[0]] if haystack.dim() == 2 else haystack
        room = length - fixed
        if hay.numel() - 1 < room:
            raise ConfigError(f"needle context {length}: the haystack window has "
                              f"{hay.numel()} tokens, fewer than the {room + 1} needed")
        depth = rng.uniform(0.1, 0.9)
        cut = int(round(depth * room))
        needle = [int(words[rng.randrange(words.size)]) for _ in range(needle_length)]
        body = hay[1:1 + room].tolist()
        ids = [int(hay[0])] + body[:cut] + cue + needle + dot + body[cut:] + cue
        start = 1 + cut + len(cue)
        trials.append(NeedleTrial(torch.tensor(ids, dtype=torch.int64),
                                  (start, start + needle_length),
                                  torch.tensor(needle, dtype=torch.int64), depth))
    return trials


def _step_hits(alpha_rows: list, keys: torch.Tensor, generated: int, needle_set: set[int],
               span: tuple[int, int]) -> torch.Tensor:
    """(L, H) copy hits of one decoding step from each layer's (H, T) attention row."""
    if generated not in needle_set:
        return torch.zeros(len(alpha_rows), alpha_rows[0].shape[0], dtype=torch.bool)
    return torch.stack([hs.retrieval_hits(a, keys.to(a.device), generated, span).cpu()
                        for a in alpha_rows])


def _greedy(model, trial: NeedleTrial, prefix: list[int], n_steps: int, cache_arg: str
            ) -> tuple[list[torch.Tensor], list[int]]:
    """Greedy decoding of ``n_steps`` tokens after prompt + ``prefix`` with the key-value
    cache, one captured row per step: each step's (L, H) hits and token."""
    device = input_device(model)
    keys = torch.cat([trial.prompt, torch.tensor(prefix, dtype=torch.int64)])
    needle_set = set(trial.needle.tolist())
    ids, past, steps, generated = keys[None].to(device), None, [], []
    for _ in range(n_steps):
        rows: list = []
        with capture_attention(model, rows.append, query_rows=[-1]):
            out = model(input_ids=ids, use_cache=True, **{cache_arg: past})
        past = getattr(out, cache_arg)
        g = int(out.logits[0, -1].argmax())
        rows.sort(key=lambda cap: cap.layer)
        steps.append(_step_hits([cap.alpha[0, :, -1] for cap in rows], keys, g, needle_set,
                                trial.span))
        generated.append(g)
        keys = torch.cat([keys, torch.tensor([g])])
        ids = torch.tensor([[g]], device=device)
    return steps, generated


def _forced(model, trials: Sequence[NeedleTrial]) -> list[tuple[list[torch.Tensor], list[int]]]:
    """Trials of one length in one forward of prompt + needle (teacher forcing): at row
    C - 1 + s the model sees prompt + needle[:s], exactly greedy decoding's step s for as
    long as the greedy tokens so far equal the needle. Per trial: the (L, H) hits and the
    argmax token of each step up to and including the first that differs from the
    needle (the later steps are not greedy decoding's and are left out)."""
    device = input_device(model)
    c, k = trials[0].prompt.numel(), trials[0].needle.numel()
    ids = torch.stack([torch.cat([t.prompt, t.needle]) for t in trials])
    rows = torch.arange(c - 1, c - 1 + k)
    caps: list = []
    with capture_attention(model, caps.append, query_rows=rows):
        logits = model(input_ids=ids.to(device), attention_mask=torch.ones_like(ids, device=device),
                       use_cache=False).logits
    caps.sort(key=lambda cap: cap.layer)
    out = []
    for b, trial in enumerate(trials):
        needle = trial.needle.tolist()
        steps, generated = [], []
        for s in range(k):
            g = int(logits[b, c - 1 + s].argmax())
            steps.append(_step_hits([cap.alpha[b, :, s] for cap in caps], ids[b], g,
                                    set(needle), trial.span))
            generated.append(g)
            if g != needle[s]:
                break
        out.append((steps, generated))
    return out


def repeat_prompts(tokenizer, vocab_size: int, first_token: int, *, n_repeats: int,
                   repeat_length: int, seed: int) -> torch.Tensor:
    """(n_repeats, 1 + 2 x repeat_length) prompts: ``first_token`` then a seeded random
    block of content tokens twice (special tokens never drawn)."""
    if repeat_length < 2 or n_repeats < 1:
        raise ConfigError(f"repeat_length >= 2 and n_repeats >= 1 expected, got "
                          f"{repeat_length!r} and {n_repeats!r}")
    content = torch.as_tensor(_content_ids(tokenizer, vocab_size))
    gen = torch.Generator().manual_seed(int(seed))
    block = content[torch.randint(0, content.numel(), (n_repeats, repeat_length), generator=gen)]
    first = torch.full((n_repeats, 1), int(first_token), dtype=torch.int64)
    return torch.cat([first, block, block], dim=1)


@torch.no_grad()
def repeat_sums(model, prompts: torch.Tensor, repeat_length: int) -> _Sums:
    """Induction and echo row sums of ``prompts`` (rows on the second copy of the block)."""
    rows = torch.arange(repeat_length + 1, 2 * repeat_length + 1)
    sums = _Sums.empty()

    def consume(cap) -> None:
        for b in range(cap.alpha.shape[0]):
            a = cap.alpha[b]
            sums.add("induction", cap.layer,
                     *hs.repeat_rows(a, cap.query_rows, repeat_length, offset=1))
            sums.add("echo", cap.layer, *hs.repeat_rows(a, cap.query_rows, repeat_length,
                                                        offset=0))

    device = input_device(model)
    with capture_attention(model, consume, query_rows=rows):
        ids = prompts.to(device)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return sums


def cache_argument(model) -> str:
    """The name of the key-value cache argument of ``model.forward``: transformers 5 names
    it ``cache``, earlier versions ``past_key_values``."""
    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


@torch.no_grad()
def decode_trials(model, trials: Sequence[NeedleTrial]
                  ) -> list[tuple[list[torch.Tensor], list[int]]]:
    """Greedy decoding of trials of one shape, made cheap and kept exact: one
    teacher-forced forward (``_forced``), which is greedy decoding itself for as long as
    the model generates the needle; a trial that departs from it is decoded greedily from
    there on with the key-value cache (``_greedy``). Per trial: the (L, H) hits and the
    token of each step."""
    shapes = {(t.prompt.numel(), t.needle.numel()) for t in trials}
    if len(shapes) != 1:
        raise ConfigError(f"trials: expected one prompt and needle length, got {sorted(shapes)}")
    out = []
    for trial, (steps, generated) in zip(trials, _forced(model, list(trials)), strict=True):
        left = trial.needle.numel() - len(steps)
        if left:
            more, more_tokens = _greedy(model, trial, generated, left, cache_argument(model))
            steps, generated = steps + more, generated + more_tokens
        out.append((steps, generated))
    return out


def retrieval_from(decoded: Sequence[tuple[list[torch.Tensor], list[int]]],
                   trials: Sequence[NeedleTrial], *, recovered_share: float = 0.5
                   ) -> tuple[dict[int, np.ndarray], int, list[bool]]:
    """Wu et al. 2024's retrieval score per layer (H,), averaged over the recovered trials
    (at least ``recovered_share`` of the needle's tokens among the generated ones), the
    number of recovered trials and each trial's outcome."""
    total: torch.Tensor | None = None
    outcomes = []
    for (steps, generated), trial in zip(decoded, trials, strict=True):
        score, ok = hs.retrieval_trial(torch.stack(steps), generated, trial.needle.tolist(),
                                       recovered_share=recovered_share)
        outcomes.append(ok)
        if ok:
            total = score if total is None else total + score
    n_ok = sum(outcomes)
    out = {layer: (total[layer] / n_ok).numpy() for layer in range(total.shape[0])} \
        if total is not None else {}
    return out, n_ok, outcomes


def head_score_rows(corpus: pd.DataFrame, repeats: _Sums, retrieval: dict[int, np.ndarray],
                    n_ok: int, *, num_layers: int, num_heads: int, inputs: dict[str, str],
                    seed: int) -> pd.DataFrame:
    """Table ``head_scores``: the corpus scores as the analysis computed them, the repeated
    tokens' induction and echo, and the retrieval score (NaN with ``n_samples`` 0 for every
    head when no needle trial was recovered: "not measured", never a score of 0)."""
    from attngeom.engine.tables import head_score_table

    rows = []

    def add(name: str, means: dict[int, tuple[np.ndarray, np.ndarray | int]]):
        for layer in range(num_layers):
            value, count = means.get(layer, (np.full(num_heads, np.nan), 0))
            for head in range(num_heads):
                c = count[head] if isinstance(count, np.ndarray) else count
                rows.append((layer, head, name, float(value[head]), int(c)))

    for name in HEAD_TYPES:
        source = HEAD_TYPES.meta(name)["input"]
        if source == "repeats":
            add(name, repeats.means(name))
        elif source == "needles":
            add(name, {layer: (v, n_ok) for layer, v in retrieval.items()} if n_ok else {})
    extra = pd.DataFrame(rows, columns=["layer", "head", "score", "value", "n_samples"])
    extra = head_score_table(extra, inputs="", seed=seed)
    extra["inputs"] = extra["score"].map(lambda s: inputs[HEAD_TYPES.meta(s)["input"]])
    base = corpus[corpus["score"].map(lambda s: HEAD_TYPES.meta(s)["input"] == "corpus")]
    columns = ["layer", "head", "score", "value", "threshold", "is_type", "n_samples",
               "inputs", "seed"]
    return pd.concat([base[columns], extra[columns]], ignore_index=True)


def head_type_labels(head_scores: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head), one bool column per head type (``is_type``)."""
    wide = head_scores.pivot_table(index=["layer", "head"], columns="score", values="is_type",
                                   aggfunc="first")
    wide = wide.reindex(columns=[c for c in HEAD_TYPES if c in wide.columns])
    return wide.fillna(False).astype(bool).reset_index()


def side_by_side(head_scores: pd.DataFrame, taxonomy: pd.DataFrame | None = None,
                 summary: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The contingency, kappa, depth and F_N tables (module docstring); without a
    taxonomy only the head types' depth profile."""
    labels = head_type_labels(head_scores)
    types = [c for c in HEAD_TYPES if c in labels.columns]
    if taxonomy is not None:
        tax = taxonomy[["layer", "head", "regime"]].drop_duplicates(["layer", "head"])
        labels = labels.merge(tax, on=["layer", "head"], how="inner")
        if labels.empty:
            raise ConfigError("taxonomy: no (layer, head) in common with the head scores")
    out = {"atlas_depth": _depth(labels, types)}
    if taxonomy is None:
        return out
    out["atlas_contingency"] = _contingency(labels, types)
    out["atlas_kappa"] = _kappa(labels, types)
    if summary is not None:
        out["atlas_fn"] = _fn_by_type(labels, types, summary)
    return out


def _regimes(labels: pd.DataFrame) -> list[str]:
    seen = list(labels["regime"].dropna().unique())
    return [r for r in REGIMES if r in seen] + sorted(r for r in seen if r not in REGIMES)


def _contingency(labels: pd.DataFrame, types: list[str]) -> pd.DataFrame:
    rows = []
    none = ~labels[types].any(axis=1)
    for regime in _regimes(labels):
        mine = labels["regime"] == regime
        n = int(mine.sum())
        for name in [*types, NO_TYPE]:
            has = none if name == NO_TYPE else labels[name]
            count = int((mine & has).sum())
            rows.append((regime, name, count, n, count / n if n else np.nan,
                         count / max(int(has.sum()), 1)))
    return pd.DataFrame(rows, columns=["regime", "head_type", "count", "n_regime",
                                       "share_of_regime", "share_of_type"])


def _kappa(labels: pd.DataFrame, types: list[str]) -> pd.DataFrame:
    rows = []
    for regime in _regimes(labels):
        is_regime = np.where(labels["regime"] == regime, "yes", "no")
        for name in types:
            is_type = np.where(labels[name], "yes", "no")
            rows.append((regime, name, cohens_kappa(is_regime.tolist(), is_type.tolist()),
                         int(((labels["regime"] == regime) & labels[name]).sum()), len(labels)))
    return pd.DataFrame(rows, columns=["regime", "head_type", "kappa", "both", "n_heads"])


def _depth(labels: pd.DataFrame, types: list[str]) -> pd.DataFrame:
    rows = []
    for layer, grp in labels.groupby("layer"):
        n = len(grp)
        for name in types:
            rows.append((int(layer), "head_type", name, int(grp[name].sum()), n))
        if "regime" in grp:
            for regime in _regimes(labels):
                rows.append((int(layer), "regime", regime, int((grp["regime"] == regime).sum()),
                             n))
    df = pd.DataFrame(rows, columns=["layer", "kind", "name", "count", "n_heads"])
    df["share"] = df["count"] / df["n_heads"]
    return df


def _fn_by_type(labels: pd.DataFrame, types: list[str], summary: pd.DataFrame) -> pd.DataFrame:
    """Mean head-level F_N (full universe, Euclidean) of each type's heads, attention rule
    and the random control, at every N of the run."""
    s = summary[(summary["scope"] == "head") & (summary["metric"] == "f_score")
                & (summary["variant"] == "full") & (summary["distance"] == "euclidean")
                & summary["rule"].isin(["attention", "random"])]
    if s.empty:
        raise ConfigError("summary: no head-scope f_score rows (full, euclidean) to compare")
    wide = s.pivot_table(index=["layer", "head", "n"], columns="rule", values="mean").reset_index()
    rows = []
    for name in [*types, NO_TYPE]:
        has = ~labels[types].any(axis=1) if name == NO_TYPE else labels[name]
        heads = labels.loc[has, ["layer", "head"]]
        part = wide.merge(heads, on=["layer", "head"])
        for n, grp in part.groupby("n"):
            f_att, f_rand = grp["attention"].mean(), grp["random"].mean()
            rows.append((name, int(n), len(grp), f_att, f_rand, f_att - f_rand))
    return pd.DataFrame(rows, columns=["head_type", "n", "n_heads", "f_attention", "f_random",
                                       "f_gap"])

"""The head atlas: the field's head types scored on a model, beside the regimes (issue 32).

``head_atlas`` runs the kernels of ``core/head_scores.py`` through the capture path
(``capture_attention``: probabilities only at the rows a score needs, never a full
eager attention matrix kept) over three kinds of input:

- **corpus windows**, rows every ``query_stride`` positions (the final one included):
  previous-token, duplicate-token, sink-head and streaming scores (or, given
  ``corpus``, the same scores accumulated on an analysis' own pass, which saves the
  forward);
- **repeated random tokens**, ``n_repeats`` prompts of the window-start token then a
  random block R of ``repeat_length`` tokens twice (seeded; special tokens never
  drawn), rows on the second copy: induction and echo scores;
- **needles in a haystack** (Wu et al. 2024), ``n_needles`` trials: a haystack cut from
  the corpus windows, a needle of ``needle_length`` random word tokens introduced by a
  cue (" The secret code is") at a seeded depth, the cue again at the end, then greedy
  decoding with a key-value cache (one captured row per step): the retrieval score.

and returns long table ``head_scores`` (schema in results/schemas.py), with the
side-by-side tables when a taxonomy (table ``taxonomy`` of a run on the same model) is
given: ``atlas_contingency`` (regime x head type: counts and the share of each type per
regime), ``atlas_kappa`` (Cohen's kappa of each binary type against each regime's
indicator), ``atlas_depth`` (per layer, the share of heads of each type and regime)
and, with a run's ``summary``, ``atlas_fn`` (F_N of each head type's heads against
their random control).
"""

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

    def means(self, name: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return {layer: (hs.mean_over_rows(self.sums[name][layer], self.counts[name][layer])
                        .numpy(), self.counts[name][layer].numpy())
                for layer in sorted(self.sums.get(name, {}))}


def _as_windows(windows) -> torch.Tensor:
    """Windows (``pipeline.windows.Window`` objects, 1-D tensors or lists) as (n, T)."""
    rows = [w.input_ids if hasattr(w, "input_ids") else torch.as_tensor(w) for w in windows]
    if not rows:
        raise ConfigError("windows: expected at least one window")
    lengths = {int(r.shape[-1]) for r in rows}
    if len(lengths) != 1:
        raise ConfigError(f"windows: expected windows of one length, got {sorted(lengths)}")
    return torch.stack([r.to(torch.int64).reshape(-1) for r in rows])


def _max_positions(model) -> int | None:
    cfg = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_length(model, length: int, what: str) -> None:
    limit = _max_positions(model)
    if limit is not None and length > limit:
        raise ConfigError(f"{what}: {length} tokens, more than the model's {limit} positions "
                          f"(valid: 2..{limit})")


@torch.no_grad()
def corpus_scores(model, windows: torch.Tensor, *, query_stride: int = 8,
                  streaming_window: int = 64, batch_size: int = 4
                  ) -> hs.HeadScoreAccumulator:
    """Previous-token, duplicate-token, sink and streaming scores over corpus windows, in
    a forward of their own (rows every ``query_stride`` back from the last)."""
    n, t = windows.shape
    if query_stride < 1:
        raise ConfigError(f"query_stride: expected an integer >= 1, got {query_stride!r}")
    _check_length(model, t, "window length")
    rows = torch.arange(t - 1, 0, -query_stride).flip(0)
    acc = hs.HeadScoreAccumulator(streaming_window)
    device = input_device(model)
    current: dict[str, torch.Tensor] = {}

    def consume(cap) -> None:
        for b in range(cap.alpha.shape[0]):
            acc.add_rows(cap.layer, cap.alpha[b], cap.query_rows, cap.values[b],
                         current["ids"][b].to(cap.alpha.device))

    with capture_attention(model, consume, query_rows=rows, chunk_size=256):
        for start in range(0, n, batch_size):
            ids = windows[start:start + batch_size]
            current["ids"] = ids
            ids = ids.to(device)
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return acc


def _content_ids(tokenizer, vocab_size: int) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = np.array([i for i in range(vocab_size) if i not in special], dtype=np.int64)
    if ids.size < 2:
        raise ConfigError("tokenizer: expected at least two non-special tokens")
    return ids


def _vocab_size(model, tokenizer) -> int:
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return min(int(size), len(tokenizer)) if size else len(tokenizer)


@torch.no_grad()
def repeat_scores(model, tokenizer, first_token: int, *, n_repeats: int = 4,
                  repeat_length: int = 64, seed: int = 0) -> tuple[_Sums, torch.Tensor]:
    """Induction and echo row sums on [first_token] + R + R, R seeded random tokens."""
    if repeat_length < 2 or n_repeats < 1:
        raise ConfigError(f"repeat_length >= 2 and n_repeats >= 1 expected, got "
                          f"{repeat_length!r} and {n_repeats!r}")
    _check_length(model, 2 * repeat_length + 1, "repeated-token prompt")
    content = torch.as_tensor(_content_ids(tokenizer, _vocab_size(model, tokenizer)))
    gen = torch.Generator().manual_seed(int(seed))
    block = content[torch.randint(0, content.numel(), (n_repeats, repeat_length), generator=gen)]
    first = torch.full((n_repeats, 1), int(first_token), dtype=torch.int64)
    prompts = torch.cat([first, block, block], dim=1)
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
    return sums, prompts


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


@torch.no_grad()
def retrieval_scores(model, trials: Sequence[NeedleTrial], *, recovered_share: float = 0.5
                     ) -> tuple[dict[int, np.ndarray], int, list[bool]]:
    """Wu et al. 2024's retrieval score per layer (H,), averaged over the recovered trials
    (at least ``recovered_share`` of the needle's tokens among the generated ones), the
    number of recovered trials and each trial's outcome.

    Greedy decoding, made cheap and kept exact: trials of one length run in one
    teacher-forced forward (``_forced``), which is greedy decoding itself for as long as
    the model generates the needle; a trial that departs from it is decoded greedily
    from there on with the key-value cache (``_greedy``)."""
    # transformers 5 names the key-value cache ``cache``; before, ``past_key_values``
    cache_arg = ("cache" if "cache" in inspect.signature(model.forward).parameters
                 else "past_key_values")
    for trial in trials:
        _check_length(model, trial.prompt.numel() + trial.needle.numel(), "needle prompt")
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, trial in enumerate(trials):
        by_shape.setdefault((trial.prompt.numel(), trial.needle.numel()), []).append(i)
    decoded: dict[int, tuple[list[torch.Tensor], list[int]]] = {}
    for members in by_shape.values():
        for i, (steps, generated) in zip(members, _forced(model, [trials[i] for i in members]),
                                         strict=True):
            left = trials[i].needle.numel() - len(steps)
            if left:
                more, more_tokens = _greedy(model, trials[i], generated, left, cache_arg)
                steps, generated = steps + more, generated + more_tokens
            decoded[i] = (steps, generated)
    total: torch.Tensor | None = None
    outcomes = []
    for i, trial in enumerate(trials):
        steps, generated = decoded[i]
        score, ok = hs.retrieval_trial(torch.stack(steps), generated, trial.needle.tolist(),
                                       recovered_share=recovered_share)
        outcomes.append(ok)
        if ok:
            total = score if total is None else total + score
    n_ok = sum(outcomes)
    out = {layer: (total[layer] / n_ok).numpy() for layer in range(total.shape[0])} \
        if total is not None else {}
    return out, n_ok, outcomes


def head_atlas(model, tokenizer, windows, *, taxonomy: pd.DataFrame | None = None,
               summary: pd.DataFrame | None = None, seed: int = 0,
               corpus: hs.HeadScoreAccumulator | None = None, query_stride: int = 8,
               streaming_window: int = 64, n_repeats: int = 4, repeat_length: int = 64,
               n_needles: int = 4, needle_length: int = 6,
               context_lengths: Sequence[int] | None = None, recovered_share: float = 0.5,
               batch_size: int = 4, model_label: str = "model", corpus_label: str = "corpus",
               ) -> dict[str, pd.DataFrame]:
    """Every head score of every head, and the side-by-side tables (module docstring).

    ``windows``: corpus windows (``Window`` objects or token-id rows of one length T,
    each starting with the model's window-start token). ``taxonomy``: table
    ``taxonomy`` of a run on the same model (for the contingency, kappa and depth
    tables); ``summary``: its table ``summary`` (for ``atlas_fn``). ``corpus``: a
    ``HeadScoreAccumulator`` that rode on an analysis' own pass over the windows (its
    rows are the analysis' rows); without it the corpus scores take a forward of their
    own, at rows every ``query_stride``. ``context_lengths`` of the needle prompts
    default to T // 2 and T // 4. Returns ``head_scores`` and the tables of
    ``side_by_side``.
    """
    was_training = model.training
    model.eval()
    try:
        win = _as_windows(windows)
        t = int(win.shape[1])
        contexts = (tuple(context_lengths) if context_lengths
                    else (max(t // 2, 2), max(t // 4, 2)))
        if corpus is None:
            corpus = corpus_scores(model, win, query_stride=query_stride,
                                   streaming_window=streaming_window, batch_size=batch_size)
            corpus_inputs = (f"{win.shape[0]} corpus windows of {t}, rows every {query_stride}, "
                             f"streaming W = {streaming_window}")
        else:
            corpus_inputs = (f"{corpus.windows} corpus windows, the analysis' rows, "
                             f"streaming W = {corpus.streaming_window}")
        repeats, _ = repeat_scores(model, tokenizer, int(win[0, 0]), n_repeats=n_repeats,
                                   repeat_length=repeat_length, seed=seed)
        trials = make_needles(tokenizer, win, _vocab_size(model, tokenizer),
                              n_needles=n_needles, needle_length=needle_length,
                              context_lengths=contexts, seed=seed)
        retrieval, n_ok, _ = retrieval_scores(model, trials, recovered_share=recovered_share)
    finally:
        model.train(was_training)
    seen = corpus.sums["previous_token"]  # every layer's attention was captured
    if not seen:
        raise ConfigError("corpus: no head scores (no window was analysed)")
    n_layers, n_heads = max(seen) + 1, int(next(iter(seen.values())).numel())
    inputs = {
        "corpus": corpus_inputs,
        "repeat": f"{n_repeats} prompts of 1 + 2 x {repeat_length} random tokens, seed {seed}",
        "needle": (f"{n_needles} needles of {needle_length} tokens, contexts "
                   f"{'/'.join(map(str, contexts))}, seeded depths, seed {seed}, "
                   f"{n_ok} recovered"),
    }
    rows = []

    def add(name: str, source: str, means: dict[int, tuple[np.ndarray, np.ndarray | int]]):
        for layer in range(n_layers):
            value, count = means.get(layer, (np.full(n_heads, np.nan), 0))
            for head in range(n_heads):
                c = count[head] if isinstance(count, np.ndarray) else count
                rows.append((layer, head, name, float(value[head]), int(c), inputs[source]))

    for name in ("previous_token", "duplicate_token", "sink", "streaming"):
        add(name, "corpus", corpus.means(name))
    for name in ("induction", "echo"):
        add(name, "repeat", repeats.means(name))
    add("retrieval", "needle", {layer: (v, n_ok) for layer, v in retrieval.items()}
        if n_ok else {})
    df = pd.DataFrame(rows, columns=["layer", "head", "score", "value", "n_samples", "inputs"])
    df["threshold"] = df["score"].map(hs.threshold)
    labels = np.where(df["score"].map(hs.below), df["value"] <= df["threshold"],
                      df["value"] >= df["threshold"])
    df["is_type"] = labels & df["value"].notna()
    df.insert(0, "corpus", corpus_label)
    df.insert(0, "model", model_label)
    df["seed"] = int(seed)
    out = {"head_scores": df[["model", "corpus", "layer", "head", "score", "value",
                              "threshold", "is_type", "n_samples", "inputs", "seed"]]}
    out.update(side_by_side(out["head_scores"], taxonomy, summary))
    return out


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

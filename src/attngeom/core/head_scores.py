"""Head scores of the head types the field already uses (method "Head types", SPEC 6).

Pure kernels, tensors in and tensors out: each takes the attention rows of one window
(or prompt) and returns a per-(head, row) score with a per-row validity mask, so that a
caller averages over whatever rows and windows it analysed (``mean_over_rows``). The
published definitions, their sources and the choices made here are in docs/method.md:

- ``attention_at``: alpha[t, source_t] for one source key per row. The previous-token
  score is it with source t - 1; on a sequence repeated twice (a random block R of
  length L, then R again) the **induction** score is it with source t - L + 1 (the
  token after the first copy of the current token) and the **echo** score with source
  t - L (the first copy itself);
- ``duplicate_token_rows``: the attention mass on earlier copies of the current token;
- ``sink_rows``: alpha[t, 0], the sink-head score (Gu et al. 2024's threshold 0.3);
- ``streaming_rows``: how much the head output z_t = sum_j alpha[t, j] v_j changes when
  the head sees only the sink and the W most recent keys, renormalised (a training-free
  proxy for DuoAttention's streaming heads);
- ``retrieval_hits``: Wu et al. 2024's copy test at one decoding step (a head whose
  most attended key is a needle token equal to the generated one), and
  ``retrieval_trial``: one trial's score (1/|needle| per copying step) and whether the
  answer was recovered (the score averages over recovered trials only).

Shapes: alpha (H, Q, T) float, query_positions (Q,) int64, tokens (T,) int64, values
(G, T, d) float with query head h reading kv head h // (H / G).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attngeom.core.batch import AttentionBatch
from attngeom.core.protocol import Accumulator, check_disjoint
from attngeom.errors import ConfigError
from attngeom.names import HEAD_TYPES

SINK = 0



def threshold(name: str) -> float:
    """The published (or attngeom's) threshold of head type ``name`` (``names.HEAD_TYPES``:
    a head is of the type when its score is >= it, or <= it where the type says
    ``below``)."""
    return float(HEAD_TYPES.meta(name)["threshold"])


def below(name: str) -> bool:
    """Whether a head is of type ``name`` when its score is at most the threshold."""
    return bool(HEAD_TYPES.meta(name).get("below", False))


def _check(alpha: Tensor, query_positions: Tensor) -> tuple[int, int, int]:
    if alpha.dim() != 3:
        raise ConfigError(f"alpha: expected shape (H, Q, T), got {tuple(alpha.shape)}")
    h, q, t = alpha.shape
    if query_positions.shape != (q,):
        raise ConfigError(f"query_positions: expected shape ({q},), got "
                          f"{tuple(query_positions.shape)}")
    if q and (int(query_positions.min()) < 0 or int(query_positions.max()) >= t):
        raise ConfigError(f"query_positions: expected positions in [0, {t - 1}], got "
                          f"{int(query_positions.min())}..{int(query_positions.max())}")
    return h, q, t


def attention_at(alpha: Tensor, query_positions: Tensor, sources: Tensor, *,
                 low: int = 0) -> tuple[Tensor, Tensor]:
    """alpha[h, i, sources[i]]: (H, Q) float64, and (Q,) bool rows whose source is a key
    the row may attend (``low <= source <= t``); an invalid row scores 0.

    >>> a = torch.tensor([[[0.25, 0.75, 0.0], [0.25, 0.5, 0.25]]])
    >>> s, ok = attention_at(a, torch.tensor([1, 2]), torch.tensor([0, 1]))
    >>> s.tolist(), ok.tolist()
    ([[0.25, 0.5]], [True, True])
    """
    h, q, t = _check(alpha, query_positions)
    src = sources.to(device=alpha.device, dtype=torch.int64)
    qpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    ok = (src >= low) & (src <= qpos) & (src < t)
    idx = torch.where(ok, src, 0)[None, :, None].expand(h, q, 1)
    got = alpha.gather(-1, idx)[..., 0].to(torch.float64)
    return torch.where(ok[None], got, 0.0), ok


def previous_token_rows(alpha: Tensor, query_positions: Tensor) -> tuple[Tensor, Tensor]:
    """Attention on t - 1, over rows t >= 2 (so that the previous token is never the
    sink, whose mass would otherwise count as previous-token attention at t = 1)."""
    qpos = query_positions.to(torch.int64)
    return attention_at(alpha, qpos, qpos - 1, low=1)


def repeat_rows(alpha: Tensor, query_positions: Tensor, period: int, *, offset: int
                ) -> tuple[Tensor, Tensor]:
    """On a block repeated with ``period`` L: attention on t - L + ``offset`` (induction:
    offset 1, the token after the earlier copy; echo: offset 0, the copy itself), over
    rows t >= L + 1 (the second copy, after the sink)."""
    if period < 1:
        raise ConfigError(f"period: expected an integer >= 1, got {period!r}")
    qpos = query_positions.to(torch.int64)
    score, ok = attention_at(alpha, qpos, qpos - period + offset, low=1)
    second = (qpos >= period + 1).to(ok.device)
    return torch.where(second[None], score, 0.0), ok & second


def duplicate_token_rows(alpha: Tensor, query_positions: Tensor, tokens: Tensor
                         ) -> tuple[Tensor, Tensor]:
    """Attention mass on earlier copies j < t (j >= 1, the sink aside) of the token at t,
    over rows that have at least one such copy.

    >>> a = torch.tensor([[[0.1, 0.5, 0.1, 0.3]]])
    >>> s, ok = duplicate_token_rows(a, torch.tensor([3]), torch.tensor([9, 4, 5, 4]))
    >>> round(float(s[0, 0]), 6), ok.tolist()
    (0.5, [True])
    """
    h, q, t = _check(alpha, query_positions)
    tok = tokens.to(alpha.device)
    if tok.shape != (t,):
        raise ConfigError(f"tokens: expected shape ({t},), got {tuple(tok.shape)}")
    qpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    keys = torch.arange(t, device=alpha.device)
    copy = (tok[None, :] == tok[qpos][:, None]) & (keys[None, :] < qpos[:, None]) \
        & (keys[None, :] >= 1)  # (Q, T)
    mass = torch.where(copy[None], alpha, 0.0).to(torch.float64).sum(-1)
    return mass, copy.any(-1)


def sink_rows(alpha: Tensor, query_positions: Tensor) -> tuple[Tensor, Tensor]:
    """alpha[t, 0] over rows t >= 1 (a row that sees only the sink says nothing)."""
    qpos = query_positions.to(torch.int64)
    score, _ = attention_at(alpha, qpos, torch.zeros_like(qpos))
    return score, (qpos >= 1).to(alpha.device)


def streaming_rows(alpha: Tensor, query_positions: Tensor, values: Tensor, window: int
                   ) -> tuple[Tensor, Tensor]:
    """||z_t - z_stream|| / ||z_t||, z_t = sum_j alpha[t, j] v_j over the visible keys and
    z_stream the same with alpha kept on the sink and keys t - W + 1 .. t only and
    renormalised to sum 1 (the head seeing only the sink and the W most recent keys).
    Valid rows: t >= W + 1 (some key is dropped) with a kept mass > 0 and z_t != 0.
    """
    h, q, t = _check(alpha, query_positions)
    if window < 1:
        raise ConfigError(f"window: expected an integer >= 1, got {window!r}")
    g = values.shape[0]
    if values.dim() != 3 or values.shape[1] != t or h % g:
        raise ConfigError(f"values: expected shape (G, {t}, d) with G dividing {h}, got "
                          f"{tuple(values.shape)}")
    qpos = query_positions.to(device=alpha.device, dtype=torch.int64)
    keys = torch.arange(t, device=alpha.device)
    near = (keys[None, :] > qpos[:, None] - window) | (keys[None, :] == SINK)  # (Q, T)
    a = alpha.to(torch.float64)
    kept = torch.where(near[None], a, 0.0)
    mass = kept.sum(-1, keepdim=True)
    v = values.to(device=alpha.device, dtype=torch.float64).repeat_interleave(h // g, 0)
    z = a @ v  # (H, Q, d)
    z_stream = (kept / mass.clamp_min(1e-300)) @ v
    norm = z.norm(dim=-1)
    ok = (qpos >= window + 1)[None] & (mass[..., 0] > 0) & (norm > 0)
    change = (z - z_stream).norm(dim=-1) / torch.where(norm > 0, norm, 1.0)
    return torch.where(ok, change, 0.0), ok


def retrieval_hits(alpha_row: Tensor, key_tokens: Tensor, generated: int,
                   needle_span: tuple[int, int]) -> Tensor:
    """Wu et al. 2024's copy test at one decoding step: (H,) bool, head h copies when its
    most attended key (ties to the smaller position) lies in the needle span [start,
    stop) and holds the generated token. ``alpha_row`` (H, T) is the attention of the
    step's query over its T keys, ``key_tokens`` (T,) their token ids.

    >>> a = torch.tensor([[0.1, 0.8, 0.1], [0.6, 0.2, 0.2]])
    >>> retrieval_hits(a, torch.tensor([1, 7, 8]), 7, (1, 3)).tolist()
    [True, False]
    """
    if alpha_row.dim() != 2 or key_tokens.shape != (alpha_row.shape[1],):
        raise ConfigError(f"alpha_row (H, T) and key_tokens (T,): got "
                          f"{tuple(alpha_row.shape)} and {tuple(key_tokens.shape)}")
    start, stop = needle_span
    top = alpha_row.argmax(-1)  # the first maximum: ties to the smaller position
    tok = key_tokens.to(alpha_row.device)[top]
    return (top >= start) & (top < stop) & (tok == int(generated))


def retrieval_trial(hits: Tensor, generated: Sequence[int], needle: Sequence[int], *,
                    recovered_share: float = 0.5) -> tuple[Tensor, bool]:
    """One needle trial's retrieval score (Wu et al. 2024) and whether it counts.

    ``hits`` (S, L, H) bool: at decoding step s, whether head (l, h) copied the
    generated token (``retrieval_hits``; all False at a step whose token is not in the
    needle). Each copying step gives the copying heads 1/|needle|: score (L, H) float64
    = hits summed over steps / |needle|. The trial counts (the answer is recovered)
    when at least ``recovered_share`` of the needle's tokens are among the generated.

    >>> hits = torch.tensor([[[True, False]], [[True, True]]])
    >>> s, ok = retrieval_trial(hits, [5, 6], [5, 6, 7, 8])
    >>> s.tolist(), ok
    ([[0.5, 0.25]], True)
    """
    if len(needle) == 0:
        raise ConfigError("needle: expected at least one token")
    score = hits.to(torch.float64).sum(0) / len(needle)
    made = set(int(g) for g in generated)
    copied = sum(1 for tok in needle if int(tok) in made)
    return score, copied >= recovered_share * len(needle)


def mean_over_rows(score_sum: Tensor, count: Tensor) -> Tensor:
    """Per-head means from summed scores and row counts; NaN where no row counted."""
    count = count.to(torch.float64)
    return torch.where(count > 0, score_sum.to(torch.float64) / count.clamp_min(1), float("nan"))


def row_sums(score: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(H,) sums of the valid rows' scores and (H,) counts, for ``mean_over_rows``."""
    valid = valid.expand_as(score) if valid.dim() == score.dim() else valid[None].expand_as(score)
    return (torch.where(valid, score, 0.0).sum(-1).cpu(),
            valid.sum(-1).cpu().to(torch.float64))


def head_labels(scores: dict[str, Tensor]) -> dict[str, Tensor]:
    """Binary head types from scores (``threshold``): >= threshold, or <= for the types
    that say ``below`` (streaming); a NaN score gives False."""
    out = {}
    for name, s in scores.items():
        thr = threshold(name)
        out[name] = (s <= thr) if below(name) else (s >= thr)
        out[name] = out[name] & ~torch.isnan(s)
    return out


@dataclass(frozen=True)
class HeadScore:
    """A head type's registry entry (``names.HEAD_TYPES``). Scored on corpus rows (``input =
    "corpus"``): ``rows(alpha (H, Q, T), query_positions (Q,), values (G, T, d), tokens
    (T,) or None, streaming_window)`` -> ((H, Q) float64 score, (Q,) or (H, Q) bool valid
    rows), a head's score the mean over its valid rows. ``rows`` is None for the types the
    atlas scores from prompts of its own (repeated tokens, needles: ``probes/atlas.py``)."""

    rows: Callable[..., tuple[Tensor, Tensor]] | None = None
    needs_tokens: bool = False


HEAD_TYPES.register("previous_token", HeadScore(lambda a, q, v, tok, w:
                                               previous_token_rows(a, q)))
HEAD_TYPES.register("duplicate_token", HeadScore(lambda a, q, v, tok, w:
                                                duplicate_token_rows(a, q, tok),
                                                needs_tokens=True))
HEAD_TYPES.register("sink", HeadScore(lambda a, q, v, tok, w: sink_rows(a, q)))
HEAD_TYPES.register("streaming", HeadScore(lambda a, q, v, tok, w:
                                          streaming_rows(a, q, v[:, :a.shape[-1]], w)))
# scored from the atlas's own prompts, not from corpus rows
for _name in HEAD_TYPES:
    if HEAD_TYPES.meta(_name)["input"] != "corpus":
        HEAD_TYPES.register(_name, HeadScore())


def corpus_scores() -> tuple[str, ...]:
    """The head types scored on corpus rows, in registry order (a type registered later
    with ``input = "corpus"`` and a ``HeadScore`` with ``rows`` joins them)."""
    return tuple(n for n in HEAD_TYPES if (HEAD_TYPES.meta(n) or {}).get("input") == "corpus")


class HeadScoreAccumulator(Accumulator):
    """The corpus-window head scores (previous-token, duplicate-token, sink, streaming)
    from whatever query rows an analysis captures, as per-(layer, head) sums and row
    counts, so that they ride on the analysis' own pass instead of a forward of their
    own (``pipeline.atlas.head_atlas(corpus=...)``). ``update`` takes an
    ``AttentionBatch`` (the duplicate-token score needs its ``tokens``); ``add_rows``
    the same tensors directly. ``merge`` adds a shard with disjoint windows exactly.
    """

    tables = ("head_scores",)

    def __init__(self, streaming_window: int = 64) -> None:
        if int(streaming_window) != streaming_window or streaming_window < 1:
            raise ConfigError(f"streaming_window: expected an integer >= 1, got "
                              f"{streaming_window!r}")
        self.streaming_window = int(streaming_window)
        self.scores = corpus_scores()
        self.sums: dict[str, dict[int, Tensor]] = {k: {} for k in self.scores}
        self.counts: dict[str, dict[int, Tensor]] = {k: {} for k in self.scores}
        self._seen: set[tuple[int, int]] = set()

    def _add(self, name: str, layer: int, score: Tensor, valid: Tensor) -> None:
        s, c = row_sums(score, valid)
        known = self.sums[name].get(layer)
        if known is not None and known.shape != s.shape:
            raise ConfigError(f"layer {layer}: expected {known.numel()} heads, got {s.numel()}")
        self.sums[name][layer] = s if known is None else known + s
        self.counts[name][layer] = self.counts[name].get(layer, 0) + c

    def add_rows(self, layer: int, alpha: Tensor, query_positions: Tensor, values: Tensor,
                 tokens: Tensor | None = None) -> None:
        """Add the rows of one window at one layer: alpha (H, Q, T), values (G, T, d)."""
        t = alpha.shape[-1]
        # a row with any non-finite attention counts nowhere (the analyses' contract)
        finite = torch.isfinite(alpha).all(-1)  # (H, Q)
        clean = torch.where(finite[..., None], alpha, 0.0)
        for name in self.scores:
            score = HEAD_TYPES[name]
            if score.needs_tokens and tokens is None:
                continue
            value, valid = score.rows(clean, query_positions, values,
                                      None if tokens is None else tokens[:t],
                                      self.streaming_window)
            valid = valid.to(finite.device)
            self._add(name, layer, value, (valid if valid.dim() == 2 else valid[None]) & finite)

    def update(self, batch: AttentionBatch) -> None:
        self._seen.add((batch.layer, batch.window))
        self.add_rows(batch.layer, batch.alpha, batch.query_positions, batch.stats.values,
                      batch.tokens)

    def merge(self, other: HeadScoreAccumulator) -> HeadScoreAccumulator:
        self._check_mergeable(other, streaming_window=self.streaming_window,
                              scores=self.scores)
        check_disjoint(self._seen, other._seen)
        for name in self.scores:
            for layer, s in other.sums[name].items():
                self._add_sums(name, layer, s, other.counts[name][layer])
        self._seen |= other._seen
        return self

    def _add_sums(self, name: str, layer: int, s: Tensor, c: Tensor) -> None:
        self.sums[name][layer] = self.sums[name].get(layer, 0) + s
        self.counts[name][layer] = self.counts[name].get(layer, 0) + c

    def means(self, name: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per layer: (H,) mean score (NaN without a counted row) and (H,) row counts."""
        return {layer: (mean_over_rows(self.sums[name][layer], self.counts[name][layer])
                        .numpy(), self.counts[name][layer].numpy())
                for layer in sorted(self.sums[name])}

    @property
    def windows(self) -> int:
        return len({w for _, w in self._seen})

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """Table ``head_scores`` (layer, head, score, value, n_samples) of these scores."""
        cols: dict[str, list] = {"layer": [], "head": [], "score": [], "value": [],
                                 "n_samples": []}
        for name in self.scores:
            for layer, (mean, count) in self.means(name).items():
                h = mean.size
                cols["layer"].append(np.full(h, layer, dtype=np.int64))
                cols["head"].append(np.arange(h, dtype=np.int64))
                cols["score"].append(np.full(h, name, dtype=object))
                cols["value"].append(mean.astype(np.float64))
                cols["n_samples"].append(count.astype(np.int64))
        empty = {"layer": np.int64, "head": np.int64, "score": object, "value": np.float64,
                 "n_samples": np.int64}
        return {"head_scores": {k: np.concatenate(v) if v else np.zeros(0, dtype=empty[k])
                                for k, v in cols.items()}}

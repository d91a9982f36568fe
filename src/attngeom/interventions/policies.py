"""Sparse-attention policies as restriction rankings: which N keys each one keeps (issue 39).

Six published KV-cache policies, each written as the set of keys a query row keeps under a
budget of N keys, so that ``restrict_topn(model, n, ranking=<policy>)`` can compare them
with the attention ranking on the same footing (the same deletion or renormalisation,
the same recomputed output; method §9):

- ``window`` (StreamingLLM, arXiv 2309.17453): the first k visible keys (the attention
  sinks, k = 4) and the N - k latest;
- ``h2o`` (Heavy-Hitter Oracle, arXiv 2306.14048): N/2 latest keys and N/2 heavy hitters
  by attention accumulated over earlier queries, with the paper's greedy eviction;
- ``tova`` (Token Omission Via Attention, arXiv 2401.06104): greedy eviction of the key
  the current query attends to least (averaged over the layer's heads by default);
- ``quest`` (arXiv 2406.10774): pages of 16 keys ranked by an upper bound on q.k from
  each page's elementwise key minimum and maximum; the query's own page always kept;
- ``snapkv`` (arXiv 2404.14469) and ``knorm`` (arXiv 2406.11430): prefill compression,
  chosen once at the end of a prompt for its final query (``final_only``).

Conventions shared by every ``<policy>_keep`` (the reference loops in
``tests/reference_policies.py`` are written from the same list):

- shapes: ``probs`` (B, H, Q, T) attention probabilities (float32, the model's own
  eager ones), ``query`` (B, H, Q, d) and ``key`` (B, G, T, d) after RoPE, ``visible``
  bool (B, 1 or H, Q, T); the result is a bool mask broadcastable to (B, H, Q, T)
  (``policy_keep`` expands it). Query row q sits at position q + T - Q.
- invisible keys are never kept; a row with at most N visible keys keeps all of them
  (the restriction is then the identity on it), whatever the policy's state.
- ties go to the smaller position (or page), as in the top-N rule of method §4, unless
  the paper says otherwise (none does).
- the greedy policies (h2o, tova) are simulated causally over the rows in order: the
  cache a row sees is what the policy holds after the earlier rows, plus the row's own
  key, less what it evicts now; the rows are looped over, the batch and heads are not.
- the scores a policy ranks by are computed in float64 (a float32 sum would turn
  near-ties into different choices from the float64 reference); head-wise tova ranks
  the float32 probabilities themselves, exactly.

``POLICIES`` is the one declaration of the names, their functions, parameters (with
defaults and constraints), the inputs each reads, whether it is prefill-only and the
part of the budget its own rule fixes (N below it is refused). The choices the papers
leave open are listed in docs/choices.md ("Sparse-attention policies").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attngeom.errors import ConfigError
from attngeom.interventions.eviction import evict_greedily, reversed_rows
from attngeom.names import RANKINGS

# ----------------------------------------------------------------------------- helpers


def _counts(visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inclusive running count of visible keys, total per row (…, 1)), int32."""
    running = visible.cumsum(-1, dtype=torch.int32)
    return running, running[..., -1:]


def _few(visible: torch.Tensor, n: int) -> torch.Tensor:
    """(…, 1) bool: rows with at most n visible keys, which keep them all."""
    return visible.sum(-1, keepdim=True) <= n


def _top_k(score: torch.Tensor, eligible: torch.Tensor, k: int) -> torch.Tensor:
    """Bool (…, P): the k eligible entries of highest score, ties to the smaller index.

    Every entry above the k-th largest score is kept, and of those equal to it the
    first ones in index order fill the rest (scores may be negative or +inf, which
    ``restriction.topn_keep``'s marks do not allow). A row with at most k eligible
    entries keeps them all."""
    if k <= 0:
        return torch.zeros_like(eligible)
    if k >= score.shape[-1]:
        return eligible.expand_as(score).clone()
    masked = torch.where(eligible, score, -math.inf)
    kth = masked.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above = masked > kth
    tie = (masked == kth) & eligible
    room = k - above.sum(-1, keepdim=True)
    return (above | (tie & (tie.cumsum(-1) <= room))) & eligible


# ----------------------------------------------------------------------------- policies


def window_keep(visible: torch.Tensor, n: int, *, sinks: int = 4) -> torch.Tensor:
    """StreamingLLM (Xiao et al., arXiv 2309.17453): the first ``sinks`` visible keys
    (the attention sinks) and the n - sinks latest visible keys of each row.

    ``visible`` (…, T) bool; returns the same shape. The paper keeps k = 4 initial
    tokens and a rolling window of recent ones; ``n < sinks`` is refused by
    ``check_policy``. The paper re-numbers positions inside its cache; here the keys
    keep the model's positions (the restriction cuts probabilities, it does not move
    keys). The positional control of App. E.5 of the follow-up (``selection
    .positional_keep``) is this rule with one sink at position 0.

    >>> window_keep(torch.ones(1, 8, dtype=torch.bool), 5, sinks=2).int().tolist()
    [[1, 1, 0, 0, 0, 1, 1, 1]]
    """
    running, total = _counts(visible)
    return visible & ((running <= sinks) | (total - running < n - sinks) | (total <= n))


def h2o_keep(probs: torch.Tensor, visible: torch.Tensor, n: int, *, heavy: float = 0.5,
             accumulate: str = "cache") -> torch.Tensor:
    """H2O (Zhang et al., arXiv 2306.14048): recent keys plus heavy hitters, per head.

    The budget splits into floor(heavy * n) heavy-hitter slots and r = n - that recent
    slots (the paper's experiments give both halves alike: heavy = 0.5). Simulated
    causally (Algorithm 1): at row t the row's own key enters the cache (with the r
    latest visible keys, which are never evicted); while the cache holds more than n
    keys, the non-recent key with the smallest accumulated attention leaves (ties: the
    larger position leaves); the row keeps the cache; then each cached key's score
    grows by the row's attention to it.

    Which attention is accumulated: ``"cache"`` (default), the probabilities as the
    policy's own cache holds them, i.e. renormalised over the kept keys, as Algorithm 1
    normalises over S_{i-1} and the authors' real-drop code (``utils_real_drop``)
    accumulates the softmax over its cache; ``"full"``, the unrestricted probabilities,
    as the authors' mask simulation (``utils_lm_eval``) sums them (there an evicted key
    can return; here it never does). Per query head (the paper's models have one kv head
    per query head; a GQA query head keeps its own cache).

    ``probs`` (B, H, Q, T), ``visible`` (B, 1|H, Q, T); returns (B, H, Q, T) bool.
    """
    b, h, _, t = probs.shape
    acc = torch.zeros((b, h, t), dtype=torch.float64, device=probs.device)  # reversed keys
    rows = reversed_rows(probs, torch.float64)
    tiny = torch.finfo(torch.float64).tiny

    def after(q: int, start: int, cached: torch.Tensor) -> None:
        held = rows(q)[..., start:] * cached
        if accumulate == "cache":
            acc[..., start:].addcdiv_(held, held.sum(-1, keepdim=True).clamp_min_(tiny))
        else:
            acc[..., start:] += held

    return evict_greedily(visible, n, h, n - math.floor(heavy * n),
                          score=lambda q, start, cached: acc[..., start:], after=after)


def tova_keep(probs: torch.Tensor, visible: torch.Tensor, n: int, *,
              heads: str = "layer") -> torch.Tensor:
    """TOVA (Oren et al., arXiv 2401.06104): evict the key the current query attends to least.

    Simulated causally: at row t the row's own key joins the cache and, while it holds
    more than n keys, the key of lowest current attention leaves (ties: the larger
    position leaves); the row keeps the cache. ``heads="layer"`` (the paper's policy and
    its code's: the attention of the last query averaged over the layer's heads, one
    cache for every head of the layer, GQA included) or ``"head"`` (each query head its
    own cache, the paper's head-wise variant). Each head's attention is its probability
    over the candidate keys (renormalised over them, as TOVA's query sees only its
    cache; the per-head order is the same either way).

    The paper's query attends to its n cached keys and itself, then evicts; here the
    eviction comes first, so the row keeps at most n keys like every other ranking.
    ``probs`` (B, H, Q, T), ``visible`` (B, 1|H, Q, T); returns (B, 1 or H, Q, T) bool.
    """
    b, h, _, _ = probs.shape
    per_head = heads == "head"
    if not per_head and visible.shape[1] != 1:
        raise ConfigError("tova: expected one visibility row per batch row for heads='layer' "
                          f"(a layer-wide cache), got {visible.shape[1]} per head; "
                          "use heads='head'")

    rows = reversed_rows(probs, torch.float32 if per_head else torch.float64)

    def score(q: int, start: int, cached: torch.Tensor) -> torch.Tensor:
        row = rows(q)[..., start:]
        if per_head:
            return row
        held = row * cached
        total = held.sum(-1, keepdim=True).clamp_min_(torch.finfo(torch.float64).tiny)
        # summed over the heads in their order (cumsum is a sequential scan), as the
        # reference does: a tree-ordered mean rounds exact ties apart differently
        return (held / total).cumsum(1)[:, -1:] / h

    return evict_greedily(visible, n, h if per_head else 1, 0, score=score)


def quest_keep(query: torch.Tensor, key: torch.Tensor, visible: torch.Tensor, n: int, *,
               page_size: int = 16) -> torch.Tensor:
    """Quest (Tang et al., arXiv 2406.10774): the pages of highest upper-bound attention.

    Keys are cut into pages of ``page_size`` positions from position 0. For query q, a
    page with elementwise key minimum m and maximum M (over its keys the row can see)
    scores sum_i max(q_i M_i, q_i m_i), an upper bound on q.k for every key in it
    (computed as q+ . M + q- . m). The row keeps floor(n / page_size) pages: its own
    page (the one holding its position, often partial) always, as the authors' kernel
    counts the last page in the budget and never ranks it, and the best-scoring others
    (ties to the smaller page); a page counts whole, so a row keeps at most n keys.
    Per query head, each against its kv head's keys (the paper's models are MHA).
    ``n < page_size`` is refused by ``check_policy``. The authors skip the first two
    layers; here the layers are the restriction's ``layers`` argument.

    ``query`` (B, H, Q, d), ``key`` (B, G, T, d), ``visible`` (B, 1|H, Q, T); returns
    (B, H, Q, T) bool.
    """
    b, h, q_len, d = query.shape
    g, t = key.shape[1], key.shape[2]
    if visible.shape[1] != 1:  # a mask per head: each head on its own
        group = h // g
        return torch.cat([quest_keep(query[:, i:i + 1], key[:, i // group:i // group + 1],
                                     visible[:, i:i + 1], n, page_size=page_size)
                          for i in range(h)], dim=1)
    pages = -(-t // page_size)
    pad = pages * page_size - t
    keys = torch.nn.functional.pad(key.to(torch.float64), (0, 0, 0, pad))
    keys = keys.view(b, g, pages, page_size, d)
    present = torch.arange(pages * page_size, device=key.device) < t
    vis = torch.nn.functional.pad(visible, (0, pad)).view(b, 1, q_len, pages, page_size)
    seen = vis.any(-1)  # (B, 1, Q, P)
    whole = (vis | ~present.view(pages, page_size)).all(-1)
    top = torch.where(present.view(pages, page_size, 1), keys, -math.inf).amax(3)
    low = torch.where(present.view(pages, page_size, 1), keys, math.inf).amin(3)
    group = h // g
    up = top.repeat_interleave(group, 1)  # (B, H, P, d)
    down = low.repeat_interleave(group, 1)
    q64 = query.to(torch.float64)
    plus, minus = q64.clamp_min(0), q64.clamp_max(0)
    score = plus @ up.transpose(-1, -2) + minus @ down.transpose(-1, -2)  # (B, H, Q, P)
    own = (torch.arange(q_len, device=key.device) + (t - q_len)) // page_size  # (Q,)
    is_own = torch.arange(pages, device=key.device) == own[:, None]  # (Q, P)
    # pages the row sees in part (the own page aside, kept unscored): bounds over the
    # visible keys only (padding, sliding windows)
    partial = (seen & ~whole & ~is_own)[:, 0]  # (B, Q, P)
    bi, qi, pi = partial.nonzero(as_tuple=True)
    if len(bi):
        mask = vis[bi, 0, qi, pi][:, None, :, None]  # (L, 1, page, 1)
        block = keys[bi, :, pi]  # (L, G, page, d)
        top_p = torch.where(mask, block, -math.inf).amax(2).repeat_interleave(group, 1)
        low_p = torch.where(mask, block, math.inf).amin(2).repeat_interleave(group, 1)
        qv = q64[bi, :, qi]  # (L, H, d)
        score[bi, :, qi, pi] = (qv.clamp_min(0) * top_p + qv.clamp_max(0) * low_p).sum(-1)
    score = torch.where(is_own & seen, math.inf, score)
    page_keep = _top_k(score, seen, n // page_size)
    page_keep |= seen & _few(visible, n)  # a row with at most n visible keys keeps them
    keys_kept = page_keep[..., None].expand(*page_keep.shape, page_size)
    return keys_kept.reshape(*page_keep.shape[:-1], pages * page_size)[..., :t] & visible


def snapkv_keep(probs: torch.Tensor, visible: torch.Tensor, n: int, *, window: int = 32,
                kernel: int = 5, pooling: str = "avgpool") -> torch.Tensor:
    """SnapKV (Li et al., arXiv 2404.14469): prefill compression for the final query row.

    The last ``window`` prompt queries (the observation window) vote: each earlier key's
    score is its attention from those queries, summed over them, then pooled along the
    keys (1-D, ``kernel`` wide, stride 1, zero padding of kernel // 2 counted in the
    average: ``avg_pool1d``'s defaults as the authors call it). The final row keeps the
    n - window best earlier keys (ties to the smaller position) and the window's own
    keys. Defaults are the authors' (``init_snapkv``: window 32, kernel 5, avgpool;
    ``maxpool`` the other pooling their code offers). Per query head (their code repeats
    the kv heads before it selects). Every row but the last keeps its visible keys;
    ``n < window`` is refused by ``check_policy``.

    ``probs`` (B, H, Q, T), ``visible`` (B, 1|H, Q, T); returns (B, H, Q, T) bool.
    """
    b, h, q_len, t = probs.shape
    keep = visible.expand(b, h, q_len, t).clone()
    last = visible[:, :, -1, :].expand(b, h, t)
    if bool((last.sum(-1) <= n).all()) or t <= window:
        return keep
    prefix = t - window
    rows = min(window, q_len)
    votes = probs[:, :, q_len - rows:, :prefix].to(torch.float64).sum(-2)  # (B, H, prefix)
    half = kernel // 2
    padded = torch.nn.functional.pad(votes, (half, half),
                                     value=0.0 if pooling == "avgpool" else -math.inf)
    pooled = padded[..., 0:prefix].clone()
    for o in range(1, kernel):  # in key order, as the reference adds them
        if pooling == "avgpool":
            pooled += padded[..., o:o + prefix]
        else:
            pooled = torch.maximum(pooled, padded[..., o:o + prefix])
    if pooling == "avgpool":
        pooled /= kernel
    chosen = _top_k(pooled, last[..., :prefix], n - window)
    row = torch.cat([chosen, last[..., prefix:]], dim=-1)
    keep[:, :, -1] = torch.where(last.sum(-1, keepdim=True) <= n, last, row)
    return keep


def knorm_keep(key: torch.Tensor, visible: torch.Tensor, n: int) -> torch.Tensor:
    """K-norm (Devoto et al., arXiv 2406.11430): the final row keeps the n visible keys
    of lowest L2 norm (ties to the smaller position).

    Prefill compression: the kept set is chosen once, at the end of the prompt, and
    applies to the final query row; every other row keeps its visible keys. Per kv head
    (the cache is per kv head; ``policy_keep`` gives each query head its kv head's set).
    RoPE rotates pairs of coordinates, so the norm is the same before and after it. The
    authors' code compresses every layer by default (their experiments skip the first
    two; here the layers are the restriction's ``layers`` argument).

    ``key`` (B, G, T, d), ``visible`` (B, 1|G|H, Q, T); returns (B, G, Q, T) bool (B, H,
    Q, T) where ``visible`` has a row per query head.
    """
    b, g, t, _ = key.shape
    heads = max(g, visible.shape[1])
    q_len = visible.shape[2]
    keep = visible.expand(b, heads, q_len, t).clone()
    last = visible[:, :, -1, :].expand(b, heads, t)
    if bool((last.sum(-1) <= n).all()):
        return keep
    norms = key.to(torch.float64).square().sum(-1)  # squared: the same order
    norms = norms.repeat_interleave(heads // g, 1)  # (B, heads, T)
    keep[:, :, -1] = _top_k(-norms, last, n)
    return keep


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Param:
    """One policy parameter: its default and what values it accepts."""

    default: object
    accepts: Callable[[object], bool]
    expected: str  # for "expected <name> <expected>, got ..."


@dataclass(frozen=True)
class Policy:
    """One policy, declared once: its keep function, parameters, the inputs it reads
    (of ``probs``, ``query``, ``key``), whether only a prompt's final row may use it
    (prefill compression), and the part of the budget its own rule fixes (n below it
    is refused)."""

    keep: Callable[..., torch.Tensor]
    params: Mapping[str, Param]
    needs: tuple[str, ...]
    prefill_only: bool
    fixed: Callable[[Mapping[str, object]], int]
    paper: str


def _int_at_least(low: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _one_of(*names: str) -> Callable[[object], bool]:
    return lambda v: v in names


def _fraction(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1


POLICIES: dict[str, Policy] = {
    "window": Policy(window_keep, {"sinks": Param(4, _int_at_least(0), "an integer >= 0")},
                     (), False, lambda p: p["sinks"], "StreamingLLM, arXiv 2309.17453"),
    "h2o": Policy(h2o_keep,
                  {"heavy": Param(0.5, _fraction, "a fraction of the budget in [0, 1)"),
                   "accumulate": Param("cache", _one_of("cache", "full"),
                                       "one of 'cache', 'full'")},
                  ("probs",), False, lambda p: 1, "H2O, arXiv 2306.14048"),
    "tova": Policy(tova_keep, {"heads": Param("layer", _one_of("layer", "head"),
                                              "one of 'layer', 'head'")},
                   ("probs",), False, lambda p: 1, "TOVA, arXiv 2401.06104"),
    "quest": Policy(quest_keep, {"page_size": Param(16, _int_at_least(1),
                                                    "a positive integer")},
                    ("query", "key"), False, lambda p: p["page_size"],
                    "Quest, arXiv 2406.10774"),
    "snapkv": Policy(snapkv_keep,
                     {"window": Param(32, _int_at_least(1), "a positive integer"),
                      "kernel": Param(5, lambda v: _int_at_least(1)(v) and v % 2 == 1,
                                      "an odd positive integer"),
                      "pooling": Param("avgpool", _one_of("avgpool", "maxpool"),
                                       "one of 'avgpool', 'maxpool'")},
                     ("probs",), True, lambda p: p["window"], "SnapKV, arXiv 2404.14469"),
    "knorm": Policy(knorm_keep, {}, ("key",), True, lambda p: 1,
                    "K-norm, arXiv 2406.11430"),
}


# each policy is a restriction ranking: ``names.RANKINGS`` declares the names with what a
# configuration checks before torch loads (the fixed part at the default parameters,
# prefill only; ``tests/interventions/test_policies.py`` holds the two to the same)
for _name, _policy in POLICIES.items():
    RANKINGS.register(_name, _policy)


def check_policy(name: str, n: int, params: Mapping[str, object] | None = None, *,
                 final_only: bool = False) -> dict[str, object]:
    """The policy's full parameters (defaults filled in), or one-line ``ConfigError``.

    Refuses an unknown policy or parameter, a value outside its constraint, a budget
    below the part the policy's rule fixes (``window``: n < sinks; ``quest``: n <
    page_size; ``snapkv``: n < window) and a prefill-only policy (``snapkv``, ``knorm``)
    asked of every row (the LM loss) rather than a prompt's final one (``final_only``).
    """
    if name not in POLICIES:
        raise ConfigError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")
    policy = POLICIES[name]
    given = dict(params or {})
    unknown = sorted(set(given) - set(policy.params))
    if unknown:
        known = ", ".join(policy.params) or "none"
        raise ConfigError(f"{name}: unknown parameter {unknown[0]!r}; expected {known}")
    full = {k: given.get(k, p.default) for k, p in policy.params.items()}
    for k, p in policy.params.items():
        if not p.accepts(full[k]):
            raise ConfigError(f"{name}: expected {k} {p.expected}, got {full[k]!r}")
    if policy.prefill_only and not final_only:
        raise ConfigError(f"{name}: prefill compression applies to a prompt's final query "
                          "only; it cannot restrict every row (the LM loss): use it with "
                          "final_only=True (a QA probe)")
    floor = policy.fixed(full)
    if n < floor:
        what = {"window": "sinks", "quest": "page_size", "snapkv": "window"}.get(name, "1")
        raise ConfigError(f"{name}: expected n >= {what} ({floor}), got n = {n}")
    return full


def policy_keep(name: str, n: int, params: Mapping[str, object] | None = None, *,
                visible: torch.Tensor, probs: torch.Tensor | None = None,
                query: torch.Tensor | None = None, key: torch.Tensor | None = None,
                final_only: bool = False) -> torch.Tensor:
    """(B, H, Q, T) bool keys kept by policy ``name`` at budget ``n`` (possibly a view).

    Passes each policy the inputs it ``needs``; ``final_only``: every row but the last
    keeps its visible keys (a prompt's final query, the prefill policies' only row).
    """
    full = check_policy(name, n, params, final_only=final_only)
    policy = POLICIES[name]
    inputs = {"probs": probs, "query": query, "key": key}
    for need in policy.needs:
        if inputs[need] is None:
            raise ConfigError(f"{name}: expected {need} for the policy, got None")
    reference = probs if probs is not None else query
    if reference is None:
        raise ConfigError(f"{name}: expected probs or query (the number of query heads), "
                          "got neither")
    b, h, q_len = reference.shape[:3]
    t = visible.shape[-1]
    keep = policy.keep(*(inputs[x] for x in policy.needs), visible, n, **full)
    if keep.shape[1] not in (1, h):  # per kv head: each query head reads its kv head's
        keep = keep.repeat_interleave(h // keep.shape[1], 1)
    keep = keep.expand(b, h, q_len, t)
    if final_only and not policy.prefill_only and q_len > 1:
        keep = torch.cat([visible[:, :, :-1].expand(b, h, q_len - 1, t), keep[:, :, -1:]],
                         dim=2)
    return keep

"""Slow references for the sparse-attention policies, written from each definition.

Plain Python loops in float64 over every (batch row, head, query row); the greedy
policies (h2o, tova) step through the rows one at a time with a Python ``set`` as the
cache. Nothing here is vectorised or shared with ``attngeom.interventions.policies``:
the fast functions are compared with these on generated inputs (ties, padding, sliding
windows, arbitrary masks, GQA groupings, budgets at their limits).

Common rules (docs/method.md, "Sparse-attention policies"): tensors ``probs`` (B, H, Q,
T), ``query`` (B, H, Q, d), ``key`` (B, G, T, d), ``visible`` (B, 1 or H, Q, T); query
row q sits at position q + T - Q; query head h reads kv head h // (H / G); a row with
at most n visible keys keeps all of them; invisible keys are never kept; ties go to the
smaller position (or page). Each function returns a (B, H, Q, T) bool tensor.
"""

from __future__ import annotations

import math

import torch


def _visible(visible, b, h, q):
    """The positions row (b, h, q) of ``visible`` (nested lists) can see, in order."""
    row = visible[b][h if len(visible[b]) > 1 else 0][q]
    return [j for j, seen in enumerate(row) if seen]


def _result(b, h, q, t, rows):
    """A (B, H, Q, T) bool tensor from {(b, h, q): kept positions}."""
    out = [[[[False] * t for _ in range(q)] for _ in range(h)] for _ in range(b)]
    for (i, j, k), kept in rows.items():
        for pos in kept:
            out[i][j][k][pos] = True
    return torch.tensor(out, dtype=torch.bool).reshape(b, h, q, t)


def _each_row(visible, n, num_heads, choose):
    """Every row of (B, ``num_heads``, Q, T): the keys ``choose(i, h, q, seen)`` keeps
    where the row sees more than n keys (``seen``, in order), all of them elsewhere."""
    b, _, q_len, t = visible.shape
    vis = visible.tolist()
    rows = {}
    for i in range(b):
        for h in range(num_heads):
            for q in range(q_len):
                seen = _visible(vis, i, h, q)
                rows[i, h, q] = seen if len(seen) <= n else choose(i, h, q, seen)
    return _result(b, num_heads, q_len, t, rows)


def window(visible, n, num_heads, sinks=4):
    """StreamingLLM: the first ``sinks`` visible keys and the n - sinks latest ones."""
    def choose(i, h, q, seen):
        return seen[:sinks] + (seen[len(seen) - (n - sinks):] if n > sinks else [])

    return _each_row(visible, n, num_heads, choose)


def h2o(probs, visible, n, heavy=0.5, accumulate="cache"):
    """H2O, step by step: recent r = n - floor(heavy n) latest visible keys never leave;
    the cache takes them and the row's own key, drops what the row cannot see, and
    while it holds more than n keys the non-recent key of least accumulated attention
    leaves (ties: the larger
    position); the row keeps the cache; then every cached key's score grows by the row's
    probability, over the cache's total (``cache``) or as it is (``full``)."""
    b, h_len, q_len, t = probs.shape
    r = n - math.floor(heavy * n)
    vis, prob = visible.tolist(), probs.double().tolist()
    rows = {}
    for i in range(b):
        for h in range(h_len):
            cache: set[int] = set()
            score = [0.0] * t
            for q in range(q_len):
                seen = _visible(vis, i, h, q)
                if len(seen) <= n:
                    cache = set(seen)
                else:
                    recent = set(seen[-r:])
                    cache = (cache | recent | {q + t - q_len}) & set(seen)
                    while len(cache) > n:
                        victim = min(cache - recent, key=lambda j: (score[j], -j))
                        cache.remove(victim)
                rows[i, h, q] = sorted(cache)
                p = prob[i][h][q]
                total = 0.0
                for j in sorted(cache):
                    total += p[j]
                for j in sorted(cache):
                    if accumulate == "full":
                        score[j] += p[j]
                    elif total > 0:
                        score[j] += p[j] / total
    return _result(b, h_len, q_len, t, rows)


def _tova_steps(prob_rows, visible_rows, n, shift):
    """One TOVA cache over rows: ``prob_rows(q)`` gives [per-head probability lists] for
    row q, ``visible_rows(q)`` its visible positions. The row's key joins, invisible
    keys leave, and the cache keeps its n keys of highest mean (over heads) attention,
    each head's renormalised over the candidates (ties: the smaller position stays)."""
    cache: set[int] = set()
    kept = []
    for q, seen in enumerate(visible_rows):
        if len(seen) <= n:
            cache = set(seen)
        else:
            candidates = (cache | {q + shift}) & set(seen)
            if len(candidates) > n:
                heads = prob_rows(q)
                mean = {j: 0.0 for j in candidates}
                for p in heads:
                    total = 0.0
                    for j in sorted(candidates):
                        total += p[j]
                    for j in candidates:
                        mean[j] += p[j] / total if total > 0 else 0.0
                for j in candidates:
                    mean[j] /= len(heads)
                order = sorted(candidates, key=lambda j: (-mean[j], j))
                candidates = set(order[:n])
            cache = candidates
        kept.append(sorted(cache))
    return kept


def tova(probs, visible, n, heads="layer"):
    """TOVA: one cache per layer (mean over heads) or per head (``heads="head"``)."""
    b, h_len, q_len, t = probs.shape
    shift = t - q_len
    vis, prob = visible.tolist(), probs.double().tolist()
    rows = {}
    for i in range(b):
        groups = [[h] for h in range(h_len)] if heads == "head" else [list(range(h_len))]
        for group in groups:
            seen = [_visible(vis, i, group[0], q) for q in range(q_len)]

            def prob_rows(q, i=i, group=group):
                return [prob[i][h][q] for h in group]

            for q, kept in enumerate(_tova_steps(prob_rows, seen, n, shift)):
                for h in group:
                    rows[i, h, q] = kept
    return _result(b, h_len, q_len, t, rows)


def quest(query, key, visible, n, page_size=16):
    """Quest: pages of ``page_size`` from position 0; a page scores sum_i max(q_i M_i,
    q_i m_i) over the keys of it the row sees; the row's own page (holding its position)
    is kept whenever it holds a visible key, then the best other pages up to n //
    page_size pages in all (ties: the smaller page)."""
    b, h_len, q_len, d = query.shape
    g, t = key.shape[1], key.shape[2]
    group = h_len // g
    qs, ks = query.double().tolist(), key.double().tolist()
    known = {}

    def bounds(i, kv, members):
        """Elementwise maximum and minimum of kv head ``kv``'s keys at ``members``
        (remembered: most rows see the same pages whole)."""
        if (i, kv, members) not in known:
            known[i, kv, members] = (
                [max(ks[i][kv][j][c] for j in members) for c in range(d)],
                [min(ks[i][kv][j][c] for j in members) for c in range(d)])
        return known[i, kv, members]

    def choose(i, h, q, seen):
        pages: dict[int, list[int]] = {}
        for j in seen:
            pages.setdefault(j // page_size, []).append(j)
        qv = qs[i][h][q]
        scores = {}
        for page, members in pages.items():
            top, low = bounds(i, h // group, tuple(members))
            total = 0.0
            for c in range(d):
                total += max(qv[c] * top[c], qv[c] * low[c])
            scores[page] = total
        own = (q + t - q_len) // page_size
        chosen = [own] if own in pages else []
        others = sorted((p for p in pages if p != own), key=lambda p: (-scores[p], p))
        chosen += others[:max(n // page_size - len(chosen), 0)]
        return sorted(j for p in chosen for j in pages[p])

    return _each_row(visible, n, h_len, choose)


def snapkv(probs, visible, n, window=32, kernel=5, pooling="avgpool"):
    """SnapKV on the last row: votes of the last ``window`` query rows on the keys
    before position T - window, pooled over ``kernel`` neighbours (average with the
    zero padding counted, or maximum over those present), the n - window best kept plus
    the window's keys; every other row keeps its visible keys."""
    _, h_len, q_len, t = probs.shape
    prefix = t - window
    half = kernel // 2
    prob = probs.double().tolist()

    def choose(i, h, q, seen):
        if q < q_len - 1 or prefix <= 0:
            return seen
        voters = [q for q in range(q_len) if q + t - q_len >= prefix]
        votes = []
        for j in range(prefix):
            total = 0.0
            for v in voters:
                total += prob[i][h][v][j]
            votes.append(total)
        pooled = []
        for j in range(prefix):
            near = [votes[j + o] for o in range(-half, half + 1) if 0 <= j + o < prefix]
            if pooling == "avgpool":
                total = 0.0
                for x in near:
                    total += x
                pooled.append(total / kernel)
            else:
                pooled.append(max(near))
        earlier = sorted((j for j in seen if j < prefix), key=lambda j: (-pooled[j], j))
        return sorted(earlier[:n - window] + [j for j in seen if j >= prefix])

    return _each_row(visible, n, h_len, choose)


def knorm(key, visible, n, num_heads):
    """K-norm on the last row: the n visible keys of least L2 norm of the row's kv head
    (ties: the smaller position); every other row keeps its visible keys."""
    g, d = key.shape[1], key.shape[3]
    q_len = visible.shape[2]
    group = num_heads // g
    ks = key.double().tolist()

    def choose(i, h, q, seen):
        if q < q_len - 1:
            return seen
        norms = {}
        for j in seen:
            total = 0.0
            for c in range(d):
                total += ks[i][h // group][j][c] ** 2
            norms[j] = math.sqrt(total)
        return sorted(sorted(seen, key=lambda j: (norms[j], j))[:n])

    return _each_row(visible, n, num_heads, choose)


REFERENCES = {"window": window, "h2o": h2o, "tova": tova, "quest": quest, "snapkv": snapkv,
              "knorm": knorm}

"""Slow reference for the "other sinks by token identity" statistics (SPEC 3).

Written from the definition with plain loops over windows, query rows and keys,
so that a fast vectorised implementation can be compared with it. Standard
library only. The sums are exact: every alpha is turned into a
``fractions.Fraction`` (exactly, as the float it is) and every uniform weight is
``Fraction(1, |U_t|)``; only the final ratios are converted to float.

Input: the windows of ONE head. Each window is a dict

- ``"tokens"``: ``T`` int token ids,
- ``"rows"``: ``{t: (alpha, visible)}``, ``alpha`` the ``T`` attention
  probabilities of query ``t`` and ``visible`` the ``T`` bools of the keys it may see.

A (query t, key j) pair counts (``_counted_pairs``) when

- the row is valid: at least two visible keys, all visible alphas finite;
- key ``j`` is visible from ``t``;
- the query is far enough from the key: ``t - j >= min_distance`` for a causal
  model, ``|t - j| >= min_distance`` for a bidirectional one (``causal=False``).

``reference_sink_tokens`` groups the counted pairs with ``j >= 1`` by
``tokens[j]``; ``reference_position0`` takes the counted pairs with ``j == 0``.

An **occurrence** is one key ``(window index, j)`` with at least one counted pair;
its share is the mean ``alpha_t[j]`` over its counted pairs (exact, a Fraction). The
spread of the shares is given by nearest-rank quantiles: the p-quantile of n values is
the ``ceil(p n)``-th smallest (so the median of an even count is the lower middle
value). A token is a sink (``reference_detected``) only when it **recurs** (SPEC 3):
at least 5 occurrences, in at least 3 windows, and its median share is ``>= 0.1`` and
``>= 5`` times the uniform share.
"""

from __future__ import annotations

import math
from fractions import Fraction


def _row_is_valid(alpha, visible):
    """A row counts only with at least two visible keys and finite visible alphas."""
    n_visible = 0
    for j in range(len(alpha)):
        if not visible[j]:
            continue
        n_visible += 1
        if not math.isfinite(float(alpha[j])):
            return False
    return n_visible >= 2


def _far_enough(t, j, min_distance, causal):
    """``t - j >= min_distance`` (causal) or ``|t - j| >= min_distance`` (bidirectional)."""
    if causal:
        return t - j >= min_distance
    return abs(t - j) >= min_distance


def _counted_pairs(windows, min_distance, causal):
    """Every counted (query, key) pair as ``(window index, t, j, alpha_t[j], |U_t|)``."""
    pairs = []
    for w, window in enumerate(windows):
        big_t = len(window["tokens"])
        for t in sorted(window["rows"]):
            alpha, visible = window["rows"][t]
            if t < 0 or t >= big_t:
                raise ValueError(f"query position {t} outside the window of length {big_t}")
            if len(alpha) != big_t or len(visible) != big_t:
                raise ValueError(f"row {t}: alpha or visible is not of length {big_t}")
            if not _row_is_valid(alpha, visible):
                continue
            n_visible = 0
            for j in range(big_t):
                if visible[j]:
                    n_visible += 1
            for j in range(big_t):
                if not visible[j]:
                    continue
                if not _far_enough(t, j, min_distance, causal):
                    continue
                pairs.append((w, t, j, float(alpha[j]), n_visible))
    return pairs


def _new_accumulator():
    return {"pairs": 0, "occurrences": {}, "share_sum": Fraction(0), "uniform_sum": Fraction(0)}


def _add_pair(acc, w, j, alpha_tj, n_visible):
    """Add one counted pair: one more pair, to its key occurrence, alpha and 1 / |U_t|."""
    acc["pairs"] += 1
    occurrence = acc["occurrences"].setdefault((w, j), [Fraction(0), 0])
    occurrence[0] += Fraction(alpha_tj)
    occurrence[1] += 1
    acc["share_sum"] += Fraction(alpha_tj)
    acc["uniform_sum"] += Fraction(1, n_visible)


def nearest_rank(values, p):
    """The ``ceil(p n)``-th smallest of the n ``values`` (at least the first)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(Fraction(p) * len(ordered)))
    return ordered[rank - 1]


def _finish(acc, min_share=0.1):
    """pairs, occurrences, windows, mean_share = share_sum / pairs, uniform_share, the
    nearest-rank quartiles of the occurrence shares, share_held (the fraction of
    occurrences with share >= min_share) and lift = median_share / uniform_share."""
    pairs = acc["pairs"]
    shares = [total / count for total, count in acc["occurrences"].values()]
    median = float(nearest_rank(shares, Fraction(1, 2)))
    uniform = float(acc["uniform_sum"] / pairs)
    return {
        "pairs": pairs,
        "occurrences": len(acc["occurrences"]),
        "windows": len({w for w, _j in acc["occurrences"]}),
        "mean_share": float(acc["share_sum"] / pairs),
        "uniform_share": uniform,
        "share_q1": float(nearest_rank(shares, Fraction(1, 4))),
        "median_share": median,
        "share_q3": float(nearest_rank(shares, Fraction(3, 4))),
        "share_held": sum(1 for x in shares if x >= min_share) / len(shares),
        "lift": median / uniform,
    }


def reference_sink_tokens(windows, *, min_distance=16, causal=True, min_share=0.1):
    """SPEC 3 "other sinks by token identity" for one head.

    For each token id x, over the counted pairs whose key ``j >= 1`` holds x
    (``tokens[j] == x``): ``pairs`` (how many), ``occurrences`` (distinct
    ``(window index, j)`` keys of x with at least one counted pair), ``mean_share``
    (sum of ``alpha_t[j]`` / pairs), ``uniform_share`` (sum of ``1 / |U_t|`` / pairs),
    ``windows`` (distinct windows of those occurrences), the occurrence shares'
    nearest-rank ``share_q1``, ``median_share``, ``share_q3``, ``share_held`` (fraction
    of occurrences with share >= ``min_share``) and ``lift`` (median_share /
    uniform_share).

    Returns ``{token_id: {...}}`` for the tokens with at least one counted pair.
    """
    accumulators = {}
    for w, _t, j, alpha_tj, n_visible in _counted_pairs(windows, min_distance, causal):
        if j < 1:
            continue
        token = int(windows[w]["tokens"][j])
        if token not in accumulators:
            accumulators[token] = _new_accumulator()
        _add_pair(accumulators[token], w, j, alpha_tj, n_visible)
    stats = {}
    for token in sorted(accumulators):
        stats[token] = _finish(accumulators[token], min_share)
    return stats


def is_sink(s, *, min_share=0.1, min_lift=5.0, min_occurrences=5, min_windows=3):
    """SPEC 3: recurring (occurrences, windows) and a median share that holds."""
    return (s["occurrences"] >= min_occurrences and s["windows"] >= min_windows
            and s["median_share"] >= min_share
            and s["median_share"] >= min_lift * s["uniform_share"])


def reference_detected(stats, **thresholds):
    """Sorted token ids that ``is_sink`` (same keyword thresholds)."""
    return sorted(token for token, s in stats.items() if is_sink(s, **thresholds))


def reference_position0(windows, *, min_distance=16, causal=True, min_share=0.1):
    """The same statistics as ``reference_sink_tokens`` over keys ``j == 0`` only.

    Token identity is ignored; ``occurrences`` is the number of windows whose
    position 0 has at least one counted pair. ``None`` without a counted pair.
    """
    acc = _new_accumulator()
    for w, _t, j, alpha_tj, n_visible in _counted_pairs(windows, min_distance, causal):
        if j != 0:
            continue
        _add_pair(acc, w, j, alpha_tj, n_visible)
    if acc["pairs"] == 0:
        return None
    return _finish(acc, min_share)


# ---------------------------------------------------------------------------
# Hand-worked golden checks
# ---------------------------------------------------------------------------


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def _causal_rows(big_t, alpha_of):
    """Rows t = 0 .. T-1 of a causal window; ``alpha_of(t)`` gives the t + 1 alphas of keys 0..t."""
    rows = {}
    for t in range(big_t):
        head = alpha_of(t)
        alpha = list(head) + [0.0] * (big_t - len(head))
        visible = [j <= t for j in range(big_t)]
        rows[t] = (alpha, visible)
    return rows


def _planted_alpha(t):
    """Token at position 3 takes 0.5 from every t >= 19; the rest is uniform."""
    if t < 19:
        return [1.0 / (t + 1)] * (t + 1)
    alpha = [0.5 / t] * (t + 1)
    alpha[3] = 0.5
    return alpha


def test_planted_token_once_is_not_a_sink():
    """A token planted at position 3 of ONE 40-token window holds, but does not recur.

    Tokens: 1000 + j at every position j except tokens[3] = 7. Causal rows
    t = 0..39; for t >= 19, alpha[3] = 0.5 and the other t visible keys share
    0.5 (0.5 / t each); for t < 19 the row is uniform 1 / (t + 1).

    Key 3 counts from queries with t - 3 >= 16, i.e. t = 19..39: 21 pairs, one
    occurrence (share 0.5, so every quartile is 0.5), one window, uniform_sum =
    sum_{t=19}^{39} 1/(t+1) (about 0.7309), lift 0.5 / (uniform_sum / 21) about 14.4.
    The share holds (>= 0.1, >= 5x uniform) but one occurrence in one window is not a
    sink: nothing is detected; with min_occurrences = min_windows = 1 token 7 is. Every
    other key j gets at most 0.5 / t <= 0.5 / 19 < 0.1 from a t >= 19 query and
    1/(t+1) <= 1/17 from t = 16..18, so it fails the share test.

    Position 0 counts from t = 16..39: 24 pairs, one occurrence, alphas 1/17,
    1/18, 1/19 (t = 16, 17, 18) and 0.5/t (t = 19..39).
    """
    tokens = [1000 + j for j in range(40)]
    tokens[3] = 7
    window = {"tokens": tokens, "rows": _causal_rows(40, _planted_alpha)}
    stats = reference_sink_tokens([window])
    s = stats[7]
    uniform_sum = sum(1 / (t + 1) for t in range(19, 40))
    assert (s["pairs"], s["occurrences"], s["windows"]) == (21, 1, 1)
    assert s["mean_share"] == s["median_share"] == s["share_q1"] == s["share_q3"] == 0.5
    assert s["share_held"] == 1.0
    assert _close(s["uniform_share"], uniform_sum / 21)
    assert _close(s["lift"], 10.5 / uniform_sum)
    assert 14.0 < s["lift"] < 14.5
    assert reference_detected(stats) == []
    assert reference_detected(stats, min_occurrences=1, min_windows=1) == [7]
    # keys 24..39 are never 16 positions before a query of a 40-token window
    assert sorted(stats) == sorted([7] + [1000 + j for j in range(1, 24) if j != 3])

    p0 = reference_position0([window])
    share_sum = 1 / 17 + 1 / 18 + 1 / 19 + sum(0.5 / t for t in range(19, 40))
    uniform0 = 1 / 17 + 1 / 18 + 1 / 19 + uniform_sum
    assert (p0["pairs"], p0["occurrences"], p0["windows"]) == (24, 1, 1)
    assert _close(p0["mean_share"], share_sum / 24)
    assert _close(p0["median_share"], share_sum / 24)
    assert _close(p0["uniform_share"], uniform0 / 24)
    assert _close(p0["lift"], share_sum / uniform0)


def _final_row(big_t, hot):
    """One final query (t = T - 1) giving 0.5 to each key of ``hot``, the rest uniform."""
    alpha = [0.0] * big_t
    rest = (1.0 - 0.5 * len(hot)) / (big_t - len(hot))
    for j in range(big_t):
        alpha[j] = 0.5 if j in hot else rest
    return {big_t - 1: (alpha, [True] * big_t)}


def test_recurring_separator_is_a_sink_and_a_word_seen_once_is_not():
    """Final queries over six 40-token windows. Token 2 (a separator, BOS-like) sits at
    position 5 of every window and takes 0.5 of the final query in windows 0..4 and
    nothing special in window 5; token 50 (a content word) occurs once, in window 0 at
    position 10, and takes 0.5 there (one final query retrieving it). Every other key
    holds (1 - 0.5 k) / (40 - k), k the number of hot keys of the row (about 0 or 1/78).

    Token 2: 6 occurrences in 6 windows; shares 0.5 x 5 and 1/40 (window 5, a uniform
    row); nearest-rank median (3rd smallest of 6) 0.5, q1 (2nd smallest) 0.5, q3 0.5,
    share_held 5/6, uniform 1/40, lift 20: a sink. Token 50:
    1 occurrence, 1 window: not a sink though its share 0.5 is 20x uniform.
    """
    windows = []
    for w in range(6):
        tokens = [1000 + j for j in range(40)]
        tokens[5] = 2
        hot = {5} if w < 5 else set()
        if w == 0:
            tokens[10] = 50
            hot = {5, 10}
        windows.append({"tokens": tokens, "rows": _final_row(40, hot)})
    stats = reference_sink_tokens(windows)
    sep, word = stats[2], stats[50]
    assert (sep["occurrences"], sep["windows"], sep["pairs"]) == (6, 6, 6)
    assert sep["median_share"] == sep["share_q1"] == sep["share_q3"] == 0.5
    assert _close(sep["share_held"], 5 / 6)
    assert _close(sep["uniform_share"], 1 / 40) and _close(sep["lift"], 20.0)
    assert (word["occurrences"], word["windows"]) == (1, 1)
    assert word["median_share"] == 0.5
    assert reference_detected(stats) == [2]
    assert reference_detected(stats, min_occurrences=7) == []
    assert reference_detected(stats, min_windows=7) == []


def _previous_token_alpha(t):
    """alpha[t-1] = 0.9, the other t keys share 0.1; t = 0 sees only itself."""
    if t == 0:
        return [1.0]
    alpha = [0.1 / t] * (t + 1)
    alpha[t - 1] = 0.9
    return alpha


def test_previous_token_head_has_no_distant_share():
    """A previous-token head gives no counted pair a share >= 0.1.

    40 distinct tokens 1000 + j, causal, alpha[t-1] = 0.9, the other t visible keys
    0.1 / t each (row t = 0 has one visible key: not valid). A counted pair has
    t - j >= 16 and so never is (t, t-1); its alpha is 0.1 / t <= 0.1 / 17 < 0.1
    (t >= 17 for j >= 1). Nothing is detected.

    With min_distance = 1 the pair (39, 38) counts and it is the only pair of key 38:
    mean_share 0.9, uniform 1/40, lift 36.
    """
    tokens = [1000 + j for j in range(40)]
    window = {"tokens": tokens, "rows": _causal_rows(40, _previous_token_alpha)}
    stats = reference_sink_tokens([window])
    assert len(stats) > 0
    for s in stats.values():
        assert s["mean_share"] < 0.1
    assert reference_detected(stats) == []

    near = reference_sink_tokens([window], min_distance=1)
    s = near[1038]
    assert (s["pairs"], s["occurrences"]) == (1, 1)
    assert s["mean_share"] == 0.9
    assert s["uniform_share"] == 1 / 40
    assert _close(s["lift"], 36.0)


def test_bidirectional_key_after_query_counts():
    """With causal=False a key after the query counts when |t - j| >= min_distance.

    T = 6, tokens [1, 2, 3, 4, 9, 5], every key visible (|U| = 6), min_distance 2:

    - t=0: [0.1, 0.1, 0.1, 0.1, 0.5, 0.1] -> pairs with j = 2, 3, 4, 5
      (tokens 3, 4, 9, 5: alphas 0.1, 0.1, 0.5, 0.1)
    - t=3: [0.5, 0.1, 0.1, 0.1, 0.1, 0.1] -> pairs with j = 0 (position 0, 0.5),
      j = 1 (token 2, 0.1), j = 5 (token 5, 0.1); j = 2, 4 are 1 away, j = 3 is 0

    Token 9: 1 pair, mean 0.5, uniform 1/6, lift 3. Token 5: 2 pairs, one occurrence,
    mean 0.1, uniform 1/6, lift 0.2 / (2/6) = 0.6. Position 0: 1 pair (t=3), mean
    0.5, lift 3.

    With causal=True the same rows give t - j < 0 for every key after the query:
    token 9 (after t=0, one before t=3) has no pair; only t=3's keys 0 and 1 count.
    """
    everything = [True] * 6
    window = {
        "tokens": [1, 2, 3, 4, 9, 5],
        "rows": {
            0: ([0.1, 0.1, 0.1, 0.1, 0.5, 0.1], everything),
            3: ([0.5, 0.1, 0.1, 0.1, 0.1, 0.1], everything),
        },
    }
    stats = reference_sink_tokens([window], min_distance=2, causal=False)
    assert sorted(stats) == [2, 3, 4, 5, 9]
    assert (stats[9]["pairs"], stats[9]["occurrences"]) == (1, 1)
    assert stats[9]["mean_share"] == 0.5
    assert _close(stats[9]["uniform_share"], 1 / 6)
    assert _close(stats[9]["lift"], 3.0)
    assert (stats[5]["pairs"], stats[5]["occurrences"]) == (2, 1)
    assert _close(stats[5]["mean_share"], 0.1)
    assert _close(stats[5]["lift"], 0.6)
    p0 = reference_position0([window], min_distance=2, causal=False)
    assert (p0["pairs"], p0["occurrences"]) == (1, 1)
    assert _close(p0["lift"], 3.0)

    causal = reference_sink_tokens([window], min_distance=2, causal=True)
    assert sorted(causal) == [2]
    assert reference_position0([window], min_distance=2, causal=True)["pairs"] == 1


def test_occurrences_windows_and_invalid_rows():
    """Occurrences across windows; invalid rows drop; position 0 counts per window.

    min_distance 2, causal.

    - W0 tokens [0, 7, 1, 7, 1]:
      t=3 [0.25, 0.25, 0.25, 0.25] (|U| 4): pairs j=0 (0.25), j=1 (token 7, 0.25);
      t=4 [0.2] * 5 (|U| 5): pairs j=0, j=1 (token 7), j=2 (token 1), each 0.2.
      (Key 3, also token 7, would need t >= 5: no pair.)
    - W1 tokens [0, 1, 7, 1, 1]:
      t=0 one visible key -> invalid; t=2 [nan, 0.5, 0.5] -> invalid;
      t=3 [0.4, 0.2, 0.2, 0.2, inf] with key 4 invisible (|U| 4) -> valid:
      j=0 (0.4), j=1 (token 1, 0.2);
      t=4 [0.1, 0.1, 0.6, 0.1, 0.1] (|U| 5): j=0 (0.1), j=1 (token 1, 0.1),
      j=2 (token 7, 0.6).

    Token 7: pairs 3 ((W0,1) twice, (W1,2)), occurrences 2 in 2 windows, share 0.25 +
    0.2 + 0.6 = 1.05, mean 0.35, uniform 1/4 + 1/5 + 1/5 = 0.65 (mean 0.65 / 3);
    occurrence shares (W0,1) (0.25 + 0.2) / 2 = 0.225 and (W1,2) 0.6: nearest-rank
    median and q1 (1st of 2) 0.225, q3 (2nd) 0.6, lift 0.225 / (0.65 / 3) = 27/26.
    Token 1: pairs 3, occurrences 2 ((W0,2), (W1,1)), share 0.2 + 0.2 + 0.1 = 0.5,
    mean 1/6, uniform 0.65; occurrence shares 0.2 and (0.2 + 0.1) / 2 = 0.15: median
    0.15, q3 0.2, lift 0.15 / (0.65 / 3) = 9/13. Token 0 is only ever at position 0:
    absent. Position 0: pairs 4, occurrences 2, share 0.25 + 0.2 + 0.4 + 0.1 = 0.95,
    mean 0.2375, uniform 1/4 + 1/5 + 1/4 + 1/5 = 0.9, uniform mean 0.225; occurrence
    shares W0 0.225, W1 0.25: median 0.225, lift 1.
    """
    w0 = {
        "tokens": [0, 7, 1, 7, 1],
        "rows": {
            3: ([0.25, 0.25, 0.25, 0.25, 0.0], [True, True, True, True, False]),
            4: ([0.2] * 5, [True] * 5),
        },
    }
    w1 = {
        "tokens": [0, 1, 7, 1, 1],
        "rows": {
            0: ([1.0, 0.0, 0.0, 0.0, 0.0], [True, False, False, False, False]),
            2: ([math.nan, 0.5, 0.5, 0.0, 0.0], [True, True, True, False, False]),
            3: ([0.4, 0.2, 0.2, 0.2, math.inf], [True, True, True, True, False]),
            4: ([0.1, 0.1, 0.6, 0.1, 0.1], [True] * 5),
        },
    }
    stats = reference_sink_tokens([w0, w1], min_distance=2)
    assert sorted(stats) == [1, 7]
    s7 = stats[7]
    assert (s7["pairs"], s7["occurrences"], s7["windows"]) == (3, 2, 2)
    assert _close(s7["mean_share"], 0.35)
    assert _close(s7["uniform_share"], 0.65 / 3)
    assert _close(s7["median_share"], 0.225) and _close(s7["share_q1"], 0.225)
    assert _close(s7["share_q3"], 0.6)
    assert _close(s7["lift"], 27 / 26)
    s1 = stats[1]
    assert (s1["pairs"], s1["occurrences"], s1["windows"]) == (3, 2, 2)
    assert _close(s1["mean_share"], 1 / 6)
    assert _close(s1["median_share"], 0.15) and _close(s1["share_q3"], 0.2)
    assert _close(s1["lift"], 9 / 13)
    p0 = reference_position0([w0, w1], min_distance=2)
    assert (p0["pairs"], p0["occurrences"], p0["windows"]) == (4, 2, 2)
    assert _close(p0["mean_share"], 0.2375)
    assert _close(p0["uniform_share"], 0.225)
    assert _close(p0["median_share"], 0.225)
    assert _close(p0["lift"], 1.0)


def test_no_pairs_and_detection_thresholds():
    """No counted pair -> empty stats and position 0 None; thresholds are inclusive.

    A 3-token window with min_distance 16 has no pair at all. For the thresholds (each
    entry: median, uniform, occurrences, windows): token 5 (0.1, 0.02, 5, 3) is in
    (share, occurrences and windows met with equality), token 1 (5/16,
    1/16, 9, 9) is in (lift exactly 5), token 6 (0.09, 0.001, 9, 9) is out (share),
    token 2 (0.5, 0.11, 9, 9) out (lift), token 3 (0.5, 0.01, 4, 4) out (occurrences),
    token 4 (0.5, 0.01, 9, 2) out (windows) -> [1, 5].
    """
    window = {"tokens": [4, 5, 6], "rows": _causal_rows(3, lambda t: [1.0 / (t + 1)] * (t + 1))}
    assert reference_sink_tokens([window]) == {}
    assert reference_position0([window]) is None

    def entry(median, uniform, occurrences, windows):
        return {"median_share": median, "uniform_share": uniform,
                "occurrences": occurrences, "windows": windows}

    stats = {5: entry(0.1, 0.02, 5, 3), 1: entry(5 / 16, 1 / 16, 9, 9),
             6: entry(0.09, 0.001, 9, 9), 2: entry(0.5, 0.11, 9, 9),
             3: entry(0.5, 0.01, 4, 4), 4: entry(0.5, 0.01, 9, 2)}
    assert reference_detected(stats) == [1, 5]
    assert reference_detected(stats, min_share=0.0, min_lift=0.0, min_occurrences=1,
                              min_windows=1) == [1, 2, 3, 4, 5, 6]
    assert nearest_rank([3, 1, 2, 4], Fraction(1, 2)) == 2
    assert nearest_rank([3, 1, 2], Fraction(1, 2)) == 2
    assert nearest_rank([3, 1, 2, 4, 5], Fraction(1, 4)) == 2
    assert nearest_rank([7], Fraction(1, 4)) == 7

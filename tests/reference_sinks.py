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
    return {"pairs": 0, "occurrences": set(), "share_sum": Fraction(0), "uniform_sum": Fraction(0)}


def _add_pair(acc, w, j, alpha_tj, n_visible):
    """Add one counted pair: one more pair, its key occurrence, alpha and 1 / |U_t|."""
    acc["pairs"] += 1
    acc["occurrences"].add((w, j))
    acc["share_sum"] += Fraction(alpha_tj)
    acc["uniform_sum"] += Fraction(1, n_visible)


def _finish(acc):
    """pairs, occurrences, mean_share = share_sum / pairs, uniform_share, lift."""
    pairs = acc["pairs"]
    return {
        "pairs": pairs,
        "occurrences": len(acc["occurrences"]),
        "mean_share": float(acc["share_sum"] / pairs),
        "uniform_share": float(acc["uniform_sum"] / pairs),
        "lift": float(acc["share_sum"] / acc["uniform_sum"]),
    }


def reference_sink_tokens(windows, *, min_distance=16, causal=True):
    """SPEC 3 "other sinks by token identity" for one head.

    For each token id x, over the counted pairs whose key ``j >= 1`` holds x
    (``tokens[j] == x``): ``pairs`` (how many), ``occurrences`` (distinct
    ``(window index, j)`` keys of x with at least one counted pair), ``mean_share``
    (sum of ``alpha_t[j]`` / pairs), ``uniform_share`` (sum of ``1 / |U_t|`` / pairs)
    and ``lift`` (sum of alphas / sum of uniform weights).

    Returns ``{token_id: {"pairs", "occurrences", "mean_share", "uniform_share",
    "lift"}}`` for the tokens with at least one counted pair.
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
        stats[token] = _finish(accumulators[token])
    return stats


def reference_detected(stats, *, min_share=0.1, min_lift=5.0):
    """Sorted token ids with ``mean_share >= min_share`` and ``lift >= min_lift``."""
    detected = []
    for token, s in stats.items():
        if s["mean_share"] >= min_share and s["lift"] >= min_lift:
            detected.append(token)
    return sorted(detected)


def reference_position0(windows, *, min_distance=16, causal=True):
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
    return _finish(acc)


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


def test_planted_token_is_detected():
    """A token planted at position 3 of a 40-token window is detected.

    Tokens: 1000 + j at every position j except tokens[3] = 7. Causal rows
    t = 0..39; for t >= 19, alpha[3] = 0.5 and the other t visible keys share
    0.5 (0.5 / t each); for t < 19 the row is uniform 1 / (t + 1).

    Key 3 counts from queries with t - 3 >= 16, i.e. t = 19..39: 21 pairs, one
    occurrence, share_sum = 21 * 0.5 = 10.5, mean_share 0.5, uniform_sum =
    sum_{t=19}^{39} 1/(t+1) = 1/20 + ... + 1/40 (about 0.7309), so lift about 14.4
    >= 5: detected. Every other key j gets at most 0.5 / t <= 0.5 / 19 < 0.1 from a
    t >= 19 query and 1/(t+1) <= 1/17 from t = 16..18, so it is not detected.

    Position 0 counts from t = 16..39: 24 pairs, one occurrence, alphas 1/17,
    1/18, 1/19 (t = 16, 17, 18) and 0.5/t (t = 19..39).
    """
    tokens = [1000 + j for j in range(40)]
    tokens[3] = 7
    window = {"tokens": tokens, "rows": _causal_rows(40, _planted_alpha)}
    stats = reference_sink_tokens([window])
    s = stats[7]
    uniform_sum = sum(1 / (t + 1) for t in range(19, 40))
    assert (s["pairs"], s["occurrences"]) == (21, 1)
    assert s["mean_share"] == 0.5
    assert _close(s["uniform_share"], uniform_sum / 21)
    assert _close(s["lift"], 10.5 / uniform_sum)
    assert 14.0 < s["lift"] < 14.5
    assert reference_detected(stats) == [7]
    # keys 24..39 are never 16 positions before a query of a 40-token window
    assert sorted(stats) == sorted([7] + [1000 + j for j in range(1, 24) if j != 3])

    p0 = reference_position0([window])
    share_sum = 1 / 17 + 1 / 18 + 1 / 19 + sum(0.5 / t for t in range(19, 40))
    uniform0 = 1 / 17 + 1 / 18 + 1 / 19 + uniform_sum
    assert (p0["pairs"], p0["occurrences"]) == (24, 1)
    assert _close(p0["mean_share"], share_sum / 24)
    assert _close(p0["uniform_share"], uniform0 / 24)
    assert _close(p0["lift"], share_sum / uniform0)


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

    Token 7: pairs 3 ((W0,1) twice, (W1,2)), occurrences 2, share 0.25 + 0.2 + 0.6
    = 1.05, mean 0.35, uniform 1/4 + 1/5 + 1/5 = 0.65, lift 1.05 / 0.65 = 21/13.
    Token 1: pairs 3, occurrences 2 ((W0,2), (W1,1)), share 0.2 + 0.2 + 0.1 = 0.5,
    mean 1/6, uniform 0.65, lift 10/13. Token 0 is only ever at position 0: absent.
    Position 0: pairs 4, occurrences 2, share 0.25 + 0.2 + 0.4 + 0.1 = 0.95, mean
    0.2375, uniform 1/4 + 1/5 + 1/4 + 1/5 = 0.9, uniform mean 0.225, lift 19/18.
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
    assert (s7["pairs"], s7["occurrences"]) == (3, 2)
    assert _close(s7["mean_share"], 0.35)
    assert _close(s7["uniform_share"], 0.65 / 3)
    assert _close(s7["lift"], 21 / 13)
    s1 = stats[1]
    assert (s1["pairs"], s1["occurrences"]) == (3, 2)
    assert _close(s1["mean_share"], 1 / 6)
    assert _close(s1["lift"], 10 / 13)
    p0 = reference_position0([w0, w1], min_distance=2)
    assert (p0["pairs"], p0["occurrences"]) == (4, 2)
    assert _close(p0["mean_share"], 0.2375)
    assert _close(p0["uniform_share"], 0.225)
    assert _close(p0["lift"], 19 / 18)


def test_no_pairs_and_detection_thresholds():
    """No counted pair -> empty stats and position 0 None; thresholds are inclusive.

    A 3-token window with min_distance 16 has no pair at all. For the thresholds:
    token 5 (mean 0.1, lift 5.0) is in (both bounds inclusive), token 6 (0.09, 10)
    and token 2 (0.5, 4.9) are out, token 1 (0.3, 6) is in -> [1, 5].
    """
    window = {"tokens": [4, 5, 6], "rows": _causal_rows(3, lambda t: [1.0 / (t + 1)] * (t + 1))}
    assert reference_sink_tokens([window]) == {}
    assert reference_position0([window]) is None

    def entry(mean_share, lift):
        return {
            "pairs": 1,
            "occurrences": 1,
            "mean_share": mean_share,
            "uniform_share": 0.0,
            "lift": lift,
        }

    stats = {5: entry(0.1, 5.0), 6: entry(0.09, 10.0), 2: entry(0.5, 4.9), 1: entry(0.3, 6.0)}
    assert reference_detected(stats) == [1, 5]
    assert reference_detected(stats, min_share=0.0, min_lift=0.0) == [1, 2, 5, 6]

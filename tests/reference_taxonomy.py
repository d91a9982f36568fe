"""Slow reference for the head taxonomy (SPEC 4), written from the definition.

Everything here is a plain loop over windows, query rows and keys, with no shared
work and no shortcuts, so that a fast vectorised implementation can be compared
with it on generated inputs. Standard library only.

Input: the windows of ONE attention head. Each window is a dict

- ``"T"``: the window length (positions ``0 .. T-1``),
- ``"norms"``: ``T`` floats, the value norms ``||v_j||`` of the head's kv head,
- ``"rows"``: ``{t: (alpha, visible)}`` with ``alpha`` the ``T`` attention
  probabilities of query ``t`` and ``visible`` the ``T`` bools saying which keys
  query ``t`` may see.

Definitions (SPEC 4), one helper each:

- counted queries (``_is_counted``): ``t >= 1``, at least one visible key, all
  visible alphas finite, and for ``counted="half"`` also ``2 * t >= T``;
- the winner (``_winner``): argmax over visible ``j`` of
  ``float(alpha[j]) * float(norms[j])``, ties to the smaller ``j``;
- the class (``_classify``): ``"self"`` if ``w == t``, else ``"sink"`` if ``w == 0``,
  else ``"other"``;
- the counts of a window (``_window_counts``): ``n``, the class counts, and for the
  other-winners the offset counts ``c_off[t - w]`` and position counts ``c_pos[w]``;
- ``n_top = max(max c_off, max c_pos)`` (``_n_top``);
- the regime (``_regime``) from the scores ``(n_self, n_sink, n_top)`` (rule
  ``"single"``) or ``(n_self, n_sink, n_other)`` (rule ``"lumped"``);
- the most frequent other source (``_top_source``);
- label stability over explicit resamples of window indices (``_stability``).

Non-finite value norms at a visible key of a counted row have no defined winner;
the reference raises ``ValueError`` rather than guess.
"""

from __future__ import annotations

import math

NAN = float("nan")
COUNTED = ("final", "half")
RULES = ("single", "lumped")
RETRIEVER = "Retriever"
MIXER = "Mixer"
RESET = "Reset"
NONE = "none"


def _check_row(window, t, alpha, visible):
    """Check the shape of one row: ``0 <= t < T`` and ``T`` alphas and ``T`` flags."""
    big_t = window["T"]
    if t < 0 or t >= big_t:
        raise ValueError(f"query position {t} outside the window of length {big_t}")
    if len(alpha) != big_t:
        raise ValueError(f"row {t}: {len(alpha)} alphas for a window of length {big_t}")
    if len(visible) != big_t:
        raise ValueError(f"row {t}: {len(visible)} flags for a window of length {big_t}")


def _is_counted(big_t, t, alpha, visible, counted):
    """SPEC 4 counted queries.

    ``counted="final"``: every given row may count; ``counted="half"``: only rows
    with ``t >= T/2``, i.e. ``2 * t >= T``. In both cases the row must also have
    ``t >= 1``, at least one visible key, and a finite alpha at every visible key.
    """
    if counted == "half" and 2 * t < big_t:
        return False
    if t < 1:
        return False
    n_visible = 0
    for j in range(big_t):
        if not visible[j]:
            continue
        n_visible += 1
        if not math.isfinite(float(alpha[j])):
            return False
    return n_visible >= 1


def _winner(alpha, visible, norms):
    """SPEC 4 winner: argmax over visible ``j`` of ``alpha[j] * norms[j]``.

    The products are Python floats ``float(alpha[j]) * float(norms[j])``. The scan
    goes from ``j = 0`` upwards and only a strictly larger product replaces the
    best so far, so ties go to the smaller ``j``.
    """
    best_j = None
    best_product = None
    for j in range(len(alpha)):
        if not visible[j]:
            continue
        norm = float(norms[j])
        if not math.isfinite(norm):
            raise ValueError(f"non-finite value norm at visible key {j}")
        product = float(alpha[j]) * norm
        if best_j is None or product > best_product:
            best_j = j
            best_product = product
    return best_j


def _classify(t, w):
    """SPEC 4 class: ``"self"`` if ``w == t``, else ``"sink"`` if ``w == 0``, else ``"other"``.

    ``self`` is tested first, so it would win over ``sink`` at ``t == 0`` (which
    never counts anyway).
    """
    if w == t:
        return "self"
    if w == 0:
        return "sink"
    return "other"


def _empty_counts():
    """Counts of no query at all."""
    return {
        "n": 0,
        "n_self": 0,
        "n_sink": 0,
        "n_other": 0,
        "offsets": {},
        "positions": {},
    }


def _window_counts(window, counted):
    """The SPEC 4 counts of one window.

    ``n`` counted queries, the three class counts, and for the other-winners
    ``offsets[o]`` = how many have ``t - w == o`` and ``positions[p]`` = how many
    have ``w == p``.
    """
    counts = _empty_counts()
    big_t = window["T"]
    norms = window["norms"]
    if len(norms) != big_t:
        raise ValueError(f"{len(norms)} norms for a window of length {big_t}")
    for t in sorted(window["rows"]):
        alpha, visible = window["rows"][t]
        _check_row(window, t, alpha, visible)
        if not _is_counted(big_t, t, alpha, visible, counted):
            continue
        w = _winner(alpha, visible, norms)
        kind = _classify(t, w)
        counts["n"] += 1
        if kind == "self":
            counts["n_self"] += 1
        elif kind == "sink":
            counts["n_sink"] += 1
        else:
            counts["n_other"] += 1
            offset = t - w
            counts["offsets"][offset] = counts["offsets"].get(offset, 0) + 1
            counts["positions"][w] = counts["positions"].get(w, 0) + 1
    return counts


def _sum_counts(count_list):
    """Add up window counts; a window listed twice is added twice."""
    total = _empty_counts()
    for counts in count_list:
        total["n"] += counts["n"]
        total["n_self"] += counts["n_self"]
        total["n_sink"] += counts["n_sink"]
        total["n_other"] += counts["n_other"]
        for offset, c in counts["offsets"].items():
            total["offsets"][offset] = total["offsets"].get(offset, 0) + c
        for position, c in counts["positions"].items():
            total["positions"][position] = total["positions"].get(position, 0) + c
    return total


def _n_top(counts):
    """SPEC 4: ``n_top = max(max offset count, max position count)``, 0 without others."""
    max_offset = max(counts["offsets"].values(), default=0)
    max_position = max(counts["positions"].values(), default=0)
    return max(max_offset, max_position)


def _scores(counts, rule):
    """The three regime scores: ``(n_self, n_sink, n_top)`` or ``(n_self, n_sink, n_other)``."""
    third = _n_top(counts) if rule == "single" else counts["n_other"]
    return (counts["n_self"], counts["n_sink"], third)


def _regime(counts, rule):
    """SPEC 4 regime and the index of the winning score.

    Retriever if ``s_self >= s_sink`` and ``s_self >= s_third``; else Mixer if
    ``s_sink >= s_third``; else Reset. ``"none"`` (index ``None``) when ``n == 0``.
    """
    if counts["n"] == 0:
        return NONE, None
    s_self, s_sink, s_third = _scores(counts, rule)
    if s_self >= s_sink and s_self >= s_third:
        return RETRIEVER, 0
    if s_sink >= s_third:
        return MIXER, 1
    return RESET, 2


def _top_source(counts):
    """SPEC 4 most frequent other source: ``(kind, source, count)``.

    If the largest offset count is at least the largest position count, the source
    is ``("offset", o*)``, o* the offset with the largest count, ties to the
    smallest ``|o|`` and then the smaller ``o``; otherwise ``("position", p*)``, ties
    to the smaller ``p``. ``("none", -1, 0)`` without other winners.
    """
    if counts["n_other"] == 0:
        return NONE, -1, 0
    # the best offset has the smallest key (-count, |o|, o): the largest count,
    # then the smallest |o|, then the smaller o
    offset_keys = []
    for offset, c in counts["offsets"].items():
        offset_keys.append((-c, abs(offset), offset))
    best_offset = min(offset_keys)[2]
    # the best position has the smallest key (-count, p)
    position_keys = []
    for position, c in counts["positions"].items():
        position_keys.append((-c, position))
    best_position = min(position_keys)[1]
    offset_count = counts["offsets"][best_offset]
    position_count = counts["positions"][best_position]
    if offset_count >= position_count:
        return "offset", best_offset, offset_count
    return "position", best_position, position_count


def _stability(per_window, resamples, full_regime, rule):
    """SPEC 4 label stability.

    For each resample (a list of window indices, repetition allowed) the counts of
    the listed windows are summed and the regime is recomputed from the sums
    (``n_top`` from the summed offset and position counts). The stability is the
    share of resamples whose regime equals ``full_regime``; NaN without resamples
    or when ``full_regime`` is ``"none"``. A resample with no counted query has
    regime ``"none"`` and so never matches.
    """
    resamples = list(resamples)
    if len(resamples) == 0 or full_regime == NONE:
        return NAN
    matches = 0
    for resample in resamples:
        chosen = []
        for index in resample:
            index = int(index)
            if index < 0 or index >= len(per_window):
                raise ValueError(f"resample index {index} outside 0..{len(per_window) - 1}")
            chosen.append(per_window[index])
        summed = _sum_counts(chosen)
        regime, _ = _regime(summed, rule)
        if regime == full_regime:
            matches += 1
    return matches / len(resamples)


def reference_head_taxonomy(windows, *, causal=True, counted="final", rule="single", resamples=()):
    """SPEC 4 taxonomy of one head, from the definition.

    ``causal`` does not change anything: visibility comes from each row's
    ``visible`` flags, and offsets ``t - w`` may be negative only when a row sees
    keys after the query (a bidirectional model). It is accepted so that the call
    matches the fast path.

    Returns a dict with ``n_queries, n_self, n_sink, n_other, n_top`` (ints),
    ``f_self, f_sink, f_other`` (counts / n), ``regime`` (``"Retriever"``,
    ``"Mixer"``, ``"Reset"`` or ``"none"``), ``winning_share`` and
    ``runner_up_share`` (the winning and the second largest score over n),
    ``top_source_kind`` (``"offset"``, ``"position"`` or ``"none"``), ``top_source``
    (int, -1 for none), ``top_source_share`` (its count / n) and ``stability``.
    Shares are NaN when n == 0.
    """
    del causal
    if counted not in COUNTED:
        raise ValueError(f"counted must be one of {COUNTED}, got {counted!r}")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")

    per_window = []
    for window in windows:
        per_window.append(_window_counts(window, counted))
    total = _sum_counts(per_window)

    n = total["n"]
    n_top = _n_top(total)
    regime, win_index = _regime(total, rule)
    kind, source, source_count = _top_source(total)

    if n == 0:
        f_self = NAN
        f_sink = NAN
        f_other = NAN
        winning_share = NAN
        runner_up_share = NAN
        top_source_share = NAN
    else:
        f_self = total["n_self"] / n
        f_sink = total["n_sink"] / n
        f_other = total["n_other"] / n
        scores = _scores(total, rule)
        winning_share = scores[win_index] / n
        others = []
        for i in range(3):
            if i != win_index:
                others.append(scores[i])
        runner_up_share = max(others) / n
        top_source_share = source_count / n

    stability = _stability(per_window, resamples, regime, rule)

    return {
        "n_queries": n,
        "n_self": total["n_self"],
        "n_sink": total["n_sink"],
        "n_other": total["n_other"],
        "n_top": n_top,
        "f_self": f_self,
        "f_sink": f_sink,
        "f_other": f_other,
        "regime": regime,
        "winning_share": winning_share,
        "runner_up_share": runner_up_share,
        "top_source_kind": kind,
        "top_source": source,
        "top_source_share": top_source_share,
        "stability": stability,
    }


# ---------------------------------------------------------------------------
# Hand-worked golden checks
# ---------------------------------------------------------------------------


def _causal_window(big_t, alphas, norms=None):
    """A causal window: ``alphas`` maps ``t`` to a list of ``t + 1`` alphas (keys 0..t).

    The alphas are padded with zeros to length ``T``; ``visible[j] = j <= t``.
    Norms default to all 1.0.
    """
    if norms is None:
        norms = [1.0] * big_t
    rows = {}
    for t, head in alphas.items():
        alpha = list(head) + [0.0] * (big_t - len(head))
        visible = [j <= t for j in range(big_t)]
        rows[t] = (alpha, visible)
    return {"T": big_t, "norms": list(norms), "rows": rows}


def _approx(a, b):
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-12)


def test_previous_token_head_is_reset():
    """Previous-token head: every counted winner is ``t - 1``.

    T = 6, norms all 1. Rows (keys 0..t):

    - t=0: [1.0]                         -> ignored (t < 1)
    - t=2: [0.2, 0.7, 0.1]               -> w=1, other, offset 1, position 1
    - t=3: [0.1, 0.1, 0.7, 0.1]          -> w=2, other, offset 1, position 2
    - t=4: [0.1, 0.05, 0.05, 0.7, 0.1]   -> w=3, other, offset 1, position 3
    - t=5: [0.1, 0.05, 0.05, 0.0, 0.7, 0.1] -> w=4, other, offset 1, position 4

    n = 4, n_self = n_sink = 0, n_other = 4; c_off = {1: 4}, c_pos = {1..4: 1},
    so n_top = 4. Single scores (0, 0, 4): 0 >= 0 but 0 < 4, and 0 < 4 -> Reset,
    winning share 4/4 = 1, runner-up max(0, 0)/4 = 0. Top source: max offset
    count 4 >= max position count 1 -> ("offset", 1), share 4/4. Lumped scores
    (0, 0, 4): Reset too.
    """
    window = _causal_window(
        6,
        {
            0: [1.0],
            2: [0.2, 0.7, 0.1],
            3: [0.1, 0.1, 0.7, 0.1],
            4: [0.1, 0.05, 0.05, 0.7, 0.1],
            5: [0.1, 0.05, 0.05, 0.0, 0.7, 0.1],
        },
    )
    out = reference_head_taxonomy([window])
    assert out["n_queries"] == 4
    assert (out["n_self"], out["n_sink"], out["n_other"], out["n_top"]) == (0, 0, 4, 4)
    assert out["regime"] == RESET
    assert out["winning_share"] == 1.0
    assert out["runner_up_share"] == 0.0
    assert (out["top_source_kind"], out["top_source"]) == ("offset", 1)
    assert out["top_source_share"] == 1.0
    assert (out["f_self"], out["f_sink"], out["f_other"]) == (0.0, 0.0, 1.0)
    assert math.isnan(out["stability"])
    assert reference_head_taxonomy([window], rule="lumped")["regime"] == RESET


def test_self_sink_tie_is_retriever():
    """A tie between n_self and n_sink goes to Retriever; a tie of products goes to smaller j.

    T = 5, norms all 1:

    - t=1: [0.3, 0.7]                 -> w=1 = t, self
    - t=2: [0.4, 0.4, 0.2]            -> products tie at j=0 and j=1 -> w=0, sink
    - t=3: [0.1, 0.1, 0.1, 0.7]       -> w=3, self
    - t=4: [0.5, 0.1, 0.1, 0.1, 0.2]  -> w=0, sink

    n = 4, n_self = 2, n_sink = 2, n_other = 0, n_top = 0. Scores (2, 2, 0):
    2 >= 2 and 2 >= 0 -> Retriever, winning 2/4, runner-up max(2, 0)/4 = 0.5.
    No other winner: top source ("none", -1), share 0.0.
    """
    window = _causal_window(
        5,
        {
            1: [0.3, 0.7],
            2: [0.4, 0.4, 0.2],
            3: [0.1, 0.1, 0.1, 0.7],
            4: [0.5, 0.1, 0.1, 0.1, 0.2],
        },
    )
    out = reference_head_taxonomy([window])
    assert (out["n_queries"], out["n_self"], out["n_sink"], out["n_other"]) == (4, 2, 2, 0)
    assert out["n_top"] == 0
    assert out["regime"] == RETRIEVER
    assert out["winning_share"] == 0.5
    assert out["runner_up_share"] == 0.5
    assert (out["top_source_kind"], out["top_source"], out["top_source_share"]) == (
        "none",
        -1,
        0.0,
    )


def test_sink_head_is_mixer_and_norms_decide():
    """Sink head -> Mixer; the value norms, not alpha alone, pick the winner.

    T = 5, norms [2, 1, 1, 1, 1]; products alpha[j] * norms[j]:

    - t=1: [0.9, 0.1]                -> products [1.8, 0.1]         -> w=0, sink
    - t=2: [0.7, 0.1, 0.2]           -> [1.4, 0.1, 0.2]             -> w=0, sink
    - t=3: [0.2, 0.6, 0.1, 0.1]      -> [0.4, 0.6, 0.1, 0.1]        -> w=1, other,
      offset 2, position 1
    - t=4: [0.3, 0.4, 0.1, 0.1, 0.1] -> [0.6, 0.4, 0.1, 0.1, 0.1]   -> w=0, sink
      (alpha alone would pick j=1)

    n = 4, (n_self, n_sink, n_other) = (0, 3, 1), c_off = {2: 1}, c_pos = {1: 1},
    n_top = 1. Scores (0, 3, 1): 0 < 3 -> not Retriever; 3 >= 1 -> Mixer, winning
    3/4, runner-up max(0, 1)/4 = 0.25. Top source: 1 >= 1 -> ("offset", 2), 1/4.
    """
    window = _causal_window(
        5,
        {
            1: [0.9, 0.1],
            2: [0.7, 0.1, 0.2],
            3: [0.2, 0.6, 0.1, 0.1],
            4: [0.3, 0.4, 0.1, 0.1, 0.1],
        },
        norms=[2.0, 1.0, 1.0, 1.0, 1.0],
    )
    out = reference_head_taxonomy([window])
    assert (out["n_queries"], out["n_self"], out["n_sink"], out["n_other"]) == (4, 0, 3, 1)
    assert out["n_top"] == 1
    assert out["regime"] == MIXER
    assert out["winning_share"] == 0.75
    assert out["runner_up_share"] == 0.25
    assert (out["top_source_kind"], out["top_source"]) == ("offset", 2)
    assert out["top_source_share"] == 0.25


def test_half_counting_drops_early_rows():
    """``counted="half"`` keeps only rows with 2t >= T.

    T = 6, norms all 1:

    - t=1: [0.2, 0.8]                          -> self
    - t=2: [0.1, 0.1, 0.8]                     -> self
    - t=3: [0.7, 0.1, 0.1, 0.1]                -> sink
    - t=4: [0.6, 0.1, 0.1, 0.1, 0.1]           -> sink
    - t=5: [0.1, 0.1, 0.1, 0.6, 0.05, 0.05]    -> w=3, other, offset 2

    final: n = 5, (2, 2, 1), n_top = 1 -> scores (2, 2, 1) -> Retriever.
    half: 2t >= 6 keeps t = 3, 4, 5: n = 3, (0, 2, 1), n_top = 1 -> Mixer, winning
    2/3, runner-up 1/3, top source ("offset", 2) with share 1/3.

    Odd T = 5: 2t >= 5 keeps t >= 3, so of rows t = 2 (self) and t = 3 (sink) only
    t = 3 counts: n = 1, Mixer.
    """
    window = _causal_window(
        6,
        {
            1: [0.2, 0.8],
            2: [0.1, 0.1, 0.8],
            3: [0.7, 0.1, 0.1, 0.1],
            4: [0.6, 0.1, 0.1, 0.1, 0.1],
            5: [0.1, 0.1, 0.1, 0.6, 0.05, 0.05],
        },
    )
    final = reference_head_taxonomy([window], counted="final")
    assert (final["n_queries"], final["n_self"], final["n_sink"], final["n_other"]) == (
        5,
        2,
        2,
        1,
    )
    assert final["regime"] == RETRIEVER
    half = reference_head_taxonomy([window], counted="half")
    assert (half["n_queries"], half["n_self"], half["n_sink"], half["n_other"]) == (3, 0, 2, 1)
    assert half["regime"] == MIXER
    assert _approx(half["winning_share"], 2 / 3)
    assert _approx(half["runner_up_share"], 1 / 3)
    assert (half["top_source_kind"], half["top_source"]) == ("offset", 2)
    assert _approx(half["top_source_share"], 1 / 3)

    odd = _causal_window(5, {2: [0.1, 0.1, 0.8], 3: [0.7, 0.1, 0.1, 0.1]})
    out = reference_head_taxonomy([odd], counted="half")
    assert (out["n_queries"], out["n_sink"], out["regime"]) == (1, 1, MIXER)


def test_single_and_lumped_differ_and_offset_ties():
    """Scattered other-winners: small n_top, large n_other.

    T = 8, norms all 1:

    - t=1: [0.1, 0.9]                                        -> self
    - t=2: [0.1, 0.1, 0.8]                                   -> self
    - t=4: [0.1, 0.1, 0.5, 0.1, 0.2]                         -> w=2, offset 2, position 2
    - t=5: [0.1, 0.5, 0.1, 0.1, 0.1, 0.1]                    -> w=1, offset 4, position 1
    - t=7: [0.05, 0.05, 0.05, 0.05, 0.5, 0.1, 0.1, 0.1]      -> w=4, offset 3, position 4

    n = 5, (2, 0, 3); every offset and position count is 1, so n_top = 1.
    single (2, 0, 1): Retriever, winning 2/5, runner-up 1/5.
    lumped (2, 0, 3): 2 < 3 and 0 < 3 -> Reset, winning 3/5, runner-up 2/5.
    Top source: offset counts tie at 1 -> smallest |o| = 2 -> ("offset", 2), 1/5.
    """
    window = _causal_window(
        8,
        {
            1: [0.1, 0.9],
            2: [0.1, 0.1, 0.8],
            4: [0.1, 0.1, 0.5, 0.1, 0.2],
            5: [0.1, 0.5, 0.1, 0.1, 0.1, 0.1],
            7: [0.05, 0.05, 0.05, 0.05, 0.5, 0.1, 0.1, 0.1],
        },
    )
    single = reference_head_taxonomy([window], rule="single")
    assert (single["n_self"], single["n_sink"], single["n_other"], single["n_top"]) == (
        2,
        0,
        3,
        1,
    )
    assert single["regime"] == RETRIEVER
    assert _approx(single["winning_share"], 0.4)
    assert _approx(single["runner_up_share"], 0.2)
    assert (single["top_source_kind"], single["top_source"]) == ("offset", 2)
    assert _approx(single["top_source_share"], 0.2)
    lumped = reference_head_taxonomy([window], rule="lumped")
    assert lumped["regime"] == RESET
    assert lumped["n_top"] == 1
    assert _approx(lumped["winning_share"], 0.6)
    assert _approx(lumped["runner_up_share"], 0.4)


def test_position_source_and_bidirectional_offsets():
    """A fixed position wins the source; negative offsets tie-break by |o| then o.

    Causal, T = 6, norms all 1:

    - t=2: [0.1, 0.2, 0.7]                       -> self
    - t=3: [0.1, 0.6, 0.1, 0.2]                  -> w=1, offset 2
    - t=4: [0.1, 0.5, 0.1, 0.1, 0.2]             -> w=1, offset 3
    - t=5: [0.1, 0.4, 0.1, 0.1, 0.1, 0.2]        -> w=1, offset 4

    c_off = {2: 1, 3: 1, 4: 1} (max 1), c_pos = {1: 3} (max 3): 1 < 3 ->
    ("position", 1), share 3/4; n_top = 3; scores (1, 0, 3) -> Reset.

    Bidirectional, T = 6, every key visible, norms all 1:

    - t=3: [0.1, 0.1, 0.1, 0.1, 0.1, 0.5] -> w=5, offset -2, position 5
    - t=4: [0.1, 0.1, 0.5, 0.1, 0.1, 0.1] -> w=2, offset 2, position 2

    c_off = {-2: 1, 2: 1}, c_pos = {5: 1, 2: 1}: 1 >= 1 -> offset; |-2| = |2|, so
    the smaller o = -2 wins, share 1/2. Scores (0, 0, 1) -> Reset.
    """
    window = _causal_window(
        6,
        {
            2: [0.1, 0.2, 0.7],
            3: [0.1, 0.6, 0.1, 0.2],
            4: [0.1, 0.5, 0.1, 0.1, 0.2],
            5: [0.1, 0.4, 0.1, 0.1, 0.1, 0.2],
        },
    )
    out = reference_head_taxonomy([window])
    assert (out["n_self"], out["n_sink"], out["n_other"], out["n_top"]) == (1, 0, 3, 3)
    assert out["regime"] == RESET
    assert (out["top_source_kind"], out["top_source"]) == ("position", 1)
    assert out["top_source_share"] == 0.75
    assert out["winning_share"] == 0.75
    assert out["runner_up_share"] == 0.25

    everything = [True] * 6
    bidirectional = {
        "T": 6,
        "norms": [1.0] * 6,
        "rows": {
            3: ([0.1, 0.1, 0.1, 0.1, 0.1, 0.5], everything),
            4: ([0.1, 0.1, 0.5, 0.1, 0.1, 0.1], everything),
        },
    }
    out = reference_head_taxonomy([bidirectional], causal=False)
    assert (out["n_queries"], out["n_other"], out["n_top"]) == (2, 2, 1)
    assert (out["top_source_kind"], out["top_source"]) == ("offset", -2)
    assert out["top_source_share"] == 0.5
    assert out["regime"] == RESET


def test_invalid_rows_are_ignored_and_empty_head():
    """Rows without a visible key or with a non-finite visible alpha do not count.

    T = 4, norms all 1:

    - t=1: visible none                         -> ignored
    - t=2: [nan, 0.5, 0.5], visible 0..2        -> ignored (non-finite visible alpha)
    - t=3: [0.2, 0.1, 0.1, 0.6], visible 0..3 -> w=3, self

    So n = 1, n_self = 1, Retriever with share 1. A second window with only
    row t=2 whose invisible key 3 holds inf counts: [0.9, 0.05, 0.05, inf] with
    visible 0..2 -> sink. A head whose rows all drop has n = 0: regime "none",
    shares NaN, top source ("none", -1, NaN), stability NaN even with resamples.
    """
    window = {
        "T": 4,
        "norms": [1.0] * 4,
        "rows": {
            1: ([0.0, 1.0, 0.0, 0.0], [False] * 4),
            2: ([math.nan, 0.5, 0.5, 0.0], [True, True, True, False]),
            3: ([0.2, 0.1, 0.1, 0.6], [True] * 4),
        },
    }
    out = reference_head_taxonomy([window])
    assert (out["n_queries"], out["n_self"], out["regime"]) == (1, 1, RETRIEVER)
    assert out["winning_share"] == 1.0

    invisible_inf = {
        "T": 4,
        "norms": [1.0] * 4,
        "rows": {2: ([0.9, 0.05, 0.05, math.inf], [True, True, True, False])},
    }
    out = reference_head_taxonomy([invisible_inf])
    assert (out["n_queries"], out["n_sink"], out["regime"]) == (1, 1, MIXER)

    empty = {"T": 4, "norms": [1.0] * 4, "rows": {0: ([1.0, 0.0, 0.0, 0.0], [True] * 4)}}
    out = reference_head_taxonomy([empty], resamples=[[0]])
    assert out["n_queries"] == 0
    assert out["regime"] == NONE
    for key in ("f_self", "f_sink", "f_other", "winning_share", "runner_up_share"):
        assert math.isnan(out[key])
    assert (out["top_source_kind"], out["top_source"]) == ("none", -1)
    assert math.isnan(out["top_source_share"])
    assert math.isnan(out["stability"])


def test_stability_with_explicit_resamples():
    """Stability over two explicit resamples of three windows.

    Norms all 1.

    - W0 (T = 3): t=1 [0.2, 0.8] self; t=2 [0.1, 0.1, 0.8] self -> (2, 0, 0)
    - W1 (T = 3): t=1 [0.9, 0.1] sink; t=2 [0.8, 0.1, 0.1] sink -> (0, 2, 0)
    - W2 (T = 4): t=1 [0.7, 0.3] sink; t=2 [0.1, 0.2, 0.7] self;
      t=3 [0.1, 0.6, 0.2, 0.1] w=1 other, offset 2, position 1 -> (1, 1, 1)

    Full data: (3, 3, 1), n_top = 1 -> scores (3, 3, 1) -> Retriever (tie).
    Resample [0, 0, 1]: (4, 2, 0), n_top 0 -> Retriever (matches).
    Resample [2, 2, 1]: (2, 4, 2), c_off = {2: 2}, n_top 2 -> Mixer (no match).
    Stability = 1/2. Resample [2, 2, 2] alone: (3, 3, 3) with n_top 3 (the summed
    offset count) -> Retriever, stability 1.
    """
    w0 = _causal_window(3, {1: [0.2, 0.8], 2: [0.1, 0.1, 0.8]})
    w1 = _causal_window(3, {1: [0.9, 0.1], 2: [0.8, 0.1, 0.1]})
    w2 = _causal_window(4, {1: [0.7, 0.3], 2: [0.1, 0.2, 0.7], 3: [0.1, 0.6, 0.2, 0.1]})
    out = reference_head_taxonomy([w0, w1, w2], resamples=[[0, 0, 1], [2, 2, 1]])
    assert (out["n_queries"], out["n_self"], out["n_sink"], out["n_other"]) == (7, 3, 3, 1)
    assert out["regime"] == RETRIEVER
    assert out["stability"] == 0.5
    assert reference_head_taxonomy([w0, w1, w2], resamples=[[2, 2, 2]])["stability"] == 1.0
    lumped = reference_head_taxonomy([w0, w1, w2], rule="lumped", resamples=[[2, 2, 1]])
    assert lumped["regime"] == RETRIEVER
    assert lumped["stability"] == 0.0

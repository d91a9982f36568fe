"""The policy_atlas step: heads restricted alone, and the localised scan, by the atlas'
head types (issue 39, item 2). Four heads worked by hand:

    head    types                   streaming   window delta (pooled, per window)
    (0, 0)  sink, streaming         1           0.10, 0.12
    (0, 1)  previous_token          0           0.40, 0.50
    (1, 0)  (none)                  0           0.20, 0.18
    (1, 1)  previous_token, sink    0           0.30, 0.30

retrieval is not measured (every value NaN): it is never a row, never "0 heads".
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from attngeom.results.schemas import validate_table
from attngeom.studies.combine import atlas_types, policy_first_heads, policy_head_types

MC = {"model": "m", "corpus": "c"}
HEADS = [(0, 0), (0, 1), (1, 0), (1, 1)]
TYPES = {(0, 0): {"sink", "streaming"}, (0, 1): {"previous_token"}, (1, 0): set(),
         (1, 1): {"previous_token", "sink"}}
WINDOW = {(0, 0): (0.10, 0.12), (0, 1): (0.40, 0.50), (1, 0): (0.20, 0.18),
          (1, 1): (0.30, 0.30)}


def _scores() -> pd.DataFrame:
    rows = []
    for layer, head in HEADS:
        for score, threshold in (("previous_token", 0.4), ("sink", 0.3), ("streaming", 0.1),
                                 ("retrieval", 0.1)):
            is_type = score in TYPES[(layer, head)]
            value = math.nan if score == "retrieval" else (
                (0.05 if is_type else 0.5) if score == "streaming"
                else (0.9 if is_type else 0.01))
            rows.append({**MC, "layer": layer, "head": head, "score": score, "value": value,
                         "threshold": threshold, "is_type": is_type, "n_samples": 10,
                         "inputs": "", "seed": 0})
    df = pd.DataFrame(rows)
    validate_table("head_scores", df)
    return df


def _alone(ranking="window", n=8, values=WINDOW, status="measured") -> pd.DataFrame:
    rows = [{**MC, "layer": l, "head": h, "ranking": ranking, "renormalize": False,
             "tau": 0.05, "n": n, "nll": 2.0, "delta_nll_rel": values[(l, h)][0],
             "mean_doc_delta_rel": values[(l, h)][1], "status": status, "n_windows": 4}
            for l, h in HEADS]
    df = pd.DataFrame(rows)
    validate_table("restrict_alone", df)
    return df


def test_atlas_types_list_each_head_s_types_in_registry_order():
    types, measured = atlas_types(_scores())
    by = types.set_index(["layer", "head"])
    assert by.loc[(1, 1), "types"] == "previous_token,sink"
    assert by.loc[(0, 0), "types"] == "sink,streaming" and by.loc[(1, 0), "types"] == ""
    assert by["streaming"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert measured[("m", "c")] == ["previous_token", "sink", "streaming"]  # no retrieval


def test_head_types_average_the_heads_of_each_type_by_hand():
    table = policy_head_types({"policies": _alone()}, _scores())
    validate_table("policy_head_types", table)
    got = table.set_index("head_type")
    # previous_token: (0, 1) and (1, 1): 0.40 and 0.30; sink: (0, 0) and (1, 1)
    assert got.loc["previous_token", "n_heads"] == 2
    assert got.loc["previous_token", "mean_delta_nll_rel"] == pytest.approx(0.35)
    assert got.loc["previous_token", "max_delta_nll_rel"] == pytest.approx(0.40)
    assert got.loc["sink", "mean_delta_nll_rel"] == pytest.approx(0.20)
    assert got.loc["streaming", "mean_delta_nll_rel"] == pytest.approx(0.10)
    assert got.loc["untyped", "n_heads"] == 1
    assert got.loc["all", "mean_delta_nll_rel"] == pytest.approx(0.25)
    assert "retrieval" not in got.index  # not measured: no row, not zero heads
    assert set(table["part"]) == {"policies"} and (table["n"] == 8).all()


def test_a_ranking_undefined_at_the_oracle_s_n_has_no_heads():
    quest = _alone("quest", values={h: (math.nan, math.nan) for h in HEADS},
                   status="below_fixed")
    table = policy_head_types({"policies": pd.concat([_alone(), quest])}, _scores())
    q = table[table["ranking"] == "quest"]
    assert (q["n_heads"] == 0).all() and q["mean_delta_nll_rel"].isna().all()
    assert len(q) == len(table[table["ranking"] == "window"])


def test_first_heads_rank_by_the_per_window_score_with_the_streaming_base_rate():
    local = pd.DataFrame([{**MC, "scope": "head", "layer": l, "head": h, "ranking": "window",
                           "renormalize": False, "n": 16, "nll": 2.0, "delta_nll_rel": 0.0,
                           "mean_doc_delta_rel": d, "rank": r, "n_windows": 4}
                          for (l, h), d, r in (((1, 0), 0.3, 1), ((1, 1), 0.1, 2))]
                         + [{**MC, "scope": "layer", "layer": 0, "head": -1,
                             "ranking": "window", "renormalize": False, "n": 16, "nll": 2.0,
                             "delta_nll_rel": 0.0, "mean_doc_delta_rel": 0.9, "rank": 1,
                             "n_windows": 4}])
    validate_table("restrict_local", local)
    table = policy_first_heads({"policies": _alone()}, local, _scores(), first=3)
    validate_table("policy_first_heads", table)
    alone = table[table["part"] == "policies"]
    # per-window scores 0.12, 0.50, 0.18, 0.30: (0, 1), (1, 1), (1, 0) first
    assert list(zip(alone["layer"], alone["head"], strict=True)) == [(0, 1), (1, 1), (1, 0)]
    assert alone["rank"].tolist() == [1, 2, 3]
    assert alone["head_types"].tolist() == ["previous_token", "previous_token,sink", ""]
    assert alone["streaming"].tolist() == [0.0, 0.0, 0.0]
    assert (alone["streaming_share"] == 0.25).all() and (alone["n_heads"] == 4).all()
    scan = table[table["part"] == "local"]  # head rows only, in the scan's own rank
    assert list(zip(scan["layer"], scan["head"], scan["rank"], strict=True)) == [
        (1, 0, 1), (1, 1, 2)]
    assert (scan["streaming_share"] == 0.0).all() and (scan["n_heads"] == 2).all()


def test_no_streaming_score_is_nan_not_no():
    scores = _scores()
    scores.loc[scores["score"] == "streaming", "value"] = np.nan
    table = policy_first_heads({"policies": _alone()}, None, scores)
    assert table["streaming"].isna().all() and table["streaming_share"].isna().all()
    assert policy_head_types({"policies": _alone()}, None).empty

"""Policies in the N* search and each head alone at the oracle's N* (issue 39, item 2).

The search's bookkeeping is checked against a stand-in ``measure`` whose deltas are
known (an N below a policy's fixed part is never measured and never passes), the heads
alone against restricting one head by hand on a tiny Llama.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attngeom.errors import ConfigError
from attngeom.interventions.nstar import NStarSearch
from attngeom.interventions.sweeps import (
    ALONE_COLUMNS,
    Restriction,
    SearchResult,
    alone_scan,
    alone_settings,
    fixed_part,
    restrict_search,
    search_tables,
    window_measure,
)
from attngeom.names import RANKINGS

try:
    from tests.architectures import make_inputs, make_model
except ImportError:  # pytest run from inside tests/
    from architectures import make_inputs, make_model

DOCS = np.array([1.0, 1.2, 0.8])  # per-window base NLL of the stand-in


def _stand_in(scale: dict[str, float], asked: list):
    """A ``Measure`` whose window NLLs are base * (1 + scale[ranking] / N): delta is
    scale / N exactly, for every window; ``asked`` records every (ranking, N) run."""

    def measure(rnd, settings):
        asked.extend((s.ranking, s.n) for s in settings)
        docs = np.array([DOCS * (1 + scale[s.ranking] / s.n) for s in settings])
        docs = docs.reshape(len(settings), len(DOCS))
        return float(DOCS.mean()), DOCS.copy(), docs.mean(axis=1), docs

    return measure


def _template(ranking: str, flag: bool = False) -> Restriction:
    return Restriction("model", -1, -1, 1, flag, ranking)


def test_fixed_parts_are_the_registry_s() -> None:
    assert fixed_part("attention") == 0 and fixed_part("window") == 4
    assert fixed_part("quest") == 16
    assert all(fixed_part(r) == RANKINGS.meta(r)["fixed"] for r in RANKINGS)


def test_an_n_below_a_policy_s_fixed_part_fails_without_a_forward() -> None:
    """delta = 8 / N: N*_0.6 = 14 (8 / 13 > 0.6) and N*_2.5 = 4 for every ranking that
    may hold so few keys. Quest (page 16) passes at 16 on the grid; the search would
    narrow below it, but an N under 16 is undefined for Quest: never run, it fails, so
    Quest's N* stays 16. Window (4 sinks) may go down to 4, as the oracle does."""
    asked: list = []
    templates = [_template("attention"), _template("window"), _template("quest")]
    scale = {"attention": 8.0, "window": 8.0, "quest": 8.0}
    base, base_docs, results = restrict_search(
        templates, _stand_in(scale, asked), length=128, taus=(0.6, 2.5), grid=[16, 32, 64])
    by = {r.setting.ranking: r for r in results}
    assert not [n for r, n in asked if n < fixed_part(r)]
    assert {r: by[r].search.nstar for r in by} == {
        "attention": {0.6: 14, 2.5: 4}, "window": {0.6: 14, 2.5: 4},
        "quest": {0.6: 16, 2.5: 16}}
    assert min(n for r, n in asked if r == "attention") < 4  # the oracle goes below
    assert set(by["quest"].nll) == {16, 32, 64}  # measured Ns only
    _, nstar = search_tables(results, base, base_docs, (0.6, 2.5), length=128,
                             bootstrap=30, seed=1)
    quest = nstar[nstar["ranking"] == "quest"].set_index("tau")
    assert quest["n_evaluated"].tolist() == [3, 3]  # the refused Ns are not evaluations
    assert quest.loc[2.5, "ratio"] == 4.0 and quest.loc[2.5, "oracle_n_star"] == 4.0
    # every window moves alike: every replicate of Quest's N* is 16, and the ratio's
    # interval is 16 over the oracle's replicates
    assert quest.loc[2.5, ["n_star_low", "n_star_high"]].tolist() == [16.0, 16.0]
    assert quest.loc[2.5, ["ratio_low", "ratio_high"]].tolist() == [4.0, 4.0]


def _result(ranking: str, flag: bool, nstar: int) -> SearchResult:
    search = NStarSearch(evaluations={nstar: 0.0}, nstar={0.05: nstar},
                         grid_nstar={0.05: nstar}, monotone=True, notes=())
    return SearchResult(_template(ranking, flag), search, {}, {})


def test_alone_settings_take_the_oracle_s_n_of_the_same_treatment() -> None:
    results = [_result("attention", False, 6), _result("window", False, 40),
               _result("quest", False, 64), _result("attention", True, 20),
               _result("quest", True, 64)]
    pairs = alone_settings(results, 0.05, [(0, 1), (2, 0)], length=20)
    got = [(s.layer, s.head, s.ranking, s.renormalize, s.n, status) for s, status in pairs]
    assert got[:5] == [(0, 1, "attention", False, 6, "measured"),
                       (0, 1, "window", False, 6, "measured"),
                       (0, 1, "quest", False, 6, "below_fixed"),
                       (0, 1, "attention", True, 20, "identity"),  # N* = T: nothing cut
                       (0, 1, "quest", True, 20, "identity")]
    assert [g[:2] for g in got[5:]] == [(2, 0)] * 5
    assert all(s.scope == "head" for s, _ in pairs)
    with pytest.raises(ConfigError, match="^alone_tau: .*add attention to the rankings"):
        alone_settings([_result("window", False, 8)], 0.05, [(0, 0)], length=20)


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


def test_each_head_alone_equals_restricting_it_by_hand(llama) -> None:
    """The oracle's N* is given (5, deleted); each row is that head restricted alone,
    measured again here with ``restrict_topn(heads=[...])`` window by window (the model's
    float32 loss: equal to about 1e-7 of a nat)."""
    from attngeom.interventions.restriction import restrict_topn

    ids = make_inputs("llama", batch=3, seed=7)["input_ids"]
    t = ids.shape[1]
    results = [_result("attention", False, 5), _result("window", False, 9),
               _result("quest", False, 16)]
    table = alone_scan(results, window_measure(llama, ids, batch_size=1), 0.05,
                       [(0, 1), (1, 3)], length=t)
    assert list(table.columns) == list(ALONE_COLUMNS)
    assert table["status"].tolist() == ["measured", "measured", "below_fixed"] * 2
    assert (table["n"] == 5).all() and (table["n_windows"] == 3).all()

    def per_window():
        with torch.no_grad():
            return np.array([float(llama(input_ids=w[None], labels=w[None]).loss)
                             for w in ids])

    base = per_window()
    for row in table[table["status"] == "measured"].itertuples():
        with restrict_topn(llama, 5, heads=[(row.layer, row.head)], renormalize=False,
                           ranking=row.ranking):
            got = per_window()
        assert row.mean_doc_delta_rel == pytest.approx(np.mean((got - base) / base), abs=1e-6)
        assert row.delta_nll_rel == pytest.approx((got.mean() - base.mean()) / base.mean(),
                                                  abs=1e-6)
        assert abs(row.delta_nll_rel) > 1e-5  # the head alone changes the loss
        assert row.nll == pytest.approx(got.mean(), rel=1e-6)
    undefined = table[table["status"] == "below_fixed"]
    assert undefined[["nll", "delta_nll_rel", "mean_doc_delta_rel"]].isna().all().all()
    # at the window length the restriction is the identity: delta 0, no forward
    full = alone_scan([_result("attention", False, t)], window_measure(llama, ids), 0.05,
                      [(0, 0)], length=t)
    assert full["status"].tolist() == ["identity"] and full["delta_nll_rel"].tolist() == [0.0]
    assert not math.isnan(full["nll"].iloc[0])

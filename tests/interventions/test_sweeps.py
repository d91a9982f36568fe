"""Sweeps (SPEC 6): every row recomputed by hand, every bad argument caught first.

The pruning rows are checked against removing the ranking's first heads by hand,
the scan against removing each head by hand, the restriction bookkeeping (scopes,
N*) against a stand-in restriction whose effect is known, and the real
restriction at N >= T against the unrestricted model. One run on the shared
stories260K model exercises every ranker, all six taxonomy orders and the scan
on real weights and real text.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom.errors import ConfigError
from attngeom.interventions import restriction as restriction_module
from attngeom.interventions.gates import remove_heads
from attngeom.interventions.perplexity import evaluate_nll
from attngeom.interventions.rankers import rank_heads, sensitivity_ranking
from attngeom.interventions.sweeps import (
    NSTAR_COLUMNS,
    PRUNING_COLUMNS,
    RANKINGS_COLUMNS,
    RESTRICT_COLUMNS,
    SCAN_COLUMNS,
    n_star,
    prune_sweep,
    restrict_sweep,
    scan_heads,
)

try:
    from tests.architectures import STORIES_PATH, make_inputs, make_model
    from tests.architectures import TINYSTORIES_PATH as TINYSTORIES
except ImportError:  # pytest run from inside tests/
    from architectures import STORIES_PATH, make_inputs, make_model
    from architectures import TINYSTORIES_PATH as TINYSTORIES

ALL_HEADS = [(l, h) for l in range(2) for h in range(4)]


def _taxonomy(num_layers: int = 2, num_heads: int = 4) -> pd.DataFrame:
    regimes = ["Mixer", "Reset", "Retriever", "none"]
    return pd.DataFrame(
        [
            (l, h, regimes[(l + h) % 4], 1.0 / (1 + l * num_heads + h))
            for l in range(num_layers)
            for h in range(num_heads)
        ],
        columns=["layer", "head", "regime", "mean_output_norm"],
    )


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


@pytest.fixture(scope="module")
def windows():
    ids = make_inputs("llama", batch=6, seed=5)["input_ids"]
    return ids[:3], ids[3:]


class _NoModelWork:
    """Makes any forward call fail loudly, so validation must come first."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        def refuse(*_):
            raise AssertionError("model work before validation")

        self.handle = self.model.register_forward_pre_hook(refuse)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# --------------------------------------------------------------------------- prune_sweep


def _rankings(model, rank_ids, *, orders=("Mixer>Reset>Retriever",), seeds=(0,)):
    out = [rank_heads("magnitude", model)]
    out += [rank_heads("random", model, seed=s) for s in seeds]
    out += [rank_heads("taxonomy", model, taxonomy=_taxonomy(), order=o) for o in orders]
    out.append(rank_heads("sensitivity", model, rank_ids, batch_size=2))
    return out


def test_prune_rows_equal_removing_the_first_heads_by_hand(llama, windows):
    from attngeom.interventions.rankers import ALL_ORDERS

    rank_ids, eval_ids = windows
    rankings = _rankings(llama, rank_ids, orders=ALL_ORDERS, seeds=(0, 1))
    pruning, ranks = prune_sweep(llama, rankings, eval_ids, keep_fractions=(1.0, 0.5, 0.3),
                                 batch_size=2)
    assert list(pruning.columns) == list(PRUNING_COLUMNS)
    assert list(ranks.columns) == list(RANKINGS_COLUMNS)
    assert len(pruning) == (1 + 2 + 6 + 1) * 3
    assert sorted(pruning["heads_kept"].unique().tolist()) == [2, 4, 8]  # round(0.3 * 8) = 2
    base = evaluate_nll(llama, eval_ids).nll
    full = pruning[pruning["keep_fraction"] == 1.0]
    assert (full["nll"] == base).all() and (full["delta_nll_rel"] == 0.0).all()
    assert set(pruning.loc[pruning["ranker"] == "random", "seed"]) == {0, 1}
    assert set(pruning.loc[pruning["ranker"] != "random", "seed"]) == {-1}
    assert pruning.loc[pruning["ranker"] == "taxonomy", "order"].nunique() == 6
    keys = ["ranker", "seed", "order"]
    for key, ranking in ranks.groupby(keys):
        assert ranking["rank"].tolist() == list(range(8))
        heads = list(zip(ranking["layer"], ranking["head"], strict=True))
        assert sorted(heads) == ALL_HEADS
        rows = pruning.set_index(keys).loc[key]
        for _, row in rows.iterrows():
            with remove_heads(llama, heads[: 8 - int(row["heads_kept"])]):
                nll = evaluate_nll(llama, eval_ids).nll
            assert row["nll"] == pytest.approx(nll, abs=1e-12)
            assert row["delta_nll_rel"] == pytest.approx((nll - base) / base, abs=1e-12)
            assert row["perplexity"] == pytest.approx(math.exp(nll), rel=1e-12)
    # Data rankers rank on the windows they are given, not on the evaluation windows.
    sens = ranks[ranks["ranker"] == "sensitivity"].sort_values(["layer", "head"])
    expected = sensitivity_ranking(llama, rank_ids).scores.numpy().ravel()
    np.testing.assert_allclose(sens["score"].to_numpy(), expected, rtol=0, atol=1e-12)
    on_eval = sensitivity_ranking(llama, eval_ids).scores.numpy().ravel()
    assert not np.allclose(expected, on_eval)


def test_taxonomy_orders(llama, windows):
    orders = ("Reset>Mixer>Retriever", ("Retriever", "Mixer", "Reset"))
    rankings = [rank_heads("taxonomy", llama, taxonomy=_taxonomy(), order=o) for o in orders]
    pruning, ranks = prune_sweep(llama, rankings, windows[1], keep_fractions=(0.5,))
    assert pruning["order"].tolist() == ["Reset>Mixer>Retriever", "Retriever>Mixer>Reset"]
    first = ranks[ranks["order"] == "Reset>Mixer>Retriever"].iloc[0]
    assert (first["layer"] + first["head"]) % 4 == 1  # a Reset head goes first


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda m, ids: rank_heads("taxonomy", m), "per-head table"),
        (lambda m, ids: rank_heads("taxonomy", m, taxonomy=_taxonomy(2, 3)), "one row per head"),
        (lambda m, ids: rank_heads("taxonomy", m, taxonomy=_taxonomy(), order="Mixer>Mixer>Reset"),
         "permutation"),
        (lambda m, ids: rank_heads("entropy", m), "needs ranking windows"),
        (lambda m, ids: rank_heads("norm", m), "taxonomy, magnitude, entropy"),
        (lambda m, ids: prune_sweep(m, [], torch.zeros(3, dtype=torch.long)), "shape"),
        (lambda m, ids: restrict_sweep(m, ids, [1, 2], scopes=("layer",), layers=[2]),
         "layers"),
        (lambda m, ids: restrict_sweep(m, ids, [1], scopes=("head",), heads=[(0, 4)]), "heads"),
    ],
)
def test_kernel_errors_are_one_line_before_any_model_work(llama, windows, call, words):
    """What only the model can tell (its shape, a table's heads) fails before any forward;
    argument values are the configuration's to check (tests/test_config.py)."""
    with _NoModelWork(llama), pytest.raises(ConfigError, match=words) as info:
        call(llama, windows[1])
    assert "\n" not in str(info.value)


def test_prune_refuses_an_encoder():
    model = make_model("bert")
    ids = make_inputs("bert")["input_ids"]
    with pytest.raises(ConfigError, match="causal"):
        prune_sweep(model, [rank_heads("magnitude", model)], ids)


# --------------------------------------------------------------------------- scan_heads


def test_scan_rows_equal_removing_each_head_by_hand(llama, windows):
    _, eval_ids = windows
    base = evaluate_nll(llama, eval_ids).nll
    deltas = {}
    for head in ALL_HEADS:
        with remove_heads(llama, [head]):
            deltas[head] = (evaluate_nll(llama, eval_ids).nll - base) / base
    threshold = float(np.median(list(deltas.values())))
    scan = scan_heads(llama, eval_ids, threshold=threshold)
    assert list(scan.columns) == list(SCAN_COLUMNS)
    assert list(zip(scan["layer"], scan["head"], strict=True)) == ALL_HEADS
    for _, row in scan.iterrows():
        delta = deltas[(row["layer"], row["head"])]
        assert row["delta_nll_rel"] == pytest.approx(delta, abs=1e-12)
        assert row["nll"] == pytest.approx(base * (1 + delta), rel=1e-12)
        assert row["critical"] == (delta > threshold)
    assert 0 < scan["critical"].sum() < 8
    assert (scan["threshold"] == threshold).all()


# --------------------------------------------------------------------------- restrict_sweep


def test_n_star_is_the_smallest_qualifying_n():
    assert n_star([1, 2, 4], [0.3, 0.02, 0.0], 0.05) == 2
    assert n_star([1, 2, 4], [0.01, 0.2, 0.0], 0.05) == 1  # smallest, not "from then on"
    assert math.isnan(n_star([1, 2], [0.5, 0.2], 0.1))


def test_restrict_bookkeeping_with_a_known_stand_in(llama, windows, monkeypatch):
    """A stand-in removes head (0, 0) when n < 4 and also (1, 1) when n < 2."""
    _, eval_ids = windows
    calls = []

    @contextlib.contextmanager
    def fake(model, n, *, layers=None, heads=None, renormalize=True, ranking="attention",
             seed=0, windows=None):
        calls.append((n, layers, heads, renormalize))
        removed = [(0, 0)] * (n < 4) + [(1, 1)] * (n < 2)
        with remove_heads(model, removed):
            yield

    monkeypatch.setattr(restriction_module, "restrict_topn", fake)
    restrict, nstar = restrict_sweep(
        llama, eval_ids, [8, 1, 4, 2], scopes=("model", "layer", "head"), renormalize=True,
        taus=(0.0, 1e6), layers=[1], heads=[(1, 0), (1, 3)], search="grid", bootstrap=0,
    )  # fmt: skip
    assert list(restrict.columns) == list(RESTRICT_COLUMNS)
    assert list(nstar.columns) == list(NSTAR_COLUMNS)
    targets = [("model", -1, -1), ("layer", 1, -1), ("head", 1, 0), ("head", 1, 3)]
    assert (
        list(
            dict.fromkeys(zip(restrict["scope"], restrict["layer"], restrict["head"], strict=True))
        )
        == targets
    )
    assert calls[:4] == [(1, None, None, True), (2, None, None, True), (4, None, None, True),
                         (8, None, None, True)]  # fmt: skip
    assert calls[4] == (1, [1], None, True) and calls[8] == (1, None, [(1, 0)], True)
    base = evaluate_nll(llama, eval_ids).nll
    with remove_heads(llama, [(0, 0)]):
        one = evaluate_nll(llama, eval_ids).nll
    model_rows = restrict[restrict["scope"] == "model"].set_index("n")
    assert model_rows.loc[2, "delta_nll_rel"] == pytest.approx((one - base) / base, abs=1e-12)
    assert model_rows.loc[4, "delta_nll_rel"] == 0.0 and model_rows.loc[8, "nll"] == base
    assert model_rows.loc[1, "passes"] == "1e+06" and model_rows.loc[4, "passes"] == "0,1e+06"
    tight = nstar[nstar["tau"] == 0.0]
    loose = nstar[nstar["tau"] == 1e6]
    assert (tight["n_star"] == 4.0).all() and (loose["n_star"] == 1.0).all()
    assert (nstar["grid_n_star"] == nstar["n_star"]).all()
    assert len(nstar) == 4 * 2
    assert (nstar["n_star_status"] == "within_grid").all() and (nstar["search"] == "grid").all()

    # the adaptive search adds N = 3 (between the failing 2 and the passing 4) and nothing
    # else: 3 fails tau = 0, so N*_0 = 4; N*_1e6 = 1 on the grid
    calls.clear()
    restrict, nstar = restrict_sweep(llama, eval_ids, [8, 1, 4, 2], renormalize=True,
                                     taus=(0.0, 1e6), bootstrap=50)
    assert sorted(restrict["n"]) == [1, 2, 3, 4, 8]
    assert restrict.set_index("n").loc[3, "on_grid"] == False  # noqa: E712
    assert nstar.set_index("tau")["n_star"].to_dict() == {0.0: 4.0, 1e6: 1.0}
    assert (nstar["n_star_status"] == "search").all() and nstar["monotone"].all()
    assert (nstar["n_star_low"] <= nstar["n_star"]).all()
    assert (nstar["n_star"] <= nstar["n_star_high"]).all()
    assert (nstar["n_evaluated"] == 5).all()
    assert (nstar["window_length"] == eval_ids.shape[1]).all()
    # a tau no N shorter than the window reaches: N* is the window length (the endpoint),
    # never a grid N at or past the window
    t = eval_ids.shape[1]
    _, never = restrict_sweep(llama, eval_ids, [1, 2, 2 * t], scopes=("model",), taus=(0.0,),
                              renormalize=True, search="grid", bootstrap=0)
    assert never["n_star"].tolist() == [float(t)]
    assert (never["n_star_status"] == "endpoint").all()


def test_restrict_at_full_length_changes_nothing(llama, windows):
    _, eval_ids = windows
    t = eval_ids.shape[1]
    restrict, nstar = restrict_sweep(
        llama, eval_ids, [1, t - 1, t], scopes=("model", "layer", "head"), taus=(0.01,),
        search="grid", bootstrap=0)
    # N >= T restricts nothing: it is not run, its row is the base
    assert len(restrict) == (1 + 2 + 8) * 2 * 3
    assert (restrict.loc[restrict["n"] == t, "delta_nll_rel"] == 0.0).all()
    last = restrict[restrict["n"] == t - 1]  # only the final query loses one key
    assert last["delta_nll_rel"].abs().max() < 0.05
    one = restrict[(restrict["n"] == 1) & (restrict["scope"] == "model")]
    assert (one["delta_nll_rel"].abs() > 1e-3).all()
    assert set(nstar["n_star"].dropna()) <= {1.0, float(t - 1), float(t)}


def test_rankings_and_flags_each_get_a_search(llama, windows):
    _, eval_ids = windows
    restrict, nstar = restrict_sweep(
        llama, eval_ids, [1, 2, 4, 8], rankings=("attention", "contribution", "random"),
        renormalize=(False, True), taus=(0.05,), bootstrap=20, seed=3)
    keys = set(zip(nstar["ranking"], nstar["renormalize"], strict=True))
    assert keys == {(r, f) for r in ("attention", "contribution", "random")
                    for f in (False, True)}
    # each search's N* is the smallest passing N it tried, every smaller one tried fails
    for (ranking, flag), rows in restrict.groupby(["ranking", "renormalize"]):
        row = nstar[(nstar["ranking"] == ranking) & (nstar["renormalize"] == flag)].iloc[0]
        passing = rows.loc[rows["delta_nll_rel"] <= 0.05, "n"]
        expected = float(passing.min()) if len(passing) else float(eval_ids.shape[1])
        assert row["n_star"] == expected
    # the attention ranking with deletion is the restriction as before: same numbers
    alone, _ = restrict_sweep(llama, eval_ids, [1, 2, 4, 8], renormalize=(False,),
                              taus=(0.05,), search="grid", bootstrap=0)
    mine = restrict[(restrict["ranking"] == "attention") & ~restrict["renormalize"]
                    & restrict["on_grid"]]
    assert mine["nll"].tolist() == alone["nll"].tolist()


def test_local_scan_scores_mean_of_document_increases(llama, windows):
    from attngeom.interventions.sweeps import restrict_local

    _, eval_ids = windows
    table = restrict_local(llama, eval_ids, scope="head", n=(2,), top_layers=1)
    layers = table[table["scope"] == "layer"]
    heads = table[table["scope"] == "head"]
    assert sorted(layers["layer"]) == [0, 1] and len(heads) == 4
    top = int(layers.sort_values("rank").iloc[0]["layer"])
    assert set(heads["layer"]) == {top}
    assert sorted(heads["rank"]) == [1, 2, 3, 4]
    # by hand: one layer restricted, each window's relative increase, then their mean
    from attngeom.interventions.restriction import restrict_topn

    def per_window():
        with torch.no_grad():
            return np.array([float(llama(input_ids=w[None], labels=w[None]).loss)
                             for w in eval_ids])

    base = per_window()
    with restrict_topn(llama, 2, layers=[top], renormalize=False):
        got = per_window()
    row = layers[layers["layer"] == top].iloc[0]
    assert row["mean_doc_delta_rel"] == pytest.approx(float(np.mean((got - base) / base)),
                                                      rel=1e-5)
    assert row["delta_nll_rel"] == pytest.approx((got.mean() - base.mean()) / base.mean(),
                                                 rel=1e-5)


# --------------------------------------------------------------------------- stories260K


def _story_windows(tokenizer, count: int, length: int = 64) -> torch.Tensor:
    """The first ``length`` tokens (BOS first) of the first ``count`` long-enough stories."""
    text = TINYSTORIES.read_text(encoding="utf-8")
    out = []
    for story in text.split("<|endoftext|>"):
        ids = tokenizer(story.strip())["input_ids"]
        if len(ids) >= length:
            out.append(ids[:length])
        if len(out) == count:
            break
    return torch.tensor(out)


def _taxonomy_from_capture(model, ids) -> pd.DataFrame:
    """SPEC 4 regimes and mean output norms, written from the definition (all queries t >= 1)."""
    from attngeom.capture import capture_attention, model_layout

    layout = model_layout(model)
    counts = np.zeros((layout.num_layers, layout.num_heads, 3))  # self, sink, other
    norm_sum = np.zeros((layout.num_layers, layout.num_heads))
    queries = np.zeros(layout.num_layers)

    def consumer(cap):
        alpha = cap.alpha.double()[:, :, 1:]  # (B, H, Q-1, T): rows t >= 1
        values = cap.values.double().repeat_interleave(layout.group_size, dim=1)  # (B, H, T, d)
        t = cap.query_rows[1:].view(1, 1, -1)
        winner = (alpha * values.norm(dim=-1)[:, :, None, :]).argmax(dim=-1)
        kinds = [winner == t, winner == 0, (winner != t) & (winner != 0)]
        for k, mask in enumerate(kinds):
            counts[cap.layer, :, k] += mask.sum(dim=(0, 2)).numpy()
        norm_sum[cap.layer] += (alpha @ values).norm(dim=-1).sum(dim=(0, 2)).numpy()
        queries[cap.layer] += alpha.shape[0] * alpha.shape[2]

    with torch.no_grad(), capture_attention(model, consumer):
        model(input_ids=ids)
    rows = []
    for l in range(layout.num_layers):
        for h in range(layout.num_heads):
            regime = ("Retriever", "Mixer", "Reset")[int(np.argmax(counts[l, h]))]
            rows.append((l, h, regime, norm_sum[l, h] / queries[l]))
    return pd.DataFrame(rows, columns=["layer", "head", "regime", "mean_output_norm"])


@pytest.mark.slow
def test_stories260k_prune_sweep_and_scan():
    from attngeom.capture import load_model
    from attngeom.interventions.gates import check_gates

    model, tokenizer = load_model(str(STORIES_PATH))
    ids = _story_windows(tokenizer, 12)
    assert (ids[:, 0] == 1).all()  # BOS at position 0
    rank_ids, eval_ids = ids[:6], ids[6:]
    check_gates(model)
    base = evaluate_nll(model, eval_ids)
    with torch.no_grad():
        losses = [float(model(w[None], labels=w[None]).loss) for w in eval_ids]
    assert base.nll == pytest.approx(float(np.mean(losses)), abs=1e-6)
    assert 0.5 < base.nll < 2.0  # a trained model on its own training distribution

    from attngeom.interventions.rankers import ALL_ORDERS

    taxonomy = _taxonomy_from_capture(model, rank_ids)
    made = [rank_heads("taxonomy", model, taxonomy=taxonomy, order=o) for o in ALL_ORDERS]
    made += [rank_heads(name, model, rank_ids) for name in ("magnitude", "entropy")]
    made += [rank_heads("random", model, seed=s) for s in (0, 1)]
    made += [rank_heads(name, model, rank_ids) for name in ("gradient", "sensitivity")]
    pruning, rankings = prune_sweep(model, made, eval_ids)
    assert len(pruning) == (6 + 1 + 1 + 2 + 1 + 1) * 5
    assert sorted(pruning["heads_kept"].unique().tolist()) == [10, 20, 30, 36, 40]
    assert (pruning.loc[pruning["keep_fraction"] == 1.0, "nll"] == base.nll).all()
    # Removing three quarters of a trained model's heads hurts, whatever the order.
    quarter = pruning[pruning["keep_fraction"] == 0.25]
    assert (quarter["delta_nll_rel"] > 0.2).all()
    for _, ranking in rankings.groupby(["ranker", "seed", "order"]):
        assert sorted(zip(ranking["layer"], ranking["head"], strict=True)) == [
            (l, h) for l in range(5) for h in range(8)
        ]
    default = rankings[rankings["order"] == "Mixer>Reset>Retriever"]
    regime = taxonomy.set_index(["layer", "head"])["regime"]
    ranks = {"Mixer": 0, "Reset": 1, "Retriever": 2}
    norm = taxonomy.set_index(["layer", "head"])["mean_output_norm"]
    keys = [ranks[regime[(l, h)]] for l, h in zip(default["layer"], default["head"], strict=True)]
    norms = [norm[(l, h)] for l, h in zip(default["layer"], default["head"], strict=True)]
    # By regime, then ascending norm (on these windows every head may share one regime).
    assert list(zip(keys, norms, strict=True)) == sorted(zip(keys, norms, strict=True))
    np.testing.assert_allclose(default["score"].to_numpy(), norms, rtol=0, atol=0)

    scan = scan_heads(model, eval_ids, threshold=0.02)
    assert len(scan) == 40
    top = scan.sort_values("delta_nll_rel", ascending=False).iloc[0]
    with remove_heads(model, [(int(top["layer"]), int(top["head"]))]):
        removed = evaluate_nll(model, eval_ids).nll
    assert top["delta_nll_rel"] == pytest.approx((removed - base.nll) / base.nll, abs=1e-12)
    assert top["delta_nll_rel"] > 0.01 and scan["critical"].any()
    assert scan["delta_nll_rel"].mean() > 0  # on average a trained head helps


def test_ratio_to_the_oracle_pairs_the_bootstrap_replicates() -> None:
    """Each ranking's N* over the attention oracle's (same scope and treatment), and an
    interval from the same document draws for both: a ranking whose per-document losses
    equal the oracle's has ratio 1 in every replicate."""
    import numpy as np

    from attngeom.interventions.nstar import NStarSearch, nstar_replicates
    from attngeom.interventions.sweeps import Restriction, SearchResult, search_tables

    base_docs = np.array([1.0, 1.1, 0.9, 1.2])

    def result(ranking, per_n, nstar):
        search = NStarSearch(evaluations={n: 0.0 for n in per_n}, nstar={0.05: nstar},
                             grid_nstar={0.05: nstar}, monotone=True, notes=())
        return SearchResult(Restriction("model", -1, -1, 1, False, ranking, 0), search,
                            {n: float(np.mean(v)) for n, v in per_n.items()}, per_n)

    oracle = {n: base_docs * (1 + 0.5 / n) for n in (1, 2, 4, 8, 16)}
    twice = {n: base_docs * (1 + 1.0 / n) for n in (1, 2, 4, 8, 16, 32)}
    results = [result("attention", oracle, 16), result("window", twice, 32),
               result("contribution", oracle, 16)]
    _, nstar = search_tables(results, 1.05, base_docs, (0.05,), length=64, bootstrap=200,
                             seed=3)
    by = nstar.set_index("ranking")
    assert by.loc["attention", "ratio"] == 1.0 and by.loc["window", "ratio"] == 2.0
    assert by.loc["window", "oracle_n_star"] == 16
    assert by.loc["contribution", ["ratio_low", "ratio_high"]].tolist() == [1.0, 1.0]
    mine = nstar_replicates(base_docs, twice, (0.05,), length=64, replicates=200, seed=3)
    theirs = nstar_replicates(base_docs, oracle, (0.05,), length=64, replicates=200, seed=3)
    q = mine[0.05] / theirs[0.05]
    assert by.loc["window", "ratio_low"] == np.nanquantile(q, 0.025)
    assert by.loc["window", "ratio_high"] == np.nanquantile(q, 0.975)

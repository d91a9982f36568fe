"""The streamed top-N state equals the per-row kernel, chunked and merged (STYLE 2-3)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from attngeom.config import AnalysisConfig
from attngeom.core.accumulators import TopNAccumulator, TopNConfig
from attngeom.core.batch import AttentionBatch, ValueStats
from attngeom.core.geometry import METRICS, causal_visibility, topn_metrics
from attngeom.core.metrics import metrics
from attngeom.errors import ConfigError
from tests.core.batches import assert_columns_equal

H, G, T, D = 4, 2, 12, 3
GRID = (1, 2, 4, 11, 12)


def _rounded() -> list[str]:
    """The metrics that may move in their last bits between two ways of computing them
    (``Metric.exact`` False: the margin, a ratio of rounded inner products)."""
    return [m.name for m in metrics() if not m.exact]


def _window(seed: int):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(G, T, D, generator=gen)
    rows = torch.arange(1, T)
    logits = torch.randn(H, rows.numel(), T, generator=gen)
    vis = causal_visibility(rows, T)
    alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
    return alpha, values, rows, vis


def _batches(window: int, seed: int, chunks: int = 1):
    alpha, values, rows, vis = _window(seed)
    stats = ValueStats(values)
    out = []
    for part in torch.tensor_split(torch.arange(rows.numel()), chunks):
        out.append(AttentionBatch(window, 0, alpha[:, part], vis[:, part], rows[part], stats))
    return out


def _cfg(**kw) -> TopNConfig:
    base = dict(n_grid=GRID, rules=("attention", "random"), distances=("euclidean", "cosine"),
                repeats=3, seed=7, bounds=False)
    base.update(kw)
    return TopNConfig(**base)


def _table(acc: TopNAccumulator) -> dict[str, np.ndarray]:
    return acc.compute()["metrics"]


def _assert_tables_equal(a: dict, b: dict) -> None:
    assert_columns_equal(a, b, rtol=1e-12, atol=1e-12)


def test_stream_equals_kernel_mean() -> None:
    """Per-window means are the kernel's metrics averaged over valid (query, repeat) rows."""
    acc = TopNAccumulator(_cfg())
    for b in _batches(3, 0):
        acc.update(b)
    table = _table(acc)
    alpha, values, rows, vis = _window(0)
    for rule in ("attention", "random"):
        res = topn_metrics(alpha, values, GRID, rule=rule, visible=vis, query_positions=rows,
                           repeats=3, seed=7, window=3, layer=0)
        for name in METRICS:
            x = res.metric(name).numpy()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN (H, N) cells
                expect = np.nanmean(x, axis=(0, 2))  # (H, NN)
            sel = (table["rule"] == rule) & (table["variant"] == "full") & (
                table["distance"] == "euclidean")
            got = table[name][sel].reshape(H, len(GRID))
            np.testing.assert_allclose(got, expect, rtol=1e-12, equal_nan=True)
        sel = (table["rule"] == rule) & (table["variant"] == "full") & (
            table["distance"] == "euclidean")
        nq = table["n_queries"][sel].reshape(H, len(GRID))
        assert (nq[:, GRID.index(12)] == 0).all()  # N = 12 never fits a universe of <= 12
        assert (nq[:, GRID.index(1)] == rows.numel()).all()
        skipped = table["n_skipped"][sel].reshape(H, len(GRID))
        assert (skipped[:, GRID.index(12)] == rows.numel()).all()
        # N = 11 is valid only for the last query (universe of 12 keys)
        assert (nq[:, GRID.index(11)] == 1).all()
    assert np.isnan(table["precision"][table["n"] == 12]).all()


def test_query_chunks_add_up() -> None:
    """Chunks of query rows add up to the whole window: every column to 1e-12, the margin
    within rounding, since a chunk's rows (and the sink-excluded rows redone in packs
    of a chunk's size) take their ``V s_N`` products from calls of another shape, and
    on shapes this small torch's own small-matrix loop rounds apart from BLAS."""
    whole, chunked = TopNAccumulator(_cfg()), TopNAccumulator(_cfg())
    for b in _batches(0, 1):
        whole.update(b)
    for b in _batches(0, 1, chunks=3):
        chunked.update(b)
    a, b = _table(whole), _table(chunked)
    rounded = [(a.pop(name), b.pop(name)) for name in _rounded()]
    _assert_tables_equal(a, b)
    for x, y in rounded:
        np.testing.assert_allclose(y, x, rtol=1e-7, atol=1e-12, equal_nan=True)


def test_kernel_byte_budget_chunks_rows_and_never_the_tables() -> None:
    """A budget of one byte cuts every kernel (order, metrics, bounds) into single rows;
    the tables, bounds and the sink split included, stay the same: the counts behind
    P, R, F and the bounds bit for bit, the margin (a ratio of inner products, whose
    matrix products round by row-block size) to 1e-7."""
    from attngeom.core.kernels import temporaries

    cfg = _cfg(bounds=True, variants=("full", "no_sink"))
    whole, chunked = TopNAccumulator(cfg), TopNAccumulator(cfg)
    for b in _batches(2, 5):
        whole.update(b)
    with temporaries(1):
        for b in _batches(2, 5):
            chunked.update(b)
    a, b = whole.compute(), chunked.compute()
    assert_columns_equal(a["sink_effect"], b["sink_effect"], rtol=0, atol=0)
    rounded = [(a["metrics"].pop(name), b["metrics"].pop(name)) for name in _rounded()]
    assert_columns_equal(a["metrics"], b["metrics"], rtol=0, atol=0)
    for x, y in rounded:
        np.testing.assert_allclose(y, x, rtol=1e-7, atol=1e-12, equal_nan=True)


def test_merge_equals_one_run_and_half_differs() -> None:
    one = TopNAccumulator(_cfg())
    shard_a, shard_b = TopNAccumulator(_cfg()), TopNAccumulator(_cfg())
    for w in range(4):
        for b in _batches(w, w):
            one.update(b)
            (shard_a if w % 2 else shard_b).update(b)
    half = _table(shard_a)
    merged = TopNAccumulator(_cfg()).merge(shard_a).merge(shard_b)
    _assert_tables_equal(_table(one), _table(merged))
    merged_rev = TopNAccumulator(_cfg()).merge(shard_b).merge(shard_a)
    _assert_tables_equal(_table(one), _table(merged_rev))
    assert len(half["window"]) < len(_table(one)["window"])


def test_random_control_independent_of_processing_order() -> None:
    fwd, rev = TopNAccumulator(_cfg()), TopNAccumulator(_cfg())
    for w in range(3):
        for b in _batches(w, 10 + w):
            fwd.update(b)
    for w in reversed(range(3)):
        for b in _batches(w, 10 + w):
            rev.update(b)
    _assert_tables_equal(_table(fwd), _table(rev))


def test_merge_rejects_other_config() -> None:
    with pytest.raises(ConfigError, match="different configurations"):
        TopNAccumulator(_cfg()).merge(TopNAccumulator(_cfg(seed=8)))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rules=("attention", "best")), "rules"),
        (dict(distances=()), "distances"),
        (dict(n_grid=(0, 2)), "n_grid"),
        (dict(repeats=0), "repeats"),
    ],
)
def test_config_errors(kw, match) -> None:
    """Values are checked once, by the configuration the accumulator is built from."""
    with pytest.raises(ConfigError, match=match):
        AnalysisConfig(model="m", corpus="c", **kw)


def test_sink_effect_split() -> None:
    """F with and without the sink, split by whether the attention rule selected it."""
    acc = TopNAccumulator(_cfg(rules=("attention",), distances=("euclidean",)))
    for b in _batches(0, 2):
        acc.update(b)
    eff = acc.compute()["sink_effect"]
    alpha, values, rows, vis = _window(2)
    full = topn_metrics(alpha, values, GRID, visible=vis, query_positions=rows)
    nos = topn_metrics(alpha, values, GRID, visible=vis, query_positions=rows, exclude_sink=True)
    chosen = full.sink_selected[0]
    both = full.valid[0] & nos.valid[0]
    for j in range(len(GRID)):
        for h in range(H):
            m = chosen[h, :, j] & both[h, :, j]
            row = (eff["head"] == h) & (eff["n"] == GRID[j])
            got = eff["f_full_sink_selected"][row][0]
            if m.any():
                assert got == pytest.approx(float(full.f_score[0, h, m, j].mean()))
                assert eff["f_nosink_sink_selected"][row][0] == pytest.approx(
                    float(nos.f_score[0, h, m, j].mean()))
            else:
                assert np.isnan(got)
            assert eff["n_sink_selected"][row][0] == int(m.sum())


def test_non_finite_value_states_skip_the_rows_that_see_them() -> None:
    """An inf value (fp16 overflow) must not give valid-looking metrics."""
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(1, 6, 3, generator=gen)
    values[0, 4, 0] = float("inf")
    rows = torch.arange(1, 6)
    vis = causal_visibility(rows, 6)
    alpha = torch.softmax(torch.randn(1, 5, 6, generator=gen).masked_fill(~vis, float("-inf")), -1)
    res = topn_metrics(alpha, values, (1, 2), visible=vis, query_positions=rows)
    # rows t = 4, 5 see key 4; rows t = 1..3 do not and stay valid
    assert res.nonfinite[0].tolist() == [False, False, False, True, True]
    assert not res.valid[0, 0, 3:].any() and res.valid[0, 0, :3, 0].all()
    assert torch.isnan(res.f_score[0, 0, 3:]).all()
    clean = topn_metrics(alpha[:, :3, :4], values[:, :4], (1, 2), query_positions=rows[:3])
    torch.testing.assert_close(res.f_score[0, 0, :3], clean.f_score[0, 0], equal_nan=True)


def test_bound_columns_are_window_means_of_the_per_query_bounds() -> None:
    """The random repeats folded into one bounds call give the per-repeat bounds."""
    from attngeom.core.bounds import certified_bounds, window_constants

    acc = TopNAccumulator(_cfg(rules=("random",), distances=("euclidean",), bounds=True,
                               variants=("full",)))
    (batch,) = _batches(0, 4)
    acc.update(batch)
    table = acc.compute()["metrics"]
    alpha, values, rows, vis = _window(4)
    res = topn_metrics(alpha, values, GRID, rule="random", visible=vis, query_positions=rows,
                       repeats=3, seed=7, window=0, layer=0)
    consts = window_constants(ValueStats(values))
    per_k = [
        certified_bounds(alpha.double(), ValueStats(values), batch.kv_of_head, res.order[k],
                         batch.universe(), GRID, *consts)["recall_bound"]
        for k in range(3)
    ]
    stacked = torch.stack(per_k)  # (K, H, Q, NN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expect = np.nanmean(torch.where(res.valid, stacked, float("nan")).numpy(), axis=(0, 2))
    np.testing.assert_allclose(table["recall_bound"].reshape(H, len(GRID)), expect,
                               rtol=1e-12, equal_nan=True)
    assert (table["recall_bound"][~np.isnan(table["recall_bound"])]
            <= table["recall"][~np.isnan(table["recall_bound"])] + 1e-12).all()


def test_stacked_windows_equal_one_update_per_window() -> None:
    """update_many stacks windows along the head dimension; the tables do not change."""
    cfg = _cfg(bounds=True, rules=("attention", "contribution", "random"))
    one_by_one, stacked = TopNAccumulator(cfg), TopNAccumulator(cfg)
    batches = [b for w in range(3) for b in _batches(10 + w, w)]
    for b in batches:
        one_by_one.update(b)
    stacked.update_many(batches)
    a, b = one_by_one.compute(), stacked.compute()
    _assert_tables_equal(a["metrics"], b["metrics"])
    _assert_tables_equal(a["sink_effect"], b["sink_effect"])


def test_rules_in_one_pass_equal_each_rule_alone() -> None:
    """``topn_metrics_rules`` stacks the rules' orders as the K rows of one pass; every
    rule gets, bit for bit, what ``topn_metrics`` gives it alone (both universes, ties)."""
    from attngeom.core.geometry import topn_metrics_rules

    alpha, values, rows, vis = _window(4)
    alpha = alpha.clone()
    alpha[1] = (alpha[1] * 8).round() / 8  # tied scores
    for exclude_sink in (False, True):
        both = topn_metrics_rules(alpha, values, GRID, rules=("random", "attention",
                                  "contribution"), visible=vis, query_positions=rows,
                                  repeats=3, seed=7, exclude_sink=exclude_sink)
        assert list(both) == ["random", "attention", "contribution"]
        for rule, res in both.items():
            one = topn_metrics(alpha, values, GRID, rule=rule, visible=vis,
                               query_positions=rows, repeats=3, seed=7,
                               exclude_sink=exclude_sink)
            assert res.valid.shape[0] == (3 if rule == "random" else 1)
            for name in (*METRICS, "valid", "top", "sink_selected", "nonfinite"):
                got, want = getattr(res, name), getattr(one, name)
                if got.dtype.is_floating_point:
                    got, want = got.nan_to_num(-1.0), want.nan_to_num(-1.0)
                assert torch.equal(got, want), (rule, name)
    with pytest.raises(ConfigError, match="distinct"):
        topn_metrics_rules(alpha, values, GRID, rules=("attention", "attention"),
                           visible=vis, query_positions=rows)


def test_rules_sharing_a_pass_keep_their_own_path() -> None:
    """The Gram and direct paths round differently (exact ties can fall either way), so
    each rule's path is decided by its own rows: here the random rule's repeats make the
    Gram path pay while the attention rule alone takes the direct one, and the stacked
    call still gives each rule its lone result, ties included."""
    from attngeom.core.exact_counts import gram_pays as _gram_pays
    from attngeom.core.geometry import causal_visibility, topn_metrics_rules

    g, h, t, d, grid = 2, 4, 64, 64, (1, 2, 3, 4, 6, 8, 12, 16)
    qpos = torch.arange(60, 64)
    vis = causal_visibility(qpos, t)
    cpu = torch.device("cpu")
    assert _gram_pays(3 * 2 * 4, t, d, len(grid), 16, g, cpu)
    assert not _gram_pays(2 * 4, t, d, len(grid), 16, g, cpu)
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        values = (torch.randn(g, t, d, generator=gen) * 0.7).round() / 3  # exact ties
        logits = (torch.randn(h, qpos.numel(), t, generator=gen) * 0.5).round()
        alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
        stats = ValueStats(values, queries=qpos.numel())
        both = topn_metrics_rules(alpha, None, grid, rules=("random", "attention"),
                                  visible=vis, query_positions=qpos, repeats=3, stats=stats)
        for rule, res in both.items():
            one = topn_metrics(alpha, None, grid, rule=rule, visible=vis, query_positions=qpos,
                               repeats=3, stats=stats)
            for name in (*METRICS, "top"):
                assert torch.equal(getattr(res, name).nan_to_num(-1.0),
                                   getattr(one, name).nan_to_num(-1.0)), (seed, rule, name)


def test_kernel_budget_never_picks_the_path_so_ties_stay_put() -> None:
    """The Gram and direct paths round apart, so exact ties may fall either way between
    them; the memory budget (which changes no table) must not choose between them. Tie-
    heavy inputs, where the two paths do give different counts, agree under any budget."""
    from attngeom.core.exact_counts import gram_pays as _gram_pays
    from attngeom.core.geometry import causal_visibility, topn_metrics
    from attngeom.core.kernels import temporaries

    g, h, t, d, grid = 2, 4, 64, 64, (1, 2, 3, 4, 6, 8, 12, 16)
    qpos = torch.arange(0, 64)
    vis = causal_visibility(qpos, t)
    for budget in (1, 2**16, 2**20):
        with temporaries(budget):
            assert _gram_pays(2 * qpos.numel(), t, d, len(grid), 16, g, torch.device("cpu"))
    differ_by_path = 0
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        values = (torch.randn(g, t, d, generator=gen) * 0.7).round() / 3  # exact ties
        logits = (torch.randn(h, qpos.numel(), t, generator=gen) * 0.5).round()
        alpha = torch.softmax(logits.masked_fill(~vis, float("-inf")), -1)
        kw = dict(rule="attention", visible=vis, query_positions=qpos)
        res = {}
        for budget in (2**20, 2**16):
            with temporaries(budget):
                res[budget] = topn_metrics(alpha, values, grid, **kw)
        direct = topn_metrics(alpha, values, grid, path="direct", **kw)
        for name in ("precision", "recall", "inversions"):
            a, b = (getattr(res[x], name).nan_to_num(-1.0) for x in (2**20, 2**16))
            assert torch.equal(a, b), (seed, name)
            differ_by_path += int((a != getattr(direct, name).nan_to_num(-1.0)).sum())
    assert differ_by_path > 0  # the inputs do hold ties that the two paths break apart


def test_gram_sums_get_one_set_of_steps_whatever_the_chunk_width(monkeypatch) -> None:
    """The Gram row sums read their steps off the grid and the window, never off a chunk's
    width: compiled, each distinct steps tuple is another graph (dynamo's limit of 32
    graphs would switch compilation off for a run of narrow chunks)."""
    from attngeom.core import exact_counts, geometry, kernels

    seen = set()
    plain = kernels.gram_sums

    def spy(gram, top, a_top, steps, width):
        seen.add((steps, top.shape[-1]))
        return plain(gram, top, a_top, steps, width)

    monkeypatch.setattr(exact_counts, "summing_gram", lambda: spy)
    gen = torch.Generator().manual_seed(0)
    t = 40
    alpha = torch.softmax(torch.randn(2, t, t, generator=gen), -1)
    values = torch.randn(1, t, 4, generator=gen)
    geometry.topn_metrics(alpha, values, (1, 2, 4, 8, 16, 32), path="gram", chunk_rows=1)
    assert len(seen) == 1, seen


def test_random_orders_take_a_universe_shared_by_the_heads() -> None:
    """``select_order`` with a (1, Q, T) universe (broadcast over heads) gives the orders
    of the universe expanded to every head."""
    from attngeom.core.geometry import causal_visibility, select_order

    h, t = 3, 9
    pos = torch.tensor([4, 6, 8])
    alpha = torch.full((h, 3, t), 1 / t, dtype=torch.float64)
    norms = torch.ones(h, t, dtype=torch.float64)
    uni = causal_visibility(pos, t)
    kw = dict(repeats=2, query_positions=pos, seed=5)
    shared = select_order(alpha, norms, uni, "random", 4, **kw)
    assert torch.equal(shared, select_order(alpha, norms, uni.expand(h, 3, t), "random", 4,
                                            **kw))


def test_both_variants_bounds_in_one_call_equal_a_call_each() -> None:
    """``final`` rows: with a budget that holds both variants' bound rows the accumulator
    stacks them into one ``bounds_of_top`` call, with half of it one call per variant;
    the bound columns (and every other) are the same bits either way, on a window with a
    sink among the first keys."""
    from unittest import mock

    from attngeom.core import accumulators

    gen = torch.Generator().manual_seed(4)
    h, g, t = 4, 2, 50
    qpos = torch.tensor([t - 1])
    logits = torch.randn(h, 1, t, generator=gen)
    logits[..., 0] += 3.0
    alpha = torch.softmax(logits, -1)
    values = torch.randn(g, t, 8, generator=gen)
    cfg = TopNConfig(n_grid=(1, 2, 4, 8), repeats=3, bounds=True)
    k = cfg.repeats + len(cfg.rules) - 1  # the orders of one variant's call
    one = 48 * k * h * t  # the bytes of one variant's rows
    tables, calls = [], []
    # the bounds' own budget only (the metrics' pieces, and how their products round,
    # stay as they are)
    for budget in (2 * one, one):  # both together, then one variant per call
        acc = TopNAccumulator(cfg)
        with mock.patch.object(accumulators, "_BOUND_CHUNK_BYTES", budget), mock.patch.object(
                accumulators, "bounds_of_top", wraps=accumulators.bounds_of_top) as spy:
            acc.update(AttentionBatch(0, 0, alpha, causal_visibility(qpos, t), qpos,
                                      ValueStats(values)))
        calls.append(spy.call_count)
        tables.append(acc.compute()["metrics"])
    assert calls == [1, 2]
    for name, column in tables[0].items():
        if column.dtype.kind == "f":
            assert ((column == tables[1][name]) | (column != column)).all(), name
        else:
            assert (column == tables[1][name]).all(), name
    assert np.isfinite(tables[0]["f_bound"]).any()


def test_cell_sums_own_their_storage() -> None:
    """Every sum of a cell is its own tensor, never a view of the stacked sums: a pickled
    shard stores a view's whole storage, so views would hold each stack once per column."""
    from attngeom.core.accumulators import BOUND_COLUMNS

    acc = TopNAccumulator(_cfg(bounds=True, distances=("euclidean",)))
    (batch,) = _batches(0, 1)
    acc.update(batch)
    assert acc.cells
    for cell in acc.cells.values():
        assert set(cell.sums) == {*METRICS, *BOUND_COLUMNS}
        for x in (*cell.sums.values(), cell.counts, cell.bound_counts):
            assert x.untyped_storage().nbytes() == x.numel() * x.element_size()

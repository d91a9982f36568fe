"""Head taxonomy (SPEC 4): constructed heads with known regimes, ties, signatures, streaming."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attngeom.core.batch import ValueStats
from attngeom.core.taxonomy import (
    TAXONOMY_COLUMNS,
    TaxonomyAccumulator,
    classify_regime,
    output_inner_products,
    source_winners,
    taxonomy_rows,
)
from attngeom.errors import ConfigError
from tests.core.batches import batch_of, causal

T = 6


def constructed_heads():
    """Unit-norm values; head 0 peaks on the query token (Retriever), head 1 on the sink
    (Mixer), head 2 on the token two back (Reset), head 3 splits self / sink evenly in
    count (a regime tie -> Retriever)."""
    v = torch.eye(T).unsqueeze(0)
    qpos = torch.arange(1, T)
    vis = causal(qpos, T)
    q = qpos.numel()
    alpha = torch.zeros(4, q, T)
    for i, t in enumerate(qpos.tolist()):
        base = vis[0, i].float() * 0.1
        rows = [base.clone() for _ in range(4)]
        rows[0][t] += 1.0
        rows[1][0] += 1.0
        if t >= 3:  # t = 1, 2 stay uniform: the tie goes to the sink
            rows[2][t - 2] += 1.0
        rows[3][t if i % 2 == 0 else 0] += 1.0
        for h in range(4):
            alpha[h, i] = rows[h] / rows[h].sum()
    return v, alpha, qpos


def test_constructed_regimes() -> None:
    v, alpha, qpos = constructed_heads()
    acc = TaxonomyAccumulator()
    acc.update(batch_of(v, alpha, qpos))
    out = acc.compute()["taxonomy"]
    assert list(out) == list(TAXONOMY_COLUMNS)
    assert out["regime"].tolist()[:2] == ["Retriever", "Mixer"]
    assert out["f_self"][0] == 1.0 and out["f_sink"][1] == 1.0
    # head 2: t = 3, 4, 5 win at t - 2 (other); t = 1, 2 are uniform rows whose tie goes to
    # the smaller position, the sink: f_other 3/5, f_sink 2/5 -> Reset
    assert out["f_other"][2] == pytest.approx(0.6) and out["f_sink"][2] == pytest.approx(0.4)
    assert out["regime"][2] == "Reset"
    # head 3: queries 0, 2, 4 self (3 of 5), 1, 3 sink: Retriever; counts checked below
    assert out["f_self"][3] == pytest.approx(0.6) and out["regime"][3] == "Retriever"
    assert out["n_queries"].tolist() == [5, 5, 5, 5]
    # offsets: head 0 always 0 -> entropy 0; head 1 offsets t - 0 = 1..5 -> ln 5
    assert out["offset_entropy"][0] == pytest.approx(0.0)
    assert out["offset_entropy"][1] == pytest.approx(math.log(5))
    # head 2: offsets 2, 2, 2 (t = 3..5), 1, 2 (t = 1, 2 -> sink): {2: 4, 1: 1}
    p = np.array([0.8, 0.2])
    assert out["offset_entropy"][2] == pytest.approx(-(p * np.log(p)).sum())


def test_winner_ties_use_contribution_and_smaller_position() -> None:
    """alpha * ||v||, exact ties to the smaller position.

    norms (2, 1, 1): row 0 contributions (.4, .4, .4) all tie -> 0; row 1 (1, .25, .25) -> 0.
    norms (.5, 1, 1): row 0 (.1, .4, .4) -> 1 (tie of 1 and 2); row 1 (.25, .25, .25) -> 0.
    With norms (1, 1, 3) the largest alpha loses to the largest norm: row 1 -> 2.
    """
    alpha = torch.tensor([[[0.2, 0.4, 0.4], [0.5, 0.25, 0.25]]])
    norms = torch.tensor([[2.0, 1.0, 1.0]], dtype=torch.float64)
    uni = torch.ones(1, 2, 3, dtype=torch.bool)
    assert source_winners(alpha, norms, uni).tolist() == [[0, 0]]
    norms = torch.tensor([[1.0, 1.0, 3.0]], dtype=torch.float64)
    assert source_winners(alpha, norms, uni).tolist() == [[2, 2]]
    norms = torch.tensor([[0.5, 1.0, 1.0]], dtype=torch.float64)
    assert source_winners(alpha, norms, uni).tolist() == [[1, 0]]
    uni[0, 0, 1] = False  # key 1 masked: 2 wins
    assert source_winners(alpha, norms, uni).tolist()[0][0] == 2


def test_regime_tie_order() -> None:
    """Equal counts resolve Retriever > Mixer > Reset."""
    got = classify_regime(np.array([1, 0, 1, 0, 2]), np.array([1, 1, 0, 0, 1]),
                          np.array([1, 1, 1, 1, 0]))
    assert got.tolist() == ["Retriever", "Mixer", "Retriever", "Reset", "Retriever"]


def test_no_valid_query_gives_none_and_nan() -> None:
    """A layer analysed only at t = 0 has no valid query: regime none, NaN fractions."""
    v = torch.randn(1, 4, 2)
    acc = TaxonomyAccumulator()
    acc.update(batch_of(v, torch.tensor([[[1.0, 0, 0, 0]]]), torch.tensor([0])))
    out = acc.compute()["taxonomy"]
    assert out["regime"].tolist() == ["none"] and out["n_queries"].tolist() == [0]
    for name in ("f_self", "f_sink", "f_other", "offset_entropy", "sink_alignment",
                 "self_alignment", "mean_output_norm"):
        assert math.isnan(out[name][0]), name


@pytest.mark.parametrize("d", [3, 12])  # d < T uses ||alpha V||^2, d >= T alpha^T G alpha
def test_signature_matches_explicit_outputs(d: int) -> None:
    gen = torch.Generator().manual_seed(d)
    t = 8
    v = torch.randn(2, t, d, generator=gen)
    v[1, 3] = 0.0  # a zero value: its cosines are 0
    qpos = torch.arange(1, t)
    vis = causal(qpos, t)
    alpha = torch.softmax(torch.randn(4, t - 1, t, generator=gen).masked_fill(~vis, -math.inf),
                          -1)
    b = batch_of(v, alpha, qpos)
    ip = output_inner_products(alpha, b.stats, b.kv_of_head, qpos)
    kv = b.kv_of_head
    z = torch.einsum("hqt,htd->hqd", alpha.double(), v.double()[kv])
    torch.testing.assert_close(ip["z_sq"], (z * z).sum(-1))
    torch.testing.assert_close(ip["z_sink"], (z * v.double()[kv][:, None, 0]).sum(-1))
    vt = v.double()[kv][:, qpos]
    torch.testing.assert_close(ip["z_self"], (z * vt).sum(-1))
    rows = taxonomy_rows(b)

    def cos(a, b):
        den = a.norm(dim=-1) * b.norm(dim=-1)
        return torch.where(den > 0, (a * b).sum(-1) / den.clamp_min(1e-300), 0.0)

    torch.testing.assert_close(rows["sink_alignment"], cos(z, v.double()[kv][:, None, 0]))
    torch.testing.assert_close(rows["self_alignment"], cos(z, vt))
    torch.testing.assert_close(rows["output_norm"], z.norm(dim=-1))
    acc = TaxonomyAccumulator()
    acc.update(b)
    out = acc.compute()["taxonomy"]
    np.testing.assert_allclose(out["sink_alignment"],
                               cos(z, v.double()[kv][:, None, 0]).mean(-1).numpy())
    np.testing.assert_allclose(out["mean_output_norm"], z.norm(dim=-1).mean(-1).numpy())
    # the brute-force winner
    contrib = alpha.double() * v.double().norm(dim=-1)[kv][:, None, :]
    win = contrib.masked_fill(~vis, -1).argmax(-1)
    assert torch.equal(rows["winner"], win)


def test_mixer_sink_aligned_retriever_self_aligned() -> None:
    """Signature of the constructed heads: Mixer output = mostly v0 (sink alignment near
    1), Retriever output = mostly v_t."""
    v, alpha, qpos = constructed_heads()
    acc = TaxonomyAccumulator()
    acc.update(batch_of(v, alpha, qpos))
    out = acc.compute()["taxonomy"]
    assert out["sink_alignment"][1] > 0.9 and out["self_alignment"][0] > 0.9
    assert out["sink_alignment"][0] < 0.5 and out["self_alignment"][1] < 0.5


def test_merge_and_chunks_equal_one_run() -> None:
    gen = torch.Generator().manual_seed(9)
    wins = []
    for _ in range(4):
        v = torch.randn(2, 9, 3, generator=gen)
        qpos = torch.arange(9)
        vis = causal(qpos, 9)
        a = torch.softmax((torch.randn(4, 9, 9, generator=gen) * 3).masked_fill(~vis, -math.inf),
                          -1)
        wins.append((v, a, qpos))
    whole = TaxonomyAccumulator()
    for w, (v, a, q) in enumerate(wins):
        for layer in (0, 1):
            whole.update(batch_of(v, a, q, window=w, layer=layer))
    shards = [TaxonomyAccumulator(), TaxonomyAccumulator()]
    for w, (v, a, q) in enumerate(wins):
        stats = ValueStats(v)
        for layer in (0, 1):
            for part in torch.tensor_split(torch.arange(q.numel()), 4):
                shards[w % 2].update(batch_of(v, a[:, part], q[part], window=w, layer=layer,
                                              stats=stats))
    half = shards[0].compute()["taxonomy"]
    merged_acc = shards[0].merge(shards[1])
    # a merged window's sources: its four chunks' summed into one int32 array
    kept = [merged_acc._layers[layer].windows[w]["other"] for layer in (0, 1) for w in (1, 3)]
    assert all(len(o) <= 1 and all(a.dtype == np.int32 for a in o) for o in kept)
    assert any(len(o) == 1 for o in kept)
    merged = merged_acc.compute()["taxonomy"]
    ref = whole.compute()["taxonomy"]
    assert list(merged) == list(ref)
    for k in ref:
        if ref[k].dtype.kind == "f":
            np.testing.assert_allclose(merged[k], ref[k], rtol=1e-12, equal_nan=True)
        else:
            assert merged[k].tolist() == ref[k].tolist()
    assert not np.allclose(half["f_self"], merged["f_self"])
    assert merged["layer"].tolist() == [0] * 4 + [1] * 4


def test_encoder_negative_offsets() -> None:
    """Bidirectional rows: a winner after the query gives a negative offset."""
    v = torch.eye(4).unsqueeze(0)
    qpos = torch.tensor([1, 2])
    vis = torch.ones(1, 2, 4, dtype=torch.bool)
    alpha = torch.tensor([[[0.1, 0.1, 0.1, 0.7], [0.1, 0.1, 0.1, 0.7]]])
    acc = TaxonomyAccumulator()
    acc.update(batch_of(v, alpha, qpos, visible=vis))
    out = acc.compute()["taxonomy"]
    assert out["f_other"][0] == 1.0 and out["regime"][0] == "Reset"
    p = np.array([0.5, 0.5])  # offsets -2 and -1
    assert out["offset_entropy"][0] == pytest.approx(-(p * np.log(p)).sum())


def test_bad_kv_mapping_and_head_count() -> None:
    v = torch.randn(2, 4, 2)
    alpha = torch.full((2, 1, 4), 0.25)
    with pytest.raises(ConfigError, match="kv_of_head"):
        output_inner_products(alpha, ValueStats(v), torch.tensor([1, 0]), torch.tensor([3]))
    acc = TaxonomyAccumulator()
    acc.update(batch_of(v, alpha, torch.tensor([3])))
    with pytest.raises(ConfigError, match="heads"):
        acc.update(batch_of(v, torch.full((4, 1, 4), 0.25), torch.tensor([3])))



# --------------------------------------------------------------------------- single source


def _structured_windows(seed: int, count: int, t: int = 12, heads: int = 6):
    """Windows whose heads prefer (0) self, (1) the sink, (2) the previous token,
    (3) a fixed position 2, (4, 5) random keys: every regime and source kind occurs."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        v = torch.randn(2, t, 3, generator=gen) + 0.5
        qpos = torch.arange(1, t)
        vis = causal(qpos, t)
        logits = torch.randn(heads, qpos.numel(), t, generator=gen)
        rows = torch.arange(qpos.numel())
        bump = 2.5 + torch.rand(qpos.numel(), generator=gen) * 2
        logits[0, rows, qpos] += bump
        logits[1, :, 0] += bump
        logits[2, rows, qpos - 1] += bump
        logits[3, rows[qpos >= 2], 2] += bump[qpos >= 2]
        alpha = torch.softmax(logits.masked_fill(~vis, -math.inf), -1)
        out.append((v, alpha, qpos))
    return out


def _reference_windows(wins, head: int):
    out = []
    for v, a, q in wins:
        t = v.shape[1]
        norms = v[head * v.shape[0] // a.shape[0]].double().norm(dim=-1).tolist()
        vis = causal(q, t)[0]
        rows = {int(q[i]): (a[head, i].double().tolist(), vis[i].tolist())
                for i in range(q.numel())}
        out.append({"T": t, "norms": norms, "rows": rows})
    return out


@pytest.mark.parametrize("rule", ["single", "lumped"])
@pytest.mark.parametrize("counted", ["final", "half"])
@pytest.mark.parametrize("seed", [0, 1])
def test_single_source_taxonomy_equals_the_reference(rule, counted, seed) -> None:
    """Regime, shares, top source and label stability of every head equal the loop
    reference written from SPEC 4, with query chunks and two shards merged."""
    from attngeom.core.stats import bootstrap_indices
    from tests.reference_taxonomy import reference_head_taxonomy

    wins = _structured_windows(seed, 7)
    n_boot = 64
    shards = [TaxonomyAccumulator(counted=counted, rule=rule, n_boot=n_boot, seed=seed)
              for _ in range(2)]
    for w, (v, a, q) in enumerate(wins):
        stats = ValueStats(v)
        for part in torch.tensor_split(torch.arange(q.numel()), 3):
            shards[w % 2].update(batch_of(v, a[:, part], q[part], window=10 + w, stats=stats))
    out = shards[0].merge(shards[1]).compute()["taxonomy"]
    resamples = bootstrap_indices(len(wins), n_boot, seed).tolist()
    regimes = set()
    for head in range(6):
        ref = reference_head_taxonomy(_reference_windows(wins, head), counted=counted,
                                      rule=rule, resamples=resamples)
        assert out["regime"][head] == ref["regime"], head
        regimes.add(ref["regime"])
        assert out["n_queries"][head] == ref["n_queries"]
        for key in ("f_self", "f_sink", "f_other", "winning_share", "runner_up_share",
                    "top_source_share", "stability"):
            assert out[key][head] == pytest.approx(ref[key], rel=1e-12, nan_ok=True), key
        assert out["top_source_kind"][head] == ref["top_source_kind"]
        assert out["top_source"][head] == ref["top_source"]
        assert out["regime_rule"][head] == rule
    if rule == "single":
        assert regimes == {"Retriever", "Mixer", "Reset"}


def test_previous_token_head_reads_offset_one_and_counted_half() -> None:
    """A previous-token head is a Reset whose top other source is offset 1; under the
    lumped rule a spread-out head wins by count, under the single rule it does not.
    With counted="half" the rows t < T/2 do not count."""
    wins = _structured_windows(5, 4, t=16)
    acc = TaxonomyAccumulator(counted="half", n_boot=20)
    for w, (v, a, q) in enumerate(wins):
        acc.update(batch_of(v, a, q, window=w))
    out = acc.compute()["taxonomy"]
    assert out["regime"][2] == "Reset"
    assert (out["top_source_kind"][2], out["top_source"][2]) == ("offset", 1)
    assert out["n_queries"].tolist() == [4 * 8] * 6  # t = 8..15 of each window
    assert (out["top_source_kind"][3], out["top_source"][3]) == ("position", 2)
    assert out["stability"].min() >= 0.0 and out["stability"].max() <= 1.0


def test_stability_is_nan_without_bootstrap_and_bad_options() -> None:
    v, alpha, qpos = constructed_heads()
    acc = TaxonomyAccumulator(n_boot=0)
    acc.update(batch_of(v, alpha, qpos))
    assert np.isnan(acc.compute()["taxonomy"]["stability"]).all()
    with pytest.raises(ConfigError, match="regime_rule"):
        TaxonomyAccumulator(rule="plurality")
    with pytest.raises(ConfigError, match="counted"):
        TaxonomyAccumulator(counted="late")
    with pytest.raises(ConfigError, match="counted, rule"):
        TaxonomyAccumulator(rule="single").merge(TaxonomyAccumulator(rule="lumped"))


def _resampled_top_whole(sources_w, weights, num_heads):
    """The resampled n_top straight from the definition: every (resample, source) sum."""
    rows = np.concatenate([r for _, r in sources_w])
    cols = np.concatenate([np.full(len(r), w) for w, r in sources_w])
    out = np.zeros((weights.shape[0], num_heads))
    for key in {tuple(x) for x in rows[:, :3].tolist()}:
        mine = (rows[:, :3] == key).all(1)
        total = weights[:, cols[mine]] @ rows[mine, 3].astype(np.float64)
        out[:, key[0]] = np.maximum(out[:, key[0]], total)
    return out


@pytest.mark.parametrize("elements", [1, 7, 64, 2**22])
def test_resampled_top_in_blocks_equals_the_definition(elements, monkeypatch) -> None:
    """The resampled counts come in blocks of source rows (a corpus of ``all`` queries
    has millions); any block size gives the definition's numbers exactly."""
    from attngeom.core import taxonomy

    monkeypatch.setattr(taxonomy, "_RESAMPLE_ELEMENTS", elements)
    rng = np.random.default_rng(elements)
    h, w_count = 3, 9
    sources = []
    for w in range(w_count):
        n = int(rng.integers(0, 12))
        rows = np.stack([rng.integers(0, h, n), rng.integers(0, 2, n),
                         rng.integers(-4, 5, n), rng.integers(1, 6, n)], 1)
        sources.append((w, rows.astype(np.int64)))
    weights = rng.integers(0, 3, (11, w_count)).astype(np.float64)
    got = taxonomy._resampled_top(sources, weights, h, chunk=4)
    assert np.array_equal(got, _resampled_top_whole(sources, weights, h))


def test_source_rows_are_int32_only_where_they_fit() -> None:
    from attngeom.core.taxonomy import _compact, _other_sources

    small = _compact(np.array([[0, 0, -3, 5], [1, 1, 7, 2]]))
    assert small.dtype == np.int32
    huge = _compact(np.array([[0, 0, -1, 2**31]]))  # a corpus fed as one window
    assert huge.dtype == np.int64 and int(huge[0, 3]) == 2**31
    assert _other_sources([small, huge, small]).tolist() == [
        [0, 0, -3, 10], [0, 0, -1, 2**31], [1, 1, 7, 4]]

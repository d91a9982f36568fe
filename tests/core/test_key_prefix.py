"""Query chunks stop at the last key their rows can see (``ValueStats.key_prefix``).

Causal rows of ``all`` queries see a prefix of the window; the metrics and bounds cut
each chunk's keys there. One-row chunks (the shortest prefixes, shorter than N_max near
the start) must give the tables of whole-window rows: the same orders, padding, counts
and F_N, and margins within matrix-product rounding.
"""

import pytest
import torch

from attngeom.core.batch import ValueStats
from attngeom.core.geometry import topn_metrics
from attngeom.core.metrics import metrics

GRID = [1, 2, 4, 8, 16]


def _rows(t: int = 24, h: int = 4, g: int = 2, d: int = 3):
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(h, t, t, generator=gen) * 2
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1), torch.randn(g, t, d, generator=gen)


@pytest.mark.parametrize("rule", ["attention", "contribution", "random"])
@pytest.mark.parametrize("path", ["direct", "gram"])
@pytest.mark.parametrize("exclude_sink", [False, True])
def test_one_row_chunks_give_the_whole_window_rows(rule, path, exclude_sink):
    alpha, values = _rows()
    kw = dict(rule=rule, path=path, exclude_sink=exclude_sink, repeats=3,
              query_positions=torch.arange(alpha.shape[1]))
    whole = topn_metrics(alpha, values, GRID, chunk_rows=alpha.shape[1], **kw)
    rows = topn_metrics(alpha, values, GRID, chunk_rows=1, **kw)
    assert torch.equal(whole.top, rows.top)  # padding past the prefix as the window pads
    assert torch.equal(whole.valid, rows.valid)
    for m in metrics():
        if m.exact:
            assert torch.equal(whole.metric(m.name).nan_to_num(-1.0),
                               rows.metric(m.name).nan_to_num(-1.0)), m.name
        else:  # float32 values: the shorter key axis changes the summation order
            torch.testing.assert_close(whole.metric(m.name), rows.metric(m.name), rtol=1e-6,
                                       atol=1e-7, equal_nan=True)
    # the early rows really were cut short: position 2 sees keys 0..2 only
    assert whole.universe[:, 2, 3:].sum() == 0


def test_key_prefix_cuts_the_cached_statistics():
    _, values = _rows()
    stats = ValueStats(values)
    part = stats.key_prefix(5, with_gram=True)
    assert part.num_keys == 5 and part.queries == stats.queries
    assert torch.equal(part.norms, stats.norms[:, :5])
    assert torch.equal(part.gram, stats.gram[:, :5, :5])
    assert stats.key_prefix(stats.num_keys) is stats


def test_nan_value_at_a_key_no_row_sees_changes_nothing():
    """A non-finite value state outside every universe pads short rows' orders; it must
    not poison the Gram path, whatever the chunking (found by a fuzzing review)."""
    gen = torch.Generator().manual_seed(3)
    t = 8
    values = torch.randn(1, t, 3, generator=gen, dtype=torch.float64)
    values[0, 6] = float("nan")
    alpha = torch.rand(2, t, t, generator=gen, dtype=torch.float64)
    visible = torch.tril(torch.ones(t, t, dtype=torch.bool))[None]
    visible[..., 6] = False
    alpha = torch.where(visible, alpha, 0.0)
    alpha = alpha / alpha.sum(-1, keepdim=True)
    runs = [topn_metrics(alpha, values, [1, 2, 4, 8], visible=visible, path=path,
                         chunk_rows=rows)
            for path, rows in (("gram", 1), ("gram", 8), ("direct", 1), ("direct", 8))]
    for other in runs[1:]:
        for name in (m.name for m in metrics() if m.exact):
            assert torch.equal(runs[0].metric(name).nan_to_num(-1),
                               other.metric(name).nan_to_num(-1)), name
    assert not bool(runs[0].nonfinite.any())


def test_stacked_windows_hold_their_gram_matrices_once() -> None:
    """Stacking windows' value stats gives each window's own Gram product (bit for bit),
    held once: the parts' matrices are views of the stack's, and the next stack of the
    same parts (the layer's next query chunk) reuses it instead of copying."""
    import torch

    from attngeom.core.batch import ValueStats

    gen = torch.Generator().manual_seed(0)
    parts = [ValueStats(torch.randn(2, 50, 8, generator=gen)) for _ in range(3)]
    alone = [p.values64 @ p.values64.transpose(-1, -2) for p in parts]
    first = ValueStats.stack(parts).gram
    assert torch.equal(first, torch.cat(alone))
    assert all(p.gram._base is first for p in parts)
    assert ValueStats.stack(parts).gram is first
    other = ValueStats(torch.randn(2, 50, 8, generator=gen))
    assert other.gram.shape == (2, 50, 50)  # its own first: a stack with it copies
    assert torch.equal(ValueStats.stack([other, parts[1]]).gram,
                       torch.cat([other.gram, alone[1]]))

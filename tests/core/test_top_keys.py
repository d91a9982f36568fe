"""``top_keys`` against a stable full sort, on rows with and without ties (the tie-free
rows take the topk shortcut, the others the tie-breaking selection)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attngeom.core.geometry import top_keys


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 4), t=st.integers(1, 50),
       nmax=st.integers(1, 60), levels=st.sampled_from([2, 5, 10**9]),
       largest=st.booleans(), integer=st.booleans())
def test_top_keys_is_the_stable_sort_prefix(seed, rows, t, nmax, levels, largest, integer):
    gen = torch.Generator().manual_seed(seed)
    score = torch.randint(0, levels, (rows, t), generator=gen)
    score = score if integer else score.double() / levels
    universe = torch.rand(rows, t, generator=gen) < 0.85
    got = top_keys(score, universe, nmax, largest=largest)
    key = -score.double() if largest else score.double()
    key = torch.where(universe, key, float("inf"))  # the rest after every universe key
    want = torch.sort(key, dim=-1, stable=True).indices[:, : min(nmax, t)]
    usize = universe.sum(-1)
    for r in range(rows):
        k = min(int(usize[r]), nmax)  # past |U| the padding order is not specified
        assert got[r, :k].tolist() == want[r, :k].tolist()
        assert sorted(got[r].tolist()) == sorted(set(got[r].tolist()))

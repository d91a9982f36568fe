"""Context-length sweep: nested windows, both scorings, N* per L, bootstrap and slope."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from architectures import make_model

from attngeom.assets import asset
from attngeom.capture import load_tokenizer
from attngeom.config import CompetitionConfig
from attngeom.engine.runner import RunContext
from attngeom.errors import ConfigError
from attngeom.interventions.selection import Selection, restriction
from attngeom.probes.context_sweep import (
    ContextInputs,
    _replicate_nstar,
    document_nll,
    loglog_slope,
    nested_suffixes,
    run_context,
    sweep_windows,
)


def context_sweep(model, windows, *, taus=(0.01, 0.05, 0.1), tail=128, n_boot=1000, seed=0,
                  batch_size=4, selections=(Selection("attention"),)):  # noqa: B008
    """The context probe's tables for nested ``windows`` on ``model`` (no run folder)."""
    cfg = CompetitionConfig(model="m", corpus="c", probe="context", taus=taus, tail=tail,
                            bootstrap=n_boot, seed=seed, batch_size=batch_size,
                            lengths=tuple(sorted(windows)))
    inputs = ContextInputs(windows=windows, record=None, corpus="c",
                           selections=tuple(selections))
    return run_context(RunContext.in_memory(cfg, model, inputs=inputs))


def _windows(d: int = 4, t: int = 64, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (d, t), generator=gen)
    ids[:, 0] = 1
    return list(ids)


def test_nested_suffixes_end_at_the_same_token() -> None:
    wins = _windows()
    nested = nested_suffixes(wins, [16, 32, 64])
    for length, ids in nested.items():
        assert ids.shape == (4, length)
        assert (ids[:, 0] == 1).all()
        for w, row in zip(wins, ids, strict=True):
            assert torch.equal(row[1:], w[64 - length + 1:])
    assert torch.equal(nested[64], torch.stack(wins))
    with pytest.raises(ConfigError, match="at least that length"):
        nested_suffixes(wins, [65])


def test_sweep_windows_come_from_the_fixed_length_protocol() -> None:
    tok = load_tokenizer(asset("stories260K"))
    docs = [" ".join(f"Story {k} line {i}: the cat sat on the mat and looked around."
                     for i in range(30)) for k in range(6)]
    nested, record = sweep_windows(docs, tok, [160, 200], n_documents=3, seed=2027,
                                   dataset="toy", model_id="stories")
    assert record.window_length == 200 and len(record.chosen) == 3
    assert nested[200].shape == (3, 200) and nested[160].shape == (3, 160)
    assert torch.equal(nested[160][:, 1:], nested[200][:, 41:])
    with pytest.raises(ConfigError, match="above the tail"):
        sweep_windows(docs, tok, [64, 128], n_documents=3, seed=0, dataset="toy",
                      model_id="stories")


def test_document_nll_scorings() -> None:
    model = make_model("llama")
    ids = torch.stack(_windows(3, 40))
    all_nll, tail_nll = document_nll(model, ids, tail=8, batch_size=2)
    for i in range(3):
        with torch.no_grad():
            logits = model(ids[i: i + 1]).logits[0].double()
        nll = -torch.log_softmax(logits[:-1], -1).gather(1, ids[i, 1:, None])[:, 0]
        assert all_nll[i] == pytest.approx(float(nll.mean()), rel=1e-6)
        assert tail_nll[i] == pytest.approx(float(nll[-8:].mean()), rel=1e-6)


def test_slope_of_a_power_law() -> None:
    lengths = [256, 512, 1024, 2048]
    assert loglog_slope(lengths, [3 * x ** 0.8 for x in lengths]) == pytest.approx(0.8)
    # the paper's Llama-3-8B / WikiText: N* = 2 + L/32 -> (10, 18, 34, 66)
    assert loglog_slope(lengths, [10, 18, 34, 66]) == pytest.approx(0.9078, abs=1e-3)
    assert math.isnan(loglog_slope([256], [10]))


def test_replicate_nstar_reads_the_evaluated_ns() -> None:
    base = np.array([1.0, 1.0, 1.0])
    per_n = {2: np.array([2.0, 2.0, 2.0]), 4: np.array([1.0, 1.0, 4.0]),
             8: np.array([1.0, 1.0, 1.0])}
    draws = np.array([[0, 1, 2], [0, 0, 1], [2, 2, 2]])
    # replicate 0: N=4 delta 1.0 fails 0.5, N=8 passes; replicate 1: N=4 passes;
    # replicate 2: only document 2, N=4 fails, N=8 passes
    assert _replicate_nstar(base, per_n, 0.5, 16, draws).tolist() == [8, 4, 8]
    assert _replicate_nstar(base, {}, 0.5, 16, draws).tolist() == [16, 16, 16]


def test_sweep_against_an_exhaustive_scan() -> None:
    """N*_tau per L is the smallest tried N that passes, and never above the true minimum
    of a full scan where the scanned curve is monotone."""
    model = make_model("llama")
    windows = nested_suffixes(_windows(3, 48), [16, 32, 48])
    taus = (0.02, 0.2)
    frames = context_sweep(model, windows, selections=(Selection("attention", False),),
                           taus=taus, tail=8, n_boot=200, seed=1, batch_size=3)
    nstar = frames["context_nstar"]
    assert set(nstar["scoring"]) == {"tail", "all"}
    for length, ids in windows.items():
        base_all, base_tail = document_nll(model, ids, tail=8)
        scan = {}
        for n in range(1, length):
            with restriction(model, n, ranking="attention", renormalize=False):
                a, t = document_nll(model, ids, tail=8)
            scan[n] = {"all": (a.mean() - base_all.mean()) / base_all.mean(),
                       "tail": (t.mean() - base_tail.mean()) / base_tail.mean()}
        for scoring in ("tail", "all"):
            for tau in taus:
                row = nstar[(nstar.length == length) & (nstar.scoring == scoring)
                            & (nstar.tau == tau)].iloc[0]
                found = int(row["nstar"])
                passing = [n for n in scan if scan[n][scoring] <= tau]
                true_min = min(passing) if passing else length
                assert found >= true_min
                if found < length:
                    assert scan[found][scoring] <= tau
                if all(scan[n][scoring] > tau for n in range(1, found)):
                    assert found == true_min
                assert row["nstar_low"] <= row["nstar_high"]
                tried = curve_of(frames, length, scoring)
                stable = int(row["nstar_stable"])
                assert stable >= found
                assert all(d <= tau for n, d in tried.items() if n >= stable)
    curve = frames["context_curve"]
    assert (curve.groupby(["length", "scoring"])["n"].nunique() > 0).all()
    slope = frames["context_slope"]
    assert len(slope) == 2 * len(taus) and slope["n_lengths"].eq(3).all()
    assert frames["context_nll"]["nll"].gt(0).all()


def curve_of(frames, length, scoring) -> dict[int, float]:
    c = frames["context_curve"]
    c = c[(c.length == length) & (c.scoring == scoring)]
    return dict(zip(c["n"], c["delta_rel"], strict=True))


def test_bad_lengths_one_line() -> None:
    model = make_model("llama")
    windows = nested_suffixes(_windows(2, 32), [16, 32])
    with pytest.raises(ConfigError, match="tail: expected fewer scored targets than the "
                                          "shortest length 16"):
        context_sweep(model, windows, tail=16)
    with pytest.raises(ConfigError, match="ranking: unknown restriction ranking 'bogus'"):
        context_sweep(model, windows, tail=8, selections=(Selection("bogus"),))

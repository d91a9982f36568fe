"""The benchmarks' own pieces: the naive baseline computes what the fast kernel does, and
the GPU script (which no machine of this project has run on a GPU) runs end to end on
its CPU path. No timing is asserted: only that the numbers exist and agree."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from attngeom.core.batch import ValueStats
from attngeom.core.geometry import causal_visibility, topn_metrics

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
from naive_metrics import naive_topn  # noqa: E402


def test_naive_baseline_agrees_with_topn_metrics() -> None:
    gen = torch.Generator().manual_seed(7)
    h, g, t, d = 4, 2, 40, 8
    rows = torch.tensor([5, 17, 30, 39])
    scores = torch.randn(h, rows.numel(), t, generator=gen) * 3
    vis = causal_visibility(rows, t)
    alpha = torch.softmax(scores.masked_fill(~vis, float("-inf")), -1)
    values = torch.randn(g, t, d, generator=gen)
    grid = (1, 2, 4, 8, 16)
    fast = topn_metrics(alpha, None, grid, visible=vis, query_positions=rows,
                        stats=ValueStats(values, queries=rows.numel())).f_score[0]
    ref = naive_topn(alpha, values, grid, vis)
    assert ref.shape == fast.shape
    both_nan = ref.isnan() & fast.isnan()
    assert bool((both_nan | ((ref - fast).abs() <= 1e-9)).all())
    # undefined exactly where N is not below the row's |U| = t + 1 (row 5: N = 8 and 16)
    out_of_range = torch.tensor(grid)[None, :] >= (rows + 1)[:, None]
    assert torch.equal(ref.isnan(), out_of_range.expand_as(ref))


def test_gpu_benchmark_runs_on_its_cpu_path(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_gpu.py"), "--dry-run", "--no-compile",
         "--lengths", "64", "--repeats", "1", "--warmup", "0", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    modes = {r["mode"] for r in rows}
    assert {"plain", "final", "all"} <= modes
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)
    assert data["commit"] is None or data["commit"].startswith(_head())


def _head() -> str:
    """The checkout's short commit, or "" without git or outside a checkout."""
    try:
        return subprocess.run(["git", "-C", str(BENCH), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def test_results_name_the_commit_they_measured(monkeypatch) -> None:
    """Each benchmark's JSON says which code it timed: the checkout's commit (marked when
    the package or the scripts differ from it), or None where git cannot tell."""
    import bench_analysis

    commit = bench_analysis.source_commit()
    if _head():  # a git checkout (CI clones one)
        assert commit in (_head(), _head() + "+changes")

    def broken(*args, **kwargs):
        raise OSError("no git here")

    monkeypatch.setattr(bench_analysis.subprocess, "run", broken)
    assert bench_analysis.source_commit() is None


def test_candidate_certificate_is_sound() -> None:
    """Where ``certificate_rate.certified`` says a row's counts follow from its candidates,
    they do: intruders, the nearest unselected distance and the inversions computed over
    the selected keys and the candidates equal those over every key (rows with peaked and
    flat attention, so that both outcomes occur)."""
    from certificate_rate import certified

    gen = torch.Generator().manual_seed(11)
    t, d, c = 60, 8, 10
    outcomes = set()
    for trial in range(60):
        temperature = (0.2, 1.0, 4.0)[trial % 3]
        alpha = torch.softmax(torch.randn(t, generator=gen, dtype=torch.float64) / temperature, 0)
        values = torch.randn(t, d, generator=gen, dtype=torch.float64)
        values *= torch.rand(t, 1, generator=gen, dtype=torch.float64) * 3
        order = (torch.argsort(-alpha, stable=True) if trial % 2
                 else torch.randperm(t, generator=gen))
        for n in (1, 2, 4, 8):
            selected = order[:n]
            ok = certified(alpha, values, selected, c)
            outcomes.add(ok)
            if not ok:
                continue
            s = (alpha[selected, None] * values[selected]).sum(0)
            dist = (alpha[:, None] * values - s).norm(dim=-1)
            rest = torch.ones(t, dtype=torch.bool)
            rest[selected] = False
            contrib = torch.where(rest, alpha * values.norm(dim=-1), -1.0)
            kept = torch.zeros(t, dtype=torch.bool)
            kept[torch.topk(contrib, c).indices] = True
            assert _counts(dist, selected, rest) == _counts(dist, selected, kept), (trial, n)
    assert outcomes == {True, False}


def test_candidate_certificate_is_tight() -> None:
    """Rows built at the certificate's edge: every key left out lies on the line of the
    aggregate, at exactly ``||s|| - alpha_u ||v_u||``, and the farthest selected key is
    swept across the one with the largest such contribution. Certified rows must keep
    their counts; a certificate loosened by a tenth of that contribution would certify
    rows where that key is an intruder (which the sweep holds)."""
    from certificate_rate import certified

    c = 4
    outcomes, intruded = set(), 0
    for b in torch.linspace(0.0, 1.8, 181, dtype=torch.float64):
        # selected keys 0 and 1 (alpha 0.3 each) give s = (0.6, 0) and lie at
        # 0.3 sqrt(1 + b^2) from it; key u >= 2 lies at 0.6 - contribution u
        values = torch.zeros(12, 2, dtype=torch.float64)
        values[0] = torch.stack([torch.tensor(1.0, dtype=torch.float64), b])
        values[1] = torch.stack([torch.tensor(1.0, dtype=torch.float64), -b])
        values[2:, 0] = 1.0
        alpha = torch.tensor([0.3, 0.3, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01],
                             dtype=torch.float64)
        selected = torch.tensor([0, 1])
        rest = torch.ones(12, dtype=torch.bool)
        rest[selected] = False
        kept = torch.zeros(12, dtype=torch.bool)
        kept[2 : 2 + c] = True
        dist = (alpha[:, None] * values - (alpha[selected, None] * values[selected]).sum(0)
                ).norm(dim=-1)
        if abs(float(dist[selected].max()) - 0.5) < 1e-9:  # exactly on the edge: skip
            continue
        ok = certified(alpha, values, selected, c)
        outcomes.add(ok)
        intruded += int(float(dist[selected].max()) > 0.5)  # key 6 (at 0.5) intrudes
        if ok:
            assert _counts(dist, selected, rest) == _counts(dist, selected, kept), float(b)
    assert outcomes == {True, False} and intruded > 0


def _counts(dist: torch.Tensor, selected: torch.Tensor, keys: torch.Tensor) -> tuple:
    """Intruders, the nearest distance and the inversions over the unselected ``keys``."""
    far = dist[selected].max()
    inversions = int((dist[keys][None, :] <= dist[selected][:, None]).sum())
    return int((dist[keys] <= far).sum()), float(dist[keys].min()), inversions


def test_paired_timing_reports_medians_and_the_range_of_pair_ratios(monkeypatch) -> None:
    """Interleaved baseline / candidate runs: the medians of each, and the smallest and
    largest ratio of one pair, which the printed line shows in brackets."""
    import bench_analysis

    seconds = iter([1.0, 2.0, 2.0, 2.0, 4.0, 2.0])  # baseline, candidate, ...
    calls = []

    def fake(fn, clock=None):
        calls.append(fn)
        return next(seconds)

    monkeypatch.setattr(bench_analysis, "_time", fake)
    base, cand, (low, high) = bench_analysis.paired("b", "c", 3)
    assert calls == ["b", "c"] * 3
    assert (base, cand, low, high) == (2.0, 2.0, 0.5, 2.0)
    line = bench_analysis._line({"model": "m", "window_length": 8, "mode": "final",
                                 "ratio": cand / base, "against": "plain",
                                 "pair_ratio_low": low, "pair_ratio_high": high})
    assert "1.00x plain [pairs 0.50-2.00]" in line

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
    rows = json.loads(out.read_text())["rows"]
    modes = {r["mode"] for r in rows}
    assert {"plain", "final", "all"} <= modes
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)

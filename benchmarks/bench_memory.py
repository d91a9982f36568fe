"""Peak resident memory above the model, per mode and window length (one window).

What is measured: for the benchmark's random-weight Llama of realistic shape
(``bench_analysis.random_llama``: 8 layers, hidden 1024, 16 heads, 4 kv heads) and one
window of T tokens (batch 1), the peak resident set size (RSS) of the process during
one call, minus the RSS just before it, for each mode:

* ``plain``: the plain sdpa forward, no capture (the baseline);
* ``eager``: the eager forward with ``output_attentions=True``, which keeps every
  layer's L x H x T x T probabilities (what hook-based tools do);
* ``final``: ``final`` queries with every analysis (``bench_analysis.MODES["final"]``:
  the default analyses, 16 random repeats);
* ``all``: every query, the attention rule and 2 random repeats, metrics only
  (``bench_analysis.MODES["all_attention_random2"]``);
* ``all_budget``: ``all`` with ``memory_budget=0.05`` GB instead of the default 0.25,
  to show that the budget bounds the captured rows (it cannot bite for ``final``
  queries, which capture one row per window; ``final_budget`` is there to show that).

How: every (mode, T) point runs in a fresh subprocess (``--point MODE T``), so that
nothing allocated by one point (allocator caches, compiled kernels, lazy imports) is
counted in another. The subprocess builds the seeded model, prepares the window, runs
one warm-up of the same mode at T = 64 (lazy imports, one-time caches), collects
garbage and trims malloc, records VmRSS (the baseline: the model, torch and the
libraries), resets the high-water mark by writing ``5`` to ``/proc/self/clear_refs``
(Linux), runs the measured call once and reads VmHWM from ``/proc/self/status``.

Why RSS above the model: torch on CPU has no caching allocator, so RSS follows the
live tensors, and the high-water mark catches the transient peak inside a layer that
sampling would miss. glibc's malloc serves blocks above its mmap threshold with mmap
and gives them back when freed, but raises that threshold (up to 32 MB) each time a
mapped block is freed, after which tensors of a few MB come from the heap and its
freed pieces stay resident; the subprocesses therefore run with a fixed threshold
(``MALLOC_MMAP_THRESHOLD_=131072``; ``--malloc-default`` leaves glibc's own), which
makes RSS track the live tensors (at T = 4096 it changed ``final`` from +0.66 to
+0.34 GB and ``plain`` from +0.42 to +0.28 GB).
The model, torch and the libraries are the same for every mode and T; what is left
is the cost of the mode at that T, which is what the memory budget has to bound.
The theoretical size of the eager probabilities, L x H x T^2 x 4 bytes, is printed
next to the table. Memory is not affected by a noisy machine; the seconds are.

Points whose previous (shorter) T of the same mode took longer than ``--skip-after``
seconds, or timed out, are skipped (each doubling of T costs >= 4x for ``all``); a
point that runs past ``--timeout`` is recorded as ``timeout``; a point whose estimated
need exceeds the memory available is skipped before it starts.

Run: ``.venv/bin/python benchmarks/bench_memory.py --json benchmarks/results-memory-cpu.json``
(``--quick``: T = 512 and 1024; ``--modes plain,eager,final``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import inspect
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 2**30
LENGTHS = (512, 1024, 2048, 4096)
QUICK_LENGTHS = (512, 1024)
WARMUP_T = 64
# mode -> (bench_analysis.MODES key, AnalysisConfig changes); None: a forward, no analysis
MODES: dict[str, tuple[str, dict] | None] = {
    "plain": None,
    "eager": None,
    "final": ("final", {}),
    "all": ("all_attention_random2", {}),
    "all_budget": ("all_attention_random2", {"memory_budget": 0.05}),
    "final_budget": ("final", {"memory_budget": 0.05}),
}
DEFAULT_MODES = ("plain", "eager", "final", "final_budget", "all", "all_budget")
MARK = "BENCH_MEMORY_POINT "
MMAP_THRESHOLD = "131072"  # bytes; fixed, so freed tensors leave RSS (docstring)


# ---------------------------------------------------------------- /proc helpers


def _status_kb(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1))


def _meminfo_kb(key: str) -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.M).group(1))


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: malloc keeps its caches
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ---------------------------------------------------------------- one point (subprocess)


def _call(bench, mode: str):
    """The measured call of ``mode`` on ``bench`` (a ``bench_analysis.Bench``)."""
    spec = MODES[mode]
    if spec is None:
        return bench.plain if mode == "plain" else bench.eager
    key, changes = spec
    cfg = bench.config(key, compiled=False)
    if changes:
        cfg = cfg.with_(**changes)
    return lambda: bench.stream(cfg)


def point(mode: str, length: int, threads: int) -> dict:
    import torch
    from bench_analysis import Bench, random_llama

    from attngeom.engine.stream import chunk_rows

    torch.set_num_threads(threads)
    rss_start = _status_kb("VmRSS")
    model = random_llama()  # seeded inside
    bench = Bench(model, length)
    _call(Bench(model, WARMUP_T), mode)()  # lazy imports and one-time caches
    _trim()
    base_kb = _status_kb("VmRSS")
    call = _call(bench, mode)
    _reset_peak()
    hwm_reset_kb = _status_kb("VmHWM")
    t0 = time.perf_counter()
    call()
    seconds = time.perf_counter() - t0
    peak_kb = _status_kb("VmHWM")
    layout = bench.layout
    out = {"mode": mode, "T": length, "status": "ok", "seconds": seconds,
           "model_rss_gb": base_kb / 2**20, "peak_gb": peak_kb / 2**20,
           "above_model_gb": (peak_kb - base_kb) / 2**20,
           "hwm_after_reset_gb": hwm_reset_kb / 2**20, "rss_before_model_gb": rss_start / 2**20,
           "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
           "param_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / GB}
    spec = MODES[mode]
    if spec is not None:
        cfg = bench.config(spec[0], compiled=False).with_(**spec[1])
        out["memory_budget_gb"] = cfg.memory_budget
        out["chunk_rows"] = chunk_rows(cfg, layout.num_heads, length)
    return out


# ---------------------------------------------------------------- the parent


def eager_theory_gb(layers: int, heads: int, length: int) -> float:
    """Bytes of the float32 probabilities ``output_attentions`` keeps: L x H x T^2 x 4."""
    return layers * heads * length * length * 4 / GB


def _need_gb(mode: str, length: int, layers: int, heads: int) -> float:
    """A rough upper estimate of a point's need above the model (for the skip check)."""
    if mode == "eager":
        return 1.5 * eager_theory_gb(layers, heads, length) + 1.0
    return 0.5 * eager_theory_gb(1, heads, length) + 1.5


def run_point(mode: str, length: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--point", mode, str(length),
           "--threads", str(args.threads)]
    env = dict(os.environ)
    if not args.malloc_default:
        env.setdefault("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "T": length, "status": "timeout",
                "wall_s": time.perf_counter() - t0, "timeout_s": args.timeout}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return {**json.loads(line[len(MARK):]), "wall_s": wall}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"mode": mode, "T": length, "status": f"error (rc {proc.returncode})",
            "wall_s": wall, "stderr_tail": tail}


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] == "ok":
        return f"{row['above_model_gb']:.3f}"
    return row["status"].split(" ")[0]


def table(rows: list[dict], lengths, modes, layers: int, heads: int) -> str:
    by = {(r["mode"], r["T"]): r for r in rows}
    head = f"{'T':>6} " + " ".join(f"{m:>11}" for m in modes) + f" {'eager L*H*T^2*4':>16}"
    lines = ["GB above the model (peak RSS - RSS before the call)", head]
    for t in lengths:
        cells = " ".join(f"{_cell(by.get((m, t))):>11}" for m in modes)
        lines.append(f"{t:>6} {cells} {eager_theory_gb(layers, heads, t):>16.3f}")
    lines += ["", "seconds of the measured call"]
    lines.append(f"{'T':>6} " + " ".join(f"{m:>11}" for m in modes))
    for t in lengths:
        cells = []
        for m in modes:
            r = by.get((m, t))
            ok = r is not None and r["status"] == "ok"
            cells.append(f"{r['seconds']:>11.1f}" if ok else f"{_cell(r):>11}")
        lines.append(f"{t:>6} " + " ".join(cells))
    base = [r["model_rss_gb"] for r in rows if r["status"] == "ok"]
    if base:
        lines.append(f"\nRSS before the call (model {rows[0].get('param_gb', 0):.3f} GB of "
                     f"parameters, torch, libraries): {min(base):.3f}-{max(base):.3f} GB")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", nargs=2, metavar=("MODE", "T"), help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="T = 512 and 1024 only")
    ap.add_argument("--lengths", default=None, help="comma-separated T (default 512..4096)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per point")
    ap.add_argument("--skip-after", type=float, default=300.0,
                    help="skip longer T of a mode whose previous T took longer than this")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared machine two threads stall each other "
                    "for seconds; memory does not depend on it)")
    ap.add_argument("--malloc-default", action="store_true",
                    help="keep glibc's dynamic mmap threshold (RSS then keeps freed heap)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()

    if args.point:
        mode, length = args.point[0], int(args.point[1])
        print(MARK + json.dumps(point(mode, length, args.threads)), flush=True)
        return

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {unknown}; expected some of {', '.join(MODES)}")
    if args.lengths:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    else:
        lengths = QUICK_LENGTHS if args.quick else LENGTHS
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("bench_memory: needs Linux (/proc/self/clear_refs and VmHWM)")

    import torch
    from bench_analysis import random_llama, source_commit

    shape = {k: p.default for k, p in inspect.signature(random_llama).parameters.items()}
    layers, hidden, heads, kv_heads = (shape[k] for k in ("layers", "hidden", "heads",
                                                          "kv_heads"))
    rows: list[dict] = []
    notes: list[str] = []
    slow: dict[str, str] = {}  # mode -> why its longer T are skipped
    start = time.perf_counter()
    for t in lengths:
        for mode in modes:
            if mode in slow:
                rows.append({"mode": mode, "T": t, "status": "skipped", "why": slow[mode]})
                print(f"T={t:<5} {mode:12s} skipped: {slow[mode]}", flush=True)
                continue
            need = _need_gb(mode, t, layers, heads)
            avail = _meminfo_kb("MemAvailable") / 2**20
            if need > avail:
                why = f"needs about {need:.1f} GB, {avail:.1f} GB available"
                rows.append({"mode": mode, "T": t, "status": "skipped", "why": why})
                print(f"T={t:<5} {mode:12s} skipped: {why}", flush=True)
                continue
            row = run_point(mode, t, args)
            rows.append(row)
            if row["status"] == "ok":
                print(f"T={t:<5} {mode:12s} {row['above_model_gb']:7.3f} GB above model "
                      f"(baseline {row['model_rss_gb']:.3f} GB, call {row['seconds']:.1f} s, "
                      f"point {row['wall_s']:.0f} s)", flush=True)
                if row["seconds"] > args.skip_after:
                    slow[mode] = (f"T={t} took {row['seconds']:.0f} s > --skip-after "
                                  f"{args.skip_after:.0f} s")
            else:
                print(f"T={t:<5} {mode:12s} {row['status']} after {row['wall_s']:.0f} s "
                      f"{row.get('stderr_tail', '')}", flush=True)
                slow[mode] = f"T={t}: {row['status']}"
    for mode, why in slow.items():
        notes.append(f"{mode}: longer T skipped ({why})")
    text = table(rows, lengths, modes, layers, heads)
    print()
    print(text)
    for n in notes:
        print("note:", n)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        results = {
            "what": "peak RSS above the RSS before the call (GB), one window, batch 1",
            "commit": source_commit(),
            "torch": torch.__version__, "threads": args.threads,
            "machine": platform.processor() or platform.machine(),
            "model": {"layers": layers, "hidden": hidden, "heads": heads,
                      "kv_heads": kv_heads, "source": "bench_analysis.random_llama"},
            "modes": {m: (None if MODES[m] is None else
                          {"bench_analysis_mode": MODES[m][0], **MODES[m][1]}) for m in modes},
            "lengths": list(lengths),
            "eager_theory_gb": {str(t): eager_theory_gb(layers, heads, t) for t in lengths},
            "timeout_s": args.timeout, "skip_after_s": args.skip_after,
            "malloc_mmap_threshold": (None if args.malloc_default else
                                      os.environ.get("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)),
            "points": rows, "notes": notes, "table": text.splitlines(),
        }
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"written {args.json}")


if __name__ == "__main__":
    main()

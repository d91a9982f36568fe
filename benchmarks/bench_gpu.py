"""Cost of the analysis on a GPU at 7B shape: time ratios and peak memory per mode.

**Not run on a GPU by this project yet**: it is correct by construction and its CPU
path (``--device cpu --tiny``) is what has been run. Run it on a CUDA machine with

    .venv/bin/python benchmarks/bench_gpu.py --json benchmarks/results-gpu.json

(``--kv-heads 8`` for a Llama-3-like grouped-query variant, ``--lengths 1024,4096``,
``--repeats 5``); it needs about 14 GB for the model plus about 45 GB for the eager
reference at T = 4096 (``--no-eager`` drops it), and a few minutes.

The model is a random-weight Llama of 7B shape (32 layers, hidden 4096, 32 heads, 32
kv heads, intermediate 11008, vocab 32000) built in bf16 directly on the device (no
download). At each T, in one process and on one input, every mode is timed side by
side with a plain sdpa forward (``bench_analysis.paired``: interleaved, the
median of ``--repeats``, after warm-up), with ``torch.cuda.synchronize()`` around
every timed call:

* ``eager``: the eager forward with ``output_attentions`` (the hook-based reference);
* ``final``: ``final`` queries with every analysis (``bench_analysis.MODES["final"]``),
  target <= 1.05x the plain forward;
* ``all``: every query, the attention rule and 2 random repeats, metrics only
  (``bench_analysis.MODES["all_attention_random2"]``), target <= 1.5x;

``final`` and ``all`` are run with the compiled counting kernels off and on; the first
call of each is a warm-up whose compile time (``attngeom.core.kernels.compile_seconds``)
is reported apart. The table building (``frames``) is timed once per run and reported
apart too (it amortises over windows). Peak memory is ``torch.cuda.max_memory_allocated``
during one call minus the memory allocated before it (the model and the input), per
mode. The ratio is of the streaming pass; the targets are the issue's.

The passes, configurations and timing helpers are ``bench_analysis``'s (imported);
this file adds only the device, the dtype, the 7B shape and CUDA synchronisation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import MODES, Bench, pair_spread, paired, source_commit  # noqa: E402

from attngeom.core import kernels  # noqa: E402

GB = 2**30
SHAPE_7B = dict(layers=32, hidden=4096, heads=32, kv_heads=32, intermediate=11008,
                vocab=32000)
SHAPE_TINY = dict(layers=2, hidden=256, heads=8, kv_heads=8, intermediate=688, vocab=1000)
# our mode -> (bench_analysis.MODES key, target ratio over the plain forward)
TARGETS = {"final": ("final", 1.05), "all": ("all_attention_random2", 1.5)}


def random_llama(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 vocab: int, positions: int, device: str, dtype: torch.dtype):
    """A random-weight Llama built directly on ``device`` in ``dtype`` (seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=positions,
                      attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class GpuBench(Bench):
    """``bench_analysis.Bench`` with the forward's input on the device and synchronised
    calls; the windows stay on the CPU, as a run's do (``stream_windows`` moves them)."""

    def __init__(self, model, window_length: int, device: str, dtype: str) -> None:
        super().__init__(model, window_length)
        self.device, self.dtype_name = device, dtype
        self.ids = self.ids.to(device)

    def config(self, mode: str, compiled: bool):
        return super().config(mode, compiled).with_(device=self.device, dtype=self.dtype_name)

    def synced(self, fn):
        def run() -> None:
            _sync(self.device)
            fn()
            _sync(self.device)

        return run

    def peak_above(self, fn) -> float | None:
        """GB of ``max_memory_allocated`` above what was allocated before ``fn`` (CUDA)."""
        if not self.device.startswith("cuda"):
            return None
        _sync(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        fn()
        _sync(self.device)
        return (torch.cuda.max_memory_allocated(self.device) - before) / GB


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_length(bench: GpuBench, repeats: int, warmup: int, compile_modes, eager: bool,
                   label: dict) -> list[dict]:
    plain = bench.synced(bench.plain)
    for _ in range(warmup):
        plain()
    rows = []
    plain_peak = bench.peak_above(plain)
    plain_s = statistics.median(_timed(plain) for _ in range(repeats))
    rows.append({**label, "mode": "plain", "compiled": None, "baseline_s": plain_s,
                 "stream_s": plain_s, "ratio": 1.0, "peak_above_model_gb": plain_peak})
    print(_line(rows[-1]), flush=True)
    if eager:
        run = bench.synced(bench.eager)
        run()  # warm-up
        peak = bench.peak_above(run)
        t_base, t_run, (low, high) = paired(plain, run, repeats)
        rows.append({**label, "mode": "eager", "compiled": None, "baseline_s": t_base,
                     "stream_s": t_run, "ratio": t_run / t_base, "pair_ratio_low": low,
                     "pair_ratio_high": high, "peak_above_model_gb": peak})
        print(_line(rows[-1]), flush=True)
    for mode, (key, target) in TARGETS.items():
        for compiled in compile_modes:
            cfg = bench.config(key, compiled)
            holder = {}

            def run(cfg=cfg, holder=holder) -> None:
                holder["acc"] = bench.stream(cfg)

            run = bench.synced(run)
            before = kernels.compile_seconds()
            first = _timed(run)  # warm-up; compiles when compiled
            compile_s = kernels.compile_seconds() - before
            for _ in range(max(0, warmup - 1)):
                run()
            peak = bench.peak_above(run)
            t_base, t_run, (low, high) = paired(plain, run, repeats)
            t_frames = _timed(lambda holder=holder: holder["acc"].frames(model="bench",
                                                                         corpus="bench"))
            ratio = t_run / t_base
            rows.append({**label, "mode": mode, "compiled": compiled, "baseline_s": t_base,
                         "stream_s": t_run, "ratio": ratio, "pair_ratio_low": low,
                         "pair_ratio_high": high, "target": target,
                         "pass": ratio <= target, "frames_s": t_frames,
                         "first_call_s": first, "compile_s": compile_s,
                         "peak_above_model_gb": peak})
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    tag = {None: "", False: " (compile off)", True: " (compile on)"}[row["compiled"]]
    peak = row.get("peak_above_model_gb")
    mem = f" peak +{peak:.2f} GB" if peak is not None else ""
    verdict = ""
    if "target" in row:
        verdict = (f"  target <= {row['target']:.2f}x {'PASS' if row['pass'] else 'FAIL'}"
                   f"  (compile {row['compile_s']:.1f} s, tables {row['frames_s']:.2f} s, "
                   "once)")
    times = f"({row['stream_s'] * 1e3:8.1f} ms vs {row['baseline_s'] * 1e3:8.1f} ms)"
    return (f"T={row['window_length']:<5} {row['mode'] + tag:20s} {row['ratio']:6.2f}x plain"
            f"{pair_spread(row)} {times}{mem}{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on cuda), float32 (cpu)")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2-layer model at T = 128, 256 (to check the script on a CPU)")
    ap.add_argument("--dry-run", action="store_true", help="--device cpu --tiny")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="kv heads (default 32; 8 for a Llama-3-like variant)")
    ap.add_argument("--lengths", default=None, help="comma-separated T (default 1024,4096)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true", help="compiled kernels off only")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager reference")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device here; pass --device cpu --tiny to check the script")
    dtype_name = args.dtype or ("bfloat16" if on_cuda else "float32")
    dtype = getattr(torch, dtype_name)
    shape = dict(SHAPE_TINY if args.tiny else SHAPE_7B)
    if args.kv_heads is not None:
        shape["kv_heads"] = args.kv_heads
    if args.lengths:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    else:
        lengths = (128, 256) if args.tiny else (1024, 4096)
    repeats = min(args.repeats, 2) if args.tiny else args.repeats
    compile_modes = (False,) if args.no_compile else (False, True)

    t0 = time.perf_counter()
    model = random_llama(**shape, positions=max(lengths), device=args.device, dtype=dtype)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    name = f"llama-{shape['layers']}x{shape['hidden']}-kv{shape['kv_heads']}"
    print(f"{name}: {params / 1e6:,.1f} M parameters, {dtype_name} on {args.device} "
          f"(built in {build_s:.1f} s)", flush=True)
    results = {"commit": source_commit(), "torch": torch.__version__, "device": args.device,
               "dtype": dtype_name,
               "gpu": torch.cuda.get_device_name(args.device) if on_cuda else None,
               "machine": platform.processor() or platform.machine(),
               "model": {"name": name, **shape, "parameters": params},
               "model_allocated_gb": (torch.cuda.memory_allocated(args.device) / GB
                                      if on_cuda else None),
               "repeats": repeats, "warmup": args.warmup,
               "modes": {m: MODES[k] for m, (k, _) in TARGETS.items()}, "rows": []}
    for t in lengths:
        bench = GpuBench(model, t, args.device, dtype_name)
        label = {"model": name, "window_length": t}
        results["rows"] += measure_length(bench, repeats, args.warmup, compile_modes,
                                          not args.no_eager, label)
        del bench
    print()
    print(f"{'T':>6} {'mode':10} {'compile':>7} {'ratio':>7} {'target':>7} {'':4} "
          f"{'peak GB':>8} {'compile s':>9}")
    for r in results["rows"]:
        if "target" not in r:
            continue
        peak = r["peak_above_model_gb"]
        print(f"{r['window_length']:>6} {r['mode']:10} {'on' if r['compiled'] else 'off':>7} "
              f"{r['ratio']:>6.2f}x {r['target']:>6.2f}x {'PASS' if r['pass'] else 'FAIL':4} "
              f"{'-' if peak is None else f'{peak:.2f}':>8} {r['compile_s']:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"written {args.json}")


if __name__ == "__main__":
    main()

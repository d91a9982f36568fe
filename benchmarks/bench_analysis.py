"""Cost of the analysis, as ratios measured side by side in one process.

Timings on a shared machine are noisy, so only ratios are reported, each against a
baseline run in the same process on the same inputs (median of several repeats):

* capture: plain forward (the model's own sdpa path) vs eager with
  ``output_attentions`` vs attngeom's ``final``-query and ``all``-query passes (all
  analyses: metrics with the random control, sink, taxonomy, bounds, diagnostics);
* metric work: ``topn_metrics`` vs a naive per-head, per-query, per-N loop that
  materialises the contributions y = alpha v (what one-off scripts do), on the
  same captured rows.

Run: ``.venv/bin/python benchmarks/bench_analysis.py [--quick] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive_metrics import naive_topn  # noqa: E402

from attngeom.capture import capture_attention, load_model, model_layout  # noqa: E402
from attngeom.core.batch import ValueStats  # noqa: E402
from attngeom.core.geometry import topn_metrics  # noqa: E402
from attngeom.pipeline.analysis import make_accumulators, stream_windows  # noqa: E402
from attngeom.pipeline.config import AnalysisConfig, default_model  # noqa: E402


class _Win:
    def __init__(self, index: int, ids: torch.Tensor) -> None:
        self.index, self.input_ids = index, ids


def _median_time(fn, repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_llama(layers: int, hidden: int, heads: int, kv_heads: int, positions: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=positions, attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval()


def bench_model(name: str, model, window_length: int, n_windows: int, repeats: int) -> dict:
    layout = model_layout(model)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (n_windows, window_length), generator=gen)
    ids[:, 0] = 1
    windows = [_Win(i, ids[i]) for i in range(n_windows)]

    def plain():
        with torch.inference_mode():
            model(input_ids=ids)

    def eager():
        prev = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                model(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation(prev)

    def analysis(mode: str, **options):
        cfg = AnalysisConfig(window_length=window_length, query_mode=mode,
                             batch_size=n_windows, bootstrap=0, **options)

        def run():
            acc = make_accumulators(cfg, window_length)
            stream_windows(model, layout, windows, cfg, acc, progress=False)
            acc.compute()

        return run

    def capture_only(mode: str):
        from attngeom.core.queries import query_positions

        rows = query_positions(mode, window_length)

        def run():
            with torch.inference_mode(), capture_attention(model, lambda cap: None,
                                                           query_rows=rows):
                model(input_ids=ids)

        return run

    t_plain = _median_time(plain, repeats)
    out = {
        "model": name, "window_length": window_length, "windows": n_windows,
        "layers": layout.num_layers, "heads": layout.num_heads,
        "kv_heads": layout.num_kv_heads, "plain_forward_s": t_plain,
    }
    out["eager_output_attentions_x_plain"] = _median_time(eager, repeats) / t_plain
    out["capture_final_x_plain"] = _median_time(capture_only("final"), repeats) / t_plain
    out["capture_all_x_plain"] = _median_time(capture_only("all"), repeats) / t_plain
    out["analysis_final_x_plain"] = _median_time(analysis("final"), repeats) / t_plain
    t_eager = out["eager_output_attentions_x_plain"] * t_plain
    # the paper's metric alone (attention rule, full universe, no control) over all queries
    t_one = _median_time(analysis("all", rules=("attention",), variants=("full",),
                                  analyses=("metrics",)), 1, warmup=False)
    out["analysis_all_attention_only_x_eager"] = t_one / t_eager
    # everything: 3 rules x 2 variants, random control, sink, taxonomy, bounds, diagnostics
    t_all = _median_time(analysis("all"), 1, warmup=False)
    out["analysis_all_x_plain"] = t_all / t_plain
    out["analysis_all_x_eager"] = t_all / t_eager
    return out


def bench_metric_work(model, window_length: int, grid, n_rows: int) -> dict:
    """Fast kernel vs the naive loop on one captured layer (attention rule, euclidean)."""
    from attngeom.core.queries import query_positions

    ids = torch.randint(3, model.config.vocab_size, (1, window_length),
                        generator=torch.Generator().manual_seed(1))
    rows = query_positions("all", window_length)[-n_rows:]
    got = {}

    def keep(cap):
        if cap.layer == 0:
            got["cap"] = cap

    with torch.inference_mode(), capture_attention(model, keep, query_rows=rows):
        model(input_ids=ids)
    cap = got["cap"]
    alpha, values, vis = cap.alpha[0], cap.values[0], cap.visible[0]

    def fast():
        topn_metrics(alpha, None, grid, visible=vis, query_positions=rows,
                     stats=ValueStats(values))

    def naive():
        naive_topn(alpha, values, grid, vis)

    t_fast = _median_time(fast, 3)
    t_naive = _median_time(naive, 1)
    ref = naive_topn(alpha, values, grid, vis)
    res = topn_metrics(alpha, None, grid, visible=vis, query_positions=rows,
                       stats=ValueStats(values))
    fast_f = res.f_score[0]
    same = ((fast_f - ref).abs() <= 1e-9) | (ref.isnan() & fast_f.isnan())
    agree = float(same.double().mean())
    return {"rows": int(rows.numel()), "heads": int(alpha.shape[0]), "grid": list(grid),
            "fast_s": t_fast, "naive_s": t_naive, "naive_x_fast": t_naive / t_fast,
            "f_score_agreement": agree}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = 3 if args.quick else 5
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "runs": []}
    stories, _ = load_model(default_model())
    results["runs"].append(bench_model("stories260K", stories, 256, 4 if args.quick else 8,
                                       repeats))
    big = random_llama(2 if args.quick else 4, 512, 8, 4, 1024)
    results["runs"].append(bench_model("llama-random-512w", big, 256 if args.quick else 512,
                                       1, repeats))
    results["metric_work"] = bench_metric_work(big, 256 if args.quick else 512,
                                               (1, 2, 4, 8, 16, 32), 32 if args.quick else 64)
    for run in results["runs"]:
        print(f"\n{run['model']}: T={run['window_length']}, {run['windows']} windows, "
              f"plain forward {run['plain_forward_s'] * 1e3:.1f} ms")
        for k, v in run.items():
            if k.endswith(("_x_plain", "_x_eager")):
                print(f"  {k:36s} {v:6.2f}x")
    mw = results["metric_work"]
    print(f"\nmetric work ({mw['heads']} heads x {mw['rows']} rows, N grid {mw['grid']}): "
          f"naive loop {mw['naive_x_fast']:.0f}x slower than topn_metrics "
          f"(F_N equal on {mw['f_score_agreement']:.1%} of rows)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

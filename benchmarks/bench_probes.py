"""What the engine costs the atlas and the probes (issue 37's Speed targets).

* **Head scores on the taxonomy's forward.** The atlas's corpus head scores
  (previous-token, duplicate-token, sink, streaming) are the ``head_scores`` analysis:
  their strided rows ride the taxonomy's pass. Timed on the same batch of windows: the
  plain (sdpa) forward, the analysis the atlas runs without them (``metrics``,
  ``taxonomy``) and with them; the target is that they add at most 0.3x a plain forward.
* **Resumable units.** The qa and context probes run as units whose results are written
  to shards as they finish. Timed: the same probe with an output directory (every unit
  pickled to its shard, read back in order) against no output directory (units kept in
  memory, nothing written): the target is at most 5% more.

Medians of interleaved repeats in one process (``bench_analysis.paired``); the machine is
shared, so read the ratios, not the seconds. Run:
``.venv/bin/python benchmarks/bench_probes.py [--repeats 3] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import paired, source_commit  # noqa: E402


def head_scores(model_name: str, window: int, n_windows: int, repeats: int) -> dict:
    """The atlas's analysis pass with and without the head scores, and the plain forward."""
    import torch

    from attngeom.capture import load_model, model_layout
    from attngeom.config import AnalysisConfig
    from attngeom.corpora.documents import load_windows
    from attngeom.engine.analyses import AnalysisContext, AnalysisSet
    from attngeom.engine.stream import stream_windows

    model, tokenizer = load_model(model_name)
    layout = model_layout(model)
    common = dict(model=model_name, corpus=None, window_length=window, n_windows=n_windows,
                  batch_size=n_windows, query_mode="final", variants=("full",),
                  distances=("euclidean",), bootstrap=0, head_stride=8)
    without = AnalysisConfig(**common, analyses=("metrics", "taxonomy"))
    with_scores = AnalysisConfig(**common, analyses=("metrics", "taxonomy", "head_scores"))
    windows, _, _ = load_windows(without, tokenizer)
    ids = torch.stack([w.input_ids for w in windows])

    def plain() -> None:
        with torch.inference_mode():
            model(input_ids=ids)

    def run(cfg):
        def call() -> None:
            stream_windows(model, layout, windows, cfg, AnalysisSet.create(cfg,
                                                                           AnalysisContext()))
        return call

    base, taxonomy, _ = paired(plain, run(without), repeats)
    _, both, _ = paired(run(without), run(with_scores), repeats)
    return {"model": model_name, "window": window, "windows": n_windows,
            "plain_s": base, "taxonomy_s": taxonomy, "with_head_scores_s": both,
            "extra_over_plain": (both - taxonomy) / base}


def units(probe: str, repeats: int, options: dict) -> dict:
    """The probe with shards written (an output directory) against in memory."""
    from attngeom import api
    from attngeom.capture import load_model

    model_name = options.pop("model")
    loaded = load_model(model_name)
    where = Path(tempfile.mkdtemp(prefix="bench-units-"))

    def in_memory() -> None:
        api.competition(model_name, None, None, probe=probe, progress=False,
                        model_and_tokenizer=loaded, **options)

    def with_shards() -> None:
        out = where / "run"
        shutil.rmtree(out, ignore_errors=True)
        api.competition(model_name, None, out, probe=probe, progress=False,
                        model_and_tokenizer=loaded, **options)

    memory, shards, (low, high) = paired(in_memory, with_shards, repeats)
    shutil.rmtree(where, ignore_errors=True)
    return {"probe": probe, "options": options, "in_memory_s": memory, "with_shards_s": shards,
            "ratio": shards / memory, "pair_ratios": [low, high]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    import torch

    from attngeom.assets import asset

    torch.set_num_threads(args.threads)
    model = args.model or asset("smollm2-135m")
    out = {"commit": source_commit(), "machine": platform.machine(),
           "threads": args.threads, "repeats": args.repeats,
           "head_scores": head_scores(model, 256, 4, args.repeats)}
    print(json.dumps(out["head_scores"]), flush=True)
    small = asset("stories260K")
    out["units"] = [
        units("qa", args.repeats, dict(model=small, backgrounds=(0, 64), n_episodes=4,
                                       grid_max=8, bootstrap=50, batch_size=2)),
        # large enough that the run's fixed cost of writing its tables (which the
        # in-memory run skips) is not most of the difference: at lengths 64, 128 and
        # 4 documents (about 1 s) it read 1.10x
        units("context", args.repeats, dict(model=small, lengths=(128, 256), tail=64,
                                            n_documents=8, bootstrap=50, taus=(0.05,),
                                            batch_size=2)),
    ]
    for row in out["units"]:
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""``attngeom demo``: the default study on the shared models and corpora."""

from __future__ import annotations

from pathlib import Path

from attngeom.assets import asset
from attngeom.config import AnalysisConfig, PruneConfig, RestrictConfig, ScanConfig
from attngeom.pipeline.analyze import run_analysis
from attngeom.pipeline.compare import compare_runs
from attngeom.pipeline.interventions import Prune, Restrict, ScanHeads
from attngeom.pipeline.runner import execute
from attngeom.pipeline.tables import headline
from attngeom.report import build_report


def default_corpus() -> str:
    return asset("tinystories", "--corpus")


def smollm_path() -> str:
    """The shared SmolLM2-135M-Instruct GGUF (a real decoder with a first-token sink)."""
    return asset("smollm2-135m", "--model")


def demo(out: str | Path = "runs/demo", *, quick: bool = False, progress: bool = True) -> dict:
    """The default study: stories260K on the shared TinyStories and WikiText samples, and
    SmolLM2-135M (a decoder with a strong sink) on WikiText.

    Writes three analysis runs, the regime comparison of stories260K between corpora, a
    head scan, a short pruning sweep and a top-N restriction sweep, and one HTML report
    per run; returns the paths and the headline F_N table.
    """
    out = Path(out)
    corpora = {
        "tinystories": default_corpus(),
        "wikitext": asset("wikitext-2-test", "--corpus"),
    }
    n_windows = 8 if quick else 48
    results = {}
    for name, path in corpora.items():
        cfg = AnalysisConfig(
            corpus=path, n_windows=n_windows, window_length=256, query_mode="stride:16",
            corpus_label=name,
        )
        results[name] = run_analysis(cfg, out / name, overwrite=True, progress=progress)
    cfg = AnalysisConfig(
        model=smollm_path(), corpus=corpora["wikitext"], n_windows=4 if quick else 12,
        window_length=256, query_mode="stride:16", corpus_label="wikitext",
        model_label="SmolLM2-135M",
    )
    results["smollm2-wikitext"] = run_analysis(cfg, out / "smollm2-wikitext", overwrite=True,
                                               progress=progress)
    comparison = compare_runs(out / "tinystories", out / "wikitext")
    run = {"overwrite": True, "progress": progress}
    scan = execute(ScanHeads(), ScanConfig(n_eval_windows=4 if quick else 8), out / "scan",
                   **run)
    pruned = execute(Prune(), PruneConfig(
        rankers=("taxonomy", "magnitude", "random"), seeds=(0, 1) if quick else (0, 1, 2),
        n_rank_windows=4 if quick else 8, n_eval_windows=4 if quick else 8), out / "prune",
        **run)
    restricted = execute(Restrict(), RestrictConfig(n_eval_windows=2 if quick else 4),
                         out / "restrict", **run)
    reports = {name: build_report(out / name)
               for name in (*results, "scan", "prune", "restrict")}
    return {
        "runs": {name: r.out_dir for name, r in results.items()},
        "results": results,
        "headline": {name: headline(r["summary"]) for name, r in results.items()},
        "comparison": comparison,
        "head_scan": scan,
        "pruning": pruned,
        "restrict": restricted,
        "reports": reports,
    }

"""Small synthetic run directories, written with ``attngeom.results.io``.

The tables follow the schemas of docs/internals.md with made-up but plausible
numbers (attention beats random, sinks compressed and anti-aligned, a few
critical heads), small enough that every figure draws in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attngeom.names import METRICS

MODEL = "tiny-llama"
CORPUS = "tiny-stories"
LAYERS = 4
HEADS = 4
N_GRID = (1, 2, 4, 8, 16)
WINDOWS = 3
RULES = ("attention", "contribution", "random")
ALL_TABLES = ("metrics", "summary", "sink", "sink_tokens", "taxonomy", "bounds",
              "assumptions", "pruning", "rankings", "head_scan", "restrict", "restrict_nstar")


def _base_f(rule: str, n: int, layer: int) -> float:
    level = {"attention": 0.8, "contribution": 0.7, "random": 0.3}[rule]
    return float(np.clip(level - 0.05 * np.log2(n) - 0.03 * layer, 0.02, 0.98))


def make_tables(seed: int = 0) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    mc = {"model": MODEL, "corpus": CORPUS}
    rows = []
    for w in range(WINDOWS):
        for layer in range(LAYERS):
            for head in range(HEADS):
                for rule in RULES:
                    for variant in ("full", "no_sink"):
                        for n in N_GRID:
                            trivial = n == 1
                            f = 1.0 if trivial else _base_f(rule, n, layer) + rng.normal(0, .03)
                            if variant == "no_sink" and not trivial:
                                f = min(1.0, f + 0.1)
                            p = 1.0 if trivial else float(np.clip(f + 0.05, 0, 1))
                            r = 1.0 if trivial else float(np.clip(f - 0.05, 0, 1))
                            bound = rule == "attention" and variant == "full"
                            rows.append({**mc, "window": w, "layer": layer, "head": head,
                                         "rule": rule, "variant": variant,
                                         "distance": "euclidean", "n": n, "precision": p,
                                         "recall": r, "f_score": float(np.clip(f, 0, 1)),
                                         "margin": rng.normal(), "inversions": float(n),
                                         "n_queries": 1, "n_skipped": 0, "trivial": trivial,
                                         "precision_bound": 0.5 * p if bound else np.nan,
                                         "recall_bound": 0.4 * r if bound else np.nan,
                                         "f_bound": 0.45 * f if bound else np.nan,
                                         "precision_inv_bound": 0.6 * p if bound else np.nan,
                                         "recall_inv_bound": 0.5 * r if bound else np.nan})
    metrics = pd.DataFrame(rows)
    for extra in METRICS:  # any metric added later gets plausible values too
        if extra not in metrics:
            metrics[extra] = rng.random(len(metrics))

    keys = ["rule", "variant", "distance", "n"]
    cols = list(METRICS)
    frames = []
    for scope, by in (("model", []), ("layer", ["layer"]), ("head", ["layer", "head"])):
        per_window = metrics.groupby(keys + by + ["window"])[cols].mean()
        means = per_window.groupby(level=list(range(len(keys) + len(by)))).mean()
        long = means.reset_index().melt(id_vars=keys + by, var_name="metric", value_name="mean")
        long["scope"] = scope
        for column in ("layer", "head"):
            if column not in long:
                long[column] = -1
        frames.append(long)
    summary = pd.concat(frames, ignore_index=True).assign(**mc, n_windows=WINDOWS)
    summary["ci_low"] = summary["mean"] - 0.04
    summary["ci_high"] = summary["mean"] + 0.04
    summary["trivial"] = summary["n"] == 1

    lh = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]
    sink = pd.DataFrame([
        {**mc, "layer": l, "head": h, "n": n, "sink_position": 0,
         "norm_ratio": 3.0 + l + 0.5 * h, "sink_cos_mean": -0.5 + 0.3 * h - 0.1 * l,
         "sink_cos_pairwise": -0.2 + 0.1 * h, "sink_mass": 0.2 + 0.1 * l,
         "sink_in_top_n": min(1.0, 0.1 * n), "f_full_sink_selected": 0.35,
         "f_full_sink_unselected": 0.7, "f_nosink_sink_selected": 0.75,
         "f_nosink_sink_unselected": 0.72, "n_windows": WINDOWS}
        for l, h in lh for n in N_GRID])
    token_rows = [{**mc, "layer": l, "head": h, "position": 0, "token_id": 1, "token": "<s>",
                   "occurrences": WINDOWS, "windows": WINDOWS, "pairs": 40,
                   "mean_share": 0.2 + 0.1 * l, "uniform_share": 0.02,
                   "share_q1": 0.15 + 0.1 * l, "median_share": 0.2 + 0.1 * l,
                   "share_q3": 0.25 + 0.1 * l, "share_held": 1.0, "lift": 10.0 + 5 * l,
                   "detected": True, "n_windows": WINDOWS} for l, h in lh]
    token_rows.append({**mc, "layer": 1, "head": 2, "position": -1, "token_id": 13,
                       "token": "'.'", "occurrences": 7, "windows": 3, "pairs": 90,
                       "mean_share": 0.3, "uniform_share": 0.02, "share_q1": 0.2,
                       "median_share": 0.3, "share_q3": 0.4, "share_held": 0.86,
                       "lift": 15.0, "detected": True, "n_windows": WINDOWS})
    sink_tokens = pd.DataFrame(token_rows)

    regimes = ["Mixer", "Reset", "Retriever", "Mixer"]
    tax_rows = []
    for l, h in lh:
        regime = regimes[(l + h) % 4]
        fr = {"Retriever": (0.6, 0.3, 0.1), "Mixer": (0.1, 0.7, 0.2),
              "Reset": (0.2, 0.2, 0.6)}[regime]
        tax_rows.append({**mc, "layer": l, "head": h, "n_queries": 40, "f_self": fr[0],
                         "f_sink": fr[1], "f_other": fr[2], "offset_entropy": 1.2,
                         "sink_alignment": 0.4, "self_alignment": 0.3,
                         "mean_output_norm": 1.0 + l, "regime": regime,
                         "regime_rule": "single", "winning_share": max(fr),
                         "runner_up_share": sorted(fr)[1], "top_source_kind": "offset",
                         "top_source": 1, "top_source_share": fr[2],
                         "stability": 0.5 if (l, h) == (1, 1) else 0.95})
    taxonomy = pd.DataFrame(tax_rows)

    bounds = pd.DataFrame([
        {**mc, "layer": l, "head": h, "n": n, "kappa": 4.0, "mu": 0.2, "sink_cos": -0.3,
         "precision_envelope": max(0.0, 1 - 0.1 * n), "recall_envelope": max(0.0, 1 - 0.12 * n),
         "f_envelope": max(0.0, 1 - 0.11 * n), "certified": n <= 4,
         "largest_certified_n": 4, "precision_measured": _base_f("attention", n, l) + 0.05,
         "recall_measured": _base_f("attention", n, l) - 0.05,
         "f_measured": _base_f("attention", n, l), "mu_quantile": 0.99,
         "pair_violation_rate": 0.01, "pair_violation_max": 0.02 * h,
         "sink_cos_violation_rate": 0.01 * h, "sink_cos_violation_max": 0.03 * h}
        for l, h in lh for n in N_GRID])
    assumptions = pd.DataFrame([
        {**mc, "layer": l, "head": h, "norm_cv": 0.2, "sink_norm_ratio": 3.0 + l,
         "cos_decay_lambda": 5.0 + h, "cos_decay_mae": 0.05, "negative_cos_share": 0.1,
         "mass_sink": 0.3, "mass_middle": 0.4, "mass_recent": 0.3} for l, h in lh])

    prune_rows, rank_rows = [], []
    for ranker, seeds in (("taxonomy", [0]), ("magnitude", [0]), ("entropy", [0]),
                          ("random", [0, 1, 2])):
        for seed in seeds:
            for keep, base in ((1.0, 10.0), (0.9, 11.0), (0.75, 13.0), (0.5, 20.0),
                               (0.25, 60.0)):
                ppl = base * (1.0 + (0.3 if ranker == "random" else 0.1) * (1 - keep)
                              + 0.05 * seed)
                prune_rows.append({**mc, "ranker": ranker, "seed": seed,
                                   "order": "Mixer,Reset,Retriever" if ranker == "taxonomy"
                                   else "", "keep_fraction": keep,
                                   "heads_kept": round(keep * LAYERS * HEADS),
                                   "nll": float(np.log(ppl)), "perplexity": ppl,
                                   "delta_nll_rel": float(np.log(ppl) / np.log(10.0) - 1)})
            for rank, (l, h) in enumerate(lh):
                rank_rows.append({**mc, "ranker": ranker, "seed": seeds[0], "order": "",
                                  "rank": rank, "layer": l, "head": h, "score": float(rank)})
    pruning = pd.DataFrame(prune_rows)
    rankings = pd.DataFrame(rank_rows)

    head_scan = pd.DataFrame([
        {**mc, "layer": l, "head": h, "nll": 2.3,
         "delta_nll_rel": 2.5 if (l, h) == (0, 2) else 0.001 * (l + h) - 0.002,
         "critical": (l, h) == (0, 2), "threshold": 0.1} for l, h in lh])

    restrict_rows = []
    for renorm in (True, False):
        for n in N_GRID:
            d = (0.5 if renorm else 0.9) / n
            restrict_rows.append({**mc, "scope": "model", "layer": -1, "head": -1, "n": n,
                                  "renormalize": renorm, "nll": 2.3 * (1 + d),
                                  "perplexity": float(np.exp(2.3 * (1 + d))),
                                  "delta_nll_rel": d, "ranking": "attention", "on_grid": True,
                                  "passes": ",".join(str(t) for t in (0.05, 0.1) if d <= t)})
    restrict = pd.DataFrame(restrict_rows)
    restrict_nstar = pd.DataFrame([
        {**mc, "scope": "model", "layer": -1, "head": -1, "renormalize": renorm, "tau": tau,
         "n_star": ns, "n_star_status": "above_grid" if ns != ns else "within_grid",
         "ranking": "attention", "grid_n_star": ns, "n_star_low": ns, "n_star_high": ns,
         "n_evaluated": len(N_GRID), "search": "grid", "monotone": True, "note": "",
         "window_length": 64, "n_star_bisect": ns, "n_star_interpolate": ns,
         "oracle_n_star": ns, "ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0}
        for renorm, tau, ns in ((True, 0.05, 16), (True, 0.1, 8), (False, 0.1, 16),
                                (False, 0.05, float("nan")))])
    return {"metrics": metrics, "summary": summary, "sink": sink,
            "sink_tokens": sink_tokens, "taxonomy": taxonomy, "bounds": bounds,
            "assumptions": assumptions, "pruning": pruning, "rankings": rankings,
            "head_scan": head_scan, "restrict": restrict, "restrict_nstar": restrict_nstar}


def manifest_for(tables) -> dict:
    return {
        "attngeom_version": "0.1.0",
        "command": "attngeom analyze tiny-llama --corpus tiny-stories",
        "config": {"n_grid": list(N_GRID), "queries": "final", "repeats": 16},
        "model": {"name": MODEL, "class": "LlamaForCausalLM", "sha256": "ab" * 32,
                  "num_layers": LAYERS, "num_heads": HEADS, "num_kv_heads": 2, "head_dim": 8},
        "corpus": {"name": CORPUS, "sha256": "cd" * 32, "n_windows": WINDOWS,
                   "window_length": 64},
        "versions": {"python": "3.11", "torch": "2.5.0", "transformers": "5.3.0"},
        "seed": 0,
        "timings": {"analyze_s": 1.5},
        "tables": {name: f"{name}.parquet" for name in tables},
        "counts": {"windows": WINDOWS},
        "created": "2026-01-01T00:00:00Z",
    }


def write_run(run_dir, tables=ALL_TABLES, seed: int = 0, frames=None) -> Path:
    """Write a synthetic run holding ``tables`` (names) into ``run_dir``.

    ``frames`` replaces the generated tables by name (e.g. an edited copy).
    """
    from attngeom.results.io import write_manifest, write_table

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    generated = make_tables(seed)
    generated.update(frames or {})
    for name in tables:
        write_table(run_dir, name, generated[name])
    write_manifest(run_dir, manifest_for(tables))
    return run_dir

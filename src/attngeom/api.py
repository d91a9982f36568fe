"""The Python API: every command of the CLI is one function here, usable from notebooks.

Each function takes plain values (or a configuration object), returns pandas
DataFrames (inside a small result object), and writes a results directory when
given ``out``. The CLI only parses arguments and calls these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from attngeom.errors import ConfigError, RunDirError
from attngeom.pipeline.config import AnalysisConfig, default_corpus, default_model, shared_assets
from attngeom.pipeline.run import AnalysisResult, RunResult, label_of, run_analysis

__all__ = [
    "AnalysisConfig",
    "AnalysisResult",
    "InterventionResult",
    "analyze",
    "check",
    "compare",
    "demo",
    "prune",
    "report",
    "restrict",
    "scan_heads",
]


def analyze(
    model: str | None = None,
    corpus: str | None = None,
    out: str | Path | None = None,
    *,
    config: AnalysisConfig | None = None,
    overwrite: bool = False,
    progress: bool = True,
    model_and_tokenizer=None,
    **options,
) -> AnalysisResult:
    """Top-N geometry, sink, taxonomy, bounds and diagnostics of a model on a corpus.

    ``options`` are ``AnalysisConfig`` fields (window_length, n_windows, n_grid,
    query_mode, rules, distances, repeats, seed, device, dtype, ...).

    >>> res = analyze(n_windows=2, window_length=32, progress=False)  # doctest: +SKIP
    >>> res["summary"].query("scope == 'model' and metric == 'f_score'")  # doctest: +SKIP
    """
    if config is None:
        config = AnalysisConfig(**_fill(options, model, corpus))
    elif options or model or corpus:
        config = config.with_(**_fill(options, model, corpus, keep_default=False))
    return run_analysis(config, out, overwrite=overwrite, progress=progress,
                        model_and_tokenizer=model_and_tokenizer)


def _fill(options: dict, model, corpus, keep_default: bool = True) -> dict:
    opts = dict(options)
    if model is not None:
        opts["model"] = model
    elif keep_default:
        opts.setdefault("model", default_model())
    if corpus is not None:
        opts["corpus"] = corpus
    elif keep_default:
        opts.setdefault("corpus", default_corpus())
    return opts


def report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report/index.html`` (figures and tables of whatever the run holds)."""
    from attngeom.report import build_report

    return build_report(Path(run_dir))


def check(model: str | None = None, *, device: str = "cpu", dtype: str = "float32") -> dict:
    """Run the load-time self-checks on a model (probabilities, masks, logits, gates)."""
    from attngeom.capture import check_model, load_model
    from attngeom.interventions.gates import check_gates

    m, tok = load_model(model or default_model(), device=device, dtype=dtype)
    rep = check_model(m, tok)
    check_gates(m)
    return {"model": model or default_model(), "report": rep, "gates": "ok"}


InterventionResult = RunResult  # what prune, scan_heads and restrict return


@dataclass(frozen=True)
class _Setup:
    model: object
    tokenizer: object
    layout: object
    rank_ids: object
    eval_ids: object
    rank_windows: list
    eval_windows: list
    config: AnalysisConfig


def _setup(model, corpus, window_length, n_rank, n_eval, device, dtype, seed) -> _Setup:
    import torch

    from attngeom.capture import load_model, load_tokenizer, model_layout
    from attngeom.pipeline.analysis import check_window_fits
    from attngeom.pipeline.run import load_windows

    config = AnalysisConfig(
        model=model or default_model(), corpus=corpus or default_corpus(),
        window_length=window_length, n_windows=n_rank + n_eval, seed=seed,
        device=device, dtype=dtype,
    )
    tok = load_tokenizer(config.model)
    windows, _info, _policy = load_windows(config, tok)
    m, tok = load_model(config.model, device=device, dtype=dtype, tokenizer=tok)
    layout = model_layout(m)
    if not layout.is_causal:
        raise ConfigError(f"{layout.model_class} is not a causal LM: perplexity needs one")
    check_window_fits(window_length, layout)
    if len(windows) < n_rank + n_eval:
        raise ConfigError(
            f"corpus gives {len(windows)} windows of {window_length} tokens; "
            f"{n_rank} ranking + {n_eval} evaluation windows were asked for"
        )
    rank, ev = windows[:n_rank], windows[n_rank : n_rank + n_eval]

    def stack(ws):
        return torch.stack([w.input_ids for w in ws]) if ws else None

    return _Setup(m, tok, layout, stack(rank), stack(ev), [w.index for w in rank],
                  [w.index for w in ev], config)


def _write(out, command: str, fingerprint_cfg: dict, tables: dict, overwrite: bool, s: _Setup,
           timings: dict) -> tuple[Path | None, dict]:
    """Write the tables and the manifest (the directory was checked by ``_check_out``)."""
    from attngeom.pipeline.run import model_identity
    from attngeom.results.io import prepare_run_dir, write_manifest, write_table
    from attngeom.results.manifest import build_manifest, config_fingerprint

    manifest = build_manifest(
        command=command, config=fingerprint_cfg,
        model_info=model_identity(s.config.model, s.model, s.layout),
        corpus_info={"name": s.config.corpus, "window_length": s.config.window_length,
                     "rank_windows": s.rank_windows, "eval_windows": s.eval_windows},
        seed=s.config.seed, timings=timings,
        tables={name: f"{name}.parquet" for name in tables}, counts={},
        fingerprint=config_fingerprint(fingerprint_cfg),
    )
    if out is None:
        return None, manifest
    out = prepare_run_dir(out, command=command, fingerprint=config_fingerprint(fingerprint_cfg),
                          overwrite=overwrite)
    for name, df in tables.items():
        write_table(out, name, df)
    write_manifest(out, manifest)
    return out, manifest


def _label(df, s: _Setup):
    if "model" in df.columns:
        return df
    df = df.copy()
    df.insert(0, "corpus", label_of(s.config.corpus))
    df.insert(0, "model", label_of(s.config.model))
    return df


def _check_out(out, overwrite: bool, command: str, cfg: dict) -> None:
    """Refuse a directory holding another run before any model work."""
    if out is None:
        return
    from attngeom.results.io import prepare_run_dir
    from attngeom.results.manifest import config_fingerprint

    prepare_run_dir(out, command=command, fingerprint=config_fingerprint(cfg),
                    overwrite=overwrite, check_only=True)


def _run_intervention(command: str, cfg: dict, out, overwrite: bool, body, *, n_rank: int,
                      n_eval: int, window_length: int, device: str, dtype: str,
                      seed: int = 0) -> RunResult:
    """Check arguments and the output directory, load model and windows, run ``body``, write."""
    if n_eval < 1 or n_rank < 0:
        raise ConfigError(
            f"expected n_eval_windows >= 1 and n_rank_windows >= 0, got {n_eval}, {n_rank}"
        )
    if window_length < 2:
        raise ConfigError(f"window_length: expected >= 2 tokens, got {window_length}")
    cfg = {**cfg, "dtype": dtype}
    _check_out(out, overwrite, command, cfg)
    t0 = time.perf_counter()
    s = _setup(cfg["model"], cfg["corpus"], window_length, n_rank, n_eval, device, dtype, seed)
    tables = {name: _label(df, s) for name, df in body(s).items()}
    out_dir, manifest = _write(out, command, cfg, tables, overwrite, s,
                               {"total_s": time.perf_counter() - t0})
    return RunResult(tables, manifest, out_dir)


def prune(
    model: str | None = None,
    corpus: str | None = None,
    out: str | Path | None = None,
    *,
    rankers=("taxonomy", "magnitude", "entropy", "random", "gradient", "sensitivity"),
    keep_fractions=(1.0, 0.9, 0.75, 0.5, 0.25),
    seeds=(0, 1, 2),
    orders=None,
    window_length: int = 128,
    n_rank_windows: int = 8,
    n_eval_windows: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
    seed: int = 0,
    overwrite: bool = False,
) -> InterventionResult:
    """Keep-fraction pruning sweep per ranker (SPEC 6).

    Rankers see only the ranking windows; perplexity is measured on the evaluation
    windows that follow them in the corpus (disjoint by construction).
    """
    from attngeom.interventions.rankers import RANKERS
    from attngeom.interventions.sweeps import prune_sweep

    rankers = tuple(rankers)
    bad = [r for r in rankers if r not in RANKERS]
    if bad:
        raise ConfigError(
            f"rankers: expected names among {', '.join(RANKERS)}, got {', '.join(bad)}"
        )
    fracs = tuple(float(f) for f in keep_fractions)
    if any(not (0.0 < f <= 1.0) for f in fracs):
        raise ConfigError(f"keep fractions: expected values in (0, 1], got {list(fracs)}")
    cfg = {"model": model or default_model(), "corpus": corpus or default_corpus(),
           "rankers": list(rankers), "keep_fractions": list(fracs), "seeds": list(seeds),
           "orders": orders, "window_length": window_length, "n_rank_windows": n_rank_windows,
           "n_eval_windows": n_eval_windows, "seed": seed}
    if n_rank_windows < 1:
        raise ConfigError("prune: expected n_rank_windows >= 1 (rankers need their own windows)")
    if not fracs or not tuple(seeds):
        raise ConfigError("prune: expected at least one keep fraction and one seed")

    def body(s: _Setup) -> dict:
        taxonomy = None
        if "taxonomy" in rankers:
            taxonomy = run_analysis(
                s.config.with_(n_windows=n_rank_windows, start_window=0,
                               analyses=("taxonomy",), query_mode="all"),
                None, progress=False, model_and_tokenizer=(s.model, s.tokenizer),
            )["taxonomy"]
        pruning, rankings = prune_sweep(
            s.model, s.rank_ids, s.eval_ids, rank_windows=s.rank_windows,
            eval_windows=s.eval_windows, rankers=rankers, keep_fractions=fracs,
            seeds=tuple(seeds), taxonomy=taxonomy, orders=orders,
        )
        tables = {"pruning": pruning, "rankings": rankings}
        if taxonomy is not None:
            tables["taxonomy"] = taxonomy
        return tables

    return _run_intervention("prune", cfg, out, overwrite, body, n_rank=n_rank_windows,
                             n_eval=n_eval_windows, window_length=window_length,
                             device=device, dtype=dtype, seed=seed)


def scan_heads(
    model: str | None = None,
    corpus: str | None = None,
    out: str | Path | None = None,
    *,
    threshold: float = 0.05,
    window_length: int = 128,
    n_eval_windows: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
    overwrite: bool = False,
) -> InterventionResult:
    """Remove each head alone and report relative delta-NLL; critical heads above ``threshold``."""
    from attngeom.interventions.sweeps import scan_heads as _scan

    if not threshold > 0:
        raise ConfigError(f"threshold: expected a positive relative delta-NLL, got {threshold}")
    cfg = {"model": model or default_model(), "corpus": corpus or default_corpus(),
           "threshold": threshold, "window_length": window_length,
           "n_eval_windows": n_eval_windows}
    return _run_intervention(
        "scan-heads", cfg, out, overwrite,
        lambda s: {"head_scan": _scan(s.model, s.eval_ids, threshold=threshold)},
        n_rank=0, n_eval=n_eval_windows, window_length=window_length, device=device,
        dtype=dtype,
    )


def restrict(
    model: str | None = None,
    corpus: str | None = None,
    out: str | Path | None = None,
    *,
    n_grid=(1, 2, 4, 8, 16, 32, 64),
    scopes=("model",),
    layers=None,
    heads=None,
    renormalize=(True, False),
    taus=(0.01, 0.05, 0.10),
    window_length: int = 128,
    n_eval_windows: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
    overwrite: bool = False,
) -> InterventionResult:
    """Top-N attention restriction: delta-NLL per N and the effective set size N*_tau (SPEC 6)."""
    from attngeom.interventions.sweeps import restrict_sweep

    grid = tuple(int(n) for n in n_grid)
    if not grid or min(grid) < 1:
        raise ConfigError(f"n_grid: expected integers >= 1, got {list(grid)}")
    if not tuple(taus) or any(not t > 0 for t in taus):
        raise ConfigError(f"taus: expected positive relative delta-NLL thresholds, got {taus}")
    if not tuple(renormalize):
        raise ConfigError("renormalize: expected True, False or both")
    bad = [x for x in scopes if x not in ("model", "layer", "head")] or not tuple(scopes)
    if bad:
        raise ConfigError(f"scopes: expected a subset of model, layer, head, got {scopes}")
    cfg = {"model": model or default_model(), "corpus": corpus or default_corpus(),
           "n_grid": list(grid), "scopes": list(scopes), "layers": layers, "heads": heads,
           "renormalize": list(renormalize), "taus": list(taus),
           "window_length": window_length, "n_eval_windows": n_eval_windows}

    def body(s: _Setup) -> dict:
        res, nstar = restrict_sweep(
            s.model, s.eval_ids, grid, scopes=tuple(scopes), renormalize=tuple(renormalize),
            taus=tuple(taus), layers=layers, heads=heads,
        )
        return {"restrict": res, "restrict_nstar": nstar}

    return _run_intervention("restrict", cfg, out, overwrite, body, n_rank=0,
                             n_eval=n_eval_windows, window_length=window_length,
                             device=device, dtype=dtype)


STABLE = 0.8  # the label stability above which a head counts as firmly labelled


@dataclass
class Comparison:
    """Regime stability between two runs (SPEC 4)."""

    agreement: float
    kappa: float
    n_heads: int
    excluded: int
    confusion: object
    merged: object
    stable_agreement: float = float("nan")
    n_stable: int = 0
    stability_threshold: float = 0.8

    def __str__(self) -> str:
        kappa = (f"{self.kappa:.3f}" if self.kappa == self.kappa
                 else "undefined (a single regime in both runs)")
        lines = [
            f"heads compared: {self.n_heads} (excluded: {self.excluded})",
            f"same regime: {self.agreement:.1%}   Cohen's kappa: {kappa}",
        ]
        if "stability_a" in self.merged.columns:
            sa, sb = self.merged["stability_a"], self.merged["stability_b"]
            stable = (f"{self.stable_agreement:.1%}" if self.n_stable else "no such head")
            lines.append(
                f"label stability (window bootstrap): median {sa.median():.3f} and "
                f"{sb.median():.3f}; heads stable (>= {self.stability_threshold:g}) in both: "
                f"{self.n_stable}, same regime among them: {stable}"
            )
        lines.append(self.confusion.to_string())
        return "\n".join(lines)


def compare(run_a: str | Path, run_b: str | Path) -> Comparison:
    """How stable the Retriever/Mixer/Reset regimes are between two runs."""
    import pandas as pd

    from attngeom.core.agreement import regime_agreement
    from attngeom.results.io import read_manifest, read_table

    runs = []
    for run in (run_a, run_b):
        manifest = read_manifest(run)
        if "taxonomy" not in manifest.get("tables", {}):
            raise RunDirError(f"{run} has no taxonomy table; run 'attngeom analyze' with taxonomy")
        runs.append((manifest, read_table(run, "taxonomy")))
    (ma, ta), (mb, tb) = runs
    ida, idb = ma.get("model", {}), mb.get("model", {})
    def identity(m: dict) -> tuple:
        # a local model is known by its files' hash; a hub model (no hash) by its id
        return (m.get("sha256") or m.get("name"), m.get("class"), m.get("num_layers"),
                m.get("num_heads"))

    if identity(ida) != identity(idb):
        raise RunDirError(
            f"{run_a} and {run_b} analyse different models ({ida.get('name')} vs "
            f"{idb.get('name')}); compare needs runs of the same model"
        )
    cols = ["layer", "head", "regime"] + (
        ["stability"] if "stability" in ta.columns and "stability" in tb.columns else [])
    merged = ta[cols].merge(tb[cols], on=["layer", "head"], suffixes=("_a", "_b"))
    agr = regime_agreement(list(merged["regime_a"]), list(merged["regime_b"]))
    stable_agreement, n_stable = float("nan"), 0
    if "stability_a" in merged.columns:
        both = merged[(merged["stability_a"] >= STABLE) & (merged["stability_b"] >= STABLE)]
        n_stable = len(both)
        if n_stable:
            stable_agreement = float((both["regime_a"] == both["regime_b"]).mean())
    long = pd.DataFrame(agr.confusion)
    confusion = long.pivot_table(index="regime_a", columns="regime_b", values="count",
                                 aggfunc="sum", sort=False)
    confusion.index.name = f"{_run_name(ma, run_a)} \\ {_run_name(mb, run_b)}"
    confusion.columns.name = None
    return Comparison(
        agreement=float(agr.agreement), kappa=float(agr.kappa), n_heads=int(agr.n_heads),
        excluded=int(agr.n_excluded), confusion=confusion, merged=merged,
        stable_agreement=stable_agreement, n_stable=n_stable, stability_threshold=STABLE,
    )


def _run_name(manifest: dict, run) -> str:
    corpus = manifest.get("config", {}).get("corpus_label") or Path(str(run)).name
    return str(corpus)


def smollm_path() -> str:
    """The shared SmolLM2-135M-Instruct GGUF (a real decoder with a first-token sink)."""
    return str(shared_assets() / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf")


def demo(out: str | Path = "runs/demo", *, quick: bool = False, progress: bool = True) -> dict:
    """The default study: stories260K on the shared TinyStories and WikiText samples, and
    SmolLM2-135M (a decoder with a strong sink) on WikiText.

    Writes three analysis runs, the regime comparison of stories260K between corpora, a
    head scan, a short pruning sweep and a top-N restriction sweep, and one HTML report
    per run; returns the paths and the headline F_N table.
    """
    from attngeom.pipeline.tables import headline

    out = Path(out)
    corpora = {
        "tinystories": default_corpus(),
        "wikitext": str(shared_assets() / "corpora" / "wikitext-2-raw" / "wiki.test.lf.txt"),
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
    comparison = compare(out / "tinystories", out / "wikitext")
    scan = scan_heads(out=out / "scan", n_eval_windows=4 if quick else 8, overwrite=True)
    pruned = prune(
        out=out / "prune", rankers=("taxonomy", "magnitude", "random"),
        seeds=(0, 1) if quick else (0, 1, 2), n_rank_windows=4 if quick else 8,
        n_eval_windows=4 if quick else 8, overwrite=True,
    )
    restricted = restrict(out=out / "restrict", n_eval_windows=2 if quick else 4,
                          overwrite=True)
    reports = {name: report(out / name)
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

"""``analyze`` end to end: validate, load, window, stream, aggregate, write.

Order matters for bad input: the configuration is checked first, then the output
directory (a directory holding another run is refused before anything is computed),
then the corpus and model; tables are written only once everything succeeded, each
atomically, and the manifest last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from attngeom.errors import CorpusError
from attngeom.pipeline.analysis import (
    check_window_fits,
    grid_report,
    make_accumulators,
    stream_windows,
)
from attngeom.pipeline.config import AnalysisConfig


@dataclass
class RunResult:
    """What every command returns: its tables as DataFrames, the manifest, where they went."""

    tables: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    out_dir: Path | None = None

    def __getitem__(self, name: str):
        return self.tables[name]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {len(v)} rows" for k, v in self.tables.items())
        return f"{type(self).__name__}(out_dir={self.out_dir}, {shapes})"


AnalysisResult = RunResult


def label_of(path_or_id: str) -> str:
    p = Path(path_or_id)
    return p.name if p.name else str(path_or_id)


def load_windows(config: AnalysisConfig, tokenizer, *, n_windows=None, start_window=None):
    """Read the corpus and cut it into windows of ``config.window_length`` tokens.

    Returns ``(windows, corpus_info, policy)``; ``policy`` is the document-boundary
    policy (SPEC 7) the windows follow.
    """
    from attngeom.pipeline.corpus import read_documents
    from attngeom.pipeline.windows import boundary_policy, make_windows

    policy = boundary_policy(tokenizer, config.doc_boundary, config.boundary_token)
    docs, info = read_documents(
        config.corpus, text_column=config.text_column, separator=config.separator
    )
    windows = make_windows(
        docs, tokenizer, config.window_length,
        n_windows=config.n_windows if n_windows is None else n_windows,
        start_window=config.start_window if start_window is None else start_window,
        policy=policy, name=getattr(info, "name", None),
    )
    if not windows:
        raise CorpusError(
            f"corpus {config.corpus} gives no window of {config.window_length} tokens "
            f"from window {config.start_window} on"
        )
    return windows, info, policy


def model_identity(name: str, model, layout) -> dict:
    from attngeom.results.manifest import directory_sha256, file_sha256

    p = Path(name).expanduser()
    digest = directory_sha256(p) if p.is_dir() else file_sha256(p) if p.is_file() else None
    return {
        "name": name,
        "class": layout.model_class,
        "sha256": digest,
        "num_layers": layout.num_layers,
        "num_heads": layout.num_heads,
        "num_kv_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim,
        "is_causal": layout.is_causal,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }


def run_analysis(
    config: AnalysisConfig,
    out_dir: str | Path | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    model_and_tokenizer=None,
) -> AnalysisResult:
    """Analyse ``config.model`` on ``config.corpus`` (SPEC 1-5); write tables if ``out_dir``."""
    from attngeom.capture import load_model, load_tokenizer, model_layout
    from attngeom.pipeline import tables as tb
    from attngeom.results.io import prepare_run_dir, write_manifest, write_table
    from attngeom.results.manifest import build_manifest, config_fingerprint

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    fingerprint = config_fingerprint(config.fingerprint_dict())
    if out_dir is not None:  # refuse another run's directory now; clear it only when writing
        prepare_run_dir(out_dir, command="analyze", fingerprint=fingerprint,
                        overwrite=overwrite, check_only=True)
    # the tokenizer first: a bad corpus or boundary option fails before the model loads
    tokenizer = load_tokenizer(config.model) if model_and_tokenizer is None else (
        model_and_tokenizer[1])
    windows, corpus_info, policy = load_windows(config, tokenizer)
    timings["windows_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    if model_and_tokenizer is None:
        model, tokenizer = load_model(config.model, device=config.device, dtype=config.dtype,
                                      tokenizer=tokenizer)
    else:
        model = model_and_tokenizer[0]
    layout = model_layout(model)
    check_window_fits(config.window_length, layout)
    timings["load_model_s"] = time.perf_counter() - t1

    grid = grid_report(config.n_grid, config.window_length, config.query_mode, layout.is_causal)
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    special_ids |= set(policy.prefix) | set(policy.suffix)
    if policy.token_id is not None:
        special_ids.add(policy.token_id)
    accumulators = make_accumulators(config, config.window_length, sorted(special_ids))
    stream = stream_windows(model, layout, windows, config, accumulators, progress=progress)
    timings["stream_s"] = stream.seconds

    t2 = time.perf_counter()
    model_label = config.model_label or label_of(config.model)
    corpus_label = config.corpus_label or label_of(config.corpus)
    raw = accumulators.compute()
    tables = {}
    effect = None
    for name, cols in raw.items():
        df = tb.frame(cols, model=model_label, corpus=corpus_label)
        if name == "sink_tokens":
            df = tb.with_token_text(df, tokenizer)
        if name == "sink_effect":
            effect = df
        else:
            tables[name] = df
    if "metrics" in tables:
        tables["summary"] = tb.summarize(
            tables["metrics"], n_boot=config.bootstrap, seed=config.seed
        )
    if "sink" in tables:
        tables["sink"] = tb.sink_table(tables["sink"], effect)
    if "bounds" in tables:
        tables["bounds"] = tb.bounds_table(tables["bounds"], tables.get("summary"))
    timings["aggregate_s"] = time.perf_counter() - t2

    metrics_acc = accumulators.items.get("metrics")
    counts = {
        "windows": stream.windows,
        "tokens": stream.tokens,
        "nonfinite_rows": int(metrics_acc.nonfinite_rows) if metrics_acc else 0,
        "never_valid_n": grid["never_valid_n"],
        "largest_universe": grid["largest_universe"],
        "skipped_entries": int(tables["metrics"]["n_skipped"].sum()) if "metrics" in tables else 0,
    }
    timings["total_s"] = time.perf_counter() - t0
    corpus_meta = _corpus_meta(corpus_info, windows, config)
    corpus_meta["boundary_policy"] = policy.to_dict()
    manifest = build_manifest(
        command="analyze",
        config=config.to_dict(),
        model_info=model_identity(config.model, model, layout),
        corpus_info=corpus_meta,
        seed=config.seed,
        timings=timings,
        tables={name: f"{name}.parquet" for name in tables},
        counts=counts,
        fingerprint=fingerprint,
    )
    if out_dir is not None:
        out_dir = prepare_run_dir(out_dir, command="analyze", fingerprint=fingerprint,
                                  overwrite=overwrite)
        for name, df in tables.items():
            write_table(out_dir, name, df)
        write_manifest(out_dir, manifest)
    return AnalysisResult(tables=tables, manifest=manifest, out_dir=out_dir)


def _corpus_meta(info, windows, config) -> dict:
    meta = info.to_dict() if hasattr(info, "to_dict") else dict(info)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in meta.items()}
    meta.update({
        "n_windows": len(windows),
        "window_length": config.window_length,
        "first_window": int(windows[0].index),
        "last_window": int(windows[-1].index),
    })
    return meta

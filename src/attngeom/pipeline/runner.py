"""One runner for every command: check, read, load, compute, write (in that order).

``execute(command, config, out)`` is the only path a command takes:

1. the configuration was validated when it was built (``attngeom.config``);
2. the output directory is checked before anything is loaded: one holding another
   run is refused, and one that cannot be created or written fails now, not after
   the work (``--out /proc/x``);
3. the tokenizer loads and the corpus is cut into windows, so a bad corpus or
   boundary option fails before the model loads;
4. the model loads and is checked against the command (window length, causal LM);
5. ``command.run(context)`` computes the tables, reporting progress;
6. each table is written atomically, then the manifest (``attngeom.results``).

A command is a ``Command`` subclass (``pipeline/analyze.py``,
``pipeline/interventions.py``); the API (``attngeom.api``) builds a configuration and
calls ``execute``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngeom.errors import ConfigError, CorpusError, RunDirError


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

    def headline(self):
        """F_N by rule and N over all heads (``None`` without a summary table)."""
        from attngeom.pipeline.tables import headline

        return headline(self.tables["summary"]) if "summary" in self.tables else None


@dataclass
class RunContext:
    """Everything a command's ``run`` sees."""

    config: Any
    tokenizer: Any
    windows: list
    corpus_info: Any
    policy: Any
    model: Any = None
    layout: Any = None
    progress: Any = True
    timings: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    corpus_extra: dict = field(default_factory=dict)

    @property
    def model_label(self) -> str:
        return self.config.model_label or label_of(self.config.model)

    @property
    def corpus_label(self) -> str:
        return self.config.corpus_label or label_of(self.config.corpus)


class Command:
    """A command of the CLI and the API: its name, what it needs, how it runs."""

    name: str = ""
    needs_causal: bool = False  # perplexity needs a causal LM

    def run(self, ctx: RunContext) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


def label_of(path_or_id: str) -> str:
    p = Path(str(path_or_id))
    return p.name if p.name else str(path_or_id)


def check_writable(out: Path) -> Path:
    """Create ``out`` if needed and prove a file can be written there (one line if not)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create results directory {out}: "
                          f"{e.strerror or type(e).__name__}") from None
    probe = out / f".attngeom-write-test.{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"cannot write to results directory {out}: "
                          f"{e.strerror or type(e).__name__}") from None
    return out


def prepare_output(out, command: str, fingerprint: str, overwrite: bool) -> Path | None:
    """Refuse another run's directory and prove this one writable, before any work."""
    if out is None:
        return None
    from attngeom.results.io import prepare_run_dir

    prepare_run_dir(out, command=command, fingerprint=fingerprint, overwrite=overwrite,
                    check_only=True)
    return check_writable(Path(out))


def load_windows(config, tokenizer, *, n_windows=None, start_window=None):
    """Read the corpus and cut it into windows of ``config.window_length`` tokens.

    Returns ``(windows, corpus_info, policy)``; ``policy`` is the document-boundary
    policy (method §10) the windows follow.
    """
    from attngeom.pipeline.corpus import read_documents
    from attngeom.pipeline.windows import boundary_policy, make_windows

    policy = boundary_policy(tokenizer, config.doc_boundary, config.boundary_token)
    docs, info = read_documents(
        config.corpus, text_column=config.text_column, separator=config.separator
    )
    windows = make_windows(
        docs, tokenizer, config.window_length,
        n_windows=config.windows_needed if n_windows is None else n_windows,
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


def _corpus_meta(ctx: RunContext) -> dict:
    info = ctx.corpus_info
    meta = info.to_dict() if hasattr(info, "to_dict") else dict(info)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in meta.items()}
    meta.update({
        "n_windows": len(ctx.windows),
        "window_length": ctx.config.window_length,
        "first_window": int(ctx.windows[0].index),
        "last_window": int(ctx.windows[-1].index),
        "boundary_policy": ctx.policy.to_dict(),
    })
    meta.update(ctx.corpus_extra)
    return meta


def _labelled(df, ctx: RunContext):
    if "model" in df.columns:
        return df
    df = df.copy()
    df.insert(0, "corpus", ctx.corpus_label)
    df.insert(0, "model", ctx.model_label)
    return df


def execute(command: Command, config, out=None, *, overwrite: bool = False,
            progress=True, model_and_tokenizer=None) -> RunResult:
    """Run ``command`` with ``config``; write its tables and manifest to ``out`` if given."""
    from attngeom.capture import load_model, load_tokenizer, model_layout
    from attngeom.pipeline.stream import check_window_fits
    from attngeom.results.manifest import build_manifest, config_fingerprint

    config.require_model_and_corpus()
    fingerprint = config_fingerprint(config.fingerprint_dict())
    out_dir = prepare_output(out, command.name, fingerprint, overwrite)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    given_model, given_tok = model_and_tokenizer or (None, None)
    tokenizer = given_tok if given_tok is not None else load_tokenizer(config.model)
    windows, info, policy = load_windows(config, tokenizer)
    needed = config.windows_needed
    if command.needs_causal and needed is not None and len(windows) < needed:
        raise ConfigError(
            f"corpus gives {len(windows)} windows of {config.window_length} tokens; "
            f"the command needs {needed}"
        )
    timings["windows_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    if given_model is None:
        model, tokenizer = load_model(config.model, device=config.device, dtype=config.dtype,
                                      tokenizer=tokenizer)
    else:
        model = given_model
    layout = model_layout(model)
    check_window_fits(config.window_length, layout)
    if command.needs_causal and not layout.is_causal:
        raise ConfigError(f"{layout.model_class} is not a causal LM: {command.name} measures "
                          "next-token loss, which needs one")
    timings["load_model_s"] = time.perf_counter() - t1

    ctx = RunContext(config=config, tokenizer=tokenizer, windows=windows, corpus_info=info,
                     policy=policy, model=model, layout=layout, progress=progress,
                     timings=timings)
    tables = {name: _labelled(df, ctx) for name, df in command.run(ctx).items()}
    timings["total_s"] = time.perf_counter() - t0
    manifest = build_manifest(
        command=command.name, config=config.to_dict(),
        model_info=model_identity(config.model, model, layout), corpus_info=_corpus_meta(ctx),
        seed=config.seed, timings=timings, tables={n: f"{n}.parquet" for n in tables},
        counts=ctx.counts, fingerprint=fingerprint,
    )
    if out_dir is not None:
        from attngeom.results.io import prepare_run_dir, write_manifest, write_table

        out_dir = prepare_run_dir(out_dir, command=command.name, fingerprint=fingerprint,
                                  overwrite=overwrite)
        for name, df in tables.items():
            write_table(out_dir, name, df)
        write_manifest(out_dir, manifest)
    return RunResult(tables=tables, manifest=manifest, out_dir=out_dir)

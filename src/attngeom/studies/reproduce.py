"""``attngeom reproduce STUDY.toml --out DIR``: every cell of a study, then its steps, then
one report.

1. The study file is read and checked (``studies.study``); nothing has loaded yet.
2. ``--dry-run`` stops here and lists the cells: command, windows, memory estimate.
3. Each cell runs through the common runner (``pipeline.runner.execute``) in
   ``DIR/runs/MODEL/CORPUS/COMMAND``: a finished cell (its manifest holds the same
   configuration) is skipped without loading anything, an unfinished one resumes from
   its shards. A model loads once for all its cells.
4. The same table of every run is written side by side to ``DIR/tables/NAME.parquet``
   (model and corpus columns), beside the study's own tables: ``regime_stability``
   (taxonomy between corpora), ``geometry_loss`` (Spearman of F_N and the
   restriction's delta-NLL over N) and ``reference_values`` (published numbers beside
   the measured ones).
5. ``DIR/study.json`` records the study, its cells and what each did;
   ``DIR/report/index.html`` is the study report, linking every run's own report.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from attngeom.errors import RunDirError
from attngeom.studies.study import Cell, Study, find_study, load_study

STUDY_FILE = "study.json"
_OWN = {STUDY_FILE, "runs", "tables", "report"}


@dataclass
class StudyResult:
    study: Study
    out_dir: Path | None
    plan: object  # pandas DataFrame, one row per cell
    tables: dict = field(default_factory=dict)
    report: Path | None = None
    cells: list = field(default_factory=list)  # dicts: model, corpus, command, status, ...
    wall_s: float = 0.0

    def summary(self) -> str:
        """What the CLI prints: the plan of a dry run, else the main numbers and where
        the results and the report are."""
        if self.out_dir is None:
            return format_plan(self.study, self.plan)
        from attngeom.report.study import study_findings

        skipped = sum(c["status"] == "skipped" for c in self.cells)
        lines = [f"study {self.study.name}: {len(self.cells)} runs in {self.wall_s:.0f} s "
                 f"({skipped} finished before)"]
        from attngeom.report.text import format_protocol

        lines += [f"protocol: {line}" for line in format_protocol(protocol(self.study))]
        lines += [f"- {sentence}" for sentence in study_findings(self.tables)]
        lines += [f"results: {self.out_dir}", f"tables: {self.out_dir / 'tables'}"]
        if self.report is not None:
            lines.append(f"report: {self.report}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- plan


def _windows(cell: Cell) -> str:
    cfg = cell.config
    needed = cfg.windows_needed
    text = "every window" if needed is None else str(needed)
    if cfg.windows_per_document:
        text = (f"{cfg.windows_per_document} per document"
                + ("" if needed is None else f", at most {needed}"))
    if cfg.sample_documents:
        text += f" (of {cfg.sample_documents} sampled documents)"
    return text


def cell_memory_gb(study: Study, cell: Cell) -> float:
    """Estimated device memory of the cell's process (NaN when the shape is unknown)."""
    from attngeom.studies.presets import estimate_memory_gb

    shape = study.models[cell.model].shape
    if not shape:
        return float("nan")
    return estimate_memory_gb(
        params_b=shape["params_b"], layers=shape["layers"], hidden=shape["hidden"],
        kv_dim=shape["kv_heads"] * shape["head_dim"], heads=shape["heads"],
        vocab=shape["vocab"], window_length=cell.config.window_length,
        batch_size=cell.config.batch_size, dtype=cell.config.dtype, command=cell.command,
        quantization=cell.config.quantization)


def plan(study: Study):
    """One row per cell: what runs where, on how many windows, with how much memory."""
    import pandas as pd

    rows = []
    for cell in study.cells:
        m = study.models[cell.model]
        rows.append({
            "model": cell.model, "corpus": cell.corpus, "command": cell.command,
            "analyses": ",".join(getattr(cell.config, "analyses", ())) or "-",
            "windows": _windows(cell), "T": cell.config.window_length,
            # the weights' format where quantized: "bfloat16 8bit" computes in bfloat16
            "dtype": " ".join([cell.config.dtype] + [cell.config.quantization] * (
                cell.config.quantization != "none")),
            "memory_gb": round(cell_memory_gb(study, cell), 2),
            "source": m.model if m.available else f"{m.model} (not in the local cache)",
            "directory": str(cell.directory),
        })
    return pd.DataFrame(rows)


def format_plan(study: Study, table) -> str:
    lines = [f"study {study.name}: {len(study.cells)} cells "
             f"({len(study.models)} models x {len(study.corpora)} corpora), analyses "
             f"{', '.join(study.analyses)}"]
    shown = table.drop(columns=["source", "directory"])
    lines.append(shown.to_string(index=False))
    missing = [m for m in study.models.values() if not m.available]
    for m in missing:
        gated = getattr(m.preset, "gated", False)
        lines.append(f"model {m.label}: {m.model} is not in the local cache (offline); it is "
                     "downloaded when the study runs with the hub reachable"
                     + ("; gated: accept its licence on the hub and log in first" if gated
                        else ""))
    steps = [s for s in ("cross_corpus", "geometry_vs_loss") if s in study.analyses]
    if steps:
        lines.append(f"then: {', '.join(steps)}, the combined tables and the study report")
    return "\n".join(lines)


# --------------------------------------------------------------------------- run


def _finished(directory: Path, cell: Cell) -> bool:
    from attngeom.results.io import holds_run
    from attngeom.results.manifest import config_fingerprint

    return holds_run(directory, cell.command, config_fingerprint(cell.config.fingerprint_dict()))


def _check_out(out: Path, study: Study, overwrite: bool) -> None:
    from attngeom.engine.runner import check_writable

    if out.exists() and not out.is_dir():
        raise RunDirError(f"expected a study directory, got {out} (a file)")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()}
        foreign = sorted(entries - _OWN)
        if foreign:
            raise RunDirError(f"{out} holds files a study did not write ({', '.join(foreign[:5])})"
                              "; choose an empty or new directory")
        if STUDY_FILE in entries and not overwrite:
            try:
                old = json.loads((out / STUDY_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old = {}
            if old.get("study") != study.name:
                raise RunDirError(f"{out} holds study {old.get('study')!r}, not "
                                  f"{study.name!r}; pass --overwrite or choose another "
                                  "directory")
    check_writable(out)


def reproduce(study_file, out=None, *, dry_run: bool = False, overwrite: bool = False,
              progress: bool = True, reports: bool = True) -> StudyResult:
    """Run (or with ``dry_run`` only plan) the study in ``study_file`` into ``out``."""
    study = study_file if isinstance(study_file, Study) else load_study(find_study(
        str(study_file)))
    table = plan(study)
    if dry_run:
        return StudyResult(study=study, out_dir=None, plan=table)
    if out is None:
        raise RunDirError("reproduce needs an output directory (--out)")
    out = Path(out)
    _check_out(out, study, overwrite)
    t0 = time.perf_counter()
    _check_documents(study, out, overwrite=overwrite, progress=progress)
    done = _run_cells(study, out, overwrite=overwrite, progress=progress)
    tables = _study_tables(study, out, done)
    run_reports = {}
    if reports:
        from attngeom.report import build_report

        for rec in done:
            directory = out / rec["directory"]
            index = directory / "report" / "index.html"
            if rec["status"] != "skipped" or not index.is_file():
                build_report(directory)
            run_reports[rec["directory"]] = str(index.relative_to(out))
    result = StudyResult(study=study, out_dir=out, plan=table, tables=tables, cells=done,
                         wall_s=time.perf_counter() - t0)
    _write_study_json(out, study, done, tables, result.wall_s, run_reports)
    if reports:
        from attngeom.report.study import build_study_report

        result.report = build_study_report(out)
    return result


def _say(progress: bool, text: str) -> None:
    if progress:
        import sys

        print(text, file=sys.stderr, flush=True)


def _check_documents(study: Study, out: Path, *, overwrite: bool, progress: bool) -> None:
    """Every cell that will run and asks a number of documents (the fixed protocol, the
    context sweep) is checked against its corpus before the first model loads: a study
    fails in one line at once, not hours in, after the models before it ran. One
    tokenizer per model, loaded without weights."""
    from attngeom.capture import load_tokenizer
    from attngeom.corpora.documents import check_documents

    tokenizers: dict = {}
    for cell in study.cells:
        cfg = cell.config
        if getattr(cfg, "document_protocol", "stream") != "fixed" \
                and getattr(cfg, "probe", None) != "context":
            continue
        if not overwrite and _finished(out / cell.directory, cell):
            continue
        if cfg.model not in tokenizers:
            _say(progress, f"checking the documents of {cell.name} ...")
            tokenizers[cfg.model] = load_tokenizer(cfg.model)
        check_documents(cfg, tokenizers[cfg.model])


def _run_cells(study: Study, out: Path, *, overwrite: bool, progress: bool) -> list[dict]:
    from attngeom.engine.runner import Distributed, execute, work_of
    from attngeom.results.state import run_states

    done = []
    loaded_key, loaded = None, None
    for i, cell in enumerate(study.cells, start=1):
        directory = out / cell.directory
        rec = {"model": cell.model, "corpus": cell.corpus, "command": cell.command,
               "directory": cell.directory.as_posix()}
        head = f"[{i}/{len(study.cells)}] {cell.name}"
        if not overwrite and _finished(directory, cell):
            _say(progress, f"{head}: finished before, skipped")
            rec.update(status="skipped", wall_s=0.0)
            done.append(rec)
            continue
        cfg = cell.config
        key = (cfg.model, cfg.dtype, cfg.device, cfg.device_map, cfg.quantization)
        if key != loaded_key:
            loaded = None  # free the previous model before the next one loads
            _say(progress, f"{head}: loading model {cell.model} ({cfg.dtype}, "
                           f"{cfg.device}) ...")
            loaded = _load(cfg, Distributed.from_env(cfg.device))
            loaded_key = key
        resumed = bool(run_states(directory))  # shards of an unfinished run are there
        _say(progress, f"{head}: {'resuming' if resumed else 'running'}")
        t = time.perf_counter()
        execute(work_of(cell.command), cfg, directory, overwrite=overwrite,
                progress=progress, model_and_tokenizer=loaded)
        rec.update(status="resumed" if resumed else "run", wall_s=time.perf_counter() - t)
        done.append(rec)
    return done


def _load(cfg, dist):
    from attngeom.capture import load_model

    return load_model(cfg.model, device=dist.device(cfg.device), dtype=cfg.dtype,
                      device_map=cfg.device_map, quantization=cfg.quantization)


# --------------------------------------------------------------------------- tables


def _study_tables(study: Study, out: Path, done: list[dict]) -> dict:
    from attngeom.engine.compare import compare_runs
    from attngeom.results.io import available_tables, read_table, write_table
    from attngeom.studies import combine, references

    per_table: dict[str, list] = {}
    for rec in done:
        directory = out / rec["directory"]
        for name in available_tables(directory):
            per_table.setdefault(name, []).append(read_table(directory, name))
    tables = {name: combine.combine(frames) for name, frames in per_table.items()}

    if "cross_corpus" in study.analyses:
        ms, cs = study.filters["cross_corpus"]
        pairs = []
        for m in ms:
            dirs = {cell.corpus: out / cell.directory for cell in study.cells_of("analyze")
                    if cell.model == m and cell.corpus in cs
                    and "taxonomy" in cell.config.analyses}
            for a, b in itertools.combinations(sorted(dirs), 2):
                pairs.append((m, a, b, compare_runs(dirs[a], dirs[b])))
        tables["regime_stability"] = combine.regime_stability(pairs)
    if "geometry_vs_loss" in study.analyses:
        section = study.filters["geometry_vs_loss"]
        renorm = study.options.get("geometry_vs_loss", {}).get("renormalize", False)
        g = combine.geometry_loss(tables.get("summary"), tables.get("restrict"),
                                  renormalize=(bool(renorm),))
        pairs = set(itertools.product(*section))
        # a row averaged over corpora ("a+b") is kept when each of its corpora is
        g = g[[all((m, x) in pairs for x in c.split("+"))
               for m, c in zip(g["model"], g["corpus"], strict=True)]]
        tables["geometry_loss"] = g.reset_index(drop=True)
    tables["reference_values"] = combine.reference_values(study, tables,
                                                          references.REFERENCES)
    target = out / "tables"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.parquet"):
        if old.stem not in tables:
            old.unlink()
    for name, df in tables.items():
        write_table(target, name, df)
    return tables


# what a reader needs to weigh a study's numbers, per command (config fields or properties)
PROTOCOL_KEYS = ("window_length", "query_mode", "n_windows", "n_rank_windows",
                 "n_eval_windows", "bootstrap", "effective_repeats", "n_grid",
                 "document_protocol")


def protocol(study: Study) -> dict:
    """Per command, the value of each protocol option over the study's cells (one value,
    or the sorted distinct values where cells differ): window length, query mode,
    windows, bootstrap replicates, random-control repeats, set sizes."""
    out: dict = {}
    for cell in study.cells:
        entry = out.setdefault(cell.command, {})
        for key in PROTOCOL_KEYS:
            if hasattr(cell.config, key):
                value = getattr(cell.config, key)
                value = list(value) if isinstance(value, tuple) else value
                seen = entry.setdefault(key, [])
                if value not in seen:
                    seen.append(value)
    return {cmd: {k: (vals[0] if len(vals) == 1 else vals) for k, vals in entry.items()}
            for cmd, entry in out.items()}


def _write_study_json(out: Path, study: Study, done, tables, wall_s, run_reports) -> None:
    from attngeom.results.io import write_json
    from attngeom.results.manifest import attngeom_version
    from attngeom.studies import references

    record = {
        "study": study.name, "title": study.title, "description": study.description,
        "file": str(study.path), "sha256": study.sha256, "analyses": list(study.analyses),
        "attngeom_version": attngeom_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": {k: {"model": m.model, "preset": getattr(m.preset, "name", None),
                       "is_causal": m.is_causal, "shape": m.shape}
                   for k, m in study.models.items()},
        "corpora": {k: {"corpus": c.corpus, **c.options} for k, c in study.corpora.items()},
        "protocol": protocol(study),
        "cells": done, "run_reports": run_reports,
        "reference_notes": dict(getattr(references, "UNAVAILABLE", {})),
        "tables": {name: f"tables/{name}.parquet" for name in tables},
        "wall_s": round(wall_s, 3),
    }
    write_json(out / STUDY_FILE, record)

"""``attngeom reproduce STUDY.toml --out DIR``: every cell of a study, then its steps, then
one report.

1. The study file is read and checked (``studies.study``); nothing has loaded yet.
   ``--shard K/N`` (or a scheduler's array index, ``studies/shards.py``) keeps a share
   of the cells.
2. ``--dry-run`` stops here and lists the cells: command, windows, memory estimate.
3. Each cell runs through the common runner (``engine.runner.execute``) in
   ``DIR/runs/MODEL/CORPUS/COMMAND``: a finished cell (its manifest holds the same
   configuration) is skipped without loading anything, an unfinished one resumes from
   its shards. A model loads once for all its cells. A cell is claimed first
   (``studies/claims.py``): one another process computes is left to it by a share,
   waited for by a plain run.
4. Once every cell of the study is finished (by the process that finishes the last
   one, one at a time), the same table of every run is written side by side to
   ``DIR/tables/NAME.parquet`` (model and corpus columns), beside the study's own
   tables: ``regime_stability`` (taxonomy between corpora), ``geometry_loss``
   (Spearman of F_N and the restriction's delta-NLL over N), ``policy_head_types`` and
   ``policy_first_heads`` (heads restricted alone, and the localised scan, by the atlas'
   head types) and ``reference_values`` (published numbers beside the measured ones).
   A part whose tables another part writes too is named apart there (``restrict-
   policies``: ``policy_restrict``, ``policy_nstar``, ``policy_alone``).
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
from attngeom.results.state import STATE_DIR
from attngeom.studies import claims
from attngeom.studies.claims import Claim
from attngeom.studies.estimate import cell_seconds
from attngeom.studies.shards import Shard, resolve_shard
from attngeom.studies.study import Cell, Study, find_study, load_study

STUDY_FILE = "study.json"
_OWN = {STUDY_FILE, "runs", "tables", "report", STATE_DIR}


@dataclass
class StudyResult:
    study: Study
    out_dir: Path | None
    plan: object  # pandas DataFrame, one row per cell
    tables: dict = field(default_factory=dict)
    report: Path | None = None
    cells: list = field(default_factory=list)  # dicts: model, corpus, command, status, ...
    wall_s: float = 0.0
    shard: Shard | None = None  # the share of the cells this process ran (None: all)
    unfinished: int = 0  # cells of the study not finished when this process ended
    steps: str = "written"  # the tables and report: written, elsewhere (another share's)

    def summary(self) -> str:
        """What the CLI prints: the plan of a dry run, else the main numbers and where
        the results and the report are."""
        if self.out_dir is None:
            return format_plan(self.study, self.plan, self.shard)
        from attngeom.report.study import study_findings

        skipped = sum(c["status"] == "skipped" for c in self.cells)
        if self.unfinished or self.steps != "written":
            return self._share_summary()
        lines = [f"study {self.study.name}: {len(self.cells)} runs in {self.wall_s:.0f} s "
                 f"({skipped} finished before)"]
        from attngeom.report.text import format_protocol

        lines += [f"protocol: {line}" for line in format_protocol(protocol(self.study))]
        lines += [f"- {sentence}" for sentence in study_findings(self.tables)]
        lines += [f"results: {self.out_dir}", f"tables: {self.out_dir / 'tables'}"]
        if self.report is not None:
            lines.append(f"report: {self.report}")
        return "\n".join(lines)

    def _share_summary(self) -> str:
        """A share that did not write the study's tables: what it did, who writes them."""
        count = {s: sum(c["status"] == s for c in self.cells)
                 for s in ("run", "resumed", "skipped", "elsewhere")}
        lines = [f"study {self.study.name}, share {self.shard}: {len(self.cells)} cells in "
                 f"{self.wall_s:.0f} s ({count['run'] + count['resumed']} computed, "
                 f"{count['skipped']} finished before, {count['elsewhere']} left to another "
                 "process)", f"results: {self.out_dir}"]
        if self.unfinished:
            lines.append(f"{self.unfinished} of {len(self.study.cells)} cells are not "
                         "finished: the process that finishes the last one writes the "
                         "tables and the report (or run reproduce again without --shard)")
        else:
            lines.append(f"tables and report: written by another process, in "
                         f"{self.out_dir / 'tables'} and {self.out_dir / 'report'}")
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


def plan(study: Study, cells=None):
    """One row per cell (of ``cells``, default all): what runs where, on how many
    windows, with how much memory."""
    import pandas as pd

    rows = []
    for cell in study.cells if cells is None else cells:
        m = study.models[cell.model]
        rows.append({
            "model": cell.model, "corpus": cell.corpus, "command": cell.command,
            "analyses": ",".join(getattr(cell.config, "analyses", ())) or "-",
            "windows": _windows(cell), "T": cell.config.window_length,
            # the weights' format where quantized: "bfloat16 8bit" computes in bfloat16
            "dtype": " ".join([cell.config.dtype] + [cell.config.quantization] * (
                cell.config.quantization != "none")),
            "memory_gb": round(cell_memory_gb(study, cell), 2),
            "minutes": round(cell_seconds(cell.command, cell.config, m.shape) / 60, 1),
            "source": m.model if m.available else f"{m.model} (not in the local cache)",
            "directory": str(cell.directory),
        })
    return pd.DataFrame(rows)


def expected_time(table) -> str:
    """The plan's estimated total, in words (``studies/estimate.py``)."""
    minutes = table["minutes"].sum() if len(table) else 0.0
    unknown = int(table["minutes"].isna().sum()) if len(table) else 0
    if unknown == len(table):
        return "expected time: unknown (no model shape could be read here)"
    more = f", plus {unknown} cells of unknown models" if unknown else ""
    return (f"expected time: about {max(1, round(minutes))} minutes on two CPU cores "
            f"(an estimate from the cells' forward passes{more})")


def format_plan(study: Study, table, shard: Shard | None = None) -> str:
    lines = [f"study {study.name}: {len(study.cells)} cells "
             f"({len(study.models)} models x {len(study.corpora)} corpora), analyses "
             f"{', '.join(study.analyses)}", expected_time(table)]
    if shard is not None:
        start, stop = shard.bounds(len(study.cells))
        lines.append(f"share {shard} (from {shard.source}): cells {start + 1} to {stop}")
    shown = table.drop(columns=["source", "directory"])
    lines.append(shown.to_string(index=False))
    missing = [m for m in study.models.values() if not m.available]
    for m in missing:
        gated = getattr(m.preset, "gated", False)
        lines.append(f"model {m.label}: {m.model} is not in the local cache (offline); it is "
                     "downloaded when the study runs with the hub reachable"
                     + ("; gated: accept its licence on the hub and log in first" if gated
                        else ""))
    from attngeom.studies.study import STUDY_STEPS

    steps = [s for s in STUDY_STEPS if s in study.analyses]
    if steps:
        lines.append(f"then: {', '.join(steps)}, the combined tables and the study report"
                     + (" (by the process that finishes the last cell)" if shard else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------- run


POLL_S = 5.0  # how often a process waiting for another's cell or steps looks again


def _check_out(out: Path, study: Study, overwrite: bool) -> None:
    from attngeom.engine.runner import check_writable
    from attngeom.results.files import TEMP_RE
    from attngeom.results.io import WRITE_PROBE_PREFIX

    if out.exists() and not out.is_dir():
        raise RunDirError(f"expected a study directory, got {out} (a file)")
    if out.is_dir():
        entries = {p.name for p in out.iterdir()}
        # another share's write probe or half-written study.json is no stranger's file
        foreign = sorted(e for e in entries - _OWN if not e.startswith(WRITE_PROBE_PREFIX)
                         and not ((m := TEMP_RE.match(e)) and m.group("target") in _OWN))
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
              progress: bool = True, reports: bool = True,
              shard: str | Shard | None = None) -> StudyResult:
    """Run (or with ``dry_run`` only plan) the study in ``study_file`` into ``out``.

    ``shard="K/N"`` runs share K of N of the cells (``studies/shards.py``; without it a
    SLURM array's or a Kubernetes Indexed Job's index is read); the study's tables and
    report are written by the process that finds every cell finished. Without a share
    the whole study runs, and cells another process is computing are waited for."""
    from attngeom.engine.runner import Distributed

    study = study_file if isinstance(study_file, Study) else load_study(find_study(
        str(study_file)))
    part = resolve_shard(shard, len(study.cells))
    cells = list(study.cells) if part is None else part.select(study.cells)
    table = plan(study, cells)
    if dry_run:
        return StudyResult(study=study, out_dir=None, plan=table, shard=part)
    if out is None:
        raise RunDirError("reproduce needs an output directory (--out)")
    out = Path(out)
    _check_out(out, study, overwrite)
    t0 = time.perf_counter()
    _say(progress, f"study {study.name}: {len(cells)} cells; {expected_time(table)}")
    _check_documents(cells, out, overwrite=overwrite, progress=progress)
    dist = Distributed.from_env(cells[0].config.device)
    note = "reproduce" + (f" --shard {part}" if part else "")
    mine = _run_cells(study, cells, out, dist, wait=part is None, note=note,
                      overwrite=overwrite, progress=progress, reports=reports)
    result = StudyResult(study=study, out_dir=out, plan=table, cells=mine, shard=part)
    if dist.is_main:
        _finish(result, out, mine, note=note, reports=reports, progress=progress, t0=t0)
    result.wall_s = time.perf_counter() - t0
    return result


def _say(progress: bool, text: str) -> None:
    if progress:
        import sys

        print(text, file=sys.stderr, flush=True)


def _check_documents(cells, out: Path, *, overwrite: bool, progress: bool) -> None:
    """Every cell that will run and asks a number of documents (the fixed protocol, the
    context sweep) is checked against its corpus before the first model loads: a study
    fails in one line at once, not hours in, after the models before it ran. One
    tokenizer per model, loaded without weights."""
    from attngeom.capture import load_tokenizer
    from attngeom.corpora.documents import check_documents

    tokenizers: dict = {}
    for cell in cells:
        cfg = cell.config
        if getattr(cfg, "document_protocol", "stream") != "fixed" \
                and getattr(cfg, "probe", None) != "context":
            continue
        if not overwrite and claims.finished(out, cell):
            continue
        if cfg.model not in tokenizers:
            _say(progress, f"checking the documents of {cell.name} ...")
            tokenizers[cfg.model] = load_tokenizer(cfg.model)
        check_documents(cfg, tokenizers[cfg.model])


class _Models:
    """The loaded model, kept for the next cells of the same model and options."""

    def __init__(self, dist) -> None:
        self.dist, self.key, self.loaded = dist, None, None

    def get(self, cell: Cell, progress: bool, head: str):
        cfg = cell.config
        key = (cfg.model, cfg.dtype, cfg.device, cfg.device_map, cfg.quantization)
        if key != self.key:
            self.loaded = None  # free the previous model before the next one loads
            _say(progress, f"{head}: loading model {cell.model} ({cfg.dtype}, "
                           f"{cfg.device}) ...")
            self.loaded = _load(cfg, self.dist)
            self.key = key
        return self.loaded


def _run_cells(study: Study, cells: list[Cell], out: Path, dist, *, wait: bool, note: str,
               overwrite: bool, progress: bool, reports: bool) -> list[dict]:
    """Compute the cells this process claims (``studies/claims.py``), in study order; a
    cell another process holds is waited for when ``wait`` (a plain run), else left to
    it (status ``elsewhere``). Returns one record per cell of ``cells``."""
    models = _Models(dist)
    number = {id(c): i for i, c in enumerate(study.cells, start=1)}
    recs: dict[int, dict] = {}
    busy = []
    talk = progress and dist.is_main
    for cell in cells:
        head = f"[{number[id(cell)]}/{len(study.cells)}] {cell.name}"
        lease = claims.cell_lease(out, cell, note)
        got = _claim(out, cell, lease, dist, overwrite=overwrite)
        if got is Claim.BUSY:
            _say(talk, f"{head}: another process computes it"
                       + ("" if wait else ", left to it"))
            busy.append(cell)
            continue
        recs[id(cell)] = _compute(cell, out, lease, got, models, dist, head=head,
                                  overwrite=overwrite, progress=progress, reports=reports)
    while wait and busy:  # a plain run ends with every cell finished
        time.sleep(POLL_S)
        still = []
        for cell in busy:
            lease = claims.cell_lease(out, cell, note)
            got = _claim(out, cell, lease, dist, overwrite=False)  # its result is fresh
            if got is Claim.BUSY:
                still.append(cell)
                continue
            head = f"[{number[id(cell)]}/{len(study.cells)}] {cell.name}"
            recs[id(cell)] = _compute(cell, out, lease, got, models, dist, head=head,
                                      overwrite=overwrite, progress=progress,
                                      reports=reports, waited=True)
        busy = still
    return [recs.get(id(c)) or _rec(c, status="elsewhere") for c in cells]


def _claim(out: Path, cell: Cell, lease, dist, *, overwrite: bool) -> Claim:
    value = claims.claim(out, cell, lease, overwrite=overwrite) if dist.is_main else 0
    return Claim(claims.agree(dist, int(value), cell.config.device))


def _rec(cell: Cell, **kw) -> dict:
    return {"model": cell.model, "corpus": cell.corpus, "command": cell.command,
            "directory": cell.directory.as_posix(), **kw}


def _compute(cell: Cell, out: Path, lease, got: Claim, models: _Models, dist, *, head: str,
             overwrite: bool, progress: bool, reports: bool, waited: bool = False) -> dict:
    """Run a claimed cell (its lease held by rank 0) and record it; a finished one is
    ``skipped``, or what its process recorded when this process waited for it."""
    from attngeom.engine.runner import execute, work_of
    from attngeom.results.state import run_states

    talk = progress and dist.is_main
    directory = out / cell.directory
    if got is Claim.FINISHED:
        if waited:
            _say(talk, f"{head}: finished by another process")
            other = claims.read_record(out, cell) if dist.is_main else None
            return _rec(cell, status=(other or {}).get("status", "skipped"),
                        wall_s=(other or {}).get("wall_s", 0.0))
        _say(talk, f"{head}: finished before, skipped")
        return _rec(cell, status="skipped", wall_s=0.0)
    try:
        loaded = models.get(cell, talk, head)
        resumed = bool(run_states(directory))  # shards of an unfinished run are there
        _say(talk, f"{head}: {'resuming' if resumed else 'running'}")
        t = time.perf_counter()
        execute(work_of(cell.command), cell.config, directory, overwrite=overwrite,
                progress=progress, model_and_tokenizer=loaded)
        rec = _rec(cell, status="resumed" if resumed else "run",
                   wall_s=time.perf_counter() - t)
        if dist.is_main:
            claims.write_record(out, cell, rec)
            if reports:
                from attngeom.report import build_report

                build_report(directory)
        return rec
    finally:
        lease.release()


def _load(cfg, dist):
    from attngeom.capture import load_model

    return load_model(cfg.model, device=dist.device(cfg.device), dtype=cfg.dtype,
                      device_map=cfg.device_map, quantization=cfg.quantization)


# --------------------------------------------------------------------------- steps


def _finish(result: StudyResult, out: Path, mine: list[dict], *, note: str, reports: bool,
            progress: bool, t0: float) -> None:
    """The cross-run steps, the study report and ``study.json``, by one process at a
    time (the steps' lease) and only once every cell is finished. A share finding them
    already written for the current runs (another share finished last at the same
    time) leaves them; a plain run always writes them."""
    study = result.study
    lease = claims.steps_lease(out, note)
    while not lease.take():
        _say(progress, "waiting for another process writing the study's tables ...")
        time.sleep(POLL_S)
    try:
        done = _all_cells(study, out, mine)
        result.unfinished = sum(rec is None for rec in done)
        if result.unfinished:
            return
        if result.shard is not None and claims.steps_current(out, study):
            result.steps = "elsewhere"
            return
        result.cells = done
        result.tables = _study_tables(study, out, done)
        run_reports = {}
        if reports:
            from attngeom.report import build_report

            for rec in done:
                index = out / rec["directory"] / "report" / "index.html"
                if not index.is_file():
                    build_report(out / rec["directory"])
                run_reports[rec["directory"]] = str(index.relative_to(out))
        _write_study_json(out, study, done, result.tables, time.perf_counter() - t0,
                          run_reports)
        if reports:
            from attngeom.report.study import build_study_report

            result.report = build_study_report(out)
        result.steps = "written"
        claims.steps_written(out, study)
    finally:
        lease.release()


def _all_cells(study: Study, out: Path, mine: list[dict]) -> list[dict | None]:
    """Every cell's record in study order: this process's own, else what the process
    that ran it recorded, else ``skipped`` (finished before); ``None``: not finished."""
    own = {rec["directory"]: rec for rec in mine if rec["status"] != "elsewhere"}
    done = []
    for cell in study.cells:
        rec = own.get(cell.directory.as_posix())
        if rec is None and claims.finished(out, cell):
            other = claims.read_record(out, cell) or {"status": "skipped", "wall_s": 0.0}
            rec = _rec(cell, status=other["status"], wall_s=other["wall_s"])
        done.append(rec)
    return done


# --------------------------------------------------------------------------- tables


def _study_tables(study: Study, out: Path, done: list[dict]) -> dict:
    from attngeom.config import COMMANDS
    from attngeom.engine.compare import compare_runs
    from attngeom.results.io import available_tables, read_table, write_table
    from attngeom.studies import combine, references

    per_table: dict[str, list] = {}
    for rec in done:
        directory = out / rec["directory"]
        # a part whose tables another part also writes is named apart (config.CommandSpec)
        named = dict(COMMANDS[rec["command"]].study_tables)
        for name in available_tables(directory):
            per_table.setdefault(named.get(name, name), []).append(read_table(directory,
                                                                              name))
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
    if "policy_atlas" in study.analyses:
        pairs = set(itertools.product(*study.filters["policy_atlas"]))

        def kept(df):  # the rows of the step's models and corpora
            if df is None or not len(df):
                return df
            return df[[(m, c) in pairs for m, c in zip(df["model"], df["corpus"],
                                                       strict=True)]]

        alone = {"policies": kept(tables.get("policy_alone")),
                 "restriction": kept(tables.get("restrict_alone"))}
        scores = kept(tables.get("head_scores"))
        tables["policy_head_types"] = combine.policy_head_types(alone, scores)
        tables["policy_first_heads"] = combine.policy_first_heads(
            alone, kept(tables.get("restrict_local")), scores)
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

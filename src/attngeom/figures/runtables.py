"""Load what a run directory holds, checked, for the figures and the report.

Reading goes through ``attngeom.results.io`` (``read_manifest``, ``read_table``,
``available_tables``). Until that module exists a minimal reader with the same
contract stands in (``_fallback_*``); it can go once ``results.io`` is merged.

What counts as what:

- no ``manifest.json``: not a run, ``RunDirError``;
- a table the manifest lists whose file is missing, unreadable or lacks a column
  a figure needs: ``RunDirError`` naming the file;
- a table the manifest does not list: simply absent (a partial run), and the
  figures and report sections that need it are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngeom.errors import RunDirError

# Columns each figure or report section reads, by table (docs/internals.md).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "summary": ("model", "corpus", "scope", "layer", "head", "rule", "variant", "distance",
                "n", "metric", "mean", "ci_low", "ci_high", "trivial"),
    "metrics": ("model", "corpus", "window", "layer", "head", "rule", "variant", "distance",
                "n", "precision", "recall", "f_score", "trivial"),
    "sink": ("model", "corpus", "layer", "head", "n", "norm_ratio", "sink_cos_mean",
             "sink_mass", "f_full_sink_selected", "f_full_sink_unselected",
             "f_nosink_sink_selected", "f_nosink_sink_unselected"),
    "taxonomy": ("model", "corpus", "layer", "head", "f_self", "f_sink", "f_other", "regime"),
    "bounds": ("model", "corpus", "layer", "head", "n", "precision_envelope",
               "recall_envelope", "f_envelope", "precision_measured", "recall_measured",
               "f_measured", "certified", "largest_certified_n"),
    "pruning": ("model", "corpus", "ranker", "seed", "order", "keep_fraction", "perplexity"),
    "head_scan": ("model", "corpus", "layer", "head", "delta_nll_rel", "critical"),
    "restrict": ("model", "corpus", "scope", "layer", "head", "n", "renormalize",
                 "delta_nll_rel"),
    "restrict_nstar": ("model", "corpus", "scope", "layer", "head", "renormalize", "tau",
                       "n_star"),
}


@dataclass
class RunTables:
    """A run's manifest and every table it holds, by table name."""

    run_dir: Path
    manifest: dict[str, Any]
    tables: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def has(self, *names: str) -> bool:
        """True when every named table is present and non-empty."""
        return all(n in self.tables and len(self.tables[n]) > 0 for n in names)

    def get(self, name: str):
        """The table, or None when the run does not hold it (or it is empty)."""
        df = self.tables.get(name)
        return df if df is not None and len(df) > 0 else None


def load_run(run_dir) -> RunTables:
    """Read and check every table of ``run_dir``.

    Raises ``RunDirError`` (naming the path) for a directory that is not a run,
    and for a listed table that is missing, corrupt or short of columns.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"expected a run directory, got {str(run_dir)!r} (no such directory)")
    read_manifest, read_table, available_tables = _reader()
    manifest = read_manifest(run_dir)
    listed = dict(manifest.get("tables") or {})
    names = list(dict.fromkeys([*listed, *available_tables(run_dir)]))
    run = RunTables(run_dir=run_dir, manifest=manifest)
    for name in names:
        file_name = listed.get(name, f"{name}.parquet")
        path = run_dir / file_name
        if not path.exists():
            raise RunDirError(
                f"incomplete run: manifest.json lists table {name!r} but {path} does not exist"
            )
        df = read_table(run_dir, name)
        missing = [c for c in REQUIRED_COLUMNS.get(name, ()) if c not in df.columns]
        if missing:
            raise RunDirError(
                f"table {name!r} in {path} lacks column(s) {', '.join(missing)}; "
                f"expected the schema of docs/internals.md"
            )
        run.tables[name] = df
        run.files[name] = file_name
    return run


def _reader():
    try:
        from attngeom.results import io as results_io
    except ImportError:  # results.io not merged yet: remove this branch once it is
        return _fallback_read_manifest, _fallback_read_table, _fallback_available_tables
    return results_io.read_manifest, results_io.read_table, results_io.available_tables


def _fallback_read_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / "manifest.json"
    if not path.is_file():
        raise RunDirError(f"not an attngeom run: {run_dir} has no manifest.json")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirError(f"cannot read {path}: {exc}") from exc
    if not isinstance(manifest, dict):
        raise RunDirError(f"expected a JSON object in {path}, got {type(manifest).__name__}")
    return manifest


def _fallback_available_tables(run_dir: Path) -> list[str]:
    manifest = _fallback_read_manifest(run_dir)
    listed = manifest.get("tables") or {}
    return [name for name, file_name in listed.items() if (Path(run_dir) / file_name).exists()]


def _fallback_read_table(run_dir: Path, name: str):
    import pandas as pd

    listed = _fallback_read_manifest(run_dir).get("tables") or {}
    path = Path(run_dir) / listed.get(name, f"{name}.parquet")
    try:
        return pd.read_parquet(path)
    except FileNotFoundError as exc:
        raise RunDirError(f"table {name!r} not found: {path} does not exist") from exc
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RunDirError(f"corrupt table {name!r}: cannot read {path} ({exc})") from exc

"""Load what a run directory holds, checked, for the figures and the report.

Reading goes through ``attngeom.results.io`` (``read_manifest``, ``read_table``,
``available_tables``), which checks every table against its schema. What counts
as what:

- no ``manifest.json``: not a run, ``RunDirError``;
- a table the manifest lists whose file is missing, or a table file that is
  corrupt or lacks a schema column: ``RunDirError`` naming the file;
- a table neither listed nor on disk: simply absent (a partial run), and the
  figures and report sections that need it are left out;
- a table name this version does not know (a newer writer): kept in
  ``RunTables.unknown`` and reported, not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngeom.errors import RunDirError


@dataclass
class RunTables:
    """A run's manifest and every table it holds, by table name."""

    run_dir: Path
    manifest: dict[str, Any]
    tables: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)

    def get(self, name: str):
        """The table, or None when the run does not hold it (or it is empty)."""
        df = self.tables.get(name)
        return df if df is not None and len(df) > 0 else None

    def groups(self) -> list[tuple[str, str]]:
        """The (model, corpus) pairs the run's tables hold, sorted."""
        pairs: set[tuple[str, str]] = set()
        for df in self.tables.values():
            if len(df) and {"model", "corpus"} <= set(df.columns):
                pairs |= set(map(tuple, df[["model", "corpus"]].drop_duplicates().astype(str)
                                 .itertuples(index=False)))
        return sorted(pairs)


def load_run(run_dir) -> RunTables:
    """Read and check every table of ``run_dir``.

    Raises ``RunDirError`` (naming the path) for a directory that is not a run,
    and for a listed table that is missing or corrupt.
    """
    from attngeom.results import io
    from attngeom.results.schemas import SCHEMAS, table_file

    run_dir = Path(run_dir)
    manifest = io.read_manifest(run_dir)
    listed = manifest.get("tables") or {}
    if not isinstance(listed, dict):
        raise RunDirError(f"corrupt manifest {run_dir / io.MANIFEST_NAME}: expected "
                          f"'tables' to map table names to files, got {type(listed).__name__}")
    run = RunTables(run_dir=run_dir, manifest=manifest)
    run.unknown = [name for name in listed if name not in SCHEMAS]
    present = set(io.available_tables(run_dir))
    for name in SCHEMAS.names():
        if name not in listed and name not in present:
            continue
        path = run_dir / table_file(name)
        if name not in present:
            raise RunDirError(
                f"incomplete run: manifest.json lists table {name} but {path} does not exist"
            )
        run.tables[name] = io.read_table(run_dir, name)
        run.files[name] = table_file(name)
    return run

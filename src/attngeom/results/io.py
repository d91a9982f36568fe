"""Reading and writing a results directory: Parquet tables and ``manifest.json``.

A run directory holds one ``NAME.parquet`` per table of ``schemas.SCHEMAS`` and one
``manifest.json`` (docs/internals.md). Every write is atomic: the bytes go to a
hidden temporary file in the same directory, which is then renamed over the target
(``os.replace``), so a run killed at any point leaves either the old file or the new
one, never half of one (a killed run resumes from its shards). Table files are
deterministic: the same rows give the same bytes, whatever order they came in,
because rows are sorted by the table's key columns (``schemas.ROW_KEYS``), columns
follow the schema and no timestamp or pandas metadata is stored. The only
non-deterministic value of a run, the manifest's ``created`` time, stays out of the
tables.

>>> import tempfile, pandas as pd
>>> d = prepare_run_dir(tempfile.mkdtemp(), command="demo", fingerprint="abc")
>>> df = pd.DataFrame({"model": ["m"], "corpus": ["c"], "layer": [0], "head": [1],
...                    "nll": [2.0], "delta_nll_rel": [0.1], "critical": [True],
...                    "threshold": [0.05]})
>>> _ = write_table(d, "head_scan", df)
>>> available_tables(d), read_table(d, "head_scan")["nll"].tolist()
(['head_scan'], [2.0])
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

from attngeom.errors import ConfigError, RunDirError
from attngeom.results import schemas
from attngeom.results.files import TEMP_RE as _TEMP_RE
from attngeom.results.files import atomic_write as _atomic_write
from attngeom.results.manifest import config_fingerprint, to_json
from attngeom.results.schemas import (
    BOOL,
    FLOAT,
    INT,
    ROW_KEYS,
    SCHEMAS,
    STRING,
    check_table_name,
    table_file,
    validate_table,
)
from attngeom.results.state import LOCK_FILE, STATE_DIR, differences, run_states

MANIFEST_NAME = "manifest.json"
PARQUET_COMPRESSION = "zstd"

# an empty file each process of a run writes and removes at once to prove the directory
# writable (``engine/runner.check_writable``); another process of the same run may
# see one while it checks the directory, so directory checks look past it
WRITE_PROBE_PREFIX = ".attngeom-write-test."
_PROBE_RE = re.compile(r"^\.attngeom-write-test\.[0-9a-f]{32}$")


def _existing_dir(run_dir) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(
            f"results directory {run_dir} does not exist (create it with prepare_run_dir)"
        )
    return run_dir


# --------------------------------------------------------------------------- tables


def _arrow_table(name: str, df):
    """``df`` as a pyarrow Table with the schema's columns, types and row order."""
    import numpy as np
    import pyarrow as pa

    validate_table(name, df)
    schema = SCHEMAS[name]
    df = df.reset_index(drop=True)
    if len(df) > 1:
        try:
            order = df.sort_values(
                list(ROW_KEYS[name]), kind="mergesort", na_position="last"
            ).index
        except TypeError as e:
            raise ConfigError(f"table {name}: cannot sort rows by key columns ({e})") from None
        df = df.loc[order].reset_index(drop=True)

    arrays, names = [], []
    for column, dtype in schema.items():
        arrays.append(_column_array(name, column, dtype, df[column], np, pa))
        names.append(column)
    for column in df.columns:
        if column in schema:
            continue
        if not isinstance(column, str):
            raise ConfigError(f"table {name}: column names must be strings, got {column!r}")
        try:
            arrays.append(pa.Array.from_pandas(df[column]))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ConfigError(f"table {name}: column {column}: {_one_line(e)}") from None
        names.append(column)
    return pa.Table.from_arrays(arrays, names=names)


def _column_array(table: str, column: str, dtype: str, s, np, pa):
    where = f"table {table}: column {column}"
    if dtype == STRING:
        values = [None if _is_missing(v) else v for v in s.astype(object).tolist()]
        bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
        if bad is not None:
            raise ConfigError(f"{where}: expected strings, got {type(bad).__name__} {bad!r}")
        return pa.array(values, type=pa.string())
    if dtype == FLOAT:
        return pa.array(s.to_numpy(dtype=np.float64, na_value=np.nan), type=pa.float64())
    if dtype == INT:
        try:
            f = s.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected int64, got {s.dtype}") from None
        if not np.all(np.isfinite(f)) or not np.all(f == np.round(f)):
            raise ConfigError(f"{where}: expected integers, got non-integer or missing values")
        values = f.astype(np.int64) if s.dtype.kind == "f" else s.to_numpy(dtype=np.int64)
        return pa.array(values, type=pa.int64())
    if dtype == BOOL:
        if s.isna().any():
            raise ConfigError(f"{where}: expected bool, got missing values")
        return pa.array(s.to_numpy(dtype=bool), type=pa.bool_())
    raise AssertionError(dtype)  # pragma: no cover - schemas only use the four dtypes


def _is_missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def write_table(run_dir, name: str, df) -> Path:
    """Write ``df`` as table ``name`` (``run_dir/NAME.parquet``), atomically.

    Columns are checked against ``schemas.SCHEMAS[name]`` (``ConfigError`` when one is
    missing or of the wrong kind) and stored with the schema's dtypes, in schema order
    and then any extra columns; rows are sorted by ``schemas.ROW_KEYS[name]`` (stable),
    so identical rows give byte-identical files. Returns the file's path.
    """
    import pyarrow.parquet as pq

    run_dir = _existing_dir(run_dir)
    table = _arrow_table(name, df)
    return _atomic_write(
        run_dir / table_file(name),
        lambda f: pq.write_table(table, f, compression=PARQUET_COMPRESSION),
    )


def read_table(run_dir, name: str):
    """Read table ``name`` of ``run_dir`` as a pandas DataFrame.

    ``RunDirError`` names the file when it is missing, is not valid Parquet, or lacks
    a column of the schema.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_table_name(name)
    run_dir = _existing_dir(run_dir)
    path = run_dir / table_file(name)
    if not path.is_file():
        raise RunDirError(f"table {name} not found: {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise RunDirError(
            f"cannot read {path}: not a valid Parquet file ({_one_line(e)})"
        ) from None
    df = table.to_pandas()
    validate_table(name, df, source=str(path))
    return df


def available_tables(run_dir) -> list[str]:
    """Names of the tables whose files ``run_dir`` holds, in ``schemas.SCHEMAS`` order."""
    run_dir = _existing_dir(run_dir)
    return [n for n in schemas.SCHEMAS.names() if (run_dir / f"{n}.parquet").is_file()]


# --------------------------------------------------------------------------- manifest


def write_manifest(run_dir, manifest: dict) -> Path:
    """Write ``run_dir/manifest.json`` atomically (UTF-8, sorted keys, 2-space indent)."""
    if not isinstance(manifest, dict):
        raise ConfigError(f"manifest: expected a dict, got {type(manifest).__name__}")
    run_dir = _existing_dir(run_dir)
    data = (to_json(manifest) + "\n").encode("utf-8")
    return _atomic_write(run_dir / MANIFEST_NAME, lambda f: f.write(data))


def write_json(path, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (as ``write_manifest`` does)."""
    data = (to_json(obj) + "\n").encode("utf-8")
    return _atomic_write(Path(path), lambda f: f.write(data))


def read_manifest(run_dir) -> dict:
    """Read ``run_dir/manifest.json``.

    ``RunDirError`` when the directory is missing, holds no manifest ("not an
    attngeom run"), or the manifest is not a JSON object (naming the file).
    """
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST_NAME
    if not run_dir.is_dir():
        raise RunDirError(f"not an attngeom run: {run_dir} does not exist")
    if not path.is_file():
        raise RunDirError(f"not an attngeom run: {run_dir} has no {MANIFEST_NAME}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunDirError(f"corrupt manifest {path}: {_one_line(e)}") from None
    if not isinstance(manifest, dict):
        raise RunDirError(
            f"corrupt manifest {path}: expected a JSON object, got {type(manifest).__name__}"
        )
    return manifest


# --------------------------------------------------------------------------- run dirs


REPORT_DIR = "report"  # written by ``attngeom report`` inside a run directory


def _own_names(manifest: dict | None) -> set[str]:
    """Top-level names in a run directory that attngeom wrote (and may remove)."""
    own = {MANIFEST_NAME, *(f"{n}.parquet" for n in schemas.SCHEMAS.names())}
    if manifest:
        listed = list((manifest.get("tables") or {}).values()) if isinstance(
            manifest.get("tables"), dict
        ) else []
        files = manifest.get("files")
        if isinstance(files, (list, tuple)):
            listed += list(files)
        for name in listed:
            if isinstance(name, str) and name and Path(name).name == name and name != "..":
                own.add(name)
    return own


_REPORT_FILES = re.compile(r"^(index\.html|figures(/[A-Za-z0-9_.-]+\.(png|pdf))?)$")


def _is_report_dir(entry: Path) -> bool:
    """A ``report/`` folder holding only what ``attngeom report`` writes."""
    if not entry.is_dir() or entry.is_symlink():
        return False
    for path in entry.rglob("*"):
        rel = path.relative_to(entry).as_posix()
        if path.is_symlink() or not _REPORT_FILES.match(rel):
            return False
    return True


def _is_own(entry: Path, own: set[str]) -> bool:

    if entry.name == REPORT_DIR:
        return _is_report_dir(entry)
    if entry.name == STATE_DIR:  # unfinished runs' shards (results/state.py)
        return entry.is_dir() and not entry.is_symlink()
    if entry.name in own:
        return entry.is_file() or not entry.exists()
    m = _TEMP_RE.match(entry.name)
    return bool(m) and m.group("target") in own and entry.is_file()


def _describe(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


OVERWRITE_HINT = "pass --overwrite (overwrite=True in Python)"


def _refusal(run_dir: Path, manifest, manifest_problem, foreign: list[str], command: str,
             fingerprint: str, config, overwrite: bool) -> str | None:
    """Why ``run_dir`` cannot take this run (None: it can): files attngeom did not write
    (always), another run or unreadable attngeom files (unless ``overwrite``)."""
    if foreign:
        what = "" if manifest is None else (
            "this run and " if _same_run(manifest, command, fingerprint) else "another run and "
        )
        return (f"{run_dir} holds {what}files attngeom did not write ({_describe(foreign)}); "
                "choose an empty or new directory")
    if overwrite:
        return None
    if manifest is not None:
        return (f"{run_dir} holds a different attngeom run "
                f"({_how_different(manifest, command, fingerprint, config)}); "
                f"{OVERWRITE_HINT} to replace it or choose another directory")
    reason = manifest_problem or f"attngeom files but no {MANIFEST_NAME}"
    return f"{run_dir} holds {reason}; {OVERWRITE_HINT} to replace it or choose another directory"


def prepare_run_dir(
    run_dir, *, command: str, fingerprint: str, overwrite: bool = False,
    check_only: bool = False, config: dict | None = None,
) -> Path:
    """Create or check the directory a run of ``command`` writes its results to.

    - missing or empty: created, returned;
    - holding the same run (its manifest has this ``command`` and ``fingerprint``):
      returned untouched, so a later resume can pick up its finished windows;
    - holding a different run, or attngeom files without a readable manifest:
      ``RunDirError``, unless ``overwrite=True``, which removes attngeom's own files
      (``manifest.json``, the table files, the files the manifest lists, leftover
      temporary files) and nothing else;
    - holding anything else (not written by attngeom): ``RunDirError`` naming those
      entries, even with ``overwrite=True``; user files are never deleted.

    ``fingerprint`` is normally ``manifest.config_fingerprint(config)``; a manifest
    without a ``fingerprint`` field is compared by the fingerprint of its ``config``.

    ``config`` (the new run's fingerprint options) lets the refusal of a finished run
    of other options name the first option that differs.

    ``check_only=True`` raises exactly the same errors but creates and removes
    nothing: commands call it before any work, and again without it just before
    writing, so a run that fails half way leaves the previous results in place.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"expected a results directory, got {run_dir} (a file)")
    if not run_dir.exists():
        if check_only:
            return run_dir
        run_dir.mkdir(parents=True, exist_ok=True)  # another process may race us here
    entries = sorted((p for p in run_dir.iterdir() if not _PROBE_RE.match(p.name)
                      and not _only_a_lock(p)), key=lambda p: p.name)
    if not entries:
        return run_dir

    manifest, manifest_problem = None, None
    if (run_dir / MANIFEST_NAME).is_file():
        try:
            manifest = read_manifest(run_dir)
        except RunDirError as e:
            manifest_problem = str(e)
    theirs = manifest is not None and not _written_by_attngeom(manifest)
    if theirs:  # someone else's manifest.json: none of this directory is ours to remove
        manifest = None
    own = _own_names(manifest)
    if theirs:
        own.discard(MANIFEST_NAME)
    foreign = [p.name for p in entries if not _is_own(p, own)]

    if manifest is not None and _same_run(manifest, command, fingerprint) and not overwrite:
        return run_dir
    if manifest is None and not foreign and not overwrite and _resuming(run_dir, command,
                                                                         fingerprint):
        return run_dir  # this very run, unfinished: it resumes from its shards
    refusal = _refusal(run_dir, manifest, manifest_problem, foreign, command, fingerprint,
                       config, overwrite)
    if refusal:
        raise RunDirError(refusal)
    if check_only:
        return run_dir
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return run_dir


def _resuming(run_dir: Path, command: str, fingerprint: str) -> bool:

    return any(s.get("command") == command and s.get("fingerprint") == fingerprint
               for s in run_states(run_dir))


def _only_a_lock(entry: Path) -> bool:
    """The state folder of a run that has taken its lock and written nothing else yet."""
    return entry.name == STATE_DIR and entry.is_dir() and {
        p.name for p in entry.iterdir()} <= {LOCK_FILE}


def _how_different(manifest: dict, command: str, fingerprint: str,
                    config: dict | None) -> str:
    """``command 'prune', this run 'analyze'``, or the first option that differs (``option
    n_grid (was [1, 2], now [1, 2, 4]) and 2 more``), else both fingerprints."""
    if manifest.get("command") != command:
        return f"command {manifest.get('command')!r}; this run: {command!r}"
    old = manifest.get("config")
    if config is not None and isinstance(old, dict):
        diff = differences({k: old.get(k) for k in config}, config)
        if diff:
            more = f" and {len(diff) - 1} more" if len(diff) > 1 else ""
            return f"option {diff[0]}{more}"
    return (f"fingerprint {_short(_fingerprint_of(manifest))}; this run: "
            f"{_short(fingerprint)}")


def _written_by_attngeom(manifest: dict) -> bool:
    return isinstance(manifest, dict) and "attngeom_version" in manifest and "command" in manifest


def _fingerprint_of(manifest: dict) -> str | None:
    fp = manifest.get("fingerprint")
    if fp is None and isinstance(manifest.get("config"), dict):
        try:
            fp = config_fingerprint(manifest["config"])
        except ConfigError:
            fp = None
    return fp


def _same_run(manifest: dict, command: str, fingerprint: str) -> bool:
    return manifest.get("command") == command and _fingerprint_of(manifest) == fingerprint


def holds_run(run_dir: str | Path, command: str, fingerprint: str) -> bool:
    """Whether ``run_dir`` holds the finished run of ``command`` with this configuration
    fingerprint (a readable manifest that matches); False for anything else."""
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST_NAME).is_file():
        return False
    try:
        return _same_run(read_manifest(run_dir), command, fingerprint)
    except RunDirError:
        return False


def _short(fp) -> str:
    return "none" if not fp else str(fp)[:12]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."

"""What a run's ``manifest.json`` records, and the hashes that identify its inputs.

The manifest (docs/internals.md) says what was run (command, configuration and its
fingerprint, seed), on what (model and corpus identity, with sha256 hashes of the
files), with what (attngeom and library versions), how long it took, which tables it
wrote and how many of everything it counted. ``created`` is the one value that
differs between two runs of the same command; the table files hold no timestamp.

>>> m = build_manifest("analyze", {"window_length": 256}, {"name": "m"}, {"name": "c"},
...                    seed=0, timings={}, tables=["metrics"], counts={})
>>> m["tables"], m["fingerprint"] == config_fingerprint({"window_length": 256})
({'metrics': 'metrics.parquet'}, True)
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import platform
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from attngeom.errors import ConfigError
from attngeom.names import RANDOM_CONTROL

VERSIONED_PACKAGES = ("torch", "transformers", "numpy", "pandas", "pyarrow")

# Files that make up a local model: weights, configuration, tokenizer.
MODEL_FILE_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.gguf",
    "*.json",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.vocab",
)

_CHUNK = 1 << 20


# --------------------------------------------------------------------------- JSON


def _jsonable(value):
    """``json`` fallback: paths as strings, numpy scalars as Python numbers, sets sorted."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-serialisable")


def to_json(obj, *, indent: int | None = 2) -> str:
    """Canonical JSON: sorted keys, UTF-8 text, no NaN or infinity.

    ``indent=None`` gives the compact form (no spaces) that fingerprints hash.
    Values JSON cannot hold raise ``ConfigError`` naming them.
    """
    try:
        return json.dumps(
            obj,
            sort_keys=True,
            indent=indent,
            separators=(",", ": ") if indent is not None else (",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_jsonable,
        )
    except (TypeError, ValueError) as e:
        detail = " ".join(str(e).split())
        raise ConfigError(f"expected JSON-serialisable values, got {detail}") from None


def config_fingerprint(config: Mapping) -> str:
    """sha256 (hex) of the canonical JSON of ``config``: equal configurations, equal hash.

    Key order does not matter; tuples and lists hash alike; paths hash as strings.

    >>> config_fingerprint({"a": 1, "b": [1, 2]}) == config_fingerprint({"b": (1, 2), "a": 1})
    True
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config: expected a mapping, got {type(config).__name__}")
    return hashlib.sha256(to_json(dict(config), indent=None).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- manifest


def package_versions() -> dict[str, str | None]:
    """Installed versions of the libraries whose behaviour the numbers depend on.

    Read from package metadata, so nothing is imported; ``None`` when not installed.
    """
    out: dict[str, str | None] = {}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def attngeom_version() -> str:
    try:
        return metadata.version("attngeom")
    except metadata.PackageNotFoundError:  # running from a source tree, not installed
        return "unknown"


def _as_dict(value, what: str) -> dict:
    if value is None:
        return {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise ConfigError(f"{what}: expected a dict or dataclass, got {type(value).__name__}")


def build_manifest(
    command: str,
    config: dict,
    model_info: dict,
    corpus_info: dict,
    seed,
    timings,
    tables,
    counts,
    *,
    fingerprint: str | None = None,
) -> dict:
    """The manifest of one run, ready for ``io.write_manifest``.

    Adds ``fingerprint`` (what ``prepare_run_dir`` compares; pass the one given to
    ``prepare_run_dir`` when that hashes less than the whole ``config``, e.g. not the
    labels or the device; default ``config_fingerprint(config)``),
    ``attngeom_version``, ``versions`` (torch, transformers, numpy, pandas, pyarrow,
    python) and ``created`` (UTC, ISO 8601, the only non-deterministic
    field). ``model_info`` and ``corpus_info`` may be dicts or dataclasses (e.g.
    ``CorpusInfo``); ``tables`` is ``{table_name: file_name}`` or a list of names
    (each stored as ``NAME.parquet``). Everything must be JSON-serialisable.
    """
    if not isinstance(command, str) or not command:
        raise ConfigError(f"command: expected a non-empty string, got {command!r}")
    config = _as_dict(config, "config")
    if isinstance(tables, Mapping):
        table_files = {str(k): str(v) for k, v in tables.items()}
    elif isinstance(tables, Iterable) and not isinstance(tables, str):
        table_files = {str(n): f"{n}.parquet" for n in tables}
    else:
        raise ConfigError(f"tables: expected a dict or list of names, got {tables!r}")
    manifest = {
        "attngeom_version": attngeom_version(),
        "random_control": RANDOM_CONTROL,
        "command": command,
        "config": config,
        "fingerprint": config_fingerprint(config) if fingerprint is None else str(fingerprint),
        "model": _as_dict(model_info, "model_info"),
        "corpus": _as_dict(corpus_info, "corpus_info"),
        "versions": package_versions(),
        "seed": seed,
        "timings": _as_dict(timings, "timings"),
        "tables": table_files,
        "counts": _as_dict(counts, "counts"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    to_json(manifest)  # fail here, naming the value, rather than when writing
    return manifest


# --------------------------------------------------------------------------- hashes


def file_sha256(path) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"expected a file to hash, got {str(path)!r} (no such file)")
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def directory_sha256(directory, *, patterns: Iterable[str] | None = MODEL_FILE_PATTERNS) -> str:
    """One sha256 (hex) for the model files of a local model directory.

    Hashes the sorted list of ``relative/path<TAB>sha256`` lines of every file under
    ``directory`` whose name matches one of ``patterns`` (weights, configuration and
    tokenizer files by default; ``None`` takes every file), skipping hidden files and
    folders (``.git``, ``.cache``). So renaming, adding or changing a weight, config or
    tokenizer file changes the hash; a README or a lock file does not.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"expected a model directory to hash, got {str(directory)!r}")
    pats = None if patterns is None else tuple(patterns)
    lines = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith("."):
                continue
            if pats is not None and not any(fnmatch.fnmatch(name, p) for p in pats):
                continue
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            lines.append(f"{rel}\t{file_sha256(path)}\n")
    if not lines:
        raise ConfigError(
            f"expected model files ({', '.join(pats or ('any',))}) in {directory}, found none"
        )
    h = hashlib.sha256()
    for line in sorted(lines):
        h.update(line.encode("utf-8"))
    return h.hexdigest()

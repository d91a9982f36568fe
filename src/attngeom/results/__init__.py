"""attngeom.results: long Parquet tables, ``manifest.json`` and their column schemas.

A results directory holds one ``NAME.parquet`` per table of ``SCHEMAS`` and a
``manifest.json`` (docs/internals.md). This package imports only pandas, pyarrow and
the standard library, and only when a name below is first used, so importing
``attngeom.results`` stays cheap.

- ``io``: ``write_table``, ``read_table``, ``available_tables``, ``write_manifest``,
  ``read_manifest``, ``prepare_run_dir``
- ``schemas``: ``SCHEMAS`` (the tables' registry), ``ROW_KEYS``, ``validate_table``
- ``manifest``: ``build_manifest``, ``config_fingerprint``, ``file_sha256``,
  ``directory_sha256``
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "write_table": "io",
    "read_table": "io",
    "available_tables": "io",
    "write_manifest": "io",
    "read_manifest": "io",
    "prepare_run_dir": "io",
    "MANIFEST_NAME": "io",
    "SCHEMAS": "schemas",
    "ROW_KEYS": "schemas",
    "validate_table": "schemas",
    "build_manifest": "manifest",
    "config_fingerprint": "manifest",
    "file_sha256": "manifest",
    "directory_sha256": "manifest",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'attngeom.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"attngeom.results.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

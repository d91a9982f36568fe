"""How a model or corpus is named in tables and titles when no label is given."""

from __future__ import annotations

from pathlib import Path


def label_of(path_or_id: str) -> str:
    """The last part of a path or hub id (``/data/models/llama`` -> ``llama``)."""
    p = Path(str(path_or_id))
    return p.name if p.name else str(path_or_id)

"""Atomic file writes, the one thing every writer of a results directory shares.

A leaf of ``attngeom.results`` (standard library only): ``io`` (tables, manifest) and
``state`` (the shards of a run in progress) both write through ``atomic_write`` and
neither imports the other for it, so the package has no import cycle.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Hidden temporary files of ``atomic_write``: ".<target name>.<32 hex>.tmp".
TEMP_RE = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{32}\.tmp$")



def atomic_write(path: Path, write: Callable[[Any], None]) -> Path:
    """Write ``path`` through ``write(file)`` into a temporary sibling, then rename it.

    The temporary file is created with mode 0o666 less the umask (like ``open``), is
    fsynced before the rename, and is removed if anything fails.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def fsync_dir(directory: Path) -> None:
    """Make the rename durable where the platform allows it (POSIX); skip elsewhere."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

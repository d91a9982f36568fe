"""The state of a run in progress: ``RUN/.attngeom/`` (its identity and its finished shards).

A run writes the result of every unit of work (one batch of windows of one stage) to
its own shard file as soon as the unit is done, atomically, so a run killed at any
point resumes with the same command: finished shards are read back, only the others
are computed, and the tables end up identical to an uninterrupted run's. The shards
of several processes (a data-parallel run) meet in the same folder. The folder goes
once the run's tables and manifest are written.

Each run has its own folder ``.attngeom/FINGERPRINT/`` (so a new run given
``--overwrite`` leaves the previous results in place until its own are written):

- ``run.json``: the command, its fingerprint and every option that decides the
  shards (``resume_key``); a resume with another value of one is refused, naming it.
- ``STAGE/UNIT.shard``: a magic line, a JSON header (the run's fingerprint, the stage,
  the unit, its windows, the payload's length and sha256) and the pickled payload. A
  shard whose length or hash does not match (a torn write, a bad disk) is reported as
  missing and computed again.

Shards are read only from a run directory the same command wrote; like any pickle
they must not come from an untrusted source.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

from attngeom.errors import RunDirError
from attngeom.results.files import atomic_write
from attngeom.results.manifest import to_json

STATE_DIR = ".attngeom"
RUN_FILE = "run.json"
MAGIC = b"attngeom-shard 1\n"


def state_dir(run_dir, fingerprint: str) -> Path:
    return Path(run_dir) / STATE_DIR / str(fingerprint)[:16]


def run_states(run_dir) -> list[dict]:
    """``run.json`` of every unfinished run in ``run_dir`` (unreadable ones skipped)."""
    root = Path(run_dir) / STATE_DIR
    out = []
    for path in sorted(root.glob(f"*/{RUN_FILE}")) if root.is_dir() else []:
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(state, dict):
            out.append(state)
    return out


def write_run_state(run_dir, *, command: str, fingerprint: str, resume_key: dict) -> None:
    folder = state_dir(run_dir, fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    data = to_json({"command": command, "fingerprint": fingerprint,
                    "resume_key": resume_key}).encode("utf-8")
    atomic_write(folder / RUN_FILE, lambda f: f.write(data))


def differences(old: dict, new: dict) -> list[str]:
    """The options whose values differ, as ``name (was X, now Y)``, in a stable order."""
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            out.append(f"{key} (was {old.get(key)!r}, now {new.get(key)!r})")
    return out


def check_resumable(run_dir, *, command: str, resume_key: dict) -> None:
    """Refuse to start beside an unfinished run of other options (one line naming the
    first option that differs); an unfinished run of these options is resumed."""
    for state in run_states(run_dir):
        if state.get("command") != command:
            raise RunDirError(
                f"{run_dir} holds an unfinished {state.get('command')!r} run; this is "
                f"{command!r}: choose another directory or pass --overwrite (overwrite=True in "
                "Python)"
            )
        diff = differences(state.get("resume_key") or {}, resume_key)
        if diff:
            more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
            raise RunDirError(
                f"cannot resume the unfinished run in {run_dir}: option {diff[0]}{more} "
                "differs; rerun it with its own options, choose another directory, or "
                "pass --overwrite (overwrite=True in Python)"
            )


def clear_states(run_dir) -> None:
    """Remove every run's state (after the tables and manifest are written)."""
    shutil.rmtree(Path(run_dir) / STATE_DIR, ignore_errors=True)


class ShardStore:
    """Finished units of one run: ``RUN/.attngeom/FINGERPRINT/STAGE/UNIT.shard``."""

    def __init__(self, run_dir, fingerprint: str, *, command: str = "",
                 resume_key: dict | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.root = state_dir(run_dir, fingerprint)
        self.fingerprint = fingerprint
        self.command = command
        self.resume_key = resume_key or {}
        self._announced = False

    def path(self, stage: str, unit: int) -> Path:
        return self.root / stage / f"{unit:06d}.shard"

    def save(self, stage: str, unit: int, windows: list[int], payload: Any) -> Path:
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        header = json.dumps({
            "fingerprint": self.fingerprint, "stage": stage, "unit": unit,
            "windows": list(windows), "length": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }, sort_keys=True).encode("utf-8")
        if not self._announced:  # the run's identity goes first, with the first shard
            write_run_state(self.run_dir, command=self.command, fingerprint=self.fingerprint,
                            resume_key=self.resume_key)
            self._announced = True
        path = self.path(stage, unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        return atomic_write(path, lambda f: f.write(MAGIC + header + b"\n" + data))

    def load(self, stage: str, unit: int, windows: list[int], *,
             payload: bool = True, repair: bool = True) -> tuple[bool, Any]:
        """``(True, payload)`` for a sound shard of this unit, ``(False, None)`` otherwise
        (with ``payload=False`` the shard is checked but not unpickled: ``(True, None)``).

        A damaged shard is removed (with ``repair=False`` it is left alone, for the
        process that owns the unit; ``RunContext.run_units`` counts them); a sound one
        from another configuration or for other windows is an error: the directory
        mixes runs.
        """
        path = self.path(stage, unit)
        if not path.is_file():
            return False, None
        try:
            raw = path.read_bytes()
            if not raw.startswith(MAGIC):
                raise ValueError("no magic line")
            end = raw.index(b"\n", len(MAGIC))
            header = json.loads(raw[len(MAGIC):end])
            data = raw[end + 1:]
            if len(data) != header["length"] or (
                    hashlib.sha256(data).hexdigest() != header["sha256"]):
                raise ValueError("length or hash mismatch")
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            if repair:
                path.unlink(missing_ok=True)
            return False, None
        if header.get("fingerprint") != self.fingerprint or header.get("windows") != list(
                windows) or header.get("stage") != stage:
            raise RunDirError(
                f"{path} is a shard of another configuration (fingerprint "
                f"{str(header.get('fingerprint'))[:12]}, windows {header.get('windows')}); "
                "it cannot be merged into this run"
            )
        return True, (pickle.loads(data) if payload else None)


LOCK_FILE = "lock"


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """``RUN/.attngeom/lock``: one run at a time writes into a directory.

    Taken by the first process of a run before any work and given back when the run
    ends; a second run into the same directory is refused with one line while the
    first one lives. A lock left by a killed run (its process is gone, on this
    machine) is taken over, so a killed run resumes with the same command.
    """

    def __init__(self, run_dir) -> None:
        self.path = Path(run_dir) / STATE_DIR / LOCK_FILE
        self._held = False

    def check(self) -> None:
        """Raise the one-line refusal if a live run holds the lock (take nothing)."""
        import os
        import socket

        holder = self._holder() if self.path.is_file() else None
        if holder and (holder.get("host") != socket.gethostname() or (
                holder["pid"] != os.getpid() and _alive(holder["pid"]))):
            raise self._busy(holder)

    def _busy(self, holder: dict) -> RunDirError:
        return RunDirError(
            f"{self.path.parents[1]} is in use by another attngeom run (process "
            f"{holder.get('pid')} on {holder.get('host')}); wait for it to finish or "
            "choose another directory")

    def acquire(self) -> RunLock:
        import os
        import socket

        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                holder = self._holder()
                if holder and (holder.get("host") != me["host"] or _alive(holder["pid"])):
                    raise self._busy(holder) from None
                self.path.unlink(missing_ok=True)  # a killed run's lock
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._held = True
            return self
        raise RunDirError(f"cannot take the lock {self.path}; another run is starting there")

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            return holder if isinstance(holder.get("pid"), int) else None
        except (OSError, ValueError, AttributeError):
            return None  # half written, or gone: treated as stale

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False
            with contextlib.suppress(OSError):  # the state folder, when nothing else is in it
                self.path.parent.rmdir()

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

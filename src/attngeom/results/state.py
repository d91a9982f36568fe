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


def _read_holder(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        return holder if isinstance(holder.get("pid"), int) else None
    except (OSError, ValueError, AttributeError):
        return None  # half written, or gone: treated as stale


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
        return _read_holder(self.path)

    def drop_if_held_by(self, holder: dict) -> bool:
        """Remove the lock when it names ``holder``'s process (pid and host): one whose
        study lease (``Lease``) was found stale, so it is gone even on another machine,
        where this lock alone cannot tell."""
        mine = self._holder()
        if mine and (mine.get("pid"), mine.get("host")) == (holder.get("pid"),
                                                            holder.get("host")):
            self.path.unlink(missing_ok=True)
            return True
        return False

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


HEARTBEAT_S = 30.0  # how often a held lease's file is touched
STALE_S = 300.0  # another machine's lease untouched this long is a dead process's


class Lease:
    """A lock file any process of a study may take: ``path`` holds who took it.

    Several processes on several machines (a SLURM array, an Indexed Job's pods) share
    a study directory; each cell and the study's final steps are one lease, so no two
    processes compute the same cell or write the tables at once. ``take`` never
    waits: it says whether this process now holds the lease.

    A lease is free when its file is absent, names a process of this machine that has
    exited, or names another machine's process and was not touched for ``STALE_S``
    seconds: the holder touches it every ``HEARTBEAT_S`` from a thread, and a killed
    job on another node stops doing so (the comparison is with this machine's clock,
    against the file system's times: clocks off by minutes would need a larger
    ``STALE_S``; a process stopped, not killed, for that long loses its leases).
    A stale lease is moved aside before it is replaced and replaced only if what was
    moved is what was judged stale, so two processes taking over one lease at once do
    not both win.
    """

    def __init__(self, path, note: str = "") -> None:
        self.path = Path(path)
        self.note = note
        self._token: str | None = None
        self._stop = None
        self.replaced: dict | None = None  # the stale holder this process took over from

    @property
    def held(self) -> bool:
        return self._token is not None

    def holder(self) -> dict | None:
        """Who holds the lease (``pid``, ``host``, ``note``), or ``None``."""
        return _read_holder(self.path)

    def take(self) -> bool:
        import os
        import socket
        import time
        import uuid

        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": token,
                         "note": self.note, "since": time.time()}).encode("utf-8")
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileNotFoundError:  # its folder was tidied away meanwhile
                self.path.parent.mkdir(parents=True, exist_ok=True)
                continue
            except FileExistsError:
                stale, seen = self._stale()
                if not stale or not self._move_aside(seen):
                    return False
                continue  # the stale lease is gone: try again
            with os.fdopen(fd, "wb") as f:
                f.write(me)
            self._token = token
            self._beat()
            return True
        return False

    def release(self) -> None:
        """Give the lease back (its file goes only if it still names this holder)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if self.held and (self.holder() or {}).get("token") == self._token:
            self.path.unlink(missing_ok=True)
        self._token = None

    def _stale(self) -> tuple[bool, bytes | None]:
        """Whether the lease's holder is gone, with the file's bytes (``None``: the file
        went meanwhile)."""
        import socket
        import time

        try:
            raw, age = self.path.read_bytes(), time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return True, None  # released meanwhile
        except OSError:
            return False, None
        try:
            holder = json.loads(raw)
        except ValueError:
            holder = None
        if not isinstance(holder, dict) or not isinstance(holder.get("pid"), int):
            # being written (a holder writes right after creating it), or damaged
            return age > HEARTBEAT_S, raw
        if holder.get("host") == socket.gethostname():
            return not _alive(holder["pid"]), raw
        return age > STALE_S, raw

    def _move_aside(self, seen: bytes | None) -> bool:
        """Remove the lease file if it still holds ``seen``; put back anything else."""
        import os
        import uuid

        if seen is None:
            return True
        aside = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True
        try:
            if aside.read_bytes() == seen:
                with contextlib.suppress(ValueError):
                    self.replaced = json.loads(seen)
                return True
            with contextlib.suppress(FileExistsError):  # a new holder's: put it back
                os.link(aside, self.path)
            return False
        finally:
            aside.unlink(missing_ok=True)

    def _beat(self) -> None:
        import os
        import threading

        stop = threading.Event()
        token = self._token

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                if (self.holder() or {}).get("token") != token:
                    return  # taken over (this process was stopped too long)
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        threading.Thread(target=beat, name=f"lease {self.path.name}", daemon=True).start()
        self._stop = stop

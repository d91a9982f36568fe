"""Who computes a study's cell when several processes share one study directory.

Shares of a study (``--shard K/N``, ``studies/shards.py``), a plain ``reproduce`` beside
them, or shares that overlap all meet in ``DIR``. Each cell is claimed before its model
loads: a finished cell is skipped; otherwise its lease
``DIR/.attngeom/runs/MODEL/CORPUS/COMMAND.lock`` (``results.state.Lease``) is taken, and
a cell whose lease another live process holds is left to it. Whoever finishes a cell
writes ``COMMAND.json`` beside the lease (status, seconds, the manifest's hash), so the
process that writes the study's tables can say what every cell did, whichever process
ran it. The study's final steps are one more lease, ``DIR/.attngeom/steps.lock``.

Under ``torchrun`` a study's processes are the ranks of one data-parallel run: rank 0
claims, and the others follow its decision (one broadcast integer per cell), so every
rank enters the same cells.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
from pathlib import Path

from attngeom.results.state import STATE_DIR, Lease, RunLock
from attngeom.studies.study import Cell

STEPS_LEASE = "steps.lock"
STEPS_RECORD = "steps.json"  # the runs the study's tables were last written from


class Claim(enum.IntEnum):
    FINISHED = 0  # its manifest holds this configuration: nothing to do
    RUN = 1  # this process holds the cell's lease and computes it
    BUSY = 2  # another live process holds the lease


def state_root(out: Path) -> Path:
    return Path(out) / STATE_DIR


def cell_lease(out: Path, cell: Cell, note: str = "") -> Lease:
    return Lease(state_root(out) / cell.directory.with_suffix(".lock"), note=note)


def steps_lease(out: Path, note: str = "") -> Lease:
    return Lease(state_root(out) / STEPS_LEASE, note=note)


def record_path(out: Path, cell: Cell) -> Path:
    return state_root(out) / cell.directory.with_suffix(".json")


def finished(out: Path, cell: Cell) -> bool:
    """Whether ``DIR/runs/...`` holds the cell's finished run (this configuration)."""
    from attngeom.results.io import holds_run
    from attngeom.results.manifest import config_fingerprint

    return holds_run(Path(out) / cell.directory, cell.command,
                     config_fingerprint(cell.config.fingerprint_dict()))


def manifest_sha256(out: Path, cell: Cell) -> str | None:
    from attngeom.results.io import MANIFEST_NAME

    try:
        return hashlib.sha256((Path(out) / cell.directory / MANIFEST_NAME)
                              .read_bytes()).hexdigest()
    except OSError:
        return None


def claim(out: Path, cell: Cell, lease: Lease, *, overwrite: bool) -> Claim:
    """This process's claim on ``cell`` (rank 0's; see ``agree``). With ``RUN`` the
    lease is held, and a dead holder's run lock in the cell's directory is gone."""
    if not overwrite and finished(out, cell):
        return Claim.FINISHED
    if not lease.take():
        return Claim.BUSY
    if not overwrite and finished(out, cell):  # finished between the look and the take
        lease.release()
        return Claim.FINISHED
    if lease.replaced:  # its process is gone: its run's own lock too, on any machine
        RunLock(Path(out) / cell.directory).drop_if_held_by(lease.replaced)
    return Claim.RUN


def agree(dist, value: int, device: str) -> int:
    """Rank 0's ``value`` on every rank of a data-parallel run (itself in one process)."""
    if dist.world == 1:
        return value
    import torch
    import torch.distributed as td

    on = f"cuda:{dist.local_rank}" if td.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=on)
    td.broadcast(t, src=0)
    return int(t.item())


def write_record(out: Path, cell: Cell, rec: dict) -> None:
    """What the cell's process did (``status``, ``wall_s``), for the steps' writer."""
    from attngeom.results.io import write_json

    path = record_path(out, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"status": rec["status"], "wall_s": rec["wall_s"],
                      "manifest_sha256": manifest_sha256(out, cell)})


def read_record(out: Path, cell: Cell) -> dict | None:
    """The record of the cell's last computation, when it is the finished run's."""
    try:
        rec = json.loads(record_path(out, cell).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("manifest_sha256") != manifest_sha256(out, cell):
        return None
    return rec


def steps_written(out: Path, study) -> None:
    """Note which runs the tables and report were written from (every cell's manifest
    hash) and drop the cells' records: from now on they were finished before."""
    from attngeom.results.io import write_json

    write_json(state_root(out) / STEPS_RECORD, {
        "sha256": study.sha256,
        "manifests": {c.directory.as_posix(): manifest_sha256(out, c) for c in study.cells}})
    for cell in study.cells:
        path = record_path(out, cell)
        path.unlink(missing_ok=True)
        for folder in path.parents:  # the emptied folders of the records and leases
            if folder == state_root(out):
                break
            with contextlib.suppress(OSError):
                folder.rmdir()


def steps_current(out: Path, study) -> bool:
    """Whether the tables and report were written from the runs now in ``DIR`` (the
    same study file, every cell's manifest unchanged): another share finished last."""
    try:
        record = json.loads((state_root(out) / STEPS_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("sha256") == study.sha256 and (
        record.get("manifests") == {c.directory.as_posix(): manifest_sha256(out, c)
                                    for c in study.cells})

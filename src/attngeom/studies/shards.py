"""Which cells of a study one process runs: ``--shard K/N``, or the scheduler's array index.

A study spread over N jobs (a SLURM job array, a Kubernetes Indexed Job, N shells) gives
each job a fixed share of its cells, so the jobs need to agree on nothing but the study
file. Share K of N (K counted from 1) is a contiguous block of the study's cell order,
cells ``floor((K-1) C / N)`` to ``floor(K C / N) - 1`` of C. Blocks rather than every
N-th cell because the cells are ordered model by model and a process loads a model once
for its consecutive cells of it: with blocks a model loads in at most the shares its
cells straddle, with ``index mod N`` in every share. (Neither balances time: the
cells of a model and corpus are the analyze run then the interventions, and blocks
keep those together too.)

Without ``--shard`` the environment is read, in this order:

- SLURM job arrays: ``SLURM_ARRAY_TASK_ID`` with ``SLURM_ARRAY_TASK_MIN``,
  ``SLURM_ARRAY_TASK_MAX``, ``SLURM_ARRAY_TASK_STEP`` (1 when unset) and
  ``SLURM_ARRAY_TASK_COUNT``; K is the task's place in the range (``--array=0-3`` and
  ``--array=1-4`` both give 1..4), N the count. An array that is not one range with a
  step (``--array=1,4,9``, a resubmission of some tasks) is refused: pass ``--shard``.
- Kubernetes Indexed Jobs: ``JOB_COMPLETION_INDEX`` (0-based) is K - 1. Kubernetes
  gives the pod no variable with the number of completions, so the Job's manifest sets
  ``JOB_COMPLETIONS`` to its ``spec.completions``; the index alone is not read as a
  share, because multi-node ``torchrun`` in an Indexed Job uses it as the node rank.

>>> parse_shard("2/3", n_cells=7)
Shard(index=2, count=3, source='--shard')
>>> Shard(2, 3).select(list("abcdefg"))
['c', 'd']
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from attngeom.errors import ConfigError

T = TypeVar("T")
K8S_COUNT = "JOB_COMPLETIONS"  # ours: the manifest sets it (Kubernetes does not)


@dataclass(frozen=True)
class Shard:
    """Share ``index`` (1-based) of ``count``; ``source`` says where it was read."""

    index: int
    count: int
    source: str = "--shard"

    def bounds(self, n_cells: int) -> tuple[int, int]:
        """``[start, stop)`` of this share's block among ``n_cells`` cells."""
        return ((self.index - 1) * n_cells // self.count, self.index * n_cells // self.count)

    def select(self, cells: Sequence[T]) -> list[T]:
        start, stop = self.bounds(len(cells))
        return list(cells[start:stop])

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, *, n_cells: int | None = None, source: str = "--shard") -> Shard:
    """``"K/N"`` as a ``Shard``; one ``ConfigError`` line for anything else."""
    m = re.fullmatch(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*", str(text))
    if not m:
        raise ConfigError(f"{source}: expected K/N (share K of N, K from 1), got {text!r}")
    return _checked(int(m.group(1)), int(m.group(2)), n_cells, source)


def _checked(index: int, count: int, n_cells: int | None, source: str) -> Shard:
    if count < 1:
        raise ConfigError(f"{source}: expected at least one share, got {index}/{count}")
    if not 1 <= index <= count:
        raise ConfigError(f"{source}: share {index} of {count} is outside 1..{count} "
                          "(K counts from 1)")
    if n_cells is not None and count > n_cells:
        raise ConfigError(f"{source}: {count} shares for {n_cells} cells; use at most "
                          f"{n_cells} (a share without a cell would have nothing to do)")
    return Shard(index, count, source)


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer; pass --shard K/N "
                          "instead") from None


def _slurm(env: Mapping[str, str], n_cells: int | None) -> Shard:
    task, lo, hi = (_int(env, f"SLURM_ARRAY_TASK_{k}") for k in ("ID", "MIN", "MAX"))
    step = _int(env, "SLURM_ARRAY_TASK_STEP") or 1
    count = _int(env, "SLURM_ARRAY_TASK_COUNT")
    source = "SLURM_ARRAY_TASK_ID"
    if lo is None or hi is None or step < 1:
        raise ConfigError(f"{source}={task} without SLURM_ARRAY_TASK_MIN/MAX: pass "
                          "--shard K/N")
    span = (hi - lo) // step + 1
    if count is None:
        count = span
    if (task - lo) % step or count != span:
        raise ConfigError(f"{source}: the array {lo}-{hi}:{step} of {count} tasks is not "
                          "one range (some tasks were left out or resubmitted); pass "
                          "--shard K/N to each task")
    return _checked((task - lo) // step + 1, count, n_cells, source)


def shard_from_env(env: Mapping[str, str] | None = None, *,
                   n_cells: int | None = None) -> Shard | None:
    """The share a scheduler's environment names (SLURM array, Kubernetes Indexed Job
    with ``JOB_COMPLETIONS``), or ``None`` outside one."""
    env = os.environ if env is None else env
    if _int(env, "SLURM_ARRAY_TASK_ID") is not None:
        return _slurm(env, n_cells)
    index = _int(env, "JOB_COMPLETION_INDEX")
    count = _int(env, K8S_COUNT)
    if index is not None and count is not None:
        return _checked(index + 1, count, n_cells, "JOB_COMPLETION_INDEX")
    return None


def resolve_shard(shard: str | Shard | None, n_cells: int, *,
                  env: Mapping[str, str] | None = None) -> Shard | None:
    """The share this process runs: ``shard`` when given (``"K/N"`` or a ``Shard``),
    else the environment's; ``None`` runs the whole study. ``"1/1"`` is the whole study
    too, and is how a plain run is asked for inside an array job."""
    if isinstance(shard, Shard):
        shard = _checked(shard.index, shard.count, n_cells, shard.source)
    elif shard is not None:
        shard = parse_shard(shard, n_cells=n_cells)
    else:
        shard = shard_from_env(env, n_cells=n_cells)
    return None if shard is None or shard.count == 1 else shard

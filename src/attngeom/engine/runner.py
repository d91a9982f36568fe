"""One runner for every command: check, read, load, compute, write (in that order).

``execute(command, config, out)`` is the only path a command takes:

1. the configuration was validated when it was built (``attngeom.config``);
2. the output directory is checked before anything is loaded: one holding another
   run is refused, and one that cannot be created or written fails now, not after
   the work (``--out /proc/x``);
3. the tokenizer loads and the corpus is cut into windows, so a bad corpus or
   boundary option fails before the model loads;
4. the model loads and is checked against the command (window length, causal LM);
5. ``command.run(context)`` computes the tables, reporting progress; its work is cut
   into units (batches of windows), each written to its own shard as soon as it is
   done (``run_units``), so a killed run resumes with the same command and a
   data-parallel run (``torchrun``, ``accelerate launch``) shares the units among
   its processes; the units are combined in unit order, so the tables are the same
   bit for bit whichever process computed which unit, and whether it resumed;
6. each table is written atomically, then the manifest, then the shards go
   (``attngeom.results``).

A command is a ``Command`` subclass (``engine/analyze.py``,
``engine/loss_runs.py``); the API (``attngeom.api``) builds a configuration and
calls ``execute``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attngeom.corpora.labels import label_of
from attngeom.errors import ConfigError, RunDirError


@dataclass
class RunResult:
    """What every command returns: its tables as DataFrames, the manifest, where they went."""

    tables: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    out_dir: Path | None = None

    def __getitem__(self, name: str):
        return self.tables[name]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {len(v)} rows" for k, v in self.tables.items())
        return f"{type(self).__name__}(out_dir={self.out_dir}, {shapes})"

    def headline(self):
        """F_N by rule and N over all heads (``None`` without a summary table)."""
        from attngeom.engine.tables import headline

        return headline(self.tables["summary"]) if "summary" in self.tables else None


@dataclass(frozen=True)
class Distributed:
    """This process's place in a data-parallel run (one process: rank 0 of 1).

    Read from the ``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` variables that ``torchrun``
    and ``accelerate launch`` set; the process group (gloo on CPUs, nccl on GPUs) is
    created here when the launcher has not made one.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls, device: str = "cpu") -> Distributed:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if str(device).startswith("cuda") else "gloo"
            dist.init_process_group(backend=backend)
        return cls(rank=dist.get_rank(), world=dist.get_world_size(),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def owns(self, unit: int) -> bool:
        return unit % self.world == self.rank

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def device(self, device: str) -> str:
        """One GPU per process: ``cuda`` becomes ``cuda:LOCAL_RANK``."""
        return f"cuda:{self.local_rank}" if self.world > 1 and device == "cuda" else device


@dataclass(frozen=True)
class Unit:
    """One unit of work (``index`` its place in the stage): a batch of windows, or of
    whatever else a command cuts its work into (a probe's examples or documents), with
    ``ids`` naming them in the unit's shard (default: the windows' indices), so a shard
    is never read back for other inputs."""

    index: int
    windows: tuple
    ids: tuple[int, ...] | None = None

    @property
    def window_ids(self) -> list[int]:
        if self.ids is not None:
            return [int(i) for i in self.ids]
        return [int(w.index) for w in self.windows]


def units_of(windows: Sequence, batch_size: int) -> list[Unit]:
    return [Unit(i, tuple(windows[s : s + batch_size]))
            for i, s in enumerate(range(0, len(windows), batch_size))]


@dataclass
class RunContext:
    """Everything a command's ``run`` sees."""

    config: Any
    tokenizer: Any
    windows: list
    corpus_info: Any
    policy: Any
    model: Any = None
    layout: Any = None
    shape: Any = None  # validate.ModelShape, read from the model's configuration
    inputs: Any = None  # what the command's ``prepare`` built before the model loaded
    progress: Any = True
    timings: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    corpus_extra: dict = field(default_factory=dict)
    store: Any = None  # results.state.ShardStore, or None without an output directory
    dist: Distributed = field(default_factory=Distributed)
    pending: int = 0  # weight this process computes in the current stage (``run_units``)

    def run_units(self, stage: str, units: Sequence[Unit], process: Callable[[Unit], Any], *,
                  desc: str, unit: str = "window",
                  weight: Callable[[Unit], int] = lambda u: len(u.windows)) -> Iterator:
        """The result of every unit of ``stage``, in unit order.

        A unit whose shard is already on disk (a resumed run) is read back; this
        process computes the others it owns (all of them without data parallelism),
        saving each to its shard as soon as it is done. With several processes the
        results are read from the shards once every process has finished the stage.
        Progress counts ``weight(unit)`` per unit, resumed units included. Shards are
        checked up front but unpickled one at a time, as their unit comes: a resumed
        run holds one unit's state at a time, as an uninterrupted one does. Every
        process checks every shard before any process repairs one (a barrier between),
        so all count the same damaged shards; only a unit's owner removes its shard.
        ``self.pending`` holds the weight this process will compute in the stage (set
        before the first ``process`` call).
        """
        from attngeom.engine.progress import Progress, plural

        store, dist = self.store, self.dist
        done, damaged = set(), []
        if store is not None:
            for u in units:
                if store.load(stage, u.index, u.window_ids, payload=False, repair=False)[0]:
                    done.add(u.index)
                elif store.path(stage, u.index).is_file():
                    damaged.append(u)
            if dist.world > 1:
                dist.barrier()  # every process has looked before an owner repairs
        for u in damaged:
            if dist.owns(u.index):
                store.path(stage, u.index).unlink(missing_ok=True)
        self.counts["redone_shards"] = self.counts.get("redone_shards", 0) + len(damaged)
        self.pending = sum(weight(u) for u in units
                           if u.index not in done and dist.owns(u.index))
        resumed = sum(weight(u) for u in units if u.index in done)
        key = f"resumed_{plural(unit)}"
        self.counts[key] = self.counts.get(key, 0) + resumed
        total = sum(weight(u) for u in units)
        show = self.progress if dist.is_main else False
        # the first process's bar counts every process's units: the others' by their
        # shards, which appear as each one finishes a unit
        others = [u for u in units if u.index not in done and not dist.owns(u.index)]
        with Progress(total, desc=desc, unit=unit, enabled=show, initial=resumed,
                      redone=sum(weight(u) for u in damaged)) as bar:
            for u in units:
                if u.index in done:
                    if dist.world == 1:
                        yield self._resumed(stage, u)
                    continue
                if not dist.owns(u.index):
                    continue
                payload = process(u)
                if store is not None:
                    store.save(stage, u.index, u.window_ids, payload)
                bar.advance(weight(u))
                others = _count_finished(store, stage, others, bar, weight)
                if dist.world == 1:
                    yield payload
            if dist.world > 1 and dist.is_main and show:
                while others:  # until every other process has written its units
                    time.sleep(0.2)
                    others = _count_finished(store, stage, others, bar, weight)
        if dist.world > 1:
            dist.barrier()
            for u in units:
                ok, payload = store.load(stage, u.index, u.window_ids)
                if not ok:
                    raise RunDirError(f"unit {u.index} of stage {stage} has no shard after "
                                      "every process finished; run the command again")
                yield payload

    @classmethod
    def in_memory(cls, config, model, *, tokenizer=None, inputs=None,
                  progress=False) -> RunContext:
        """A context for a command's pieces on a model already in memory (a notebook, a
        test): no output directory, so units are computed and kept in memory."""
        from attngeom.capture import model_layout

        layout = model_layout(model)
        return cls(config=config, tokenizer=tokenizer, windows=[], corpus_info={},
                   policy=None, model=model, layout=layout, shape=_shape_of(layout),
                   inputs=inputs, progress=progress)

    def _resumed(self, stage: str, u: Unit):
        ok, payload = self.store.load(stage, u.index, u.window_ids)
        if not ok:
            raise RunDirError(f"unit {u.index} of stage {stage}: its shard was sound when the "
                              "run started and is not now; run the command again")
        return payload

    @property
    def model_label(self) -> str:
        return self.config.model_label or label_of(self.config.model)

    @property
    def corpus_label(self) -> str:
        return self.config.corpus_label or label_of(self.config.corpus)


def _count_finished(store, stage: str, pending: list, bar, weight) -> list:
    """Advance ``bar`` by the units of ``pending`` another process has finished (their
    shard is on disk; a shard is written whole or not at all); the rest stay pending."""
    if not pending or store is None:
        return pending
    left = []
    for u in pending:
        if store.path(stage, u.index).is_file():
            bar.advance(weight(u))
        else:
            left.append(u)
    return left


class Command:
    """The work of a run command: ``prepare(ctx)`` builds and checks its inputs before
    the model loads (``ctx.model`` is None there unless a loaded model was passed in;
    ``ctx.shape`` the model's shape from its configuration, or None), ``run(ctx)``
    computes its tables. What the command is called, its configuration and whether it
    needs a causal LM are its declaration in ``config.COMMANDS`` (``@command`` on its
    configuration class)."""

    def prepare(self, ctx: RunContext) -> None:
        """Build and check what ``run`` needs that takes no weights (default: nothing)."""

    def run(self, ctx: RunContext) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


def work_of(name: str) -> Command:
    """The ``Command`` that computes the registered command ``name``."""
    import importlib

    from attngeom.config import command_spec

    module, _, attr = command_spec(name).work.partition(":")
    return getattr(importlib.import_module(module), attr)()


def check_writable(out: Path) -> Path:
    """Create ``out`` if needed and prove a file can be written there (one line if not)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create results directory {out}: "
                          f"{e.strerror or type(e).__name__}") from None
    from attngeom.results.io import WRITE_PROBE_PREFIX

    probe = out / f"{WRITE_PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunDirError(f"cannot write to results directory {out}: "
                          f"{e.strerror or type(e).__name__}") from None
    return out


def prepare_output(out, command: str, fingerprint: str, overwrite: bool,
                   config: dict | None = None) -> Path | None:
    """Refuse another run's directory and prove this one writable, before any work."""
    if out is None:
        return None
    from attngeom.results.io import prepare_run_dir

    prepare_run_dir(out, command=command, fingerprint=fingerprint, overwrite=overwrite,
                    check_only=True, config=config)
    return check_writable(Path(out))


def model_identity(name: str, model, layout) -> dict:
    from attngeom.results.manifest import directory_sha256, file_sha256

    p = Path(name).expanduser()
    digest = directory_sha256(p) if p.is_dir() else file_sha256(p) if p.is_file() else None
    return {
        "name": name,
        "class": layout.model_class,
        "sha256": digest,
        "num_layers": layout.num_layers,
        "num_heads": layout.num_heads,
        "num_kv_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim,
        "is_causal": layout.is_causal,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }


def _corpus_meta(ctx: RunContext) -> dict:
    info = ctx.corpus_info
    meta = info.to_dict() if hasattr(info, "to_dict") else dict(info)
    meta = {k: (str(v) if isinstance(v, Path) else v) for k, v in meta.items()}
    meta["n_windows"] = len(ctx.windows)
    if ctx.windows:  # a probe that cuts its own prompts reads no window of the run's
        meta.update({"window_length": ctx.config.window_length,
                     "first_window": int(ctx.windows[0].index),
                     "last_window": int(ctx.windows[-1].index)})
    meta["boundary_policy"] = ctx.policy.to_dict()
    meta.update(ctx.corpus_extra)
    return meta


def _labelled(df, ctx: RunContext):
    if "model" in df.columns:
        return df
    df = df.copy()
    df.insert(0, "corpus", ctx.corpus_label)
    df.insert(0, "model", ctx.model_label)
    return df


def execute(command: Command, config, out=None, *, overwrite: bool = False,
            progress=True, model_and_tokenizer=None) -> RunResult:
    """Run ``command`` with ``config``; write its tables and manifest to ``out`` if given.

    The command's name and needs are its declaration (``config.COMMANDS``), found by
    the configuration's class."""
    from attngeom.config import command_spec
    from attngeom.results.state import RunLock, check_resumable

    spec = command_spec(config.command)
    config.require_model_and_corpus()
    # every check that needs no weights comes first: a mistake never costs a load, and
    # never leaves a run folder that refuses the corrected command
    shape = _preflight(config, model_and_tokenizer)
    dist = Distributed.from_env(config.device)
    if dist.world > 1 and out is None:
        raise ConfigError("a data-parallel run needs an output directory (--out): its "
                          "processes share their finished windows there")
    lock = RunLock(out) if out is not None and dist.is_main else None
    if lock is not None:
        lock.check()  # a run in progress there: refused before anything else is said
    if out is not None and not overwrite:
        check_resumable(out, command=spec.name, resume_key=config.resume_key())
    from attngeom.results.manifest import config_fingerprint

    fingerprint = config_fingerprint(config.fingerprint_dict())
    out_dir = prepare_output(out, spec.name, fingerprint, overwrite,
                             config.fingerprint_dict())
    if lock is None:
        return _execute(command, spec, config, out_dir, fingerprint, dist, overwrite=overwrite,
                        progress=progress, model_and_tokenizer=model_and_tokenizer,
                        shape=shape)
    with lock:
        return _execute(command, spec, config, out_dir, fingerprint, dist, overwrite=overwrite,
                        progress=progress, model_and_tokenizer=model_and_tokenizer,
                        shape=shape)


def _preflight(config, model_and_tokenizer):
    """The model's shape from its configuration (no weights: ``capture.model_shape``, or
    the given model's layout) and every option checked against it; the device checked.
    Returns the shape (``None`` where the configuration cannot be read here: a hub id
    offline and not cached; the checks then run once the model has loaded)."""
    from attngeom.capture import check_device, model_layout, model_shape
    from attngeom.validate import check_config

    given = (model_and_tokenizer or (None, None))[0]
    if given is not None:
        shape = _shape_of(model_layout(given))
    else:
        if config.device_map is None:
            check_device(config.device)
        shape = model_shape(config.model)
    if shape is not None:
        check_config(config, shape)
    return shape


def _shape_of(layout):
    from attngeom.validate import ModelShape

    return ModelShape(layers=layout.num_layers, heads=layout.num_heads,
                      kv_heads=layout.num_kv_heads, max_positions=layout.max_positions,
                      is_causal=layout.is_causal, name=layout.model_class)


def _execute(command, spec, config, out_dir, fingerprint, dist, *, overwrite, progress,
             model_and_tokenizer, shape) -> RunResult:
    from attngeom.capture import load_tokenizer
    from attngeom.engine.progress import plural, say
    from attngeom.results.manifest import build_manifest
    from attngeom.results.state import ShardStore, clear_states

    name, resume_key = spec.name, config.resume_key()
    talk = progress if dist.is_main else False
    store = None
    if out_dir is not None:
        store = ShardStore(out_dir, fingerprint, command=name, resume_key=resume_key)
        if dist.is_main and overwrite and store.root.is_dir():
            _drop_other_resume_key(store.root, resume_key)
        dist.barrier()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    given_model, given_tok = model_and_tokenizer or (None, None)
    tokenizer = given_tok if given_tok is not None else load_tokenizer(config.model)
    from attngeom.corpora.documents import load_windows

    if config.reads_windows:
        windows, info, policy = load_windows(config, tokenizer)
    else:  # the command reads its own inputs (``prepare``), which the manifest records
        from attngeom.corpora.windows import boundary_policy

        windows, info = [], {"name": label_of(config.corpus), "path": str(config.corpus)}
        policy = boundary_policy(tokenizer, config.doc_boundary, config.boundary_token)
    needed = config.windows_needed
    if spec.loss and needed is not None and len(windows) < needed:
        raise ConfigError(
            f"corpus gives {len(windows)} windows of {config.window_length} tokens; "
            f"the command needs {needed}"
        )
    counts: dict = {}
    if needed is not None and len(windows) < needed:
        counts["windows_requested"] = needed
        say(talk, f"warning: the corpus gives {len(windows)} windows of "
                  f"{config.window_length} tokens, {needed} were asked for; running on "
                  f"{len(windows)}")
    if shape is not None and spec.loss and not shape.is_causal:
        raise ConfigError(f"{shape.name} is not a causal LM: {name} measures next-token "
                          "loss, which needs one")
    ctx = RunContext(config=config, tokenizer=tokenizer, windows=windows, corpus_info=info,
                     policy=policy, model=given_model, shape=shape, progress=talk,
                     timings=timings, store=store, dist=dist, counts=counts)
    command.prepare(ctx)  # the command's own inputs, checked before any weight is read
    timings["windows_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    _load(ctx, spec, given_model)
    timings["load_model_s"] = time.perf_counter() - t1
    tables = {n: _labelled(df, ctx) for n, df in command.run(ctx).items()}
    timings["total_s"] = time.perf_counter() - t0
    manifest = build_manifest(
        command=name, config=config.to_dict(),
        model_info=model_identity(config.model, ctx.model, ctx.layout),
        corpus_info=_corpus_meta(ctx),
        seed=config.seed, timings=timings, tables={n: f"{n}.parquet" for n in tables},
        counts=ctx.counts, fingerprint=fingerprint,
    )
    if out_dir is not None and dist.is_main:
        from attngeom.results.io import prepare_run_dir, write_manifest, write_table

        say(talk, f"writing {len(tables)} {plural('table', len(tables))} to {out_dir} ...")
        out_dir = prepare_run_dir(out_dir, command=name, fingerprint=fingerprint,
                                  overwrite=overwrite)
        for n, df in tables.items():
            write_table(out_dir, n, df)
        write_manifest(out_dir, manifest)
    # the shards go only once every process has read them: a rank still reading the last
    # stage's shards must not find them deleted (it failed with "no shard" 1 run in 3)
    dist.barrier()
    if out_dir is not None and dist.is_main:
        clear_states(out_dir)
    return RunResult(tables=tables, manifest=manifest, out_dir=out_dir)


def _load(ctx: RunContext, spec, given_model) -> None:
    """Load the model (unless one was given) into ``ctx``; the checks that needed its
    configuration run now if it could not be read before (a hub id not cached)."""
    from attngeom.capture import load_model, model_layout
    from attngeom.engine.progress import say
    from attngeom.validate import check_config

    config = ctx.config
    if given_model is None:
        say(ctx.progress, f"loading {label_of(config.model)} ({config.dtype}, "
                          f"{config.device}) ...")
        model, ctx.tokenizer = load_model(config.model, device=ctx.dist.device(config.device),
                                          dtype=config.dtype, tokenizer=ctx.tokenizer,
                                          device_map=config.device_map,
                                          quantization=config.quantization)
    else:
        model = given_model
    layout = model_layout(model)
    if ctx.shape is None:  # the configuration could not be read before the load
        ctx.shape = _shape_of(layout)
        check_config(config, ctx.shape)
    if spec.loss and not layout.is_causal:
        raise ConfigError(f"{layout.model_class} is not a causal LM: {spec.name} measures "
                          "next-token loss, which needs one")
    ctx.model, ctx.layout = model, layout


def _drop_other_resume_key(root: Path, resume_key: dict) -> None:
    """With overwrite: shards of this fingerprint cut with other batch or chunk sizes go."""
    import shutil

    from attngeom.results.state import RUN_FILE

    try:
        import json

        old = json.loads((root / RUN_FILE).read_text(encoding="utf-8")).get("resume_key")
    except (OSError, ValueError):
        old = None
    if old != resume_key:
        shutil.rmtree(root, ignore_errors=True)

"""The configuration of every command, each option declared once (a leaf: no torch).

A frozen dataclass per command (``AnalysisConfig``, ``PruneConfig``, ``ScanConfig``,
``RestrictConfig``) shares the base ``RunConfig`` (model, corpus, windows, device,
dtype, seed). Each field carries its help text; the CLI builds its options from the
fields (``attngeom.cli``), a study file fills the same fields, and the API takes them
as keyword arguments, so an option is declared in exactly one place. Validation
happens once, in ``__post_init__``, with the checks of ``attngeom.validate``: a bad
value fails in a second with one line, before any model or corpus work.

>>> AnalysisConfig(model="m", corpus="c", n_grid="8,1,2").n_grid
(1, 2, 8)
>>> AnalysisConfig(model="m", corpus="c", query_mode="last")
Traceback (most recent call last):
...
attngeom.errors.ConfigError: query_mode: expected 'final', 'all' or 'stride:k' with k >= 1, \
got 'last'
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import ClassVar

from attngeom import validate as v
from attngeom.assets import DEFAULT_CORPUS, DEFAULT_MODEL, asset
from attngeom.errors import ConfigError
from attngeom.names import (
    ANALYSIS_ALIASES,
    ANALYSIS_NEEDS,
    DISTANCES,
    DTYPES,
    QUANTIZATIONS,
    RANDOM_CONTROL,
    RANKER_REGIMES,
    RANKERS,
    REGIME_RULES,
    RESTRICT_SCOPES,
    RULES,
    VARIANTS,
)
from attngeom.results import schemas
from attngeom.results.schemas import ANALYSES

__all__ = [
    "COMMANDS", "AnalysisConfig", "CommandSpec", "PruneConfig", "RestrictConfig", "RunConfig",
    "ScanConfig",
    "command", "command_spec", "loss_commands", "option", "option_fields",
]


def option(default=MISSING, *, help: str, factory=None, fingerprint: bool | str = True,
           metavar: str | None = None, cli: bool = True):
    """A configuration field with its help text (shown by ``--help`` with the default).

    ``fingerprint=False`` marks fields that change how a run is computed but not its
    numbers (device, batch sizes), which a resumed or repeated run may change.
    ``fingerprint="unless_default"``: a field added after runs were made, which enters
    the fingerprint only when it differs from its default, so those runs keep theirs.
    """
    meta = {"help": help, "fingerprint": fingerprint, "metavar": metavar, "cli": cli}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class CommandSpec:
    """One run command, declared once: the CLI's subcommand and help, the API's
    ``api.run(name)``, the study file's analysis name and run folder, and what the
    runner must check are all read from here (``COMMANDS``).

    ``work`` and ``summary`` are ``"module:name"`` paths, imported only when the command
    runs, so declaring a command imports nothing heavy: ``work`` is the
    ``pipeline.runner.Command`` subclass that computes the tables, ``summary`` the
    function that turns a ``RunResult`` into the text the CLI prints.
    """

    name: str
    config: type
    help: str
    work: str
    summary: str = "attngeom.report.text:tables_summary"
    run_dir: str = ""  # its folder in a study, runs/MODEL/CORPUS/RUN_DIR (default: name)
    loss: bool = False  # measures next-token loss: needs a causal LM, holds the logits
    study: str | None = None  # its name in a study's analyses (None: not in studies)

    @property
    def folder(self) -> str:
        return self.run_dir or self.name


COMMANDS: dict[str, CommandSpec] = {}


def command(name: str, *, help: str, work: str, **spec):
    """Class decorator: register the configuration class of run command ``name``
    (``CommandSpec`` fields as keywords). Adding a command is this declaration, its
    configuration class and its ``work`` (``docs/extending.md``)."""

    def register(cls):
        cls.command = name
        COMMANDS[name] = CommandSpec(name=name, config=cls, help=help, work=work, **spec)
        return cls

    return register


def command_spec(name: str) -> CommandSpec:
    """The registered command ``name`` (``ConfigError`` naming the known ones otherwise)."""
    if name not in COMMANDS:
        raise ConfigError(f"command: expected one of {', '.join(COMMANDS)}, got {name!r}")
    return COMMANDS[name]


def loss_commands() -> tuple[str, ...]:
    """The commands that measure next-token loss (they need a causal LM)."""
    return tuple(n for n, c in COMMANDS.items() if c.loss)


@dataclass(frozen=True)
class RunConfig:
    """What every command shares: which model, which corpus, which windows, where."""

    command: ClassVar[str] = ""

    model: str | None = option(
        None, help="hub id, local model directory or .gguf file (default: the bundled "
        "stories260K)", metavar="MODEL")
    corpus: str | None = option(
        None, help="a .txt, .jsonl or .parquet file, a folder of them, or wikitext-103, "
        "wikitext-2, openwebtext (default: the bundled TinyStories sample)", metavar="CORPUS")
    window_length: int = option(256, help="tokens per window (T), special tokens included")
    start_window: int = option(0, help="index of the first window taken from the corpus")
    windows_per_document: int | None = option(
        None, help="cut each document alone and take its first K windows (a document too "
        "short for one gives none; default: documents joined into one stream)",
        metavar="K")
    sample_documents: int | None = option(
        None, help="draw this many documents from the corpus by a hash of each document and "
        "the seed, then cut windows from them (default: every document, in corpus order)")
    document_protocol: str = option(
        "stream", help="how windows are made: stream (documents joined, cut into "
        "consecutive windows) or fixed (the follow-up's protocol: one window per document "
        "at a hashed offset, the initial token first, the first N_DOCUMENTS documents of at "
        "least T-1 tokens in hash order)")
    n_documents: int = option(50, help="documents of the fixed protocol (one window each)")
    seed: int = option(0, help="seed of the random control, bootstrap and seeded rankers")
    device: str = option("cpu", help="torch device (cpu, cuda, cuda:1, mps)", fingerprint=False)
    dtype: str = option("float32", help=f"model dtype ({', '.join(DTYPES)})")
    quantization: str = option(
        "none", help="weights through bitsandbytes on a CUDA GPU: 8bit (LLM.int8, outlier "
        "threshold 6.0, as the follow-up ran Mistral-Small-24B), 4bit (nf4) or none; "
        "activations and attention stay in --dtype", fingerprint="unless_default")
    batch_size: int = option(4, help="windows per forward pass", fingerprint=False)
    device_map: str | None = option(
        None, help="'auto': spread a model too large for one GPU over the GPUs of this "
        "machine (transformers device_map; then one process, not data-parallel)",
        fingerprint=False)
    text_column: str = option("text", help="text column of .jsonl / .parquet corpora")
    separator: str | None = option(
        None, help="line that separates documents in a .txt corpus (default: "
        "<|endoftext|> if present, else blank lines)")
    doc_boundary: str = option(
        "auto", help="what goes between documents: auto (the tokenizer's training "
        "convention), bos, eos, sep or none")
    boundary_token: str | None = option(
        None, help="the token placed at document boundaries instead of the tokenizer's own")
    model_label: str | None = option(None, help="model name in the tables (default: from MODEL)")
    corpus_label: str | None = option(None, help="corpus name in the tables (default: from "
                                      "CORPUS)")

    def __post_init__(self) -> None:
        s = object.__setattr__
        for name, default in (("model", DEFAULT_MODEL), ("corpus", DEFAULT_CORPUS)):
            value = getattr(self, name)
            if value is None:
                # resolved now where the assets are at hand; else when the run starts
                with contextlib.suppress(ConfigError):
                    s(self, name, asset(default, f"--{name}"))
            else:
                s(self, name, str(value))
        s(self, "window_length", v.integer("window_length", self.window_length, low=2))
        s(self, "start_window", v.integer("start_window", self.start_window, low=0))
        if self.windows_per_document is not None:
            s(self, "windows_per_document",
              v.integer("windows_per_document", self.windows_per_document, low=1))
        if self.sample_documents is not None:
            s(self, "sample_documents",
              v.integer("sample_documents", self.sample_documents, low=1))
        s(self, "seed", v.integer("seed", self.seed))
        v.one_of("document_protocol", self.document_protocol, ("stream", "fixed"))
        s(self, "n_documents", v.integer("n_documents", self.n_documents, low=1))
        if self.document_protocol == "fixed" and (self.windows_per_document
                                                  or self.sample_documents):
            raise ConfigError("document_protocol: 'fixed' chooses its own documents and "
                              "windows; drop windows_per_document and sample_documents")
        s(self, "batch_size", v.integer("batch_size", self.batch_size, low=1))
        v.one_of("dtype", self.dtype, DTYPES)
        v.one_of("quantization", self.quantization, QUANTIZATIONS)
        v.text("device", self.device)
        v.text("text_column", self.text_column)
        v.text("separator", self.separator, optional=True)
        v.boundary_options(self.doc_boundary, self.boundary_token)

    # ------------------------------------------------------------------ use

    def with_(self, **changes) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def require_model_and_corpus(self) -> None:
        """Raise the one-line "pass --model" error where no default could be found."""
        for name, default in (("model", DEFAULT_MODEL), ("corpus", DEFAULT_CORPUS)):
            if getattr(self, name) is None:
                asset(default, f"--{name}")

    @property
    def windows_needed(self) -> int | None:
        """How many windows the command reads (``None``: every window of the corpus)."""
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (list(x) if isinstance(x, tuple) else x) for k, x in d.items()}

    def fingerprint_dict(self) -> dict:
        """What identifies the run's results (the device and batch sizes do not)."""
        d = self.to_dict()
        for f in fields(self):
            keep = f.metadata.get("fingerprint", True)
            if not keep or (keep == "unless_default" and d.get(f.name) == f.default):
                d.pop(f.name, None)
        return d

    def resume_key(self) -> dict:
        """What a resumed run must share with the shards it finds: the fingerprint's
        options and those that cut the work into shards (batch and chunk sizes)."""
        d = self.fingerprint_dict()
        d["batch_size"] = self.batch_size
        for name in ("chunk_size", "memory_budget"):
            if hasattr(self, name):
                d[name] = getattr(self, name)
        if hasattr(self, "repeats"):  # shards drawn by another random control differ
            d["random_control"] = RANDOM_CONTROL
        return d


@command("analyze", help="top-N geometry, sink, taxonomy, bounds and assumptions of a model",
         work="attngeom.engine.analyze:Analyze",
         summary="attngeom.report.text:analyze_summary")
@dataclass(frozen=True)
class AnalysisConfig(RunConfig):
    """``attngeom analyze``: top-N geometry, sink, taxonomy, bounds and assumptions."""

    n_windows: int | None = option(32, help="windows to analyse (0 or none: every window)")
    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32), help="set sizes N")
    query_mode: str = option("final", help="analysed queries: final (the last content "
                             "token), all, or stride:k")
    rules: tuple[str, ...] = option(RULES, help="selection rules")
    distances: tuple[str, ...] = option(("euclidean",), help=f"distances ({', '.join(DISTANCES)})")
    variants: tuple[str, ...] = option(VARIANTS, help="universes: full, and no_sink (the sink "
                                       "dropped from the universe)")
    analyses: tuple[str, ...] = option(ANALYSES, help="analyses to run")
    repeats: int | None = option(None, help="random-control repeats (default: 16 for final "
                                 "queries, 2 otherwise)")
    chunk_size: int | None = option(None, help="query rows per chunk (default: as many as "
                                    "--memory-budget allows)", fingerprint=False)
    memory_budget: float = option(0.25, help="GB of captured query rows per window of a "
                                  "batch; sets the query chunk when --chunk-size is not given",
                                  fingerprint=False)
    compile: str = option("auto", help="torch.compile the exact kernels: on, off, or auto "
                          "(on for all/stride queries on a GPU, for all, stride:k with "
                          "k <= 4, or final queries over >= 256 windows on CPU); tables "
                          "are identical either way",
                          fingerprint=False)
    bootstrap: int = option(1000, help="window-bootstrap replicates of the intervals and the "
                            "label stability (0: none)")
    regime_rule: str = option("single", help="head regime rule: single (plurality of self, "
                              "sink and the most frequent single other source) or lumped")
    sink_min_occurrences: int = option(5, help="a token is a sink of a head only when "
                                       "analysed queries saw it at least this many times")
    sink_min_windows: int = option(3, help="a sink token must also occur in at least this "
                                   "many windows")

    def __post_init__(self) -> None:
        super().__post_init__()
        s = object.__setattr__
        n = None if self.n_windows is None else v.integer("n_windows", self.n_windows, low=0)
        s(self, "n_windows", None if n == 0 else n)
        s(self, "n_grid", v.n_grid(self.n_grid))
        v.parse_query_mode(self.query_mode)
        s(self, "rules", v.choices("rules", self.rules, RULES))
        s(self, "distances", v.choices("distances", self.distances, DISTANCES))
        s(self, "variants", v.choices("variants", self.variants, VARIANTS))
        given = tuple(ANALYSIS_ALIASES.get(a, a) if isinstance(a, str) else a
                      for a in v.as_tuple(self.analyses, "analyses"))
        s(self, "analyses", v.choices("analyses", given, schemas.ANALYSES))
        if self.repeats is not None:
            s(self, "repeats", v.integer("repeats", self.repeats, low=1))
        if self.chunk_size is not None:
            s(self, "chunk_size", v.integer("chunk_size", self.chunk_size, low=1))
        s(self, "memory_budget", v.number("memory_budget", self.memory_budget, low=1e-6))
        v.one_of("compile", self.compile, ("auto", "on", "off"))
        s(self, "bootstrap", v.integer("bootstrap", self.bootstrap, low=0))
        v.one_of("regime_rule", self.regime_rule, REGIME_RULES)
        s(self, "sink_min_occurrences", v.integer("sink_min_occurrences",
                                                  self.sink_min_occurrences, low=1))
        s(self, "sink_min_windows", v.integer("sink_min_windows", self.sink_min_windows, low=1))
        for name in self.analyses:
            missing = [x for x in ANALYSIS_NEEDS.get(name, ()) if x not in self.analyses]
            if missing:
                raise ConfigError(f"analyses: {name!r} needs {', '.join(map(repr, missing))}")

    @property
    def effective_repeats(self) -> int:
        if self.repeats is not None:
            return self.repeats
        return 16 if self.query_mode == "final" else 2

    @property
    def windows_needed(self) -> int | None:
        return self.n_windows

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["effective_repeats"] = self.effective_repeats
        return d


@dataclass(frozen=True)
class _InterventionConfig(RunConfig):
    """What the perplexity-based commands share: evaluation windows and their batch."""

    window_length: int = option(128, help="tokens per window (T), special tokens included; "
                                "shorter than analyze's 256 because these commands run a "
                                "forward pass per setting (per head for scan-heads)")
    batch_size: int = option(8, help="windows per forward pass; larger than analyze's 4, "
                             "which keeps every layer's attention rows of a batch",
                             fingerprint=False)
    n_eval_windows: int = option(8, help="held-out windows the NLL is measured on")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "n_eval_windows",
                           v.integer("n_eval_windows", self.n_eval_windows, low=1))

    @property
    def windows_needed(self) -> int:
        return self.n_rank_windows_needed + self.n_eval_windows

    @property
    def n_rank_windows_needed(self) -> int:
        return 0


def _orders(value) -> tuple[str, ...] | None:
    """Regime orders of the taxonomy ranker: None (the default order), "all", or orders
    written ``Mixer>Reset>Retriever``."""
    if value is None:
        return None
    items = list(v.as_tuple(value, "orders"))
    if items == ["all"]:
        return tuple(">".join(p) for p in itertools.permutations(RANKER_REGIMES))
    if len(items) == 3 and all(isinstance(x, str) and ">" not in x for x in items):
        items = [">".join(items)]  # one order written as three names
    out = []
    for item in items:
        names = tuple(item.split(">")) if isinstance(item, str) else tuple(item)
        if sorted(names) != sorted(RANKER_REGIMES):
            raise ConfigError(
                f"orders: expected 'all' or permutations of {'>'.join(RANKER_REGIMES)}, "
                f"got {item!r}"
            )
        out.append(">".join(names))
    if not out:
        raise ConfigError("orders: expected 'all' or at least one regime order")
    return tuple(dict.fromkeys(out))


def known_rankers() -> tuple[str, ...]:
    """The registered head rankers: ``interventions.rankers.RANKERS`` once that module is
    loaded (a ranker registered since is known; it cannot be registered before the module
    loads), else the built-in names (``names.RANKERS``), without importing torch here."""
    module = sys.modules.get("attngeom.interventions.rankers")
    return tuple(module.RANKERS) if module is not None else tuple(RANKERS)


@command("prune", help="keep-fraction pruning sweep per head ranker",
         work="attngeom.engine.loss_runs:Prune",
         summary="attngeom.report.text:prune_summary", loss=True, study="pruning")
@dataclass(frozen=True)
class PruneConfig(_InterventionConfig):
    """``attngeom prune``: keep-fraction pruning sweep per head ranker (method §9)."""

    rankers: tuple[str, ...] = option(RANKERS, help="head rankers")
    keep_fractions: tuple[float, ...] = option((1.0, 0.9, 0.75, 0.5, 0.25),
                                               help="fractions of heads kept")
    seeds: tuple[int, ...] = option((0, 1, 2), help="seeds of the random ranker")
    orders: tuple[str, ...] | None = option(
        None, help="regime orders of the taxonomy ranker: all, or orders like "
        "Reset>Mixer>Retriever (default: Mixer>Reset>Retriever)")
    n_rank_windows: int = option(8, help="windows the rankers rank on (before the evaluation "
                                 "windows, disjoint from them)")

    def __post_init__(self) -> None:
        super().__post_init__()
        s = object.__setattr__
        s(self, "rankers", v.choices("rankers", self.rankers, known_rankers()))
        s(self, "keep_fractions", v.fractions("keep_fractions", self.keep_fractions))
        s(self, "seeds", v.integers("seeds", self.seeds))
        s(self, "orders", _orders(self.orders))
        s(self, "n_rank_windows", v.integer("n_rank_windows", self.n_rank_windows, low=1))

    @property
    def n_rank_windows_needed(self) -> int:
        return self.n_rank_windows


@command("scan-heads", help="remove each head alone; find critical heads",
         work="attngeom.engine.loss_runs:ScanHeads",
         summary="attngeom.report.text:scan_summary", run_dir="scan", loss=True,
         study="head_scan")
@dataclass(frozen=True)
class ScanConfig(_InterventionConfig):
    """``attngeom scan-heads``: relative delta-NLL of removing each head alone (method §9)."""

    threshold: float = option(0.05, help="relative delta-NLL above which a head is critical")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "threshold",
                           v.number("threshold", self.threshold, low=0.0, low_open=True))


@command("restrict", help="keep only the top-N attention entries per query; N*_tau",
         work="attngeom.engine.loss_runs:Restrict",
         summary="attngeom.report.text:restrict_summary", loss=True, study="restriction")
@dataclass(frozen=True)
class RestrictConfig(_InterventionConfig):
    """``attngeom restrict``: top-N attention restriction and N*_tau (method §9)."""

    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64), help="kept entries N per "
                                     "query: the search's first round (those below the window "
                                     "length)")
    scopes: tuple[str, ...] = option(("model",), help="what is restricted at once: model, "
                                     "layer (each layer alone), head (each head alone)")
    layers: tuple[int, ...] | None = option(None, help="layers of the layer and head scopes "
                                            "and of the localised scan (default: all)")
    heads: tuple[tuple[int, int], ...] | None = option(
        None, help="heads of the head scope as LAYER:HEAD,... (default: all heads of LAYERS)",
        metavar="L:H,...")
    rankings: tuple[str, ...] = option(("attention",), help="which N keys are kept: "
                                       "attention, contribution (alpha ||v||), random (seeded)")
    renormalize: tuple[bool, ...] = option((True, False), help="renormalise the kept "
                                           "probabilities: true, false or both")
    taus: tuple[float, ...] = option((0.01, 0.05, 0.10), help="relative delta-NLL thresholds "
                                     "of N*_tau, each in (0, 1)")
    search: str = option("adaptive", help="N*_tau: adaptive (the follow-up's integer search: "
                         "grid, bisection, refinement) or grid (smallest N of the grid)")
    refine: int = option(3, help="integers below the bisection's pass tried upward")
    bootstrap: int = option(1000, help="document bootstrap replicates of N*'s interval "
                            "(0: none)")
    scope: str = option("model", help="model: N*_tau of the scopes above; layer: the "
                        "localised scan, N keys in one layer at a time; head: the layer scan, "
                        "then each head of the most sensitive layers")
    scan_n: tuple[int, ...] = option((16,), help="kept entries N of the localised scan")
    scan_top_layers: int = option(2, help="layers whose heads the head scan restricts one at "
                                  "a time (the most sensitive of the layer scan)")

    def __post_init__(self) -> None:
        super().__post_init__()
        s = object.__setattr__
        s(self, "n_grid", v.n_grid(self.n_grid))
        s(self, "scopes", v.choices("scopes", self.scopes, RESTRICT_SCOPES))
        if self.layers is not None:
            s(self, "layers", tuple(sorted(v.integers("layers", self.layers, low=0))))
        s(self, "heads", v.head_pairs("heads", self.heads))
        s(self, "rankings", v.choices("rankings", self.rankings, RULES))
        flags = v.as_tuple(self.renormalize, "renormalize")
        if any(isinstance(x, str) and x.strip().lower() == "both" for x in flags):
            flags = (False, True)
        s(self, "renormalize", v.flags("renormalize", flags))
        taus = tuple(v.number("taus", t) for t in v.as_tuple(self.taus, "taus"))
        bad = [t for t in taus if not 0.0 < t < 1.0]
        if bad or not taus:
            raise ConfigError(f"taus: expected relative thresholds in (0, 1) (5% is 0.05), "
                              f"got {bad[0] if bad else 'none'}")
        s(self, "taus", tuple(dict.fromkeys(taus)))
        v.one_of("search", self.search, ("adaptive", "grid"))
        s(self, "refine", v.integer("refine", self.refine, low=0))
        s(self, "bootstrap", v.integer("bootstrap", self.bootstrap, low=0))
        v.one_of("scope", self.scope, RESTRICT_SCOPES)
        s(self, "scan_n", v.n_grid(self.scan_n, "scan_n"))
        s(self, "scan_top_layers", v.integer("scan_top_layers", self.scan_top_layers, low=0))
        if self.scope == "head" and self.scan_top_layers < 1:
            raise ConfigError("scope head: expected scan_top_layers >= 1 (the layers whose "
                              "heads are scanned), got 0: no layer to scan")
        if self.scope != "model" and max(self.scan_n) >= self.window_length:
            raise ConfigError(f"scan_n: expected N below the window length "
                              f"{self.window_length} (N >= T restricts nothing), got "
                              f"{max(self.scan_n)}")
        if self.heads is not None and self.layers is not None:
            outside = [h for h in self.heads if h[0] not in self.layers]
            if outside:
                raise ConfigError(f"heads: expected every head's layer in layers="
                                  f"{list(self.layers)}, got {outside[0]}")


def option_fields(cls: type[RunConfig]) -> list[tuple[str, object, object, dict]]:
    """(name, resolved type, default, metadata) of every CLI option of ``cls``, in order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if not f.metadata.get("cli", True):
            continue
        default = f.default if f.default is not MISSING else f.default_factory()
        out.append((f.name, hints[f.name], default, dict(f.metadata)))
    return out


# --------------------------------------------------------------------------- issue 31-32
# The head atlas, the competition probes and the localised restriction as run commands
# (their work in probes/atlas_command.py, probes/competition_command.py and
# engine/loss_runs.py).


def _thresholds(value) -> tuple[str, ...]:
    """Head-type thresholds written ``NAME=VALUE`` (``sink=0.3``), names of
    ``core.head_scores.HEAD_TYPES`` (read without importing torch: the names are
    checked when the command runs)."""
    out = []
    for item in v.as_tuple(value, "thresholds"):
        name, sep, number = str(item).partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"thresholds: expected NAME=VALUE items (sink=0.3), got {item!r}")
        out.append(f"{name.strip()}={v.number('thresholds', number.strip())}")
    return tuple(out)


@command("atlas", help="head atlas: the field's head types scored beside the regimes",
         work="attngeom.probes.atlas_command:Atlas",
         summary="attngeom.report.text:atlas_summary", study="atlas")
@dataclass(frozen=True)
class AtlasConfig(RunConfig):
    """``attngeom atlas``: previous-token, duplicate-token, induction, echo, sink,
    retrieval and streaming scores of every head, with the taxonomy of the same windows
    computed in the same run, and the regime x head type tables (issue 32)."""

    n_windows: int = option(8, help="corpus windows (scores and taxonomy)")
    query_mode: str = option("final", help="queries of the taxonomy: final, all or stride:k")
    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32), help="set sizes N of the F_N "
                                     "of each head type")
    bootstrap: int = option(200, help="window-bootstrap replicates of the taxonomy's "
                            "stability (0: none)")
    regime_rule: str = option("single", help="head regime rule: single or lumped")
    query_stride: int = option(8, help="corpus rows every K positions for the head scores "
                               "(the last included)", metavar="K")
    streaming_window: int = option(64, help="W of the streaming proxy: the head sees the "
                                   "sink and the W most recent tokens")
    n_repeats: int = option(4, help="repeated random-token prompts (induction, echo)")
    repeat_length: int = option(64, help="random tokens repeated in each prompt")
    n_needles: int = option(4, help="needle-in-a-haystack trials (retrieval score)")
    needle_length: int = option(6, help="tokens of each needle")
    needle_contexts: tuple[int, ...] | None = option(
        None, help="context lengths of the needle prompts (default: T/2 and T/4)")
    recovered_share: float = option(0.5, help="share of a needle's tokens the model must "
                                    "copy for a trial to count")
    thresholds: tuple[str, ...] = option((), help="head-type thresholds other than the "
                                         "published ones, as NAME=VALUE,... (sink=0.3)",
                                         metavar="NAME=VALUE,...")

    def __post_init__(self) -> None:
        super().__post_init__()
        s = object.__setattr__
        s(self, "n_windows", v.integer("n_windows", self.n_windows, low=1))
        v.parse_query_mode(self.query_mode)
        s(self, "n_grid", v.n_grid(self.n_grid))
        s(self, "bootstrap", v.integer("bootstrap", self.bootstrap, low=0))
        v.one_of("regime_rule", self.regime_rule, REGIME_RULES)
        for name in ("query_stride", "streaming_window", "n_repeats", "repeat_length",
                     "n_needles", "needle_length"):
            s(self, name, v.integer(name, getattr(self, name), low=1))
        if self.needle_contexts is not None:
            s(self, "needle_contexts", v.integers("needle_contexts", self.needle_contexts,
                                                  low=2))
            too_long = [c for c in self.needle_contexts if c > self.window_length]
            if too_long:
                raise ConfigError(f"needle_contexts: expected lengths up to the window "
                                  f"length {self.window_length} (the haystack is cut from "
                                  f"a window), got {too_long[0]}")
        s(self, "recovered_share", v.number("recovered_share", self.recovered_share,
                                            low=0.0, high=1.0))
        s(self, "thresholds", _thresholds(self.thresholds))

    @property
    def windows_needed(self) -> int:
        return self.n_windows


COMPETITION_PROBES = ("qa", "context")


@command("competition", help="retrieval under competition: the qa and context probes",
         work="attngeom.probes.competition_command:Competition",
         summary="attngeom.report.text:competition_summary", loss=True)
@dataclass(frozen=True)
class CompetitionConfig(RunConfig):
    """``attngeom competition --probe qa|context`` (issue 31): generated bAbI qa1 with
    corpus background, or a nested context-length sweep; N* per setting. The corpus is
    the background (qa) or the documents (context); by default WikiText-2's test
    articles."""

    probe: str = option("qa", help="qa (bAbI qa1 under background text) or context "
                        "(nested context-length sweep)")
    rankings: tuple[str, ...] = option(("attention",), help="which N keys are kept: "
                                       "attention, contribution or random")
    renormalize: tuple[bool, ...] = option((False,), help="renormalise the kept "
                                           "probabilities: true, false or both")
    taus: tuple[float, ...] | None = option(
        None, help="N* thresholds: qa, answer-loss increase in nats (default 0.1,0.2); "
        "context, relative NLL increase in (0, 1) (default 0.01,0.05,0.1)")
    bootstrap: int = option(1000, help="bootstrap replicates over examples / documents")
    backgrounds: tuple[int, ...] = option((0, 256, 512, 1024), help="qa: tokens of "
                                          "background text around the facts")
    n_episodes: int = option(60, help="qa: generated episodes per background")
    facts: tuple[int, ...] = option((2, 6), help="qa: fewest and most movement facts "
                                    "per episode", metavar="MIN,MAX")
    prompt_format: str = option("auto", help="qa: plain, chat (the model's chat "
                                "template) or auto (chat where the tokenizer has one)")
    answer_prefix: str = option("", help="qa: words that open the answer before the "
                                "scored position, {person} the asked person (e.g. "
                                "'{person} is in the' for an instruct model's chat turn)",
                                fingerprint="unless_default")
    babilong: str | None = option(None, help="qa: real BABILong rows (a dataset split "
                                  "name or a local .jsonl) instead of generated episodes")
    positional: bool = option(True, help="qa: add the positional control (the initial "
                              "token and the N-1 most recent)")
    grid_max: int = option(256, help="qa: largest N of the power-of-two grid")
    nstar: bool = option(True, help="search N* (false: answers and support only)")
    lengths: tuple[int, ...] = option((256, 512, 1024, 2048), help="context: lengths L "
                                      "of the nested windows")
    tail: int = option(128, help="context: final targets scored at every L (tail128)")

    def __post_init__(self) -> None:
        s = object.__setattr__
        if self.corpus is None:  # WikiText-2's test articles: documents long enough for L
            with contextlib.suppress(ConfigError):
                s(self, "corpus", asset("wikitext-2-test", "--corpus"))
        super().__post_init__()
        v.one_of("probe", self.probe, COMPETITION_PROBES)
        s(self, "rankings", v.choices("rankings", self.rankings, RULES))
        flags = v.as_tuple(self.renormalize, "renormalize")
        if any(isinstance(x, str) and x.strip().lower() == "both" for x in flags):
            flags = (False, True)
        s(self, "renormalize", v.flags("renormalize", flags))
        if self.taus is not None:
            taus = tuple(v.number("taus", t, low=0.0, low_open=True)
                         for t in v.as_tuple(self.taus, "taus"))
            if not taus:
                raise ConfigError("taus: expected at least one threshold")
            if self.probe == "context" and max(taus) >= 1.0:
                raise ConfigError(f"taus: expected relative thresholds in (0, 1) for the "
                                  f"context probe (5% is 0.05), got {max(taus)}")
            s(self, "taus", tuple(dict.fromkeys(taus)))
        s(self, "bootstrap", v.integer("bootstrap", self.bootstrap, low=0))
        s(self, "backgrounds", tuple(dict.fromkeys(
            v.integers("backgrounds", self.backgrounds, low=0))))
        if not self.backgrounds:
            raise ConfigError("backgrounds: expected at least one background length")
        s(self, "n_episodes", v.integer("n_episodes", self.n_episodes, low=1))
        facts = tuple(v.integer("facts", x, low=1) for x in v.as_tuple(self.facts, "facts"))
        if len(facts) != 2 or facts[0] > facts[1]:
            raise ConfigError(f"facts: expected MIN,MAX with 1 <= MIN <= MAX, got "
                              f"{','.join(map(str, facts))}")
        s(self, "facts", tuple(facts))
        v.one_of("prompt_format", self.prompt_format, ("auto", "plain", "chat"))
        _check_answer_prefix(self.answer_prefix)
        v.text("babilong", self.babilong, optional=True)
        s(self, "grid_max", v.integer("grid_max", self.grid_max, low=1))
        for name in ("positional", "nstar"):
            value = getattr(self, name)
            given = v.flags(name, (value,) if isinstance(value, bool) else value)
            if len(given) != 1:
                raise ConfigError(f"{name}: expected true or false, got {value!r}")
            s(self, name, given[0])
        s(self, "lengths", tuple(sorted(set(v.integers("lengths", self.lengths, low=2)))))
        if not self.lengths:
            raise ConfigError("lengths: expected at least one context length")
        s(self, "tail", v.integer("tail", self.tail, low=1))
        if self.probe == "context" and self.tail >= min(self.lengths):
            raise ConfigError(f"tail: expected fewer scored targets than the shortest "
                              f"length {min(self.lengths)}, got {self.tail}")

    @property
    def effective_taus(self) -> tuple[float, ...]:
        if self.taus is not None:
            return self.taus
        return (0.10, 0.20) if self.probe == "qa" else (0.01, 0.05, 0.10)

    @property
    def windows_needed(self) -> int:
        return 1  # the runner's window check; the probes cut their own prompts

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["effective_taus"] = list(self.effective_taus)
        return d


def _check_answer_prefix(prefix: object) -> None:
    """One line for an answer prefix the qa prompt cannot use: not text, padded with
    spaces (the candidates bring their own), or a field other than {person}."""
    import string

    if not isinstance(prefix, str):
        raise ConfigError(f"answer_prefix: expected text, got {prefix!r}")
    if prefix != prefix.strip():
        raise ConfigError(f"answer_prefix: expected no leading or trailing spaces (the "
                          f"candidates bring their own), got {prefix!r}")
    try:
        fields_ = {f for _, f, _, _ in string.Formatter().parse(prefix) if f is not None}
    except ValueError as error:
        raise ConfigError(f"answer_prefix: {error} in {prefix!r}") from None
    if fields_ - {"person"}:
        raise ConfigError(f"answer_prefix: only {{person}} may be filled in, got "
                          f"{prefix!r}")


def _probe_default(probe: str):
    """A ``CompetitionConfig`` subclass whose probe is ``probe`` (and must stay so)."""

    def post_init(self) -> None:
        CompetitionConfig.__post_init__(self)
        if self.probe != probe:
            raise ConfigError(f"probe: the {self.command} run is the {probe!r} probe, got "
                              f"{self.probe!r}")

    return post_init


@command("competition-qa", help="the qa probe of competition, as a study part",
         work="attngeom.probes.competition_command:Competition",
         summary="attngeom.report.text:competition_summary", run_dir="qa", loss=True,
         study="qa")
@dataclass(frozen=True)
class CompetitionQAConfig(CompetitionConfig):
    """``competition --probe qa`` under its study name ``qa``."""

    probe: str = option("qa", help="the probe (qa only)")
    __post_init__ = _probe_default("qa")


@command("competition-context", help="the context probe of competition, as a study part",
         work="attngeom.probes.competition_command:Competition",
         summary="attngeom.report.text:competition_summary", run_dir="context", loss=True,
         study="context")
@dataclass(frozen=True)
class CompetitionContextConfig(CompetitionConfig):
    """``competition --probe context`` under its study name ``context``."""

    probe: str = option("context", help="the probe (context only)")
    __post_init__ = _probe_default("context")


@command("restrict-local", help="localised top-N restriction: one layer, then one head, "
         "at a time", work="attngeom.engine.loss_runs:Restrict",
         summary="attngeom.report.text:restrict_summary", run_dir="restrict-local",
         loss=True, study="local_restriction")
@dataclass(frozen=True)
class LocalRestrictConfig(RestrictConfig):
    """``restrict --scope head`` under its own name, so that a study runs it beside
    the whole-model restriction (study name ``local_restriction``)."""

    scope: str = option("head", help="layer: N keys in one layer at a time; head: the "
                        "layer scan, then each head of the most sensitive layers")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scope == "model":
            raise ConfigError("scope: restrict-local scans layers or heads (layer, head); "
                              "the whole model is restrict's")

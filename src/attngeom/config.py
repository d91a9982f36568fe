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
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import ClassVar

from attngeom import validate as v
from attngeom.assets import DEFAULT_CORPUS, DEFAULT_MODEL, asset
from attngeom.errors import ConfigError
from attngeom.names import (
    ANALYSES,
    ANALYSIS_ALIASES,
    DISTANCES,
    DOC_BOUNDARIES,
    DTYPES,
    HEAD_TYPES,
    ORACLE,
    PROBES,
    QUANTIZATIONS,
    RANDOM_CONTROL,
    RANKER_REGIMES,
    RANKERS,
    RANKINGS,
    REGIME_RULES,
    RESTRICT_SCOPES,
    RULES,
    STEPS,
    VARIANTS,
)
from attngeom.registry import Registry
from attngeom.validate import (
    Check,
    Flag,
    Flags,
    HeadPairs,
    Integer,
    Layers,
    Lengths,
    ModelShape,
    Number,
    OneOf,
    Sizes,
    SubsetOf,
    Text,
    WindowLength,
)

__all__ = [
    "COMMANDS", "AnalysisConfig", "CommandSpec", "PruneConfig", "RestrictConfig", "RunConfig",
    "ScanConfig",
    "command", "command_spec", "loss_commands", "option", "option_fields",
]


def option(default=MISSING, *, help: str, check: Check | None = None, factory=None,
           fingerprint: bool | str = True, metavar: str | None = None, cli: bool = True):
    """A configuration field with its help text (shown by ``--help`` with the default)
    and its constraint (``check``, ``attngeom.validate``): applied when the configuration
    is built, and against the model's shape before any weight loads (``check_config``).

    ``fingerprint=False`` marks fields that change how a run is computed but not its
    numbers (device, batch sizes), which a resumed or repeated run may change.
    ``fingerprint="unless_default"``: a field added after runs were made, which enters
    the fingerprint only when it differs from its default, so those runs keep theirs.
    """
    meta = {"help": help, "fingerprint": fingerprint, "metavar": metavar, "cli": cli,
            "check": check}
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
    # (run table, study table): its tables' names among a study's combined tables where
    # another part writes the same table for the same model and corpus
    study_tables: tuple[tuple[str, str], ...] = ()

    @property
    def folder(self) -> str:
        return self.run_dir or self.name


COMMANDS: Registry[CommandSpec] = Registry("command", option="command")


def command(name: str, *, help: str, work: str, **spec):
    """Class decorator: register the configuration class of run command ``name``
    (``CommandSpec`` fields as keywords). Adding a command is this declaration, its
    configuration class and its ``work`` (``docs/extending.md``)."""

    def register(cls):
        cls.command = name
        COMMANDS.register(name, CommandSpec(name=name, config=cls, help=help, work=work,
                                            **spec))
        return cls

    return register


def command_spec(name: str) -> CommandSpec:
    """The registered command ``name`` (a did-you-mean ``ConfigError`` otherwise)."""
    return COMMANDS[name]


def loss_commands() -> tuple[str, ...]:
    """The commands that measure next-token loss (they need a causal LM)."""
    return tuple(n for n, c in COMMANDS.items() if c.loss)


@dataclass(frozen=True)
class RunConfig:
    """What every command shares: which model, which corpus, which windows, where."""

    command: ClassVar[str] = ""

    model: str | None = option(
        None, help="hub id, local model directory, .gguf file or asset:NAME (default: the "
        "bundled stories260K)", metavar="MODEL")
    corpus: str | None = option(
        None, help="a .txt, .jsonl or .parquet file, a folder of them, asset:NAME, or "
        "wikitext-103, wikitext-2, openwebtext (default: the bundled TinyStories sample)",
        metavar="CORPUS")
    window_length: int = option(256, check=WindowLength(),
                                help="tokens per window (T), special tokens included")
    start_window: int = option(0, check=Integer(0),
                               help="index of the first window taken from the corpus")
    windows_per_document: int | None = option(
        None, check=Integer(1, none=True), metavar="K",
        help="cut each document alone and take its first K windows (a document too short "
        "for one gives none; default: documents joined into one stream)")
    sample_documents: int | None = option(
        None, check=Integer(1, none=True),
        help="draw this many documents from the corpus by a hash of each document and "
        "the seed, then cut windows from them (default: every document, in corpus order)")
    document_protocol: str = option(
        "stream", check=OneOf(("stream", "fixed")),
        help="how windows are made: stream (documents joined, cut into consecutive windows) "
        "or fixed (the follow-up's protocol: one window per document at a hashed offset, the "
        "initial token first, the first N_DOCUMENTS documents of at least T-1 tokens in hash "
        "order)")
    n_documents: int = option(50, check=Integer(1),
                              help="documents of the fixed protocol (one window each)")
    seed: int = option(0, check=Integer(),
                       help="seed of the random control, bootstrap and seeded rankers")
    device: str = option("cpu", check=Text(), fingerprint=False,
                         help="torch device (cpu, cuda, cuda:1, mps)")
    dtype: str = option("float32", check=OneOf(DTYPES), help=f"model dtype ({', '.join(DTYPES)})")
    quantization: str = option(
        "none", check=OneOf(QUANTIZATIONS), fingerprint="unless_default",
        help="weights through bitsandbytes on a CUDA GPU: 8bit (LLM.int8, outlier threshold "
        "6.0, as the follow-up ran Mistral-Small-24B), 4bit (nf4) or none; activations and "
        "attention stay in --dtype")
    batch_size: int = option(4, check=Integer(1), fingerprint=False,
                             help="windows per forward pass")
    device_map: str | None = option(
        None, check=Text(optional=True), fingerprint=False,
        help="'auto': spread a model too large for one GPU over the GPUs of this machine "
        "(transformers device_map; then one process, not data-parallel)")
    text_column: str = option("text", check=Text(),
                              help="text column of .jsonl / .parquet corpora")
    separator: str | None = option(
        None, check=Text(optional=True),
        help="line that separates documents in a .txt corpus (default: <|endoftext|> if "
        "present, else blank lines)")
    doc_boundary: str = option(
        "auto", check=OneOf(DOC_BOUNDARIES),
        help="what goes between documents: auto (the tokenizer's training convention), bos, "
        "eos, sep or none")
    boundary_token: str | None = option(
        None, help="the token placed at document boundaries instead of the tokenizer's own")
    model_label: str | None = option(None, help="model name in the tables (default: from MODEL)")
    corpus_label: str | None = option(None, help="corpus name in the tables (default: from "
                                      "CORPUS)")

    def __post_init__(self) -> None:
        s = object.__setattr__
        for name, default in (("model", DEFAULT_MODEL), ("corpus", self.default_corpus)):
            value = getattr(self, name)
            if value is None:
                # resolved now where the assets are at hand; else when the run starts
                with contextlib.suppress(ConfigError):
                    s(self, name, asset(default, f"--{name}"))
            else:
                s(self, name, _source(name, value))
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                s(self, f.name, check.clean(f.name, getattr(self, f.name)))
        if self.document_protocol == "fixed" and (self.windows_per_document
                                                  or self.sample_documents):
            raise ConfigError("document_protocol: 'fixed' chooses its own documents and "
                              "windows; drop windows_per_document and sample_documents")
        v.boundary_options(self.doc_boundary, self.boundary_token, DOC_BOUNDARIES)
        self.check_options()

    default_corpus: ClassVar[str] = DEFAULT_CORPUS
    reads_windows: ClassVar[bool] = True  # the runner cuts the corpus into its windows

    def check_options(self) -> None:
        """The checks that read several options at once (a subclass adds its own)."""

    def check_model(self, shape: ModelShape) -> None:
        """The checks against the model that read several options at once (after every
        option's own ``against``; ``validate.check_config`` runs both)."""

    # ------------------------------------------------------------------ use

    def with_(self, **changes) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def require_model_and_corpus(self) -> None:
        """Raise the one-line "pass --model" error where no default could be found."""
        for name, default in (("model", DEFAULT_MODEL), ("corpus", self.default_corpus)):
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


def _source(name: str, value) -> str:
    """A model or corpus as given; ``asset:NAME`` is a bundled asset (one line listing the
    known ones when NAME is not)."""
    text = str(value)
    if text.startswith("asset:"):
        return asset(text.split(":", 1)[1], f"--{name}")
    return text


class _QueryMode(Check):
    def clean(self, name, value):
        v.parse_query_mode(value)
        return value


class _Analyses(Check):
    """Analyses by name (the old names of ``ANALYSIS_ALIASES`` read as the new ones)."""

    def clean(self, name, value):
        given = tuple(ANALYSIS_ALIASES.get(a, a) if isinstance(a, str) else a
                      for a in v.as_tuple(value, name))
        out = ANALYSES.choices(given, name)
        for a in out:
            missing = [x for x in (ANALYSES.meta(a) or {}).get("needs", ()) if x not in out]
            if missing:
                raise ConfigError(f"{name}: {a!r} needs {', '.join(map(repr, missing))}")
        return out


@command("analyze", help="top-N geometry, sink, taxonomy, bounds and assumptions of a model",
         work="attngeom.engine.analyze:Analyze",
         summary="attngeom.report.text:analyze_summary")
@dataclass(frozen=True)
class AnalysisConfig(RunConfig):
    """``attngeom analyze``: top-N geometry, sink, taxonomy, bounds and assumptions."""

    n_windows: int | None = option(32, check=Integer(1, zero_none=True),
                                   help="windows to analyse (0 or none: every window)")
    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32), check=Sizes(within_window=True),
                                     help="set sizes N (at most the window length)")
    query_mode: str = option("final", check=_QueryMode(),
                             help="analysed queries: final (the last content token), all, or "
                             "stride:k")
    rules: tuple[str, ...] = option(RULES.names(), check=SubsetOf(RULES),
                                    help="selection rules")
    distances: tuple[str, ...] = option(("euclidean",), check=SubsetOf(DISTANCES),
                                        help=f"distances ({', '.join(DISTANCES)})")
    variants: tuple[str, ...] = option(VARIANTS, check=SubsetOf(VARIANTS),
                                       help="universes: full, and no_sink (the sink dropped "
                                       "from the universe)")
    analyses: tuple[str, ...] = option(
        tuple(a for a in ANALYSES if (ANALYSES.meta(a) or {}).get("default", True)),
        check=_Analyses(), help=f"analyses to run (of {', '.join(ANALYSES)})")
    repeats: int | None = option(None, check=Integer(1, none=True),
                                 help="random-control repeats (default: 16 for final queries, "
                                 "2 otherwise)")
    chunk_size: int | None = option(None, check=Integer(1, none=True), fingerprint=False,
                                    help="query rows per chunk (default: as many as "
                                    "--memory-budget allows)")
    memory_budget: float = option(0.25, check=Number(1e-6), fingerprint=False,
                                  help="GB of captured query rows per window of a batch; sets "
                                  "the query chunk when --chunk-size is not given")
    compile: str = option("auto", check=OneOf(("auto", "on", "off")), fingerprint=False,
                          help="torch.compile the exact kernels: on, off, or auto (on for "
                          "all/stride queries on a GPU, for all, stride:k with k <= 4, or "
                          "final queries over >= 256 windows on CPU); tables are identical "
                          "either way")
    bootstrap: int = option(1000, check=Integer(0),
                            help="window-bootstrap replicates of the intervals and the label "
                            "stability (0: none)")
    regime_rule: str = option("single", check=OneOf(REGIME_RULES),
                              help="head regime rule: single (plurality of self, sink and the "
                              "most frequent single other source) or lumped")
    sink_min_occurrences: int = option(5, check=Integer(1),
                                       help="a token is a sink of a head only when analysed "
                                       "queries saw it at least this many times")
    sink_min_windows: int = option(3, check=Integer(1),
                                   help="a sink token must also occur in at least this many "
                                   "windows")
    head_stride: int = option(8, check=Integer(1), metavar="K",
                              help="head_scores: rows every K positions back from the final "
                              "one")
    streaming_window: int = option(64, check=Integer(1),
                                   help="head_scores: W of the streaming proxy (the head sees "
                                   "the sink and the W most recent tokens)")

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

    window_length: int = option(128, check=WindowLength(),
                                help="tokens per window (T), special tokens included; shorter "
                                "than analyze's 256 because these commands run a forward pass "
                                "per setting (per head for scan-heads)")
    batch_size: int = option(8, check=Integer(1), fingerprint=False,
                             help="windows per forward pass; larger than analyze's 4, which "
                             "keeps every layer's attention rows of a batch")
    n_eval_windows: int = option(8, check=Integer(1),
                                 help="held-out windows the NLL is measured on")

    @property
    def windows_needed(self) -> int:
        return self.n_rank_windows_needed + self.n_eval_windows

    @property
    def n_rank_windows_needed(self) -> int:
        return 0


class _Orders(Check):
    """Regime orders of the taxonomy ranker: None (the default order), "all", or orders
    written ``Mixer>Reset>Retriever``."""

    def clean(self, name, value):
        if value is None:
            return None
        items = list(v.as_tuple(value, name))
        if items == ["all"]:
            return tuple(">".join(p) for p in itertools.permutations(RANKER_REGIMES))
        if len(items) == 3 and all(isinstance(x, str) and ">" not in x for x in items):
            items = [">".join(items)]  # one order written as three names
        out = []
        for item in items:
            names = tuple(item.split(">")) if isinstance(item, str) else tuple(item)
            if sorted(names) != sorted(RANKER_REGIMES):
                raise ConfigError(f"{name}: expected 'all' or permutations of "
                                  f"{'>'.join(RANKER_REGIMES)}, got {item!r}")
            out.append(">".join(names))
        if not out:
            raise ConfigError(f"{name}: expected 'all' or at least one regime order")
        return tuple(dict.fromkeys(out))


class _Fractions(Check):
    def clean(self, name, value):
        return v.fractions(name, value)


class _Integers(Check):
    def clean(self, name, value):
        return v.integers(name, value)


@command("prune", help="keep-fraction pruning sweep per head ranker",
         work="attngeom.engine.loss_runs:Prune",
         summary="attngeom.report.text:prune_summary", loss=True, study="pruning")
@dataclass(frozen=True)
class PruneConfig(_InterventionConfig):
    """``attngeom prune``: keep-fraction pruning sweep per head ranker (method §9)."""

    rankers: tuple[str, ...] = option(RANKERS.names(), check=SubsetOf(RANKERS),
                                      help="head rankers")
    keep_fractions: tuple[float, ...] = option((1.0, 0.9, 0.75, 0.5, 0.25), check=_Fractions(),
                                               help="fractions of heads kept")
    seeds: tuple[int, ...] = option((0, 1, 2), check=_Integers(),
                                    help="seeds of the random ranker")
    orders: tuple[str, ...] | None = option(
        None, check=_Orders(),
        help="regime orders of the taxonomy ranker: all, or orders like Reset>Mixer>Retriever "
        "(default: Mixer>Reset>Retriever)")
    n_rank_windows: int = option(8, check=Integer(1),
                                 help="windows the rankers rank on (before the evaluation "
                                 "windows, disjoint from them)")

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

    threshold: float = option(0.05, check=Number(0.0, low_open=True),
                              help="relative delta-NLL above which a head is critical")


class _RelativeTaus(Check):
    """Relative thresholds in (0, 1), duplicates dropped, at least one."""

    def clean(self, name, value):
        taus = tuple(v.number(name, t) for t in v.as_tuple(value, name))
        bad = [t for t in taus if not 0.0 < t < 1.0]
        if bad or not taus:
            raise ConfigError(f"{name}: expected relative thresholds in (0, 1) (5% is 0.05), "
                              f"got {bad[0] if bad else 'none'}")
        return tuple(dict.fromkeys(taus))


class _AloneTau(Check):
    """None, or one relative threshold in (0, 1)."""

    def clean(self, name, value):
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return _RelativeTaus().clean(name, [v.number(name, value)])[0]


def _policy_budgets(rankings: tuple[str, ...], sizes, name: str) -> None:
    """A budget below a ranking's fixed part (the keys every budget holds) is refused."""
    for ranking in rankings:
        fixed = int((RANKINGS.meta(ranking) or {}).get("fixed", 0))
        small = [n for n in sizes if n < fixed]
        if small:
            raise ConfigError(f"{name}: the {ranking} ranking keeps {fixed} fixed keys, so "
                              f"every N must be >= {fixed}, got {small[0]}")


def _loss_rankings(rankings: tuple[str, ...]) -> None:
    """Rankings that choose once at the end of a prompt cannot restrict an LM loss."""
    prefill = [r for r in rankings if (RANKINGS.meta(r) or {}).get("prefill_only")]
    if prefill:
        raise ConfigError(f"rankings: {prefill[0]} compresses a prompt once, for its final "
                          "query only (competition --probe qa); the LM loss restricts every "
                          "query")


@command("restrict", help="keep only the top-N attention entries per query; N*_tau",
         work="attngeom.engine.loss_runs:Restrict",
         summary="attngeom.report.text:restrict_summary", loss=True, study="restriction")
@dataclass(frozen=True)
class RestrictConfig(_InterventionConfig):
    """``attngeom restrict``: top-N attention restriction and N*_tau (method §9)."""

    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32, 64), check=Sizes(),
                                     help="kept entries N per query: the search's first round "
                                     "(those below the window length)")
    scopes: tuple[str, ...] = option(("model",), check=SubsetOf(RESTRICT_SCOPES),
                                     help="what is restricted at once: model, layer (each "
                                     "layer alone), head (each head alone)")
    layers: tuple[int, ...] | None = option(None, check=Layers(),
                                            help="layers of the layer and head scopes and of "
                                            "the localised scan (default: all)")
    heads: tuple[tuple[int, int], ...] | None = option(
        None, check=HeadPairs(), metavar="L:H,...",
        help="heads of the head scope as LAYER:HEAD,... (default: all heads of LAYERS)")
    rankings: tuple[str, ...] = option(("attention",), check=SubsetOf(RANKINGS),
                                       help=f"which N keys are kept: {', '.join(RANKINGS)}")
    renormalize: tuple[bool, ...] = option((True, False), check=Flags(),
                                           help="renormalise the kept probabilities: true, "
                                           "false or both")
    taus: tuple[float, ...] = option((0.01, 0.05, 0.10), check=_RelativeTaus(),
                                     help="relative delta-NLL thresholds of N*_tau, each in "
                                     "(0, 1)")
    search: str = option("adaptive", check=OneOf(("adaptive", "grid")),
                         help="N*_tau: adaptive (the follow-up's integer search: grid, "
                         "narrowing, refinement) or grid (smallest N of the grid)")
    step: str = option("interpolate", check=OneOf(STEPS), fingerprint="unless_default",
                       help="how the adaptive search narrows a bracket: bisect (the "
                       "follow-up's midpoints) or interpolate (predicts N* from the log-log "
                       "curve: fewer evaluations, the same N* where the loss is monotone)")
    refine: int = option(3, check=Integer(0),
                         help="integers below the bisection's pass tried upward")
    bootstrap: int = option(1000, check=Integer(0),
                            help="document bootstrap replicates of N*'s interval (0: none)")
    alone_tau: float | None = option(
        None, check=_AloneTau(), fingerprint="unless_default",
        help="then restrict each head of --layers (or --heads) alone, under every ranking, "
        "at the attention oracle's whole-model N*_tau for this tau (one of --taus): the "
        "restrict_alone table (default: not run)")
    # the localised scan's options: ``restrict-local`` shows them (``restrict`` computes
    # N* over the scopes of --scopes; the API may still pass scope= here)
    scope: str = option("model", check=OneOf(RESTRICT_SCOPES), cli=False,
                        help="model: N*_tau of the scopes above; layer: the localised scan, N "
                        "keys in one layer at a time; head: the layer scan, then each head "
                        "of the most sensitive layers")
    scan_n: tuple[int, ...] = option((16,), check=Sizes(), cli=False,
                                     help="kept entries N of the localised scan")
    scan_top_layers: int = option(2, check=Integer(0), cli=False,
                                  help="layers whose heads the head scan restricts one at a "
                                  "time (the most sensitive of the layer scan)")

    def check_options(self) -> None:
        super().check_options()
        _loss_rankings(self.rankings)
        if self.scope != "model":
            _policy_budgets(self.rankings, self.scan_n, "scan_n")
        elif self.n_grid != type(self).__dataclass_fields__["n_grid"].default:
            # a grid given explicitly is checked; the default one starts at N = 1, and its
            # Ns below a ranking's fixed part fail the search without a forward
            _policy_budgets(self.rankings, self.n_grid, "n_grid")
        if self.scope == "head" and self.scan_top_layers < 1:
            raise ConfigError("scope head: expected scan_top_layers >= 1 (the layers whose "
                              "heads are scanned), got 0: no layer to scan")
        if self.scope != "model" and max(self.scan_n) >= self.window_length:
            raise ConfigError(f"scan_n: expected N below the window length "
                              f"{self.window_length} (N >= T restricts nothing), got "
                              f"{max(self.scan_n)}")
        if self.alone_tau is not None:
            _alone_options(self)
        if self.heads is not None and self.layers is not None:
            outside = [h for h in self.heads if h[0] not in self.layers]
            if outside:
                raise ConfigError(f"heads: expected every head's layer in layers="
                                  f"{list(self.layers)}, got {outside[0]}")

    def check_model(self, shape: ModelShape) -> None:
        scanned = len(self.layers) if self.layers is not None else shape.layers
        if self.scope == "head" and self.scan_top_layers > scanned:
            raise ConfigError(f"scan_top_layers: expected at most the {scanned} layers the "
                              f"layer scan covers (valid: 1..{scanned}), got "
                              f"{self.scan_top_layers}")


def _alone_options(cfg: RestrictConfig) -> None:
    """The heads alone run at the oracle's N*_tau of the whole-model searches."""
    if cfg.scope != "model" or "model" not in cfg.scopes:
        raise ConfigError("alone_tau: each head alone runs at the whole-model N* of "
                          "restrict --scopes model (restrict-local scans instead)")
    if cfg.alone_tau not in cfg.taus:
        raise ConfigError(f"alone_tau: expected one of the taus "
                          f"{','.join(f'{t:g}' for t in cfg.taus)}, got {cfg.alone_tau:g}")
    if ORACLE not in cfg.rankings:
        raise ConfigError(f"alone_tau: each head alone runs at the {ORACLE} oracle's N*: "
                          f"add {ORACLE} to the rankings")


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


# --------------------------------------------------------------------------- atlas, probes
# The head atlas, the competition probes and the localised restriction as run commands
# (their work in probes/atlas_command.py, probes/competition_command.py and
# engine/loss_runs.py).

# the needle's cue (" The secret code is") and the cue again at the end take about this
# many tokens with any tokenizer; a needle context must hold them and the needle
_CUE_TOKENS = 16


class _Thresholds(Check):
    """Head-type thresholds written ``NAME=VALUE`` (``sink=0.3``), names of
    ``names.HEAD_TYPES``."""

    def clean(self, name, value):
        out = []
        for item in v.as_tuple(value, name):
            key, sep, number = str(item).partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"{name}: expected NAME=VALUE items (sink=0.3), got {item!r}")
            HEAD_TYPES.check(key.strip(), name)
            out.append(f"{key.strip()}={v.number(name, number.strip())}")
        return tuple(out)


@command("atlas", help="head atlas: the field's head types scored beside the regimes",
         work="attngeom.probes.atlas_command:Atlas",
         summary="attngeom.report.text:atlas_summary", study="atlas",
         # the taxonomy the atlas computes in its own run, apart from analyze's on the
         # same model and corpus
         study_tables=(("summary", "atlas_summary"), ("taxonomy", "atlas_taxonomy")))
@dataclass(frozen=True)
class AtlasConfig(RunConfig):
    """``attngeom atlas``: previous-token, duplicate-token, induction, echo, sink,
    retrieval and streaming scores of every head, with the taxonomy of the same windows
    computed in the same run, and the regime x head type tables (issue 32)."""

    n_windows: int = option(8, check=Integer(1), help="corpus windows (scores and taxonomy)")
    query_mode: str = option("final", check=_QueryMode(),
                             help="queries of the taxonomy: final, all or stride:k")
    n_grid: tuple[int, ...] = option((1, 2, 4, 8, 16, 32), check=Sizes(within_window=True),
                                     help="set sizes N of the F_N of each head type")
    bootstrap: int = option(200, check=Integer(0),
                            help="window-bootstrap replicates of the taxonomy's stability "
                            "(0: none)")
    regime_rule: str = option("single", check=OneOf(REGIME_RULES),
                              help="head regime rule: single or lumped")
    query_stride: int = option(8, check=Integer(1), metavar="K",
                               help="corpus rows every K positions for the head scores (the "
                               "last included)")
    streaming_window: int = option(64, check=Integer(1),
                                   help="W of the streaming proxy: the head sees the sink and "
                                   "the W most recent tokens")
    n_repeats: int = option(4, check=Integer(1),
                            help="repeated random-token prompts (induction, echo)")
    repeat_length: int = option(64, check=Integer(1),
                                help="random tokens repeated in each prompt (the prompt is "
                                "1 + 2 x this long)")
    n_needles: int = option(4, check=Integer(1),
                            help="needle-in-a-haystack trials (retrieval score)")
    needle_length: int = option(6, check=Integer(1), help="tokens of each needle")
    needle_contexts: tuple[int, ...] | None = option(
        None, help="context lengths of the needle prompts (default: T/2 and T/4)")
    recovered_share: float = option(0.5, check=Number(0.0, 1.0),
                                    help="share of a needle's tokens the model must copy for "
                                    "a trial to count")
    thresholds: tuple[str, ...] = option((), check=_Thresholds(), metavar="NAME=VALUE,...",
                                         help="head-type thresholds other than the published "
                                         "ones, as NAME=VALUE,... (sink=0.3)")

    def check_options(self) -> None:
        super().check_options()
        if self.needle_contexts is not None:
            object.__setattr__(self, "needle_contexts", v.integers(
                "needle_contexts", self.needle_contexts, low=2))
        contexts = self.effective_needle_contexts
        too_long = [c for c in contexts if c > self.window_length]
        if too_long:
            raise ConfigError(f"needle_contexts: expected lengths up to the window length "
                              f"{self.window_length} (the haystack is cut from a window), "
                              f"got {too_long[0]}")
        room = min(contexts) - _CUE_TOKENS
        if self.needle_length > room:
            raise ConfigError(f"needle_length: expected a needle that fits the shortest "
                              f"needle context {min(contexts)} with its cue (valid: "
                              f"1..{max(room, 0)}), got {self.needle_length}")

    def check_model(self, shape: ModelShape) -> None:
        limit = shape.max_positions
        if limit is not None and 1 + 2 * self.repeat_length > limit:
            raise ConfigError(f"repeat_length: expected a repeated prompt (1 + 2 x length) "
                              f"within {shape.name}'s {limit} positions (valid: "
                              f"1..{(limit - 1) // 2}), got {self.repeat_length}")

    @property
    def effective_needle_contexts(self) -> tuple[int, ...]:
        if self.needle_contexts is not None:
            return tuple(self.needle_contexts)
        return tuple(dict.fromkeys((max(2, self.window_length // 2),
                                    max(2, self.window_length // 4))))

    @property
    def windows_needed(self) -> int:
        return self.n_windows


class _AnswerPrefix(Check):
    """An answer prefix the qa prompt can use: text, not padded with spaces (the
    candidates bring their own), no field other than {person}."""

    def clean(self, name, value):
        import string

        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected text, got {value!r}")
        if value != value.strip():
            raise ConfigError(f"{name}: expected no leading or trailing spaces (the "
                              f"candidates bring their own), got {value!r}")
        try:
            found = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
        except ValueError as error:
            raise ConfigError(f"{name}: {error} in {value!r}") from None
        if found - {"person"}:
            raise ConfigError(f"{name}: only {{person}} may be filled in, got {value!r}")
        return value


class _Taus(Check):
    """N* thresholds, each > 0 (the probe decides their unit), or None (its default)."""

    def clean(self, name, value):
        if value is None:
            return None
        taus = tuple(v.number(name, t, low=0.0, low_open=True) for t in v.as_tuple(value, name))
        if not taus:
            raise ConfigError(f"{name}: expected at least one threshold")
        return tuple(dict.fromkeys(taus))


@command("competition", help="retrieval under competition: the qa, context and kept probes",
         work="attngeom.probes.competition:Competition",
         summary="attngeom.report.text:competition_summary", loss=True)
@dataclass(frozen=True)
class CompetitionConfig(RunConfig):
    """``attngeom competition --probe qa|context|kept`` (issue 31): generated bAbI qa1 with
    corpus background, or a nested context-length sweep; N* per setting; or the geometry
    of what each ranking keeps (issue 39). The corpus is the background (qa) or the
    documents (context, kept); by default WikiText-2's test articles."""

    default_corpus: ClassVar[str] = "wikitext-2-test"
    reads_windows: ClassVar[bool] = False  # the probes cut their own prompts

    window_length: int = option(256, check=Integer(2), cli=False,
                                help="not used: the probes cut their own prompts (qa) and "
                                "nested windows (context: --lengths)")

    corpus: str | None = option(
        None, help="a .txt, .jsonl or .parquet file, a folder of them, asset:NAME, or "
        "wikitext-103, wikitext-2, openwebtext: the background (qa) or the documents "
        "(context) (default: the bundled WikiText-2 test articles)", metavar="CORPUS")
    probe: str = option("qa", check=OneOf(PROBES),
                        help="qa (bAbI qa1 under background text), context (nested "
                        "context-length sweep) or kept (the geometry of what each ranking "
                        "keeps at the windows' final queries)")
    rankings: tuple[str, ...] = option(("attention",), check=SubsetOf(RANKINGS),
                                       help=f"which N keys are kept: {', '.join(RANKINGS)}")
    renormalize: tuple[bool, ...] = option((False,), check=Flags(),
                                           help="renormalise the kept probabilities: true, "
                                           "false or both")
    taus: tuple[float, ...] | None = option(
        None, check=_Taus(),
        help="N* thresholds: qa, answer-loss increase in nats (default 0.1,0.2); context, "
        "relative NLL increase in (0, 1) (default 0.01,0.05,0.1)")
    bootstrap: int = option(1000, check=Integer(0),
                            help="bootstrap replicates over examples / documents (0: none)")
    backgrounds: tuple[int, ...] | None = option(
        None, check=Lengths(0, positions=False, none=True),
        help="qa: tokens of background text around the facts (default: 0,256,512,1024, "
        "those whose prompts fit the model's positions)")
    n_episodes: int = option(60, check=Integer(1), help="qa: generated episodes per background")
    facts: tuple[int, ...] = option((2, 6), metavar="MIN,MAX",
                                    help="qa: fewest and most movement facts per episode")
    prompt_format: str = option("auto", check=OneOf(("auto", "plain", "chat")),
                                help="qa: plain, chat (the model's chat template) or auto "
                                "(chat where the tokenizer has one)")
    answer_prefix: str = option("", check=_AnswerPrefix(), fingerprint="unless_default",
                                help="qa: words that open the answer before the scored "
                                "position, {person} the asked person (e.g. '{person} is in "
                                "the' for an instruct model's chat turn)")
    babilong: str | None = option(None, check=Text(optional=True),
                                  help="qa: real BABILong rows (a dataset split name or a "
                                  "local .jsonl) instead of generated episodes")
    positional: bool = option(True, check=Flag(),
                              help="qa: add the positional control (the initial token and the "
                              "N-1 most recent)")
    grid_max: int = option(256, check=Integer(1),
                           help="qa: largest N of the power-of-two grid")
    nstar: bool = option(True, check=Flag(), help="search N* (false: answers, support and "
                         "the budgets only)")
    budgets: tuple[int, ...] = option(
        (16, 64, 256), check=Sizes(),
        help="qa: budgets N every selection is also evaluated at (accuracy, answer loss, "
        "support recall of the kept set); kept: the N of the kept sets compared (a default "
        "N below a ranking's fixed part is left out for it)")
    step: str = option("interpolate", check=OneOf(STEPS), fingerprint="unless_default",
                       help="how the N* search narrows a bracket: bisect (the follow-up's "
                       "midpoints) or interpolate (predicts N* from the log-log curve: fewer "
                       "evaluations, the same N* where the loss is monotone)")
    lengths: tuple[int, ...] | None = option(
        None, check=Lengths(2, increasing=True, positions=False, none=True),
        help="context, kept: lengths L of the nested windows, increasing (default: "
        "256,512,1024,2048, those within the model's positions)")
    tail: int = option(128, check=Integer(1),
                       help="context: final targets scored at every L (tail128)")

    def check_options(self) -> None:
        super().check_options()
        facts = tuple(v.integer("facts", x, low=1) for x in v.as_tuple(self.facts, "facts"))
        if len(facts) != 2 or facts[0] > facts[1]:
            raise ConfigError(f"facts: expected MIN,MAX with 1 <= MIN <= MAX, got "
                              f"{','.join(map(str, facts))}")
        object.__setattr__(self, "facts", facts)
        if self.budgets != (16, 64, 256):  # the defaults leave out what a ranking cannot
            _policy_budgets(self.rankings, self.budgets, "budgets")
        if self.probe == "context":
            if self.taus is not None and max(self.taus) >= 1.0:
                raise ConfigError(f"taus: expected relative thresholds in (0, 1) for the "
                                  f"context probe (5% is 0.05), got {max(self.taus)}")
            if self.lengths is not None and self.tail >= min(self.lengths):
                raise ConfigError(f"tail: expected fewer scored targets than the shortest "
                                  f"length {min(self.lengths)}, got {self.tail}")
            _loss_rankings(self.rankings)

    def check_model(self, shape: ModelShape) -> None:
        limit = shape.max_positions
        if (self.probe in ("context", "kept") and limit is not None
                and self.lengths is not None and max(self.lengths) > limit):
            low = self.tail + 1 if self.probe == "context" else 2
            raise ConfigError(f"lengths: expected lengths within {shape.name}'s {limit} "
                              f"positions (valid: {low}..{limit}), got {max(self.lengths)}")
        if (self.probe == "qa" and limit is not None and self.backgrounds is not None
                and max(self.backgrounds) >= limit):
            raise ConfigError(f"backgrounds: expected backgrounds that leave room for the "
                              f"episode within {shape.name}'s {limit} positions (valid: "
                              f"0..{limit - 1}, less the episode's tokens), got "
                              f"{max(self.backgrounds)}")
        if self.probe == "context" and not self.context_lengths(limit):
            raise ConfigError(f"lengths: none of the default lengths fits {shape.name}'s "
                              f"{limit} positions above the tail of {self.tail}; pass "
                              "--lengths")

    # the defaults of backgrounds and lengths: the follow-up's, cut to what the model holds
    DEFAULT_BACKGROUNDS: ClassVar[tuple[int, ...]] = (0, 256, 512, 1024)
    DEFAULT_LENGTHS: ClassVar[tuple[int, ...]] = (256, 512, 1024, 2048)

    def context_lengths(self, max_positions: int | None) -> tuple[int, ...]:
        """The lengths the context probe runs: as given, else the defaults that fit."""
        if self.lengths is not None:
            return self.lengths
        return tuple(n for n in self.DEFAULT_LENGTHS if n > self.tail
                     and (max_positions is None or n <= max_positions))

    @property
    def effective_taus(self) -> tuple[float, ...]:
        if self.taus is not None:
            return self.taus
        return (0.10, 0.20) if self.probe == "qa" else (0.01, 0.05, 0.10)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["effective_taus"] = list(self.effective_taus)
        return d


def _probe_default(probe: str):
    """A ``CompetitionConfig`` subclass whose probe is ``probe`` (and must stay so)."""

    def check_options(self) -> None:
        CompetitionConfig.check_options(self)
        if self.probe != probe:
            raise ConfigError(f"probe: the {self.command} run is the {probe!r} probe, got "
                              f"{self.probe!r}")

    return check_options


@command("competition-qa", help="the qa probe of competition, as a study part",
         work="attngeom.probes.competition:Competition",
         summary="attngeom.report.text:competition_summary", run_dir="qa", loss=True,
         study="qa")
@dataclass(frozen=True)
class CompetitionQAConfig(CompetitionConfig):
    """``competition --probe qa`` under its study name ``qa``."""

    probe: str = option("qa", check=OneOf(PROBES), help="the probe (qa only)")
    check_options = _probe_default("qa")


@command("competition-context", help="the context probe of competition, as a study part",
         work="attngeom.probes.competition:Competition",
         summary="attngeom.report.text:competition_summary", run_dir="context", loss=True,
         study="context")
@dataclass(frozen=True)
class CompetitionContextConfig(CompetitionConfig):
    """``competition --probe context`` under its study name ``context``."""

    probe: str = option("context", check=OneOf(PROBES), help="the probe (context only)")
    check_options = _probe_default("context")


@command("restrict-local", help="localised top-N restriction: one layer, then one head, "
         "at a time", work="attngeom.engine.loss_runs:Restrict",
         summary="attngeom.report.text:restrict_summary", run_dir="restrict-local",
         loss=True, study="local_restriction")
@dataclass(frozen=True)
class LocalRestrictConfig(RestrictConfig):
    """The localised scan (``restrict``'s ``scope = "head"``) under its own name, so that a
    study runs it beside the whole-model restriction (study name ``local_restriction``)."""

    scopes: tuple[str, ...] = option(("model",), check=SubsetOf(RESTRICT_SCOPES), cli=False,
                                     help="not used by the localised scan (restrict's)")
    alone_tau: float | None = option(None, check=_AloneTau(), cli=False,
                                     help="not used by the localised scan (restrict's)")
    scope: str = option("head", check=OneOf(RESTRICT_SCOPES),
                        help="layer: N keys in one layer at a time; head: the layer scan, "
                        "then each head of the most sensitive layers")
    scan_n: tuple[int, ...] = option((16,), check=Sizes(),
                                     help="kept entries N of the localised scan")
    scan_top_layers: int = option(2, check=Integer(0),
                                  help="layers whose heads the head scan restricts one at a "
                                  "time (the most sensitive of the layer scan)")

    def check_options(self) -> None:
        super().check_options()
        if self.scope == "model":
            raise ConfigError("scope: restrict-local scans layers or heads (layer, head); "
                              "the whole model is restrict's")


def _loss_policies() -> tuple[str, ...]:
    """The oracle and the built-in policies an LM loss can restrict with (not the
    positional control, not the prefill-only ones): restrict-policies' default."""
    return (ORACLE, *(r for r in RANKINGS.names() if r != "positional"
                      and (RANKINGS.meta(r) or {}).get("kind") == "policy"
                      and not RANKINGS.meta(r).get("prefill_only")))


@command("restrict-policies", help="sparse-attention policies against the top-N oracle: "
         "N*, its ratio, each head alone", work="attngeom.engine.loss_runs:Restrict",
         summary="attngeom.report.text:restrict_summary", run_dir="policies", loss=True,
         study="policies", study_tables=(("restrict", "policy_restrict"),
                                         ("restrict_nstar", "policy_nstar"),
                                         ("restrict_alone", "policy_alone")))
@dataclass(frozen=True)
class PolicyRestrictConfig(RestrictConfig):
    """``attngeom restrict-policies``: restrict with the sparse-attention policies beside the
    attention oracle (N* and its ratio) and each head alone at the oracle's N*_5%, a study
    part of its own (``policies``) whose tables a study names ``policy_*``, so it runs
    beside the restriction part on the same model and corpus."""

    n_grid: tuple[int, ...] = option((16, 32, 64), check=Sizes(),
                                     help="kept entries N per query: the search's first round "
                                     "(at least Quest's page of 16)")
    rankings: tuple[str, ...] = option(_loss_policies(), check=SubsetOf(RANKINGS),
                                       help=f"which N keys are kept: {', '.join(RANKINGS)}")
    renormalize: tuple[bool, ...] = option((False,), check=Flags(),
                                           help="renormalise the kept probabilities: true, "
                                           "false or both")
    alone_tau: float | None = option(
        0.05, check=_AloneTau(), help="restrict each head alone, under every ranking, at the "
        "attention oracle's N*_tau for this tau (one of --taus; none: not run)")

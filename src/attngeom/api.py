"""The Python API: every command of the CLI is one function here, usable from notebooks.

Each run function takes the model, corpus and output directory, and any field of its
configuration as a keyword (``attngeom.config``: ``AnalysisConfig``, ``PruneConfig``,
``ScanConfig``, ``RestrictConfig``), or a ready ``config``; it returns a ``RunResult``
(tables as pandas DataFrames, the manifest, where they went). ``model_and_tokenizer``
reuses a model already in memory. The work itself is in ``attngeom.engine`` (the runner
and the run commands), ``attngeom.corpora`` and ``attngeom.probes``.
"""

from __future__ import annotations

from pathlib import Path

from attngeom.config import (
    AnalysisConfig,
    PruneConfig,
    RestrictConfig,
    RunConfig,
    ScanConfig,
    command_spec,
)
from attngeom.engine.compare import Comparison, compare_runs
from attngeom.engine.runner import RunResult, execute, work_of

__all__ = [
    "AnalysisConfig",
    "AnalysisResult",
    "Comparison",
    "InterventionResult",
    "PruneConfig",
    "RestrictConfig",
    "RunResult",
    "ScanConfig",
    "analyze",
    "atlas",
    "check",
    "compare",
    "competition",
    "demo",
    "inspect",
    "prune",
    "report",
    "reproduce",
    "restrict",
    "run",
    "scan_heads",
    "summary",
    "view",
]

AnalysisResult = RunResult  # what analyze returns
InterventionResult = RunResult  # what prune, scan_heads and restrict return


def _config(cls: type[RunConfig], config, model, corpus, options: dict) -> RunConfig:
    given = {k: val for k, val in (("model", model), ("corpus", corpus)) if val is not None}
    if config is None:
        return cls(**given, **options)
    if not isinstance(config, cls):
        raise TypeError(f"config: expected {cls.__name__}, got {type(config).__name__}")
    return config.with_(**given, **options) if given or options else config


def run(command: str, model: str | None = None, corpus: str | None = None,
        out: str | Path | None = None, *, config: RunConfig | None = None,
        overwrite: bool = False, progress=True, model_and_tokenizer=None,
        **options) -> RunResult:
    """Run the registered command ``command`` (``config.COMMANDS``: analyze, prune,
    scan-heads, restrict and any command added since); ``options`` are fields of its
    configuration class. The functions below are this with the command's name."""
    spec = command_spec(command)
    return execute(work_of(command), _config(spec.config, config, model, corpus, options),
                   out, overwrite=overwrite, progress=progress,
                   model_and_tokenizer=model_and_tokenizer)


def summary(result: RunResult) -> str:
    """The text ``attngeom COMMAND`` prints for ``result``: its main table with human
    column names and every caveat (the command's declared ``summary`` function)."""
    import importlib

    spec = command_spec(result.manifest.get("command", ""))
    module, _, attr = spec.summary.partition(":")
    return getattr(importlib.import_module(module), attr)(result)


def analyze(model: str | None = None, corpus: str | None = None, out: str | Path | None = None,
            *, config: AnalysisConfig | None = None, overwrite: bool = False,
            progress=True, model_and_tokenizer=None, **options) -> RunResult:
    """Top-N geometry, sink, taxonomy, bounds and diagnostics of a model on a corpus.

    ``options`` are ``AnalysisConfig`` fields (window_length, n_windows, n_grid,
    query_mode, rules, distances, repeats, seed, device, dtype, ...).

    >>> res = analyze(n_windows=2, window_length=32, bootstrap=50, progress=False)
    >>> f = res["summary"].query("scope == 'model' and metric == 'f_score' and n == 2")
    >>> sorted(f["rule"].unique())
    ['attention', 'contribution', 'random']
    """
    return run("analyze", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def prune(model: str | None = None, corpus: str | None = None, out: str | Path | None = None,
          *, config: PruneConfig | None = None, overwrite: bool = False, progress=True,
          model_and_tokenizer=None, **options) -> RunResult:
    """Keep-fraction pruning sweep per ranker (method §9); ``options``: ``PruneConfig`` fields.

    Rankers see only the ranking windows; perplexity is measured on the evaluation
    windows that follow them in the corpus (disjoint by construction).
    """
    return run("prune", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def scan_heads(model: str | None = None, corpus: str | None = None,
               out: str | Path | None = None, *, config: ScanConfig | None = None,
               overwrite: bool = False, progress=True, model_and_tokenizer=None,
               **options) -> RunResult:
    """Remove each head alone and report relative delta-NLL; critical heads above
    ``threshold`` (method §9). ``options``: ``ScanConfig`` fields."""
    return run("scan-heads", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def restrict(model: str | None = None, corpus: str | None = None,
             out: str | Path | None = None, *, config: RestrictConfig | None = None,
             overwrite: bool = False, progress=True, model_and_tokenizer=None,
             **options) -> RunResult:
    """Top-N attention restriction: delta-NLL per N and the effective set size N*_tau
    (method §9). ``options``: ``RestrictConfig`` fields."""
    return run("restrict", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``RUN_DIR/report/index.html`` (figures and tables of whatever the run holds),
    or ``OUT/index.html`` where ``out`` is given (a run directory one cannot write to)."""
    from attngeom.report import build_report

    return build_report(Path(run_dir), out=out, viewer=report_viewer)


def report_viewer(out_html, run_dir, heads) -> Path:
    """The run report's geometry viewer page: ``heads`` at the final query of the run's
    first window, the grid's N only (a small page)."""
    from attngeom.viewer import write_viewer

    return write_viewer(out_html, run=run_dir, heads=heads, queries=(-1,), n_max=0)


def compare(run_a: str | Path, run_b: str | Path) -> Comparison:
    """How stable the Retriever/Mixer/Reset regimes are between two runs of one model."""
    return compare_runs(run_a, run_b)


def check(model: str | None = None, *, device: str = "cpu", dtype: str = "float32",
          quantization: str = "none"):
    """Run the load-time self-checks on a model; returns what each measured (method §10).

    Probabilities sum to one, masked keys are zero, the output under capture equals
    the model's own, every layer is captured, gates of one change nothing and
    removing a head changes the output. Raises ``SelfCheckError`` on a failure.
    ``quantization`` loads the weights as a run would (``8bit``/``4bit``: CUDA and
    bitsandbytes), so a quantized model is checked as it will be measured.
    """
    from attngeom.engine.checks import run_checks

    return run_checks(model, device=device, dtype=dtype, quantization=quantization)


def reproduce(study: str | Path, out: str | Path | None = None, *, dry_run: bool = False,
              overwrite: bool = False, progress=True, shard: str | None = None):
    """Run every cell of a study file, then its cross-corpus and cross-model steps, then
    one study report (``DIR/report/index.html``); ``dry_run`` only checks the file and
    lists the cells. ``study`` is a path or the name of a shipped study (``demo``,
    ``paper``, ``followup``). ``shard="K/N"`` runs share K of N of the cells (default:
    a SLURM array's or Kubernetes Indexed Job's index); the process that finishes the
    last cell writes the tables and report. Returns a ``studies.reproduce.StudyResult``."""
    from attngeom.studies.reproduce import reproduce as run_study

    return run_study(study, out, dry_run=dry_run, overwrite=overwrite, progress=progress,
                     shard=shard)


def demo(out: str | Path = "runs/demo", *, progress=True):
    """The demo study (``studies/demo.toml``) on the bundled models and corpora
    (``make demo``)."""
    return reproduce("demo", out, progress=progress)


def atlas(model: str | None = None, corpus: str | None = None, out: str | Path | None = None,
          *, config=None, overwrite: bool = False, progress=True, model_and_tokenizer=None,
          **options) -> RunResult:
    """The head atlas (issue 32): previous-token, duplicate-token, induction, echo, sink,
    retrieval and streaming scores of every head, beside the regimes of the same
    windows (tables ``head_scores``, ``atlas_contingency``, ``atlas_kappa``,
    ``atlas_depth``, ``atlas_fn``). ``options``: ``AtlasConfig`` fields."""
    return run("atlas", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def competition(model: str | None = None, corpus: str | None = None,
                out: str | Path | None = None, *, probe: str = "qa", config=None,
                overwrite: bool = False, progress=True, model_and_tokenizer=None,
                **options) -> RunResult:
    """Retrieval under competition (issue 31): ``probe="qa"`` (bAbI qa1 under corpus
    background: answers, the competence screen, support statistics, N*) or
    ``probe="context"`` (nested context-length sweep: N* per L and its log-log slope).
    ``options``: ``CompetitionConfig`` fields."""
    if config is None:
        options["probe"] = probe
    return run("competition", model, corpus, out, config=config, overwrite=overwrite,
               progress=progress, model_and_tokenizer=model_and_tokenizer, **options)


def inspect(*args, **kwargs):
    """One head's selection at one query, key by key (``attngeom.viewer.inspect``:
    returns a ``HeadView`` with the numbers and a matplotlib figure)."""
    from attngeom.viewer import inspect as inspect_view

    return inspect_view(*args, **kwargs)


def view(run_dir: str | Path | None = None, *, prompt: str | None = None,
         model: str | None = None, heads="0:0", queries=(-1,), window: int | None = None,
         out: str | Path | None = None, n_max: int | None = None) -> Path:
    """Write the geometry viewer (one self-contained HTML page) for ``heads`` (``"L:H,..."``
    or pairs) at ``queries`` (positions; negatives from the end, -1 the final query) of
    an analyze run's window (``run_dir``, ``window``) or of ``prompt`` on ``model``;
    returns its path (default ``RUN_DIR/viewer.html``, or ``viewer.html`` for a
    prompt). ``docs/viewer.md`` describes the page."""
    from attngeom import validate as v
    from attngeom.errors import ConfigError

    if (run_dir is None) == (prompt is None):
        raise ConfigError("view: expected a run directory or --prompt TEXT (one of them)")
    if run_dir is None and not str(prompt).strip():
        raise ConfigError("prompt: expected some text, got an empty prompt")
    pairs = v.head_pairs("heads", heads)
    if not pairs:
        raise ConfigError("heads: expected at least one LAYER:HEAD pair")
    items = v.as_tuple(queries, "queries")
    if not items:
        raise ConfigError("queries: expected at least one query position")
    positions = tuple(v.integer("queries", q) for q in items)
    if n_max is not None:
        n_max = v.integer("n_max", n_max, low=0)
    from attngeom.viewer import write_viewer

    def target(default: Path) -> Path:
        """``out`` as given: an .html file, or a folder (existing, or named without a
        suffix) that gets viewer.html."""
        if out is None:
            return default
        path = Path(out)
        return path / "viewer.html" if path.is_dir() or not path.suffix else path

    if run_dir is not None:
        return write_viewer(target(Path(run_dir) / "viewer.html"), run=run_dir, window=window,
                            heads=pairs, queries=positions, n_max=n_max)
    from attngeom.assets import DEFAULT_MODEL, asset

    if model is None:
        model = asset(DEFAULT_MODEL, "--model")
    elif str(model).startswith("asset:"):
        model = asset(str(model).split(":", 1)[1], "--model")
    return write_viewer(target(Path("viewer.html")), model, prompt, heads=pairs,
                        queries=positions, n_max=n_max)

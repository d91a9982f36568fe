"""The configuration of an analysis run: one plain object the CLI, the API and a
future study file (ROADMAP, ``attngeom reproduce``) all build.

Validation happens here, before any model or corpus work, so bad input fails in a
second with one line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from attngeom.core.accumulators import VARIANTS, check_choices
from attngeom.core.geometry import DISTANCES, RULES
from attngeom.core.queries import parse_query_mode
from attngeom.core.taxonomy import REGIME_RULES
from attngeom.errors import ConfigError
from attngeom.pipeline.windows import check_boundary_options

ANALYSES = ("metrics", "sink", "taxonomy", "bounds", "assumptions")
DTYPES = ("float32", "float16", "bfloat16", "float64")


def shared_assets() -> Path:
    """The offline assets folder beside the repository (``../shared/assets``)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "assets"
        if candidate.is_dir():
            return candidate
    return here.parents[3].parent / "shared" / "assets"


def default_model() -> str:
    return str(shared_assets() / "stories260K-hf")


def default_corpus() -> str:
    return str(shared_assets() / "corpora" / "tinystories" / "TinyStories-train.head2MiB.txt")


def _tuple(value, name: str) -> tuple:
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    try:
        return tuple(value)
    except TypeError:
        raise ConfigError(f"{name}: expected a list, got {value!r}") from None


@dataclass(frozen=True)
class AnalysisConfig:
    """Everything ``attngeom analyze`` needs; defaults follow SPEC 2 and 7.

    ``repeats=None`` picks SPEC 2's default for the query mode (16 for ``final``,
    2 otherwise). ``n_windows=None`` uses every window the corpus holds.
    """

    model: str = field(default_factory=default_model)
    corpus: str = field(default_factory=default_corpus)
    window_length: int = 256
    n_windows: int | None = 32
    start_window: int = 0
    n_grid: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    query_mode: str = "final"
    rules: tuple[str, ...] = RULES
    distances: tuple[str, ...] = ("euclidean",)
    variants: tuple[str, ...] = VARIANTS
    repeats: int | None = None
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 4
    chunk_size: int | None = None
    bootstrap: int = 1000
    analyses: tuple[str, ...] = ANALYSES
    text_column: str = "text"
    separator: str | None = None
    doc_boundary: str = "auto"
    boundary_token: str | None = None
    regime_rule: str = "single"
    model_label: str | None = None
    corpus_label: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("rules", "distances", "variants", "analyses"):
            set_(self, name, _tuple(getattr(self, name), name))
        try:
            set_(self, "n_grid", tuple(int(n) for n in _tuple(self.n_grid, "n_grid")))
        except ValueError:
            raise ConfigError(f"n_grid: expected integers, got {self.n_grid!r}") from None
        check_choices("rules", self.rules, RULES)
        check_choices("distances", self.distances, DISTANCES)
        check_choices("variants", self.variants, VARIANTS)
        check_choices("analyses", self.analyses, ANALYSES)
        if not self.n_grid:
            raise ConfigError("n_grid: expected at least one N")
        if min(self.n_grid) < 1:
            raise ConfigError(f"n_grid: expected every N >= 1, got {list(self.n_grid)}")
        set_(self, "n_grid", tuple(sorted(set(self.n_grid))))
        parse_query_mode(self.query_mode)
        if self.window_length < 2:
            raise ConfigError(f"window_length: expected >= 2 tokens, got {self.window_length}")
        if self.n_windows is not None and self.n_windows < 1:
            raise ConfigError(f"n_windows: expected >= 1 (or None for all), got {self.n_windows}")
        if self.start_window < 0:
            raise ConfigError(f"start_window: expected >= 0, got {self.start_window}")
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError(f"repeats: expected >= 1, got {self.repeats}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: expected >= 1, got {self.batch_size}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ConfigError(f"chunk_size: expected >= 1 query rows, got {self.chunk_size}")
        if self.bootstrap < 0:
            raise ConfigError(f"bootstrap: expected >= 0 replicates, got {self.bootstrap}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_boundary_options(self.doc_boundary, self.boundary_token)
        if self.regime_rule not in REGIME_RULES:
            raise ConfigError(f"regime_rule: expected one of {', '.join(REGIME_RULES)}, "
                              f"got {self.regime_rule!r}")
        if "metrics" not in self.analyses and "bounds" in self.analyses:
            raise ConfigError("analyses: 'bounds' needs 'metrics' (the bounds sit beside them)")

    @property
    def effective_repeats(self) -> int:
        if self.repeats is not None:
            return self.repeats
        return 16 if self.query_mode == "final" else 2

    def with_(self, **changes) -> AnalysisConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["effective_repeats"] = self.effective_repeats
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}

    def fingerprint_dict(self) -> dict:
        """What identifies the run's results (labels and device do not change numbers)."""
        d = self.to_dict()
        for k in ("device", "batch_size", "chunk_size"):
            d.pop(k)
        return d

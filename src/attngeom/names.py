"""The names every layer shares: rules, metrics, regimes, rankers, analyses (one place each).

A leaf module (no attngeom import, no torch), so the kernels, the configuration, the
figures and the report all read one declaration of each name. See ``docs/method.md``
for what each one means.
"""

from __future__ import annotations

from collections.abc import Sequence

# --- top-N geometry (method: "Top-N selection")
RULES = ("attention", "contribution", "random")
DISTANCES = ("euclidean", "cosine")
VARIANTS = ("full", "no_sink")


class _Names(Sequence):
    """A read-only, ordered sequence of names that a registry extends at run time."""

    def __init__(self, *names: str) -> None:
        self._names = list(names)

    def __getitem__(self, i):
        return tuple(self._names[i]) if isinstance(i, slice) else self._names[i]

    def __len__(self) -> int:
        return len(self._names)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(tuple(self._names))

    def _add(self, name: str) -> None:
        self._names.append(name)

    def _remove(self, name: str) -> None:
        if name in self._names:
            self._names.remove(name)


# the built-in metrics, declared with how they are computed in ``core/metrics.py`` (which
# checks this list); a metric registered there later (``register_metric``) joins it, and
# every table, figure and test reads it live
METRICS = _Names("precision", "recall", "f_score", "margin", "inversions")
SEPARABILITY = METRICS[:3]  # precision, recall, F: what the figures and findings show
SINK = 0  # the sink is position 0
# how the random control draws its orders (core/random_control.py); bumped when the
# draws change, so a run is never resumed over shards of another scheme
RANDOM_CONTROL = "fisher-yates-lowbias32"

# --- head taxonomy (method: "Head taxonomy")
REGIMES = ("Retriever", "Mixer", "Reset")
RETRIEVER, MIXER, RESET = REGIMES  # for code that means one regime in particular
NO_REGIME = "none"  # the label of a head with no valid query
REGIME_RULES = ("single", "lumped")
STABLE = 0.8  # a label kept in fewer window-bootstrap resamples reads as uncertain

# --- the analyses of ``attngeom analyze``: their names and tables are declared with the
# table schemas (``results/schemas.py``), their accumulators in ``engine/analyses.py``
ANALYSIS_NEEDS = {"bounds": ("metrics",)}  # the bounds sit beside the measured metrics
# the names study files used before the analyses had one name everywhere; still accepted
# (by study files and ``--analyses``) and read as the name on the right
ANALYSIS_ALIASES = {"geometry": "metrics", "diagnostics": "assumptions"}

# --- interventions (method: "Interventions")
RANKERS = ("taxonomy", "magnitude", "entropy", "random", "gradient", "sensitivity")
RANKER_REGIMES = (MIXER, RESET, RETRIEVER)  # the taxonomy ranker's default order
RESTRICT_SCOPES = ("model", "layer", "head")

# --- windows and models
DTYPES = ("float32", "float16", "bfloat16", "float64")
# bitsandbytes weights: LLM.int8 (the follow-up's Mistral-Small-24B) or nf4; none: as stored
QUANTIZATIONS = ("none", "8bit", "4bit")
DOC_BOUNDARIES = ("auto", "bos", "eos", "sep", "none")

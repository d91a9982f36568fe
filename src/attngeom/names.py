"""The names every layer shares: rules, metrics, regimes, rankers, analyses (one place each).

A leaf module (no attngeom import, no torch), so the kernels, the configuration, the
figures and the report all read one declaration of each name. See ``docs/method.md``
for what each one means.
"""

from __future__ import annotations

# --- top-N geometry (method: "Top-N selection")
RULES = ("attention", "contribution", "random")
DISTANCES = ("euclidean", "cosine")
VARIANTS = ("full", "no_sink")
METRICS = ("precision", "recall", "f_score", "margin", "inversions")
SEPARABILITY = METRICS[:3]  # precision, recall, F: what the figures and findings show
SINK = 0  # the sink is position 0
# how the random control draws its orders (core/random_control.py); bumped when the
# draws change, so a run is never resumed over shards of another scheme
RANDOM_CONTROL = "fisher-yates-lowbias32"

# --- head taxonomy (method: "Head taxonomy")
REGIMES = ("Retriever", "Mixer", "Reset")
NO_REGIME = "none"
REGIME_RULES = ("single", "lumped")
STABLE = 0.8  # a label kept in fewer window-bootstrap resamples reads as uncertain

# --- the analyses of ``attngeom analyze``: their names and tables are declared with the
# table schemas (``results/schemas.py``), their accumulators in ``pipeline/analyses.py``
ANALYSIS_NEEDS = {"bounds": ("metrics",)}  # the bounds sit beside the measured metrics

# --- interventions (method: "Interventions")
RANKERS = ("taxonomy", "magnitude", "entropy", "random", "gradient", "sensitivity")
RANKER_REGIMES = ("Mixer", "Reset", "Retriever")  # the taxonomy ranker's default order
RESTRICT_SCOPES = ("model", "layer", "head")

# --- windows and models
DTYPES = ("float32", "float16", "bfloat16", "float64")
DOC_BOUNDARIES = ("auto", "bos", "eos", "sep", "none")

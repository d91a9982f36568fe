"""The names every layer shares: one registry per kind of name, and the fixed option sets.

A leaf module (no torch; it imports only ``attngeom.registry``), so the kernels, the
configuration, the figures and the report all read one declaration of each name: the
registries know their built-in names here and import their entries only when a run looks
one up (``attngeom.registry``). See ``docs/method.md``
for what each one means.
"""

from __future__ import annotations

from attngeom.registry import Registry

# --- top-N geometry (method: "Top-N selection"); the kernels (core/selection.py) switch
# on the rule's name, so this registry holds names only; ``control``: the random control
RULES: Registry[None] = Registry("selection rule", option="rules",
                                 builtins=(("attention", {"oracle": True}), "contribution",
                                           ("random", {"control": True})))
# the top-N oracle (the largest probabilities) every other restriction is compared with
ORACLE = next(r for r in RULES if (RULES.meta(r) or {}).get("oracle"))
# the rules that rank keys by what the model computed (every rule but the control)
MODEL_RULES = tuple(r for r in RULES if not (RULES.meta(r) or {}).get("control"))
DISTANCES = ("euclidean", "cosine")
VARIANTS = ("full", "no_sink")

# the metrics, each registered with how it is computed by ``core/metrics.py``; a metric
# registered later (``register_metric``) joins them, and every table, figure and test
# reads this registry live
METRICS: Registry = Registry(
    "metric", option="metrics",
    builtins=("precision", "recall", "f_score", "margin", "inversions"),
    module="attngeom.core.metrics")
SEPARABILITY = METRICS.names()[:3]  # precision, recall, F: what the figures and findings show
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

# --- the analyses of ``attngeom analyze``, in the order they run: their tables are
# declared with the table schemas (``results/schemas.py``), their accumulators registered
# by ``engine/analyses.py``; ``needs`` the analyses whose tables each one reads
ANALYSES: Registry = Registry(
    "analysis", option="analyses",
    builtins=("metrics", "sink", "taxonomy", ("bounds", {"needs": ("metrics",)}),
              "assumptions", ("head_scores", {"default": False})),
    module="attngeom.engine.analyses")
# the names study files used before the analyses had one name everywhere; still accepted
# (by study files and ``--analyses``) and read as the name on the right
ANALYSIS_ALIASES = {"geometry": "metrics", "diagnostics": "assumptions"}

# --- interventions (method: "Interventions")
# head rankers of ``prune`` (``interventions/rankers.py`` registers each)
RANKERS: Registry = Registry(
    "head ranker", option="rankers",
    builtins=("taxonomy", "magnitude", "entropy", "random", "gradient", "sensitivity"),
    module="attngeom.interventions.rankers")
# which N keys a restriction keeps (``restrict --rankings``, ``competition --rankings``):
# the geometry's rules as scores (attention is the top-N oracle), the positional control
# of the follow-up (App. E.5: the initial token and the N - 1 most recent keys) and the
# sparse-attention policies (``interventions/policies.py``: StreamingLLM's window, H2O,
# TOVA, Quest; SnapKV and K-norm compress a prompt once, for its final query only).
# ``fixed``: the keys the policy's own rule holds at its default parameters (a smaller
# budget is refused); ``prefill_only``: not for an LM loss, which restricts every query.
RANKINGS: Registry = Registry(
    "restriction ranking", option="rankings",
    builtins=(*((r, {"kind": "score", "fixed": 0}) for r in RULES),
              ("positional", {"kind": "policy", "fixed": 1}),
              ("window", {"kind": "policy", "fixed": 4}),
              ("h2o", {"kind": "policy", "fixed": 1}),
              ("tova", {"kind": "policy", "fixed": 1}),
              ("quest", {"kind": "policy", "fixed": 16}),
              ("snapkv", {"kind": "policy", "fixed": 32, "prefill_only": True}),
              ("knorm", {"kind": "policy", "fixed": 1, "prefill_only": True})),
    module="attngeom.interventions.restriction")
RANKER_REGIMES = (MIXER, RESET, RETRIEVER)  # the taxonomy ranker's default order
# how the N* search narrows a bracket (``interventions/nstar.py``): the follow-up's
# midpoints, or a prediction from the log-log curve (the same N* where the loss is monotone)
STEPS = ("bisect", "interpolate")
RESTRICT_SCOPES = ("model", "layer", "head")

# --- head types of the atlas (``core/head_scores.py`` registers how each is scored):
# a head is of the type when its score is >= ``threshold`` (<= for ``streaming``, whose
# score is an output change). sink 0.3: Gu et al. 2024; retrieval 0.1: Wu et al. 2024;
# the others are choices of attngeom (docs/method.md, "Head types").
HEAD_TYPES: Registry = Registry(
    "head type", option="thresholds",
    builtins=(("previous_token", {"threshold": 0.4, "input": "corpus"}),
              ("duplicate_token", {"threshold": 0.4, "input": "corpus"}),
              ("induction", {"threshold": 0.4, "input": "repeats"}),
              ("echo", {"threshold": 0.4, "input": "repeats"}),
              ("sink", {"threshold": 0.3, "input": "corpus"}),
              ("streaming", {"threshold": 0.1, "input": "corpus", "below": True}),
              ("retrieval", {"threshold": 0.1, "input": "needles"})),
    module="attngeom.core.head_scores")

# --- probes of ``attngeom competition`` (``probes/competition.py`` registers each)
PROBES: Registry = Registry("probe", option="probe", builtins=("qa", "context", "kept"),
                            module="attngeom.probes.competition")

# --- windows and models
DTYPES = ("float32", "float16", "bfloat16", "float64")
# bitsandbytes weights: LLM.int8 (the follow-up's Mistral-Small-24B) or nf4; none: as stored
QUANTIZATIONS = ("none", "8bit", "4bit")
DOC_BOUNDARIES = ("auto", "bos", "eos", "sep", "none")

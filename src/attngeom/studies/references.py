"""Published reference values, shown beside a study's own measurements.

Every number of the follow-up paper (arXiv 2609.37879: Tables 1-10, the context-length
numbers of App. C.4, the localised restriction of E.3, the support statistics of D.1,
the BABILong tables and the other numbers of its text) and every statement of the
geometry paper (arXiv 2602.01893, known only as ranges and qualitative findings) is one
:class:`Reference`: where it stands in the paper, the setting it belongs to, and its
value. The extracts these were copied from are the project's
``reference/followup-2609.37879.md`` and ``reference/geometry-2602.01893.md``; a cell the
extraction garbled carries the reconstruction and says so in ``note``.

A reference is a point (``value``), a bound (``relation`` ``">"``: "> 256", nothing
tested passed; ``"~"``: an approximate value) or a range (``low``..``high``: the
geometry paper's statements, and the spread over models of the follow-up's results).
``model`` is a preset name (``studies/presets.py``) or :data:`ANY_MODEL` for a statement
about every model of a paper; a reference naming an unknown model, quantity or setting
key fails on construction with one line.

The setting (``params``) uses the names of attngeom's tables where they exist:

- ``ranking``: the restriction's (or geometry's) top-N ranking, attention or
  contribution (random: the control); ``renormalize``: deletion (False) or
  renormalisation (True); ``scope``: model, layer, head;
- ``tau`` (relative, 0.05 = 5%) or ``tau_nats`` (BABILong's absolute threshold);
- ``n``: the restriction or set size; ``n_min``: the smallest N of a Spearman range;
- ``window_length`` (L, the initial token included), ``scoring`` (``all``: every target
  of the window; ``tail128``: the final 128 targets), ``protocol`` (``fixed``: App. B.2's
  one hashed window per document; ``context``: B.3's nested suffixes; ``qa``: BABILong);
- ``distance``, ``layer``, ``head``, ``background`` (BABILong 0K..4K), ``n_documents``;
- ``n_star_rule``: ``stable`` for App. C.4's second reading of a non-monotone curve (the
  smallest N from which every larger tested N passes); absent, N* is the smallest tested
  pass. ``ranking`` ``positional``: App. E.5's control (BOS and the N - 1 latest keys).

``combine.reference_values`` puts our number beside the published one where the
study ran the same preset, corpus and setting, and shows a paper's range over its
models as context (never as a match) for models the paper did not run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, RANKINGS, REGIMES, RULES
from attngeom.studies.presets import PRESETS

GEOMETRY_PAPER = "arXiv 2602.01893"  # Mudarisov, Burtsev, Petrova, State (2026)
FOLLOW_UP = "arXiv 2609.37879"  # Mudarisov, Burtsev, State (2026)
ANY_MODEL = "*"  # a statement about every model of the paper

OWT, WT = "openwebtext", "wikitext-103"
BOTH = f"{OWT}+{WT}"  # a value averaged over (or maximised over) the two corpora
QA = {t: f"babilong-{t}" for t in ("qa1", "qa2", "qa3")}

QUANTITIES = {
    "f_score": "top-N F-score F_N of selected vs non-selected value states",
    "precision": "top-N geometric precision",
    "recall": "top-N geometric recall",
    "best_n": "set size N at which separation is best",
    "oscillation_n": "range of N over which F_N oscillates",
    "n_star": "smallest top-N restriction N with relative delta-NLL <= tau (N*_tau)",
    "n_star_ratio": "ratio of two N*_tau values (named in the note)",
    "n_star_ci_low": "lower end of N*_tau's 95% document-bootstrap interval",
    "n_star_ci_high": "upper end of N*_tau's 95% document-bootstrap interval",
    "n_star_loglog_slope": "OLS slope of log N*_tau on log L over the four window lengths",
    "n_star_qa": "smallest N whose BABILong answer loss rises by at most tau_nats",
    "n_star_qa_ratio": "N*_qa at 4K over N*_qa at 0K",
    "spearman_f_dnll": "Spearman correlation over N of F_N with the relative delta-NLL",
    "delta_nll_rel": "relative change of the next-token NLL against the unmodified model",
    "nll_drop": "full-model NLL change (nats/token) from L = 256 to L = 2048",
    "nll_max_abs_diff": "largest NLL difference between two implementations (parity)",
    "qa_loss": "full-model BABILong candidate loss (nats)",
    "qa_accuracy": "full-model BABILong accuracy",
    "qa_accuracy_change_pp": "accuracy change 0K -> 4K in percentage points",
    "support_displacement_ratio": "support displacement at 4K over 0K",
    "support_mass_ratio": "attention mass on support tokens at 4K over 0K",
    "support_recall64_change_pp": "recall@64 of support tokens, 4K minus 0K (pp)",
    "outranking_probability": "mean probability a non-support token outranks support",
    "displacement_loglog_slope": "log-log slope of displacement against non-support count",
    "nonsupport_growth": "growth of the non-support token count from 0K to 4K",
    "predictor_error": "mean |log2| error of the E.4 set-size predictor",
    "predictor_sensitivity": "sensitivity of the E.4 threshold classifier",
    "sink_norm_ratio": "mean non-sink value norm over the sink's value norm",
    "sink_f_drop": "factor by which F_N falls when the sink is selected",
    "regime_share": "share of heads labelled with one regime",
    "statement": "a qualitative finding (no number; see note)",
}

PARAM_KEYS = ("n", "n_min", "rule", "ranking", "variant", "distance", "tau", "tau_nats",
              "renormalize", "scope", "layer", "head", "regime", "window_length",
              "scoring", "protocol", "background", "n_documents", "n_star_rule")
_CHOICES = {"rule": RULES, "ranking": RANKINGS.names(), "distance": DISTANCES,
            "regime": REGIMES, "n_star_rule": ("smallest", "stable"),
            "scope": ("model", "layer", "head"), "scoring": ("all", "tail128"),
            "protocol": ("fixed", "context", "qa", "geometry"),
            "background": ("0K", "1K", "2K", "4K"), "renormalize": (False, True)}
RELATIONS = ("=", "~", ">", "<")
MAX_NOTE_WORDS = 40

UNAVAILABLE: dict[str, str] = {
    GEOMETRY_PAPER: "the full text could not be read; its statements are quoted as ranges "
                    "and qualitative findings from the abstract, an explainer and the review "
                    "thread, never as point values",
}


@dataclass(frozen=True)
class Reference:
    """One published number (or range, or statement) with its place and setting."""

    source: str  # FOLLOW_UP or GEOMETRY_PAPER
    where: str  # "Table 2 (App. C.3)": the exact place
    model: str  # a preset name, or ANY_MODEL
    corpus: str  # "openwebtext", "wikitext-103", BOTH, "babilong-qa1", ...
    quantity: str  # a key of QUANTITIES
    value: float | None = None  # the point value (None for a range or a statement)
    params: tuple[tuple[str, object], ...] = ()
    relation: str = "="  # "=", "~" (approximately), ">" / "<" (a bound)
    low: float | None = None  # a range's ends (both or neither)
    high: float | None = None
    note: str = ""  # garbling, reconstruction, or the statement itself

    def __post_init__(self) -> None:
        # checked on construction, so a mistyped entry fails at import, not in a report
        what = f"reference {self.where!r} ({self.model}, {self.quantity})"
        for name in ("source", "where", "corpus"):
            if not str(getattr(self, name)).strip():
                raise ConfigError(f"{what}: empty {name}")
        if self.model != ANY_MODEL and self.model not in PRESETS:
            raise ConfigError(f"{what}: unknown model {self.model!r}; expected a preset name "
                              f"of studies/presets.py or {ANY_MODEL!r}")
        if self.quantity not in QUANTITIES:
            raise ConfigError(f"{what}: unknown quantity {self.quantity!r}")
        if self.relation not in RELATIONS:
            raise ConfigError(f"{what}: relation {self.relation!r}: expected one of "
                              f"{', '.join(RELATIONS)}")
        for name in ("value", "low", "high"):
            x = getattr(self, name)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))
                                  or not math.isfinite(x)):
                raise ConfigError(f"{what}: {name} must be a finite number, got {x!r}")
        if (self.low is None) != (self.high is None):
            raise ConfigError(f"{what}: a range needs both low and high")
        if self.low is not None and self.low > self.high:
            raise ConfigError(f"{what}: low {self.low} > high {self.high}")
        if self.quantity == "statement":
            if self.value is not None or not self.note.strip():
                raise ConfigError(f"{what}: a statement has no value and says itself in note")
        elif self.value is None and self.low is None:
            raise ConfigError(f"{what}: expected a value or a low..high range")
        if len(self.note.split()) > MAX_NOTE_WORDS:
            raise ConfigError(f"{what}: note longer than {MAX_NOTE_WORDS} words")
        keys = [k for k, _ in self.params]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"{what}: repeated params key")
        for key, x in self.params:
            if key not in PARAM_KEYS:
                raise ConfigError(f"{what}: params key {key!r}: expected one of "
                                  f"{', '.join(PARAM_KEYS)}")
            if key in _CHOICES and x not in _CHOICES[key]:
                raise ConfigError(f"{what}: params {key}={x!r}: expected one of "
                                  f"{', '.join(map(str, _CHOICES[key]))}")

    @property
    def setting(self) -> dict:
        return dict(self.params)

    @property
    def is_range(self) -> bool:
        return self.low is not None

    def shown(self) -> str:
        """The published value as written: ``33``, ``> 256``, ``~ 1.107``, ``5.8-17.2``."""
        if self.quantity == "statement":
            return self.note
        if self.is_range:
            return f"{self.low:g}-{self.high:g}"
        return f"{self.value:g}" if self.relation == "=" else f"{self.relation} {self.value:g}"


# --------------------------------------------------------------------------- builders

_F = FOLLOW_UP
_TAUS = (0.01, 0.05, 0.10)


def _p(**kw) -> tuple[tuple[str, object], ...]:
    return tuple(kw.items())


# Table 2's cells the extraction garbled (the extract's "(g)"), with how far the paper's
# text pins each reconstruction. "Confirmed": another passage states the value (C.3 quotes
# Llama-2-7B's attention 5% cells; C.5's contribution 1% maximum 120 exceeds the OWT
# cell, so it is the WT cell; Table 9 repeats Gemma-7B's contribution deletion cells).
# "Most likely": the text bounds or orders it but does not state it (E.2's and C.5's
# maxima bound the Gemma-2-9B and Mistral-Small-24B cells; the merged "10 11" order;
# the shifted Llama-2-7B attention rows).
_CONFIRMED = {
    ("llama-2-7b", "attention", OWT, 0.05): "App. C.3 quotes 85",
    ("llama-2-7b", "attention", WT, 0.05): "App. C.3 quotes 101",
    ("mistral-small-24b", "contribution", WT, 0.01): "App. C.5's maximum 120 is this cell",
    ("gemma-7b", "contribution", OWT, 0.05): "Table 9's deletion column repeats 227",
    ("gemma-7b", "contribution", OWT, 0.10): "Table 9's deletion column repeats 205",
}
_MOST_LIKELY = {
    **{("gemma-2-9b", r, OWT, t): "App. E.2's cross-corpus maxima only bound it"
       for r in ("attention", "contribution") for t in (0.05, 0.10)},
    **{("llama-2-7b", "attention", c, t): "row shifted in the extraction; the text does "
                                          "not state it"
       for c in (OWT, WT) for t in (0.01, 0.10)},
    ("llama-3.2-1b", "contribution", WT, 0.10): 'merged "10 11" cell; order not certain',
    ("llama-3-8b", "attention", WT, 0.10): 'merged "10 11" cell; order not certain',
    ("mistral-small-24b", "contribution", OWT, 0.05): "App. C.5's maximum 39 only bounds it",
}
CONFIRMED_NOTE = "reconstructed: confirmed by the text"
MOST_LIKELY_NOTE = "reconstructed: most likely"


def _garbled(model: str, ranking: str, corpus: str, tau: float) -> str:
    """The note of a Table 2 cell: empty where it was read cleanly."""
    key = (model, ranking, corpus, tau)
    if key in _CONFIRMED:
        return f"{CONFIRMED_NOTE} ({_CONFIRMED[key]})"
    if key in _MOST_LIKELY:
        return f"{MOST_LIKELY_NOTE} ({_MOST_LIKELY[key]})"
    return ""


# Table 2 (App. C.3): N*_tau at L = 1024, fixed-length protocol, deletion, all targets
# model -> ranking -> (OWT 1%, 5%, 10%, WT 1%, 5%, 10%); None: not measured
_TABLE2 = {
    "qwen-2.5-1.5b": {"attention": (99, 39, 24, 108, 42, 26),
                      "contribution": (104, 41, 25, 112, 43, 27)},
    "qwen-2.5-7b": {"attention": (61, 33, 21, 63, 31, 21),
                    "contribution": (59, 31, 21, 63, 30, 20)},
    "gemma-7b": {"attention": (283, 226, 206, 253, 195, 173),
                 "contribution": (281, 227, 205, 253, 195, 173)},
    "gemma-2-9b": {"attention": (None, 12, 7, None, 12, 7),
                   "contribution": (None, 11, 6, None, 11, 7)},
    "llama-2-7b": {"attention": (191, 85, 59, 234, 101, 65),
                   "contribution": (121, 60, 46, 140, 65, 47)},
    "llama-3.2-1b": {"attention": (61, 18, 10, 65, 19, 10),
                     "contribution": (60, 17, 9, 64, 19, 10)},
    "llama-3-8b": {"attention": (60, 16, 10, 71, 20, 11),
                   "contribution": (59, 16, 9, 72, 20, 10)},
    "mistral-7b-v0.3": {"attention": (51, 14, 10, 51, 16, 10),
                        "contribution": (51, 14, 9, 51, 15, 9)},
    "mistral-small-24b": {"attention": (105, 32, 16, 119, 40, 22),
                          "contribution": (107, 31, 16, 120, 39, 22)},
}


def _table2() -> list[Reference]:
    out = []
    for model, by in _TABLE2.items():
        for ranking, cells in by.items():
            for i, value in enumerate(cells):
                if value is None:
                    continue
                corpus, tau = (OWT, WT)[i // 3], _TAUS[i % 3]
                out.append(Reference(
                    _F, "Table 2 (App. C.3)", model, corpus, "n_star", value,
                    _p(ranking=ranking, renormalize=False, tau=tau, scope="model",
                       window_length=1024, scoring="all", protocol="fixed", n_documents=50),
                    note=_garbled(model, ranking, corpus, tau)))
    return out


# Table 1 (App. C.2): Spearman of F_N with relative delta-NLL, attention, both averaged
# over OWT and WT-103; model -> distance -> (N >= 1, N >= 2, N >= 8)
_TABLE1 = {
    "qwen-2.5-7b": {"euclidean": (0.817, 0.738, 0.371), "cosine": (0.983, 0.976, 0.943)},
    "gemma-7b": {"euclidean": (0.783, 0.690, 0.257), "cosine": (0.433, 0.190, -0.943)},
    "llama-3-8b": {"euclidean": (0.700, 0.571, -0.029), "cosine": (0.550, 0.357, -0.543)},
    "mistral-7b-v0.3": {"euclidean": (0.633, 0.476, -0.257), "cosine": (0.717, 0.595, 0.029)},
}


def _table1() -> list[Reference]:
    return [Reference(_F, "Table 1 (App. C.2)", model, BOTH, "spearman_f_dnll", value,
                      _p(ranking="attention", distance=distance, n_min=n_min,
                         renormalize=False, window_length=1024, protocol="fixed"))
            for model, by in _TABLE1.items() for distance, cells in by.items()
            for n_min, value in zip((1, 2, 8), cells, strict=True)]


# Tables 3-5 (App. C.4): context-length sweep, nested suffixes, 50 documents; cells are
# N*_1% / N*_5% / N*_10% at L = 256, 512, 1024, 2048 (Table 3 = the 5% attention cells)
_LENGTHS = (256, 512, 1024, 2048)
_TABLE4 = {  # tail128 scoring
    ("qwen-2.5-7b", OWT): {"attention": "27/16/12 46/31/19 73/43/29 164/78/50",
                           "contribution": "26/16/11 47/28/19 71/42/29 158/74/49"},
    ("qwen-2.5-7b", WT): {"attention": "28/17/13 59/31/22 88/45/31 137/70/49",
                          "contribution": "27/16/12 57/31/21 84/45/30 141/69/49"},
    ("gemma-7b", OWT): {"attention": "106/76/68 192/150/136 340/280/256 646/504/463",
                        "contribution": "105/76/68 190/150/136 346/279/256 635/503/461"},
    ("gemma-7b", WT): {"attention": "95/71/63 180/137/120 390/244/222 641/423/387",
                       "contribution": "94/71/64 183/137/120 383/245/221 650/423/388"},
    ("llama-3-8b", OWT): {"attention": "30/10/6 56/17/10 107/32/17 188/57/30",
                          "contribution": "29/10/6 55/16/9 106/31/16 185/56/29"},
    ("llama-3-8b", WT): {"attention": "24/10/6 57/18/11 121/34/17 241/66/33",
                         "contribution": "24/9/6 57/18/10 120/34/17 243/66/33"},
}
_TABLE5 = {  # all-token scoring, same runs
    ("qwen-2.5-7b", OWT): {"attention": "22/13/9 35/20/14 55/31/21 102/51/34",
                           "contribution": "21/12/9 34/19/13 54/30/20 100/49/33"},
    ("qwen-2.5-7b", WT): {"attention": "23/13/9 39/20/14 61/31/22 94/48/34",
                          "contribution": "23/12/9 38/20/14 61/30/21 93/48/34"},
    ("gemma-7b", OWT): {"attention": "89/67/59 157/125/111 275/227/204 483/394/358",
                        "contribution": "88/67/59 157/125/111 276/227/203 484/395/358"},
    ("gemma-7b", WT): {"attention": "80/63/57 147/110/97 247/192/173 416/332/300",
                       "contribution": "79/63/57 148/110/97 245/192/173 419/331/299"},
    ("llama-3-8b", OWT): {"attention": "20/7/5 32/10/6 61/17/10 113/30/16",
                          "contribution": "19/6/4 32/10/6 59/17/9 110/29/15"},
    ("llama-3-8b", WT): {"attention": "18/7/5 36/11/7 76/19/11 140/36/18",
                         "contribution": "18/7/4 35/11/6 76/19/10 139/36/18"},
}


def _context_tables() -> list[Reference]:
    out = []
    for where, scoring, table in (("Table 4 (App. C.4)", "tail128", _TABLE4),
                                  ("Table 5 (App. C.4)", "all", _TABLE5)):
        for (model, corpus), by in table.items():
            for ranking, text in by.items():
                for L, cell in zip(_LENGTHS, text.split(), strict=True):
                    for tau, value in zip(_TAUS, cell.split("/"), strict=True):
                        place = where
                        if scoring == "tail128" and ranking == "attention" and tau == 0.05:
                            place = "Tables 3 and 4 (Sec. 3.2, App. C.4)"
                        out.append(Reference(
                            _F, place, model, corpus, "n_star", int(value),
                            _p(ranking=ranking, renormalize=False, tau=tau, scope="model",
                               window_length=L, scoring=scoring, protocol="context",
                               n_documents=50)))
    return out


def _c4_numbers() -> list[Reference]:
    """App. C.4's other numbers: slopes, intervals, ratios, tolerances, partial runs."""
    out = []
    ctx = dict(renormalize=False, scope="model", protocol="context", n_documents=50)
    slopes = {("qwen-2.5-7b", OWT): 0.733, ("qwen-2.5-7b", WT): 0.666,
              ("gemma-7b", OWT): 0.909, ("gemma-7b", WT): 0.856,
              ("llama-3-8b", OWT): 0.845, ("llama-3-8b", WT): 0.908}
    for (model, corpus), value in slopes.items():
        out.append(Reference(_F, "App. C.4", model, corpus, "n_star_loglog_slope", value,
                             _p(ranking="attention", tau=0.05, scoring="tail128", **ctx)))
    out.append(Reference(_F, "App. C.4", "llama-3-8b", WT, "n_star_loglog_slope", 1.107,
                         _p(ranking="attention", tau=0.01, scoring="tail128", **ctx),
                         relation="~", note="from the 1% cells 24, 57, 121, 241"))
    out.append(Reference(_F, "App. C.4", ANY_MODEL, BOTH, "n_star_ratio", low=4.12,
                         high=6.63, params=_p(ranking="attention", tau=0.05,
                                              scoring="tail128", **ctx),
                         note="N*_5% at L = 2048 over L = 256, across the six model-corpus "
                              "pairs (Qwen-2.5-7B, Gemma-7B, Llama-3-8B)"))
    cis = {("qwen-2.5-7b", OWT): (78, 72, 102), ("gemma-7b", OWT): (504, 480, 640),
           ("llama-3-8b", OWT): (57, 54, 96), ("qwen-2.5-7b", WT): (70, 64, 80),
           ("gemma-7b", WT): (423, 412, 448), ("llama-3-8b", WT): (66, 63, 96)}
    for (model, corpus), (_, lo, hi) in cis.items():
        for q, v in (("n_star_ci_low", lo), ("n_star_ci_high", hi)):
            out.append(Reference(_F, "App. C.4", model, corpus, q, v,
                                 _p(ranking="attention", tau=0.05, window_length=2048,
                                    scoring="tail128", **ctx)))
    # "Contribution, OWT 5%, L = 2048: 74, 503, 56" repeats Table 4's cells: not again
    for model, corpus, first, stable, L in (("qwen-2.5-7b", WT, 45, 47, 1024),
                                            ("gemma-7b", WT, 423, 425, 2048)):
        out.append(Reference(
            _F, "App. C.4", model, corpus, "n_star", stable,
            _p(ranking="attention", tau=0.05, window_length=L, scoring="tail128",
               n_star_rule="stable", **ctx),
            note=f"non-monotone loss: smallest passing N {first}; {stable} is the smallest "
                 "with every larger tested N passing"))
    out.append(Reference(_F, "App. C.4", ANY_MODEL, OWT, "nll_drop", low=-0.342, high=-0.292,
                         params=_p(protocol="context", n_documents=50),
                         note="full-model NLL falls 0.292-0.342 nats/token from L = 256 to "
                              "2048 (Qwen-2.5-7B, Gemma-7B, Llama-3-8B)"))
    for model, (a, b) in {"qwen-2.5-7b": (16, 72), "gemma-7b": (76, 496),
                          "llama-3-8b": (10, 54)}.items():
        for L, v in ((256, a), (2048, b)):
            out.append(Reference(
                _F, "App. C.4", model, OWT, "n_star", v,
                _p(ranking="attention", window_length=L, scoring="tail128", **ctx),
                note="fixed absolute tolerance 0.05 x NLL(M; L = 256), no extra refinement"))
    for L, v in ((256, 9), (512, 13), (1024, 22)):
        out.append(Reference(_F, "App. C.4", "mistral-7b-v0.3", OWT, "n_star", v,
                             _p(ranking="attention", tau=0.05, window_length=L,
                                scoring="tail128", **ctx),
                             note="partial Mistral-7B-v0.3 run"))
    for n, v in ((49, 0.0519852), (50, 0.0498641)):
        out.append(Reference(_F, "App. C.4", "mistral-7b-v0.3", OWT, "delta_nll_rel", v,
                             _p(ranking="attention", n=n, window_length=2048,
                                scoring="tail128", **ctx),
                             note="provisional N*_5% = 50, excluded from the tables"))
    out.append(Reference(_F, "App. C.4", ANY_MODEL, BOTH, "nll_max_abs_diff", 5.76e-7,
                         _p(protocol="context"),
                         note="the maximum over 28 parity checks (prefixes <= 256 "
                              "positions), all passing"))
    return out


def _other_lm() -> list[Reference]:
    """B.5 parity, C.5 maxima, E.3 localised restriction, E.4 predictor, Gemma ratio."""
    out = []
    for corpus, v in ((OWT, 6.19e-7), (WT, 5.18e-7)):
        out.append(Reference(_F, "App. B.5", ANY_MODEL, corpus, "nll_max_abs_diff", v,
                             _p(protocol="fixed"),
                             note="chunked against eager NLL; the full-N hook differs by 0"))
    for ranking, cells in (("attention", (119, 40, 22)), ("contribution", (120, 39, 22))):
        for tau, v in zip(_TAUS, cells, strict=True):
            out.append(Reference(_F, "App. C.5", "mistral-small-24b", BOTH, "n_star", v,
                                 _p(ranking=ranking, renormalize=False, tau=tau,
                                    scope="model", window_length=1024, scoring="all",
                                    protocol="fixed", n_documents=50),
                                 note="maximum over the two corpora"))
    # one statement over both tau (226 / 12 at 5%, 206 / 7 at 10%), so one entry
    out.append(Reference(_F, "App. E.2", "gemma-7b", BOTH, "n_star_ratio", low=19, high=29,
                         params=_p(protocol="fixed"), relation="~",
                         note="Gemma-7B over Gemma-2-9B N*_5% and N*_10%, about 19-29-fold "
                              "(226 vs 12, 206 vs 7)"))
    local = dict(ranking="attention", renormalize=False, window_length=1024, protocol="fixed")
    out.append(Reference(_F, "App. E.3", "gemma-7b", OWT, "delta_nll_rel", 0.709,
                         _p(scope="layer", layer=0, n=128, n_documents=50, **local),
                         note="mean of per-document relative increases"))
    out.append(Reference(_F, "App. E.3", "gemma-7b", OWT, "delta_nll_rel", 0.621,
                         _p(scope="head", layer=0, head=12, n=128, n_documents=20, **local),
                         note="the super-head; mean of per-document relative increases"))
    out.append(Reference(_F, "App. E.3", "qwen-2.5-7b", OWT, "delta_nll_rel", 0.0186,
                         _p(scope="layer", n=16, n_documents=50, **local),
                         note="largest sampled single-layer effect"))
    out.append(Reference(_F, "App. E.3", "mistral-7b-v0.3", OWT, "delta_nll_rel", 0.0033,
                         _p(scope="layer", n=8, n_documents=50, **local),
                         note="largest sampled single-layer effect"))
    out.append(Reference(_F, "App. E.4", ANY_MODEL, OWT, "predictor_error", 1.75,
                         _p(n_documents=20), note="raw-N baseline, mean |log2| error, 16 "
                                                  "cases of 4 models, tau 5 and 10%"))
    out.append(Reference(_F, "App. E.4", ANY_MODEL, OWT, "predictor_sensitivity", 0.75,
                         _p(n_documents=20), note="mean and P95 sensitivity (maximum 1)"))
    return out


# Table 9 (App. E.1): OWT, 50 documents; (model, ranking) -> (5% del, 5% ren, 10% del,
# 10% ren)
_TABLE9 = {("qwen-2.5-7b", "attention"): (33, 15, 21, 9),
           ("qwen-2.5-7b", "contribution"): (31, 24, 21, 13),
           ("gemma-7b", "attention"): (226, 7, 206, 4),
           ("gemma-7b", "contribution"): (227, 11, 205, 7),
           ("mistral-7b-v0.3", "attention"): (14, 8, 10, 5),
           ("mistral-7b-v0.3", "contribution"): (14, 14, 9, 11)}


def _table9() -> list[Reference]:
    out = []
    for (model, ranking), cells in _TABLE9.items():
        for (tau, renorm), v in zip(((0.05, False), (0.05, True), (0.10, False),
                                     (0.10, True)), cells, strict=True):
            if not renorm:
                continue  # the deletion columns repeat Table 2
            out.append(Reference(_F, "Table 9 (App. E.1)", model, OWT, "n_star", v,
                                 _p(ranking=ranking, renormalize=True, tau=tau,
                                    scope="model", window_length=1024, scoring="all",
                                    protocol="fixed", n_documents=50)))
    return out


_QA_MODELS = ("qwen-2.5-7b", "gemma-7b", "llama-3-8b", "mistral-7b-v0.3")
_BG = ("0K", "1K", "2K", "4K")


def _babilong() -> list[Reference]:
    out = []
    qa1 = QA["qa1"]
    table6 = {"qwen-2.5-7b": (32, 16, 32, 64), "llama-3-8b": (32, 128, 256, 316),
              "gemma-7b": (64, 256, ">256", 760), "mistral-7b-v0.3": (8, 64, 256, ">256")}
    for model, cells in table6.items():
        for bg, v in zip(_BG, cells, strict=True):
            bound = isinstance(v, str)
            out.append(Reference(
                _F, "Table 6 (Sec. 3.3)", model, qa1, "n_star_qa", 256 if bound else v,
                _p(ranking="attention", renormalize=False, tau_nats=0.10, background=bg,
                   protocol="qa"), relation=">" if bound else "=",
                note="nothing tested through 256 passes" if bound else ""))
    table7 = {"qwen-2.5-7b": (0.690, 1.178, 1.303, 1.385),
              "gemma-7b": (0.647, 0.882, 0.933, 1.150),
              "llama-3-8b": (0.740, 0.773, 0.857, 1.163),
              "mistral-7b-v0.3": (0.792, 1.018, 1.151, 1.311)}
    for model, cells in table7.items():
        for bg, v in zip(_BG, cells, strict=True):
            out.append(Reference(_F, "Table 7 (App. D)", model, qa1, "qa_loss", v,
                                 _p(background=bg, protocol="qa"),
                                 note="uniform over 6 candidates: log 6 = 1.792"))
    table8 = {"qwen-2.5-7b": (0.70, 0.49, 0.28), "gemma-7b": (0.71, 0.49, 0.30),
              "llama-3-8b": (0.67, 0.49, 0.26), "mistral-7b-v0.3": (0.63, 0.52, 0.23)}
    for model, cells in table8.items():
        for task, v in zip(("qa1", "qa2", "qa3"), cells, strict=True):
            out.append(Reference(_F, "Table 8 (App. D)", model, QA[task], "qa_accuracy", v,
                                 _p(background="0K", protocol="qa"), note="chance 1/6"))
    for model, v in zip(_QA_MODELS, (-23, -18, -10, -14), strict=True):
        out.append(Reference(_F, "Sec. 3.3 (Fig. 6)", model, qa1, "qa_accuracy_change_pp", v,
                             _p(protocol="qa"),
                             note="drop 0K to 4K (sign from Fig. 6); Llama's paired "
                                  "interval about [-22, +2] pp" if model == "llama-3-8b"
                             else "drop 0K to 4K (sign from Fig. 6)"))
    # Table 10 (App. E.1): renormalised, qa1 at 0K and 4K
    table10 = {("qwen-2.5-7b", "attention"): (16, 16, 8, 16),
               ("qwen-2.5-7b", "contribution"): (32, 32, 8, 16),
               ("gemma-7b", "attention"): (32, 32, 8, 32),
               ("gemma-7b", "contribution"): (16, 32, 8, 32),
               ("mistral-7b-v0.3", "attention"): (8, 16, 8, 8),
               ("mistral-7b-v0.3", "contribution"): (32, 32, 16, 32)}
    for (model, ranking), cells in table10.items():
        for (tau, bg), v in zip(((0.10, "0K"), (0.10, "4K"), (0.20, "0K"), (0.20, "4K")),
                                cells, strict=True):
            out.append(Reference(_F, "Table 10 (App. E.1)", model, qa1, "n_star_qa", v,
                                 _p(ranking=ranking, renormalize=True, tau_nats=tau,
                                    background=bg, protocol="qa")))
    for model, ren, dele in (("qwen-2.5-7b", 1, 2), ("gemma-7b", 1, 11.875),
                             ("mistral-7b-v0.3", 2, None)):
        out.append(Reference(_F, "App. E.1", model, qa1, "n_star_qa_ratio", ren,
                             _p(ranking="attention", renormalize=True, tau_nats=0.10,
                                protocol="qa")))
        if dele is not None:
            out.append(Reference(_F, "App. E.1", model, qa1, "n_star_qa_ratio", dele,
                                 _p(ranking="attention", renormalize=False, tau_nats=0.10,
                                    protocol="qa"),
                                 note="760/64" if model == "gemma-7b" else ""))
    # App. D.1 support statistics (86 examples per background)
    d1 = dict(protocol="qa", ranking="attention")
    out += [
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "support_displacement_ratio", 50.0,
                  _p(**d1), note="mean of per-model 4K/0K ratios; per model 42.8-54.6 "
                                 "(Qwen 51.6, Gemma 54.6)"),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "support_displacement_ratio", low=42.8,
                  high=54.6, params=_p(**d1), note="range of per-model 4K/0K ratios"),
        Reference(_F, "App. D.1", "qwen-2.5-7b", qa1, "support_displacement_ratio", 51.6,
                  _p(**d1), note="while its N*_qa doubles"),
        Reference(_F, "App. D.1", "gemma-7b", qa1, "support_displacement_ratio", 54.6,
                  _p(**d1), note="while its N*_qa grows about 11.9-fold"),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "support_mass_ratio", 0.435, _p(**d1),
                  note="mean of per-model 4K/0K ratios"),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "support_recall64_change_pp", -63.8,
                  _p(**d1)),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "displacement_loglog_slope", low=0.79,
                  high=0.84, params=_p(**d1), note="against the non-support count; R^2 "
                                                   ">= 0.998"),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "nonsupport_growth", low=108, high=111,
                  params=_p(**d1), relation="~",
                  note="from about 32-34 non-support tokens at 0K"),
        Reference(_F, "App. D.1", ANY_MODEL, qa1, "statement", None, _p(**d1),
                  note="correct examples carry more support mass in 16/16 model-background "
                       "cells and more recall@64 in 14/16"),
    ]
    p_hat = {"qwen-2.5-7b": (0.475, 0.224), "gemma-7b": (0.451, 0.226),
             "llama-3-8b": (0.443, 0.172), "mistral-7b-v0.3": (0.451, 0.205)}
    for model, (a, b) in p_hat.items():
        for bg, v in (("0K", a), ("4K", b)):
            out.append(Reference(_F, "App. D.1", model, qa1, "outranking_probability", v,
                                 _p(background=bg, **d1)))
    # App. E.5 positional control (BOS + N - 1 most recent tokens)
    out += [
        Reference(_F, "App. E.5", "qwen-2.5-7b", qa1, "statement", None,
                  _p(ranking="positional", tau_nats=0.10, protocol="qa"),
                  note="positional control (BOS + N-1 most recent) never passes at 0K, 2K "
                       "or 4K for N in 16..256"),
        Reference(_F, "App. E.5", "mistral-7b-v0.3", qa1, "n_star_qa", 32,
                  _p(ranking="positional", tau_nats=0.10, background="0K", protocol="qa"),
                  note="positional control (BOS + N-1 most recent); never passes at 2K/4K"),
    ]
    return out


def _geometry_paper() -> list[Reference]:
    g = GEOMETRY_PAPER
    both = BOTH
    geo = dict(protocol="geometry")
    out = [
        Reference(g, "results (explainer)", ANY_MODEL, both, "statement", None,
                  _p(rule="attention", **geo),
                  note="top-attention sets are more separable than random sets of the same "
                       "size in every model, most at small and intermediate N"),
        Reference(g, "review thread (reviewer 3)", ANY_MODEL, both, "best_n", low=1, high=4,
                  params=_p(rule="attention", **geo), relation="~"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "sink_norm_ratio", low=3,
                  high=10, params=_p(**geo),
                  note="the first token's value norm is 3-10 times smaller than the others'"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "statement", None, _p(**geo),
                  note="the sink's value aligns negatively with the non-sink directions"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "sink_f_drop", 2,
                  _p(rule="attention", **geo), relation="~",
                  note="F_N falls, often by about a factor of two, when the sink is selected"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "regime_share", low=0.058,
                  high=0.172, params=_p(regime="Retriever", **geo),
                  note="always a minority"),
        Reference(g, "results (explainer); review thread", "gemma-7b", both, "statement",
                  None, _p(regime="Mixer", **geo), note="Mixer the common regime"),
        Reference(g, "results (explainer); review thread", "llama-3-8b", both, "statement",
                  None, _p(regime="Mixer", **geo), note="Mixer the common regime"),
        Reference(g, "results (explainer); review thread", "mistral-7b", both, "statement",
                  None, _p(regime="Reset", **geo), note="Reset the most common regime"),
        Reference(g, "results (explainer); review thread", "llama-2-7b", both, "statement",
                  None, _p(regime="Reset", **geo),
                  note="Reset the most common regime; the taxonomy table is for LLaMA-2-7B"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "statement", None, _p(**geo),
                  note="the dominant regime is the same on OpenWebText and WikiText-103"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "statement", None, _p(**geo),
                  note="Mixer outputs align with the sink; Retriever outputs with the "
                       "current token"),
        Reference(g, "results (explainer)", ANY_MODEL, both, "statement", None, _p(**geo),
                  note="the taxonomy is a useful coarse pruning signal at moderate keep "
                       "fractions, not always better than magnitude or entropy"),
        Reference(g, "results (explainer)", "gemma-7b", both, "statement", None,
                  _p(layer=0, head=12, **geo),
                  note="removing layer 0 head 12 alone makes Gemma-7B fail"),
        Reference(g, "review thread (reviewer 1)", ANY_MODEL, both, "oscillation_n", low=100,
                  high=800, params=_p(**geo), relation="~",
                  note="an oscillatory regime of F_N for N between about 100 and 800"),
    ]
    return out


def _setup() -> list[Reference]:
    """Setup numbers a run is compared against (Sec. 3, App. B)."""
    return [
        Reference(_F, "App. B.3", ANY_MODEL, WT, "statement", None, _p(protocol="context"),
                  note="WikiText preparation kept 2044 of 2048 rows (4 duplicate ID+text "
                       "rows removed)"),
        Reference(_F, "App. C.4", "llama-3-8b", WT, "statement", None,
                  _p(ranking="attention", tau=0.05, scoring="tail128", protocol="context"),
                  note="N*_5% at L = 256, 512, 1024, 2048 (10, 18, 34, 66) equals 2 + L/32 "
                       "exactly"),
        Reference(_F, "App. C.4", ANY_MODEL, BOTH, "statement", None,
                  _p(ranking="attention", tau=0.05, scoring="tail128", protocol="context"),
                  note="the conditional bootstrap intervals of the log-log slope contain 1 "
                       "for Gemma-7B on OpenWebText and Llama-3-8B on both corpora"),
        Reference(_F, "Sec. 3.3, App. B.4", ANY_MODEL, QA["qa1"], "statement", None,
                  _p(protocol="qa"),
                  note="100 examples a background; 86 pass span validation (90 unambiguous "
                       "and 10 ambiguous support mappings)"),
        Reference(_F, "App. C.4", ANY_MODEL, BOTH, "statement", None, _p(protocol="context"),
                  note="27 of 32 model-corpus-length conditions complete: 324 estimates "
                       "(27 x 2 rankings x 3 tau x 2 scorings)"),
    ]


REFERENCES: tuple[Reference, ...] = tuple(
    _table1() + _table2() + _context_tables() + _c4_numbers() + _other_lm() + _table9()
    + _babilong() + _geometry_paper() + _setup())


def references(*, model: str | None = None, corpus: str | None = None,
               quantity: str | None = None) -> list[Reference]:
    """The references matching every given filter (corpus compared case-insensitively)."""
    out = []
    for ref in REFERENCES:
        if model is not None and ref.model != model:
            continue
        if corpus is not None and ref.corpus.lower() != corpus.lower():
            continue
        if quantity is not None and ref.quantity != quantity:
            continue
        out.append(ref)
    return out


def paper_models(source: str = FOLLOW_UP) -> tuple[str, ...]:
    """The preset names a paper reports numbers for."""
    return tuple(sorted({r.model for r in REFERENCES
                         if r.source == source and r.model != ANY_MODEL}))


FRAME_COLUMNS = ("source", "where", "model", "corpus", "quantity", "value", "relation",
                 "low", "high", "params", "note")


def references_frame():
    """One row per reference; ``params`` as a sorted JSON object, so the frame is flat."""
    import pandas as pd

    def num(x):
        return math.nan if x is None else float(x)

    rows = [{"source": r.source, "where": r.where, "model": r.model, "corpus": r.corpus,
             "quantity": r.quantity, "value": num(r.value), "relation": r.relation,
             "low": num(r.low), "high": num(r.high),
             "params": json.dumps(dict(r.params), sort_keys=True), "note": r.note}
            for r in REFERENCES]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))

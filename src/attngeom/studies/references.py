"""Published reference values, shown beside a study's own measurements.

Only numbers a paper states in its text or tables belong here, each with the exact
place and a short verbatim quote so anyone can check it; a result shown only in a
figure is left out rather than read off the plot. When this table was written the
papers' full text could not be read offline (only the geometry paper's abstract,
which states no numbers), so no values are quoted yet: :data:`UNAVAILABLE` says so
per source, and the study report prints it instead of an empty comparison.

Vocabulary. ``quantity`` is one of :data:`QUANTITIES`; ``params`` pins the setting a
value belongs to with the keys of :data:`PARAM_KEYS` (``n``, ``rule``, ``variant``,
``distance``, ``tau``, ``renormalize``, ``layer``, ``head``, ``regime``,
``keep_fraction``, ``ranker``), which are the names the results tables use.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from attngeom.errors import ConfigError
from attngeom.names import DISTANCES, RANKERS, REGIMES, RULES, VARIANTS
from attngeom.studies.presets import PRESETS

GEOMETRY_PAPER = "arXiv 2602.01893"  # Mudarisov, Burtsev, Petrova, State (2026)
FOLLOW_UP = "arXiv 2609.37879"

QUANTITIES = {
    "f_score": "top-N F-score F_N of selected vs non-selected value states",
    "precision": "top-N geometric precision",
    "recall": "top-N geometric recall",
    "n_star": "smallest top-N restriction N with relative delta-NLL <= tau (N*_tau)",
    "spearman_f_dnll": "Spearman correlation of F_N with the restriction's relative delta-NLL",
    "sink_norm_ratio": "mean non-sink value norm over the sink's value norm",
    "sink_cos": "cosine of the sink's value with the other values",
    "regime_share": "share of heads labelled with one regime (Retriever, Mixer, Reset)",
    "ppl": "perplexity",
    "delta_nll_rel": "relative change of the next-token NLL against the unmodified model",
}

PARAM_KEYS = ("n", "rule", "variant", "distance", "tau", "renormalize", "layer", "head",
              "regime", "keep_fraction", "ranker")
_CHOICES = {"rule": RULES, "variant": VARIANTS, "distance": DISTANCES, "regime": REGIMES,
            "ranker": RANKERS}
MAX_QUOTE_WORDS = 20

UNAVAILABLE: dict[str, str] = {
    GEOMETRY_PAPER: "only the abstract could be read offline when this table was written, "
                    "and it states no numbers; no values are quoted",
    FOLLOW_UP: "text not available offline when this table was written; no values are quoted",
}


@dataclass(frozen=True)
class Reference:
    """One published number with where it comes from and the setting it belongs to."""

    source: str  # "arXiv 2602.01893"
    where: str  # "Table 2", "Section 5.1": the exact place
    model: str  # a preset name
    corpus: str  # "wikitext-103", "openwebtext", ...
    quantity: str  # a key of QUANTITIES
    value: float
    params: tuple[tuple[str, object], ...]  # (("n", 8), ("rule", "attention"), ...)
    quote: str  # <= 20 words, verbatim from the sentence or table row

    def __post_init__(self) -> None:
        # checked on construction, so a mistyped entry fails at import, not in a report
        for field in ("source", "where", "corpus", "quote"):
            if not str(getattr(self, field)).strip():
                raise ConfigError(f"reference {self.quantity!r}: empty {field}")
        if self.model not in PRESETS:
            raise ConfigError(f"reference model {self.model!r} is not a preset name")
        if self.quantity not in QUANTITIES:
            raise ConfigError(f"reference quantity {self.quantity!r}: expected one of "
                              f"{', '.join(QUANTITIES)}")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) \
                or not math.isfinite(self.value):
            raise ConfigError(f"reference {self.quantity!r}: value must be a finite number, "
                              f"got {self.value!r}")
        if len(self.quote.split()) > MAX_QUOTE_WORDS:
            raise ConfigError(f"reference {self.quantity!r}: quote longer than "
                              f"{MAX_QUOTE_WORDS} words")
        keys = [k for k, _ in self.params]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"reference {self.quantity!r}: repeated params key")
        for key, value in self.params:
            if key not in PARAM_KEYS:
                raise ConfigError(f"reference params key {key!r}: expected one of "
                                  f"{', '.join(PARAM_KEYS)}")
            if key in _CHOICES and value not in _CHOICES[key]:
                raise ConfigError(f"reference params {key}={value!r}: expected one of "
                                  f"{', '.join(_CHOICES[key])}")


REFERENCES: tuple[Reference, ...] = ()


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


FRAME_COLUMNS = ("source", "where", "model", "corpus", "quantity", "value", "params", "quote")


def references_frame():
    """One row per reference; ``params`` as a sorted JSON object, so the frame is flat."""
    import pandas as pd

    rows = [{"source": r.source, "where": r.where, "model": r.model, "corpus": r.corpus,
             "quantity": r.quantity, "value": float(r.value),
             "params": json.dumps(dict(r.params), sort_keys=True), "quote": r.quote}
            for r in REFERENCES]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))

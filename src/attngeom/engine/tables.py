"""From accumulator columns to the run's tidy tables (method §5, §6, §8).

``summary`` is built from the per-window rows of ``metrics`` alone, so any other
aggregate can be recomputed from the stored table the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attngeom.core.accumulators import SINK_EFFECT_COLUMNS
from attngeom.core.geometry import METRICS
from attngeom.core.stats import bootstrap_mean_ci
from attngeom.names import RULES

SUMMARY_KEYS = ("rule", "variant", "distance", "n")


def frame(columns: dict, *, model: str, corpus: str):
    """A DataFrame of accumulator columns with the identifying columns first."""
    import pandas as pd

    df = pd.DataFrame({k: np.asarray(v) for k, v in columns.items()})
    df.insert(0, "corpus", corpus)
    df.insert(0, "model", model)
    return df


def summarize(metrics, *, n_boot: int, seed: int, level: float = 0.95):
    """Window-bootstrap means of every metric at head, layer and model scope.

    Per window the metric is first averaged over the heads in scope (NaN heads left
    out), then windows are resampled. ``trivial`` rows (euclidean N = 1) are kept but
    flagged, so a "non-trivial" summary is one filter away.
    """
    import pandas as pd

    if metrics.empty:
        return pd.DataFrame(columns=_SUMMARY_COLUMNS)
    model, corpus = metrics["model"].iloc[0], metrics["corpus"].iloc[0]
    parts = []
    for scope, keys in (
        ("head", ["layer", "head"]),
        ("layer", ["layer"]),
        ("model", []),
    ):
        index = [*keys, *SUMMARY_KEYS]
        for metric in METRICS:
            wide = metrics.pivot_table(
                index=index, columns="window", values=metric, aggfunc="mean", dropna=False,
                observed=True,
            )
            mean, low, high, count = bootstrap_mean_ci(
                wide.to_numpy(dtype=np.float64), n_boot=n_boot, level=level, seed=seed
            )
            out = wide.index.to_frame(index=False)
            out["metric"] = metric
            out["mean"], out["ci_low"], out["ci_high"] = mean, low, high
            out["n_windows"] = count.astype(np.int64)
            if "layer" not in out:
                out["layer"] = -1
            if "head" not in out:
                out["head"] = -1
            out["scope"] = scope
            parts.append(out)
    df = pd.concat(parts, ignore_index=True)
    df["trivial"] = (df["n"] == 1) & (df["distance"] == "euclidean")
    df.insert(0, "corpus", corpus)
    df.insert(0, "model", model)
    df["layer"] = df["layer"].astype(np.int64)
    df["head"] = df["head"].astype(np.int64)
    return df[_SUMMARY_COLUMNS].reset_index(drop=True)


_SUMMARY_COLUMNS = [
    "model", "corpus", "scope", "layer", "head", "rule", "variant", "distance", "n",
    "metric", "mean", "ci_low", "ci_high", "n_windows", "trivial",
]


def with_token_text(sink_tokens, tokenizer):
    """``sink_tokens`` with a ``token`` column: each id as the tokenizer writes it.

    The position-0 line of a run whose windows start with different tokens reads
    ``(window start)``.
    """
    df = sink_tokens.copy()
    ids = df["token_id"].to_numpy()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    text = {int(i): _token_text(tokenizer, int(i), special) for i in set(ids.tolist()) if i >= 0}
    df.insert(df.columns.get_loc("token_id") + 1, "token",
              [text[int(i)] if i >= 0 else "(window start)" for i in ids])
    return df


def _token_text(tokenizer, token_id: int, special: set[int]) -> str:
    """A special token by name (``<s>``, ``[SEP]``), any other as its quoted text
    (``'.'``, ``'\\n'``), so that whitespace stays visible."""
    text = tokenizer.decode([token_id])
    if token_id in special or "\ufffd" in text:  # a byte piece alone decodes to U+FFFD
        return str(tokenizer.convert_ids_to_tokens(token_id))
    return repr(text)


def sink_table(sink, effect):
    """method §6 sink statistics joined with the F_N split by whether the sink was selected.

    The split is averaged per window (over the queries of each kind), then over the
    windows where that kind occurred.
    """
    if effect is None or effect.empty:
        # the split needs both variants of the attention rule; without them it is NaN
        sink = sink.copy()
        for c in SINK_EFFECT_COLUMNS:
            if c not in sink.columns:
                sink[c] = np.nan
        return sink
    cols = [c for c in effect.columns if c.startswith("f_")]
    per_head = effect.groupby(["layer", "head", "n"], as_index=False)[cols].mean()
    base = sink.drop(columns=[c for c in cols if c in sink.columns])
    return base.merge(per_head, on=["layer", "head", "n"], how="left")


def bounds_table(bounds, summary):
    """The constant-norm envelope beside the measured attention-rule metrics (method §8)."""
    if bounds is None or summary is None or summary.empty:
        return bounds
    sel = summary[
        (summary["scope"] == "head") & (summary["rule"] == "attention")
        & (summary["variant"] == "full") & (summary["distance"] == "euclidean")
    ]
    wide = sel.pivot_table(index=["layer", "head", "n"], columns="metric", values="mean")
    rename = {"precision": "precision_measured", "recall": "recall_measured",
              "f_score": "f_measured"}
    wide = wide[[c for c in rename if c in wide.columns]].rename(columns=rename).reset_index()
    wide.columns.name = None
    base = bounds.drop(columns=[c for c in rename.values() if c in bounds.columns])
    return base.merge(wide, on=["layer", "head", "n"], how="left")


def headline(summary, *, rules: Sequence[str] = RULES.names()):
    """The demo's table: F_N by rule and N over all heads (full universe, euclidean)."""
    sel = summary[
        (summary["scope"] == "model") & (summary["metric"] == "f_score")
        & (summary["variant"] == "full") & (summary["distance"] == "euclidean")
        & summary["rule"].isin(rules)
    ]
    return sel[["rule", "n", "mean", "ci_low", "ci_high", "n_windows", "trivial"]].sort_values(
        ["n", "rule"]
    )


def head_score_table(scores, *, inputs: str, seed: int):
    """Table ``head_scores`` from the accumulator's columns: each head type's threshold
    and the binary label (>= the threshold, <= for the types that say ``below``; NaN, a
    score with no counted row, is no label), what the score was measured on, the seed."""
    from attngeom.core.head_scores import below, threshold

    df = scores.copy()
    df["threshold"] = df["score"].map(threshold)
    low = df["score"].map(below).astype(bool)
    df["is_type"] = (((low & (df["value"] <= df["threshold"]))
                      | (~low & (df["value"] >= df["threshold"]))) & df["value"].notna())
    df["inputs"] = inputs
    df["seed"] = int(seed)
    return df

"""Column schemas of every results table (docs/internals.md, "Table schemas").

``SCHEMAS`` maps a table name to its ordered columns and their dtypes; the file of
table ``name`` is ``name.parquet`` and holds these columns first, in this order, then
any extra columns in the order the writer gave them. ``ROW_KEYS`` names the columns a
table's rows are sorted by before writing, so that the same rows give the same file
whatever order they were produced in (shards merged must equal one run).

Dtypes are one of ``"string"``, ``"int64"``, ``"float64"``, ``"bool"``. Integer-valued
quantities that can be undefined (``largest_certified_n``, ``n_star``) are float64 so
that "undefined" is NaN, never 0 (STYLE 10).

>>> list(SCHEMAS["taxonomy"])[:4]
['model', 'corpus', 'layer', 'head']
>>> ROW_KEYS["sink_tokens"]
('model', 'corpus', 'layer', 'head', 'position', 'token_id')
"""

from __future__ import annotations

from attngeom.errors import ConfigError, RunDirError
from attngeom.registry import Registry

STRING, INT, FLOAT, BOOL = "string", "int64", "float64", "bool"


def _cols(spec: str) -> dict[str, str]:
    """``"a:s b:i c:f d:b"`` -> ordered ``{column: dtype}``."""
    short = {"s": STRING, "i": INT, "f": FLOAT, "b": BOOL}
    out: dict[str, str] = {}
    for item in spec.split():
        name, kind = item.split(":")
        out[name] = short[kind]
    return out


_ID = "model:s corpus:s "
_BOUND_COLUMNS = (
    "precision_bound:f recall_bound:f f_bound:f precision_inv_bound:f recall_inv_bound:f"
)

_DECLARED: dict[str, dict[str, str]] = {
    "metrics": _cols(
        _ID + "window:i layer:i head:i rule:s variant:s distance:s n:i "
        "precision:f recall:f f_score:f margin:f inversions:f n_queries:i n_skipped:i "
        "trivial:b " + _BOUND_COLUMNS
    ),
    "summary": _cols(
        _ID + "scope:s layer:i head:i rule:s variant:s distance:s n:i metric:s "
        "mean:f ci_low:f ci_high:f n_windows:i trivial:b"
    ),
    "sink": _cols(
        _ID + "layer:i head:i n:i sink_position:i norm_ratio:f sink_cos_mean:f "
        "sink_cos_pairwise:f sink_mass:f sink_in_top_n:f f_full_sink_selected:f "
        "f_full_sink_unselected:f f_nosink_sink_selected:f f_nosink_sink_unselected:f "
        "n_windows:i"
    ),
    "sink_tokens": _cols(
        _ID + "layer:i head:i position:i token_id:i token:s occurrences:i windows:i pairs:i "
        "mean_share:f uniform_share:f share_q1:f median_share:f share_q3:f share_held:f "
        "lift:f detected:b n_windows:i"
    ),
    "taxonomy": _cols(
        _ID + "layer:i head:i n_queries:i f_self:f f_sink:f f_other:f offset_entropy:f "
        "sink_alignment:f self_alignment:f mean_output_norm:f regime:s regime_rule:s "
        "winning_share:f runner_up_share:f top_source_kind:s top_source:i "
        "top_source_share:f stability:f"
    ),
    "bounds": _cols(
        _ID + "layer:i head:i n:i kappa:f mu:f mu_quantile:f sink_cos:f "
        "precision_envelope:f recall_envelope:f f_envelope:f certified:b "
        "largest_certified_n:f precision_measured:f recall_measured:f f_measured:f "
        "pair_violation_rate:f pair_violation_max:f sink_cos_violation_rate:f "
        "sink_cos_violation_max:f"
    ),
    "assumptions": _cols(
        _ID + "layer:i head:i norm_cv:f sink_norm_ratio:f cos_decay_lambda:f "
        "cos_decay_mae:f negative_cos_share:f mass_sink:f mass_middle:f mass_recent:f"
    ),
    "pruning": _cols(
        _ID + "ranker:s seed:i order:s keep_fraction:f heads_kept:i nll:f perplexity:f "
        "delta_nll_rel:f"
    ),
    "rankings": _cols(_ID + "ranker:s seed:i order:s rank:i layer:i head:i score:f"),
    "head_scan": _cols(
        _ID + "layer:i head:i nll:f delta_nll_rel:f critical:b threshold:f"
    ),
    "restrict": _cols(
        _ID + "scope:s layer:i head:i n:i renormalize:b nll:f perplexity:f delta_nll_rel:f "
        "ranking:s on_grid:b passes:s"
    ),
    "restrict_nstar": _cols(
        _ID + "scope:s layer:i head:i renormalize:b tau:f n_star:f n_star_status:s "
        "ranking:s grid_n_star:f n_star_low:f n_star_high:f n_evaluated:i search:s "
        "monotone:b note:s window_length:i n_star_bisect:f n_star_interpolate:f "
        "oracle_n_star:f ratio:f ratio_low:f ratio_high:f"
    ),
    "restrict_local": _cols(
        _ID + "scope:s layer:i head:i ranking:s renormalize:b n:i nll:f delta_nll_rel:f "
        "mean_doc_delta_rel:f rank:i n_windows:i"
    ),
    # each head restricted alone at the attention oracle's N*_tau (restrict --alone-tau)
    "restrict_alone": _cols(
        _ID + "layer:i head:i ranking:s renormalize:b tau:f n:i nll:f delta_nll_rel:f "
        "mean_doc_delta_rel:f status:s n_windows:i"
    ),
    # the head atlas (probes/atlas.py): the field's head types, one row per head and score
    "head_scores": _cols(
        _ID + "layer:i head:i score:s value:f threshold:f is_type:b n_samples:i inputs:s seed:i"
    ),
    # the head atlas beside the regimes (``attngeom atlas``, probes/atlas.py)
    "atlas_contingency": _cols(
        _ID + "regime:s head_type:s count:i n_regime:i share_of_regime:f share_of_type:f"
    ),
    "atlas_kappa": _cols(_ID + "regime:s head_type:s kappa:f both:i n_heads:i"),
    "atlas_depth": _cols(_ID + "layer:i kind:s name:s count:i n_heads:i share:f"),
    "atlas_fn": _cols(_ID + "head_type:s n:i n_heads:i f_attention:f f_random:f f_gap:f"),
    # the competition probes (``attngeom competition``, probes/competition.py)
    "competition_settings": _cols(_ID + "setting:s value:s"),
    "qa_answers": _cols(
        _ID + "background:i prompt_format:s n_examples:i accuracy:f accuracy_low:f "
        "accuracy_high:f loss:f loss_low:f loss_high:f screen:b scoring:s"
    ),
    "qa_examples": _cols(
        _ID + "background:i episode:i answer:s predicted:s correct:b loss:f prompt_tokens:i"
    ),
    "qa_support": _cols(
        _ID + "background:i score:s statistic:s split:s layer:i head:i mean:f ci_low:f "
        "ci_high:f n_examples:i"
    ),
    "qa_support_summary": _cols(
        _ID + "background:i score:s statistic:s split:s mean:f"
    ),
    "qa_curve": _cols(_ID + "background:i ranking:s mode:s n:i delta_loss:f accuracy:f"),
    "qa_nstar": _cols(
        _ID + "background:i ranking:s mode:s tau:f nstar:f grid_nstar:f nstar_low:f "
        "nstar_high:f"
    ),
    # every selection at the budgets and at its N* (issue 39: retrieval per policy)
    "qa_budget": _cols(
        _ID + "background:i ranking:s mode:s n:i budget:b nstar_taus:s n_examples:i "
        "accuracy:f accuracy_low:f accuracy_high:f delta_loss:f delta_low:f delta_high:f "
        "support_recall:f recall_low:f recall_high:f"
    ),
    "context_nll": _cols(_ID + "length:i scoring:s nll:f"),
    "context_curve": _cols(_ID + "length:i ranking:s mode:s scoring:s n:i delta_rel:f"),
    "context_nstar": _cols(
        _ID + "length:i ranking:s mode:s scoring:s tau:f nstar:f grid_nstar:f nstar_low:f "
        "nstar_high:f"
    ),
    "context_slope": _cols(
        _ID + "ranking:s mode:s scoring:s tau:f slope:f slope_low:f slope_high:f n_lengths:i"
    ),
    # the geometry of what each ranking keeps at the final query (issue 39, probes/kept.py)
    "kept_geometry": _cols(
        _ID + "length:i layer:i head:i ranking:s n:i kept:f overlap:f precision:f recall:f "
        "f_score:f f_random:f n_windows:i"
    ),
    "kept_summary": _cols(
        _ID + "length:i ranking:s n:i n_windows:i kept:f overlap:f overlap_low:f "
        "overlap_high:f precision:f recall:f f_score:f f_score_low:f f_score_high:f "
        "f_random:f f_random_low:f f_random_high:f f_gap:f f_gap_low:f f_gap_high:f"
    ),
    # study tables (``attngeom reproduce``): computed from the runs' tables
    "regime_stability": _cols(
        _ID + "other_corpus:s n_heads:i excluded:i agreement:f kappa:f "
        "n_stable:i stable_agreement:f"
    ),
    "geometry_loss": _cols(
        _ID + "distance:s rule:s variant:s metric:s renormalize:b n_points:i ns:s "
        "spearman:f"
    ),
    "reference_values": _cols(
        _ID + "quantity:s params:s published:f measured:f source:s location:s quote:s"
    ),
    # step policy_atlas (studies/combine.py): heads alone per head type of the atlas, and
    # the heads that break first (heads alone, or the localised scan) with their types
    "policy_head_types": _cols(
        _ID + "part:s ranking:s renormalize:b tau:f n:i head_type:s n_heads:i "
        "mean_delta_nll_rel:f max_delta_nll_rel:f"
    ),
    "policy_first_heads": _cols(
        _ID + "part:s ranking:s renormalize:b n:i rank:i layer:i head:i "
        "mean_doc_delta_rel:f head_types:s streaming:f streaming_share:f n_heads:i"
    ),
}
# tables a study part writes under names apart (``config.CommandSpec.study_tables``),
# because another part writes the originals on the same model and corpus: the policies
# part's restriction tables (``restrict-policies``) and the atlas' own taxonomy
STUDY_NAMES = (("policy_restrict", "restrict"), ("policy_nstar", "restrict_nstar"),
               ("policy_alone", "restrict_alone"), ("atlas_summary", "summary"),
               ("atlas_taxonomy", "taxonomy"))
for _study_name, _run_name in STUDY_NAMES:
    _DECLARED[_study_name] = dict(_DECLARED[_run_name])

_MC = ("model", "corpus")
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "metrics": (*_MC, "window", "layer", "head", "rule", "variant", "distance", "n"),
    "summary": (*_MC, "scope", "layer", "head", "rule", "variant", "distance", "n", "metric"),
    "sink": (*_MC, "layer", "head", "n"),
    "sink_tokens": (*_MC, "layer", "head", "position", "token_id"),
    "taxonomy": (*_MC, "layer", "head"),
    "bounds": (*_MC, "layer", "head", "n"),
    "assumptions": (*_MC, "layer", "head"),
    "pruning": (*_MC, "ranker", "seed", "order", "keep_fraction"),
    "rankings": (*_MC, "ranker", "seed", "order", "rank"),
    "head_scan": (*_MC, "layer", "head"),
    "restrict": (*_MC, "scope", "layer", "head", "ranking", "renormalize", "n"),
    "restrict_nstar": (*_MC, "scope", "layer", "head", "ranking", "renormalize", "tau"),
    "restrict_local": (*_MC, "scope", "layer", "head", "ranking", "renormalize", "n"),
    "restrict_alone": (*_MC, "layer", "head", "ranking", "renormalize"),
    "head_scores": (*_MC, "layer", "head", "score"),
    "atlas_contingency": (*_MC, "regime", "head_type"),
    "atlas_kappa": (*_MC, "regime", "head_type"),
    "atlas_depth": (*_MC, "layer", "kind", "name"),
    "atlas_fn": (*_MC, "head_type", "n"),
    "competition_settings": (*_MC, "setting"),
    "qa_answers": (*_MC, "background"),
    "qa_examples": (*_MC, "background", "episode"),
    "qa_support": (*_MC, "background", "score", "statistic", "split", "layer", "head"),
    "qa_support_summary": (*_MC, "background", "score", "statistic", "split"),
    "qa_curve": (*_MC, "background", "ranking", "mode", "n"),
    "qa_nstar": (*_MC, "background", "ranking", "mode", "tau"),
    "qa_budget": (*_MC, "background", "ranking", "mode", "n"),
    "context_nll": (*_MC, "length", "scoring"),
    "context_curve": (*_MC, "length", "ranking", "mode", "scoring", "n"),
    "context_nstar": (*_MC, "length", "ranking", "mode", "scoring", "tau"),
    "context_slope": (*_MC, "ranking", "mode", "scoring", "tau"),
    "kept_geometry": (*_MC, "length", "layer", "head", "ranking", "n"),
    "kept_summary": (*_MC, "length", "ranking", "n"),
    "regime_stability": (*_MC, "other_corpus"),
    "geometry_loss": (*_MC, "distance", "rule", "variant", "metric", "renormalize"),
    "reference_values": (*_MC, "quantity", "params", "source", "location"),
    "policy_head_types": (*_MC, "part", "ranking", "renormalize", "head_type"),
    "policy_first_heads": (*_MC, "part", "ranking", "renormalize", "n", "rank"),
}
ROW_KEYS.update((_study_name, ROW_KEYS[_run_name]) for _study_name, _run_name in STUDY_NAMES)

# every table, in the order reports and combined study tables list them; a table added
# by an extension is one ``SCHEMAS.register(name, columns)`` (with its ``ROW_KEYS``)
SCHEMAS: Registry[dict[str, str]] = Registry("table", option="table")
for _name, _columns in _DECLARED.items():
    SCHEMAS.register(_name, _columns)

# The analysis of ``attngeom analyze`` that writes each of its tables (the other tables
# are written by the intervention commands); the analyses themselves, in the order they
# run, are ``names.ANALYSES`` (``engine/analyses.py`` registers an accumulator for each).
WRITTEN_BY = {
    "metrics": "metrics", "summary": "metrics", "sink": "sink", "sink_tokens": "sink",
    "taxonomy": "taxonomy", "bounds": "bounds", "assumptions": "assumptions",
    "head_scores": "head_scores",
}


def analysis_tables(analysis: str) -> tuple[str, ...]:
    """The tables analysis ``analysis`` writes, in schema order."""
    return tuple(t for t, a in WRITTEN_BY.items() if a == analysis)


def table_file(name: str) -> str:
    """The file name of table ``name`` inside a run directory (``name.parquet``)."""
    check_table_name(name)
    return f"{name}.parquet"


def check_table_name(name: str) -> None:
    """Raise ``ConfigError`` (did you mean ...) unless ``name`` is a registered table."""
    SCHEMAS.check(name)


def validate_table(name: str, df, *, source: str | None = None) -> None:
    """Check that ``df`` holds every column of table ``name`` with a compatible dtype.

    Missing columns, or a column whose values cannot be the schema's dtype (text in a
    number column, numbers in a text column), raise ``ConfigError`` when the frame
    is about to be written, or ``RunDirError`` naming ``source`` when it was read
    from that file. Extra columns are allowed. An unknown ``name`` is a
    ``ConfigError`` either way.

    >>> import pandas as pd
    >>> validate_table("head_scan", pd.DataFrame({"model": ["m"]}))
    Traceback (most recent call last):
    ...
    attngeom.errors.ConfigError: table head_scan: missing columns corpus, layer, head, nll, \
delta_nll_rel, critical, threshold
    """
    import pandas as pd
    from pandas.api import types as pt

    check_table_name(name)
    where = f"table {name}" if source is None else f"{source} (table {name})"
    error = ConfigError if source is None else RunDirError
    missing = [c for c in SCHEMAS[name] if c not in df.columns]
    if missing:
        raise error(f"{where}: missing columns {', '.join(missing)}")
    for column, dtype in SCHEMAS[name].items():
        s = df[column]
        if dtype == STRING:
            ok = (
                pt.is_string_dtype(s)
                or pt.is_object_dtype(s)
                or isinstance(s.dtype, pd.CategoricalDtype)
            )
        elif dtype == BOOL:
            ok = pt.is_bool_dtype(s) or (pt.is_object_dtype(s) and _all_bool(s))
        else:
            ok = (pt.is_numeric_dtype(s) and not pt.is_complex_dtype(s)) or (
                len(s) == 0 and pt.is_object_dtype(s)
            )
        if not ok:
            raise error(f"{where}: column {column}: expected {dtype}, got {s.dtype}")


def _all_bool(s) -> bool:
    return all(isinstance(v, bool) for v in s.tolist())

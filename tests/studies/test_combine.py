"""The study's combined tables: geometry against loss as the follow-up's Table 1, and the
published values beside ours (matches for the paper's models, ranges as context for
the others). Synthetic tables, so every expected number is worked out here."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attngeom.studies import references as refs
from attngeom.studies.combine import geometry_loss, reference_values, spearman

GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def _summary(model, corpus, rule, distance, values, ns=GRID):
    return pd.DataFrame({"model": model, "corpus": corpus, "scope": "model", "layer": -1,
                         "head": -1, "rule": rule, "variant": "full", "distance": distance,
                         "n": ns, "metric": "f_score", "mean": values})


def _restrict(model, corpus, ranking, values, ns=GRID, renorm=False, with_ranking=True):
    df = pd.DataFrame({"model": model, "corpus": corpus, "scope": "model", "layer": -1,
                       "head": -1, "n": ns, "renormalize": renorm, "delta_nll_rel": values})
    if with_ranking:
        df["ranking"] = ranking
    return df


def _ranked(x):
    """Average ranks written out (1-based), ties sharing the mean of their places."""
    x = list(x)
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _slow_spearman(x, y):
    rx, ry = np.array(_ranked(x)), np.array(_ranked(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / math.sqrt((rx * rx).sum() * (ry * ry).sum()))


@pytest.fixture
def two_corpora():
    rng = np.random.default_rng(3)
    s, r = [], []
    curves = {}
    for corpus in ("owt", "wt"):
        for rule in ("attention", "contribution", "random"):
            for distance in ("euclidean", "cosine"):
                f = np.round(rng.uniform(0, 1, len(GRID)), 1)  # ties on purpose
                s.append(_summary("m", corpus, rule, distance, f))
                curves[(corpus, rule, distance, "f")] = f
            d = np.round(rng.uniform(0, 2, len(GRID)), 1)
            r.append(_restrict("m", corpus, rule, d))
            curves[(corpus, rule, "d")] = d
    return pd.concat(s), pd.concat(r), curves


def test_table1_averages_over_corpora_then_ranks(two_corpora):
    summary, restrict, c = two_corpora
    gl = geometry_loss(summary, restrict)
    avg = gl[gl["averaged"]]
    # one row per distance x ranking (attention, contribution) x N range
    assert len(avg) == 2 * 2 * 3 and set(avg["corpus"]) == {"owt+wt"}
    assert set(avg["rule"]) == {"attention", "contribution"}  # random is not in Table 1
    for row in avg.itertuples():
        f = (c[("owt", row.rule, row.distance, "f")] + c[("wt", row.rule, row.distance,
                                                          "f")]) / 2
        d = (c[("owt", row.rule, "d")] + c[("wt", row.rule, "d")]) / 2
        keep = [i for i, n in enumerate(GRID) if n >= row.n_min]
        assert row.n_points == {1: 9, 2: 8, 8: 6}[row.n_min]
        assert row.ns == ",".join(str(GRID[i]) for i in keep)
        assert row.spearman == pytest.approx(_slow_spearman(f[keep], d[keep]))
    alone = gl[~gl["averaged"]]
    assert set(alone["corpus"]) == {"owt", "wt"} and len(alone) == 2 * len(avg)


def test_only_the_n_every_corpus_holds_count():
    s = pd.concat([_summary("m", "a", "attention", "euclidean", [1, 2, 3, 4], ns=[1, 2, 4, 8]),
                   _summary("m", "b", "attention", "euclidean", [4, 3, 2, 1, 0],
                            ns=[1, 2, 4, 8, 16])])
    r = pd.concat([_restrict("m", "a", "attention", [0.1, 0.2, 0.3, 0.4, 0.5],
                             ns=[1, 2, 4, 8, 16]),
                   _restrict("m", "b", "attention", [0.5, 0.4, 0.3, 0.2, 0.1],
                             ns=[1, 2, 4, 8, 16])])
    gl = geometry_loss(s, r, rankings=("attention",))
    row = gl[gl["averaged"] & (gl["n_min"] == 1)].iloc[0]
    assert row.ns == "1,2,4,8" and row.n_corpora == 2
    # averaged F is constant (2.5): the correlation says nothing
    assert math.isnan(row.spearman)
    b = gl[(gl["corpus"] == "b") & (gl["n_min"] == 1)].iloc[0]
    assert b.ns == "1,2,4,8,16" and b.spearman == pytest.approx(1.0)
    assert math.isnan(gl[(gl["corpus"] == "a") & (gl["n_min"] == 8)].iloc[0].spearman)


def test_a_restriction_without_rankings_is_attention():
    s = pd.concat([_summary("m", "a", rule, "euclidean", np.arange(9.0))
                   for rule in ("attention", "contribution")])
    r = _restrict("m", "a", None, -np.arange(9.0), with_ranking=False)
    gl = geometry_loss(s, r)
    assert set(gl["rule"]) == {"attention"} and not gl["averaged"].any()
    assert gl[gl["n_min"] == 1].iloc[0].spearman == pytest.approx(-1.0)
    assert len(geometry_loss(None, None)) == 0
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(
        _slow_spearman([1, 2, 2, 3], [1, 3, 2, 4]))


# --------------------------------------------------------------------------- references


def _study(models: dict, corpora: dict, window_length=1024, step="bisect", protocol="fixed"):
    """A stand-in for ``studies.study.Study``: labels -> preset (or None), corpora; one
    restrict cell per model and corpus (``step``: how its integer search narrows)."""
    m = {label: SimpleNamespace(preset=SimpleNamespace(name=p) if p else None)
         for label, p in models.items()}
    c = {label: SimpleNamespace(corpus=corpus) for label, corpus in corpora.items()}
    cfg = SimpleNamespace(window_length=window_length, document_protocol=protocol,
                          n_documents=50, search="adaptive", refine=3, step=step)
    cells = [SimpleNamespace(model=label, corpus=corpus, command=command, config=cfg)
             for label in models for corpus in corpora
             for command in ("restrict", "restrict-local")]
    return SimpleNamespace(models=m, corpora=c,
                           cells_of=lambda cmd: [x for x in cells if x.command == cmd])


def _nstar(model, corpus, tau, value, ranking="attention", renorm=False):
    return {"model": model, "corpus": corpus, "scope": "model", "layer": -1, "head": -1,
            "renormalize": renorm, "tau": tau, "n_star": float(value), "ranking": ranking}


_QWEN_NSTAR = [_nstar("qwen", "owt", 0.05, 35), _nstar("qwen", "wt", 0.05, 30),
               _nstar("qwen", "owt", 0.05, 20, renorm=True),
               _nstar("qwen", "owt", 0.05, 40, ranking="contribution")]


def test_the_same_model_and_setting_is_a_match_with_its_difference():
    study = _study({"qwen": "qwen-2.5-7b"}, {"owt": "openwebtext", "wt": "wikitext-103"})
    nstar = pd.DataFrame(_QWEN_NSTAR)
    gl = pd.DataFrame([{"model": "qwen", "corpus": "owt+wt", "distance": "cosine",
                        "rule": "attention", "variant": "full", "metric": "f_score",
                        "renormalize": False, "n_points": 6, "ns": "8,16,32,64,128,256",
                        "spearman": 0.9, "n_min": 8, "averaged": True, "n_corpora": 2}])
    rv = reference_values(study, {"restrict_nstar": nstar, "geometry_loss": gl},
                          refs.REFERENCES)
    assert set(rv["model"]) == {"qwen"}
    measured = rv[rv["kind"] != "not measured"]
    assert set(measured["kind"]) == {"match"} and (measured["differs"] == "").all()
    assert rv[rv["kind"] == "not measured"]["measured"].isna().all()

    def one(**kw):
        sel = rv
        for k, v in kw.items():
            sel = sel[sel[k] == v]
        return sel

    t2 = rv[(rv["location"] == "Table 2 (App. C.3)") & (rv["corpus"] == "owt")
            & rv["params"].str.contains('"tau": 0.05')]
    att = t2[t2["params"].str.contains('"ranking": "attention"')].iloc[0]
    assert (att.published, att.measured, att.difference) == (33, 35, 2)
    assert (att.our_length, att.paper_length) == ("1024", "1024")
    assert att.our_size == att.paper_size == "7.62B"  # the preset's published count
    con = t2[t2["params"].str.contains('"ranking": "contribution"')].iloc[0]
    assert (con.published, con.measured, con.difference) == (31, 40, 9)
    ren = one(location="Table 9 (App. E.1)")
    ren = ren[ren["params"].str.contains('"ranking": "attention"')
              & ren["params"].str.contains('"tau": 0.05')].iloc[0]
    assert (ren.published, ren.measured) == (15, 20)
    t1 = one(location="Table 1 (App. C.2)", corpus="owt+wt")
    t1 = t1[t1["params"].str.contains('"distance": "cosine"')
            & t1["params"].str.contains('"n_min": 8')].iloc[0]
    assert t1.published == pytest.approx(0.943) and t1.measured == 0.9
    assert t1.difference == pytest.approx(0.9 - 0.943) and t1.kind == "match"
    # a setting the study did not run is listed, not measured
    tail = one(location="Table 4 (App. C.4)")
    assert len(tail) and tail["measured"].isna().all() and tail["difference"].isna().all()
    assert set(tail["kind"]) == {"not measured"}
    assert "L = 1024, fixed windows, 50 documents" in att.our_setting


@pytest.mark.parametrize("change, differs", [
    (dict(window_length=64), "L: 64 vs 1024"),
    (dict(protocol="stream"), "windows: documents joined vs one per document"),
    (dict(step=None), "N* search: integer by interpolation, refine 3 vs integer by "
                      "bisection, refine 3"),
])
def test_the_paper_model_in_another_setting_is_context_saying_what_differs(change, differs):
    study = _study({"qwen": "qwen-2.5-7b"}, {"owt": "openwebtext", "wt": "wikitext-103"},
                   **change)
    rv = reference_values(study, {"restrict_nstar": pd.DataFrame(_QWEN_NSTAR)},
                          refs.REFERENCES)
    measured = rv[rv["measured"].notna()]
    assert len(measured) == 4 and set(measured["kind"]) == {"context"}
    assert (measured["differs"] == differs).all()
    # the model's own published value stays beside ours; no difference is taken
    att = measured[(measured["location"] == "Table 2 (App. C.3)")
                   & (measured["corpus"] == "owt")
                   & measured["params"].str.contains('"ranking": "attention"')].iloc[0]
    assert (att.published, att.measured) == (33, 35) and math.isnan(att.difference)


def test_a_spearman_over_fewer_sizes_is_context():
    study = _study({"qwen": "qwen-2.5-7b"}, {"owt": "openwebtext", "wt": "wikitext-103"})
    gl = pd.DataFrame([{"model": "qwen", "corpus": "owt+wt", "distance": "euclidean",
                        "rule": "attention", "variant": "full", "metric": "f_score",
                        "renormalize": False, "n_points": 5, "ns": "1,2,4,8,16",
                        "spearman": 0.5, "n_min": 1, "averaged": True, "n_corpora": 2}])
    rv = reference_values(study, {"geometry_loss": gl}, refs.REFERENCES)
    row = rv[rv["measured"].notna()].iloc[0]
    assert row.kind == "context" and math.isnan(row.difference)
    assert row.differs == "N range: 1..16 (5 sizes) vs 1..256 (9 sizes)"


def test_a_model_the_paper_did_not_run_gets_its_range_as_context_never_a_match():
    study = _study({"tiny": None, "smol": "smollm2-135m"}, {"owt": "openwebtext"},
                   window_length=64)
    nstar = pd.DataFrame([_nstar("tiny", "owt", 0.05, 9), _nstar("smol", "owt", 0.05, 5)])
    rv = reference_values(study, {"restrict_nstar": nstar}, refs.REFERENCES)
    assert set(rv["kind"]) == {"context"}
    assert rv["published"].isna().all() and rv["difference"].isna().all()
    row = rv[(rv["model"] == "tiny") & (rv["location"] == "Table 2 (App. C.3)")].iloc[0]
    # OWT, attention, deletion, 5%: Gemma-2-9B's 12 .. Gemma-7B's 226 over the nine
    assert (row.published_low, row.published_high, row.measured) == (12, 226, 9)
    assert row.published_text == "12-226" and "gemma-7b" in row.paper_models
    assert len(row.paper_models.split(",")) == 9
    # what differs, with the sizes: Qwen-2.5-1.5B (1.54B) .. Mistral-Small-24B (24B)
    assert row.differs.startswith("model: tiny (?) vs 9 models (1.24B-23.6B); "
                                  "L: 64 vs 1024")
    smol = rv[(rv["model"] == "smol") & (rv["location"] == "Table 2 (App. C.3)")].iloc[0]
    assert smol.our_size == "135M" and smol.paper_size == "1.24B-23.6B"
    assert (smol.our_length, smol.paper_length) == ("64", "1024")
    # only settings we measured are shown as context
    assert set(rv["quantity"]) == {"n_star"}


def test_a_study_without_a_matching_corpus_shows_nothing():
    study = _study({"qwen": "qwen-2.5-7b"}, {"tiny": "/data/tinystories.txt"})
    rv = reference_values(study, {}, refs.REFERENCES)
    assert len(rv) == 0 and "difference" in rv.columns


def test_the_localised_values_read_the_mean_of_per_document_increases():
    study = _study({"gemma": "gemma-7b"}, {"owt": "openwebtext"})
    local = pd.DataFrame([
        {"model": "gemma", "corpus": "owt", "scope": "layer", "layer": 0, "head": -1,
         "ranking": "attention", "renormalize": False, "n": 128, "delta_nll_rel": 0.5,
         "mean_doc_delta_rel": 0.7},
        {"model": "gemma", "corpus": "owt", "scope": "head", "layer": 0, "head": 12,
         "ranking": "attention", "renormalize": False, "n": 128, "delta_nll_rel": 0.4,
         "mean_doc_delta_rel": 0.6}])
    rv = reference_values(study, {"restrict_local": local}, refs.REFERENCES)
    e3 = rv[rv["location"] == "App. E.3"].set_index("quantity")
    layer = rv[(rv["location"] == "App. E.3") & rv["params"].str.contains('"scope": "layer"')]
    head = rv[(rv["location"] == "App. E.3") & rv["params"].str.contains('"head": 12')]
    assert len(e3) == 2 and set(e3["kind"]) == {"match"}
    assert layer.iloc[0].measured == 0.7 and layer.iloc[0].difference == pytest.approx(-0.009)
    assert head.iloc[0].measured == 0.6 and head.iloc[0].difference == pytest.approx(-0.021)


def test_the_report_says_a_setting_in_words():
    from attngeom.report.study import setting_text

    assert setting_text('{"ranking": "attention", "renormalize": false, "scope": "model", '
                        '"tau": 0.05, "window_length": 1024, "scoring": "all"}') == \
        "attention, deleted, tau 5%, L 1024, all targets"
    assert setting_text('{"ranking": "attention", "renormalize": false, "scope": "head", '
                        '"layer": 0, "head": 12, "n": 128}') == \
        "attention, deleted, head only, N = 128, layer 0, head 12"
    assert setting_text("{}") == "-" and setting_text("not json") == "not json"


def test_the_study_figures_draw_table1_and_every_ranking(two_corpora):
    import matplotlib

    matplotlib.use("Agg")
    from attngeom.figures.study import fig_study_restrict, fig_study_table1

    summary, restrict, _ = two_corpora
    drawn = fig_study_table1(geometry_loss(summary, restrict))
    # two distances x two rankings x three N ranges, one bar per averaged model
    assert len(drawn.data) == 12
    assert all(len(v) == 1 for v in drawn.data.values())
    drawn = fig_study_restrict(restrict)
    assert len(drawn.lines) == 2 * 3  # corpora x rankings (deleted only here)
    assert any("random" in label for label in drawn.lines)

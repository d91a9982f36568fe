"""The head atlas (issue 32): one small end-to-end run on stories260K, the seeded prompts,
the side-by-side tables on hand-built labels, the figures and bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom import api
from attngeom.errors import ConfigError
from attngeom.names import HEAD_TYPES
from attngeom.probes.atlas import CUE, make_needles, side_by_side
from attngeom.results.schemas import SCHEMAS
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


@pytest.fixture(scope="module")
def windows(stories):
    from attngeom.corpora.corpus import read_documents
    from attngeom.corpora.windows import make_windows

    docs, _ = read_documents(str(TINYSTORIES_PATH), max_documents=60)
    return make_windows(docs, stories[1], 96, n_windows=3)


ATLAS = dict(n_windows=3, window_length=96, seed=1, query_stride=4, streaming_window=16,
             n_repeats=2, repeat_length=16, n_needles=2, needle_length=3,
             needle_contexts=(96, 48), bootstrap=20, model_label="stories260K",
             corpus_label="tinystories", progress=False)


@pytest.fixture(scope="module")
def atlas(stories):
    model, tok = stories
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    res = api.atlas(str(STORIES_PATH), str(TINYSTORIES_PATH), None,
                    model_and_tokenizer=(model, tok), **ATLAS)
    return res.tables, res.tables["taxonomy"], (layers, heads)


def test_stories_atlas_has_every_score_of_every_head(atlas) -> None:
    out, _, (layers, heads) = atlas
    df = out["head_scores"]
    assert list(df.columns) == list(SCHEMAS["head_scores"])
    assert len(df) == layers * heads * len(HEAD_TYPES)
    assert set(df["score"]) == set(HEAD_TYPES)
    assert not df.duplicated(["layer", "head", "score"]).any()
    corpus = df[df["score"].isin(["previous_token", "duplicate_token", "sink", "induction",
                                  "echo"])]
    assert corpus["value"].between(0, 1).all()  # attention masses of defined rows
    assert df.loc[df["score"] == "streaming", "value"].dropna().ge(0).all()
    # rows every 4 back from the last of 96 (95, 91, .., 3: 24 rows, all t >= 2) x 3 windows
    prev = df[df["score"] == "previous_token"]
    assert (prev["n_samples"] == 24 * 3).all()
    assert (df.loc[df["score"] == "induction", "n_samples"] == 16 * 2).all()
    retrieval = df[df["score"] == "retrieval"]
    n_ok = int(retrieval["inputs"].iloc[0].rsplit(", ", 1)[1].split()[0])
    assert (retrieval["n_samples"] == n_ok).all()
    assert retrieval["value"].isna().all() == (n_ok == 0)
    assert (df["is_type"] == np.where(df["score"] == "streaming", df["value"] <= df["threshold"],
                                      df["value"] >= df["threshold"])).all()
    assert (df["model"] == "stories260K").all() and (df["seed"] == 1).all()
    # stories260K has previous-token heads in its early layers
    assert prev["value"].max() > 0.4


def test_atlas_side_by_side_tables_add_up(atlas) -> None:
    out, taxonomy, (layers, heads) = atlas
    cont = out["atlas_contingency"]
    n_regime = taxonomy["regime"].value_counts()
    for regime, grp in cont.groupby("regime"):
        assert (grp["n_regime"] == n_regime[regime]).all()
    labels = out["head_scores"].pivot_table(index=["layer", "head"], columns="score",
                                            values="is_type", aggfunc="first")
    for name in HEAD_TYPES:
        assert cont.loc[cont["head_type"] == name, "count"].sum() == labels[name].sum()
    depth = out["atlas_depth"]
    assert (depth.groupby(["layer", "kind"])["n_heads"].first() == heads).all()
    regimes = depth[depth["kind"] == "regime"].groupby("layer")["count"].sum()
    assert (regimes == heads).all()
    assert set(out["atlas_kappa"]["head_type"]) == set(HEAD_TYPES)


def test_rerun_with_the_same_seed_gives_the_same_table(stories, atlas) -> None:
    """Only the seeded prompts differ between seeds; the same seed repeats every number;
    the corpus scores are those an analyze run with the head_scores analysis computes
    (they ride its forward)."""
    model, tok = stories
    again = api.atlas(str(STORIES_PATH), str(TINYSTORIES_PATH), None,
                      model_and_tokenizer=(model, tok), **ATLAS)
    pd.testing.assert_frame_equal(again["head_scores"], atlas[0]["head_scores"])
    analysed = api.analyze(str(STORIES_PATH), str(TINYSTORIES_PATH), None,
                           model_and_tokenizer=(model, tok), n_windows=3, window_length=96,
                           analyses=("head_scores",), head_stride=4, streaming_window=16,
                           seed=1, model_label="stories260K", corpus_label="tinystories",
                           progress=False)["head_scores"]
    mine = atlas[0]["head_scores"]
    mine = mine[mine["score"].isin(analysed["score"].unique())].reset_index(drop=True)
    assert set(analysed["score"]) == {"previous_token", "duplicate_token", "sink", "streaming"}
    pd.testing.assert_frame_equal(
        analysed.sort_values(["score", "layer", "head"]).reset_index(drop=True),
        mine.sort_values(["score", "layer", "head"]).reset_index(drop=True)[analysed.columns])


def test_needles_are_seeded_and_placed(stories, windows) -> None:
    _, tok = stories
    win = torch.stack([w.input_ids for w in windows])
    trials = make_needles(tok, win, 512, n_needles=4, needle_length=3,
                          context_lengths=(96, 48), seed=7)
    again = make_needles(tok, win, 512, n_needles=4, needle_length=3,
                         context_lengths=(96, 48), seed=7)
    cue = tok(CUE, add_special_tokens=False)["input_ids"]
    for i, (a, b) in enumerate(zip(trials, again, strict=True)):
        assert torch.equal(a.prompt, b.prompt) and a.span == b.span
        assert a.prompt.numel() == (96, 48)[i % 2]
        start, stop = a.span
        assert torch.equal(a.prompt[start:stop], a.needle)
        assert a.prompt[start - len(cue):start].tolist() == cue
        assert a.prompt[-len(cue):].tolist() == cue
        assert int(a.prompt[0]) == int(win[i % 3, 0]) and 0.1 <= a.depth <= 0.9
    other = make_needles(tok, win, 512, n_needles=4, needle_length=3,
                         context_lengths=(96, 48), seed=8)
    assert any(not torch.equal(a.needle, b.needle) for a, b in zip(trials, other, strict=True))


def test_bad_input_is_one_line(stories, windows) -> None:
    model, tok = stories
    win = torch.stack([w.input_ids for w in windows])
    with pytest.raises(ConfigError, match=r"needle: 40 tokens .*valid needle_length: 1\.\.\d+"):
        make_needles(tok, win, 512, n_needles=1, needle_length=40, context_lengths=(48,),
                     seed=0)
    with pytest.raises(ConfigError, match=r"valid context: >= \d+ tokens"):
        make_needles(tok, win, 512, n_needles=1, needle_length=3, context_lengths=(20,),
                     seed=0)
    too_long = model.config.max_position_embeddings + 1
    with pytest.raises(ConfigError, match=r"window_length: expected at most .*512 positions "
                                          r"\(valid: 2\.\.512\), got 513"):
        api.atlas(str(STORIES_PATH), str(TINYSTORIES_PATH), None, window_length=too_long,
                  progress=False)
    with pytest.raises(ConfigError, match=r"repeat_length: expected a repeated prompt .* "
                                          r"\(valid: 1\.\.255\), got 300"):
        api.atlas(str(STORIES_PATH), str(TINYSTORIES_PATH), None, repeat_length=300,
                  progress=False)


def _scores(types: dict[tuple[int, int], set[str]]) -> pd.DataFrame:
    rows = []
    for (layer, head), mine in types.items():
        for name in HEAD_TYPES:
            rows.append({"layer": layer, "head": head, "score": name, "is_type": name in mine})
    return pd.DataFrame(rows)


def test_side_by_side_by_hand() -> None:
    """Four heads: (0,0) Mixer + sink, (0,1) Mixer + sink, (1,0) Retriever + previous-token,
    (1,1) Reset, no type. Sink vs Mixer agree on all four heads: kappa 1; the contingency
    has 2 of 2 Mixers sink, 1 of 1 Retriever previous-token, the Reset in '(none)'. F_N by
    type from a hand summary: sink heads' F at N = 2 is the mean of 0.8 and 0.6 against
    random 0.5 and 0.3."""
    scores = _scores({(0, 0): {"sink"}, (0, 1): {"sink"}, (1, 0): {"previous_token"},
                      (1, 1): set()})
    tax = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                        "regime": ["Mixer", "Mixer", "Retriever", "Reset"]})
    summ = []
    for (layer, head), f_att, f_rand in (((0, 0), 0.8, 0.5), ((0, 1), 0.6, 0.3),
                                         ((1, 0), 0.9, 0.2), ((1, 1), 0.4, 0.4)):
        for rule, value in (("attention", f_att), ("random", f_rand)):
            summ.append({"scope": "head", "metric": "f_score", "variant": "full",
                         "distance": "euclidean", "rule": rule, "layer": layer, "head": head,
                         "n": 2, "mean": value})
    out = side_by_side(scores, tax, pd.DataFrame(summ))
    cont = out["atlas_contingency"].set_index(["regime", "head_type"])
    assert cont.loc[("Mixer", "sink"), "count"] == 2
    assert cont.loc[("Mixer", "sink"), "share_of_regime"] == 1.0
    assert cont.loc[("Retriever", "previous_token"), "count"] == 1
    assert cont.loc[("Reset", "(none)"), "count"] == 1
    assert cont.loc[("Reset", "sink"), "count"] == 0
    kappa = out["atlas_kappa"].set_index(["regime", "head_type"])["kappa"]
    assert kappa[("Mixer", "sink")] == 1.0 and kappa[("Retriever", "previous_token")] == 1.0
    assert np.isnan(kappa[("Mixer", "induction")]) or kappa[("Mixer", "induction")] == 0.0
    fn = out["atlas_fn"].set_index("head_type")
    assert fn.loc["sink", "f_attention"] == pytest.approx(0.7)
    assert fn.loc["sink", "f_random"] == pytest.approx(0.4)
    assert fn.loc["sink", "f_gap"] == pytest.approx(0.3) and fn.loc["sink", "n_heads"] == 2
    assert fn.loc["(none)", "f_gap"] == pytest.approx(0.0)
    depth = out["atlas_depth"].set_index(["layer", "kind", "name"])["share"]
    assert depth[(0, "head_type", "sink")] == 1.0 and depth[(1, "regime", "Reset")] == 0.5
    with pytest.raises(ConfigError, match="no .layer, head. in common"):
        side_by_side(scores, tax.assign(layer=7))


def test_figures_draw_the_tables() -> None:
    from attngeom.figures.atlas import fig_atlas_contingency, fig_atlas_depth

    scores = _scores({(0, 0): {"sink"}, (0, 1): {"sink", "streaming"},
                      (1, 0): {"previous_token"}, (1, 1): set()})
    tax = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                        "regime": ["Mixer", "Mixer", "Retriever", "Reset"]})
    out = side_by_side(scores, tax)
    drawn = fig_atlas_contingency(out["atlas_contingency"])
    assert drawn.data["regimes"] == ["Retriever", "Mixer", "Reset"]
    j = drawn.data["types"].index("sink")
    assert drawn.data["share"][1, j] == 1.0 and drawn.data["count"][1, j] == 2
    depth = fig_atlas_depth(out["atlas_depth"])
    assert "sink" in depth.lines and "Mixer" in depth.lines
    assert list(depth.lines["sink"].get_ydata()) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="atlas_contingency"):
        fig_atlas_contingency(out["atlas_contingency"].iloc[:0])


def test_teacher_forced_steps_are_greedy_decoding(stories, windows) -> None:
    """The cheap path (one teacher-forced forward, greedy from the first departure) gives
    the tokens and copy hits of plain greedy decoding: on a needle the model does not
    generate (it departs at once), and on the same prompt with its own greedy output as
    the needle (no departure: every step from the forced forward)."""
    import inspect

    from attngeom.probes import atlas as at

    model, tok = stories
    cache_arg = ("cache" if "cache" in inspect.signature(model.forward).parameters
                 else "past_key_values")
    win = torch.stack([w.input_ids for w in windows])
    trials = make_needles(tok, win, 512, n_needles=2, needle_length=4, context_lengths=(64,),
                          seed=3)
    with torch.no_grad():
        own = at._greedy(model, trials[0], [], 4, cache_arg)[1]
    echoed = at.NeedleTrial(trials[0].prompt, trials[0].span, torch.tensor(own),
                            trials[0].depth)
    with torch.no_grad():
        forced = at._forced(model, [trials[0], echoed])
        for trial, (steps, generated) in zip([trials[0], echoed], forced, strict=True):
            want_steps, want_tokens = at._greedy(model, trial, [], 4, cache_arg)
            if len(steps) < 4:
                more, more_tokens = at._greedy(model, trial, generated, 4 - len(steps),
                                               cache_arg)
                steps, generated = steps + more, generated + more_tokens
            assert generated == want_tokens
            for got, want in zip(steps, want_steps, strict=True):
                assert torch.equal(got, want)
    assert len(forced[1][0]) == 4  # its own greedy output: no departure

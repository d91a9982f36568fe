"""``inspect`` on the shared stories260K model: a prompt, a run's window, bad input.

The viewer's numbers must be the run's numbers: on a run's window captured again,
P, R, F and the inversions at the final query equal that window's row of the run's
metrics table (one final query per window, so the window mean is the row itself),
and the regime is the run's. On a prompt, they equal ``topn_metrics`` on rows
captured independently by the capture path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attngeom.config import AnalysisConfig
from attngeom.engine.analyze import run_analysis
from attngeom.errors import ConfigError, RunDirError
from attngeom.geometry import topn_metrics
from attngeom.names import REGIMES
from attngeom.results.io import read_table
from attngeom.viewer import inspect
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH

pytestmark = pytest.mark.slow

PROMPT = ("Once upon a time, there was a little girl named Lily. She liked to play outside "
          "with her dog Max. One day, Max ran into the park and Lily ran after him. She "
          "found him under a big tree with a red ball.")


@pytest.fixture(scope="module")
def stories():
    from attngeom.capture import load_model

    return load_model(str(STORIES_PATH))


@pytest.fixture(scope="module")
def run_dir(stories, tmp_path_factory):
    out = tmp_path_factory.mktemp("viewer-run") / "r"
    cfg = AnalysisConfig(model=str(STORIES_PATH), corpus=str(TINYSTORIES_PATH),
                         window_length=64, n_windows=3, query_mode="final", bootstrap=20,
                         n_grid=(1, 2, 4, 8, 16), analyses=("metrics", "taxonomy"),
                         distances=("euclidean", "cosine"))
    run_analysis(cfg, out, progress=False, model_and_tokenizer=stories)
    return out


def _captured_rows(model, ids, layer, query):
    """The query's row, captured with the rows the viewer captures beside it (those its
    regime on the prompt counts): probabilities of a chunk of another height may round
    differently in their last float32 bit."""
    from attngeom.capture import capture_attention
    from attngeom.viewer.view import regime_rows

    rows = sorted(set(regime_rows(ids.numel(), True)) | {query})
    got = {}

    def keep(cap):
        if cap.layer == layer:
            got["cap"] = cap

    with torch.inference_mode(), capture_attention(model, keep, query_rows=rows):
        model(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]))
    cap = got["cap"]
    i = rows.index(query)
    return cap.alpha[0][:, i : i + 1], cap.values[0], cap.visible[0][:, i : i + 1]


@pytest.mark.parametrize(("layer", "head", "ranking", "distance"),
                         [(0, 1, "attention", "euclidean"), (3, 2, "contribution", "cosine"),
                          (4, 7, "attention", "cosine"), (2, 5, "contribution", "euclidean")])
def test_prompt_numbers_equal_topn_metrics(stories, layer, head, ranking, distance):
    model, tokenizer = stories
    view = inspect(model, PROMPT, layer=layer, head=head, ranking=ranking, distance=distance,
                   tokenizer=tokenizer, seed=4, figure=False)
    ids = torch.as_tensor(view.token_ids)
    assert view.query == ids.numel() - 1
    alpha, values, visible = _captured_rows(model, ids, layer, view.query)
    group = alpha.shape[0] // values.shape[0]
    ns = view.ns.tolist()
    one = topn_metrics(alpha[head : head + 1], values[head // group : head // group + 1], ns,
                       rule=ranking, distance=distance, visible=visible,
                       query_positions=torch.tensor([view.query]), seed=4, layer=layer,
                       head_index=torch.tensor([head]))
    every = topn_metrics(alpha, values, ns, rule=ranking, distance=distance, visible=visible,
                         query_positions=torch.tensor([view.query]), seed=4, layer=layer)
    ghost = topn_metrics(alpha, values, ns, rule="random", distance=distance, visible=visible,
                         query_positions=torch.tensor([view.query]), seed=4, layer=layer)
    for name in ("precision", "recall", "f_score", "margin", "inversions"):
        mine = getattr(view.geometry, name)
        np.testing.assert_array_equal(mine, getattr(one, name)[0, 0, 0].numpy())
        if name != "margin":  # all heads at once: the same counts (margin: a few ulps)
            np.testing.assert_array_equal(mine, getattr(every, name)[0, head, 0].numpy())
            # the ghost is repeat 0 of the run's random control
            np.testing.assert_array_equal(getattr(view.ghost, name),
                                          getattr(ghost, name)[0, head, 0].numpy())
    assert view.metrics(4) == view.geometry.metrics(4)
    assert view.regime["regime"] in REGIMES
    assert view.regime["source"].startswith("computed on this prompt only")
    # the winner of SPEC 4: argmax alpha ||v||, ties to the smaller position
    assert view.keys[np.argmax(view.contribution)] == view.winner


def test_a_runs_window_gives_the_runs_numbers(stories, run_dir):
    model, tokenizer = stories
    metrics = read_table(run_dir, "metrics")
    taxonomy = read_table(run_dir, "taxonomy")
    for window, layer, head, distance in ((1, 2, 3, "euclidean"), (2, 4, 0, "cosine")):
        view = inspect(model, run=run_dir, window=window, layer=layer, head=head,
                       distance=distance, tokenizer=tokenizer, figure=False)
        assert view.window == window and view.query == 63  # the final query of T = 64
        rows = metrics[(metrics["window"] == window) & (metrics["layer"] == layer)
                       & (metrics["head"] == head) & (metrics["rule"] == "attention")
                       & (metrics["variant"] == "full") & (metrics["distance"] == distance)]
        assert len(rows) == 5
        for row in rows.itertuples():
            for name in ("precision", "recall", "f_score", "inversions"):
                assert getattr(view.geometry, name)[view.geometry.at(row.n)] == getattr(row, name)
            assert np.isclose(view.geometry.margin[view.geometry.at(row.n)], row.margin,
                              rtol=1e-9, atol=1e-12)
        label = taxonomy[(taxonomy["layer"] == layer)
                         & (taxonomy["head"] == head)]["regime"].item()
        assert view.regime["regime"] == label
        assert view.regime["source"].startswith("run taxonomy table")


def test_bad_input_is_one_line_naming_the_range(stories, run_dir, tmp_path):
    model, tokenizer = stories
    cases = [
        (dict(layer=5, head=0), r"layer: expected an integer in \[0, 4\]"),
        (dict(layer=0, head=8), r"head: expected an integer in \[0, 7\]"),
        (dict(layer=0, head=0, query=500), r"query: expected a position in \[1, \d+\]"),
        (dict(layer=0, head=0, query=0), r"query: expected a position in \[1, \d+\]"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            inspect(model, PROMPT, tokenizer=tokenizer, figure=False, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"longer than LlamaForCausalLM's 512 positions; "
                                          r"expected at most 512 tokens"):
        inspect(model, list(range(600)), layer=0, head=0, figure=False)
    with pytest.raises(ConfigError, match=r"window: expected a window of the run in \[0, 2\]"):
        inspect(model, run=run_dir, window=7, layer=0, head=0, tokenizer=tokenizer,
                figure=False)
    # a run without what the viewer needs
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "manifest.json").write_text(json.dumps({"command": "analyze", "config": {}}))
    with pytest.raises(RunDirError, match="config lacks model, corpus, window_length"):
        inspect(model, run=bare, layer=0, head=0, tokenizer=tokenizer, figure=False)
    notax = tmp_path / "notax"
    notax.mkdir()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (notax / "manifest.json").write_text(json.dumps(manifest))
    # a run without a taxonomy (prune, restrict, ...): the regime from the captured rows
    view = inspect(model, run=notax, layer=0, head=0, tokenizer=tokenizer, figure=False)
    assert view.regime.get("regime")
    # an intervention's config counts its windows as n_eval_windows, not n_windows: the
    # corpus record says how many it read
    restricted = tmp_path / "restricted"
    restricted.mkdir()
    config = {k: v for k, v in manifest["config"].items() if k != "n_windows"}
    (restricted / "manifest.json").write_text(json.dumps(
        {**manifest, "command": "restrict", "config": {**config, "n_eval_windows": 3}}))
    view = inspect(model, run=restricted, layer=0, head=0, tokenizer=tokenizer, figure=False)
    assert view.regime.get("regime")
    # a run that read no window (a competition probe) names the runs that have them
    probe = tmp_path / "probe"
    probe.mkdir()
    manifest = {**manifest, "command": "competition",
                "corpus": {**manifest["corpus"], "n_windows": 0}}
    (probe / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunDirError, match=r"a run of 'competition', which reads no window .*"
                                          r"view an analyze or atlas run"):
        inspect(model, run=probe, layer=0, head=0, tokenizer=tokenizer, figure=False)
    with pytest.raises(ConfigError, match="exactly one of a prompt"):
        inspect(model, PROMPT, run=run_dir, layer=0, head=0, tokenizer=tokenizer)


def test_figure_draws_the_circles(stories):
    model, tokenizer = stories
    view = inspect(model, PROMPT, layer=3, head=2, tokenizer=tokenizer, n_grid=(1, 4, 8))
    assert view.figure is not None
    drawn = view.plot(4)
    geo = view.geometry
    i = geo.at(4)
    sel = geo.selected[i][view.shown]
    assert (drawn.data["radius"][sel] <= drawn.data["rho_max"]).all()
    assert drawn.data["metrics"] == view.metrics(4)
    assert len(drawn.markers["selected"].get_offsets()) == 4
    assert len(drawn.markers["offenders"].get_offsets()) == int(
        (geo.intruders[i] | geo.stragglers[i])[view.shown].sum())
    png = view._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "layer 3 head 2" in view.describe(4)


def test_a_view_becomes_a_page(stories, tmp_path):
    model, tokenizer = stories
    view = inspect(model, PROMPT, layer=1, head=4, ranking="contribution", distance="cosine",
                   tokenizer=tokenizer, figure=False)
    assert list(view.views) == [("contribution", "cosine")]
    before = view.metrics(8)
    html = view.to_html(tmp_path / "one.html")
    assert len(view.views) == 4 and set(view.ghosts) == {"euclidean", "cosine"}
    assert view.metrics(8) == before  # the views added leave the first one as it was
    assert (tmp_path / "one.html").read_text(encoding="utf-8") == html
    assert '"attention|euclidean"' in html and '"contribution|cosine"' in html
    frame = view._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "<script" not in frame


@pytest.mark.parametrize(("name", "layer", "keys"), [
    ("bert", 1, list(range(12))),  # an encoder: every key of the sequence is visible
    ("gemma2", 0, [6, 7, 8, 9]),  # Gemma-2's sliding window of 4 before query 9
    ("gemma2", 1, list(range(10))),  # its global layer
])
def test_the_universe_is_what_the_mask_lets_the_query_see(name, layer, keys):
    from tests.architectures import make_model

    view = inspect(make_model(name), list(range(3, 15)), layer=layer, head=1, query=9,
                   figure=False)
    assert view.keys.tolist() == keys
    assert np.isclose(view.alpha.sum(), 1.0)
    assert view.ns.max() <= len(keys) - 1

"""``competition --probe kept`` (issue 39, item 4): each ranking's kept set at the final
query is the restriction's own, and the probe's numbers equal a slow recomputation from
the definitions (reference policy loops, exact reference geometry, the control's
textbook shuffle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference_policies as refpol
import torch
from architectures import STORIES_PATH, make_model
from reference_geometry import random_draws, row_metrics, shuffled

from attngeom import api
from attngeom.capture import override_attention
from attngeom.errors import ConfigError
from attngeom.interventions.restriction import KeptRow, restrict_topn
from attngeom.interventions.selection import restriction
from attngeom.names import RANKINGS
from attngeom.probes.kept import MEASURES, budgets_of, final_keep, kept_window_block

LENGTH = 40


def _layers(model, ids: torch.Tensor) -> dict:
    """Every layer's unrestricted inputs to the policies: probabilities of every row,
    visibility, query, key and value states."""
    got = {}

    def handler(call):
        got[call.layer] = {"probs": call.eager_float32()[2], "visible": call.visible(),
                           "query": call.query, "key": call.key,
                           "values": call.value.to(torch.float32)}
        return call.previous()

    with torch.no_grad(), override_attention(model, handler):
        model(input_ids=ids)
    return got


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama")  # 2 layers, 4 query heads on 2 kv heads
    ids = torch.randint(3, 128, (2, LENGTH), generator=torch.Generator().manual_seed(5))
    return model, ids, _layers(model, ids)


@pytest.mark.parametrize("ranking", list(RANKINGS))
@pytest.mark.parametrize("n", [16, 33])
def test_final_keep_is_what_the_restriction_keeps(llama, ranking, n) -> None:
    """At each layer restricted alone (its inputs the model's own), the keys the
    restriction keeps at the final row (read by a ``KeptRow``) are ``final_keep``'s."""
    model, ids, layers = llama
    n = max(n, int((RANKINGS.meta(ranking) or {}).get("fixed", 0)))  # snapkv: 32, its edge
    prefill = bool((RANKINGS.meta(ranking) or {}).get("prefill_only"))
    targets = [0] if ranking == "positional" else list(layers)  # positional: every layer
    for layer in targets:
        seen = {}

        def keep(lay, mask, seen=seen):
            seen[lay] = mask

        observe = KeptRow(keep)
        if ranking == "positional":
            opened = restriction(model, n, ranking=ranking, observe=observe)
        else:
            opened = restrict_topn(model, n, layers=[layer], ranking=ranking, seed=7,
                                   final_only=prefill, observe=observe)
        with torch.no_grad(), opened:
            model(input_ids=ids)
        inputs = layers[layer]
        want = final_keep(ranking, n, layer=layer, seed=7, **inputs)
        assert torch.equal(seen[layer], want), (ranking, layer)
        assert int(want.sum(-1).max()) <= n


def _reference_keep(ranking: str, n: int, inputs: dict) -> torch.Tensor:
    """(B, H, T) the final row's kept keys, by the slow loops of the definitions."""
    probs, visible = inputs["probs"].double(), inputs["visible"]
    b, h, q, t = probs.shape
    if ranking in refpol.REFERENCES:
        fn = refpol.REFERENCES[ranking]
        if ranking == "window":
            out = fn(visible, n, h)
        elif ranking in ("h2o", "tova", "snapkv"):
            out = fn(probs, visible, n)
        elif ranking == "quest":
            out = fn(inputs["query"], inputs["key"], visible, n)
        else:
            out = fn(inputs["key"], visible, n, h)
        return out[:, :, -1]
    out = torch.zeros(b, h, t, dtype=torch.bool)
    for i in range(b):
        for hh in range(h):
            seen = [j for j in range(t) if bool(visible[i, 0, -1, j])]
            if ranking == "attention":
                chosen = sorted(seen, key=lambda j: (-float(probs[i, hh, -1, j]), j))[:n]
            else:  # positional: the initial token and the n - 1 latest
                chosen = [0] + seen[len(seen) - (n - 1):]
            out[i, hh, chosen] = True
    return out


def test_probe_numbers_equal_the_slow_reference(llama) -> None:
    """Overlap, P, R, F of the kept set and F of its random control, per window, layer and
    head, against plain loops (exact fractions for the geometry)."""
    model, ids, layers = llama
    rankings = ("attention", "window", "h2o", "tova", "quest", "snapkv", "knorm",
                "positional")
    budgets, repeats, seed, documents = (16, 33), 2, 3, (4, 9)
    got = kept_window_block(model, ids, documents, rankings, budgets, seed=seed,
                            repeats=repeats)
    assert set(got) == {(r, n) for r in rankings for n in budgets_of(r, budgets, LENGTH)}
    checked = 0
    for (ranking, n), arrays in got.items():
        for layer, inputs in layers.items():
            kept = _reference_keep(ranking, n, inputs)
            oracle = _reference_keep("attention", n, inputs)
            g = inputs["values"].shape[1]
            b, h = kept.shape[:2]
            for i in range(b):
                for hh in range(h):
                    chosen = [j for j in range(LENGTH) if bool(kept[i, hh, j])]
                    universe = list(range(LENGTH))
                    alpha = inputs["probs"][i, hh, -1].double().numpy()
                    vals = inputs["values"][i, hh // (h // g)].double().numpy()
                    at = (i, layer, hh)
                    assert arrays["kept"][at] == len(chosen)
                    assert arrays["overlap"][at] == pytest.approx(
                        sum(bool(oracle[i, hh, j]) for j in chosen) / n, abs=1e-15)
                    order = chosen + [j for j in universe if j not in chosen]
                    m = row_metrics(order, len(chosen), alpha, vals, "euclidean").values
                    for name in ("precision", "recall", "f_score"):
                        assert arrays[name][at] == pytest.approx(float(m[name]), abs=1e-12)
                    draws = random_draws(seed, documents[i], layer, hh, LENGTH - 1, repeats,
                                         universe)
                    f_random = np.mean([float(row_metrics(shuffled(universe, draws[k]),
                                                          len(chosen), alpha, vals,
                                                          "euclidean").values["f_score"])
                                        for k in range(repeats)])
                    assert arrays["f_random"][at] == pytest.approx(f_random, abs=1e-12)
                    checked += 1
    assert checked == sum(len(budgets_of(r, budgets, LENGTH)) for r in rankings) * 2 * 2 * 4
    # the same weights run by the eager function: its own probabilities are read instead
    eager = kept_window_block(make_model("llama", attn_implementation="eager"), ids,
                              documents, rankings, budgets, seed=seed, repeats=repeats)
    for key, arrays in got.items():
        for m in MEASURES:
            assert np.array_equal(eager[key][m], arrays[m], equal_nan=True), (key, m)


def test_kept_tables_on_stories(tmp_path) -> None:
    """The command's tables: the oracle joins, its overlap is 1, the summary is each
    window's mean over heads then the mean over windows; a ranking's budgets below its
    fixed part are left out when they are the defaults and refused when given."""
    res = api.competition(str(STORIES_PATH), None, str(tmp_path / "kept"), probe="kept",
                          lengths=(48,), n_documents=3, rankings=("window", "quest"),
                          budgets=(16, 32), bootstrap=20, batch_size=2, progress=False)
    geo, summary = res["kept_geometry"], res["kept_summary"]
    assert set(summary["ranking"]) == {"attention", "window", "quest"}
    assert (geo[geo.ranking == "attention"]["overlap"] == 1.0).all()
    assert (summary["n_windows"] == 3).all()
    for measure in MEASURES:
        assert geo[measure].notna().all(), measure
    row = summary[(summary.ranking == "window") & (summary.n == 16)].iloc[0]
    per_head = geo[(geo.ranking == "window") & (geo.n == 16)]
    assert row["overlap"] == pytest.approx(per_head["overlap"].mean())  # no NaN: equal
    assert row["f_gap"] == pytest.approx(row["f_score"] - row["f_random"])
    assert row["f_score_low"] <= row["f_score"] <= row["f_score_high"]
    settings = dict(zip(res["competition_settings"]["setting"],
                        res["competition_settings"]["value"], strict=True))
    assert settings["rankings"] == "attention,window,quest"
    default = api.competition(str(STORIES_PATH), None, None, probe="kept", lengths=(40,),
                              n_documents=1, rankings=("snapkv",), bootstrap=0,
                              progress=False)["kept_summary"]
    # the default budgets 16, 64, 256 in 40-token windows: snapkv's window is 32 and
    # N >= T keeps everything, so only the oracle's 16 remains
    assert sorted(zip(default.ranking, default.n, strict=True)) == [("attention", 16)]
    with pytest.raises(ConfigError, match="budgets: the snapkv ranking keeps 32 fixed keys"):
        api.competition(str(STORIES_PATH), None, None, probe="kept", rankings=("snapkv",),
                        budgets=(16, 64))
    with pytest.raises(ConfigError, match=r"lengths: expected lengths within .* 512 "
                                          r"positions \(valid: 2\.\.512\), got 600"):
        api.competition(str(STORIES_PATH), None, None, probe="kept", lengths=(600,))
    assert math.isfinite(row["f_random"])

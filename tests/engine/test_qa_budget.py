"""Retrieval under competition per selection (issue 39, item 3): the qa probe at fixed
budgets, the support recall of the kept set at the answer query, and the ``KeptRow`` hook
that reads the kept set from the restriction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from architectures import STORIES_PATH, make_model

from attngeom import api
from attngeom.capture import capture_attention, load_model
from attngeom.errors import ConfigError
from attngeom.interventions.restriction import KeptRow, restrict_topn
from attngeom.interventions.selection import Selection, restriction
from attngeom.names import RANKINGS
from attngeom.probes import qa
from attngeom.probes.qa_probe import restricted_losses

HOOKED = ("attention", "contribution", "random", "positional", "window", "h2o", "tova",
          "quest", "snapkv", "knorm")


@pytest.mark.parametrize("ranking", HOOKED)
def test_kept_row_is_what_every_layer_keeps(ranking) -> None:
    """Under deletion, at every layer of one forward (restricted activations included), the
    probabilities the model used at the observed row are zero outside the reported set
    (a nested capture reads them), and the reported set holds only visible keys; a row
    with at most N visible keys reports all of them."""
    model = make_model("llama")
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(2))
    n = 33 if ranking == "snapkv" else 16
    prefill = bool((RANKINGS.meta(ranking) or {}).get("prefill_only"))
    for row in (-1, 20):
        kept, used = {}, {}

        def record(layer, mask, kept=kept):
            kept[layer] = mask

        def seen(cap, used=used):
            used[cap.layer] = cap.alpha[:, :, 0]

        with torch.no_grad(), restriction(model, n, ranking=ranking,
                                          final_only=prefill,
                                          observe=KeptRow(record, row)), \
                capture_attention(model, seen, query_rows=[row]):
            model(input_ids=ids)
        assert sorted(kept) == sorted(used) == [0, 1]
        position = row % 40
        for layer in kept:
            mask = kept[layer]
            assert mask.shape == (2, 4, 40)
            assert not mask[..., position + 1:].any()  # causal: nothing later is kept
            assert torch.equal(used[layer] * ~mask, torch.zeros_like(used[layer]))
            if position + 1 <= n or (prefill and row != -1):
                assert mask[..., :position + 1].all()  # the row is not restricted
            else:
                assert int(mask.sum(-1).max()) <= n


def test_observe_takes_a_kept_row_only() -> None:
    model = make_model("llama")
    with pytest.raises(ConfigError, match="observe: expected a KeptRow"), \
            restrict_topn(model, 4, observe=lambda layer, keep: None):
        pass


@pytest.fixture(scope="module")
def stories():
    return load_model(str(STORIES_PATH))


def test_support_recall_is_the_mean_share_of_support_kept(stories) -> None:
    """The recall ``restricted_losses`` reports is, per example, the mean over layers and
    heads of the share of support tokens in the kept set at the answer query, that set
    read from the restriction; the losses are those of the restricted model alone."""
    model, tok = stories
    episodes = qa.generate_episodes(2, seed=3)
    sentences = qa.split_sentences(" ".join(f"The cat sat on mat {i}." for i in range(60)))
    examples = qa.build_examples(episodes, tok, 60, sentences=sentences, seed=1)
    cands = qa.candidate_tokens(tok, prefix=" ")
    sel = Selection("window", False)
    got = restricted_losses(model, examples, cands, 16, sel, seed=0)
    from attngeom.capture import input_device

    for i, ex in enumerate(examples):
        masks = {}
        with torch.no_grad(), restriction(model, 16, ranking="window",
                                          observe=KeptRow(masks.__setitem__,
                                                          ex.length - 1)):
            values = qa.candidate_scores(model, ex, cands, input_device(model))
        loss, _ = qa.answer_loss(values, cands.names.index(ex.answer))
        assert got.loss[i] == loss
        shares = []
        for layer in sorted(masks):
            for head in range(masks[layer].shape[1]):
                hits = sum(bool(masks[layer][0, head, j]) for j in ex.support)
                shares.append(hits / len(ex.support))
        assert len(shares) == 5 * 8  # every layer and head of stories260K
        assert got.recall[i] == pytest.approx(np.mean(shares), abs=1e-15)
    assert got.recall.min() >= 0.0 and got.recall.max() < 1.0  # window drops far support


def test_budget_table_shares_the_search_evaluations(stories, tmp_path) -> None:
    """qa_budget: each selection at every budget (its fixed part allowing) and at each N*;
    an N the search evaluated reads the same numbers as the curve; N* rows name their
    taus; a policy's N* is at least its fixed part (below it the search never runs it)."""
    model, tok = stories
    res = api.competition(str(STORIES_PATH), None, str(tmp_path / "qa"),
                          model_and_tokenizer=(model, tok), backgrounds=(0,), n_episodes=3,
                          grid_max=8, bootstrap=20, budgets=(8, 16),
                          rankings=("attention", "window"), progress=False)
    budget, curve, nstar = res["qa_budget"], res["qa_curve"], res["qa_nstar"]
    assert set(budget["ranking"]) == {"attention", "window", "positional"}
    for ranking in ("attention", "window", "positional"):
        rows = budget[budget.ranking == ranking]
        assert {8, 16} <= set(rows[rows.budget]["n"])
        for _, r in rows.iterrows():
            on_curve = curve[(curve.ranking == ranking) & (curve.n == r.n)]
            if len(on_curve):  # the search's evaluation, read back
                assert r.delta_loss == pytest.approx(on_curve.iloc[0].delta_loss)
                assert r.accuracy == on_curve.iloc[0].accuracy
            assert 0.0 <= r.support_recall <= 1.0
            assert r.accuracy_low <= r.accuracy <= r.accuracy_high
        for _, s in nstar[nstar.ranking == ranking].iterrows():
            at = rows[rows.n == s.nstar]
            assert len(at) == 1 and f"{s.tau:g}" in at.iloc[0].nstar_taus.split(",")
    window = nstar[nstar.ranking == "window"]
    assert (window.nstar >= 4).all()  # window's four sinks
    assert not (curve[curve.ranking == "window"].n < 4).any()
    oracle16 = budget[(budget.ranking == "attention") & (budget.n == 16)].iloc[0]
    window16 = budget[(budget.ranking == "window") & (budget.n == 16)].iloc[0]
    assert oracle16.support_recall > window16.support_recall  # the oracle keeps more support
    # the tables went to disk with their schema
    assert (tmp_path / "qa" / "qa_budget.parquet").is_file()

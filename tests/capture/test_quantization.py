"""8-bit and 4-bit bitsandbytes loading (``load_model(..., quantization=...)``).

No GPU and no bitsandbytes here: the error paths are checked as they are, and the
load itself with a stand-in bitsandbytes module, CUDA said to be available and the
transformers class's ``from_pretrained`` replaced by one that records its arguments
and returns a tiny Llama, so what transformers would be asked for is what is checked.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import transformers

from attngeom.assets import asset
from attngeom.capture import load_model
from attngeom.cli import main
from attngeom.config import AnalysisConfig, RestrictConfig
from attngeom.errors import ConfigError, ModelError
from attngeom.results.manifest import config_fingerprint

MODEL = asset("stories260K")  # a local directory with a config.json: no network


def _tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


@pytest.fixture
def loads(monkeypatch):
    """Every ``from_pretrained`` call of the causal-LM class, its kwargs recorded."""
    calls: list[dict] = []

    def fake(source, **kwargs):
        calls.append(kwargs)
        return _tiny_llama()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake)
    return calls


@pytest.fixture
def bitsandbytes(monkeypatch):
    """bitsandbytes importable and a CUDA GPU seen (neither is true here)."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and text.strip() == text
    return text


def test_8bit_asks_for_llm_int8_with_threshold_6_on_the_one_gpu(bitsandbytes, loads):
    model, _ = load_model(MODEL, device="cuda:0", dtype="bfloat16", tokenizer=object(),
                          quantization="8bit")
    (kwargs,) = loads
    q = kwargs["quantization_config"]
    assert isinstance(q, transformers.BitsAndBytesConfig)
    assert q.load_in_8bit is True and q.load_in_4bit is False
    assert q.llm_int8_threshold == 6.0
    assert kwargs["device_map"] == {"": "cuda:0"}
    assert kwargs["dtype"] is torch.bfloat16  # the compute dtype of the unquantised parts
    assert not model.training


def test_4bit_asks_for_nf4_computing_in_the_runs_dtype(bitsandbytes, loads):
    load_model(MODEL, device="cuda:1", dtype="float16", tokenizer=object(), quantization="4bit")
    (kwargs,) = loads
    q = kwargs["quantization_config"]
    assert q.load_in_4bit is True and q.load_in_8bit is False
    assert q.bnb_4bit_quant_type == "nf4"
    assert q.bnb_4bit_compute_dtype is torch.float16
    assert kwargs["device_map"] == {"": "cuda:1"}


def test_plain_cuda_is_placed_on_the_current_gpu(bitsandbytes, loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    load_model(MODEL, device="cuda", dtype="bfloat16", tokenizer=object(), quantization="8bit")
    assert loads[0]["device_map"] == {"": "cuda:3"}


def test_a_device_map_given_is_kept(bitsandbytes, loads):
    load_model(MODEL, device="cpu", dtype="bfloat16", tokenizer=object(), quantization="8bit",
               device_map="auto")
    assert loads[0]["device_map"] == "auto"
    assert loads[0]["quantization_config"].load_in_8bit is True


def test_none_asks_transformers_for_no_quantization(loads):
    load_model(MODEL, tokenizer=object())
    (kwargs,) = loads
    assert "quantization_config" not in kwargs and "device_map" not in kwargs


def test_a_cpu_device_is_one_line_before_any_weights(bitsandbytes, loads):
    with pytest.raises(ModelError) as error:
        load_model(MODEL, device="cpu", tokenizer=object(), quantization="8bit")
    assert _one_line(error) == (f"cannot load model {MODEL!r} in 8bit: bitsandbytes "
                                "8-bit/4-bit weights need a CUDA GPU, got device 'cpu'")
    assert loads == []


def test_no_gpu_seen_is_one_line(loads, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelError) as error:
        load_model(MODEL, device="cuda", tokenizer=object(), quantization="4bit")
    assert "CUDA GPU" in _one_line(error) and "torch sees none" in _one_line(error)
    assert loads == []


def test_a_gguf_file_is_already_quantised(bitsandbytes, loads, tmp_path, monkeypatch):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")  # never read: the refusal comes first

    def no_config(*args, **kwargs):
        raise AssertionError("the configuration was read before the refusal")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_config)
    with pytest.raises(ModelError) as error:
        load_model(str(gguf), device="cuda:0", tokenizer=object(), quantization="8bit")
    assert "GGUF" in _one_line(error) and "already quantised" in _one_line(error)
    assert loads == []


def test_missing_bitsandbytes_is_one_line_with_the_install_command(loads, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ModelError) as error:
        load_model(MODEL, device="cuda:0", tokenizer=object(), quantization="8bit")
    assert _one_line(error) == "quantization 8bit needs bitsandbytes: pip install bitsandbytes"
    assert loads == []


def test_an_unknown_value_is_a_config_error():
    with pytest.raises(ConfigError, match="^quantization: expected one of none, 8bit, 4bit, "
                                          "got 'int8'$"):
        AnalysisConfig(model="m", corpus="c", quantization="int8")
    with pytest.raises(ConfigError, match="quantization"):
        load_model(MODEL, quantization="int8")


def test_the_default_leaves_fingerprints_as_they_were():
    """Runs made before the option existed keep their fingerprint; 8bit is another run."""
    for cls in (AnalysisConfig, RestrictConfig):
        plain = cls(model="m", corpus="c", dtype="bfloat16")
        d = plain.fingerprint_dict()
        assert "quantization" not in d
        assert "dtype" in d  # the options that decide the numbers still are there
        eight = plain.with_(quantization="8bit")
        assert eight.fingerprint_dict() == {**d, "quantization": "8bit"}
        assert config_fingerprint(eight.fingerprint_dict()) != config_fingerprint(d)
        assert plain.to_dict()["quantization"] == "none"  # the manifest still records it


def test_a_run_passes_it_to_the_loader(tmp_path, capsys):
    code = main(["analyze", "--quantization", "8bit", "--device", "cpu", "--n-windows", "1",
                 "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "CUDA GPU" in err and "8bit" in err


def test_a_study_loads_with_it():
    from attngeom.engine.runner import Distributed
    from attngeom.studies.reproduce import _load

    cfg = AnalysisConfig(model=MODEL, corpus="c", quantization="4bit")
    with pytest.raises(ModelError, match="in 4bit: .*CUDA GPU"):
        _load(cfg, Distributed.from_env("cpu"))

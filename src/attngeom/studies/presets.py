"""Model presets: the papers' checkpoints and their successors, by short name.

A leaf of the studies layer (stdlib, attngeom's leaves and the configuration, no
torch), so a study file can be checked and its memory planned without importing a
model stack. The architecture numbers are those of each checkpoint's ``config.json`` on the hub and
the parameter counts are the published ones; a study that loads the real model reads
its configuration again and does not trust these.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from attngeom.config import COMMANDS, loss_commands
from attngeom.errors import ConfigError
from attngeom.names import DTYPES, QUANTIZATIONS

BYTES_PER_ELEMENT = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
assert set(BYTES_PER_ELEMENT) == set(DTYPES)

# the commands whose runs compute the next-token loss, so hold the logits: declared with
# each command (``config.COMMANDS``, ``loss=True``)
LOSS_COMMANDS = loss_commands()

GB = 1e9  # decimal gigabytes, as the hub and most device tools print them
OVERHEAD_FACTOR = 1.10  # allocator fragmentation and small buffers
RUNTIME_GB = 0.5  # the device runtime's own context, paid once per process
# bytes per quantized weight: LLM.int8's one byte; nf4's half byte plus a float32 absmax
# per block of 64 (bitsandbytes' default block; double quantization would shrink it)
QUANTIZED_BYTES = {"8bit": 1.0, "4bit": 0.5 + 4 / 64}
LOGSOFTMAX_CHUNK = 256  # positions per float64 log-softmax (interventions/perplexity.py)


def _bytes(dtype: str) -> int:
    try:
        return BYTES_PER_ELEMENT[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}: expected one of "
                          f"{', '.join(BYTES_PER_ELEMENT)}") from None


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def estimate_memory_gb(*, params_b: float, layers: int, hidden: int, kv_dim: int, heads: int,
                       vocab: int, window_length: int, batch_size: int, dtype: str,
                       command: str = "analyze", quantization: str = "none") -> float:
    """Conservative device memory (decimal GB) of one attngeom process on one model.

    Shared by the presets and by a study's local models, whose shape is read from their
    configuration elsewhere, so every plan uses one formula. With ``b`` the bytes per
    element of ``dtype`` (float32 4, bfloat16/float16 2, float64 8), ``B`` the batch,
    ``T`` the window length, ``L`` the layers, ``H`` the query heads and ``kv_dim`` =
    kv_heads x head_dim::

        weights  = params_b * 1e9 * b                  quantization "none"
                 = E * b + (params_b * 1e9 - E) * q     "8bit" (q = 1), "4bit" (q = 0.5625:
                                                       nf4's half byte and a float32 scale
                                                       per 64 weights), E = 2 * vocab *
                                                       hidden the embedding and output
                                                       head, which stay in ``dtype``
        kv       = 2 * L * B * T * kv_dim * b          keys and values of every layer
        residual = (L + 1) * B * T * hidden * b        the hidden states the capture keeps
        attn     = 2 * B * H * T * T * 4               one layer's float32 scores and
                                                       probabilities (one layer at a time)
        logits   = B * T * vocab * 4                   float32 logits, loss commands only
                 + B * min(T, 256) * vocab * 8         one float64 log-softmax chunk
        total    = (weights + kv + residual + attn + logits) * 1.10 / 1e9 + 0.5

    bitsandbytes quantizes the linear layers only, so a quantized model keeps its
    embedding and output head (counted twice, as if untied: the upper side) and its
    norms (too few to count) in ``dtype``; activations are in ``dtype`` either way.
    The 1.10 covers allocator fragmentation, the 0.5 GB the device runtime. It is an
    upper-side guide for picking a batch size, not a measurement: the backward pass of
    ``prune``'s gradient ranker keeps more activations than the residual term counts.
    """
    b = _bytes(dtype)
    if command not in COMMANDS:
        raise ConfigError(f"unknown command {command!r}: expected one of {', '.join(COMMANDS)}")
    loss = COMMANDS[command].loss
    if not (isinstance(params_b, (int, float)) and math.isfinite(params_b) and params_b > 0):
        raise ConfigError(f"params_b must be a positive number, got {params_b!r}")
    for name, value in (("layers", layers), ("hidden", hidden), ("kv_dim", kv_dim),
                        ("heads", heads), ("vocab", vocab), ("window_length", window_length),
                        ("batch_size", batch_size)):
        _positive_int(name, value)
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization: expected one of {', '.join(QUANTIZATIONS)}, got "
                          f"{quantization!r}")
    B, T = batch_size, window_length
    weights = params_b * 1e9 * b
    if quantization != "none":
        embedding = min(2 * vocab * hidden, params_b * 1e9)
        weights = embedding * b + (params_b * 1e9 - embedding) * QUANTIZED_BYTES[quantization]
    kv = 2 * layers * B * T * kv_dim * b
    residual = (layers + 1) * B * T * hidden * b
    attn = 2 * B * heads * T * T * 4
    logits = 0
    if loss:
        logits = B * T * vocab * 4 + B * min(T, LOGSOFTMAX_CHUNK) * vocab * 8
    return (weights + kv + residual + attn + logits) * OVERHEAD_FACTOR / GB + RUNTIME_GB


@dataclass(frozen=True)
class Preset:
    """One hub checkpoint with its architecture, so a study can name it and plan for it."""

    name: str  # short key, e.g. "llama-2-7b"
    hub_id: str  # e.g. "meta-llama/Llama-2-7b-hf"
    dtype: str  # recommended dtype
    params_b: float  # published parameter count, billions
    layers: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_positions: int
    gated: bool  # the hub asks for a licence or contact form before download
    note: str  # one sentence: family, access, anything that changes the geometry

    @property
    def kv_dim(self) -> int:
        """Width of one layer's keys (and values): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def weights_gb(self, dtype: str | None = None) -> float:
        """Weights alone, decimal GB, in ``dtype`` (default: the preset's).

        >>> round(preset("llama-2-7b").weights_gb("bfloat16"), 2)
        13.48
        """
        return self.params_b * 1e9 * _bytes(dtype or self.dtype) / GB

    def memory_gb(self, *, window_length: int, batch_size: int, dtype: str | None = None,
                  command: str = "analyze", quantization: str = "none") -> float:
        """Device memory of one process, by :func:`estimate_memory_gb` (formula there)."""
        return estimate_memory_gb(
            params_b=self.params_b, layers=self.layers, hidden=self.hidden,
            kv_dim=self.kv_dim, heads=self.heads, vocab=self.vocab,
            window_length=window_length, batch_size=batch_size,
            dtype=dtype or self.dtype, command=command, quantization=quantization)


_META = "gated: accept Meta's community licence on the hub first"
_GEMMA = "gated: accept Google's Gemma terms of use on the hub first"
_MISTRAL = ("Apache-2.0 weights; the mistralai hub pages now ask users to share contact "
            "information before download (seen on the v0.3 family; verify for this repo)")

_ALL = (
    Preset("llama-2-7b", "meta-llama/Llama-2-7b-hf", "bfloat16", 6.74, 32, 32, 32, 128, 4096,
           32000, 4096, True,
           f"Llama 2, the geometry paper's LLaMA-2-7B: full multi-head attention; {_META}."),
    Preset("llama-3-8b", "meta-llama/Meta-Llama-3-8B", "bfloat16", 8.03, 32, 32, 8, 128, 4096,
           128256, 8192, True,
           f"Llama 3: grouped-query attention (4 query heads per kv head); {_META}."),
    Preset("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "bfloat16", 8.03, 32, 32, 8, 128, 4096,
           128256, 131072, True,
           f"Llama 3.1: Llama 3's shape with llama3 RoPE scaling to 128K positions; {_META}."),
    Preset("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "bfloat16", 1.24, 16, 32, 8, 64, 2048,
           128256, 131072, True,
           f"Llama 3.2: small Llama with tied input and output embeddings; {_META}."),
    Preset("gemma-7b", "google/gemma-7b", "bfloat16", 8.54, 28, 16, 16, 256, 3072, 256000,
           8192, True,
           "Gemma, the geometry paper's Gemma-7B: head_dim 256, so heads x head_dim = 4096 "
           f"exceeds hidden 3072; {_GEMMA}."),
    Preset("gemma-2-9b", "google/gemma-2-9b", "bfloat16", 9.24, 42, 16, 8, 256, 3584, 256000,
           8192, True,
           "Gemma 2: attention logit soft-capping 50 and final soft-capping 30, a 4096-token "
           "sliding window on alternate layers, query scale 224^-1/2, heads x head_dim "
           f"4096 != hidden 3584; {_GEMMA}."),
    Preset("mistral-7b", "mistralai/Mistral-7B-v0.1", "bfloat16", 7.24, 32, 32, 8, 128, 4096,
           32000, 32768, True,
           "Mistral 7B v0.1, the geometry paper's Mistral-7B: grouped-query attention with a "
           f"4096-token sliding window; {_MISTRAL}."),
    Preset("mistral-7b-v0.3", "mistralai/Mistral-7B-v0.3", "bfloat16", 7.25, 32, 32, 8, 128,
           4096, 32768, 32768, True,
           "Mistral 7B v0.3: v0.1's shape with a 32768-token vocabulary and no sliding "
           f"window; {_MISTRAL}."),
    Preset("mistral-small-24b", "mistralai/Mistral-Small-24B-Base-2501", "bfloat16", 23.57,
           40, 32, 8, 128, 5120, 131072, 32768, True,
           "Mistral Small 3 base (the follow-up's ninth checkpoint, run there with 8-bit "
           "bitsandbytes weights, outlier threshold 6.0, bf16 compute): grouped-query "
           "attention, no sliding window; attngeom loads it in 8-bit with quantization = "
           f"\"8bit\" (bitsandbytes, a CUDA GPU), else in the dtype given; {_MISTRAL}."),
    Preset("qwen-2.5-1.5b", "Qwen/Qwen2.5-1.5B", "bfloat16", 1.54, 28, 12, 2, 128, 1536,
           151936, 131072, False,
           "Qwen 2.5: grouped-query attention (6 query heads per kv head), biases on q/k/v, "
           "tied embeddings; Apache-2.0, not gated."),
    Preset("qwen-2.5-7b", "Qwen/Qwen2.5-7B", "bfloat16", 7.62, 28, 28, 4, 128, 3584, 152064,
           131072, False,
           "Qwen 2.5: grouped-query attention (7 query heads per kv head), biases on q/k/v; "
           "Apache-2.0, not gated."),
    Preset("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "float32", 0.135, 30, 9, 3,
           64, 576, 49152, 8192, False,
           "SmolLM2 (Llama architecture), small enough for a CPU and the offline tests; "
           "Apache-2.0, not gated."),
    Preset("gpt2", "openai-community/gpt2", "float32", 0.124, 12, 12, 12, 64, 768, 50257, 1024,
           False,
           "GPT-2 small: learned absolute positions, no BOS at the start of a window by "
           "default; MIT, not gated."),
)

PRESETS: dict[str, Preset] = {p.name: p for p in _ALL}


def preset(name: str) -> Preset:
    """The preset called ``name`` (case-insensitive; its hub id works too).

    Raises :class:`ConfigError` with the closest names when there is none, so a typo
    in a study file reads as a one-line fix.
    """
    key = str(name).strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    for p in _ALL:
        if p.hub_id.lower() == key:
            return p
    close = difflib.get_close_matches(key, list(PRESETS), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(PRESETS)}"
    raise ConfigError(f"unknown preset {name!r}: {hint}")

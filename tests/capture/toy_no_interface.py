"""A toy transformers model whose attention is computed inline, not through the interface.

Used by test_errors.py: capture must refuse it with a ModelError naming the class.
transformers itself detects such a model from its module source (an Attention
``nn.Module`` and no call of the interface), so this file must not mention it.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel


class PlainConfig(PreTrainedConfig):
    model_type = "attngeom_toy_plain"

    def __init__(self, hidden_size=8, num_attention_heads=2, vocab_size=16, **kwargs):
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = 1
        self.vocab_size = vocab_size
        super().__init__(**kwargs)


def eager_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    weights = torch.softmax(query @ key.transpose(-1, -2) * (scaling or 1.0), -1)
    return (weights @ value).transpose(1, 2), weights


class PlainAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.is_causal = True
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden):
        q, k, v = self.qkv(hidden).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2), -1)
        return self.o_proj(weights @ v)


class PlainModel(PreTrainedModel):
    config_class = PlainConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([PlainAttention(config)])
        self.post_init()

    def forward(self, input_ids, **kwargs):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        return hidden

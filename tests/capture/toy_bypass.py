"""The toy model of toy_no_interface.py, from a file transformers lets switch implementation.

transformers' own heuristic (an ``*Attention*(nn.Module)`` class in the module
source) finds none here, so ``set_attn_implementation`` succeeds, yet no layer
ever calls the registered function: capture must notice at the first forward.
(Not a subclass of PlainModel: transformers caches its verdict on the class.)
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from capture.toy_no_interface import PlainAttention, PlainConfig


class BypassModel(PreTrainedModel):
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

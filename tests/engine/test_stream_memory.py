"""What the streaming pass holds between layers: a layer's value statistics go with its
last query chunk, before the rest of the layer (its MLP) runs."""

from __future__ import annotations

import weakref

import torch

from attngeom.capture import model_layout
from attngeom.config import AnalysisConfig
from attngeom.corpora.windows import Window
from attngeom.engine.stream import stream_windows
from tests.architectures import TEST_LENGTH, make_model


class _Recorder:
    """An ``AnalysisSet`` stand-in: remembers every batch's value stats, weakly."""

    def __init__(self) -> None:
        self.stats: dict[tuple[int, int], set[int]] = {}
        self.refs: dict[int, list[weakref.ref]] = {}
        self.chunks: dict[int, int] = {}

    def update_many(self, batches) -> None:
        for b in batches:
            self.stats.setdefault((b.layer, b.window), set()).add(id(b.stats))
            self.refs.setdefault(b.layer, []).append(weakref.ref(b.stats))
        self.chunks[batches[0].layer] = self.chunks.get(batches[0].layer, 0) + 1


def test_value_stats_are_shared_by_a_layers_chunks_and_dropped_after_its_last() -> None:
    model = make_model("llama", seed=3)
    layout = model_layout(model)
    ids = torch.randint(3, 100, (2, TEST_LENGTH), generator=torch.Generator().manual_seed(4))
    windows = [Window(i, ids[i]) for i in range(2)]
    cfg = AnalysisConfig(window_length=TEST_LENGTH, query_mode="all", n_grid=(1, 2),
                         rules=("attention",), batch_size=2, bootstrap=0, chunk_size=5)
    rec = _Recorder()
    alive_at_mlp: dict[int, int] = {}

    def before_mlp(layer: int):
        def hook(module, args) -> None:
            alive_at_mlp[layer] = sum(r() is not None for r in rec.refs.get(layer, []))
        return hook

    handles = [blk.mlp.register_forward_pre_hook(before_mlp(i))
               for i, blk in enumerate(model.model.layers)]
    try:
        stream_windows(model, layout, windows, cfg, rec)
    finally:
        for h in handles:
            h.remove()
    assert set(alive_at_mlp) == set(range(layout.num_layers))
    assert all(rec.chunks[layer] > 2 for layer in alive_at_mlp)  # several chunks a layer
    # one ValueStats per (layer, window), whatever the number of chunks
    assert all(len(s) == 1 for s in rec.stats.values())
    assert len(rec.stats) == 2 * layout.num_layers
    # and none of a layer's still alive when its MLP starts
    assert alive_at_mlp == dict.fromkeys(range(layout.num_layers), 0)

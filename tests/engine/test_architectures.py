"""The streaming pass on every tiny architecture equals the definition on the model's own
eager attention probabilities (SPEC 1-2 end to end, habit 8)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from attngeom.capture import capture_attention, model_layout
from attngeom.config import AnalysisConfig
from attngeom.core.geometry import topn_metrics
from attngeom.corpora.windows import Window
from attngeom.engine.analyses import AnalysisSet
from attngeom.engine.stream import stream_windows
from tests.architectures import ARCHITECTURES, TEST_LENGTH, make_model

GRID = (1, 2, 4)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_stream_matches_eager_probabilities(name: str) -> None:
    model = make_model(name, seed=1)
    layout = model_layout(model)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 100, (2, TEST_LENGTH), generator=gen)
    windows = [Window(10 + i, ids[i]) for i in range(2)]
    cfg = AnalysisConfig(window_length=TEST_LENGTH, query_mode="all", n_grid=GRID,
                         rules=("attention", "random"), repeats=2, batch_size=2,
                         bootstrap=0)
    acc = AnalysisSet.create(cfg)
    stream_windows(model, layout, windows, cfg, acc)
    tables = acc.frames(model="m", corpus="c")
    metrics = tables["metrics"]
    assert set(tables) >= {"metrics", "sink", "taxonomy", "bounds", "assumptions"}

    # the definition, from the model's own eager probabilities and the captured values
    values = {}
    with torch.no_grad(), capture_attention(
        model, lambda c: values.setdefault(c.layer, c.values), query_rows=torch.tensor([0])
    ):
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                        output_attentions=True)
    finally:
        model.set_attn_implementation(prev)
    rows = torch.arange(1 if layout.is_causal else 0, TEST_LENGTH)
    for layer in (0, layout.num_layers - 1):
        for b, win in enumerate(windows):
            probs = out.attentions[layer][b][:, rows].float()  # (H, Q, T)
            # sliding windows (Mistral, Gemma-2): the keys the eager softmax gave mass to
            visible = probs > 0 if name in ("mistral", "gemma2") else None
            if visible is None and not layout.is_causal:
                visible = torch.ones_like(probs, dtype=torch.bool)
            for rule in ("attention", "random"):
                ref = topn_metrics(probs, values[layer][b], GRID, rule=rule, visible=visible,
                                   query_positions=rows, repeats=2, seed=0,
                                   window=win.index, layer=layer)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # N never valid here
                    expect = np.nanmean(ref.f_score.numpy(), axis=(0, 2))
                sel = ((metrics["window"] == win.index) & (metrics["layer"] == layer)
                       & (metrics["rule"] == rule) & (metrics["variant"] == "full"))
                got = metrics["f_score"][sel].to_numpy().reshape(layout.num_heads, len(GRID))
                np.testing.assert_allclose(got, expect, atol=1e-6, equal_nan=True,
                                           err_msg=f"{name} layer {layer} {rule}")

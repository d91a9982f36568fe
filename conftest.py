"""Doctest names (``make test`` runs the examples in ``src/attngeom`` docstrings).

``model`` and ``tokenizer`` are the shared stories260K, ``ids`` two 32-token windows of
the TinyStories sample; everything runs offline.
"""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
# ``--compile auto`` compiles for all-query runs on CPU; the tests pick compilation
# themselves (tests/engine/test_compile_and_budget.py compares the two)
os.environ.setdefault("ATTNGEOM_COMPILE", "0")


@pytest.fixture(autouse=True)
def _doctest_names(request):
    if not isinstance(request.node, pytest.DoctestItem):
        return
    from attngeom.assets import asset
    from attngeom.capture import load_model
    from attngeom.corpora.corpus import make_windows, read_documents

    import torch

    names = request.getfixturevalue("doctest_namespace")
    if "model" not in names:
        model, tokenizer = load_model(asset("stories260K"))
        docs, _ = read_documents(asset("tinystories"), max_documents=20)
        ids = torch.stack([w.input_ids for w in make_windows(docs, tokenizer, 32, n_windows=2)])
        names.update(model=model, tokenizer=tokenizer, ids=ids, input_ids=ids, torch=torch)

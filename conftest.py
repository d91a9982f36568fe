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


# Files whose tests read the same costly session fixture (tiny_study: a study on the real
# models, about a minute): under pytest-xdist they run on one worker, so it is computed once
SAME_WORKER = {"tests/studies/test_study_browser.py": "tests/studies/test_reproduce.py"}


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs two pytest-xdist workers with ``--dist loadfile``: the tests run
    on one thread (``torch.set_num_threads(1)``), so one process leaves a core idle. A
    worker takes whole files, so that module fixtures (a model, a run) are built once;
    the files in ``SAME_WORKER`` go with the file named there."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SAME_WORKER.get(file, file)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On an xdist worker, files holding a ``slow`` test come first (the controller hands
    out files in the workers' order; with ``--no-loadscope-reorder`` it keeps it), so that
    no long file starts last while the other worker has finished. Order within a file,
    and of the other files, is kept; without xdist nothing changes."""
    if not hasattr(config, "workerinput"):
        return
    files: dict[str, list] = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        files.setdefault(SAME_WORKER.get(file, file), []).append(item)
    ordered = sorted(files.values(), key=lambda tests: not any(
        t.get_closest_marker("slow") for t in tests))  # a stable sort
    items[:] = [t for tests in ordered for t in tests]


@pytest.fixture(autouse=True)
def _doctest_names(request):
    if not isinstance(request.node, pytest.DoctestItem):
        return
    import torch

    from attngeom.assets import asset
    from attngeom.capture import load_model
    from attngeom.corpora.corpus import make_windows, read_documents

    names = request.getfixturevalue("doctest_namespace")
    if "model" not in names:
        model, tokenizer = load_model(asset("stories260K"))
        docs, _ = read_documents(asset("tinystories"), max_documents=20)
        ids = torch.stack([w.input_ids for w in make_windows(docs, tokenizer, 32, n_windows=2)])
        names.update(model=model, tokenizer=tokenizer, ids=ids, input_ids=ids, torch=torch)

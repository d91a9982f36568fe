"""A tiny study on the real shared models, run once per session (about a minute)."""

from __future__ import annotations

import textwrap

import pytest

from tests.architectures import STORIES_PATH, TINYSTORIES_PATH, WIKITEXT_PATH, minilm_path


def tiny_study_text() -> str:
    return textwrap.dedent(f"""
    [study]
    name = "tiny"
    title = "tiny study"
    analyses = ["geometry", "sink", "taxonomy", "bounds", "diagnostics", "cross_corpus",
                "pruning", "head_scan", "restriction", "geometry_vs_loss"]

    [defaults]
    seed = 1

    [models.stories]
    model = "{STORIES_PATH}"
    [models.minilm]
    model = "{minilm_path()}"

    [corpora.tiny]
    corpus = "{TINYSTORIES_PATH}"
    [corpora.wiki]
    corpus = "{WIKITEXT_PATH}"
    sample_documents = 12
    separator = "wikitext-articles"

    [analyze]
    window_length = 64
    n_windows = 4
    query_mode = "stride:8"
    n_grid = [1, 2, 4, 8]
    bootstrap = 20
    batch_size = 2

    [pruning]
    models = ["stories"]
    corpora = ["tiny"]
    window_length = 64
    rankers = ["magnitude", "random"]
    seeds = [0]
    keep_fractions = [1.0, 0.5]
    n_rank_windows = 2
    n_eval_windows = 2

    [head_scan]
    corpora = ["tiny"]
    window_length = 64
    n_eval_windows = 2

    [restriction]
    window_length = 64
    n_grid = [1, 2, 4, 8, 16]
    n_eval_windows = 2

    [geometry_vs_loss]
    renormalize = false
    """)


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """(study file, study directory, result) of one full run of the tiny study."""
    from attngeom.studies.reproduce import reproduce

    root = tmp_path_factory.mktemp("study")
    path = root / "tiny.toml"
    path.write_text(tiny_study_text(), encoding="utf-8")
    out = root / "out"
    result = reproduce(path, out, progress=False)
    return path, out, result

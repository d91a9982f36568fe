"""The recipes of docs/extending.md, carried out: a toy analysis, ranker, figure and
command, each added through its registry alone (registered here for the test and
removed after it) and run end to end on a tiny random Llama, a study included.

If a recipe needs one more file than the doc says, this test fails: the registries,
not edits elsewhere, are what make each extension work.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch

from attngeom import api
from attngeom.config import COMMANDS, RunConfig, command, option
from attngeom.core.protocol import Accumulator
from attngeom.engine.runner import Command
from attngeom.errors import ConfigError
from attngeom.names import ANALYSES, HEAD_TYPES, RANKERS
from attngeom.results import schemas
from attngeom.results.io import read_table
from attngeom.validate import Integer
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH

# --------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random two-layer Llama with the stories260K tokenizer, saved like any model."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(STORIES_PATH))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id))
    path = tmp_path_factory.mktemp("tiny-llama") / "tiny-llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


# --------------------------------------------------------------------------- analysis

TOY_TABLE = "toy_sink_share"


class ToySinkShare(Accumulator):
    """Mean attention on position 0 per (layer, head) over the valid query rows: sums and
    counts only, so shards merge exactly."""

    tables = (TOY_TABLE,)

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = {}
        self.rows: dict[int, np.ndarray] = {}

    def update(self, batch) -> None:
        alpha = batch.alpha.double()
        finite = torch.isfinite(alpha).all(-1)  # a non-finite row counts nowhere
        share = torch.where(finite, alpha[..., 0], 0.0).sum(-1).numpy()
        h = share.shape[0]
        self.sums[batch.layer] = self.sums.get(batch.layer, np.zeros(h)) + share
        self.rows[batch.layer] = self.rows.get(batch.layer, np.zeros(h)) + finite.sum(-1).numpy()

    def merge(self, other: ToySinkShare) -> ToySinkShare:
        for layer in other.sums:
            self.sums[layer] = self.sums.get(layer, 0) + other.sums[layer]
            self.rows[layer] = self.rows.get(layer, 0) + other.rows[layer]
        return self

    def compute(self) -> dict:
        layers = sorted(self.sums)
        heads = len(self.sums[layers[0]]) if layers else 0
        return {TOY_TABLE: {
            "layer": np.repeat(layers, heads).astype(np.int64),
            "head": np.tile(np.arange(heads), len(layers)).astype(np.int64),
            "share": np.concatenate([self.sums[la] / np.maximum(self.rows[la], 1)
                                     for la in layers]) if layers else np.zeros(0),
        }}


@pytest.fixture
def toy_analysis(monkeypatch):
    """The analysis recipe: its tables in results/schemas.py, one register call in
    engine/analyses.py (both undone after the test)."""
    from attngeom.engine import analyses

    monkeypatch.setitem(schemas.ROW_KEYS, TOY_TABLE, ("model", "corpus", "layer", "head"))
    monkeypatch.setitem(schemas.WRITTEN_BY, TOY_TABLE, "toy")
    with schemas.SCHEMAS.registered(TOY_TABLE,
                                    schemas._cols(schemas._ID + "layer:i head:i share:f")), \
            ANALYSES.registered("toy", analyses.Analysis(
                "toy", lambda config, context: ToySinkShare())):
        yield "toy"


# --------------------------------------------------------------------------- ranker


@pytest.fixture
def toy_ranker(monkeypatch):
    """The ranker recipe: one function and one register call in interventions/rankers.py."""
    from attngeom.interventions import rankers

    def last_layer_first(model, **_):
        layout = rankers.model_layout(model)
        heads = [(layer, h) for layer in reversed(range(layout.num_layers))
                 for h in range(layout.num_heads)]
        scores = torch.arange(len(heads), dtype=torch.float64).reshape(
            layout.num_layers, layout.num_heads).flip(0)
        return rankers.HeadRanking("toy_last_layer", tuple(heads), scores)

    with RANKERS.registered("toy_last_layer", rankers.Ranker("toy_last_layer",
                                                             last_layer_first)):
        yield "toy_last_layer"


# --------------------------------------------------------------------------- figure


@pytest.fixture
def toy_figure():
    """The figure recipe: one @figure function in figures/catalog.py."""
    from attngeom.figures import catalog

    def make(g):
        table = g.get(TOY_TABLE)
        if table is None:
            return None

        def draw():
            from attngeom.figures.style import new_figure

            fig, ax = new_figure()
            ax.bar(range(len(table)), table["share"])
            return fig

        return catalog.Plot("Toy sink share", "Mean attention on position 0 per head.",
                            (TOY_TABLE,), draw)

    catalog.figure("toy_share", "sink")(make)
    yield "toy_share"
    catalog.CATALOG.unregister("toy_share")


# --------------------------------------------------------------------------- command

TOY_COUNTS = "toy_counts"


@dataclass(frozen=True)
class ToyCountConfig(RunConfig):
    """``attngeom toy-count``: special tokens per window."""

    n_windows: int = option(2, check=Integer(1), help="windows to count")

    @property
    def windows_needed(self) -> int:
        return self.n_windows


class ToyCount(Command):
    def run(self, ctx) -> dict:
        rows = [{"window": int(w.index), "special": int(w.special.sum())}
                for w in ctx.windows]
        return {TOY_COUNTS: pd.DataFrame(rows)}


def toy_summary(res) -> str:
    return f"{len(res[TOY_COUNTS])} windows counted"


@pytest.fixture
def toy_command(monkeypatch):
    """The command recipe: its configuration class with one @command declaration, its
    work (a Command) and a table schema."""
    monkeypatch.setitem(schemas.ROW_KEYS, TOY_COUNTS, ("model", "corpus", "window"))
    with schemas.SCHEMAS.registered(TOY_COUNTS,
                                    schemas._cols(schemas._ID + "window:i special:i")):
        command("toy-count", help="special tokens per window",
                work=f"{__name__}:ToyCount", summary=f"{__name__}:toy_summary",
                run_dir="toy", study="toy_count")(ToyCountConfig)
        try:
            yield "toy-count"
        finally:
            COMMANDS.unregister("toy-count")


# --------------------------------------------------------------------------- the runs


def test_toy_extensions_run_end_to_end(tiny_llama, toy_analysis, toy_ranker, toy_figure,
                                       toy_command, tmp_path, capsys):
    from attngeom.cli import main

    common = dict(model=tiny_llama, corpus=str(TINYSTORIES_PATH), window_length=16)
    # the analysis, through the CLI (its name is a valid --analyses value) and the API
    assert main(["analyze", "--model", tiny_llama, "--corpus", str(TINYSTORIES_PATH),
                 "--window-length", "16", "--n-windows", "3", "--batch-size", "2",
                 "--analyses", toy_analysis, "--bootstrap", "0", "--quiet",
                 "--out", str(tmp_path / "a")]) == 0
    share = read_table(tmp_path / "a", TOY_TABLE)
    assert len(share) == 2 * 4 and share["share"].between(0, 1).all()
    whole = api.analyze(**common, n_windows=3, batch_size=3, analyses=(toy_analysis,),
                        bootstrap=0, progress=False)
    pd.testing.assert_frame_equal(whole[TOY_TABLE], share, check_exact=False, rtol=1e-12)
    # the figure, in the run's report
    index = api.report(tmp_path / "a")
    html = index.read_text()
    assert "Toy sink share" in html and (index.parent / "figures" / "toy_share.png").is_file()
    # the ranker, in a pruning sweep
    res = api.prune(**common, out=tmp_path / "p", rankers=(toy_ranker, "magnitude"),
                    keep_fractions=(1.0, 0.5), n_rank_windows=1, n_eval_windows=1,
                    progress=False)
    assert set(res["pruning"]["ranker"]) == {toy_ranker, "magnitude"}
    ranked = res["rankings"][res["rankings"]["ranker"] == toy_ranker].sort_values("rank")
    assert ranked["layer"].iloc[0] == 1  # last layer first
    # the command, through the CLI and its printed summary
    assert main(["toy-count", "--model", tiny_llama, "--corpus", str(TINYSTORIES_PATH),
                 "--window-length", "16", "--n-windows", "2", "--quiet",
                 "--out", str(tmp_path / "c")]) == 0
    assert "2 windows counted" in capsys.readouterr().out
    assert len(read_table(tmp_path / "c", TOY_COUNTS)) == 2


def test_toy_analysis_and_command_run_in_a_study(tiny_llama, toy_analysis, toy_command,
                                                 tmp_path):
    from attngeom.studies.reproduce import reproduce
    from attngeom.studies.study import load_study

    path = tmp_path / "toy.toml"
    path.write_text(textwrap.dedent(f"""
        [study]
        name = "toy"
        analyses = ["{toy_analysis}", "toy_count"]

        [defaults]
        window_length = 16

        [models.tiny]
        model = "{tiny_llama}"

        [corpora.stories]
        corpus = "{TINYSTORIES_PATH}"

        [analyze]
        n_windows = 2
        bootstrap = 0

        [toy_count]
        n_windows = 3
    """))
    study = load_study(path)
    assert [c.command for c in study.cells] == ["analyze", "toy-count"]
    result = reproduce(study, tmp_path / "out", progress=False, reports=False)
    assert [c["status"] for c in result.cells] == ["run", "run"]
    assert len(result.tables[TOY_TABLE]) == 2 * 4
    assert len(result.tables[TOY_COUNTS]) == 3
    assert (tmp_path / "out" / "runs" / "tiny" / "stories" / "toy").is_dir()


# --------------------------------------------------------------------------- head score


@pytest.fixture
def toy_head_score():
    """The head-score recipe: one scoring function and one registration (with its
    threshold and input) in ``names.HEAD_TYPES``; removed after the test."""
    from attngeom.core.head_scores import HeadScore, attention_at

    def self_rows(alpha, query_positions, values, tokens, streaming_window):
        return attention_at(alpha, query_positions, query_positions.to(torch.int64), low=1)

    with HEAD_TYPES.registered("toy_self", HeadScore(self_rows),
                               meta={"threshold": 0.5, "input": "corpus"}):
        yield "toy_self"


def test_head_score_recipe(tiny_llama, toy_head_score) -> None:
    """A registered head score rides the analysis' forward (analyze --analyses head_scores
    and the atlas), gets its threshold's label and its place in the atlas's tables."""
    from attngeom.capture import capture_attention, load_model
    from attngeom.corpora.documents import load_windows

    options = dict(n_windows=2, window_length=32, seed=0, progress=False)
    res = api.analyze(tiny_llama, str(TINYSTORIES_PATH), None, analyses=("head_scores",),
                      head_stride=4, **options)
    mine = res["head_scores"].query("score == @toy_head_score")
    assert len(mine) == 2 * 4 and (mine["threshold"] == 0.5).all()
    assert (mine["is_type"] == (mine["value"] >= 0.5)).all()
    # the value is the mean of alpha[t, t] over rows every 4 back from 31, both windows
    model, tok = load_model(tiny_llama)
    cfg = api.AnalysisConfig(model=tiny_llama, corpus=str(TINYSTORIES_PATH), **{
        k: v for k, v in options.items() if k != "progress"})
    windows, _, _ = load_windows(cfg, tok)
    rows = torch.arange(31, 0, -4).flip(0)
    got: dict[int, list] = {}
    with torch.no_grad(), capture_attention(model, lambda c: got.setdefault(
            c.layer, []).append(c.alpha[:, :, torch.arange(len(rows)), rows]),
            query_rows=rows):
        model(torch.stack([w.input_ids for w in windows]))
    for layer, parts in got.items():
        want = torch.cat(parts).double().mean(dim=(0, 2))  # (H,)
        have = mine[mine["layer"] == layer].sort_values("head")["value"].to_numpy()
        np.testing.assert_allclose(have, want.numpy(), rtol=1e-6)
    atlas = api.atlas(tiny_llama, str(TINYSTORIES_PATH), None, n_windows=2, window_length=32,
                      query_stride=4, n_repeats=1, repeat_length=8, n_needles=1,
                      needle_length=2, needle_contexts=(32,), bootstrap=0, progress=False)
    assert toy_head_score in set(atlas["atlas_contingency"]["head_type"])
    assert toy_head_score in set(atlas["head_scores"]["score"])


# --------------------------------------------------------------------------- probe

TOY_PROBE = "toy_probe_loss"


def _toy_prepare(ctx):
    """The probe's inputs, built with the tokenizer before the model loads: one prompt
    per number word, each checked against the model's positions."""
    prompts = [ctx.tokenizer(f"Once upon a time there were {w} cats.")["input_ids"]
               for w in ("two", "three", "four")]
    limit = ctx.shape.max_positions if ctx.shape is not None else None
    if limit is not None and max(map(len, prompts)) > limit:
        raise ConfigError(f"toy: a prompt is longer than {limit} positions")
    return prompts


def _toy_run(ctx):
    """Each prompt's final-token NLL, one unit per prompt (resumable, shardable)."""
    from attngeom.engine.runner import Unit

    units = [Unit(i, (i,), ids=(i,)) for i in range(len(ctx.inputs))]

    def process(unit):
        ids = torch.tensor([ctx.inputs[unit.windows[0]]])
        with torch.no_grad():
            logits = ctx.model(ids).logits[0, -2].double()
        return float(-torch.log_softmax(logits, -1)[ids[0, -1]])

    nll = list(ctx.run_units("toy", units, process, desc="toy probe", unit="prompt"))
    return {TOY_PROBE: pd.DataFrame({"prompt": range(len(nll)), "nll": nll})}


@pytest.fixture
def toy_probe(monkeypatch):
    """The probe recipe: a ``Probe`` (prepare, run, settings) registered in
    ``names.PROBES`` and its table's schema; removed after the test."""
    from attngeom.names import PROBES
    from attngeom.probes.competition import Probe

    monkeypatch.setitem(schemas.ROW_KEYS, TOY_PROBE, ("model", "corpus", "prompt"))
    probe = Probe(_toy_prepare, _toy_run, settings=lambda ctx: {"prompts": len(ctx.inputs)},
                  record=lambda inputs: {"prompts": len(inputs)})
    with schemas.SCHEMAS.registered(TOY_PROBE, schemas._cols(schemas._ID + "prompt:i nll:f")), \
            PROBES.registered("toy", probe):
        yield "toy"


def test_probe_recipe(tiny_llama, toy_probe, tmp_path) -> None:
    res = api.competition(tiny_llama, None, tmp_path / "toy", probe=toy_probe, progress=False)
    table = read_table(tmp_path / "toy", TOY_PROBE)
    assert len(table) == 3 and table["nll"].gt(0).all()
    settings = dict(zip(res["competition_settings"]["setting"],
                        res["competition_settings"]["value"], strict=True))
    assert settings["probe"] == "toy" and settings["prompts"] == "3"
    assert res.manifest["corpus"]["probe"] == {"name": "toy", "prompts": 3, "seed": 0}

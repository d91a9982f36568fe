"""The policies part and the policy_atlas step in study files (issue 39, items 2 and 5):
the documented example loads, a missing part is one line at the key, and a tiny study
on stories260K runs the restriction and policies parts on the same model and corpus,
their tables named apart, the step joined with the atlas and the report consistent."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from attngeom.errors import StudyError
from attngeom.studies.study import load_study
from tests.architectures import STORIES_PATH, TINYSTORIES_PATH

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_the_documented_example_loads():
    docs = (ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    part = docs[docs.index("### The policies part"):]
    text = re.search(r"```toml\n(.*?)```", part, re.S).group(1)
    study = load_study(_write_tmp(text))
    cells = {c.command: c.config for c in study.cells}
    assert set(cells) == {"atlas", "restrict-local", "restrict-policies"}
    policies = cells["restrict-policies"]
    assert policies.rankings == ("attention", "window", "h2o", "tova", "quest")
    assert policies.alone_tau == 0.05 and policies.document_protocol == "fixed"
    assert cells["restrict-local"].rankings == ("attention", "window")


def _write_tmp(text: str) -> Path:
    import tempfile

    return _write(Path(tempfile.mkdtemp()), text)


BASE = f"""
[study]
name = "p"
analyses = ANALYSES

[models.stories]
model = "{STORIES_PATH}"
[corpora.tiny]
corpus = "{TINYSTORIES_PATH}"
"""


@pytest.mark.parametrize("analyses, extra, needle, message", [
    ('["policies", "policy_atlas"]', "", "analyses =",
     "policy_atlas joins the atlas with heads restricted alone"),
    ('["atlas", "policies", "policy_atlas"]', "\n[policies]\nalone_tau = \"none\"\n",
     "analyses =", "(the policies part, or restriction with alone_tau) or the localised"),
    ('["atlas", "policies", "policy_atlas"]', "\n[policy_atlas]\ncorpora = []\n",
     "corpora = []", "policy_atlas joins"),
    ('["atlas", "policies"]', "\n[policies]\nn_grid = [4, 16]\n", "n_grid = [4, 16]",
     "n_grid: the quest ranking keeps 16 fixed keys, so every N must be >= 16, got 4"),
    ('["atlas", "policies"]', "\n[policies]\nalone_tau = 0.2\n", "alone_tau = 0.2",
     "alone_tau: expected one of the taus 0.01,0.05,0.1, got 0.2"),
    ('["atlas", "policies"]', "\n[policies]\nrankings = [\"window\", \"snapkv\"]\n",
     "rankings =", "rankings: snapkv compresses a prompt once"),
])
def test_a_missing_part_or_a_bad_option_is_one_line(tmp_path, analyses, extra, needle,
                                                     message):
    text = textwrap.dedent(BASE).replace("ANALYSES", analyses) + extra
    if '"atlas"' in analyses:
        text += "\n[atlas]\nn_windows = 2\nwindow_length = 128\n"
    path = _write(tmp_path, text)
    with pytest.raises(StudyError) as info:
        load_study(path)
    err = str(info.value)
    assert "\n" not in err and message in err, err
    line = next(i for i, x in enumerate(text.splitlines(), 1) if needle in x)
    assert err.startswith(f"{path}:{line}:"), err


TINY = f"""
[study]
name = "tiny-policies"
analyses = ["restriction", "policies", "local_restriction", "atlas", "policy_atlas"]

[defaults]
seed = 0
bootstrap = 20
window_length = 64
n_eval_windows = 2
batch_size = 2

[models.stories]
model = "{STORIES_PATH}"
[corpora.tiny]
corpus = "{TINYSTORIES_PATH}"

[restriction]
rankings = ["attention"]
renormalize = [false]
n_grid = [1, 2, 4, 8]
taus = [0.05]

[policies]
rankings = ["attention", "window", "quest"]
taus = [0.05]
layers = [0]
n_grid = [16, 32]

[local_restriction]
rankings = ["attention", "window"]
renormalize = [false]
scan_n = [8]
scan_top_layers = 1

[atlas]
n_windows = 2
window_length = 128
query_mode = "stride:16"
bootstrap = 0
n_repeats = 2
repeat_length = 16
n_needles = 2
needle_length = 2
"""


@pytest.mark.slow
def test_a_tiny_study_names_the_policies_part_apart_and_joins_the_atlas(tmp_path):
    from attngeom.report.study import _load
    from attngeom.results.io import read_table
    from attngeom.studies.reproduce import reproduce
    from tests.report.consistency import check_report, read_report
    from tests.report.policy_checks import STUDY_POLICY_SENTENCES, study_policy_checks

    out = tmp_path / "out"
    result = reproduce(_write(tmp_path, TINY), out, progress=False)
    tables = out / "tables"
    # the restriction part's attention search and the policies part's are kept apart
    restrict = read_table(tables, "restrict_nstar")
    policy = read_table(tables, "policy_nstar")
    assert set(restrict["ranking"]) == {"attention"}
    assert set(policy["ranking"]) == {"attention", "window", "quest"}
    run = read_table(out / "runs/stories/tiny/policies", "restrict_nstar")
    assert policy.drop(columns=["model", "corpus"]).equals(run.drop(columns=["model",
                                                                             "corpus"]))
    alone = read_table(tables, "policy_alone")
    assert len(alone) == 8 * 3 and set(alone["layer"]) == {0}  # layer 0's 8 heads
    oracle = policy[(policy["ranking"] == "attention")]["n_star"].iloc[0]
    assert (alone["n"] == oracle).all() and oracle < 4
    types = read_table(tables, "policy_head_types")
    assert set(types["part"]) == {"policies"} and "all" in set(types["head_type"])
    every = types[(types["head_type"] == "all") & (types["ranking"] == "attention")]
    mine = alone[alone["ranking"] == "attention"]["delta_nll_rel"]
    assert every["mean_delta_nll_rel"].iloc[0] == pytest.approx(mine.mean())
    first = read_table(tables, "policy_first_heads")
    assert {"policies", "local"} <= set(first["part"])
    assert set(first[first["part"] == "local"]["ranking"]) == {"attention", "window"}
    # the study report shows every number of the policy tables and sentences as they are
    # (the other tables of this study are tests/report/test_report_consistency.py's)
    _, written = _load(out)
    html = (out / "report" / "index.html").read_text("utf-8")
    mine = study_policy_checks(written)
    report = read_report(html)
    report.tables = [t for t in report.tables if any(re.search(c.caption, t.caption)
                                                     for c in mine)]
    report.findings = [f for f in report.findings if "heads that break first" in f]
    # the oracle's N*_5% here is below window's 4 sinks: its heads alone are undefined
    # (below_fixed), so only the localised scan says which heads break first under it
    assert set(alone[alone["ranking"] == "window"]["status"]) == {"below_fixed"}
    assert len(report.tables) == 3 and len(report.findings) == 1
    problems = check_report(report, written, mine, STUDY_POLICY_SENTENCES)
    assert problems == [], "\n".join(problems)
    assert "of each ranking beside the attention oracle" in html
    assert "Policy x head type" in html and "study-policy-types" in html
    assert result.tables["policy_first_heads"] is not None

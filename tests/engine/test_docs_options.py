"""The options the user docs name exist: a renamed option must not leave a page
pointing at nothing (docs/scale.md, the README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attngeom.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
# the launchers' own flags (torchrun, accelerate launch), not attngeom's
LAUNCHER = {"--standalone", "--nproc-per-node", "--num_processes", "--nnodes", "--rdzv-backend",
            "--rdzv-endpoint", "--rdzv-id"}
SLURM = {"--array", "--gres", "--cpus-per-task", "--time", "--output", "--job-name"}  # sbatch's
OTHER_TOOLS = {"--no-deps"}  # pip's, in the install steps
# benchmarks/bench_real.py's, in docs/scale.md
BENCHMARKS = {"--restrict-only", "--cpu-clock", "--threads"}


def _command_options() -> set[str]:
    parser = build_parser()
    found = set()
    for action in parser._actions:
        for sub in getattr(action, "choices", None) or {}:
            if hasattr(action.choices[sub], "_actions"):
                for a in action.choices[sub]._actions:
                    found.update(a.option_strings)
    return found


@pytest.mark.parametrize("page", ["docs/scale.md", "README.md"])
def test_every_option_a_page_names_exists(page):
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", (ROOT / page).read_text()))
    missing = sorted(named - LAUNCHER - SLURM - OTHER_TOOLS - BENCHMARKS
                     - _command_options())
    assert not missing, f"{page} names options no command has: {missing}"

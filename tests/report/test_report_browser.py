"""The report in a real browser: headless Chromium over the DevTools pipe.

Checks that the page loads with no console error and no request that is not
``file:``/``data:``, that every figure decodes with a non-zero size, and saves a
full-page screenshot (to ``$ATTNGEOM_ARTIFACTS`` too, when set). A negative
control shows the same checks catch a broken image and a script error.

Where no browser is installed the test runs ``scripts/install_browser.sh`` once;
it is skipped, with the script's reason, only when that cannot install one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.report.headless_chromium import find_chromium, inspect_page

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def browser():
    found = find_chromium()
    if found:
        return found
    script = ROOT / "scripts" / "install_browser.sh"
    try:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                              timeout=600)
        reason = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = [str(exc)]
    found = find_chromium()
    if not found:
        pytest.fail(f"no Chromium and none could be installed (make test installs it with "
                    f"scripts/install_browser.sh): {reason[0]}")
    return found


def test_report_renders_in_chromium(full_run, browser, tmp_path):
    run, index = full_run
    shot = tmp_path / "report.png"
    page = inspect_page(browser, index.as_uri(), user_data_dir=tmp_path / "profile",
                        screenshot=shot)
    assert page.console_errors == []
    assert page.external_requests == []
    assert page.title == "attngeom report: tiny-llama"
    html = index.read_text(encoding="utf-8")
    assert len(page.images) == html.count("<img ") == 11
    for image in page.images:
        assert image["ok"], image
        assert image["w"] > 0 and image["h"] > 0, image
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    assert page.page_height > 2000
    artifacts = os.environ.get("ATTNGEOM_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "report_screenshot.png")


def test_checks_catch_a_broken_page(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img alt="broken" src="data:image/png;base64,AAAA">'
                   "<script>console.error('boom'); undefinedFunction();</script>"
                   "</body></html>", encoding="utf-8")
    page = inspect_page(browser, bad.as_uri(), user_data_dir=tmp_path / "profile",
                        screenshot=tmp_path / "bad.png")
    assert [image["ok"] for image in page.images] == [False]
    assert any("boom" in e for e in page.console_errors)
    assert any("undefinedFunction" in e for e in page.console_errors)


FIRST_SCREEN = """
(() => {
  const section = document.getElementById('references');
  window.scrollTo(0, section.getBoundingClientRect().top + window.scrollY);
  const wrap = document.getElementById('reference-values');
  const edge = Math.min(window.innerWidth, wrap.getBoundingClientRect().left
                        + wrap.clientWidth);
  const heads = Array.from(wrap.querySelectorAll('thead th'));
  const first = wrap.querySelector('tbody tr');
  return JSON.stringify({edge: edge, height: window.innerHeight,
    row: first.getBoundingClientRect().bottom,
    heads: heads.map(h => [h.textContent, h.getBoundingClientRect().right])});
})()
"""


def test_published_values_first_screen_says_what_is_compared(browser, tmp_path):
    """At 1400 px the section's first screen shows, without scrolling, the verdict, both
    models with their sizes and corpora, and both window lengths (issue 38)."""
    import json

    from attngeom.report.study import build_study_report
    from tests.report import report_synth as rs

    root = rs.write_study(tmp_path / "study", rs.study_tables())
    index = build_study_report(root, formats=("png",))
    page = inspect_page(browser, index.as_uri(), user_data_dir=tmp_path / "profile",
                        screenshot=None, width=1400, height=900,
                        expressions=[FIRST_SCREEN])
    assert page.console_errors == []
    got = json.loads(page.values[0])
    right = dict(got["heads"])
    for head in ("verdict", "ours: model (size), corpus", "paper's: model (size), corpus",
                 "L ours / paper", "published", "ours"):
        assert right[head] <= got["edge"], (head, right[head], got["edge"])
    assert got["row"] <= got["height"]

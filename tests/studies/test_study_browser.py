"""The study report in a real browser (headless Chromium, as the run report's test)."""

from __future__ import annotations

import pytest

from tests.report.headless_chromium import inspect_page
from tests.report.test_report_browser import browser  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


def test_study_report_renders_in_chromium(tiny_study, browser, tmp_path):  # noqa: F811
    _, out, res = tiny_study
    shot = tmp_path / "study.png"
    page = inspect_page(browser, res.report.as_uri(), user_data_dir=tmp_path / "profile",
                        screenshot=shot)
    assert page.console_errors == []
    assert page.external_requests == []
    assert page.title == "tiny study"
    html = res.report.read_text(encoding="utf-8")
    # topn, sink, regimes, pruning, restrict and the follow-up's Table 1
    assert len(page.images) == html.count("<img ") == 6
    for image in page.images:
        assert image["ok"] and image["w"] > 0 and image["h"] > 0, image
    assert page.page_height > 2000

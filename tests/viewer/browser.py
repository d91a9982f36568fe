"""Use a page in headless Chromium: load it, act on it, read what it drew.

The report tests load a page and check it; the viewer also has to *use* its page (move
the slider, switch the distance) and read the result. ``drive_page`` is the report
tests' ``inspect_page`` with a list of JavaScript expressions evaluated in order after
the load event; console errors, exceptions and non-file requests are recorded as there.
"""

from __future__ import annotations

from pathlib import Path

from tests.report.headless_chromium import PageReport, inspect_page


def drive_page(browser: str, url: str, expressions: list[str], *, user_data_dir: Path,
               screenshot: Path | None = None, width: int = 1280, height: int = 1400,
               timeout: float = 60.0) -> PageReport:
    """Load ``url``, evaluate each expression (``returnByValue``), then screenshot."""
    return inspect_page(browser, url, user_data_dir=user_data_dir, screenshot=screenshot,
                        width=width, height=height, max_height=height, timeout=timeout,
                        expressions=expressions)

"""Open a ``ckpt report`` in a real headless Chromium (Debian's, driven by Playwright) and read what it shows.

``.ci/run`` installs Chromium when it is missing; elsewhere a machine without it skips these
checks (in CI, ``CI=true``, a missing browser fails them instead).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest


@dataclass
class Page:
    """What the browser saw."""

    images: list[dict] = field(default_factory=list)
    """Every ``<img>``: its alt text, whether it loaded, and its natural width."""
    console_errors: list[str] = field(default_factory=list)
    """Console errors and uncaught exceptions."""
    slider_steps: list[str] = field(default_factory=list)
    """The step label after moving the slider to each end."""
    slider_frames: list[str] = field(default_factory=list)
    """The frame's image source after moving the slider to each end."""
    screenshot: np.ndarray | None = None
    title: str = ""
    """``document.title`` once the page loaded (what a script run by the page could have changed)."""


def chromium() -> str:
    """The system Chromium's path; skips (fails in CI) when there is none."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    return found


def open_report(report: Path, screenshot: Path) -> Page:
    """Load ``report`` from disk (no server), move its step slider to both ends, and screenshot it."""
    from PIL import Image
    from playwright.sync_api import sync_playwright

    seen = Page()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.on("console", lambda m: seen.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen.console_errors.append(str(e)))
            page.goto(report.resolve().as_uri(), wait_until="load")
            seen.title = page.title()
            seen.images = page.evaluate(
                "Array.from(document.images).map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0,"
                " width: i.naturalWidth}))"
            )
            if page.query_selector("#slider") is not None:
                last = page.get_attribute("#slider", "max")
                for value in ("0", last):
                    page.fill("#slider", value)  # sets the range's value and fires input
                    seen.slider_steps.append(page.text_content("#frame-step") or "")
                    seen.slider_frames.append(page.get_attribute("#frame", "src") or "")
            page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    with Image.open(screenshot) as image:
        seen.screenshot = np.asarray(image.convert("RGB"))
    return seen

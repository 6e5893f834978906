"""Nothing in ``ckpt report`` is trusted: every text from a store or an exception is escaped, and the page's
Content-Security-Policy runs only the script ckpt wrote (issue 68: findings 3 and 12, "what to build" 4).

The hostile store holds an HTML payload in every text ckpt reads from it: run attrs and config,
split, label and metric names, an analysis name (``--as``), option values, provenance texts, and
an error text (a damaged chunk of that analysis, named in the "comparison failed" line). Names
must pass the store's own validation (no ``/``), so they carry the ``<img onerror>`` payload; the
texts that may hold anything carry ``<script>`` too. Every payload sets ``document.title`` to
:data:`MARKER` when it runs: a real headless Chromium opens the page and the title is read back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.plugins.examples import EXAMPLE_FACTORY, mlp
from tests.helpers import invoke_ckpt, run_ckpt, set_provenance

pytestmark = pytest.mark.slow  # trains a tiny run, analyzes it, and opens its report in a browser

MARKER = "pwned"
IMG = '<img src=x onerror="document.title=`pwned`">'
"""A payload that is also a valid node name (no ``/``): analyses, splits, labels, metrics."""
SCRIPT = "<script>document.title='pwned'</script>"
"""A payload for texts that may hold anything: attrs, option values, provenance."""
INJECTED = f"{SCRIPT}<img src=x onerror=\"document.title='pwned'\"><svg onload=\"document.title='pwned'\"></svg>"
"""What a future missed escape would put into the page: the policy must stop all of it."""


def _hostile_store(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    model = mlp()
    inputs, targets = torch.randn(16, 3), torch.randint(0, 4, (16,))
    attrs = {IMG: SCRIPT, "note": SCRIPT, "config": {IMG: SCRIPT, "nested": [SCRIPT]}}
    with ckptstore.create(path, model=EXAMPLE_FACTORY, objective="cross-entropy", attrs=attrs) as writer:
        writer.add_data("eval", inputs=inputs, targets=targets, labels={IMG: targets % 2})
        writer.add_data(IMG, inputs=inputs, targets=targets, labels={IMG: targets % 2})
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(3):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            writer.write(step, model, metrics={IMG: float(loss.detach()), "loss": float(loss.detach())})
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    clustering = {"on": "loss", "label": IMG, "delta": 1.0, "tau": 1.0}
    run("clusters", path, min_cluster_size=2, place_label=SCRIPT, progress=False, **clustering)
    run("clusters", path, min_cluster_size=3, save_as=IMG, progress=False, **clustering)
    set_provenance(path, IMG, {"created": SCRIPT, "ckpt_version": SCRIPT, "version": SCRIPT})
    # finding 3: the comparison reads this chunk, and its error names the analysis (written whole: the
    # values may equal the fill value, and then zarr wrote no chunk at all)
    chunk = path / "analyses" / IMG / "top_homogeneity" / "c" / "0"
    chunk.parent.mkdir(exist_ok=True)
    chunk.write_bytes(b"<script>document.title='pwned'</script> is not a zstd frame")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The hostile store's report (written by ``ckpt report``) and that command's stderr."""
    folder = tmp_path_factory.mktemp("hostile")
    store = _hostile_store(folder / f"{IMG}.zarr")
    out = folder / "report.html"
    result = run_ckpt("report", str(store), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return out, result.stderr


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "table", "tr", "th", "td", "img"}
PAGE_TAGS |= {"p", "pre", "code", "ul", "li", "a", "hr", "input", "span", "figure", "script"}
"""Every element a report is made of."""


def _tags(page: str) -> list[tuple[str, list[str]]]:
    """Each element of ``page``, parsed as a browser would: its tag and its attributes' names."""
    from html.parser import HTMLParser

    found: list[tuple[str, list[str]]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, [name for name, _ in attrs]))

    Parser().feed(page)
    return found


def _title(page: Path) -> str:
    from tests.browser import open_report

    return open_report(page, page.with_suffix(".png")).title


def test_a_comparison_failure_naming_a_hostile_analysis_is_escaped(report: tuple[Path, str]) -> None:
    """Finding 3: the damaged chunk's error names the analysis ``<img onerror>``; the line shows it as text."""
    out, stderr = report
    page = out.read_text(encoding="utf-8")
    (line,) = (line for line in page.splitlines() if "clusters: comparison failed (" in line)
    assert "&lt;img src=x onerror=&quot;document.title=`pwned`&quot;&gt;" in line, line
    assert IMG not in page, "the analysis name reaches the page as markup"
    assert _title(out) != MARKER
    assert "Warning: clusters: comparison failed (" in stderr, "printed, as every problem the page shows"


def test_every_store_text_in_the_report_is_escaped_and_no_script_runs(report: tuple[Path, str]) -> None:
    """Item 4: no payload reaches the page as markup, and none runs in a real browser."""
    out, _ = report
    page = out.read_text(encoding="utf-8")
    for payload in (IMG, SCRIPT, "<script>document"):
        assert payload not in page, f"{payload!r} is in the page unescaped"
    tags = _tags(page)
    assert not [(tag, name) for tag, names in tags for name in names if name.startswith("on")], "event handlers"
    assert {tag for tag, _ in tags} <= PAGE_TAGS, "only the elements ckpt writes"
    assert page.count("<script") == 0, "a store without embeddings has no slider: no script at all"
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page, "the texts are shown"
    assert _title(out) != MARKER


def test_the_page_forbids_inline_script_it_did_not_write(report: tuple[Path, str], tmp_path: Path) -> None:
    """A future missed escape cannot run: a payload injected into a copy of the page is blocked by its policy.

    The same injection into a copy without the policy runs (the check can fail), and the page's own
    styling still applies (the policy names its stylesheet).
    """
    from playwright.sync_api import sync_playwright

    from tests.browser import chromium

    out, _ = report
    page = out.read_text(encoding="utf-8")
    (policy,) = re.findall(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert page.index("Content-Security-Policy") < page.index("<title>"), "the policy precedes every store text"
    injected = tmp_path / "injected.html"
    injected.write_text(page.replace("<body>", f"<body>{INJECTED}", 1), encoding="utf-8")
    control = tmp_path / "control.html"
    control.write_text(re.sub(r"<meta http-equiv=[^>]*>", "", injected.read_text()), encoding="utf-8")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            seen = {}
            for file in (injected, control):
                tab = browser.new_page()
                tab.goto(file.resolve().as_uri(), wait_until="load")
                tab.wait_for_timeout(200)  # an onerror of an image that failed to load
                seen[file.name] = (tab.title(), tab.evaluate("getComputedStyle(document.body).maxWidth"))
        finally:
            browser.close()
    assert seen["control.html"][0] == MARKER, "without the policy the injection runs: the check is real"
    assert seen["injected.html"][0] != MARKER, "the policy blocks inline script it does not name"
    assert seen["injected.html"][1] == "1300px", "the page's own stylesheet is allowed"


def _embedding_store(folder: Path) -> Path:
    """A store with a token embedding (so the report has its slider), under a name that is not UTF-8."""
    plain = folder / "embeddings.zarr"
    rng = np.random.default_rng(0)
    with ckptstore.create(plain) as writer:
        for step in range(4):
            weights = rng.normal(size=(7, 2)).astype(np.float32)
            writer.write(step, {"embed.weight": weights}, metrics={"loss": 1.0 / (step + 1)})
    hostile = Path(os.fsdecode(bytes(folder) + b"/run-\xff.zarr"))  # the folder as `ls` would show it
    plain.rename(hostile)
    return hostile


def test_a_store_folder_whose_name_is_not_utf8_is_reported(tmp_path: Path) -> None:
    """Finding 12: the name's undecodable byte is shown replaced, in the figures' titles and the page.

    The page keeps working under its policy: figures load and the slider moves (its script is allowed).
    """
    from tests.browser import open_report

    store = _embedding_store(tmp_path)
    out = tmp_path / "report.html"
    result = run_ckpt("report", str(store), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and result.stderr == "", result.stderr
    page = out.read_text(encoding="utf-8")
    assert "<h1>ckpt report: run-\ufffd.zarr</h1>" in page
    seen = open_report(out, tmp_path / "report.png")
    assert seen.console_errors == []
    assert seen.images and all(image["loaded"] for image in seen.images), seen.images
    assert seen.slider_steps == ["step 0", "step 3"] and seen.slider_frames[0] != seen.slider_frames[1]
    animated = invoke_ckpt("animate", str(store), "--out", str(tmp_path / "run.gif"), "--frames", "2")
    assert animated.returncode == 0, animated.stderr

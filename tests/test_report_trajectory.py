"""The report's trajectory section (issue 69, item 5): distances and turns drawn, planted faults named.

A real store from a real (tiny) training run, with three planted faults: a checkpoint of early
weights under a late step (possibly mislabeled), a step serving the final checkpoint's weights, and
a step holding one tensor of the final checkpoint. ``ckpt report`` writes the page (its own
process), a real headless Chromium opens it (tests/browser.py), and the figure's PNG is decoded.
"""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import ckpt
from ckpt.analyzers.figures.report import POLICY
from tests.helpers import invoke_ckpt
from tests.test_trajectory import train, write

STEPS = [0, 1, 2, 4, 8, *range(12, 120, 6)]
"""Log-spaced early, then every 6 steps, as Pythia's suites are saved (0, 1, 2, 4, ..., then every 1000)."""
FINAL = STEPS[-1]
MISLABELED = 30
IDENTICAL_TO_FINAL = 60
SHARD_OF_FINAL = 90


def planted_store(path: Path) -> Path:
    """The run with its three planted faults (module docstring)."""
    states = train(120)
    chosen = {step: states[step] for step in STEPS}
    chosen[MISLABELED] = states[5]  # weights from early on, stored under no other step
    chosen[IDENTICAL_TO_FINAL] = chosen[FINAL]
    chosen[SHARD_OF_FINAL] = {**states[SHARD_OF_FINAL], "hidden.weight": chosen[FINAL]["hidden.weight"]}
    return write(path, chosen)


def report_of(store: Path, out: Path, *options: str) -> tuple[str, list[str]]:
    """The page ``ckpt report`` wrote, and its ``Warning:`` lines (nothing else may reach stderr)."""
    done = invoke_ckpt("report", str(store), "--out", str(out), *options)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == len(done.stderr.splitlines()), done.stderr
    return out.read_text(encoding="utf-8"), warnings


def section(page: str) -> str:
    """The trajectory section's markup: from its heading to the next one."""
    start = page.index('<h2 id="trajectory">')
    return page[start : page.index("<h2", start + 1)]


def findings(page: str) -> dict[str, str]:
    """The table under the trajectory figure as a browser reads it: {"step 30": "possibly mislabeled ..."}."""
    rows: list[list[str]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "tr":
                rows.append([])
            elif tag in ("th", "td"):
                rows[-1].append("")

        def handle_data(self, data: str) -> None:
            if rows and rows[-1]:
                rows[-1][-1] += data

    Parser(convert_charrefs=True).feed(section(page))
    return {key: value.strip() for key, value in rows}


def decoded(page: str, alt: str) -> np.ndarray:
    """The RGB pixels of the page's image with this alt text, decoded from its data URI."""
    from PIL import Image

    (data,) = re.findall(rf'<img alt="{re.escape(alt)}" src="data:image/png;base64,([^"]+)">', page)
    with Image.open(io.BytesIO(base64.b64decode(data))) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def pixels_of(image: np.ndarray, color: str) -> int:
    """Pixels within a few levels of ``color`` (``#rrggbb``)."""
    rgb = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(image.astype(int) - rgb).max(axis=-1) < 24).sum())


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted_store(tmp_path_factory.mktemp("trajectory") / "run.zarr")


@pytest.mark.slow  # ckpt processes (and a browser)
def test_the_section_draws_the_trajectory_and_names_the_planted_checkpoints(store: Path, tmp_path: Path) -> None:
    from tests.browser import open_report

    page, warnings = report_of(store, tmp_path / "report.html")
    assert warnings == [], "nothing failed to draw"
    shown = section(page)
    assert f"{len(STEPS)} checkpoints x 5 floating-point tensors, each read once" in shown
    found = findings(page)
    assert set(found) == {f"step {s}" for s in (MISLABELED, IDENTICAL_TO_FINAL, SHARD_OF_FINAL, FINAL)}, found
    assert found[f"step {MISLABELED}"].startswith("possibly mislabeled (> 2x): ")
    assert found[f"step {IDENTICAL_TO_FINAL}"].startswith(f"identical to the final checkpoint (step {FINAL})")
    assert found[f"step {SHARD_OF_FINAL}"] == (
        f"1 of 4 tensors that change along the run identical to the final checkpoint (step {FINAL}) ('hidden.weight')"
    )
    assert found[f"step {FINAL}"] == f"identical to step {IDENTICAL_TO_FINAL}"
    assert "&#x27;hidden.weight&#x27;" in shown, "tensor names are escaped text, like every store text"
    # a real figure: three panels at 11 x 7.8 in and 80 dpi, not blank, with both kinds of marks drawn
    image = decoded(page, "trajectory distances")
    assert image.shape == (624, 880, 3)
    assert image.std() > 20 and len(np.unique(image.reshape(-1, 3), axis=0)) > 100
    assert pixels_of(image, "#d62728") > 400, "possibly mislabeled steps are marked in red"
    assert pixels_of(image, "#ff7f0e") > 400, "duplicated steps are marked in orange"
    # the browser: every image loads, no console or policy error, the policy and scripts as before
    seen = open_report(tmp_path / "report.html", tmp_path / "report.png")
    assert seen.console_errors == []
    (figure,) = (i for i in seen.images if i["alt"] == "trajectory distances")
    assert figure["loaded"] and figure["width"] == 880
    assert all(i["loaded"] for i in seen.images), seen.images
    assert f'content="{POLICY}"' in page and "<script" not in shown


@pytest.mark.slow  # ckpt processes (and a browser)
def test_no_trajectory_skips_the_distances_and_still_names_duplicates_without_reads(
    store: Path, tmp_path: Path
) -> None:
    """--no-trajectory reads no tensor: with every checkpoint chunk gone, the record still names the duplicates."""
    import shutil

    from tests.browser import open_report

    bare = tmp_path / "bare.zarr"
    shutil.copytree(store, bare)
    for chunk in (bare / "checkpoints").glob("*/c*"):
        if chunk.parent.name != "step":
            chunk.unlink()
    page, warnings = report_of(bare, tmp_path / "report.html", "--no-trajectory")
    assert not [w for w in warnings if w.startswith("Warning: trajectory")], warnings
    shown = section(page)
    assert "Distances not computed (<code>--no-trajectory</code>" in shown
    assert "trajectory distances" not in page, "no distance figure"
    found = findings(page)
    assert set(found) == {f"step {s}" for s in (IDENTICAL_TO_FINAL, SHARD_OF_FINAL, FINAL)}, found
    assert found[f"step {IDENTICAL_TO_FINAL}"] == f"identical to the final checkpoint (step {FINAL})"
    seen = open_report(tmp_path / "report.html", tmp_path / "report.png")
    assert seen.console_errors == []


@pytest.mark.slow  # ckpt processes (and a browser)
def test_an_unreadable_tensor_is_shown_in_the_page_not_a_crash(store: Path, tmp_path: Path) -> None:
    import shutil

    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(store, damaged)
    index = STEPS.index(48)
    (chunk,) = (damaged / "checkpoints" / "hidden.weight").glob(f"c.{index}.*")
    chunk.write_bytes(chunk.read_bytes()[:-8] + bytes(8))  # fails its checksum
    page, warnings = report_of(damaged, tmp_path / "report.html")
    (line,) = [w for w in warnings if w.startswith("Warning: trajectory")]
    assert line.startswith("Warning: trajectory: 1 unreadable tensor(s), their distances not drawn: ")
    assert "tensor 'hidden.weight' at step 48" in line, line
    shown = section(page)
    assert '<p class="error">trajectory: 1 unreadable tensor(s)' in shown
    assert decoded(page, "trajectory distances").std() > 20, "the other steps are still drawn"
    assert f"step {MISLABELED}" in findings(page), "and still checked"


@pytest.mark.slow  # ckpt processes (and a browser)
def test_a_store_of_one_checkpoint_gets_a_note(tmp_path: Path) -> None:
    path = write(tmp_path / "one.zarr", {7: train(1)[0]})
    assert len(ckpt.open(path).steps) == 1
    page, warnings = report_of(path, tmp_path / "report.html")
    assert warnings == []
    assert "<p>The store holds one checkpoint (step 7): no trajectory to draw.</p>" in section(page)
    assert "trajectory distances" not in page


PYTHIA_STEPS = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]
"""The 154 steps of every Pythia suite."""


def test_pythia_steps_are_drawn_on_a_symlog_axis_and_even_steps_on_a_linear_one() -> None:
    """Pythia's are not log-spaced all along (143 of 154 gaps are 1000), but its first ten would overlap at 0."""
    from ckpt.analyzers.figures import log_spaced
    from ckpt.analyzers.figures.trajectory import figure
    from ckpt.store.trajectory import Duplicates, Trajectory

    def drawn(steps: list[int]) -> set[str]:
        n = len(steps)
        distance = np.r_[np.nan, 1.0 / np.arange(1, n)]
        path = Trajectory(np.array(steps), distance, np.full(n, 0.5), np.full(n, 1.5), ["w"])
        return {axes.get_xscale() for axes in figure(path, Duplicates(final=steps[-1])).axes}

    assert not log_spaced(PYTHIA_STEPS)
    assert drawn(PYTHIA_STEPS) == {"symlog"}
    assert drawn(list(range(0, 143001, 1000))) == {"linear"}

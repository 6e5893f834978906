"""``ckpt report``'s development page: loss, LLC, Hessian trace and essential dynamics on one step axis.

Real stores (the example MLP run), the real analyzers through the engine, the real report. The
figure's lines are compared with the stored values they draw; the page names what is missing and
how to make it, marks a stale result, and escapes every text from the store.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers.figures import development
from ckpt.analyzers.figures.report import is_stale, write_report
from ckpt.engine.pipeline import data_hash, model_hash, run
from ckpt.plugins import load_registry
from ckpt.plugins.examples import EXAMPLE_FACTORY, mlp, write_example_run
from tests.browser import chromium, open_report
from tests.helpers import set_provenance

TINY = {
    "loss": {},
    "llc": {"chains": 2, "draws": 10, "batch_size": 16, "epsilon": 1e-4, "warn": False},  # tiny chains: flagged
    "spectrum": {"samples": 16, "probes": 6, "slq_runs": 1, "slq_steps": 4},
    # the example run turns by a few degrees a step: a low threshold gives it turning points
    "essential-dynamics": {"samples": 16, "turn_angle": 3.0, "smoothing": 0.0},
}
IMG = '<img src=x onerror="document.title=`pwned`">'


def _section(page: str) -> str:
    """The development section of a report's HTML."""
    start = page.index('<h2 id="development">')
    return page[start : page.index("<h2", start + 1)]


def _gathered(path: Path) -> development.Development:
    store = ckptstore.open(path)
    registry = load_registry()
    current = (data_hash(store), model_hash(store))
    readable = {name: store.analysis(name) for name in store.analyses}
    return development.gather(store, readable, lambda result: is_stale(store, result, registry, current))


@pytest.fixture(scope="module")
def only_loss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_example_run(tmp_path_factory.mktemp("loss") / "run.zarr", steps=6, examples=24)
    run("loss", path, progress=False)
    return path


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All four analyzers on an 8-checkpoint run; ``llc`` stale (its provenance names another model)."""
    path = write_example_run(tmp_path_factory.mktemp("all") / "run.zarr", steps=8, examples=24)
    for name, options in TINY.items():
        run(name, path, progress=False, **options)
    set_provenance(path, "llc", {"model_sha256": "0" * 64})
    return path


def test_a_store_holding_only_loss_names_what_is_missing_and_how_to_make_it(only_loss: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert write_report(str(only_loss), str(out), load_registry(), trajectory=False) == []
    section = _section(out.read_text())
    assert '<img alt="development"' in section
    for name in ("llc", "spectrum", "essential-dynamics"):
        command = rf"<code>ckpt analyze {name} \S+run\.zarr</code>"
        assert re.search(rf'<span class="missing">missing</span>: {command}', section)
    assert "ckpt analyze loss" not in section and "result <code>loss</code>, 6 checkpoints" in section
    assert "stale" not in section

    found = _gathered(only_loss)
    drawn = development.figure(found)
    assert drawn is not None and len(drawn.axes) == 1 and list(found.panels) == ["loss"]
    (line,) = drawn.axes[0].get_lines()
    mean = ckptstore.open(only_loss).analysis("loss")["mean_loss"].values
    np.testing.assert_array_equal(line.get_xdata(), np.arange(6))
    np.testing.assert_allclose(line.get_ydata(), mean)


def test_every_panel_shares_the_step_axis_and_draws_the_stored_values(analyzed: Path) -> None:
    found = _gathered(analyzed)
    assert list(found.panels) == list(development.SOURCES)
    drawn = development.figure(found)
    assert drawn is not None
    axes = drawn.axes
    assert len(axes) == 4 and all(axes[0].get_shared_x_axes().joined(axes[0], a) for a in axes[1:])
    assert [a.get_xlabel() for a in axes] == ["", "", "", "training step"]
    assert not any(label.get_visible() for label in axes[0].get_xticklabels())

    store = ckptstore.open(analyzed)
    llc, spectrum, path = (store.analysis(n) for n in ("llc", "spectrum", "essential-dynamics"))
    turning = llc["step"].values[path["turning_point"].values]
    assert turning.size and list(found.boundaries) == list(turning)
    for panel in axes:  # a dashed boundary at each turning point, in every panel
        vertical = [line.get_xdata()[0] for line in panel.get_lines() if line.get_linestyle() == "--"]
        assert vertical == list(turning)
    drawn_with_spread = ((axes[1], llc, "llc", "llc_std"), (axes[2], spectrum, "trace", "trace_stderr"))
    for panel, stored, value, spread in drawn_with_spread:
        centre = stored[value].values
        assert np.isfinite(centre).all()
        np.testing.assert_allclose(panel.get_lines()[0].get_ydata(), centre)
        (band,) = panel.collections
        edge = band.get_paths()[0].vertices[:, 1]
        np.testing.assert_allclose(
            [edge.min(), edge.max()],
            [(centre - stored[spread].values).min(), (centre + stored[spread].values).max()],
        )
    projection = path["projection"].values
    for k, line in enumerate(axes[3].get_lines()[:2]):
        np.testing.assert_allclose(line.get_ydata(), projection[:, k])
        assert line.get_label().startswith(f"PC{k + 1} (")
    assert "(stale)" in axes[1].get_lines()[0].get_label()
    assert not any("(stale)" in line.get_label() for a in (axes[0], axes[2], axes[3]) for line in a.get_lines())


def test_the_page_marks_the_stale_result_and_opens_in_a_browser(analyzed: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_report(str(analyzed), str(out), load_registry(), trajectory=False)
    section = _section(out.read_text())
    items = dict(re.findall(r"<li>([^:]+): (.*?)</li>", section))
    assert '<span class="stale">stale:' in items["local learning coefficient λ̂ ± its spread over chains"]
    assert sum('class="stale"' in item for item in items.values()) == 1
    assert "the chains&#x27; diagnostics flag" in items["local learning coefficient λ̂ ± its spread over chains"]
    assert "missing" not in section
    turning = ckptstore.open(analyzed).analysis("essential-dynamics")["turning_point"].values
    assert f"{int(turning.sum())} turning point(s) at steps" in section
    chromium()
    seen = open_report(out, tmp_path / "page.png")
    shown = {image["alt"]: image for image in seen.images}
    assert shown["development"]["loaded"] and shown["development"]["width"] > 900
    assert seen.console_errors == []


def test_hostile_store_texts_are_escaped(tmp_path: Path) -> None:
    """A hostile store path, a hostile ``--as`` name and a hostile metric name reach the page only as text."""
    import torch

    path = tmp_path / f"{IMG}.zarr"
    torch.manual_seed(0)
    model = mlp()
    inputs, targets = torch.randn(16, 3), torch.randint(0, 4, (16,))
    with ckptstore.create(path, model=EXAMPLE_FACTORY, objective="cross-entropy") as writer:
        writer.add_data("eval", inputs=inputs, targets=targets)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(4):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            writer.write(step, model, metrics={f"{IMG}loss": float(loss.detach())})
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    run("llc", path, progress=False, save_as=IMG, **TINY["llc"])
    out = tmp_path / "report.html"
    write_report(str(path), str(out), load_registry(), trajectory=False)
    section = _section(out.read_text())
    assert "<img src=x" not in section and "<script" not in section
    escaped = "&lt;img src=x onerror=&quot;document.title=`pwned`&quot;&gt;"
    assert f"result <code>{escaped}</code>" in section  # the --as name
    assert f"training metrics <code>{escaped}loss</code>" in section
    assert f"{escaped}.zarr" in section  # the store's path, in each command


def test_the_commands_of_the_development_guide_exist_with_their_options() -> None:
    """Every ``ckpt`` line of docs/development.md names a command whose ``--help`` lists each option it uses."""
    import shlex

    from tests.helpers import invoke_ckpt

    guide = (Path(__file__).resolve().parents[1] / "docs" / "development.md").read_text()
    lines = [line for block in re.findall(r"```bash\n(.+?)```", guide, flags=re.S) for line in block.splitlines()]
    assert any(line.startswith("ckpt analyze llc") for line in lines)
    for line in lines:
        words = shlex.split(line)
        command = [w for w in words[1:3] if not w.startswith("-") and "." not in w]
        shown = invoke_ckpt(*command, "--help")
        assert shown.returncode == 0, (line, shown.stderr)
        for option in (w for w in words if w.startswith("--")):
            assert option in shown.stdout, f"{line}: {option} is not an option of ckpt {' '.join(command)}"


def test_a_result_of_one_split_stays_current_when_another_split_is_added(only_loss: Path, tmp_path: Path) -> None:
    """Staleness compares the splits the analyzer reads (as reuse does), not every split of the store."""
    import shutil

    from tests.helpers import invoke_ckpt

    path = tmp_path / "run.zarr"
    shutil.copytree(only_loss, path)
    np.save(tmp_path / "x.npy", np.zeros((5, 3), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(5, np.int64))
    arrays = ("--inputs", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"))
    added = invoke_ckpt("data", "add", str(path), "probe", *arrays)
    assert added.returncode == 0, added.stderr
    again = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert "computed 0 step(s), reused 6 stored" in again.stdout, again.stdout
    out = tmp_path / "report.html"
    write_report(str(path), str(out), load_registry(), trajectory=False)
    assert 'class="stale"' not in out.read_text()

"""A result's provenance is data: of the wrong type, or naming another analyzer than its name holds, it is one
``Error:`` line in ``ckpt show`` and ``ckpt plot`` and one warning in ``ckpt report`` (issue 68, finding 9).

Each case edits a stored result's ``attrs["ckpt"]`` as an attacker would (in the result's
``zarr.json`` and in the commit record); the store is never changed by the commands that read it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, set_provenance, tree_digest

pytestmark = pytest.mark.slow  # a few ckpt processes per hostile record

CASES = {
    "options not an object": ("loss", {"options": 5}, "options is 5, expected an object"),
    "analyzer a list": ("loss", {"analyzer": ["x"]}, "analyzer is ['x'], expected a name"),
    "another analyzer's name": ("loss", {"analyzer": "polca"}, "holds a result of analyzer 'polca'"),
    "version a number": ("loss", {"version": 7}, "version is 7, expected a string"),
    "requires a string": ("loss", {"requires": "polca"}, "requires is 'polca', expected an object"),
    "option names not strings": ("loss", {"options": {"": 1, "x": {"y": 2}}}, "expected an object"),
    "created an object": ("loss", {"created": {"at": 1}}, "created is {'at': 1}, expected a string"),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small run with ``loss`` and a second loss result kept as ``mine``."""
    path = tmp_path_factory.mktemp("provenance") / "run.zarr"
    write_example_run(path, steps=3, examples=8)
    run("loss", path, progress=False)
    run("loss", path, save_as="mine", progress=False)
    return path


def _one_error_line(result: object, expected: str) -> str:
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.returncode == 1, stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_provenance_of_the_wrong_type_is_one_error_line(base: Path, tmp_path: Path, case: str) -> None:
    name, fields, expected = CASES[case]
    store = tmp_path / "run.zarr"
    shutil.copytree(base, store)
    set_provenance(store, name, fields)
    before = tree_digest(store)
    line = _one_error_line(run_ckpt("show", str(store), name), expected)
    assert f"analysis {name!r}" in line, "names the result"
    _one_error_line(run_ckpt("plot", str(store), name, "--out", str(tmp_path / "loss.png")), expected)
    out = tmp_path / "report.html"
    reported = run_ckpt("report", str(store), "--out", str(out))
    assert reported.returncode == 0 and "Traceback" not in reported.stderr, reported.stderr
    warnings = [line for line in reported.stderr.splitlines() if expected in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"Warning: {name}: "), reported.stderr
    assert expected.replace("'", "&#x27;") in out.read_text(encoding="utf-8"), "the page names the problem too"
    assert tree_digest(store) == before, "reading never changes the store"


def test_a_summary_that_fails_on_what_the_result_holds_is_one_error_line(base: Path, tmp_path: Path) -> None:
    """``mine`` holds loss values but claims polca: polca's own summary cannot read it; `show` says so in one line."""
    store = tmp_path / "run.zarr"
    shutil.copytree(base, store)
    set_provenance(store, "mine", {"analyzer": "polca", "options": {}})
    line = _one_error_line(run_ckpt("show", str(store), "mine"), "the polca summary of analysis 'mine' failed")
    assert "KeyError" in line and "recompute it" in line, line


@pytest.mark.parametrize("steps", [[-1], [0, 0, 0], [2, 1, 0], [0, 1, 2, 3, 4]], ids=str)
def test_a_result_whose_provenance_claims_other_steps_is_computed_anew(
    base: Path, tmp_path: Path, steps: list[int]
) -> None:
    """Found by the store fuzzer: duplicated or unknown claimed steps ended ``ckpt analyze`` in a pandas
    traceback, and a claim of more steps than held was reused as if computed."""
    store = tmp_path / "run.zarr"
    shutil.copytree(base, store)
    set_provenance(store, "loss", {"steps": steps})
    result = run_ckpt("analyze", "loss", str(store), "--no-progress")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert f"where its provenance claims {steps}: it is computed anew" in result.stderr, result.stderr
    assert "computed 3 step(s), reused 0 stored" in result.stdout, result.stdout
    assert invoke_ckpt("verify", str(store)).returncode == 0
    fresh, stored = ckptstore.open(base).analysis("loss"), ckptstore.open(store).analysis("loss")
    assert stored.ckpt.steps == [0, 1, 2]
    assert (fresh["loss"].values == stored["loss"].values).all()


def test_verify_accepts_a_per_run_result_that_holds_some_of_its_steps(tmp_path: Path) -> None:
    """``lca`` is computed from every checkpoint and holds one row per pair: verify used to call it damaged."""
    store = write_example_run(tmp_path / "run.zarr", steps=3, examples=8)
    result = run("lca", store, progress=False).dataset
    assert result is not None and [int(s) for s in result["step"].values] == [0, 1]
    assert result.ckpt.steps == [0, 1, 2]
    verified = invoke_ckpt("verify", str(store))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = run("lca", store, progress=False)
    assert again.computed_steps == [], "and the engine reuses it"

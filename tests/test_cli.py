"""The real ``ckpt`` command: outputs, and one ``Error:`` line for every user mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckpt.plugins
import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest


def _assert_one_line_error(result, expected: str, code: int = 1) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_version_and_help() -> None:
    version = invoke_ckpt("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"ckpt {ckptstore.__version__}"
    helped = invoke_ckpt("--help")
    assert helped.returncode == 0
    for command in ("info", "import", "verify", "repair"):
        assert command in helped.stdout


def test_a_command_run_in_process_answers_as_the_console_script_does(small_store: Path, tmp_path: Path) -> None:
    """``invoke_ckpt`` (most tests) and ``run_ckpt`` (tests of the process): same exit status, stdout and stderr."""
    for args in (
        ("info", str(small_store)),
        ("verify", str(small_store)),
        ("info", str(tmp_path / "nope.zarr")),
        ("info", str(small_store), "--bogus"),
        ("--version",),
    ):
        here, there = invoke_ckpt(*args), run_ckpt(*args)
        assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr), args
    assert invoke_ckpt("info", str(tmp_path / "nope.zarr")).returncode == 1  # not click's default exit status


def test_no_help_shows_raw_rst_markup() -> None:
    """Click prints docstrings as they are: ``double backticks`` would reach the user as such."""
    from click.testing import CliRunner

    from ckpt.cli.main import cli

    runner = CliRunner()
    for name in cli.commands:
        helped = runner.invoke(cli, [name, "--help"])
        assert helped.exit_code == 0, name
        assert "``" not in helped.output, f"ckpt {name} --help: {helped.output}"
    for name in ckpt.plugins.manager.registry().analyzers:
        helped = runner.invoke(cli, ["analyze", name, "--help"])
        assert helped.exit_code == 0 and "``" not in helped.output, f"ckpt analyze {name} --help: {helped.output}"


def test_info_shows_metadata_tensors_and_data(small_store: Path) -> None:
    result = invoke_ckpt("info", str(small_store))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "checkpoints  3 (steps 0 .. 20)" in out
    assert 'tests.models:tiny  {"d": 4}' in out
    assert "block.0.fc.bias" in out
    assert "(8,)" in out
    assert "float16" in out
    assert "eval: 6 examples, 6 datapoints, labels: parity" in out
    summary = json.loads(invoke_ckpt("info", str(small_store), "--json").stdout)
    assert summary["checkpoints"] == {"count": 3, "first": 0, "last": 20}
    assert summary["parameters"] == 10 * 4 + 8 * 4 + 8 + 1
    assert {t["name"]: t["bytes"] for t in summary["tensors"]}["block.0.fc.bias"] == 16


def test_verify_passes_on_a_good_store(small_store: Path) -> None:
    result = invoke_ckpt("verify", str(small_store))
    assert result.returncode == 0, result.stderr
    assert "3 checkpoints x 4 tensors, 1 data splits, the metrics and 0 analyses OK" in result.stdout


@pytest.mark.parametrize("command", ["info", "verify", "repair"])
def test_missing_path(tmp_path: Path, command: str) -> None:
    result = run_ckpt(command, str(tmp_path / "nope.zarr"))
    _assert_one_line_error(result, f"no store at {tmp_path / 'nope.zarr'}: the path does not exist")


@pytest.mark.parametrize("command", ["info", "verify", "repair"])
def test_not_a_store(tmp_path: Path, command: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("hello")
    before = tree_digest(tmp_path / "folder")
    result = run_ckpt(command, str(tmp_path / "folder"))
    _assert_one_line_error(result, "is not a ckpt store")
    assert tree_digest(tmp_path / "folder") == before


def test_bad_option_and_missing_argument(small_store: Path) -> None:
    before = tree_digest(small_store)
    _assert_one_line_error(run_ckpt("info", str(small_store), "--bogus"), "No such option '--bogus'", code=2)
    _assert_one_line_error(run_ckpt("info"), "Missing argument 'STORE'", code=2)
    _assert_one_line_error(run_ckpt("info", str(small_store), "--tensors", "many"), "expected a number or 'all'", 2)
    _assert_one_line_error(run_ckpt("frobnicate"), "No such command 'frobnicate'", code=2)
    assert tree_digest(small_store) == before


def _torch_run(folder: Path, steps: list[int]) -> None:
    folder.mkdir()
    for step in steps:
        torch.manual_seed(step)
        torch.save(torch.nn.Linear(3, 2).state_dict(), folder / f"step_{step}.pt")


def test_import_then_info(tmp_path: Path) -> None:
    _torch_run(tmp_path / "run", [0, 100, 200])
    result = invoke_ckpt(
        "import", str(tmp_path / "run"), str(tmp_path / "run.zarr"), "--model", "m.models:mlp", "--config", '{"h": 2}'
    )
    assert result.returncode == 0, result.stderr
    assert "imported 3 torch checkpoints (steps 0 .. 200), 2 tensors each" in result.stdout
    store = ckptstore.open(tmp_path / "run.zarr")
    assert store.steps.tolist() == [0, 100, 200]
    assert store.model == ckptstore.ModelSpec("m.models:mlp", {"h": 2})
    torch.manual_seed(100)
    expected = torch.nn.Linear(3, 2).state_dict()
    loaded = store.tensors(100, framework="torch")
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())


def test_import_errors_leave_nothing_behind(tmp_path: Path) -> None:
    _torch_run(tmp_path / "run", [0, 1])
    dest = tmp_path / "out.zarr"
    _assert_one_line_error(
        run_ckpt("import", str(tmp_path / "run"), str(dest), "--format", "onnx"), "unknown format 'onnx'", 2
    )
    _assert_one_line_error(
        run_ckpt("import", str(tmp_path / "run"), str(dest), "--config", "{bad json"), "not valid JSON", 2
    )
    _assert_one_line_error(run_ckpt("import", str(tmp_path / "missing"), str(dest)), "does not exist")
    (tmp_path / "empty").mkdir()
    _assert_one_line_error(run_ckpt("import", str(tmp_path / "empty"), str(dest)), "no checkpoints found")
    _assert_one_line_error(
        run_ckpt("import", str(tmp_path / "run"), str(dest), "--model", "no-colon"), "importable factory"
    )
    assert not dest.exists()


def test_import_refuses_an_existing_destination(tmp_path: Path, small_store: Path) -> None:
    _torch_run(tmp_path / "run", [0])
    before = tree_digest(small_store)
    _assert_one_line_error(run_ckpt("import", str(tmp_path / "run"), str(small_store)), "already exists")
    assert tree_digest(small_store) == before


def test_corrupt_chunk_through_the_cli(small_store: Path) -> None:
    chunk = small_store / "checkpoints" / "block.0.fc.weight" / "c.2.0.0"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0xFF
    chunk.write_bytes(bytes(data))
    before = tree_digest(small_store)
    result = run_ckpt("verify", str(small_store))
    _assert_one_line_error(result, "1 problem(s) in")
    assert result.stderr.strip().endswith("tensor 'block.0.fc.weight' at step 20")
    assert tree_digest(small_store) == before


def test_locked_store_through_the_cli(small_store: Path) -> None:
    with ckptstore.open(small_store, mode="a"):
        _assert_one_line_error(run_ckpt("repair", str(small_store)), "another process is writing to")

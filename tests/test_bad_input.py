"""Every user mistake: one ``Error:`` line, a non-zero exit, no traceback, and the store (and folder) as they were.

A table of bad invocations of the real ``ckpt`` command, each run on a fresh copy
of a real store; the rows for analyzer and task options are generated from what
the plugins declare, so a new bounded option gets its row.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from ckpt.plugins import load_registry
from ckpt.plugins.tasks import resolve_task
from ckpt.store.trust import TRUST_ENV
from tests.helpers import run_ckpt, write_analyzed_run

pytestmark = pytest.mark.slow  # one ckpt process per bad input: every command, every mistake

USAGE = 2  # click usage errors (bad option values, unknown names)
ERROR = 1  # everything else


def _below_minimum_rows() -> list[tuple[list[str], str, int]]:
    """One row per bounded option of every built-in analyzer and task: a value just below its minimum."""
    registry = load_registry(entry_points=False)
    commands = [(["analyze", name, "{store}"], cls) for name, cls in sorted(registry.analyzers.items())]
    commands += [
        (["train", name, "{tmp}/new.zarr"], resolve_task(task)) for name, task in sorted(registry.tasks.items())
    ]
    rows = []
    for command, owner in commands:
        for key, option in owner.option_spec().items():
            if option.minimum is None or option.choices:
                continue
            value = option.minimum - (1 if option.type is int else 0.5)
            rows.append(([*command, f"--{key.replace('_', '-')}={value}"], "is not in the range", USAGE))
    return rows


def _non_finite_rows() -> list[tuple[list[str], str, int]]:
    """One row per float option of every built-in analyzer: NaN passes every bound, so each is refused as such."""
    registry = load_registry(entry_points=False)
    rows = []
    for name, cls in sorted(registry.analyzers.items()):
        for key, option in cls.option_spec().items():
            if option.type is float and not option.choices:
                rows.append((["analyze", name, "{store}", f"--{key.replace('_', '-')}=nan"], "finite", ERROR))
    return rows


ROWS: list[tuple[list[str], str, int]] = [
    # the command line itself
    (["frobnicate"], "No such command 'frobnicate'", USAGE),
    (["analyze", "nope", "{store}"], "unknown analyzer 'nope'; registered analyzers:", USAGE),
    (["analyze", "nope", "{store}"], ", sparsity, spectrum (see `ckpt plugins`)", USAGE),
    (["analyze", "loss"], "Missing argument 'STORE...'", USAGE),
    (["analyze", "loss", "{store}", "--bogus"], "No such option '--bogus'", USAGE),
    (["analyze", "loss", "{store}", "--batch-size", "many"], "'many' is not a valid integer", USAGE),
    (["analyze", "loss", "{store}", "--scheduler", "magic"], "'magic' is not one of", USAGE),
    (["analyze", "loss", "{store}", "--workers", "0"], "0 is not in the range x>=1", USAGE),
    (["analyze", "loss", "{store}", "--block-steps", "0"], "0 is not in the range x>=1", USAGE),
    (["analyze", "clusters", "{store}", "--on", "weights"], "'weights' is not one of", USAGE),
    (["show", "{store}"], "Missing argument 'NAME'", USAGE),
    (["train", "nope", "{tmp}/new.zarr"], "unknown task 'nope'; registered tasks:", USAGE),
    (["train", "modular-addition", "{tmp}/new.zarr", "--steps", "0"], "0 is not in the range x>=1", USAGE),
    (["train", "modular-addition", "{tmp}/new.zarr", "--every", "0"], "0 is not in the range x>=1", USAGE),
    (["train", "modular-addition", "{tmp}/new.zarr", "--preset", "huge"], "'huge' is not one of", USAGE),
    (["import", "{tmp}/nowhere", "{tmp}/new.zarr", "--format", "tarball"], "unknown format 'tarball'", USAGE),
    # engine settings
    (["analyze", "loss", "{store}", "--device", "tpu"], "--device must be auto, cpu, cuda, cuda:N or mps", ERROR),
    (["analyze", "loss", "{store}", "--device", "cuda:x"], "--device must be auto, cpu, cuda, cuda:N or mps", ERROR),
    (["analyze", "loss", "{store}", "--address", "notaurl"], "--address must be a dask scheduler address", ERROR),
    (["analyze", "loss", "{store}", "--trust-factory", "rm -rf /"], "is not a module, a module:function or '*'", ERROR),
    (["analyze", "loss", "{store}", "--max-memory", "1e400"], "--max-memory must be a finite size", ERROR),
    (["analyze", "loss", "{store}", "--max-memory", "1e400GiB"], "--max-memory must be a finite size", ERROR),
    # options that size an allocation: bounded by what they size, before anything is allocated
    (["analyze", "hessian-basis", "{store}", "-k", "100000000000"], "more than the 68 parameters", ERROR),
    (["analyze", "random-basis", "{store}", "-k", "100000000000"], "more than the 68 parameters", ERROR),
    # stores that are not there, or not stores
    (["info", "{tmp}/nope.zarr"], "the path does not exist", ERROR),
    (["verify", "{tmp}/nope.zarr"], "the path does not exist", ERROR),
    (["repair", "{tmp}/nope.zarr"], "the path does not exist", ERROR),
    (["show", "{tmp}/nope.zarr", "loss"], "the path does not exist", ERROR),
    (["rm", "{tmp}/nope.zarr", "loss"], "the path does not exist", ERROR),
    (["analyze", "loss", "{tmp}/nope.zarr"], "the path does not exist", ERROR),
    (["info", "{tmp}/notes.txt"], "is a file, not a ckpt store", ERROR),
    (["repair", "{tmp}/notes.txt"], "is a file, not a ckpt store", ERROR),
    (["verify", "{tmp}/notes.txt"], "is a file, not a ckpt store", ERROR),
    (["analyze", "loss", "{tmp}/notes.txt"], "is a file, not a ckpt store", ERROR),
    (["info", "{tmp}/folder"], "is not a ckpt store (it has no zarr.json)", ERROR),
    (["repair", "{tmp}/folder"], "is not a ckpt store (it has no zarr.json)", ERROR),
    (["info", "foo://bucket/run.zarr"], "Protocol not known: foo", ERROR),
    (["analyze", "loss", "foo://bucket/run.zarr"], "Protocol not known: foo", ERROR),
    # results
    (["show", "{store}", "polca"], "no analysis 'polca' in", ERROR),
    (["rm", "{store}", "polca"], "no analysis 'polca' in", ERROR),
    (["rm", "{store}", "../checkpoints"], "contains '/'", ERROR),
    (["analyze", "clusters", "{store}", "--on", "loss", "--label", "colour"], "colour", ERROR),
    (["analyze", "loss", "{store}", "--split", "test"], "test", ERROR),
    # training
    (["train", "addition", "{tmp}/new.zarr", "--heads", "5"], "--heads (5) must divide --d-model (64)", ERROR),
    (["train", "modular-addition", "{tmp}/new.zarr", "--steps", "5", "--epochs", "1"], "not both", ERROR),
    (["train", "modular-addition", "{tmp}/new.zarr", "--device", "tpu"], "--device must be auto, cpu", ERROR),
    (["train", "modular-addition", "{store}"], "already exists; pass --resume", ERROR),
    (["train", "modular-addition", "{store}", "--resume"], "--resume continues a run with the same task", ERROR),
    (["train", "modular-addition", "{tmp}/nope.zarr", "--resume"], "the path does not exist", ERROR),
    (["demo", "{tmp}/demo", "--device", "tpu"], "--device must be auto, cpu", ERROR),
    (["demo", "{tmp}/notes.txt"], "cannot use", ERROR),
    (["demo", "{tmp}/demo", "--seeds", "4-2"], "expected 0 <= A <= B", USAGE),
    (["demo", "{tmp}/demo", "--seeds", "zero"], "expected A-B", USAGE),
    # importing
    (["import", "{tmp}/nowhere", "{tmp}/new.zarr"], "nowhere", ERROR),
    (["import", "{tmp}/folder", "{tmp}/new.zarr"], "no checkpoints found in", ERROR),
    (["verify", "foo://bucket/run.zarr"], "Protocol not known: foo", ERROR),
    *_below_minimum_rows(),
    *_non_finite_rows(),
]


def _digest(folder: Path) -> str:
    """One hash of every file (path and bytes) under ``folder``: equal hashes = nothing changed."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_analyzed_run(tmp_path_factory.mktemp("bad-input") / "run.zarr", examples=10)


def test_the_table_is_large_enough() -> None:
    assert len(ROWS) >= 100, len(ROWS)


@pytest.mark.parametrize(
    ("args", "expected", "code"), ROWS, ids=lambda row: " ".join(row) if isinstance(row, list) else None
)
def test_bad_invocation(tmp_path: Path, original: Path, args: list[str], expected: str, code: int) -> None:
    store = tmp_path / "run.zarr"
    shutil.copytree(original, store)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "keep.txt").write_text("a user's file")
    (tmp_path / "notes.txt").write_text("not a store")
    before = _digest(tmp_path)
    result = run_ckpt(*(a.format(store=store, tmp=tmp_path) for a in args), extra_env={TRUST_ENV: "tests"})
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert _digest(tmp_path) == before, "a failed command changed the store or the folder"

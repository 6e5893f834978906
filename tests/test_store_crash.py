"""Crash safety, concurrent readers and corruption, with real processes and real files."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import ckpt.store as ckptstore
from ckpt import errors
from tests.helpers import invoke_ckpt, make_tensors, run_ckpt, tree_digest
from tests.writer_process import checkpoint

pytestmark = pytest.mark.slow  # crash trials: every file write of a store killed

WRITER = Path(__file__).with_name("writer_process.py")


def _start_writer(path: Path, count: int, sleep: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), str(count), str(sleep)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _check_committed(path: Path) -> list[int]:
    """Every visible checkpoint holds exactly what was written at its step."""
    store = ckptstore.open(path)
    steps = store.steps.tolist()
    assert steps == list(range(len(steps))), "steps must be contiguous: none lost, none duplicated"
    for step in steps:
        loaded = store.tensors(step)
        for name, expected in checkpoint(step).items():
            np.testing.assert_array_equal(loaded[name], expected, err_msg=f"{name} at step {step}")
    np.testing.assert_array_equal(store.metrics["loss"].values, np.arange(len(steps), dtype=float))
    return steps


@pytest.mark.slow
def test_sigkill_at_random_points_never_loses_a_committed_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "run.zarr"
    rng = random.Random(1234)
    committed = 0
    kills_mid_write = 0
    for _trial in range(24):
        process = _start_writer(path, count=0, sleep=0.0)
        time.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        # plain xarray sees only committed checkpoints, even before any repair
        plain = xr.open_zarr(path, group="checkpoints")
        steps = _check_committed(path)
        assert plain["step"].values.tolist() == steps
        assert len(steps) >= committed, "a committed checkpoint disappeared"
        # data of the next step on disk but not committed: this kill interrupted a checkpoint
        row = len(steps)
        if any(next((path / "checkpoints" / name).glob(f"c.{row}*"), None) for name in checkpoint(0)):
            kills_mid_write += 1
        committed = len(steps)
    assert committed > 24, "the writer made too little progress for the trials to mean anything"
    # the next writer resumes cleanly after the last committed step, and a closed store is tidy
    process = _start_writer(path, count=2, sleep=0.0)
    assert process.wait(timeout=60) == 0
    assert _check_committed(path) == list(range(committed + 2))
    meta = json.loads((path / "checkpoints" / "big" / "zarr.json").read_text())
    assert meta["shape"][0] == committed + 2
    print(f"{committed} checkpoints committed over 24 kills, {kills_mid_write} kills inside a checkpoint's write")
    assert kills_mid_write >= 3, "too few kills landed inside a write for the test to prove anything"


def test_concurrent_reader_sees_only_committed_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "run.zarr"
    total = 15
    process = _start_writer(path, count=total, sleep=0.02)
    reader = ckptstore.open(path)
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reader.refresh()
        steps = reader.steps.tolist()
        seen.append(len(steps))
        if steps:  # the newest visible checkpoint is always complete
            newest = reader.tensors(steps[-1])
            np.testing.assert_array_equal(newest["big"], checkpoint(steps[-1])["big"])
        plain = xr.open_zarr(path, group="checkpoints")  # consistent sizes at every moment
        assert plain.sizes["step"] >= len(steps)
        if len(steps) == total and process.poll() is not None:
            break
    assert process.wait(timeout=60) == 0
    assert seen == sorted(seen), "a reader must never see checkpoints disappear"
    assert len(set(seen)) > 3, "the reader should have watched the run grow"
    assert _check_committed(path) == list(range(total))


def _flip_byte(chunk: Path, offset: int = 20) -> None:
    data = bytearray(chunk.read_bytes())
    data[offset] ^= 0x01
    chunk.write_bytes(bytes(data))


def test_flipped_byte_is_reported_not_returned(small_store: Path) -> None:
    _flip_byte(small_store / "checkpoints" / "embed.weight" / "c.1.0.0")  # step 10
    s = ckptstore.open(small_store)
    with pytest.raises(errors.CorruptChunkError, match=r"tensor 'embed.weight' at step 10.*crc32c checksum"):
        s.tensors(10)
    np.testing.assert_array_equal(s.tensors(20)["embed.weight"], make_tensors(20)["embed.weight"])
    with pytest.raises(errors.CorruptChunkError, match=r"tensor 'embed.weight' at step \[10\]"):
        s.checkpoints["embed.weight"].values  # noqa: B018 - the lazy view reports it too
    with pytest.raises(errors.CorruptChunkError, match=r"embed\.weight"):
        s.read_tensor("embed.weight")
    # plain zarr readers get an error too, never the wrong numbers
    with pytest.raises(ValueError, match="checksum"):
        xr.open_zarr(small_store, group="checkpoints")["embed.weight"].sel(step=10).values  # noqa: B018

    before = tree_digest(small_store)
    result = run_ckpt("verify", str(small_store))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: 1 problem(s) in {small_store}: tensor 'embed.weight' at step 10"
    )
    assert "Traceback" not in result.stderr
    assert tree_digest(small_store) == before


@pytest.mark.parametrize(
    ("damage", "why"),
    [(lambda data: data[:-9], "truncated"), (lambda data: data + b"\0" * 8, "extended"), (lambda data: b"", "emptied")],
)
def test_a_chunk_of_the_wrong_size_is_reported_not_returned(small_store: Path, damage, why: str) -> None:
    # Store.tensors reads a local store's chunk files itself; zarr names what it refuses
    chunk = small_store / "checkpoints" / "embed.weight" / "c.1.0.0"  # step 10
    chunk.write_bytes(damage(chunk.read_bytes()))
    s = ckptstore.open(small_store)
    with pytest.raises(errors.CorruptChunkError, match=r"tensor 'embed.weight' at step 10"):
        s.tensors(10, framework="torch")
    np.testing.assert_array_equal(s.tensors(20)["embed.weight"], make_tensors(20)["embed.weight"])


def test_crash_leftovers_are_repaired_on_append(small_store: Path) -> None:
    # what a writer killed after writing step 30's data but before its commit leaves behind
    import zarr

    array = zarr.open_array(small_store / "checkpoints" / "embed.weight", mode="r+")
    array.resize((4, 10, 4))
    array[3] = np.ones((10, 4), np.float32)
    assert (small_store / "checkpoints" / "embed.weight" / "c.3.0.0").exists()
    zarr.open_group(small_store / "data", mode="r+").create_group("half-written")
    assert ckptstore.open(small_store).steps.tolist() == [0, 10, 20]  # invisible to readers
    result = invoke_ckpt("repair", str(small_store))
    assert result.returncode == 0, result.stderr
    assert "  removed uncommitted data/half-written" in result.stdout.splitlines()
    assert not (small_store / "data" / "half-written").exists()
    assert not (small_store / "checkpoints" / "embed.weight" / "c.3.0.0").exists()
    assert json.loads((small_store / "checkpoints" / "embed.weight" / "zarr.json").read_text())["shape"][0] == 3
    with ckptstore.open(small_store, mode="a") as w:
        w.write(30, make_tensors(30))
    np.testing.assert_array_equal(
        ckptstore.open(small_store).tensors(30)["embed.weight"], make_tensors(30)["embed.weight"]
    )

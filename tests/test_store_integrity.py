"""Never a fill value for written data: missing, swapped and damaged pieces of a real store are named, not read.

Each test damages a real store on disk the way a user's file system or a careless
copy would (a chunk file deleted, a chunk copied from another step, the step array's
chunk lost, a data split's chunk lost) and checks that every read path and the
``ckpt`` command refuse it, naming what is wrong, where the code before format v2
returned zeros or -1 as values.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.errors import CorruptChunkError
from ckpt.plugins.testing import write_example_run
from tests.helpers import run_ckpt, tree_digest

LEGACY_STORE = Path(__file__).resolve().parent / "data" / "v0.1.0-modular-addition.zarr"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    path = write_example_run(tmp_path / "run.zarr", steps=4, examples=12)
    assert ckptstore.open(path).format_version == 2
    return path


def _chunk(store: Path, tensor: str, row: int) -> Path:
    (chunk,) = (store / "checkpoints" / tensor).glob(f"c.{row}.*")
    return chunk


def _every_read_refuses(store: Path, tensor: str, step: int) -> None:
    # a chunk of the wrong size is refused before it is read; a missing one or one in place, by its digest
    message = rf"tensor '{tensor}' at step {step} of .* (is not the tensor written there|cannot be read: its chunk)"
    with pytest.raises(CorruptChunkError, match=message):
        ckptstore.open(store).tensors(step)
    with pytest.raises(CorruptChunkError, match=message):
        ckptstore.open(store).read_tensor(tensor)
    with pytest.raises(CorruptChunkError, match=message):
        ckptstore.open(store).checkpoints[tensor].values  # noqa: B018 - the lazy path reads here
    other = next(s for s in ckptstore.open(store).steps if s != step)
    assert ckptstore.open(store).tensors(int(other))  # the rest of the store still reads


def test_a_missing_chunk_is_named_not_read_as_zeros(run: Path) -> None:
    _chunk(run, "0.weight", 2).unlink()
    _every_read_refuses(run, "0.weight", 2)
    verified = run_ckpt("verify", str(run))
    assert verified.returncode == 1
    assert "tensor '0.weight' at step 2" in verified.stderr and verified.stderr.startswith("Error: ")
    before = tree_digest(run)
    analyzed = run_ckpt("analyze", "loss", str(run), "--no-progress")
    assert analyzed.returncode == 1
    assert "tensor '0.weight' at step 2" in analyzed.stderr
    assert "loss" not in ckptstore.open(run).analyses or 2 not in ckptstore.open(run).analysis("loss").ckpt.steps
    assert {k: v for k, v in tree_digest(run).items() if not k.startswith("analyses/") and k != "zarr.json"} == {
        k: v for k, v in before.items() if not k.startswith("analyses/") and k != "zarr.json"
    }


def test_a_chunk_copied_from_another_step_is_named(run: Path) -> None:
    shutil.copy(_chunk(run, "2.bias", 3), _chunk(run, "2.bias", 1))  # intact bytes, valid crc32c, wrong step
    _every_read_refuses(run, "2.bias", 1)


def test_a_chunk_copied_from_another_tensor_of_the_same_shape_is_named(tmp_path: Path) -> None:
    path = tmp_path / "twins.zarr"
    with ckptstore.create(path) as writer:
        for step in range(2):
            writer.write(step, {"a": np.full(3, step, np.float32), "b": np.full(3, step + 5, np.float32)})
    shutil.copy(_chunk(path, "a", 1), _chunk(path, "b", 1))
    with pytest.raises(CorruptChunkError, match="tensor 'b' at step 1"):
        ckptstore.open(path).tensors(1)


def test_a_lost_step_chunk_is_named_not_read_as_minus_one(run: Path) -> None:
    for chunk in (run / "checkpoints" / "step" / "c").rglob("*"):
        chunk.unlink()
    with pytest.raises(CorruptChunkError, match=r"the step array of .* reads 4 steps \(-1..-1\) where 4 steps"):
        ckptstore.open(run)
    with pytest.raises(CorruptChunkError, match="the step array"):
        ckptstore.open(run, mode="a")
    shown = run_ckpt("info", str(run))
    assert shown.returncode == 1 and shown.stderr.startswith("Error: the step array of")


def test_a_lost_data_chunk_is_named_not_read_as_zero_targets(run: Path) -> None:
    for chunk in (run / "data" / "eval" / "targets" / "c").rglob("*"):
        chunk.unlink()
    with pytest.raises(CorruptChunkError, match=r"data split 'eval' of .* does not match the content hash"):
        ckptstore.open(run).data("eval")
    analyzed = run_ckpt("analyze", "loss", str(run), "--no-progress")
    assert analyzed.returncode == 1 and "data split 'eval'" in analyzed.stderr


def test_version_1_stores_read_and_stay_version_1(tmp_path: Path) -> None:
    """Stores written before digests read as before (nothing to check) and are appended to as v1."""
    path = tmp_path / "old.zarr"
    shutil.copytree(LEGACY_STORE, path)
    store = ckptstore.open(path)
    assert store.format_version == 1 and "digests" not in store.metadata
    first = store.tensors(0)
    with ckptstore.open(path, mode="a") as writer:
        writer.write(60, first)
    again = ckptstore.open(path)
    assert again.format_version == 1 and "digests" not in again.metadata
    np.testing.assert_array_equal(again.tensors(60)["out.weight"], first["out.weight"])


def test_digests_follow_the_tensor_order_across_reopened_writers(tmp_path: Path) -> None:
    path = tmp_path / "order.zarr"
    tensors = {"z": np.arange(3.0), "a": np.ones((2, 2)), "m": np.asarray(7, dtype=np.int64)}
    with ckptstore.create(path) as writer:
        writer.write(0, tensors)
    with ckptstore.open(path, mode="a") as writer:  # a new writer: its arrays are listed in another order
        writer.write(1, {k: v + 1 for k, v in tensors.items()})
    store = ckptstore.open(path)
    for step in (0, 1):
        read = store.tensors(step)
        np.testing.assert_array_equal(read["z"], tensors["z"] + step)
    assert sorted(store.metadata["digests"]) == ["0", "1"]


def test_a_lost_metrics_chunk_is_named_not_read_as_nan(run: Path) -> None:
    with ckptstore.open(run, mode="a") as writer:
        writer.log(10, {"loss": 0.5, "lr": 1e-3})
    for chunk in (run / "metrics" / "loss" / "c").rglob("*"):
        chunk.unlink()
    with pytest.raises(CorruptChunkError, match=r"metrics 'loss' of .* do not match the commit record"):
        ckptstore.open(run).metrics  # noqa: B018
    with pytest.raises(CorruptChunkError, match="metrics 'loss'"):
        ckptstore.open(run, mode="a")
    verified = run_ckpt("verify", str(run))
    assert verified.returncode == 1 and "metrics 'loss'" in verified.stderr

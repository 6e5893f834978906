"""Every bad input raises a CkptError subclass naming what was wrong, and leaves the store unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

import ckpt
import ckpt.store as ckptstore
from ckpt import errors
from tests.helpers import make_tensors, tree_digest


@pytest.fixture
def writer(small_store: Path):
    w = ckptstore.open(small_store, mode="a")
    yield w
    w.close()


def _unchanged(path: Path, action) -> Exception:
    before = tree_digest(path)
    with pytest.raises(errors.CkptError) as info:
        action()
    assert tree_digest(path) == before, "a rejected write changed the store"
    return info.value


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (20, "checkpoint step 20 is already committed; steps must strictly increase (last committed step: 20)"),
        (5, "checkpoint step 5 comes before the last committed step; steps must strictly increase"),
        (-1, "step must be a non-negative integer, got -1"),
        (1.5, "step must be a non-negative integer, got 1.5 (float)"),
    ],
)
def test_bad_steps(writer, small_store: Path, step, message: str) -> None:
    error = _unchanged(small_store, lambda: writer.write(step, make_tensors(30)))
    assert isinstance(error, errors.StepOrderError)
    assert message in str(error)


def test_missing_and_unexpected_tensors(writer, small_store: Path) -> None:
    tensors = make_tensors(30)
    del tensors["counter"]
    tensors["extra"] = np.zeros(2)
    error = _unchanged(small_store, lambda: writer.write(30, tensors))
    assert isinstance(error, errors.SchemaMismatchError)
    assert "checkpoint at step 30 has missing tensor(s) 'counter' and unexpected tensor(s) 'extra'" in str(error)


def test_shape_mismatch(writer, small_store: Path) -> None:
    tensors = make_tensors(30)
    tensors["embed.weight"] = np.zeros((11, 4), np.float32)
    error = _unchanged(small_store, lambda: writer.write(30, tensors))
    assert str(error) == (
        "tensor 'embed.weight' at step 30 has shape (11, 4); expected (10, 4) as in the first checkpoint"
    )


def test_dtype_mismatch(writer, small_store: Path) -> None:
    tensors = make_tensors(30)
    tensors["block.0.fc.bias"] = tensors["block.0.fc.bias"].astype(np.float32)
    error = _unchanged(small_store, lambda: writer.write(30, tensors))
    assert str(error) == (
        "tensor 'block.0.fc.bias' at step 30 has dtype float32; expected float16 as in the first checkpoint"
    )


def test_nonfinite_rejected_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "run.zarr"
    with ckptstore.create(path, reject_nonfinite=True) as w:
        w.write(0, {"w": torch.ones(3, dtype=torch.bfloat16)})
        bad = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.bfloat16)
        error = _unchanged(path, lambda: w.write(1, {"w": bad}))
        assert isinstance(error, errors.NonFiniteError)
        assert str(error) == "tensor 'w' at step 1 holds 2 NaN/inf values of 3; expected finite values"
        w.write(1, {"w": bad}, reject_nonfinite=False)  # a diverging run may still be recorded
    assert np.isnan(ckpt.open(path).tensors(1)["w"].astype(np.float32)[1])


@pytest.mark.parametrize(
    ("tensors", "error_type", "message"),
    [
        ({"a/b": np.zeros(1)}, errors.InvalidNameError, "tensor name 'a/b' contains '/'"),
        ({"step": np.zeros(1)}, errors.InvalidNameError, "tensor name 'step' is reserved"),
        ({"__x": np.zeros(1)}, errors.InvalidNameError, "starts with '__'"),
        ({"s": np.array(["a"])}, errors.UnsupportedTensorError, "tensor 's' at step 30: dtype <U1"),
        (
            {"c": torch.zeros(2, dtype=torch.complex32)},
            errors.UnsupportedTensorError,
            "tensor 'c' at step 30: dtype torch.complex32 cannot be stored",
        ),
        ({}, errors.SchemaMismatchError, "checkpoint at step 30 has no tensors"),
        ([1, 2], errors.UnsupportedTensorError, "tensors must be a mapping name -> array or an nn.Module"),
    ],
)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_bad_tensors(writer, small_store: Path, tensors, error_type, message: str) -> None:
    error = _unchanged(small_store, lambda: writer.write(30, tensors))
    assert isinstance(error, error_type)
    assert message in str(error)


def test_bad_metrics(writer, small_store: Path) -> None:
    error = _unchanged(small_store, lambda: writer.write(30, make_tensors(30), metrics={"loss": "high"}))
    assert str(error) == "metric 'loss' at step 30 must be a number, got 'high'"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs": np.zeros((4, 2)), "targets": np.zeros(5)}, "targets has 5 examples; expected 4 like inputs"),
        (
            {"inputs": np.zeros((4, 3)), "targets": np.zeros((4, 3)), "mask": np.ones((4, 2), bool)},
            "mask has shape (4, 2); expected the leading shape of targets (4, 3)",
        ),
        ({"inputs": np.zeros(4), "mask": np.full(4, 2)}, "mask must be boolean (or 0/1)"),
        ({"inputs": np.zeros(4), "labels": {"inputs": np.zeros(4)}}, "label name 'inputs' clashes"),
        ({"inputs": np.zeros(4), "text": "abcd"}, "text must be a sequence of strings"),
        ({"inputs": np.zeros(4)}, "data split 'eval' already exists"),
    ],
)
def test_bad_data(writer, small_store: Path, kwargs, message: str) -> None:
    error = _unchanged(small_store, lambda: writer.add_data("eval" if "already" in message else "new", **kwargs))
    assert isinstance(error, errors.CkptError)
    assert message in str(error)


def test_overwriting_a_split(small_store: Path) -> None:
    with ckptstore.open(small_store, mode="a") as w:
        w.add_data("eval", inputs=np.ones((3, 2)), overwrite=True)
    data = ckptstore.open(small_store).data("eval")
    assert data["inputs"].shape == (3, 2)
    assert "targets" not in data


def test_create_refuses_an_existing_store(small_store: Path) -> None:
    error = _unchanged(small_store, lambda: ckptstore.create(small_store))
    assert isinstance(error, errors.StoreExistsError)
    assert "already exists; append to it with ckpt.open" in str(error)


def test_create_refuses_bad_model_spec_and_config(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidNameError, match=r"importable factory 'package\.module:function'"):
        ckptstore.create(tmp_path / "a.zarr", model="not-a-spec")
    with pytest.raises(errors.DataError, match="JSON-serialisable"):
        ckptstore.create(tmp_path / "b.zarr", model="m:f", config={"x": object()})
    assert not (tmp_path / "a.zarr").exists()
    assert not (tmp_path / "b.zarr").exists()


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreNotFoundError, match="the path does not exist"):
        ckptstore.open(tmp_path / "missing.zarr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.NotAStoreError, match="is not a ckpt store"):
        ckptstore.open(tmp_path / "empty")
    zarr.open_group(tmp_path / "plain.zarr", mode="w")
    with pytest.raises(errors.NotAStoreError, match="is a zarr group but not a ckpt store"):
        ckptstore.open(tmp_path / "plain.zarr")


def test_future_format_version_is_detected(small_store: Path) -> None:
    root = small_store / "zarr.json"
    document = json.loads(root.read_text())
    document["attributes"]["ckpt"]["format_version"] = 3
    root.write_text(json.dumps(document))
    for mode in ("r", "a"):
        error = _unchanged(small_store, lambda mode=mode: ckptstore.open(small_store, mode=mode))
        assert isinstance(error, errors.UnsupportedFormatError)
        assert "uses store format v3; this ckpt reads v1, v2 only: upgrade ckpt" in str(error)


def test_one_writer_at_a_time(small_store: Path) -> None:
    with ckptstore.open(small_store, mode="a"):
        error = _unchanged(small_store, lambda: ckptstore.open(small_store, mode="a"))
        assert isinstance(error, errors.StoreLockedError)
    ckptstore.open(small_store, mode="a").close()  # released on close


def test_unknown_step_split_and_tensor(small_store: Path) -> None:
    s = ckptstore.open(small_store)
    with pytest.raises(errors.StepNotFoundError, match=r"step 15 is not a committed checkpoint .* steps 0\.\.20"):
        s.tensors(15)
    with pytest.raises(errors.TensorNotFoundError, match="no tensor named 'nope'"):
        s.tensors(0, ["nope"])
    with pytest.raises(errors.SplitNotFoundError, match=r"no data split 'train'.*splits are: eval"):
        s.data("train")


def test_closed_writer_refuses_writes(small_store: Path) -> None:
    w = ckptstore.open(small_store, mode="a")
    w.close()
    with pytest.raises(errors.ReadOnlyError, match="is closed"):
        w.write(30, make_tensors(30))

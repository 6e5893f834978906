"""Round trips through real Zarr stores: every dtype and framework, bit-exact."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt
import ckpt.store as ckptstore
from tests.helpers import make_tensors

TORCH_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]


def _torch_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@pytest.fixture(params=["local", "memory"])
def store_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "run.zarr")
    return f"memory://ckpt-test-{uuid.uuid4().hex}.zarr"


def test_torch_round_trip_is_bit_exact(store_path: str) -> None:
    written = {}
    with ckptstore.create(store_path, framework="torch") as w:
        for step in (0, 3, 7):
            tensors = {f"t.{str(d).removeprefix('torch.')}": _torch_tensor(d, (3, 5), step) for d in TORCH_DTYPES}
            tensors["scalar"] = torch.tensor(float(step))
            tensors["transposed"] = _torch_tensor(torch.float32, (4, 6), step).t()  # non-contiguous
            tensors["sliced"] = _torch_tensor(torch.bfloat16, (8, 8), step)[::2, 1::3]
            w.write(step, tensors)
            written[step] = tensors
    s = ckptstore.open(store_path)
    assert s.steps.tolist() == [0, 3, 7]
    for step, tensors in written.items():
        loaded = s.tensors(step, framework="torch")
        assert list(loaded) == list(tensors)
        for name, expected in tensors.items():
            got = loaded[name]
            assert got.dtype == expected.dtype, name
            assert got.shape == expected.shape, name
            assert torch.equal(got, expected), name
    assert s.schema["t.bfloat16"].dtype == "bfloat16"
    assert s.schema["scalar"].shape == ()


def test_numpy_round_trip_and_numpy_views_of_bfloat16(store_path: str) -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "bf16": rng.standard_normal(5).astype(ml_dtypes.bfloat16),
        "i8": rng.integers(-100, 100, (4,)).astype(np.int8),
        "u64": rng.integers(0, 2**40, (2, 2)).astype(np.uint64),
        "f_order": np.asfortranarray(rng.standard_normal((3, 4))),
    }
    with ckptstore.create(store_path) as w:
        w.write(1, tensors)
    loaded = ckptstore.open(store_path).tensors(1)
    for name, expected in tensors.items():
        assert loaded[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(loaded[name].view(np.uint8), np.ascontiguousarray(expected).view(np.uint8))


def test_big_endian_arrays_round_trip_as_their_values(tmp_path: Path) -> None:
    # stored little-endian by zarr; the writer writes such arrays through zarr, not to the chunk files itself
    path = tmp_path / "run.zarr"
    with ckptstore.create(path) as w:
        for step in range(2):
            w.write(step, {"be": np.arange(5, dtype=">i4") + step, "le": np.arange(3, dtype="<f8") * step})
    store = ckptstore.open(path)
    for step in range(2):
        loaded = store.tensors(step)
        np.testing.assert_array_equal(loaded["be"], np.arange(5) + step)
        np.testing.assert_array_equal(loaded["le"], np.arange(3) * step)
    np.testing.assert_array_equal(store.read_tensor("be"), np.arange(5) + np.arange(2)[:, None])


def test_jax_arrays_round_trip(tmp_path: Path) -> None:
    jnp = pytest.importorskip("jax.numpy")
    tensors = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.ones(3, dtype=jnp.bfloat16) * 1.5}
    with ckptstore.create(tmp_path / "run.zarr", framework="jax") as w:
        w.write(0, tensors)
    loaded = ckptstore.open(tmp_path / "run.zarr").tensors(0)
    np.testing.assert_array_equal(loaded["w"], np.asarray(tensors["w"]))
    assert loaded["b"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(loaded["b"].astype(np.float32), np.full(3, 1.5, np.float32))


def test_dlpack_only_objects_are_accepted(tmp_path: Path) -> None:
    class DLPackOnly:
        def __init__(self, array: np.ndarray) -> None:
            self._array = array

        def __dlpack__(self, **kwargs: object) -> object:
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> tuple[int, int]:
            return self._array.__dlpack_device__()

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ckptstore.create(tmp_path / "run.zarr") as w:
        w.write(0, {"x": DLPackOnly(array)})
    np.testing.assert_array_equal(ckpt.open(tmp_path / "run.zarr").tensors(0)["x"], array)


def test_module_state_dict_and_cuda_tensors(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    with ckptstore.create(tmp_path / "run.zarr", framework="torch") as w:
        w.write(0, model)  # an nn.Module: its state_dict, wherever it lives
    s = ckptstore.open(tmp_path / "run.zarr")
    assert s.tensor_names == list(model.state_dict())
    loaded = s.tensors(0, device=device)
    for name, value in model.state_dict().items():
        assert loaded[name].device.type == device
        assert torch.equal(loaded[name], value), name
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(s.tensors(0, framework="torch"))  # what users do with a checkpoint


def test_metadata_metrics_and_data(small_store: Path) -> None:
    s = ckptstore.open(small_store)
    assert s.model == ckptstore.ModelSpec("tests.models:tiny", {"d": 4})
    assert s.objective == "cross-entropy"
    assert s.format_version == 2
    assert [h["event"] for h in s.history] == ["create"]
    np.testing.assert_allclose(s.metrics["loss"].values, [1.0, 1 / 11, 1 / 21])
    assert s.metrics["step"].values.tolist() == [0, 10, 20]
    data = s.data("eval")
    assert data["inputs"].dims == ("example", "inputs.1")
    np.testing.assert_array_equal(data["targets"].values, np.arange(6) % 3)
    np.testing.assert_array_equal(data["parity"].values, np.arange(6) % 2)
    assert data.attrs["labels"] == ["parity"]
    assert len(data.attrs["sha256"]) == 64
    assert s.splits == ["eval"]


def test_token_data_with_mask_labels_and_text(tmp_path: Path) -> None:
    inputs = np.arange(24).reshape(4, 6)
    mask = np.zeros((4, 6), bool)
    mask[:, -2:] = True
    with ckptstore.create(tmp_path / "run.zarr") as w:
        w.add_data(
            "eval",
            inputs=inputs,
            targets=inputs + 1,
            mask=mask,
            labels={"place": np.tile(np.arange(6), (4, 1)), "carry": np.array([0, 1, 1, 0])},
            text=["a+b", "c+d", "e+f", "ü+ß"],
        )
    data = ckptstore.open(tmp_path / "run.zarr").data("eval")
    assert data["mask"].dims == ("example", "position")
    assert data["place"].dims == ("example", "position")
    assert data.attrs["datapoints"] == 8
    assert data["text"].values.tolist() == ["a+b", "c+d", "e+f", "ü+ß"]


def test_metrics_logged_without_checkpoints_get_nan_where_absent(tmp_path: Path) -> None:
    with ckptstore.create(tmp_path / "run.zarr") as w:
        w.log(0, {"loss": 2.0})
        w.log(1, {"loss": 1.5, "lr": 0.1})
        w.write(2, make_tensors(2), metrics={"loss": torch.tensor(1.0)})
    metrics = ckptstore.open(tmp_path / "run.zarr").metrics
    assert metrics["step"].values.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(metrics["loss"].values, [2.0, 1.5, 1.0])
    np.testing.assert_array_equal(np.isnan(metrics["lr"].values), [True, False, True])


def test_lazy_checkpoints_dataset(small_store: Path) -> None:
    ds = ckptstore.open(small_store).checkpoints
    assert ds["step"].values.tolist() == [0, 10, 20]
    weight = ds["block.0.fc.weight"]
    assert weight.dims == ("step", "block.0.fc.weight.0", "block.0.fc.weight.1")
    assert weight.chunks[0] == (1, 1, 1)  # one dask chunk per checkpoint: nothing read yet
    np.testing.assert_array_equal(weight.sel(step=10).values, make_tensors(10)["block.0.fc.weight"])


def test_read_tensor_across_steps(small_store: Path) -> None:
    s = ckptstore.open(small_store)
    stacked = s.read_tensor("embed.weight")
    assert stacked.shape == (3, 10, 4)
    assert 10 in s and 15 not in s and "x" not in s
    np.testing.assert_array_equal(stacked[2], make_tensors(20)["embed.weight"])
    np.testing.assert_array_equal(s.read_tensor("embed.weight", steps=[20, 0])[0], make_tensors(20)["embed.weight"])


def test_append_after_reopen(small_store: Path) -> None:
    with ckptstore.open(small_store, mode="a") as w:
        assert w.last_step == 20
        w.write(30, make_tensors(30))
    s = ckptstore.open(small_store)
    assert s.steps.tolist() == [0, 10, 20, 30]
    assert [h["event"] for h in s.history] == ["create", "open"]
    np.testing.assert_array_equal(s.tensors(30)["counter"], 30)


PLAIN_READER = textwrap.dedent(
    """
    import json, sys
    import xarray as xr
    ds = xr.open_zarr(sys.argv[1], group="checkpoints")
    data = xr.open_zarr(sys.argv[1], group="data/eval")
    out = {
        "steps": ds["step"].values.tolist(),
        "lazy": type(ds["embed.weight"].data).__module__.split(".")[0],
        "embed_10": ds["embed.weight"].sel(step=10).values.tolist(),
        "targets": data["targets"].values.tolist(),
        "ckpt_imported": any(m.split(".")[0] == "ckpt" for m in sys.modules),
    }
    print(json.dumps(out))
    """
)


def test_plain_xarray_reads_the_store_without_ckpt(small_store: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", PLAIN_READER, str(small_store)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # so that the source tree is not importable either
    )
    out = json.loads(result.stdout)
    assert out["steps"] == [0, 10, 20]
    assert out["lazy"] == "dask"
    assert not out["ckpt_imported"]
    np.testing.assert_array_equal(np.array(out["embed_10"], np.float32), make_tensors(10)["embed.weight"])
    assert out["targets"] == (np.arange(6) % 3).tolist()
    assert "Warning" not in result.stderr


def test_checksums_are_on_every_chunk(small_store: Path) -> None:
    meta = json.loads((small_store / "checkpoints" / "embed.weight" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "crc32c"]
    assert meta["dimension_names"] == ["step", "embed.weight.0", "embed.weight.1"]


def test_zstd_compression_round_trips(tmp_path: Path) -> None:
    with ckptstore.create(tmp_path / "run.zarr", compressor="zstd") as w:
        w.write(0, make_tensors(0))
    meta = json.loads((tmp_path / "run.zarr" / "checkpoints" / "embed.weight" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd", "crc32c"]
    loaded = ckptstore.open(tmp_path / "run.zarr").tensors(0)
    np.testing.assert_array_equal(loaded["embed.weight"], make_tensors(0)["embed.weight"])


def test_the_default_layout_is_read_and_written_past_zarr_and_a_compressed_one_through_it(tmp_path: Path) -> None:
    """ckpt reads and writes the default layout's chunk files itself (ckpt.store._zarr.WholeChunks).

    It recognises that layout from the array metadata of whichever zarr is installed: zarr 3.2 renamed
    the classes it had been checked against, and a wrong check would send every read through zarr.
    """
    tensors = make_tensors(0)
    for compressor, fast in ((None, set(tensors)), ("zstd", set())):
        path = tmp_path / f"{compressor}.zarr"
        with ckptstore.create(path, compressor=compressor) as w:
            w.write(0, tensors)
            assert set(w._whole_chunks) == fast
        store = ckptstore.open(path)
        assert set(store._whole_chunks) == fast
        for name, value in store.tensors(0).items():
            np.testing.assert_array_equal(value, tensors[name])

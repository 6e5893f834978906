"""The built-in analyzers on a GPU: the same numbers as on the CPU, and one Dask worker per GPU.

Skipped, with the reason, where torch sees no CUDA device (CI has none; a GPU session runs them,
see ../shared/GPU.md). ``CKPT_TEST_DEVICE=cpu`` runs the same comparisons CPU against CPU, which
checks the tests themselves on a machine without a GPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.engine.memory import GPU_SHARE, default_budget
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run

DEVICE = os.environ.get("CKPT_TEST_DEVICE", "cuda")

pytestmark = pytest.mark.skipif(
    DEVICE.startswith("cuda") and not torch.cuda.is_available(),
    reason="needs a CUDA device (torch.cuda.is_available() is False here); CKPT_TEST_DEVICE=cpu checks the tests",
)

ANALYZERS = {
    "loss": {},
    "grad-norms": {"chunk_size": 16},
    "sparsity": {},
    "hessian-basis": {"every": 2, "k": 2, "dtype": "float64", "tol": 1e-10},
    "polca": {"every": 2, "k": 2, "dtype": "float64", "tol": 1e-10, "second_order": "exact"},
    "fisher": {"every": 2, "k": 2, "dtype": "float64", "tol": 1e-10},
    "lca": {},
}
"""Every built-in that computes with torch, with options that make its numbers comparable across devices."""


@pytest.fixture(scope="module")
def cpu_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_example_run(tmp_path_factory.mktemp("cpu") / "run.zarr", examples=64)


def same_numbers(gpu: ckptstore.Store, cpu: ckptstore.Store, name: str) -> None:
    """Every float variable of result ``name`` agrees across devices (float32 kernels differ in rounding)."""
    a, b = gpu.analysis(name).load(), cpu.analysis(name).load()
    assert sorted(a.data_vars) == sorted(b.data_vars)
    for variable in a.data_vars:
        x, y = a[variable].values, b[variable].values
        if x.dtype.kind != "f":
            np.testing.assert_array_equal(x, y, err_msg=f"{name}.{variable}")
            continue
        if name in ("hessian-basis", "fisher") and a[variable].dims[0] == "basis" and variable != "eigenvalue":
            # eigenvectors are defined up to sign (and residuals, products, near tol, by the path taken)
            if variable in ("residual", "matvecs"):
                continue
            sign = np.sign(np.sum(x * y, axis=tuple(range(1, x.ndim)), keepdims=True))
            x = x * sign
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True, err_msg=f"{name}.{variable}")


@pytest.mark.parametrize("name", list(ANALYZERS))
def test_an_analyzer_on_the_gpu_gives_the_cpu_numbers(name: str, cpu_store: Path, tmp_path: Path) -> None:
    gpu_store = tmp_path / "run.zarr"
    shutil.copytree(cpu_store, gpu_store)
    options = ANALYZERS[name]
    run(name, cpu_store, scheduler="sync", **options)
    report = run(name, gpu_store, scheduler="sync", device=DEVICE, **options)
    assert report.computed_steps, "computed on the device, not reused"
    same_numbers(ckptstore.open(gpu_store), ckptstore.open(cpu_store), name)


def test_one_dask_worker_per_gpu(cpu_store: Path, tmp_path: Path) -> None:
    """``--workers N --device cuda``: a LocalCUDACluster of one worker per GPU (dask-cuda)."""
    if DEVICE.startswith("cuda"):
        pytest.importorskip("dask_cuda", reason="one worker per GPU needs dask-cuda (pip install 'ckpt[gpu]')")
    gpus = torch.cuda.device_count() if DEVICE.startswith("cuda") else 1
    store = tmp_path / "run.zarr"
    shutil.copytree(cpu_store, store)
    run("loss", cpu_store, scheduler="sync")
    run("loss", store, workers=gpus, device=DEVICE)
    same_numbers(ckptstore.open(store), ckptstore.open(cpu_store), "loss")


def test_the_default_budget_is_a_share_of_free_gpu_memory() -> None:
    if not DEVICE.startswith("cuda"):
        pytest.skip("the GPU budget needs a GPU")
    free, _ = torch.cuda.mem_get_info()
    assert abs(default_budget("cuda") - GPU_SHARE * free) <= 0.05 * free


def test_a_run_gives_its_gpu_memory_back(cpu_store: Path, tmp_path: Path) -> None:
    """After an in-process run nothing of it stays on the device: not its cached checkpoints, nor free cached blocks.

    In the third lent session a process of the quick suite held 77-79 GB of an H200 for minutes
    (which test, the log did not say), and bench/scale.py's hessian-basis, started beside it with
    80% of the then free memory as its budget, ran out. What an in-process run left behind then:
    its worker's cached checkpoints, data and basis, and torch's cache of the blocks it freed.
    """
    if not DEVICE.startswith("cuda"):
        pytest.skip("device memory needs a GPU")
    store = tmp_path / "run.zarr"
    shutil.copytree(cpu_store, store)
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for name in ("loss", "hessian-basis", "polca"):
        run(name, store, device=DEVICE, **ANALYZERS[name])
        assert torch.cuda.memory_allocated() == allocated, name
        assert torch.cuda.memory_reserved() <= reserved, name

"""Shared fixtures (real stores on disk) and the environment every test runs in; helpers are in tests/helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.plugins.examples import write_example_run
from ckpt.store.trust import TRUST_ENV
from tests.helpers import make_tensors

# The test suite's stores name factories in the test package (tests.models:mlp ...): trust them, as a
# user trusts their own code, in this process and in every `ckpt` it starts. tests/test_trust.py
# clears it to check the refusals.
os.environ[TRUST_ENV] = "tests"


def _share_the_cores() -> None:
    """Each pytest-xdist worker, and every process it starts, gets its share of the cores' threads.

    Two workers on 2 cores each running torch's default 2 threads (OpenMP, OpenBLAS) oversubscribe
    the cores, and OpenMP's threads then wait on each other: two ``ckpt analyze hessian-basis`` runs
    of the GPT-2 test model side by side took 196 s with 2 threads each and 58 s with 1 (2026-11-28).
    Tests of thread counts set them themselves; ``pytest -n 0`` runs with torch's defaults.
    """
    # Threads that wait for work sleep instead of spinning: beside another worker, a process with 2 threads
    # (ckpt demo's pinned kernels) spent most of its CPU spinning; the arithmetic is the same (the same weights)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 1:
        return
    threads = str(max(1, (os.cpu_count() or 1) // workers))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, threads)  # read by the libraries as they load: in started processes
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # this process loaded torch already


_share_the_cores()

LONGEST_FIRST = (
    # seconds summed over a file's tests (--durations=0), 2 workers on a shared, loaded machine
    "tests/test_crash_points.py",  # ~250: commands killed at every file event
    "tests/test_memory_budget.py",  # ~115: GPT-2 hessian-basis under address-space limits
    "tests/test_demo.py",  # ~90; ckpt demo starts torch itself (plain subprocess)
    "tests/test_polca_memory.py",  # ~80: GPT-2 POLCA under address-space limits (plain subprocesses)
    "tests/test_bench_scale.py",  # ~75
    "tests/test_figures.py",  # ~65 and its two trained runs
    "tests/test_follow.py",  # ~65
    "tests/test_polca.py",  # ~65
    "tests/test_basis_resume.py",  # ~65
    "tests/test_bad_input.py",  # ~65: one ckpt process per bad input
    "tests/test_lca_resume.py",  # ~55
    "tests/test_engine.py",  # ~55
    "tests/test_watch.py",  # ~47
    "tests/test_result_from_journal.py",  # ~45
    "tests/test_store_crash.py",  # ~44
    "tests/test_sandbox_addition.py",  # ~39: two trainings in fresh processes
)
"""The test files that take longest (``--durations=0``, summed a file), longest first.

pytest-xdist hands out whole files (``--dist loadfile``) in collection order
(``--no-loadscope-reorder``): the longest first, then the rest, so that no long file starts last
while the other worker has nothing left to do.
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first; every file's tests keep their order (the sort is stable)."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for tests of tiny models (extra threads only add contention on a small, busy CPU).

    Modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``; the
    worker caches are cleared afterwards.
    """
    import torch

    from ckpt.engine.worker import clear_cache

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    clear_cache()


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    """A store with three checkpoints (steps 0, 10, 20), metrics and an eval split."""
    path = tmp_path / "run.zarr"
    with ckptstore.create(path, model="tests.models:tiny", config={"d": 4}, objective="cross-entropy") as w:
        for step in (0, 10, 20):
            w.write(step, make_tensors(step), metrics={"loss": 1.0 / (step + 1)})
        w.add_data(
            "eval",
            inputs=np.arange(12).reshape(6, 2),
            targets=np.arange(6) % 3,
            labels={"parity": np.arange(6) % 2},
        )
    return path


@pytest.fixture
def mlp_store(tmp_path: Path) -> Path:
    """A 6-checkpoint run of a tiny MLP classifier with 50 eval examples (:func:`write_example_run`)."""
    return write_example_run(tmp_path / "mlp.zarr")

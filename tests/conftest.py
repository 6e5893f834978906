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


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for tests of tiny models (extra threads only add contention on a small, busy CPU).

    Modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``; the
    worker caches are cleared afterwards.
    """
    import torch

    from ckpt.plugins import clear_cache

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

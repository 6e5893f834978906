"""Runs as a dimension: one analyzer over several stores, one Dataset with a ``run`` dim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.engine.worker import clear_cache
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them


def write_run(path: Path, seed: int, weight_decay: float, steps: int) -> Path:
    """A tiny AdamW run recording its settings as ``ckpt train`` does (attrs seed and config)."""
    attrs = {"task": "toy", "seed": seed, "config": {"weight_decay": weight_decay, "lr": 0.05}}
    return write_example_run(
        path,
        steps,
        examples=20,
        seed=seed,
        attrs=attrs,
        optimizer=lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=weight_decay),
    )


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    """Three runs: two weight decays, two seeds, one of them shorter."""
    yield [
        write_run(tmp_path / "wd0-s0.zarr", 0, 0.0, 4),
        write_run(tmp_path / "wd1-s0.zarr", 0, 1.0, 4),
        write_run(tmp_path / "wd1-s1.zarr", 1, 1.0, 3),
    ]
    clear_cache()


def test_analyze_runs_stacks_results_with_the_run_settings_as_coordinates(runs: list[Path]) -> None:
    combined = ckpt.analyze_runs("loss", runs)
    assert combined.sizes["run"] == 3
    assert combined["run"].values.tolist() == [str(r) for r in runs]
    assert combined["seed"].values.tolist() == [0, 0, 1]
    assert combined["weight_decay"].values.tolist() == [0.0, 1.0, 1.0]
    for index, path in enumerate(runs):
        alone = ckptstore.open(path).analysis("loss")["loss"].values
        np.testing.assert_array_equal(combined["loss"].isel(run=index).values[: len(alone)], alone)
    # the shorter run is padded with NaN on the steps it does not have
    assert np.isnan(combined["loss"].isel(run=2).sel(step=3).values).all()
    by_decay = combined["mean_loss"].groupby("weight_decay").mean("run")
    assert by_decay.sizes["weight_decay"] == 2


def test_cli_analyzes_every_store_of_a_glob(runs: list[Path]) -> None:
    pattern = str(runs[0].parent / "wd1-*.zarr")
    done = invoke_ckpt("analyze", "loss", pattern, str(runs[0]), "--no-progress")
    assert done.returncode == 0, done.stderr
    for path in runs:
        assert f"{path}: loss: computed" in done.stdout
        assert "loss" in ckptstore.open(path).analyses
    assert "3 runs" in done.stdout


def test_cli_glob_matching_nothing_is_one_error_line(runs: list[Path]) -> None:
    before = tree_digest(runs[0])
    done = run_ckpt("analyze", "loss", str(runs[0].parent / "nothing-*.zarr"), "--no-progress")
    assert done.returncode == 2
    assert "Error: no store matches" in done.stderr
    assert "Traceback" not in done.stderr
    assert tree_digest(runs[0]) == before

"""``ckpt repair`` rebuilds what the commit record allows and drops what cannot be trusted, saying what.

Real stores on disk, damaged by hand the way disks and people damage them, and the
real ``ckpt`` command.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt
import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from tests.helpers import invoke_ckpt, make_tensors, run_ckpt, tree_digest


@pytest.fixture
def logged_store(tmp_path: Path) -> Path:
    """Six checkpoints with metrics (loss, lr) and an eval split with text."""
    path = tmp_path / "run.zarr"
    with ckptstore.create(path) as writer:
        writer.add_data("eval", inputs=np.arange(12).reshape(6, 2), text=[f"example {i}" for i in range(6)])
        for step in range(0, 60, 10):
            writer.write(step, make_tensors(step), metrics={"loss": 1.0 / (step + 1), "lr": 0.1})
    return path


def _tensors(path: Path) -> dict[int, dict[str, np.ndarray]]:
    store = ckptstore.open(path)
    return {int(step): store.tensors(int(step)) for step in store.steps}


def _repair(path: Path) -> list[str]:
    result = invoke_ckpt("repair", str(path))
    assert result.returncode == 0, result.stderr
    assert invoke_ckpt("verify", str(path)).returncode == 0
    return result.stdout.splitlines()


def test_a_damaged_checkpoint_in_the_middle_is_dropped_and_the_rest_kept_bit_exact(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    before = _tensors(mlp_store)
    victim = next((mlp_store / "checkpoints").glob("*/c.2.0*"))
    victim.unlink()  # a lost chunk of step 2
    assert run_ckpt("verify", str(mlp_store)).returncode == 1
    lines = _repair(mlp_store)
    assert "  dropped checkpoint 2 (a tensor is missing or damaged)" in lines
    assert "  dropped analysis 'loss' (holds a dropped checkpoint)" in lines
    assert lines[-2] == f"{mlp_store}: 5 committed checkpoints; 2 repair(s)"
    after = _tensors(mlp_store)
    assert sorted(after) == [0, 1, 3, 4, 5]
    for step, tensors in after.items():
        for name, value in tensors.items():
            np.testing.assert_array_equal(value, before[step][name])
    store = ckptstore.open(mlp_store)
    assert store.history[-1]["event"] == "repair" and store.history[-1]["dropped_steps"] == [2]
    assert store.analyses == [] and store.splits == ["eval"]
    # plain zarr readers agree: no stale rows beyond the new end
    assert sorted(p.name for p in (mlp_store / "checkpoints" / "0.weight").glob("c.*")) == [
        f"c.{i}.0.0" for i in range(5)
    ]
    # the repaired store is an ordinary store: append to it, analyze it
    with ckptstore.open(mlp_store, mode="a") as writer:
        writer.write(9, {name: value + 1 for name, value in before[5].items()})
    assert run("loss", mlp_store).computed_steps == [0, 1, 3, 4, 5, 9]


def test_a_lost_chunk_of_the_step_array_is_rewritten_from_the_record(logged_store: Path) -> None:
    before = _tensors(logged_store)
    for chunk in (logged_store / "checkpoints" / "step").glob("c*"):
        shutil.rmtree(chunk) if chunk.is_dir() else chunk.unlink()
    opened = run_ckpt("info", str(logged_store))
    assert opened.returncode == 1 and "ckpt repair" in opened.stderr
    lines = _repair(logged_store)
    assert lines[0] == "  rewrote checkpoints/step from the commit record (a chunk of it was lost or damaged)"
    assert not any("dropped" in line for line in lines)
    assert _tensors(logged_store).keys() == before.keys()


def test_damaged_metrics_and_a_damaged_split_are_dropped_alone(logged_store: Path) -> None:
    lr = next((logged_store / "metrics" / "lr" / "c").rglob("*"))
    lr.write_bytes(next((logged_store / "metrics" / "loss" / "c").rglob("*")).read_bytes())  # loss values as lr
    text = next((logged_store / "data" / "eval" / "text" / "c").rglob("*"))
    text.unlink()
    lines = _repair(logged_store)
    assert "  dropped metrics 'lr' (fails its digest)" in lines
    assert "  dropped data split 'eval' (fails its sha256)" in lines
    store = ckptstore.open(logged_store)
    assert list(store.metrics.data_vars) == ["loss"] and store.splits == []
    assert len(store.steps) == 6
    np.testing.assert_allclose(store.metrics["loss"].values, [1.0 / (s + 1) for s in range(0, 60, 10)])


def test_a_lost_metrics_step_column_drops_every_metric(logged_store: Path) -> None:
    for chunk in (logged_store / "metrics" / "step" / "c").rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    lines = _repair(logged_store)
    assert "  dropped metrics 'loss' (fails its digest)" in lines
    assert "  dropped metrics 'lr' (fails its digest)" in lines
    store = ckptstore.open(logged_store)
    assert len(store.metrics["step"]) == 0 and len(store.steps) == 6
    with ckptstore.open(logged_store, mode="a") as writer:  # logging starts anew
        writer.write(70, make_tensors(70), metrics={"loss": 0.5})
    assert ckptstore.open(logged_store).metrics["loss"].values.tolist() == [0.5]


def test_a_damaged_result_is_dropped_and_the_checkpoints_kept(mlp_store: Path) -> None:
    run("loss", mlp_store, block_steps=2)
    ckpt.analyze("grad-norms", mlp_store)
    chunk = next(p for p in (mlp_store / "analyses" / "loss" / "loss" / "c").rglob("*") if p.is_file())
    chunk.unlink()
    lines = _repair(mlp_store)
    assert len(lines) == 3 and lines[0].startswith("  dropped analysis 'loss' (analysis 'loss' of ")
    store = ckptstore.open(mlp_store)
    assert store.analyses == ["grad-norms"] and len(store.steps) == 6


def test_a_sound_store_is_left_as_it_was_but_for_the_history_event(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    before = {k: v for k, v in tree_digest(mlp_store).items() if k != "zarr.json"}
    result = invoke_ckpt("repair", str(mlp_store))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{mlp_store}: 6 committed checkpoints; nothing damaged or uncommitted found\n"
    assert {k: v for k, v in tree_digest(mlp_store).items() if k != "zarr.json"} == before
    assert ckptstore.open(mlp_store).history[-1]["event"] == "repair"


def test_a_result_covering_a_step_that_is_not_a_committed_checkpoint_fails_verify_and_is_dropped(
    logged_store: Path,
) -> None:
    # what a repair killed between dropping checkpoint 60 and dropping its result used to leave
    import xarray as xr

    from ckpt.store.results import write_analysis

    steps = [0, 10, 60]
    dataset = xr.Dataset({"v": (("step",), np.ones(3))}, coords={"step": steps})
    write_analysis(logged_store, "toy", dataset, attrs={"ckpt": {"analyzer": "toy", "version": "1", "steps": steps}})
    verified = run_ckpt("verify", str(logged_store))
    assert verified.returncode == 1
    assert "  analysis 'toy': covers step(s) 60, which are not committed checkpoints" in verified.stdout.splitlines()
    assert verified.stderr.startswith("Error: 1 problem(s) in ") and verified.stderr.count("\n") == 1
    lines = _repair(logged_store)
    assert "  dropped analysis 'toy' (covers step(s) 60, which are not committed checkpoints)" in lines
    assert ckptstore.open(logged_store).analyses == []
    again = invoke_ckpt("repair", str(logged_store))
    assert again.stdout.endswith("6 committed checkpoints; nothing damaged or uncommitted found\n")

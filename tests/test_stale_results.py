"""A result held lazily (a notebook's view) while ``ckpt analyze`` replaces, regrows or extends it.

Real stores, the real engine in this process. A view opened before the result was committed
again reads what it opened (extension of a per-checkpoint result: the old chunks are untouched;
a replaced or regrown one: from the kept earlier version, tests/test_snapshot_reads.py) or, once
that version is no longer kept (here: ``ckpt repair`` removed it), raises
:class:`~ckpt.errors.StaleResultError` naming both commits and saying to reopen: never
:class:`~ckpt.errors.CorruptChunkError` (the store is fine) and never a mix of versions. A chunk
damaged while the record did not change stays CorruptChunkError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt
import ckpt.store as ckptstore
from ckpt.errors import CorruptChunkError, StaleResultError, StoreError
from ckpt.plugins import AnalysisContext, Analyzer, hookimpl
from ckpt.plugins.manager import Registry, load_registry
from ckpt.plugins.testing import mlp
from tests.helpers import invoke_ckpt, weight_norm

pytestmark = pytest.mark.usefixtures("one_thread")


class RelativeNorm(Analyzer):
    """A per-run analyzer whose every value changes when the run grows: each step's norm over their mean."""

    name = "relative-norm"
    description = "Weight norm of each checkpoint over the run's mean norm."
    per = "run"

    def compute(self, ctx: AnalysisContext) -> Any:
        norms = ctx.map_checkpoints(weight_norm, {"norm": ((), np.float64)})
        return norms / norms["norm"].mean("step")


class _Plugin:
    @hookimpl
    def ckpt_register_analyzers(self, register: Any) -> None:
        register(RelativeNorm)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(extra=[_Plugin()])


def _append(path: Path, steps: tuple[int, ...]) -> None:
    with ckptstore.open(path, mode="a") as writer:
        for step in steps:
            torch.manual_seed(step)
            writer.write(step, mlp())


def _repair(path: Path) -> None:
    """``ckpt repair``: it also removes the kept earlier versions of results."""
    done = invoke_ckpt("repair", str(path))
    assert done.returncode == 0, done.stderr
    assert "removed kept earlier version" in done.stdout


def _assert_stale(held: Any, name: str, opened: str, now: str) -> None:
    with pytest.raises(StaleResultError) as caught:
        held.compute()
    message = str(caught.value)
    assert not isinstance(caught.value, CorruptChunkError)
    assert isinstance(caught.value, StoreError)
    assert f"analyses/{name} was recomputed" in message
    assert f"(opened: {opened}, now: {now})" in message
    assert f'.analysis("{name}")' in message
    assert "repair" not in message and "--force" not in message


def test_a_result_replaced_by_force_with_the_same_values_reads_them(mlp_store: Path) -> None:
    """``--force`` rewrites every chunk; where the values came out the same they are what the view opened."""
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    ckpt.analyze("loss", mlp_store, force=True, progress=False)
    fresh = ckptstore.open(mlp_store).analysis("loss").load()
    loaded = held.load()
    np.testing.assert_array_equal(loaded["loss"].values, fresh["loss"].values)


def test_a_result_replaced_for_new_eval_data_is_stale_not_corrupt_once_unkept(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    opened = held.ckpt.created
    split = ckptstore.open(mlp_store).data("eval")
    with ckptstore.open(mlp_store, mode="a") as writer:
        inputs, targets = split["inputs"].values[::-1].copy(), split["targets"].values[::-1].copy()
        writer.add_data("eval", inputs=inputs, targets=targets, overwrite=True)
    ckpt.analyze("loss", mlp_store, progress=False)
    now = ckptstore.open(mlp_store).analysis("loss").ckpt.created
    _repair(mlp_store)
    _assert_stale(held, "loss", str(opened), str(now))
    # read variable by variable, the changed one still refuses: each chunk read is checked
    with pytest.raises(StaleResultError):
        held["loss"].values  # noqa: B018


def test_a_per_run_result_regrown_is_stale_not_corrupt_once_unkept(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("relative-norm", mlp_store, registry=registry, progress=False)
    held = ckptstore.open(mlp_store).analysis("relative-norm")
    opened = held.ckpt.created
    _append(mlp_store, (6, 7))
    ckpt.analyze("relative-norm", mlp_store, registry=registry, progress=False)
    now = ckptstore.open(mlp_store).analysis("relative-norm").ckpt.created
    _repair(mlp_store)
    _assert_stale(held, "relative-norm", str(opened), str(now))


def test_a_per_checkpoint_result_extended_still_reads_what_was_opened(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    before = ckptstore.open(mlp_store).analysis("loss").load()
    _append(mlp_store, (6, 7, 8))
    ckpt.analyze("loss", mlp_store, progress=False)
    loaded = held.compute()
    assert loaded["step"].values.tolist() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_array_equal(loaded["loss"].values, before["loss"].values)
    np.testing.assert_array_equal(loaded["mean_loss"].values, before["mean_loss"].values)


def test_a_result_removed_after_it_was_opened_is_stale(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    done = invoke_ckpt("rm", str(mlp_store), "loss")
    assert done.returncode == 0, done.stderr
    with pytest.raises(StaleResultError, match=r"analyses/loss was removed after this Dataset was opened"):
        held.load()


@pytest.mark.parametrize("damage", ["reversed bytes", "another chunk's bytes"])
def test_a_damaged_chunk_of_an_unchanged_result_is_still_corrupt(mlp_store: Path, damage: str) -> None:
    """A chunk that does not decode, or decodes to other values, while the record is unchanged: corrupt."""
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    chunks = mlp_store / "analyses" / "loss" / "mean_loss" / "c"
    first, second = chunks / "0", chunks / "1"
    assert first.is_file() and second.is_file()
    second.write_bytes(second.read_bytes()[::-1] if damage == "reversed bytes" else first.read_bytes())
    with pytest.raises(CorruptChunkError, match="ckpt repair") as caught:
        held.load()
    assert not isinstance(caught.value, StaleResultError)

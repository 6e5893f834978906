"""Snapshot reads: a Dataset held while its result is replaced, regrown or extended reads what it opened.

Real stores, the real engine and the real ``ckpt`` commands; the checkpoint writer of the last
test is another process. A replaced result's folder is kept as an earlier version
(``.snapshots/``, docs/store-format.md section 1.5.1) and a held Dataset reads from it, chunk by
chunk against the digests it opened; once that version is pruned (the documented rule, or
``ckpt repair``) the held Dataset raises StaleResultError, never CorruptChunkError and never
values of another version.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr

import ckpt
import ckpt.store as ckptstore
from ckpt.errors import CorruptChunkError, StaleResultError
from ckpt.plugins import AnalysisContext, hookimpl
from ckpt.plugins.manager import Registry, load_registry
from ckpt.plugins.testing import mlp
from ckpt.store import _zarr, snapshots
from ckpt.store.provenance import Provenance
from ckpt.store.results import ResultSink
from tests.helpers import invoke_ckpt
from tests.test_stale_results import RelativeNorm

pytestmark = pytest.mark.usefixtures("one_thread")

WRITER = """
import sys, torch
import ckpt.store as ckptstore
from ckpt.plugins.testing import mlp
with ckptstore.open(sys.argv[1], mode="a") as writer:
    for step in map(int, sys.argv[2:]):
        torch.manual_seed(step)
        writer.write(step, mlp())
"""


def _append_in_another_process(path: Path, *steps: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(path), *map(str, steps)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


class GrowingUnderfoot(RelativeNorm):
    """relative-norm, but a writer in another process appends two checkpoints before it reads any."""

    name = "growing-underfoot"

    def compute(self, ctx: AnalysisContext) -> Any:
        _append_in_another_process(Path(ctx.store.path), 6, 7)
        return super().compute(ctx)


class _Plugin:
    @hookimpl
    def ckpt_register_analyzers(self, register: Any) -> None:
        register(RelativeNorm)
        register(GrowingUnderfoot)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(extra=[_Plugin()])


def _append(path: Path, *steps: int) -> None:
    with ckptstore.open(path, mode="a") as writer:
        for step in steps:
            torch.manual_seed(step)
            writer.write(step, mlp())


def _new_eval_data(path: Path) -> None:
    split = ckptstore.open(path).data("eval")
    with ckptstore.open(path, mode="a") as writer:
        inputs, targets = split["inputs"].values[::-1].copy(), split["targets"].values[::-1].copy()
        writer.add_data("eval", inputs=inputs[:40], targets=targets[:40], overwrite=True)


def _assert_same(loaded: xr.Dataset, expected: xr.Dataset) -> None:
    assert set(loaded.variables) == set(expected.variables)
    for name in expected.variables:
        np.testing.assert_array_equal(loaded[name].values, expected[name].values)


def _assert_stale(held: xr.Dataset) -> None:
    with pytest.raises(StaleResultError, match=r"no longer kept.*reopen it") as caught:
        held.compute()
    assert not isinstance(caught.value, CorruptChunkError)


def test_a_held_view_of_a_replaced_result_reads_its_old_values_exactly(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    before = ckptstore.open(mlp_store).analysis("loss").load()
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)  # new eval data: the result is replaced
    fresh = ckptstore.open(mlp_store).analysis("loss").load()
    assert not np.array_equal(fresh["loss"].values, before["loss"].values)
    _assert_same(held.compute(), before)
    assert len(snapshots.versions(_zarr.open_zarr_store(mlp_store, read_only=True), "loss")) == 1


def test_a_held_view_of_a_regrown_per_run_result_reads_its_old_values(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("relative-norm", mlp_store, registry=registry, progress=False)
    held = ckptstore.open(mlp_store).analysis("relative-norm")
    before = ckptstore.open(mlp_store).analysis("relative-norm").load()
    _append(mlp_store, 6, 7)
    ckpt.analyze("relative-norm", mlp_store, registry=registry, progress=False)
    fresh = ckptstore.open(mlp_store).analysis("relative-norm").load()
    assert fresh["step"].values.tolist() == list(range(8))
    loaded = held.compute()  # compute, not load: the held view stays lazy
    assert loaded["step"].values.tolist() == list(range(6))
    _assert_same(loaded, before)
    assert not np.array_equal(fresh["norm"].values[:6], before["norm"].values)


def test_a_held_view_of_an_extended_result_replaced_since_reads_what_it_opened(mlp_store: Path) -> None:
    """Opened, extended (chunks kept in place), then replaced: the kept version is longer than the view."""
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    before = ckptstore.open(mlp_store).analysis("loss").load()
    _append(mlp_store, 6, 7, 8)
    ckpt.analyze("loss", mlp_store, progress=False)  # extended
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)  # replaced
    loaded = held.compute()  # compute, not load: the held view stays lazy
    assert loaded["step"].values.tolist() == list(range(6))
    _assert_same(loaded, before)


def test_after_the_prune_a_held_view_is_stale_never_corrupt_or_mixed(mlp_store: Path) -> None:
    """The rule keeps the most recently retired version; older ones go after the grace period."""
    ckpt.analyze("loss", mlp_store, progress=False)
    first = ckptstore.open(mlp_store).analysis("loss")
    before = ckptstore.open(mlp_store).analysis("loss").load()
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)
    second = ckptstore.open(mlp_store).analysis("loss")
    middle = ckptstore.open(mlp_store).analysis("loss").load()
    ckpt.analyze("loss", mlp_store, force=True, progress=False)  # same values, a second kept version
    zstore = _zarr.open_zarr_store(mlp_store, read_only=False)
    assert len(snapshots.versions(zstore, "loss")) == 2
    _assert_same(first[["mean_loss"]].compute(), before[["mean_loss"]])  # one variable read: the old
    assert len(snapshots.prune(zstore, "loss", grace_s=0.0)) == 1  # the older version goes, the newest stays
    _assert_stale(first)  # chunks read before the prune do not make a mix: the whole load refuses
    _assert_same(second.compute(), middle)
    done = invoke_ckpt("repair", str(mlp_store))
    assert done.returncode == 0, done.stderr
    assert "removed kept earlier version .snapshots/analyses/loss/" in done.stdout
    assert not (mlp_store / ".snapshots").exists()
    _assert_same(second.compute(), middle)  # the force gave the same values: the current chunks match
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)
    assert invoke_ckpt("repair", str(mlp_store)).returncode == 0
    _assert_stale(second)


def test_each_commit_prunes_the_versions_past_the_grace_period(
    mlp_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshots, "SNAPSHOT_GRACE_S", 0.0)
    ckpt.analyze("loss", mlp_store, progress=False)
    for _ in range(3):
        ckpt.analyze("loss", mlp_store, force=True, progress=False)
    kept = snapshots.versions(_zarr.open_zarr_store(mlp_store, read_only=True), "loss")
    assert len(kept) == 1  # the most recently replaced stays until the next replacement


def test_rm_deletes_the_kept_versions_with_the_result(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    ckpt.analyze("loss", mlp_store, force=True, progress=False)
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)
    assert (mlp_store / ".snapshots" / "analyses" / "loss").is_dir()
    assert invoke_ckpt("rm", str(mlp_store), "loss").returncode == 0
    assert not (mlp_store / ".snapshots" / "analyses" / "loss").exists()
    with pytest.raises(StaleResultError, match="was removed after this Dataset was opened"):
        held.compute()


def test_an_object_store_keeps_the_replaced_version_too(tmp_path: Path) -> None:
    """On an fsspec store the folder is copied to its kept version, then deleted."""
    path = f"memory://snapshots-{tmp_path.name}.zarr"
    writer = ckptstore.create(path)
    for step in range(3):
        writer.write(step, {"w": np.full(3, step, np.float32)})
    writer.close()
    request = Provenance(
        analyzer="toy", version="1", options={}, data_sha256="d" * 64, model_sha256="m" * 64, requires={}
    )
    old = xr.Dataset({"value": (("step",), np.arange(3.0))}, coords={"step": [0, 1, 2]})
    with ResultSink.open(path, "toy", request) as sink:
        sink.replace(old)
        held = ckptstore.open(path).analysis("toy")
        sink.replace(old * 10)
    assert ckptstore.open(path).analysis("toy")["value"].values.tolist() == [0.0, 10.0, 20.0]
    assert held["value"].values.tolist() == [0.0, 1.0, 2.0]


def test_checkpoints_appended_by_another_process_do_not_change_what_an_analysis_reads(
    mlp_store: Path, registry: Registry
) -> None:
    ckpt.analyze("relative-norm", mlp_store, registry=registry, progress=False)
    expected = ckptstore.open(mlp_store).analysis("relative-norm").load()
    ckpt.analyze("growing-underfoot", mlp_store, registry=registry, progress=False)
    store = ckptstore.open(mlp_store)
    assert store.steps.tolist() == list(range(8))  # the writer did append, mid-analysis
    read = store.analysis("growing-underfoot").load()
    assert read["step"].values.tolist() == list(range(6))
    _assert_same(read, expected)
    assert read.ckpt.steps == list(range(6))


@pytest.mark.parametrize("damage", ["hostile metadata", "other values", "a link outside the store"])
def test_a_kept_version_that_was_tampered_with_is_never_read(mlp_store: Path, damage: str, tmp_path: Path) -> None:
    """A kept version is data: metadata bounded before zarr parses it, chunks checked, no link followed."""
    ckpt.analyze("loss", mlp_store, progress=False)
    held = ckptstore.open(mlp_store).analysis("loss")
    _new_eval_data(mlp_store)
    ckpt.analyze("loss", mlp_store, progress=False)
    (version,) = (mlp_store / ".snapshots" / "analyses" / "loss").iterdir()
    if damage == "hostile metadata":
        (version / "mean_loss" / "zarr.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "a link outside the store":  # the right chunks, but outside: never read
        (version / "mean_loss").rename(tmp_path / "outside")
        (version / "mean_loss").symlink_to(tmp_path / "outside")
    else:  # the current result's chunks in the kept version's place: they decode, to the wrong values
        for chunk in (version / "mean_loss" / "c").iterdir():
            chunk.write_bytes((mlp_store / "analyses" / "loss" / "mean_loss" / "c" / chunk.name).read_bytes())
    with pytest.raises(StaleResultError, match="no longer kept") as caught:
        held[["mean_loss"]].compute()
    assert not isinstance(caught.value, CorruptChunkError)
    if damage == "other values":  # the version's other variable is sound and still reads
        assert held[["loss"]].compute()["loss"].shape == (6, 50)
    else:  # a version with any hostile document or link is not opened at all
        with pytest.raises(StaleResultError, match="no longer kept"):
            held[["loss"]].compute()

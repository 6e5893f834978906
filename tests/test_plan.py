"""What a request computes is decided by :func:`ckpt.engine.plan.plan`, over real stores, computing nothing.

Each test stores a real result (through the engine), changes the store or the request, and asks
the plan what a rerun would reuse and compute, inside ``raise_if_dask_computes``: deciding reads
the commit record and the stored result's steps, never its data.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt
import ckpt.store as ckptstore
from ckpt.engine.plan import Plan, plan
from ckpt.plugins import AnalysisContext, Analyzer
from ckpt.plugins.manager import Registry
from ckpt.plugins.testing import mlp, raise_if_dask_computes
from tests.helpers import registry_with, weight_norm


class WholeRunNorm(Analyzer):
    """A per-run analyzer: the mean weight norm over every checkpoint (changes when the run grows)."""

    name = "whole-run-norm"
    description = "Mean weight norm over the run."
    per = "run"

    def compute(self, ctx: AnalysisContext) -> Any:
        return ctx.map_checkpoints(weight_norm, {"norm": ((), np.float64)}).mean("step")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return registry_with(WholeRunNorm)


def _plan(registry: Registry, name: str, path: Path, **options: Any) -> Plan:
    analyzer = registry.analyzers[name](**{k: v for k, v in options.items() if k != "force"})
    store = ckptstore.open(path)
    with raise_if_dask_computes():
        return plan(analyzer, store, force=bool(options.get("force")))


def _append(path: Path, steps: tuple[int, ...]) -> None:
    with ckptstore.open(path, mode="a") as writer:
        for step in steps:
            torch.manual_seed(step)
            writer.write(step, mlp())


def test_a_fresh_store_computes_every_step(mlp_store: Path, registry: Registry) -> None:
    decided = _plan(registry, "loss", mlp_store)
    assert decided.wanted == decided.missing == (0, 1, 2, 3, 4, 5)
    assert decided.reused == ()
    assert decided.computes and decided.reason is None
    assert decided.provenance.analyzer == "loss" and decided.provenance.requires == {}
    assert decided.provenance.steps == (), "covering the steps it reuses"
    with pytest.raises(dataclasses.FrozenInstanceError):
        decided.missing = ()  # type: ignore[misc]


def test_a_stored_result_of_the_same_request_is_reused_whole(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("loss", mlp_store, batch_size=7, registry=registry)
    decided = _plan(registry, "loss", mlp_store, batch_size=7)
    assert decided.reused == decided.wanted == (0, 1, 2, 3, 4, 5)
    assert decided.missing == () and not decided.computes


def test_a_stored_result_whose_options_changed_is_computed_anew(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("loss", mlp_store, batch_size=7, registry=registry)
    decided = _plan(registry, "loss", mlp_store, batch_size=8)
    assert decided.reused == () and decided.missing == decided.wanted
    assert decided.reason is not None and "options" in decided.reason


def test_a_new_checkpoint_is_the_only_step_computed(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("loss", mlp_store, registry=registry)
    _append(mlp_store, (6,))
    decided = _plan(registry, "loss", mlp_store)
    assert decided.reused == (0, 1, 2, 3, 4, 5)
    assert decided.missing == (6,) and decided.computes and decided.reason is None


def test_force_computes_every_step(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("loss", mlp_store, registry=registry)
    decided = _plan(registry, "loss", mlp_store, force=True)
    assert decided.reused == () and decided.missing == decided.wanted and decided.reason == "forced"


def test_a_per_run_result_is_computed_whole_when_the_run_grows(mlp_store: Path, registry: Registry) -> None:
    ckpt.analyze("whole-run-norm", mlp_store, registry=registry)
    assert not _plan(registry, "whole-run-norm", mlp_store).computes, "the same steps: reused"
    _append(mlp_store, (6, 7))
    decided = _plan(registry, "whole-run-norm", mlp_store)
    assert decided.reused == () and decided.missing == (0, 1, 2, 3, 4, 5, 6, 7)
    assert decided.reason is not None and "per-run" in decided.reason


def test_the_plan_is_what_the_run_does(mlp_store: Path, registry: Registry) -> None:
    """The engine follows its plan: the steps a run reports are the plan's, decided before it ran."""
    ckpt.analyze("loss", mlp_store, registry=registry)
    _append(mlp_store, (6, 7))
    decided = _plan(registry, "loss", mlp_store)
    from ckpt.engine.runner import run

    report = run("loss", mlp_store, registry=registry)
    assert (tuple(report.reused_steps), tuple(report.computed_steps)) == (decided.reused, decided.missing)


def test_a_run_opens_its_store_once_with_its_dependency(mlp_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """polca and the hessian-basis it requires: one Store in this process, refreshed, never reopened.

    On the threads scheduler the workers and the journal of the run share it too; the count is of
    real opens (``Store.__init__`` runs as it would, counted).
    """
    from ckpt.store.reader import Store

    opened: list[str] = []
    init = Store.__init__

    def counting(self: Store, *args: Any, **kwargs: Any) -> None:
        opened.append(str(args[0] if args else kwargs.get("path")))
        init(self, *args, **kwargs)

    monkeypatch.setattr(Store, "__init__", counting)
    result = ckpt.analyze("polca", mlp_store, progress=False)
    assert len(opened) == 1, opened
    assert result.ckpt.requires["hessian-basis"]["analyzer"] == "hessian-basis", "the dependency's, read back"
    opened.clear()
    ckpt.analyze("polca", mlp_store, progress=False)
    assert len(opened) == 1, "reused: one open to find it so"


def test_a_journal_reads_through_its_processs_worker_store(mlp_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a worker process (no engine run lending it a store) a journal refreshes the worker's store, never opens one.

    Without it every piece a task committed opened the store again.
    """
    import xarray as xr

    from ckpt.engine.resume import Journal
    from ckpt.engine.worker import TaskSpec, forget_worker, worker_for
    from ckpt.store.reader import Store

    spec = TaskSpec(str(mlp_store))
    worker_for(spec)  # what a task does first in its process
    opened: list[object] = []
    init = Store.__init__

    def counting(self: Store, *args: Any, **kwargs: Any) -> None:
        opened.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Store, "__init__", counting)
    journal = Journal(str(mlp_store), "result", "lca", "request")
    try:
        for step in (3, 1):
            piece = xr.Dataset({"value": (("step",), [float(step)])}, coords={"step": [step]})
            journal.add(piece, "step", [step])
        held = journal.pieces([[1], [2], [3]])
    finally:
        forget_worker(spec)
    assert held is not None and sorted(held[1]) == [0, 2], "both pieces committed and read back"
    assert opened == []
    journal.discard()
    assert len(opened) == 1, "with no worker in the process, it opens the store"

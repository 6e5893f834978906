"""The conformance kit for task plugins: subclass :class:`TaskTests` in your test suite.

It lives here, not in :mod:`ckpt.plugins.testing` with the other kits, because
it trains through the shared loop of :mod:`ckpt.sandboxes.base`, and the plugin
host does not import the sandboxes (imports point down). A test module names
the task and keeps the run tiny::

    from ckpt.sandboxes.testing import TaskTests

    import my_tasks

    class TestParity(TaskTests):
        name = "parity"
        plugin = my_tasks           # not needed once the package is installed
        options = {"steps": 2, "every": 1, "hidden": 4}

This module imports pytest, so import it from tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from ckpt import analyze
from ckpt.plugins import Task, load_registry
from ckpt.plugins.tasks import resolve_task
from ckpt.plugins.testing import RegisteredTests, check_description, check_store
from ckpt.sandboxes.base import train
from ckpt.store.format import FACTORY_RE

__all__ = ["TaskTests"]


class TaskTests(RegisteredTests):
    """Base class of a task's conformance tests (collected only through a ``Test*`` subclass).

    Set :attr:`name` (``ckpt train NAME``) and, while the package is not installed,
    :attr:`plugin`; see :class:`ckpt.plugins.testing.RegisteredTests`.

    Attributes
    ----------
    options
        Keyword arguments of :func:`ckpt.sandboxes.base.train` for a tiny run: the length
        (``steps``/``epochs``, default 2 steps), ``every`` (default 1) and task options.
    """

    kind = "tasks"
    options: ClassVar[dict[str, Any]] = {}

    # -- fixtures and helpers ---------------------------------------------------------------
    @pytest.fixture
    def task(self) -> Task:
        """The registered task (loaded when registered lazily; its plugin registered when not installed)."""
        return resolve_task(self.registered())

    def train_options(self) -> dict[str, Any]:
        """:attr:`options` over the defaults: two steps, a checkpoint after each, seed 0."""
        length = {} if {"steps", "epochs"} & set(self.options) else {"steps": 2}
        return {"every": 1, "seed": 0, **length, **self.options}

    def config(self, task: Task) -> dict[str, Any]:
        """The default preset with the task options of :attr:`options`."""
        spec = task.option_spec()
        return task.config("default", {key: value for key, value in self.options.items() if key in spec})

    @pytest.fixture
    def trained(self, task: Task, tmp_path: Path) -> Iterator[Path]:
        """A tiny run of the task (:meth:`train_options`); the worker caches are cleared afterwards."""
        from ckpt.engine.worker import clear_cache

        path = tmp_path / "run.zarr"
        train(task, path, **self.train_options())
        yield path
        clear_cache()

    # -- the tests ------------------------------------------------------------------------------
    def test_metadata(self, task: Task) -> None:
        """A :class:`ckpt.plugins.Task` with a description, a registered objective, a factory and complete presets."""
        assert isinstance(task, Task), f"{self.name!r} is a {type(task).__name__}, not a Task"
        check_description(task.description, f"task {self.name!r}")
        objectives = load_registry(extra=[self.plugin] if self.plugin else []).objectives
        # None: no per-datapoint objective (the checks that need one fail; opt them out)
        assert task.objective is None or task.objective in objectives, f"objective {task.objective!r} is not registered"
        assert FACTORY_RE.fullmatch(task.factory), f"factory {task.factory!r} is not a 'package.module:function'"
        assert "default" in task.presets, f"no 'default' preset: presets are {list(task.presets)}"
        for preset, values in task.presets.items():
            # an option whose default is None takes the preset's value: every preset must hold one
            unset = {key for key, option in task.option_spec().items() if option.default is None}
            missing = sorted(unset - set(values))
            assert not missing, f"preset {preset!r} has no value for the options {missing} (their default is None)"
            assert {"steps", "epochs"} & set(values), f"preset {preset!r} sets neither steps nor epochs"
            assert "every" in values, f"preset {preset!r} does not say how often to checkpoint (every)"

    def test_the_model_fits_the_data_and_objective(self, task: Task) -> None:
        """The model maps the test inputs to outputs with one finite loss per datapoint, and there is an eval split."""
        import torch

        assert task.objective is not None, "the task has no per-datapoint objective"
        config = self.config(task)
        data = task.make_data(config, 0)
        assert "eval" in data.splits, f"the splits {list(data.splits)} have no 'eval' (what analyzers read)"
        model = task.build_model(config)
        rows = slice(0, 8)
        mask = None if data.test_mask is None else data.test_mask[rows]
        with torch.no_grad():
            outputs = model(data.test_inputs[rows])
        losses = task.per_datapoint_loss(outputs, data.test_targets[rows], mask)
        objective = load_registry(extra=[self.plugin] if self.plugin else []).objectives[task.objective]
        targets = data.test_targets[rows].numpy()
        example, _ = objective.datapoints(targets, None if mask is None else mask.numpy())
        assert len(losses) == len(example) > 0, f"{len(losses)} losses for {len(example)} datapoints"
        assert torch.isfinite(losses).all(), "the untrained model's losses hold NaN or inf"

    def test_training_writes_a_verified_run(self, task: Task, trained: Path) -> None:
        """The run verifies and records the task's model spec, objective, checkpoints and eval split."""
        store = check_store(trained)
        config = self.config(task)
        assert store.model is not None, "the run records no model"
        assert store.model.factory == task.factory, f"the run records {store.model.factory!r}"
        assert store.model.config == task.model_config(config), "the run records another model config"
        assert store.objective == task.objective, f"the run records objective {store.objective!r}"
        assert len(store.steps) >= 2, f"{len(store.steps)} checkpoint(s): expected one per `every` steps and step 0"
        assert "eval" in store.splits, f"the run has no eval split: {list(store.splits)}"

    def test_its_runs_can_be_analyzed(self, trained: Path) -> None:
        """The ``loss`` analyzer rebuilds the model from the run and gives finite losses at every checkpoint."""
        result = analyze("loss", trained)
        losses = result["loss"].values
        assert losses.shape[0] == len(check_store(trained).steps)
        assert np.isfinite(losses).all(), "the loss analyzer found NaN or inf losses"

    def test_the_same_seed_trains_the_same_run(self, task: Task, trained: Path, tmp_path: Path) -> None:
        """A second run with the same seed holds the same weights (runs are reproducible)."""
        again = train(task, tmp_path / "again.zarr", **self.train_options())
        first = check_store(trained)
        assert [int(s) for s in again.steps] == [int(s) for s in first.steps]
        for step in first.steps:
            expected, actual = first.tensors(int(step)), again.tensors(int(step))
            for name, value in expected.items():
                np.testing.assert_array_equal(actual[name], value, err_msg=f"step {int(step)}, {name!r} differs")

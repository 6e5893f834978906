"""Training tasks (sandboxes) for ``ckpt train``: the :class:`Task` interface a task plugin implements.

A task defines its data, its model factory, its optimizer and its presets;
``ckpt train`` runs it with the shared training loop of :mod:`ckpt.sandboxes`,
which writes through the public store writer. This module imports no torch at
import time (only its methods do), so that listing tasks stays cheap; a plugin
whose task module is expensive to import registers a :class:`LazyTask`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ckpt.errors import AnalysisError, PluginError, TaskError
from ckpt.plugins.analyzer import Option, declared_options
from ckpt.plugins.manager import registry

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Dataset:
    """Training and test data of a run, and the splits stored with it.

    Attributes
    ----------
    train_inputs, train_targets, test_inputs, test_targets
        Tensors; ``train_mask``/``test_mask`` select the datapoints of token tasks.
    splits
        ``{split name: keyword arguments of Writer.add_data}``; ``"eval"`` is what
        analyzers evaluate on by default.
    """

    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor
    train_mask: torch.Tensor | None = None
    test_mask: torch.Tensor | None = None
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


class Task:
    """Base class of a training sandbox (a ``ckpt_register_tasks`` plugin).

    Subclasses set ``name``, ``description``, ``objective``, ``factory`` and
    ``presets`` (``"default"`` at least; ``"paper"`` for the paper's setting),
    declare task options as :class:`ckpt.plugins.Option` class attributes (``None``
    default = the preset's value), and implement :meth:`model_config`,
    :meth:`make_data` and :meth:`make_optimizer`.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    objective: ClassVar[str] = "cross-entropy"
    factory: ClassVar[str]
    """Model factory ``"package.module:function"`` recorded in the store."""
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    """Named settings; each holds every option plus ``steps`` (or ``epochs``), ``every``, ``batch_size``."""

    @classmethod
    def option_spec(cls) -> dict[str, Option]:
        """Task options, by name (CLI options of ``ckpt train TASK``)."""
        return declared_options(cls)

    def config(self, preset: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """The preset's settings overridden by the options given (``None`` = not given)."""
        if preset not in self.presets:
            msg = f"task {self.name!r} has no preset {preset!r}; presets: {', '.join(self.presets)}"
            raise TaskError(msg)
        spec = self.option_spec()
        unknown = sorted(set(options) - set(spec))
        if unknown:
            msg = f"task {self.name!r} has no option {unknown[0]!r}; its options are: {', '.join(spec)}"
            raise TaskError(msg)
        config = dict(self.presets[preset])
        for key, value in options.items():
            if value is not None:
                try:
                    config[key] = spec[key].convert(value, f"task {self.name!r}")
                except AnalysisError as exc:
                    raise TaskError(str(exc)) from None
        return config

    def model_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments of the model factory."""
        raise NotImplementedError

    def build_model(self, config: Mapping[str, Any]) -> torch.nn.Module:
        """The model, built through the recorded factory (what analyzers will rebuild)."""
        from ckpt.store.reader import ModelSpec

        return ModelSpec(self.factory, self.model_config(config)).build()

    def make_data(self, config: Mapping[str, Any], seed: int) -> Dataset:
        """Training and test data, and the splits to store."""
        raise NotImplementedError

    def grow(self, name: str, parent: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor | None:
        """Extend the parent's tensor ``name`` to the child's larger shape (``ckpt train --init-from``).

        A run initialised from another run copies every tensor by name; where a tensor's shape
        differs, the task decides whether it grew in a way it can extend (a token embedding
        gaining rows for new tokens) or the runs do not fit. The default grows nothing.

        Parameters
        ----------
        name
            The tensor's name (a ``state_dict`` key).
        parent
            The parent's tensor at the chosen step.
        fresh
            The child's freshly initialised tensor (the child's seed), of the child's shape.

        Returns
        -------
        torch.Tensor or None
            The child's tensor (``fresh``'s shape and dtype), or None when ``name`` cannot grow
            from ``parent``'s shape to ``fresh``'s.
        """
        return None

    def make_optimizer(self, model: torch.nn.Module, config: Mapping[str, Any]) -> tuple[torch.optim.Optimizer, Any]:
        """The optimizer and an optional learning-rate scheduler (stepped every step)."""
        raise NotImplementedError

    def steps_per_epoch(self, data: Dataset, config: Mapping[str, Any]) -> int:
        """Optimizer steps in one pass over the training data."""
        batch = config.get("batch_size")
        return 1 if not batch else math.ceil(len(data.train_inputs) / batch)

    def batches(self, data: Dataset, config: Mapping[str, Any], epoch: int, seed: int) -> Iterator[tuple]:
        """Minibatches ``(inputs, targets, mask)`` of one epoch, shuffled reproducibly by (seed, epoch)."""
        import torch

        batch = config.get("batch_size")
        n = len(data.train_inputs)
        if not batch:  # full batch
            yield data.train_inputs, data.train_targets, data.train_mask
            return
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch):
            rows = order[start : start + batch]
            mask = None if data.train_mask is None else data.train_mask[rows]
            yield data.train_inputs[rows], data.train_targets[rows], mask

    def per_datapoint_loss(self, outputs: torch.Tensor, targets: torch.Tensor, mask: Any) -> torch.Tensor:
        """The objective's per-datapoint losses (the same function analyzers use)."""
        return registry().objectives[self.objective].losses(outputs, targets, mask)

    def correct(self, outputs: torch.Tensor, targets: torch.Tensor, mask: Any) -> torch.Tensor:
        """Per-datapoint correctness (argmax == target), in the objective's datapoint order."""
        hits = outputs.argmax(-1) == targets
        return hits.flatten() if mask is None else hits[mask.bool()]

    def evaluate(self, model: torch.nn.Module, data: Dataset) -> dict[str, float]:
        """Loss and accuracy on the training and test data."""
        import torch

        metrics = {}
        with torch.no_grad():
            for part in ("train", "test"):
                inputs, targets = getattr(data, f"{part}_inputs"), getattr(data, f"{part}_targets")
                mask = getattr(data, f"{part}_mask")
                losses, hits = [], []
                for start in range(0, len(inputs), 4096):
                    rows = slice(start, start + 4096)
                    outputs = model(inputs[rows])
                    m = None if mask is None else mask[rows]
                    losses.append(self.per_datapoint_loss(outputs, targets[rows], m))
                    hits.append(self.correct(outputs, targets[rows], m))
                metrics[f"{part}_loss"] = float(torch.cat(losses).mean())
                metrics[f"{part}_accuracy"] = float(torch.cat(hits).float().mean())
        return metrics


class LazyTask:
    """A task registered by name, imported only when it is trained or its options are shown.

    ``ckpt train --help`` and ``ckpt plugins`` list tasks by name and description;
    importing every task module for that would import torch, the slowest import. Register
    ``LazyTask("addition", "pkg.tasks:Addition", "one line")`` and the class is
    imported and instantiated on first use.

    Parameters
    ----------
    name
        The task's name (what users type).
    target
        ``"package.module:Class"`` of a :class:`Task` subclass.
    description
        One line for listings (the class's own ``description`` once loaded).
    """

    def __init__(self, name: str, target: str, description: str) -> None:
        self.name = name
        self.target = target
        self.description = description
        self._task: Task | None = None

    def load(self) -> Task:
        """The task instance (imported and built on the first call)."""
        if self._task is None:
            module_name, _, attr = self.target.partition(":")
            task = getattr(importlib.import_module(module_name), attr)()
            if not isinstance(task, Task):
                msg = f"task {self.name!r} ({self.target}) is not a ckpt.plugins.Task and cannot be trained"
                raise PluginError(msg)
            self._task = task
        return self._task

    def __repr__(self) -> str:
        return f"LazyTask({self.name!r}, {self.target!r})"


def resolve_task(task: Any) -> Task:
    """The :class:`Task` behind a registered task (loading a :class:`LazyTask`)."""
    if isinstance(task, LazyTask):
        return task.load()
    if not isinstance(task, Task):
        msg = f"{task!r} is not a ckpt.plugins.Task and cannot be trained"
        raise PluginError(msg)
    return task


__all__ = ["Dataset", "LazyTask", "Task", "resolve_task"]

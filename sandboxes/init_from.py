"""Initialising a run from another run's checkpoint (``ckpt train TASK DEST --init-from SRC.zarr[@STEP]``).

The child's model is built and seeded as usual; then every tensor is replaced by the parent's of
the same name at the chosen step, bit for bit. A tensor whose shape differs is extended only when
the task declares how (:meth:`ckpt.plugins.Task.grow`: the sparse-modular-addition embedding gains
rows when p grows); anything else that does not match is one :class:`~ckpt.errors.TaskError` naming
every such tensor, raised before DEST is created. The optimizer starts fresh (its state is not
stored) and the child's schedules start at step 0.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import torch

import ckpt.store as ckptstore
from ckpt.errors import CkptError, TaskError
from ckpt.plugins import Task
from ckpt.store.lineage import Parent, parent_location

_AT_STEP = re.compile(r"(?P<path>.+)@(?P<step>[^/@]*)")
LISTED_STEPS = 20
"""A missing ``@STEP`` lists the parent's steps; beyond this many, the first and last ten."""


def split_source(source: str | os.PathLike[str]) -> tuple[str, int | None]:
    """``"SRC.zarr@STEP"`` -> ``("SRC.zarr", STEP)``; ``"SRC.zarr"`` -> ``("SRC.zarr", None)`` (the last step).

    A path that exists as given is never split, so a folder with ``@`` in its name still works.
    """
    text = str(source)
    match = _AT_STEP.fullmatch(text)
    if match is None or os.path.exists(text):
        return text, None
    step = match["step"]
    if not step.isdigit():
        msg = f"--init-from {text}: the step after '@' must be a checkpoint step (a non-negative integer), got {step!r}"
        raise TaskError(msg)
    return match["path"], int(step)


def _steps_listed(steps: list[int]) -> str:
    if len(steps) <= LISTED_STEPS:
        return ", ".join(map(str, steps))
    half = LISTED_STEPS // 2
    return f"{', '.join(map(str, steps[:half]))}, ... ({len(steps) - LISTED_STEPS} more) ..., " + ", ".join(
        map(str, steps[-half:])
    )


@dataclass
class ParentCheckpoint:
    """The parent store and the checkpoint a child starts from."""

    store: ckptstore.Store
    step: int
    source: str

    def record(self, grown: list[str]) -> Parent:
        """What the child records of it (``attrs["ckpt"]["parent"]``)."""
        digest = self.store.checkpoint_digest(self.step)
        return Parent(parent_location(self.store.path), self.step, digest, tuple(grown))


def open_parent(source: str | os.PathLike[str]) -> ParentCheckpoint:
    """Open the parent named by ``--init-from`` and check its step (never guessed).

    Raises
    ------
    TaskError
        When ``source`` is not a readable store, has no checkpoints, or has no checkpoint at the
        step named (the message lists the steps it has).
    """
    where, step = split_source(source)
    try:
        store = ckptstore.open(where)
    except CkptError as exc:
        raise TaskError(f"--init-from {source}: {exc}") from None
    steps = store.steps.tolist()
    if not steps:
        raise TaskError(f"--init-from {source}: {where} has no checkpoints to start from")
    if step is None:
        step = steps[-1]
    elif step not in store:
        msg = (
            f"--init-from {source}: {where} has no checkpoint at step {step}; its steps are {_steps_listed(steps)} "
            f"(write {where}@STEP with one of them, or {where} alone for the last)"
        )
        raise TaskError(msg)
    return ParentCheckpoint(store, int(step), str(source))


def initial_state(task: Task, model: torch.nn.Module, parent: ParentCheckpoint) -> tuple[dict[str, Any], list[str]]:
    """The child's first ``state_dict``: the parent's tensors by name, grown where the task says so.

    Returns
    -------
    state, grown
        The state to load into ``model`` and the names of the tensors that were grown.

    Raises
    ------
    TaskError
        One message naming every tensor that does not fit: missing from the parent, only in the
        parent, or of another shape or dtype that the task does not grow.
    """
    fresh = model.state_dict()
    schema = parent.store.schema
    missing = [name for name in fresh if name not in schema]
    extra = [name for name in schema if name not in fresh]
    tensors = parent.store.tensors(parent.step, [n for n in fresh if n in schema], framework="torch")
    state: dict[str, Any] = {}
    grown: list[str] = []
    differ: list[str] = []
    for name, tensor in tensors.items():
        mine = fresh[name]
        if tensor.shape == mine.shape and tensor.dtype == mine.dtype:
            state[name] = tensor
            continue
        extended = task.grow(name, tensor, mine)
        if extended is None or extended.shape != mine.shape or extended.dtype != mine.dtype:
            differ.append(
                f"{name} (parent {tuple(tensor.shape)} {_dtype(tensor)}, child {tuple(mine.shape)} {_dtype(mine)})"
            )
            continue
        state[name] = extended
        grown.append(name)
    problems = [
        f"{label}: {', '.join(names)}"
        for label, names in (
            ("missing in the parent", missing),
            ("only in the parent", extra),
            ("not growable by the task", differ),
        )
        if names
    ]
    if problems:
        spec = parent.store.model
        held = f" (a run of {spec.factory} {spec.config})" if spec is not None else ""
        msg = (
            f"--init-from {parent.source}: the parent{held} does not fit task {task.name!r} with these options: "
            f"{'; '.join(problems)}; give the child the parent's model options, or start from a run of this task"
        )
        raise TaskError(msg)
    return state, grown


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


__all__ = ["LISTED_STEPS", "ParentCheckpoint", "initial_state", "open_parent", "split_source"]

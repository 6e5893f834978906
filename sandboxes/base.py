"""The training loop every sandbox task shares (the :class:`ckpt.plugins.Task` interface is in the plugin host).

A task defines its data, its model factory, its optimizer and its presets;
:func:`train` runs an ordinary PyTorch loop and writes checkpoints, metrics and
the evaluation data through the public ckpt.store writer, exactly as a user's
own training code would. The sandboxes are clients of the store, not special
cases inside it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

import ckpt.store as ckptstore
from ckpt.engine.worker import resolve_device
from ckpt.errors import TaskError
from ckpt.plugins import Dataset, Task
from ckpt.plugins.tasks import LazyTask, resolve_task
from ckpt.sandboxes.init_from import initial_state, open_parent
from ckpt.store.format import current_factory


def checkpoint_steps(total: int, every: int, log_spaced: bool) -> list[int]:
    """Steps at which to checkpoint: 0, every ``every`` steps, the last, and dense early ones if asked."""
    steps = set(range(0, total + 1, max(1, every))) | {0, total}
    if log_spaced and total > 1:
        steps |= {int(s) for s in np.unique(np.round(np.logspace(0, np.log10(total), 40)).astype(int))}
    return sorted(s for s in steps if 0 <= s <= total)


def cpu_kernels(device: str) -> str | None:
    """``"<capability>/<threads> threads"`` of torch's CPU kernels for a CPU run, None on other devices.

    Recorded in the store's attrs: the same seed trains other weights with other
    kernels or thread counts (:mod:`ckpt.sandboxes.reproducible`).
    """
    if _device(device).type != "cpu":
        return None
    return f"{torch.backends.cpu.get_cpu_capability()}/{torch.get_num_threads()} threads"


def _device(device: str) -> torch.device:
    return torch.device(resolve_device(device, TaskError))


SMALL_MODEL_PARAMETERS = 20_000
"""Below this many parameters a CPU run trains on one torch thread (see :func:`_threads_for`)."""


@contextlib.contextmanager
def _threads_for(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Train a small model on one CPU thread; restore torch's thread count afterwards.

    The sandboxes' models are tiny (a few hundred to a few ten thousand
    parameters): each op is far too small to split across threads, so torch's
    default of one thread per core only adds synchronisation, and on a loaded
    machine every step waits for the slowest core: one thread trained the small
    sandboxes many times faster. The ``addition`` default model (102k parameters,
    batch 128 x 11 tokens) is large enough to gain from more threads, hence the
    20k-parameter bound (docs/performance.md, "Sandbox training").
    """
    previous = torch.get_num_threads()
    small = device.type == "cpu" and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(previous)


def learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate the optimizer's next step uses: its first parameter group's.

    Recorded as the ``lr`` metric at every checkpoint, after the scheduler has
    stepped, so it is the rate in force from that checkpoint on (what
    ``normalization`` and ``curvature`` compare with). Tasks whose groups differ
    record the first group's.
    """
    return float(optimizer.param_groups[0]["lr"])


def _to(data: Dataset, device: torch.device) -> Dataset:
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(data).items() if k != "splits"}
    return Dataset(**moved, splits=data.splits)


def _check_same_run(stored: ckptstore.Store, task: Task, model_config: Mapping[str, Any], where: Any) -> None:
    """Refuse to resume a store written by another task or model (before it is opened for writing)."""
    spec = stored.model
    recorded = None if spec is None else (current_factory(spec.factory), spec.config)
    if recorded != (current_factory(task.factory), dict(model_config)):
        held = "no model spec" if spec is None else f"the model {spec.factory} {spec.config}"
        msg = (
            f"{where} holds a run of {held}, not of task {task.name!r} ({task.factory} {dict(model_config)}); "
            "--resume continues a run with the same task, preset and options"
        )
        raise TaskError(msg)


def create_task_store(
    task: Task,
    path: str | os.PathLike[str],
    config: Mapping[str, Any],
    data: Dataset,
    *,
    attrs: Mapping[str, Any],
    **options: Any,
) -> ckptstore.Writer:
    """A new store for a run of ``task`` with ``config``: its model spec, objective and ``data``'s splits.

    ``options`` are :func:`ckpt.store.create`'s (``parent``, ``overwrite`` ...).
    """
    writer = ckptstore.create(
        path,
        model=task.factory,
        config=task.model_config(config),
        objective=task.objective,
        framework="torch",
        attrs=attrs,
        **options,
    )
    for split, arrays in data.splits.items():
        writer.add_data(split, **arrays)
    return writer


def train(
    task: Task | LazyTask,
    store: str | os.PathLike[str],
    *,
    preset: str = "default",
    steps: int | None = None,
    epochs: int | None = None,
    every: int | None = None,
    log_spaced: bool = False,
    seed: int = 0,
    device: str = "cpu",
    resume: bool = False,
    init_from: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **options: Any,
) -> ckptstore.Store:
    """Train ``task`` and record the run in ``store``.

    Parameters
    ----------
    task
        The sandbox (a registered :class:`ckpt.plugins.tasks.LazyTask` is loaded).
    store
        Path of the store to create (or, with ``resume``, to continue).
    preset
        Named settings (``"default"``, ``"paper"`` ...).
    steps, epochs
        Length of the run in optimizer steps or in epochs (default: the preset's).
    every
        Checkpoint every this many steps (default: the preset's).
    log_spaced
        Add ~40 log-spaced checkpoints, dense early in the run.
    seed
        Seeds data, initialisation and batch order.
    device
        ``"cpu"``, ``"cuda"`` or ``"auto"``.
    resume
        Continue an existing store from its last checkpoint (the optimizer
        state is not stored: Adam's moments restart from zero).
    init_from
        ``"PARENT.zarr"`` or ``"PARENT.zarr@STEP"``: start from that run's checkpoint (its last
        by default) instead of a fresh initialisation; tensors are copied by name, grown where
        the task declares it (:meth:`ckpt.plugins.Task.grow`), and the parent (path, step,
        checkpoint digest) is recorded in the new store. The optimizer starts fresh and every
        schedule starts at step 0. Not with ``resume``.
    progress
        Show a progress bar.
    **options
        Task options overriding the preset.

    Returns
    -------
    ckptstore.Store
        The store, read-only.
    """
    from tqdm import tqdm

    task = resolve_task(task)
    if steps is not None and epochs is not None:
        raise TaskError("give --steps or --epochs, not both")
    if resume and init_from is not None:
        msg = (
            "give --resume or --init-from, not both: --init-from starts a new STORE from a parent run; "
            "--resume continues an existing STORE (a child keeps its parent)"
        )
        raise TaskError(msg)
    config = task.config(preset, options)
    if steps is not None and int(config.get("steps") or 0) < steps:
        # tasks that size their training data by the run's length (addition draws steps * batch
        # fresh problems) draw enough for this one, instead of repeating the preset's
        config["steps"] = steps
    target = _device(device)
    torch.manual_seed(seed)
    data = task.make_data(config, seed)
    model = task.build_model(config).to(target)
    per_epoch = task.steps_per_epoch(data, config)
    if steps is None:
        epochs = epochs if epochs is not None else config.get("epochs")
        steps = epochs * per_epoch if epochs is not None else int(config["steps"])
    every = every or int(config.get("every") or per_epoch)
    schedule = checkpoint_steps(steps, every, log_spaced)
    attrs = {"task": task.name, "preset": preset, "seed": seed, "steps": steps, "config": config}
    with _threads_for(model, target):  # the kernels and threads the loop below runs with
        kernels = cpu_kernels(device)
    if kernels is not None:
        attrs["cpu_kernels"] = kernels
    if resume:
        _check_same_run(ckptstore.open(store), task, task.model_config(config), store)
        writer = ckptstore.open(store, mode="a")
        start = 0 if writer.last_step is None else writer.last_step
        if writer.last_step is not None:
            model.load_state_dict(writer.reader().tensors(start, framework="torch", device=target))
    else:
        if os.path.exists(store):
            msg = f"{store} already exists; pass --resume to continue that run, or choose another path"
            raise TaskError(msg)
        parent = None
        if init_from is not None:  # every check before the store is created: a refusal writes nothing
            source = open_parent(init_from)
            state, grown = initial_state(task, model, source)
            model.load_state_dict(state)
            parent = source.record(grown)
        writer = create_task_store(task, store, config, data, attrs=attrs, parent=parent)
        start = 0
    data = _to(data, target)
    optimizer, scheduler = task.make_optimizer(model, config)
    if scheduler is not None and start:
        # Fast-forward the schedule to where the run left it: `start` scheduler steps give
        # the learning rate an uninterrupted run has at step `start` (tests/test_sandbox_base.py
        # compares every step's rate). torch warns because no optimizer step came first, which
        # matters in a training loop (it skips the schedule's first value) but not here, where
        # the optimizer has yet to take its first step of this session.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)`", UserWarning)
            for _ in range(start):
                scheduler.step()
    pending = [s for s in schedule if s > start or (s == 0 and writer.last_step is None)]
    with (
        _threads_for(model, target),
        writer,
        tqdm(total=steps - start, desc=task.name, unit="step", disable=not progress or None) as bar,
    ):
        step = start
        epoch = step // per_epoch
        if pending and pending[0] == step:
            model.eval()
            writer.write(step, model, metrics=task.evaluate(model, data) | {"lr": learning_rate(optimizer)})
            pending.pop(0)
        skip = step - epoch * per_epoch  # a resumed run continues inside its epoch
        while step < steps:
            for inputs, targets, mask in task.batches(data, config, epoch, seed):
                if skip:
                    skip -= 1
                    continue
                if step >= steps:
                    break
                model.train()
                loss = task.per_datapoint_loss(model(inputs), targets, mask).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step += 1
                bar.update(1)
                if pending and pending[0] == step:
                    model.eval()
                    writer.write(step, model, metrics=task.evaluate(model, data) | {"lr": learning_rate(optimizer)})
                    pending.pop(0)
            epoch += 1
    return ckptstore.open(store)


__all__ = ["SMALL_MODEL_PARAMETERS", "checkpoint_steps", "cpu_kernels", "create_task_store", "train"]

"""The worker side of an analysis: what a task function gets, cached per worker.

Task functions receive a :class:`Worker`. It opens the store, rebuilds the
model from the store's model spec and loads the evaluation data *on the
worker*, once per process (the model once per thread: ``functional_call``
swaps a module's parameters while it runs, so threads must not share one).
Tasks therefore ship only a :class:`TaskSpec` (paths and names), never tensors.

Memory. A model's activations are what a task holds most of (the logits of a
language model alone: examples x tokens x vocabulary floats), so threads of one
process run their model computations (:meth:`Worker.computing`) only as many at
a time as the cores can run torch's intra-op threads: with torch using every
core, one at a time, while the other threads read their next checkpoint. The
per-thread model holds no weights of its own (:meth:`Worker.model_for`): every
call supplies the checkpoint's tensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from ckpt.errors import AnalysisError, StepNotFoundError
from ckpt.numerics.derivatives import cast_floating
from ckpt.numerics.weightless import weightless_model
from ckpt.plugins.manager import registry
from ckpt.runtime import collection_paused, release_freed_memory

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store import Store


def utc_timestamp() -> str:
    """Now, as the ``created`` of a result's provenance (``...Z``): :func:`ckpt.store.provenance.utc_now`."""
    from ckpt.store.provenance import utc_now

    return utc_now()


@dataclass(frozen=True)
class TaskSpec:
    """What a worker needs to set itself up: paths and names, never tensors (cheap to ship)."""

    store: str
    device: str = "cpu"
    storage_options: Mapping[str, Any] | None = None
    generation: str = ""
    """Which state of the store a worker may cache against (its creation time and history length):
    a store replaced (``--overwrite``) or repaired (rows moved) since gets fresh workers."""
    max_memory: int | None = None
    """Bytes this run may use on one machine (``--max-memory``); None: the worker's
    :func:`ckpt.engine.memory.default_budget`."""
    tasks: int = 1
    """Tasks that run at the same time on one machine, sharing ``max_memory``."""
    progress: bool = False
    """Whether long tasks report their progress on stderr (``--progress``)."""


DEVICE_PATTERN = r"auto|cpu|mps|cuda(:\d+)?"
"""The devices ckpt computes on (``--device``)."""


def resolve_device(device: str, error: type[Exception] = AnalysisError) -> str:
    """The torch device ``device`` names (``auto``: CUDA when torch sees one), or ``error`` saying what to pass.

    Checked before anything runs, so that a wrong ``--device`` is one line, not a
    traceback from inside a Dask task (or no message at all when every result is reused).
    """
    import re

    if not isinstance(device, str) or not re.fullmatch(DEVICE_PATTERN, device):
        msg = f"--device must be auto, cpu, cuda, cuda:N or mps, got {device!r}"
        raise error(msg)
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        msg = f"--device {device} was asked for but torch sees no CUDA device; use --device cpu or auto"
        raise error(msg)
    if device.startswith("cuda:") and int(device.split(":")[1]) >= torch.cuda.device_count():
        msg = f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        raise error(msg)
    if device == "mps" and not torch.backends.mps.is_available():
        msg = "--device mps was asked for but torch sees no MPS device; use --device cpu or auto"
        raise error(msg)
    return device


_lent: dict[tuple[str, str], Store] = {}
"""The stores an engine run in this process lends its workers and journals, by path and storage options."""
_lent_lock = threading.Lock()


def _store_key(where: str, storage_options: Mapping[str, Any] | None) -> tuple[str, str]:
    return str(where), json.dumps(dict(storage_options or {}), sort_keys=True, default=str)


@contextlib.contextmanager
def lend_store(store: Store, storage_options: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Within: this process's workers and journals of ``store``'s path use ``store`` instead of opening it.

    The engine opens a store once per run; a worker in the same process (the threads and sync
    schedulers) reads through that one :class:`~ckpt.store.Store`, refreshing it where it must see
    a later commit, as it refreshes one of its own. Workers in other processes open their own.
    """
    key = _store_key(store.path, storage_options)
    with _lent_lock:
        previous = _lent.get(key)
        _lent[key] = store
    try:
        yield
    finally:
        with _lent_lock:
            if previous is None:
                _lent.pop(key, None)
            else:
                _lent[key] = previous


def open_store(where: str, storage_options: Mapping[str, Any] | None = None, *, fresh: bool = False) -> Store:
    """The store an engine run lent this process for ``where`` (refreshed with ``fresh``), else one opened now.

    With ``fresh`` (a journal's reads, in whichever process its tasks run), a worker's store of
    ``where`` in this process is taken too: a worker process opens the store once, not per piece.
    """
    key = _store_key(where, storage_options)
    with _lent_lock:
        lent = _lent.get(key)
    if lent is None and fresh:
        with _process_lock:  # a Worker is made under it, and opens its store with fresh=False
            held = [w for s, w in _workers.items() if _store_key(s.store, s.storage_options) == key]
        lent = held[-1].store if held else None
    if lent is None:
        import ckpt.store

        return ckpt.store.open(where, storage_options=dict(storage_options or {}) or None)
    if fresh:
        lent.refresh()
    return lent


_process_lock = threading.Lock()
_workers: dict[TaskSpec, Worker] = {}
_thread_state = threading.local()
_slots: dict[str, threading.BoundedSemaphore] = {}


def concurrent_computations(device: str) -> int:
    """How many model computations the threads of one process run at once on ``device``.

    On the CPU, as many as the cores can run with torch's intra-op threads each
    (``cpu_count // torch.get_num_threads()``, at least 1): more would not be
    faster, only hold more activations: two checkpoints at once nearly
    doubled ``loss``'s and ``grad-norms``' peak memory against a plain PyTorch loop
    and took no less time (``bench/loss_memory.py --size M``; docs/performance.md,
    "Concurrent computations"). Processes started with ``OMP_NUM_THREADS=1``
    keep one computation per core. On a GPU, one.
    """
    if device != "cpu":
        return 1
    with collection_paused():  # torch's first import, often: see ckpt.runtime
        import torch

    return max(1, (os.cpu_count() or 1) // max(1, torch.get_num_threads()))


_stopping = threading.Event()
"""Set when a run is interrupted (Ctrl-C): this process's queued and running tasks stop at their next check."""


class TasksStopped(KeyboardInterrupt):
    """Raised in a task of a run that was interrupted; a KeyboardInterrupt, so nothing catches it as an error."""


def stop_tasks() -> None:
    """Make every task of this process stop at its next check (a read, a computation slot, a progress step).

    Why: on Ctrl-C the main thread leaves ``compute()`` at once, but the thread pool's
    ``atexit`` shutdown then runs every task already queued. On a GPU, with one
    computation at a time and a thread per core, that was a queued POLCA checkpoint per
    core: ``ckpt demo`` printed "Error: aborted" and went on computing until it was
    killed (docs/performance.md, "Concurrent computations").
    """
    _stopping.set()


def allow_tasks() -> None:
    """Let tasks run again (the engine calls it when a run starts)."""
    _stopping.clear()


def check_stopped() -> None:
    """Raise :class:`TasksStopped` if the run was interrupted; call it between units of a long task."""
    if _stopping.is_set():
        raise TasksStopped("the run was interrupted")


def _slot(device: str) -> threading.BoundedSemaphore:
    with _process_lock:
        slot = _slots.get(device)
        if slot is None:
            slot = _slots[device] = threading.BoundedSemaphore(concurrent_computations(device))
    return slot


def objective_for(store: Store, name: str | None = None) -> Any:
    """The registered objective ``name`` (default: the one the store names)."""
    name = name or store.objective
    if name is None:
        msg = f"{store.path} names no objective; pass --objective (e.g. cross-entropy, token-cross-entropy)"
        raise AnalysisError(msg)
    objectives = registry().objectives
    if name not in objectives:
        msg = f"unknown objective {name!r}; registered objectives: {', '.join(sorted(objectives))}"
        raise AnalysisError(msg)
    return objectives[name]


def datapoint_index(store: Store, split: str, objective: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(example, position) of every datapoint of ``split`` under the objective, row-major."""
    data = store.data(split)
    targets = data["targets"].values if "targets" in data else data["inputs"].values
    mask = data["mask"].values if "mask" in data else None
    return objective_for(store, objective).datapoints(targets, mask)


def _widened(tensor: Any) -> Any:
    """``tensor`` in float32 when it is a floating-point type narrower than float32, else as it is."""
    import torch

    if tensor.is_floating_point() and torch.finfo(tensor.dtype).bits < 32:
        return tensor.float()
    return tensor


def worker_for(spec: TaskSpec) -> Worker:
    """The cached :class:`Worker` of this process for ``spec``."""
    worker = _workers.get(spec)
    if worker is None:
        with _process_lock:
            worker = _workers.get(spec)
            if worker is None:
                worker = _workers[spec] = Worker(spec)
    return worker


def forget_worker(spec: TaskSpec) -> None:
    """Drop this process's :class:`Worker` for ``spec`` and what it cached (the end of a run).

    Why: a default budget is measured when each run starts, so nearly every run has a spec of its
    own, and its worker stayed in this process with the checkpoints, data and basis it had loaded:
    four in-process ``grad-norms`` runs of a 1.7M-parameter GPT-2 left four workers holding 13 MiB
    of checkpoints each. On a GPU those are device memory (two checkpoints, 1 GB at GPT-2 small;
    a POLCA basis K·4·D bytes), held by a notebook or a test process after its analysis returned.
    """
    with _process_lock:
        _workers.pop(spec, None)


def clear_cache() -> None:
    """Forget every cached worker, model and dataset of this process (tests, long sessions)."""
    with _process_lock:
        _workers.clear()
        _slots.clear()
    _thread_state.__dict__.clear()


class _StoppableBar(tqdm):
    """A progress bar whose every step checks for an interrupted run (a pass, a product: seconds at most)."""

    def update(self, n: float | None = 1) -> bool | None:
        check_stopped()
        return super().update(n)


class Worker:
    """Access to one store from a task: tensors, the model, the data, per-datapoint losses."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.device = spec.device
        self._store = open_store(spec.store, spec.storage_options)
        self._lock = threading.Lock()
        self._making: dict[tuple[int, Any], threading.RLock] = {}  # a lock for each value being made
        self._data: dict[str, dict[str, Any]] = {}
        self._params: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._cache: OrderedDict[Any, Any] = OrderedDict()
        self._recent: OrderedDict[Any, Any] = OrderedDict()
        self._models: dict[tuple[int, str], Any] = {}  # (thread, dtype) -> that thread's model

    @property
    def store(self) -> Store:
        """The store, read-only."""
        return self._store

    @property
    def memory_budget(self) -> int:
        """Bytes one task may use (``--max-memory`` shared by the tasks running at once): size blocks to it."""
        from ckpt.engine.memory import default_budget

        total = self.spec.max_memory if self.spec.max_memory is not None else default_budget(self.device)
        return max(1, total // max(1, self.spec.tasks))

    def _ensure_step(self, step: int) -> None:
        # a dict lookup per task: building a set of all steps here was O(T) per task
        if step not in self._store:
            with self._lock:
                self._store.refresh()  # committed after this worker opened the store
        if step not in self._store:
            msg = f"step {step} is not a committed checkpoint of {self._store.path}"
            raise StepNotFoundError(msg)

    def tensors(self, step: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The checkpoint's tensors as numpy arrays."""
        check_stopped()
        self._ensure_step(step)
        return self._store.tensors(step, names)

    def params(self, step: int, *, alone: bool = False) -> dict[str, Any]:
        """The checkpoint's tensors as torch tensors on the worker's device (last 2 steps cached).

        Half-precision tensors (bfloat16, float16, float8: mixed-precision checkpoints) come in
        float32, the precision analyzers compute in unless their ``--dtype`` says otherwise: a
        bfloat16 weight against the float32 model and inputs would not even multiply.

        ``alone``: first drop every other cached checkpoint, for a task that uses one checkpoint
        and fills the memory budget around it (hessian-basis). Two are cached for the tasks of
        pairs of checkpoints; a search at the next basis checkpoint never reads the previous one,
        which otherwise stays in memory through every product of the search.
        """
        if alone:
            with self._lock:
                for other in [key for key in self._params if key != step]:
                    del self._params[other]

        def load() -> dict[str, Any]:
            check_stopped()
            self._ensure_step(step)
            tensors = self._store.tensors(step, device=self.device)
            return {name: _widened(tensor) for name, tensor in tensors.items()}

        return self._least_recently_used(self._params, step, load, keep=2)

    def progress_bar(self, description: str, *, unit: str, total: int | None = None, postfix: str = "") -> Any:
        """A ``tqdm`` bar on stderr for a long task (a context manager), shown only with ``--progress``.

        The bars of one run's tasks say what each task is doing (``hessian-basis step 400``) and
        how it was planned (``postfix``: its memory plan).
        """
        return _StoppableBar(total=total, desc=description, unit=unit, disable=not self.spec.progress, postfix=postfix)

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Hold one of the process's computation slots of the device while the block runs.

        Wrap a task's forward and backward passes in it, after loading what the
        task reads (:meth:`params`), so that another thread reads its checkpoint
        while this one computes, but no more computations hold activations at
        once than :func:`concurrent_computations` (one, on a CPU whose cores torch
        already uses). Re-entrant within a thread. Take it outside
        ``FORWARD_AD_LOCK``, never inside it.
        """
        if getattr(_thread_state, "computing", False):
            yield
            return
        check_stopped()
        slot = _slot(self.device)
        with slot:
            check_stopped()  # interrupted while this thread waited its turn
            _thread_state.computing = True
            try:
                yield
            finally:
                _thread_state.computing = False
                if self.device == "cpu":
                    release_freed_memory()

    @property
    def model(self) -> Any:
        """The model rebuilt from the store's spec, in eval mode on the device (one per thread)."""
        return self.model_for()

    def model_for(self, dtype: Any = None) -> Any:
        """The model (as :attr:`model`), with its floating-point tensors in ``dtype`` when given.

        Analyzers that compute in double precision need the module's own
        (non-checkpointed) buffers in float64 too, so each dtype gets its copy.

        The model's parameters keep their shape and dtype but no memory (a single
        element, expanded; built without weights, :mod:`ckpt.numerics.weightless`):
        every computation supplies them (``functional_call`` with :meth:`params`).
        A module's own randomly initialised copy was never read, and it cost a full
        set of weights per thread and dtype (110 MB at 27M parameters) and, at GPT-2
        small, seconds of random numbers. Writing into them (``load_state_dict``)
        fails loudly; evaluate functionally instead. A parameter the checkpoints
        do not hold is an :class:`~ckpt.errors.AnalysisError`.
        """
        # one per thread: a functional call swaps the module's parameters, so threads cannot share one;
        # kept by the worker (not the thread), so that a forgotten worker takes its models along
        models = self._models
        key = (threading.get_ident(), str(dtype))
        model = models.get(key)
        if model is None:
            spec = self._store.model
            if spec is None:
                msg = f"{self._store.path} records no model spec; create it with model='package.module:factory'"
                raise AnalysisError(msg)
            stored = set(self._store.schema)
            where = str(self._store.path)
            model = weightless_model(spec.build, stored, self.device, dtype, source=where, selection=spec.selection)
            model = model.to(self.device).eval()
            if dtype is not None:
                model = model.to(dtype)
            models[key] = model
        return model

    def cached(self, key: Any, factory: Any) -> Any:
        """``factory()``, computed once per worker process for ``key`` (e.g. a basis read from the store).

        Parameters
        ----------
        key
            Hashable; include whatever identifies the value (a result's creation time).
        factory
            Called without arguments when ``key`` is not cached.
        """
        return self._made_once(self._cache, key, factory)

    def held(self, key: Any) -> Any:
        """The value :meth:`cached` holds for ``key``, or None; nothing is made."""
        with self._lock:
            return self._cache.get(key)

    def recent(self, key: Any, factory: Any, keep: int = 4) -> Any:
        """``factory()``, reused while ``key`` is among the ``keep`` most recently used keys of this worker.

        For values worth keeping a short while but too many to keep all: a pair
        analyzer's per-checkpoint terms, needed again by the next block of steps
        (blocks are committed every few seconds, so without this each block
        recomputed its first checkpoint: 74 instead of 51 checkpoint passes for
        POLCA on the addition demo run).
        """
        return self._least_recently_used(self._recent, key, factory, keep)

    def _least_recently_used(self, cache: OrderedDict[Any, Any], key: Any, factory: Any, keep: int) -> Any:
        """``cache[key]``, made by ``factory()`` when missing; ``cache`` keeps its ``keep`` most recently used."""
        return self._made_once(cache, key, factory, keep)

    def _made_once(self, cache: OrderedDict[Any, Any], key: Any, factory: Any, keep: int | None = None) -> Any:
        """``cache[key]``, made by one ``factory()`` call however many threads ask for it at once.

        Why: every thread of a run starts by asking for the same things (the basis, the first
        checkpoints). Each used to make its own: a read of the POLCA basis per thread, each then
        copied to the GPU. The others now wait for the first.
        """
        with self._lock:
            if key in cache:
                if keep is not None:
                    cache.move_to_end(key)
                return cache[key]
            making = self._making.setdefault((id(cache), key), threading.RLock())
        with making:
            with self._lock:
                if key in cache:  # made by the thread this one waited for
                    return cache[key]
            try:
                value = factory()
                with self._lock:
                    cache[key] = value
                    while keep is not None and len(cache) > keep:
                        cache.popitem(last=False)
            finally:
                with self._lock:
                    self._making.pop((id(cache), key), None)
        return value

    def analysis(self, name: str) -> Any:
        """A stored analysis result (lazy), re-reading the commit record when it is not visible yet."""
        if name not in self._store.analyses:
            with self._lock:
                self._store.refresh()
        return self._store.analysis(name)

    def data(self, split: str) -> dict[str, Any]:
        """The split's ``inputs``, ``targets`` and ``mask`` as torch tensors on the device."""
        with self._lock:
            cached = self._data.get(split)
        if cached is None:
            import torch

            dataset = self._store.data(split)
            cached = {
                name: torch.from_numpy(np.ascontiguousarray(dataset[name].values)).to(self.device)
                for name in ("inputs", "targets", "mask")
                if name in dataset
            }
            with self._lock:
                self._data[split] = cached
        return cached

    def objective(self, name: str | None = None) -> Any:
        """The objective (per-datapoint loss) registered as ``name``, default the store's."""
        return objective_for(self._store, name)

    def outputs(self, params: Mapping[str, Any], inputs: Any, *, dtype: Any = None) -> Any:
        """The model's outputs with ``params`` (functional: the module's own weights are unused).

        Parameters
        ----------
        params
            Every tensor of the checkpoint, as :meth:`params` gives them (some may be replaced,
            e.g. by copies that require gradients). The module's own stand-ins hold no values,
            so a tensor left out would be computed with as zeros: that is an error.
        inputs
            A batch of the split's ``inputs`` (:meth:`data`).
        dtype
            A torch floating-point dtype to compute in (``torch.float64``): the floating-point
            ``params`` and ``inputs`` are cast to it and the model of :meth:`model_for` runs.
            None: as given, with :attr:`model`.

        Raises
        ------
        AnalysisError
            When ``params`` lacks a tensor of the checkpoints.
        """
        from torch.func import functional_call

        missing = [name for name in self._store.schema if name not in params]
        if missing:
            msg = (
                f"worker.outputs got no tensor {missing[0]!r} ({len(missing)} of the checkpoint's are missing): "
                "pass every tensor of worker.params(step), replacing those you differentiate, never a subset"
            )
            raise AnalysisError(msg)
        if dtype is None:
            return functional_call(self.model, dict(params), (inputs,))
        params = {name: cast_floating(value, dtype) for name, value in params.items()}
        return functional_call(self.model_for(dtype), params, (cast_floating(inputs, dtype),))

    def losses(
        self,
        step: int,
        split: str,
        examples: slice | None = None,
        *,
        objective: str | None = None,
        batch_size: int = 1024,
    ) -> np.ndarray:
        """Per-datapoint losses of ``examples`` of ``split`` at ``step`` (float64, row-major datapoints)."""
        import torch

        params = self.params(step)
        data = self.data(split)
        fn = self.objective(objective)
        n = len(data["inputs"])
        examples = examples or slice(0, n)
        start, stop, _ = examples.indices(n)
        pieces = []
        with self.computing(), torch.no_grad():
            for begin in range(start, stop, batch_size):
                rows = slice(begin, min(begin + batch_size, stop))
                targets = data["targets"][rows] if "targets" in data else data["inputs"][rows]
                mask = data["mask"][rows] if "mask" in data else None
                outputs = self.outputs(params, data["inputs"][rows])
                pieces.append(fn.losses(outputs, targets, mask).double().cpu().numpy())
        return np.concatenate(pieces) if pieces else np.zeros(0)


__all__ = [
    "DEVICE_PATTERN",
    "TaskSpec",
    "TasksStopped",
    "Worker",
    "allow_tasks",
    "check_stopped",
    "clear_cache",
    "concurrent_computations",
    "datapoint_index",
    "forget_worker",
    "objective_for",
    "resolve_device",
    "stop_tasks",
    "utc_timestamp",
    "worker_for",
]

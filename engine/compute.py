"""Computing a plan: the analyzer's lazy Dataset, computed in blocks of steps and committed as they finish.

:func:`compute` asks the analyzer for its graph over the plan's missing steps, checks that it
is lazy and keeps its ``per`` contract, then runs it on the scheduler the settings choose
(:mod:`ckpt.engine.schedule`): a per-checkpoint or per-pair result in blocks of steps, each
committed to ``analyses/<name>`` when done, so that a run killed mid-way resumes after its last
block; a per-run result whole (its pieces committed to a journal as they are found).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.context import AnalysisContext
from ckpt.engine.failures import cluster_lost, out_of_memory
from ckpt.engine.resume import Journal
from ckpt.engine.schedule import compute_settings, local_threads, schedule_of
from ckpt.engine.worker import TaskSpec, allow_tasks, forget_worker, stop_tasks
from ckpt.errors import AnalysisError
from ckpt.plugins import PER_CHECKPOINT, PER_PAIR, PER_RUN, Analyzer
from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory
from ckpt.store.publish import local_path
from ckpt.store.results import ResultSink

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.engine.plan import Plan
    from ckpt.engine.settings import EngineSettings

COMMIT_SECONDS = 2.0
"""Target duration of a block of steps between two commits of the result."""


def check_lazy(name: str, dataset: Any) -> None:
    """Refuse a graph that is not a Dataset, or one the analyzer computed while building it."""
    if not isinstance(dataset, xr.Dataset):
        msg = f"analyzer {name!r} returned {type(dataset).__name__}, not an xarray.Dataset"
        raise AnalysisError(msg)
    eager = [v for v, variable in dataset.data_vars.items() if variable.chunks is None]
    if eager:
        msg = (
            f"analyzer {name!r} computed {eager[0]!r} while building its graph; return dask-backed "
            "variables (AnalysisContext.map_checkpoints / map_pairs) so that the engine runs them"
        )
        raise AnalysisError(msg)


def check_contract(analyzer: Analyzer, dataset: xr.Dataset, steps: Sequence[int]) -> None:
    """Refuse a result that breaks the contract of its ``per`` before anything is computed or stored.

    A per-checkpoint or per-pair result grows by rows along ``step``: every data
    variable leads with ``step``, whose coordinate holds exactly the steps asked
    for. Without this a result lacking ``step`` was stored whole and replaced,
    not extended, by the next incremental run.
    """
    name = analyzer.name
    if analyzer.per == PER_RUN:
        return
    kind = "per-checkpoint" if analyzer.per == PER_CHECKPOINT else "per-pair"
    for variable, array in dataset.data_vars.items():
        if not array.dims or array.dims[0] != "step":
            msg = (
                f"analyzer {name!r} is {kind}: its variable {variable!r} must have 'step' as first dim, "
                f"has {array.dims}"
            )
            raise AnalysisError(msg)
    if "step" not in dataset.coords:
        msg = f"analyzer {name!r} is {kind} but its result has no 'step' coordinate; add one (the steps it computed)"
        raise AnalysisError(msg)
    got, asked = [int(s) for s in dataset["step"].values], [int(s) for s in steps]
    if got != asked:

        def span(values: list[int]) -> str:
            return f"{len(values)} steps ({values[0]}..{values[-1]})" if values else "no steps"

        msg = f"analyzer {name!r} returned {span(got)} where it was asked for {span(asked)} (AnalysisContext.steps)"
        raise AnalysisError(msg)


@contextlib.contextmanager
def _tasks_stop_on_interrupt() -> Iterator[None]:
    """Let the run's tasks run; on Ctrl-C make them stop (the queued ones would otherwise all run before exit)."""
    allow_tasks()
    try:
        yield
    except KeyboardInterrupt:
        stop_tasks()
        raise


@contextlib.contextmanager
def _run_worker_released(spec: TaskSpec) -> Iterator[None]:
    """The run's computation; when it ends, its worker and the memory it freed are let go.

    What the worker cached (checkpoints, data, a basis: device memory on a GPU) is not kept for a
    later run in this process, which measures its own budget and so gets a worker of its own.
    """
    try:
        yield
    finally:
        forget_worker(spec)
        release_freed_memory()


def task_spec(store: ckptstore.Store, settings: EngineSettings) -> TaskSpec:
    """What the run's tasks open the store with on their workers (paths, not objects)."""
    where = store.path
    local = local_path(where)  # a replaced local store is a new folder (a new inode), even within one second
    generation = f"{store.created}|{len(store.history)}|{os.stat(local).st_ino if local else ''}"
    return TaskSpec(
        where,
        settings.device,
        settings.storage_options,
        generation,
        max_memory=settings.budget,
        tasks=schedule_of(settings).concurrent,
        progress=bool(settings.progress),
    )


@_tasks_stop_on_interrupt()
def compute(
    analyzer: Analyzer,
    plan: Plan,
    store: ckptstore.Store,
    results: dict[str, xr.Dataset],
    settings: EngineSettings,
    journal: Journal | None = None,
) -> list[int]:
    """Compute the plan's missing steps and commit them; the steps of pieces resumed from ``journal``."""
    missing = list(plan.missing)
    spec = task_spec(store, settings)
    context = AnalysisContext(store, missing, spec, results, analyzer=analyzer.name, journal=journal)
    dataset = analyzer.compute(context)
    check_lazy(analyzer.name, dataset)
    check_contract(analyzer, dataset, missing)
    # the worker the tasks make goes with the run, however it ends; on the CPU, what its tasks free is
    # kept for their reuse until then where the analyzer asks for it
    keep = analyzer.keeps_freed_memory and str(settings.device) == "cpu"
    with (
        freed_memory_kept_for_reuse() if keep else contextlib.nullcontext(),
        _run_worker_released(spec),
        compute_settings(settings.scheduler, settings.address, settings.workers, settings.device) as (
            dask_settings,
            count,
        ),
    ):
        if analyzer.per not in (PER_CHECKPOINT, PER_PAIR):
            return _compute_whole(analyzer, plan, store, context, dataset, dask_settings, settings, journal)
        _compute_blocks(analyzer, plan, store, dataset, dask_settings, count, settings)
    return []


def _compute_whole(
    analyzer: Analyzer,
    plan: Plan,
    store: ckptstore.Store,
    context: AnalysisContext,
    dataset: xr.Dataset,
    dask_settings: dict[str, Any],
    settings: EngineSettings,
    journal: Journal | None,
) -> list[int]:
    """Compute a per-run result whole and commit it; the steps of pieces resumed from ``journal``."""
    streamed = context.from_journal if journal is not None else None
    names = streamed[0] if streamed else ()
    with out_of_memory(settings, analyzer.name, []), cluster_lost(settings, analyzer.name, []):
        computed = add_running_sums(analyzer, dataset.drop_vars(names).compute(**dask_settings), None)
    if streamed:
        assert journal is not None
        like = {name: dataset[name].variable for name in names}
        coords = {name: computed[name].values for name in computed.coords}
        computed = computed.assign(journal.variables(streamed[1], like, coords))[list(dataset.variables)]
    # a result streamed from the journal is copied by this process's threads, a few stored chunks
    # at a time, whatever scheduler computed it: its chunks are read where the store is
    with local_threads(unless_configured=False) if streamed else contextlib.nullcontext():
        _sink(plan, store, settings).replace(computed, steps=plan.missing)
    if journal is not None:  # the whole result is committed: its pieces are not needed any more
        journal.discard()
    return list(context.resumed)


def _compute_blocks(
    analyzer: Analyzer,
    plan: Plan,
    store: ckptstore.Store,
    dataset: xr.Dataset,
    dask_settings: dict[str, Any],
    count: int,
    settings: EngineSettings,
) -> None:
    """Compute a per-checkpoint or per-pair result in blocks of steps, committing each when done."""
    from tqdm import tqdm

    missing = plan.missing
    # Blocks grow until one takes ~COMMIT_SECONDS: a commit has a fixed cost, so committing every
    # block of a few steps made the engine several times slower than a plain loop (bench/engine.py).
    # A block holds at least one step more than compute at once, so that one reads while another
    # computes; not the thread count: with many cores, blocks of that many slow steps lost minutes
    # of work to each kill (docs/performance.md, "Engine scheduling").
    least = schedule_of(settings).busy(count) + 1
    size: int = settings.block_steps or max(least, 4)
    done = list(plan.reused)
    sink = _sink(plan, store, settings)
    carry = stored_totals(analyzer, plan.target, store) if plan.reused else None
    start = 0
    with tqdm(total=len(missing), desc=analyzer.name, unit="step", disable=not settings.progress or None) as bar:
        while start < len(missing):
            began = time.perf_counter()
            with out_of_memory(settings, analyzer.name, done), cluster_lost(settings, analyzer.name, done):
                part = dataset.isel(step=slice(start, start + size)).compute(**dask_settings)
            part = add_running_sums(analyzer, part, carry)
            carry = {total: part[total].isel(step=-1, drop=True) for total in analyzer.running_sums}
            steps = [int(s) for s in part["step"].values]
            done += steps
            sink.append(part)  # after the reused steps; with none, the result anew
            bar.update(len(steps))
            start += len(steps)
            if not settings.block_steps:
                seconds = (time.perf_counter() - began) / len(steps)  # per step of this block
                size = max(least, min(4 * size, round(COMMIT_SECONDS / max(seconds, 1e-6))))


def _sink(plan: Plan, store: ckptstore.Store, settings: EngineSettings) -> ResultSink:
    """What commits the plan's result: its provenance stamped with the steps each commit covers.

    The run holds the result's lock (:func:`~ckpt.store.results.result_lock`, taken before the
    plan read what is stored), so the sink is made without taking it again.
    """
    return ResultSink(store, plan.target, plan.provenance, storage_options=settings.storage_options)


def add_running_sums(analyzer: Analyzer, part: xr.Dataset, carry: Mapping[str, Any] | None) -> xr.Dataset:
    """Add the analyzer's running sums over ``step`` to a computed block, continuing ``carry``."""
    for total, variable in analyzer.running_sums.items():
        summed = part[variable].cumsum("step") if "step" in part[variable].dims else part[variable]
        part[total] = summed if carry is None else summed + carry[total]
    return part


def stored_totals(analyzer: Analyzer, target: str, store: ckptstore.Store) -> dict[str, Any] | None:
    """The running sums at the last stored step of ``analyses/<target>`` (where an incremental run continues them)."""
    if not analyzer.running_sums:
        return None
    stored = store.analysis(target)
    return {total: stored[total].isel(step=-1, drop=True).load() for total in analyzer.running_sums}


__all__ = [
    "COMMIT_SECONDS",
    "add_running_sums",
    "check_contract",
    "check_lazy",
    "compute",
    "stored_totals",
    "task_spec",
]

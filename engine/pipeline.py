"""The engine: resolve dependencies, reuse what is stored, run the Dask graph, save results.

:func:`analyze` is what ``ckpt analyze`` and notebooks call. For an analyzer
and its options it

1. runs the analyzers it requires first (each through this same function);
2. compares the stored result's provenance (analyzer version, options, data
   hash, results of requirements) with the request; on a match it reuses the
   stored steps and computes only the missing ones (new checkpoints = new work
   only), otherwise it recomputes everything;
3. asks the analyzer for a lazy Dataset over the missing steps and computes it
   in blocks of steps on the chosen scheduler, committing each block to
   ``analyses/<name>`` as it finishes, so that a run killed mid-way resumes
   where it stopped;
4. returns the stored result, lazily read back from the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.local
import dask.threaded
import numpy as np
import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.context import AnalysisContext
from ckpt.engine.memory import default_budget, format_size, parse_size
from ckpt.engine.resume import Journal
from ckpt.engine.worker import (
    TaskSpec,
    allow_tasks,
    concurrent_computations,
    forget_worker,
    resolve_device,
    stop_tasks,
    utc_timestamp,
)
from ckpt.errors import (
    AnalysisError,
    CkptWarning,
    MissingDataError,
    NonFiniteWarning,
    UnverifiedStoreWarning,
)
from ckpt.plugins import PER_CHECKPOINT, PER_PAIR, PER_RUN, Analyzer
from ckpt.plugins.manager import Registry
from ckpt.plugins.manager import registry as shared_registry
from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory
from ckpt.store.publish import local_path
from ckpt.store.results import result_lock, threads_unless_configured, write_analysis

SCHEDULERS = ("threads", "processes", "sync")
COMMIT_SECONDS = 2.0
"""Target duration of a block of steps between two commits of the result."""


@dataclass
class RunReport:
    """What one :func:`run` did."""

    name: str
    computed_steps: list[int] = field(default_factory=list)
    """Steps (or first steps of pairs) computed in this run."""
    reused_steps: list[int] = field(default_factory=list)
    """Steps taken from the stored result."""
    dependencies: list[RunReport] = field(default_factory=list)
    dataset: xr.Dataset | None = None
    """The complete stored result (lazy)."""
    resumed: list[int] = field(default_factory=list)
    """Steps whose pieces of a per-run result an interrupted run had committed (taken, not computed)."""


def data_hash(store: ckptstore.Store, splits: Sequence[str] | None = None) -> str:
    """One hash over the content hashes of the store's data splits ``splits`` (None: every split).

    A split that is named but absent counts as absent, so that adding it later changes the hash.
    """
    names = store.splits if splits is None else sorted(set(splits))
    digests = {split: store.split_hash(split) if split in store.splits else None for split in names}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def model_hash(store: ckptstore.Store) -> str:
    """One hash over the store's model spec (factory and config) and objective."""
    spec = store.model
    record = {
        "model": None if spec is None else {"factory": spec.factory, "config": spec.config},
        "objective": store.objective,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _identity(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a provenance record that decides whether a stored result can be reused."""
    keys = ("analyzer", "version", "options", "data_sha256", "model_sha256", "requires")
    return {k: provenance.get(k) for k in keys}


def stored_identity(stored: Mapping[str, Any], store: ckptstore.Store, current_model: str) -> dict[str, Any]:
    """The identity of a stored result (what decides its reuse), as computed with the current model when it cannot tell.

    A result from before ckpt recorded the model's hash counts as computed with the current
    model while the store's model was never changed (``ckpt set-model``).
    """
    identity = _identity(stored)
    changed = any(entry.get("event") == "set-model" for entry in store.history)
    if identity["model_sha256"] is None and not changed:
        identity["model_sha256"] = current_model
    return identity


def _stored_result(store: ckptstore.Store, name: str) -> xr.Dataset | None:
    """The stored result ``name``, opened lazily, or None when there is none (or its files are gone)."""
    if name not in store.analyses:
        return None
    try:
        return store.analysis(name)
    except MissingDataError:  # deleted by hand: nothing to reuse, compute it anew
        return None


def stored_provenance(store: ckptstore.Store, name: str) -> dict[str, Any] | None:
    """The provenance attributes of a stored result, or None when there is none (or its files are gone)."""
    result = _stored_result(store, name)
    return None if result is None else result.ckpt.provenance


def _holds_claimed_steps(result: xr.Dataset, name: str, where: str, claimed: list[int]) -> bool:
    """Whether the stored ``result`` holds exactly the steps its provenance claims (warns when not).

    Reuse trusts the provenance's steps; a result whose step coordinate says otherwise (edited,
    duplicated, or out of order) is computed anew rather than reused or extended.
    """
    held = [int(s) for s in result["step"].values] if "step" in result.dims else claimed
    if held == claimed:
        return True
    msg = (
        f"the stored result {name!r} of {where} holds steps {held[:5]} where its "
        f"provenance claims {claimed[:5]}: it is computed anew"
    )
    warnings.warn(msg, CkptWarning, stacklevel=3)
    return False


def _wanted_steps(analyzer: Analyzer, store: ckptstore.Store) -> list[int]:
    steps = [int(s) for s in store.steps]
    if analyzer.per == PER_PAIR:
        return steps[:-1]
    return steps


@contextlib.contextmanager
def compute_settings(
    scheduler: str = "threads",
    address: str | None = None,
    workers: int | None = None,
    device: str = "cpu",
) -> Iterator[tuple[dict[str, Any], int]]:
    """Yield the keyword arguments of ``.compute()`` for the chosen scheduler, and its worker count.

    ``address`` connects to a running ``distributed`` scheduler; ``workers``
    starts a ``LocalCluster`` of that many single-threaded worker processes
    (with ``device="cuda"`` and dask-cuda installed, one worker per GPU);
    otherwise the local ``threads`` (default), ``processes`` or ``sync``
    scheduler is used, with ``workers`` threads/processes.
    """
    if scheduler not in SCHEDULERS:
        msg = f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}"
        raise AnalysisError(msg)
    if address is not None:
        from distributed import Client

        try:
            client = Client(address, timeout="10s")
        except OSError as exc:
            msg = f"cannot reach a dask scheduler at {address} ({exc}); start one with `dask scheduler`"
            raise AnalysisError(msg) from None
        with client:
            yield {"scheduler": client}, max(1, len(client.scheduler_info()["workers"]))
        return
    if workers is not None and workers < 1:
        msg = f"--workers must be at least 1, got {workers}"
        raise AnalysisError(msg)
    if workers is not None and scheduler == "threads":
        from distributed import Client, LocalCluster

        cluster_cls: Any = LocalCluster
        kwargs: dict[str, Any] = {"n_workers": workers, "threads_per_worker": 1, "processes": True}
        if device.startswith("cuda"):
            with contextlib.suppress(ImportError):
                from dask_cuda import LocalCUDACluster

                cluster_cls, kwargs = LocalCUDACluster, {"n_workers": workers, "threads_per_worker": 1}
        # distributed gives its workers MALLOC_TRIM_THRESHOLD_=65536, which also turns off
        # glibc's dynamic mmap threshold: every activation buffer above 128 KB is then
        # mmapped and page-faulted anew, which doubled the loss analyzer's time per checkpoint
        # (bench/engine.py; docs/performance.md, "Engine scheduling").
        spawn_environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {})}
        spawn_environ.pop("MALLOC_TRIM_THRESHOLD_", None)
        with warnings.catch_warnings(), dask.config.set({"distributed.nanny.pre-spawn-environ": spawn_environ}):
            warnings.simplefilter("ignore")  # "port 8787 is already in use" and friends
            cluster = cluster_cls(dashboard_address=None, **kwargs)
        with cluster, Client(cluster) as client:
            yield {"scheduler": client}, workers
        return
    if scheduler == "processes":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        count = workers or os.cpu_count() or 1
        # one pool for the whole run, so models and data stay cached in its processes
        with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield {"scheduler": "processes", "pool": pool}, count
        return
    if scheduler == "sync":
        count = 1
    elif scheduler == "threads" and device != "cpu":
        # one thread computing, one reading the next checkpoint: a thread per core would hold as many
        # checkpoints on the GPU while they wait for its one computation slot, outside the memory budget
        # (docs/performance.md, "Engine scheduling")
        count = concurrent_computations(device) + 1
    else:
        count = workers or os.cpu_count() or 1
    # the scheduler itself, not its name: given a name, dask imports distributed to look for a client
    # first, a visible share of every run's start-up (docs/performance.md, "Start-up and imports")
    settings: dict[str, Any] = {"scheduler": dask.threaded.get if scheduler == "threads" else dask.local.get_sync}
    if scheduler == "threads":
        settings["num_workers"] = count
    yield settings, count


def _check_lazy(name: str, dataset: Any) -> None:
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


def _check_contract(analyzer: Analyzer, dataset: xr.Dataset, steps: Sequence[int]) -> None:
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


def run(
    name: str,
    store: str | os.PathLike[str],
    *,
    scheduler: str = "threads",
    address: str | None = None,
    workers: int | None = None,
    device: str = "cpu",
    force: bool = False,
    progress: bool = False,
    block_steps: int | None = None,
    max_memory: str | int | None = None,
    registry: Registry | None = None,
    storage_options: dict[str, Any] | None = None,
    save_as: str | None = None,
    _active: tuple[str, ...] = (),
    **options: Any,
) -> RunReport:
    """Run analyzer ``name`` on ``store``, computing only what is missing; see :func:`analyze`."""
    registry = registry if registry is not None else shared_registry()
    if name not in registry.analyzers:
        known = ", ".join(sorted(registry.analyzers)) or "none"
        msg = f"unknown analyzer {name!r}; registered analyzers: {known} (see `ckpt plugins`)"
        raise AnalysisError(msg)
    if name in _active:
        msg = f"analyzers require each other in a cycle: {' -> '.join([*_active, name])}"
        raise AnalysisError(msg)
    analyzer: Analyzer = registry.analyzers[name](**options)
    device = resolve_device(device)
    if address is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://[^\s/]+/?|[^\s:/]+:\d+", address):
        msg = f"--address must be a dask scheduler address such as tcp://HOST:PORT, got {address!r}"
        raise AnalysisError(msg)
    if max_memory is not None:
        max_memory = parse_size(max_memory)
    elif address is None:  # measured once, when the run starts, not in each worker after its model loaded
        max_memory = default_budget(device)
    engine: dict[str, Any] = {  # the settings this run passes on to its dependencies and _compute
        "max_memory": max_memory,
        "scheduler": scheduler,
        "address": address,
        "workers": workers,
        "device": device,
        "progress": progress,
        "block_steps": block_steps,
        "registry": registry,
        "storage_options": storage_options,
    }
    target = save_as or name
    # user mistakes first: an error after the dependencies ran would leave the store changed
    before = ckptstore.open(str(store), storage_options=storage_options)
    unverifiable = before.unverifiable_summary()
    if unverifiable is not None:  # once per run, not per worker or checkpoint
        warnings.warn(unverifiable, UnverifiedStoreWarning, stacklevel=3)
    _check_target(name, target, before, registry)
    analyzer.preflight(before)
    report = RunReport(target)
    results: dict[str, xr.Dataset] = {}
    requirements: dict[str, Any] = {}
    dependency_options = analyzer.dependency_options()
    for dependency in analyzer.requires:
        if dependency not in registry.analyzers:
            known = ", ".join(sorted(registry.analyzers)) or "none"
            msg = f"analyzer {name!r} requires {dependency!r}, which is not registered; registered analyzers: {known}"
            raise AnalysisError(msg)
        sub_options = dependency_options.get(dependency, {})
        if sub_options is None:  # "whatever is stored": reuse the stored result's options
            stored_dependency = stored_provenance(
                ckptstore.open(str(store), storage_options=storage_options), dependency
            )
            sub_options = dict((stored_dependency or {}).get("options") or {})
        sub = run(dependency, store, _active=(*_active, name), **engine, **sub_options)
        report.dependencies.append(sub)
        assert sub.dataset is not None
        results[dependency] = sub.dataset
        identity = _identity(sub.dataset.attrs.get("ckpt", {}))
        if registry.analyzers[dependency].per == PER_RUN:
            # a whole-run result (a basis) changes when checkpoints are added: so do its dependents
            identity["steps"] = sub.dataset.attrs.get("ckpt", {}).get("steps")
        requirements[dependency] = identity

    where = str(store)
    with result_lock(where, target):  # one process computes a result at a time; a second one is refused
        opened = ckptstore.open(where, storage_options=storage_options)
        model = model_hash(opened)
        provenance = {
            **analyzer.provenance(),
            "data_sha256": data_hash(opened, analyzer.data_splits(opened)),
            "model_sha256": model,
            "requires": requirements,
        }
        wanted = _wanted_steps(analyzer, opened)
        stored_result = _stored_result(opened, target)
        stored = None if stored_result is None else stored_result.ckpt.provenance
        covered: list[int] = []
        if (
            stored_result is not None
            and stored is not None
            and not force
            and stored_identity(stored, opened, model) == _identity(provenance)
        ):
            covered = [int(s) for s in stored.get("steps", [])]
            if analyzer.per == PER_RUN and covered != wanted:
                covered = []
            if covered and analyzer.per != PER_RUN and not _holds_claimed_steps(stored_result, target, where, covered):
                covered = []
        missing = [s for s in wanted if s not in set(covered)]
        if covered and missing and min(missing) < max(covered):
            covered, missing = [], wanted  # a hole in the middle: never expected, but never wrong to redo
        report.reused_steps = [s for s in wanted if s in set(covered)]
        journal = _journal(analyzer, target, where, provenance, storage_options)
        if journal is not None and force:
            journal.discard()
        if missing or (not covered and analyzer.per == PER_RUN):
            report.resumed = _compute(
                analyzer, target, where, opened, missing, covered, provenance, results, engine, journal
            )
            report.computed_steps = missing
            _warn_if_nonfinite(opened, target, missing)
    report.dataset = ckptstore.open(where, storage_options=storage_options).analysis(target)
    return report


def _journal(
    analyzer: Analyzer, target: str, where: str, provenance: Mapping[str, Any], storage_options: Any
) -> Journal | None:
    """Where a per-run result's pieces are committed as they are found (None for other analyzers)."""
    from ckpt.store.format import PARTIAL_SUFFIX, check_name

    if analyzer.per != PER_RUN or check_name(f"{target}{PARTIAL_SUFFIX}", "analysis") is not None:
        return None
    identity = hashlib.sha256(json.dumps(_identity(provenance), sort_keys=True, default=str).encode()).hexdigest()
    return Journal(where, target, analyzer.name, identity, storage_options)


def _warn_if_nonfinite(store: ckptstore.Store, target: str, steps: list[int]) -> None:
    """Warn once when the new part of a result is NaN or inf where the checkpoint itself holds NaN or inf.

    Many results hold NaN by design (grad-norms' update at the first checkpoint, a cluster without a
    breakthrough), so a NaN alone says nothing; one computed from weights that are not finite is a
    number no analysis can stand behind. Only the steps just computed are looked at, and only the
    checkpoints of steps whose values are not finite are read again.
    """
    from ckpt.store.reader import describe_nonfinite

    result = ckptstore.open(store.path).analysis(target)
    flagged: dict[int, list[str]] = {}
    for name, variable in result.data_vars.items():
        if "step" not in variable.dims or not steps:
            continue
        part = variable.sel(step=[s for s in steps if s in set(result["step"].values.tolist())])
        if part.dtype.kind not in "fc":
            continue
        with threads_unless_configured():  # else dask imports distributed to look for a client
            values = part.transpose("step", ...).values
        finite = np.isfinite(values).reshape(part.sizes["step"], -1).all(axis=1)
        for step in np.asarray(part["step"].values)[~finite].tolist():
            flagged.setdefault(int(step), []).append(str(name))
    causes = {step: store.nonfinite(step) for step in sorted(flagged)[:100] if step in store}
    causes = {step: counts for step, counts in causes.items() if counts}
    if causes:
        variables = sorted({v for step in causes for v in flagged[step]})
        shown = "; ".join(describe_nonfinite(step, counts) for step, counts in list(causes.items())[:5])
        msg = (
            f"result {target!r} of {store.path} holds NaN or inf ({', '.join(variables)}) at step(s) "
            f"{sorted(causes)}, computed from checkpoints whose weights are not finite: {shown}"
        )
        warnings.warn(msg, NonFiniteWarning, stacklevel=3)


def _check_target(name: str, target: str, store: ckptstore.Store, registry: Registry) -> None:
    """Refuse a ``save_as`` that would replace what another analyzer, or a dependent, reads.

    Results are found by name: ``analyses/loss`` is what every analyzer requiring ``loss``
    reads, so no other analyzer's result may be saved there; and a name holding a result of
    another analyzer is not silently replaced.
    """
    if target == name:
        return
    from ckpt.store.format import check_name

    problem = check_name(target, "analysis")
    if problem:
        raise AnalysisError(f"--as: {problem}")
    if target in registry.analyzers:
        msg = (
            f"--as {target!r} is the name of the analyzer {target!r}, whose result other analyzers read "
            f"there: choose another name, such as {name}-{target}"
        )
        raise AnalysisError(msg)
    stored = stored_provenance(store, target)
    if stored is not None and stored.get("analyzer") not in (None, name):
        msg = (
            f"analyses/{target} holds a result of analyzer {stored.get('analyzer')!r}, not {name!r}: choose "
            f"another --as name, or remove it first (ckpt rm {store.path} {target})"
        )
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


@_tasks_stop_on_interrupt()
def _compute(
    analyzer: Analyzer,
    target: str,
    where: str,
    store: ckptstore.Store,
    missing: Sequence[int],
    covered: Sequence[int],
    provenance: dict[str, Any],
    results: dict[str, xr.Dataset],
    engine: dict[str, Any],
    journal: Journal | None = None,
) -> list[int]:
    """Compute ``missing`` and commit it; the steps of pieces resumed from ``journal``."""
    from tqdm import tqdm

    local = local_path(where)  # a replaced local store is a new folder (a new inode), even within one second
    generation = f"{store.created}|{len(store.history)}|{os.stat(local).st_ino if local else ''}"
    spec = TaskSpec(
        where,
        engine["device"],
        engine["storage_options"],
        generation,
        max_memory=engine["max_memory"],
        tasks=parallel_tasks(engine["scheduler"], engine["address"], engine["workers"], engine["device"]),
        progress=bool(engine["progress"]),
    )
    context = AnalysisContext(store, missing, spec, results, analyzer=analyzer.name, journal=journal)
    dataset = analyzer.compute(context)
    _check_lazy(analyzer.name, dataset)
    _check_contract(analyzer, dataset, missing)
    per_step = analyzer.per in (PER_CHECKPOINT, PER_PAIR)
    # the worker the tasks make goes with the run, however it ends; on the CPU, what its tasks free is
    # kept for their reuse until then where the analyzer asks for it
    keep = analyzer.keeps_freed_memory and str(engine["device"]) == "cpu"
    with (
        freed_memory_kept_for_reuse() if keep else contextlib.nullcontext(),
        _run_worker_released(spec),
        compute_settings(engine["scheduler"], engine["address"], engine["workers"], engine["device"]) as (
            settings,
            count,
        ),
    ):
        if not per_step:
            streamed = context.from_journal if journal is not None else None
            names = streamed[0] if streamed else ()
            with _out_of_memory(engine, analyzer.name, []), _cluster_lost(engine, analyzer.name, []):
                computed = _add_running_sums(analyzer, dataset.drop_vars(names).compute(**settings), None)
            if streamed:
                assert journal is not None
                like = {name: dataset[name].variable for name in names}
                coords = {name: computed[name].values for name in computed.coords}
                computed = computed.assign(journal.variables(streamed[1], like, coords))[list(dataset.variables)]
            attrs = {"ckpt": {**provenance, "steps": list(missing), "ckpt_version": ckptstore.__version__}}
            attrs["ckpt"]["created"] = utc_timestamp()
            # a result streamed from the journal is copied by this process's threads, a few stored chunks
            # at a time, whatever scheduler computed it: its chunks are read where the store is
            with dask.config.set(scheduler=dask.threaded.get) if streamed else contextlib.nullcontext():
                write_analysis(where, target, computed, attrs=attrs, storage_options=engine["storage_options"])
            if journal is not None:  # the whole result is committed: its pieces are not needed any more
                journal.discard()
            return list(context.resumed)
        # Blocks of steps, each committed when done, so that a killed run resumes
        # after its last block. Blocks grow until one takes ~COMMIT_SECONDS: a
        # commit has a fixed cost, so committing every block of a few steps
        # made the engine several times slower than a plain loop (bench/engine.py).
        # A block holds at least one step more than compute at once, so that one
        # reads while another computes; not the thread count: with many cores,
        # blocks of that many slow steps lost minutes of work to each kill
        # (docs/performance.md, "Engine scheduling").
        least = _busy(engine, count) + 1
        size: int = engine["block_steps"] or max(least, 4)
        done = list(covered)
        carry = _stored_totals(analyzer, target, where, engine["storage_options"]) if covered else None
        start = 0
        with tqdm(total=len(missing), desc=analyzer.name, unit="step", disable=not engine["progress"] or None) as bar:
            while start < len(missing):
                began = time.perf_counter()
                with _out_of_memory(engine, analyzer.name, done), _cluster_lost(engine, analyzer.name, done):
                    part = dataset.isel(step=slice(start, start + size)).compute(**settings)
                part = _add_running_sums(analyzer, part, carry)
                carry = {total: part[total].isel(step=-1, drop=True) for total in analyzer.running_sums}
                steps = [int(s) for s in part["step"].values]
                done += steps
                attrs = {"ckpt": {**provenance, "steps": done, "ckpt_version": ckptstore.__version__}}
                attrs["ckpt"]["created"] = utc_timestamp()
                write_analysis(
                    where,
                    target,
                    part,
                    append_dim="step" if len(done) > len(steps) else None,
                    attrs=attrs,
                    storage_options=engine["storage_options"],
                )
                bar.update(len(steps))
                start += len(steps)
                if not engine["block_steps"]:
                    seconds = (time.perf_counter() - began) / len(steps)  # per step of this block
                    size = max(least, min(4 * size, round(COMMIT_SECONDS / max(seconds, 1e-6))))
    return []


def _busy(engine: Mapping[str, Any], count: int) -> int:
    """Steps computed at once: every worker of a cluster or process pool; the computation slots of threads."""
    if engine["scheduler"] == "threads" and engine["address"] is None and engine["workers"] is None:
        return min(count, concurrent_computations(engine["device"]))
    return count


def parallel_tasks(scheduler: str, address: str | None, workers: int | None, device: str = "cpu") -> int:
    """Computations :func:`compute_settings` runs at once on one machine, which share its memory budget.

    Threads of one process compute at most :func:`concurrent_computations` at a time (the others
    read their next checkpoint); processes and LocalCluster workers each compute. A remote
    cluster (``address``) counts 1: each of its machines resolves its own budget.
    """
    if address is not None or scheduler == "sync":
        return 1
    count = workers or os.cpu_count() or 1
    if scheduler == "threads" and workers is None:
        return min(count, concurrent_computations(device))
    return count


def _allocation_failure(exc: BaseException) -> str | None:
    """The first line of an allocator's failure (numpy, torch on CPU or CUDA), else None."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return text
    if isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower()):
        return text
    return None


def _whole_sentences(text: str, limit: int) -> str:
    """The sentences ``text`` begins with, as many as fit in ``limit`` characters (at least the first, cut).

    Why: torch's CUDA message says which process holds the device in its fourth and fifth sentences
    ("Process 971 has 77.07 GiB memory in use. Including non-PyTorch memory, this process has ...");
    cut at 200 characters, a real message lost the second mid-word, and with it whether this run
    or another process held the memory.
    """
    sentences = re.split(r"(?<=\.) ", text.strip())
    kept = sentences[0][:limit]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > limit:
            break
        kept += " " + sentence
    return kept.rstrip(".")


@contextlib.contextmanager
def _out_of_memory(engine: Mapping[str, Any], name: str, done: Sequence[int]) -> Iterator[None]:
    """Turn an allocation failure mid-run into one AnalysisError that keeps what was committed."""
    try:
        yield
    except BaseException as exc:
        failure = _allocation_failure(exc)
        if failure is None:
            raise
        budget = engine.get("max_memory")
        told = f" (this run's budget: {format_size(budget)})" if budget else ""
        kept = f"the {len(done)} step(s) committed before are kept" if done else "nothing was committed"
        msg = (
            f"{name} ran out of memory: {_whole_sentences(failure, 300)}; {kept}. "
            f"Give the run less with --max-memory{told} "
            "or smaller blocks (e.g. --batch-size, --samples), then rerun the same command"
        )
        raise AnalysisError(msg) from None


@contextlib.contextmanager
def _cluster_lost(engine: Mapping[str, Any], name: str, done: Sequence[int]) -> Iterator[None]:
    """Turn a dask cluster that went away mid-run (scheduler killed, workers dying) into one AnalysisError.

    What was committed before stays (each block is committed when done): the message
    says so, and that rerunning the command computes only the rest.
    """
    try:
        yield
    except BaseException as exc:
        kind = type(exc)
        lost = kind.__module__.startswith("distributed") and kind.__name__ in (
            "FutureCancelledError",
            "CancelledError",
            "CommClosedError",
            "KilledWorker",
        )
        if not lost:
            raise
        where = f"the dask scheduler at {engine['address']}" if engine["address"] else "the dask cluster"
        cause = (
            "its workers kept dying (out of memory?)"
            if kind.__name__ == "KilledWorker"
            else "it went away mid-run (stopped or unreachable)"
        )
        kept = f"the {len(done)} step(s) committed before are kept" if done else "nothing was committed"
        msg = f"{name}: {where} failed: {cause} ({kind.__name__}); {kept}: rerun the same command to compute the rest"
        raise AnalysisError(msg) from None


def _add_running_sums(analyzer: Analyzer, part: xr.Dataset, carry: Mapping[str, Any] | None) -> xr.Dataset:
    """Add the analyzer's running sums over ``step`` to a computed block, continuing ``carry``."""
    for total, variable in analyzer.running_sums.items():
        summed = part[variable].cumsum("step") if "step" in part[variable].dims else part[variable]
        part[total] = summed if carry is None else summed + carry[total]
    return part


def _stored_totals(analyzer: Analyzer, target: str, where: str, storage_options: Any) -> dict[str, Any] | None:
    """The running sums at the last stored step of ``analyses/<target>`` (where an incremental run continues them)."""
    if not analyzer.running_sums:
        return None
    stored = ckptstore.open(where, storage_options=storage_options).analysis(target)
    return {total: stored[total].isel(step=-1, drop=True).load() for total in analyzer.running_sums}


def analyze(name: str, store: str | os.PathLike[str], **kwargs: Any) -> xr.Dataset:
    """Run an analyzer on a store and return its complete result.

    Parameters
    ----------
    name
        Registered analyzer name (``ckpt plugins`` lists them).
    store
        Path or URL of the checkpoint store.
    **kwargs
        Analyzer options (``split="eval"``), and engine options:
        ``scheduler`` (``"threads"``, ``"processes"``, ``"sync"``), ``address``
        (a ``distributed`` scheduler), ``workers`` (a ``LocalCluster`` of that
        many processes), ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``),
        ``force`` (recompute), ``progress`` (show a bar), ``max_memory`` (bytes or a
        size such as ``"12GiB"`` the run may use on this machine, shared by its parallel
        tasks; default: a share of what is free, see :mod:`ckpt.engine.memory`),
        ``save_as`` (keep the result
        under ``analyses/<save_as>`` instead of ``analyses/<name>``, e.g. several
        ``clusters`` results side by side; reused by provenance like any other).

    Returns
    -------
    xarray.Dataset
        The stored result (lazy), with its provenance in ``attrs["ckpt"]``.

    Examples
    --------
    >>> import ckpt
    >>> losses = ckpt.analyze("loss", "run.zarr", split="eval")  # doctest: +SKIP
    >>> losses["mean_loss"].plot()                                 # doctest: +SKIP
    """
    report = run(name, store, **kwargs)
    assert report.dataset is not None
    return report.dataset


def run_coordinates(stores: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """Coordinates along ``run`` of several stores: the path, and the run settings they record.

    The settings are the scalar entries of each store's ``attrs`` (``ckpt train`` records
    ``task``, ``preset``, ``seed``) and of ``attrs["config"]`` (e.g. ``weight_decay``, ``lr``)
    that every run has.
    """
    records = []
    for where in stores:
        attrs = ckptstore.open(str(where)).attrs
        record = {k: v for k, v in attrs.items() if isinstance(v, str | int | float | bool)}
        config = attrs.get("config")
        if isinstance(config, Mapping):
            record.update(
                {k: v for k, v in config.items() if isinstance(v, str | int | float | bool) and k not in record}
            )
        records.append(record)
    shared = set.intersection(*(set(r) for r in records)) if records else set()
    coords: dict[str, Any] = {"run": ("run", [str(s) for s in stores])}
    for key in sorted(shared):
        values = [r[key] for r in records]
        coords[key] = ("run", values if not all(isinstance(v, str) for v in values) else [str(v) for v in values])
    return coords


def analyze_runs(
    name: str, stores: Sequence[str | os.PathLike[str]], *, lineage: bool = False, **kwargs: Any
) -> xr.Dataset:
    """Run an analyzer on several stores and return one Dataset with a ``run`` dimension.

    Each store keeps its own result in ``analyses/<name>`` (computed only where missing);
    the results are concatenated along ``run`` (an outer join on ``step``: runs of other
    lengths are padded with NaN), with each run's path and recorded settings (seed, weight
    decay, ...) as coordinates.

    Parameters
    ----------
    name
        Registered analyzer name.
    stores
        Paths of the runs.
    lineage
        Prefix each run with the runs it was initialised from (``ckpt train --init-from``),
        as one trajectory: a child's step ``s`` becomes ``parent_step + s`` (see
        :func:`ckpt.engine.lineage.join_lineage`; the ancestors' results are computed where
        missing, in their own stores). Coordinates ``source`` and ``source_step`` along ``step``
        name the store and step each row comes from.
    **kwargs
        As for :func:`analyze`.

    Examples
    --------
    >>> import glob, ckpt
    >>> geometry = ckpt.analyze_runs("loss", sorted(glob.glob("runs/wd*.zarr")))  # doctest: +SKIP
    >>> geometry["mean_loss"].groupby("weight_decay").mean("run")                     # doctest: +SKIP
    """
    if not stores:
        msg = "analyze_runs needs at least one store"
        raise AnalysisError(msg)
    if lineage:
        from ckpt.engine.lineage import join_lineage

        results = [
            join_lineage(ckptstore.open(str(where)), name, lambda run: analyze(name, run.path, **kwargs))
            for where in stores
        ]
    else:
        results = [analyze(name, where, **kwargs) for where in stores]
    # a lineage's sources differ from run to run: kept per run, not taken from the first
    along = ["source", "source_step"] if lineage else "minimal"
    combined = xr.concat([r.drop_attrs() for r in results], dim="run", join="outer", coords=along, compat="override")
    combined = combined.assign_coords(run_coordinates(stores))
    combined.attrs["ckpt"] = {"analyzer": name, "runs": [str(s) for s in stores]}
    return combined


__all__ = [
    "COMMIT_SECONDS",
    "SCHEDULERS",
    "RunReport",
    "analyze",
    "analyze_runs",
    "compute_settings",
    "data_hash",
    "model_hash",
    "parallel_tasks",
    "run",
    "run_coordinates",
    "stored_identity",
    "stored_provenance",
]

"""Where a run computes: the one place the engine chooses and starts its Dask scheduler.

:func:`choose_schedule` is the decision, as dask's ``get_scheduler`` centralises its own: from
the engine settings (``scheduler``, ``address``, ``workers``, ``device``) it names the kind of
scheduler, how many workers or threads it has, and how many computations run at once on this
machine (they share its memory budget). :func:`compute_settings` starts what it chose and yields
the keyword arguments of ``.compute()``; :func:`local_threads` is how the engine reads stored
results in its own process, whatever computed them.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpt.engine.settings import SCHEDULERS
from ckpt.errors import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.engine.settings import EngineSettings

REMOTE, CLUSTER, PROCESSES, THREADS, SYNC = "remote", "cluster", "processes", "threads", "sync"
"""The kinds of :class:`Schedule`: a running ``distributed`` scheduler, a LocalCluster started for
the run, a process pool, this process's threads, or no parallelism at all."""


@dataclass(frozen=True)
class Schedule:
    """What :func:`choose_schedule` decided.

    Attributes
    ----------
    kind
        One of ``remote``, ``cluster``, ``processes``, ``threads``, ``sync``.
    count
        Workers, processes or threads (None for a remote cluster: known once connected).
    concurrent
        Computations that run at once on this machine and so share its memory budget: the
        computation slots of threads (the others read their next checkpoint), every worker of a
        pool or LocalCluster; 1 for a remote cluster, each of whose machines resolves its own.
    """

    kind: str
    count: int | None
    concurrent: int

    def busy(self, count: int) -> int:
        """Steps computed at once given ``count`` workers: the computation slots of threads, else every worker."""
        return min(count, self.concurrent) if self.kind == THREADS else count


def choose_schedule(
    scheduler: str = "threads", address: str | None = None, workers: int | None = None, device: str = "cpu"
) -> Schedule:
    """The scheduler a run with these settings computes on (nothing is started).

    ``address`` connects to a running ``distributed`` scheduler; ``workers`` with the ``threads``
    scheduler starts a ``LocalCluster`` of that many single-threaded worker processes (with
    ``device="cuda"`` and dask-cuda installed, one worker per GPU); otherwise the local
    ``threads`` (default), ``processes`` or ``sync`` scheduler, with ``workers`` threads/processes.
    """
    from ckpt.engine.worker import concurrent_computations

    if scheduler not in SCHEDULERS:
        msg = f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}"
        raise AnalysisError(msg)
    if address is not None:
        return Schedule(REMOTE, None, 1)
    if workers is not None and workers < 1:
        msg = f"--workers must be at least 1, got {workers}"
        raise AnalysisError(msg)
    if workers is not None and scheduler == THREADS:
        return Schedule(CLUSTER, workers, workers)
    if scheduler == PROCESSES:
        count = workers or os.cpu_count() or 1
        return Schedule(PROCESSES, count, count)
    if scheduler == SYNC:
        return Schedule(SYNC, 1, 1)
    slots = concurrent_computations(device)
    if device != "cpu":
        # one thread computing, one reading the next checkpoint: a thread per core would hold as many
        # checkpoints on the GPU while they wait for its one computation slot, outside the memory budget
        # (docs/performance.md, "Engine scheduling")
        return Schedule(THREADS, slots + 1, slots)
    count = os.cpu_count() or 1
    return Schedule(THREADS, count, min(count, slots))


def schedule_of(settings: EngineSettings) -> Schedule:
    """:func:`choose_schedule` for resolved engine settings."""
    return choose_schedule(settings.scheduler, settings.address, settings.workers, settings.device)


def parallel_tasks(scheduler: str, address: str | None, workers: int | None, device: str = "cpu") -> int:
    """Computations :func:`compute_settings` runs at once on one machine, which share its memory budget."""
    return choose_schedule(scheduler, address, workers, device).concurrent


@contextlib.contextmanager
def compute_settings(
    scheduler: str = "threads",
    address: str | None = None,
    workers: int | None = None,
    device: str = "cpu",
) -> Iterator[tuple[dict[str, Any], int]]:
    """Start what :func:`choose_schedule` chose; yield the keyword arguments of ``.compute()`` and its workers."""
    import dask

    chosen = choose_schedule(scheduler, address, workers, device)
    if chosen.kind == REMOTE:
        from distributed import Client

        try:
            client = Client(address, timeout="10s")
        except OSError as exc:
            msg = f"cannot reach a dask scheduler at {address} ({exc}); start one with `dask scheduler`"
            raise AnalysisError(msg) from None
        with client:
            yield {"scheduler": client}, max(1, len(client.scheduler_info()["workers"]))
        return
    assert chosen.count is not None
    if chosen.kind == CLUSTER:
        from distributed import Client, LocalCluster

        cluster_cls: Any = LocalCluster
        kwargs: dict[str, Any] = {"n_workers": chosen.count, "threads_per_worker": 1, "processes": True}
        if device.startswith("cuda"):
            with contextlib.suppress(ImportError):
                from dask_cuda import LocalCUDACluster

                cluster_cls, kwargs = LocalCUDACluster, {"n_workers": chosen.count, "threads_per_worker": 1}
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
            yield {"scheduler": client}, chosen.count
        return
    if chosen.kind == PROCESSES:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # one pool for the whole run, so models and data stay cached in its processes
        with ProcessPoolExecutor(chosen.count, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield {"scheduler": "processes", "pool": pool}, chosen.count
        return
    import dask.local
    import dask.threaded

    # the scheduler itself, not its name: given a name, dask imports distributed to look for a client
    # first, a visible share of every run's start-up (docs/performance.md, "Start-up and imports")
    if chosen.kind == SYNC:
        yield {"scheduler": dask.local.get_sync}, 1
        return
    yield {"scheduler": dask.threaded.get, "num_workers": chosen.count}, chosen.count


@contextlib.contextmanager
def local_threads(*, unless_configured: bool = True) -> Iterator[None]:
    """Within: dask computes on this process's threads, given as the scheduler itself.

    How the engine reads stored results where the store is (a result streamed from a journal
    is copied a few stored chunks at a time, whatever scheduler computed it). With
    ``unless_configured``, a scheduler the user configured is kept: reading a result back is
    theirs to place. Given none, or one by name, dask would import ``distributed`` to look for
    a client first.
    """
    if unless_configured:
        from ckpt.store.results import threads_unless_configured

        with threads_unless_configured():
            yield
        return
    import dask
    import dask.threaded

    with dask.config.set(scheduler=dask.threaded.get):
        yield


__all__ = [
    "CLUSTER",
    "PROCESSES",
    "REMOTE",
    "SCHEDULERS",
    "SYNC",
    "THREADS",
    "Schedule",
    "choose_schedule",
    "compute_settings",
    "local_threads",
    "parallel_tasks",
    "schedule_of",
]

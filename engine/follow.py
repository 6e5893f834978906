"""Following a run while it trains: compute what is there, then each checkpoint as it is committed.

:func:`follow` runs :func:`ckpt.engine.runner.run` once, then again each time the store's
commit record gains checkpoints (:class:`~ckpt.engine.waiting.RecordWatch` wakes it), until
the writer marks the run finished (``Writer.close()``), ``until_idle`` seconds pass without a
new checkpoint, or the process is interrupted. What a run computes is what its plan finds
missing, so:

- a per-checkpoint analyzer (``loss``, ``grad-norms`` ...) computes each new checkpoint once;
- a pair analyzer computes each pair once both of its checkpoints are committed;
- a per-run analyzer (``clusters``, ``loss-spikes``, ``hessian-basis`` ...) is recomputed over
  the whole run at most once per ``every`` seconds while checkpoints arrive, and once more at
  the end when checkpoints came after its last computation.

Everything committed stays committed: an interrupt (Ctrl-C) loses at most the block being
computed, which the next run computes again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ckpt.store as ckptstore
from ckpt.engine.runner import RunReport, run
from ckpt.engine.settings import EngineSettings, with_engine_settings
from ckpt.engine.waiting import DEFAULT_EVERY, RecordWatch, parse_duration
from ckpt.errors import StoreLockedError
from ckpt.plugins import PER_RUN
from ckpt.plugins.manager import registry as shared_registry

BUSY_RETRY = 1.0
"""Seconds before a follower tries again a result another process is computing."""

RECHECK = 60.0
"""Seconds after which the record is re-read although no wake said it changed (a missed notification)."""


@dataclass
class FollowReport:
    """What one :func:`follow` did."""

    name: str
    computed_steps: list[int] = field(default_factory=list)
    """Steps (or first steps of pairs) computed while following, in order, each once."""
    runs: int = 0
    """Runs of the analyzer that computed something (a per-run analyzer: its recomputations)."""
    stopped: str = ""
    """Why it stopped: ``"finished"`` (the writer closed the run) or ``"idle"`` (``until_idle`` passed)."""
    last: RunReport | None = None
    """The last run's report; ``last.dataset`` is the complete stored result."""


@with_engine_settings
def follow(
    name: str,
    store: str | os.PathLike[str] | ckptstore.Store,
    *,
    until_idle: str | float | None = None,
    every: str | float = DEFAULT_EVERY,
    on_report: Callable[[RunReport], None] | None = None,
    fastest: float = 0.2,
    slowest: float = 5.0,
    **kwargs: Any,
) -> FollowReport:
    """Run analyzer ``name`` on ``store`` and keep it up to date as checkpoints are committed.

    Returns when the writer closed the run (its commit record marks it finished), or when
    ``until_idle`` passed with no new checkpoint; Ctrl-C raises ``KeyboardInterrupt`` with
    every computed block committed. Without ``until_idle`` a store that is never marked
    finished (one written before ckpt recorded the mark) is followed until interrupted.

    Parameters
    ----------
    name
        Registered analyzer name.
    store
        Path or URL of the checkpoint store (or a :class:`ckpt.store.Store` opened on it).
    until_idle
        Stop after this long without a new checkpoint: seconds, or ``"30s"``, ``"10m"``, ``"1h"``.
    every
        A per-run analyzer is recomputed at most once per this long while checkpoints arrive
        (and once more at the end); other analyzers compute each new checkpoint at once.
    on_report
        Called with each run's :class:`~ckpt.engine.runner.RunReport` (the first one included).
    fastest, slowest
        Polling interval bounds in seconds where the store is polled (object stores).
    {engine_settings}
    **options
        The analyzer's options.

    Returns
    -------
    FollowReport
        The steps computed, why it stopped, the last run's report (the stored result).
    """
    idle = None if until_idle is None else parse_duration(until_idle, "--until-idle")
    cadence = parse_duration(every, "--rerun-every")
    settings, _options = EngineSettings.split(kwargs)
    registry = settings.registry if settings.registry is not None else shared_registry()
    kwargs["registry"] = registry
    if isinstance(store, ckptstore.Store):
        opened = store
    else:
        opened = ckptstore.open(str(store), storage_options=settings.storage_options)
    per_run = name in registry.analyzers and registry.analyzers[name].per == PER_RUN
    report = FollowReport(name)
    watch = RecordWatch(opened.path, settings.storage_options, fastest=fastest, slowest=slowest)
    try:
        return _loop(name, opened, kwargs, report, watch, idle, cadence, per_run, on_report)
    finally:
        watch.close()


def _loop(
    name: str,
    store: ckptstore.Store,
    kwargs: dict[str, Any],
    report: FollowReport,
    watch: RecordWatch,
    idle: float | None,
    cadence: float,
    per_run: bool,
    on_report: Callable[[RunReport], None] | None,
) -> FollowReport:
    known: set[int] = set()
    stale = True  # checkpoints the result does not cover yet
    last_new = last_run = last_read = time.monotonic()
    while True:
        store.refresh()
        last_read = time.monotonic()
        steps = {int(s) for s in store.steps}
        if steps - known:
            known |= steps
            stale, last_new = True, last_read
        finished = _finished(store)
        due = not per_run or report.last is None or finished or last_read - last_run >= cadence
        if stale and steps and due:
            if not _run_once(name, store, kwargs, report, on_report):
                watch.wait(BUSY_RETRY)  # another process computes this result: its commit may be all we need
                continue
            # idle is time without a checkpoint while waiting for one, not the time computing took
            stale, last_run = False, time.monotonic()
            last_new = max(last_new, last_run)
            continue  # a block took time: read what was committed meanwhile before waiting
        if finished:
            report.stopped = "finished"
            return report
        now = time.monotonic()
        if idle is not None and now - last_new >= idle:
            if stale and steps and not _run_once(name, store, kwargs, report, on_report):
                continue  # a per-run result not yet over the last checkpoints, held by another process
            report.stopped = "idle"
            return report
        waits = [RECHECK - (now - last_read)]
        if idle is not None:
            waits.append(idle - (now - last_new))
        if stale and per_run:
            waits.append(cadence - (now - last_run))
        watch.wait(max(0.0, min(waits)))


def _run_once(
    name: str,
    store: ckptstore.Store,
    kwargs: dict[str, Any],
    report: FollowReport,
    on_report: Callable[[RunReport], None] | None,
) -> bool:
    """One run; False when another process holds the result (computing it): the follower tries again."""
    try:
        done = run(name, store, **kwargs)
    except StoreLockedError:
        return False
    kwargs["force"] = False  # --force recomputes what was stored before following, not each new checkpoint
    if done.computed_steps:
        report.runs += 1
        seen = set(report.computed_steps)
        report.computed_steps += [s for s in done.computed_steps if s not in seen]
    report.last = done
    if on_report is not None:
        on_report(done)
    return True


def _finished(store: ckptstore.Store) -> bool:
    """Whether the commit record marks the run finished (a store written before the mark: not finished)."""
    return store.finished is True


__all__ = ["DEFAULT_EVERY", "FollowReport", "follow", "parse_duration"]

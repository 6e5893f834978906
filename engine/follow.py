"""Following a run while it trains: compute what is there, then each checkpoint as it is committed.

:func:`follow` runs :func:`ckpt.engine.runner.run` once, then again each time the store's
commit record gains checkpoints (:class:`~ckpt.engine.waiting.RecordWatch` wakes it), until
the writer marks the run finished (``Writer.close()``), ``until_idle`` seconds pass without a
new checkpoint, or the process is interrupted. What a run computes is what its plan finds
missing, so:

- a per-checkpoint analyzer (``loss``, ``grad-norms`` ...) computes each new checkpoint once;
- a pair analyzer computes each pair once both of its checkpoints are committed;
- a per-run analyzer (``clusters``, ``loss-spikes`` ...) is recomputed over the whole run at
  most once per ``rerun_every`` seconds while checkpoints arrive, and once more at the end when
  checkpoints came after its last computation;
- a per-run analyzer that says which checkpoints change it (a method ``recomputes_at(step)``:
  ``hessian-basis`` grows at the basis checkpoints of its schedule, ``--every`` /
  ``--at-steps``) is recomputed as soon as one of those is committed, not at the cadence, and
  once more at the end;
- an analyzer that requires a per-run result (``polca`` reads the final basis, so each pair
  changes when the basis grows) is recomputed whole with it: when its requirement would be
  (a basis checkpoint, else the cadence) and at the end, never at each checkpoint, which would
  recompute that requirement whole each time.

Everything committed stays committed: an interrupt (Ctrl-C) loses at most the block being
computed, which the next run computes again. :func:`follow_loop` is that loop for one analyzer
or several (:func:`ckpt.engine.watch.watch`, ``ckpt watch``), run one after the other at each wake.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import ckpt.store as ckptstore
from ckpt.engine.runner import RunReport, run
from ckpt.engine.settings import EngineSettings, with_engine_settings
from ckpt.engine.waiting import DEFAULT_EVERY, RecordWatch, parse_duration
from ckpt.errors import AnalysisError, CkptError, StoreLockedError
from ckpt.plugins import PER_PAIR, PER_RUN
from ckpt.plugins.manager import Registry
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
    rerun_every: str | float = DEFAULT_EVERY,
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
    rerun_every
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
    cadence = parse_duration(rerun_every, "--rerun-every")
    settings, options = EngineSettings.split(kwargs)
    registry = settings.registry if settings.registry is not None else shared_registry()
    kwargs["registry"] = registry
    if isinstance(store, ckptstore.Store):
        opened = store
    else:
        opened = ckptstore.open(str(store), storage_options=settings.storage_options)
    followed = Followed(name, kwargs, *schedule(name, options, registry), needs=needs(name, registry))
    watch = RecordWatch(opened.path, settings.storage_options, fastest=fastest, slowest=slowest)
    try:
        follow_loop(opened, [followed], watch, idle, cadence, on_report)
    finally:
        watch.close()
    if followed.report.last is None:  # stopped before the store held what its first run needs
        cls = registry.analyzers.get(name)
        if cls is not None and cls.per == PER_PAIR and followed.needs == 2:
            what = "compares pairs of consecutive checkpoints"
        else:
            what = f"needs {followed.needs} checkpoints" if followed.needs > 1 else "needs a checkpoint"
        msg = f"{name} {what} and {opened.path} has {len(opened.steps)} when the follower stopped: nothing computed"
        raise AnalysisError(msg)
    return followed.report


@dataclass
class Followed:
    """One analyzer a follower keeps up to date: its run's keywords and what it did so far."""

    name: str
    kwargs: dict[str, Any]
    """What each run gets: the engine settings (the registry among them) and the analyzer's options."""
    per_run: bool
    """Recomputed whole (at most once per cadence while checkpoints arrive, and at the end)."""
    recomputes_at: Callable[[int], bool] | None = None
    """Of a per-run analyzer: whether a new checkpoint at a step changes it (it is recomputed then,
    not at the cadence); None: the cadence decides."""
    changed: bool = False
    """Whether a checkpoint ``recomputes_at`` accepts came since the last run."""
    report: FollowReport = field(init=False)
    stale: bool = True
    """Whether checkpoints came that the result does not cover yet."""
    last_run: float = field(default_factory=time.monotonic)
    needs: int = 1
    """Checkpoints the store must hold before the first run (a pair analyzer: two)."""
    optional: bool = False
    """Left out, instead of failing the follower, when its first run refuses the store (an
    :class:`~ckpt.errors.AnalysisError`: a model without what it measures)."""
    left_out: str = ""
    """Why an optional analyzer was left out (its error), or empty."""

    def __post_init__(self) -> None:
        self.report = FollowReport(self.name)

    def due(self, now: float, finished: bool, cadence: float) -> bool:
        """Whether it runs now: stale, and not a per-run one waiting for its cadence or a checkpoint that changes it."""
        if not self.stale or not self.per_run or self.report.last is None or finished:
            return self.stale
        if self.recomputes_at is not None:
            return self.changed
        return now - self.last_run >= cadence

    def committed(self, steps: set[int]) -> None:
        """New checkpoints at ``steps``: stale, and changed when one of them changes a per-run result."""
        self.stale = True
        if self.recomputes_at is not None and any(self.recomputes_at(step) for step in sorted(steps)):
            self.changed = True

    @property
    def on_cadence(self) -> bool:
        """Whether the cadence decides when it is recomputed (a stale one wakes the loop for it)."""
        return self.per_run and self.recomputes_at is None


def needs(name: str, registry: Registry) -> int:
    """Checkpoints a store must hold before ``name`` computes anything: its ``min_checkpoints`` (pairs: 2+)."""
    cls = registry.analyzers.get(name)
    if cls is None:
        return 1
    return max(cls.min_checkpoints, 2 if cls.per == PER_PAIR else 1)


def schedule(name: str, options: dict[str, Any], registry: Registry) -> tuple[bool, Callable[[int], bool] | None]:
    """Whether ``name`` is recomputed whole while following, and which new checkpoints change it (None: any).

    A per-run analyzer is; so is one requiring a per-run result (directly or through others),
    changed where that result is. ``recomputes_at`` is the analyzer's method of that name, where
    it has one (each of the per-run results it requires must have one, else the cadence decides).
    An analyzer that cannot be built with ``options`` is left to its run to refuse.
    """
    cls = registry.analyzers.get(name)
    try:
        analyzer = cls(**options) if cls is not None else None
    except (CkptError, TypeError):
        analyzer = None
    if analyzer is None:
        return False, None
    if analyzer.per == PER_RUN:
        return True, getattr(analyzer, "recomputes_at", None)
    given = analyzer.dependency_options()
    hooks = [schedule(dependency, dict(given.get(dependency) or {}), registry) for dependency in analyzer.requires]
    whole = [hook for per_run, hook in hooks if per_run]
    if not whole:
        return False, None
    if any(hook is None for hook in whole):
        return True, None
    return True, lambda step: any(hook(step) for hook in whole if hook is not None)


def follow_loop(
    store: ckptstore.Store,
    followed: list[Followed],
    watch: RecordWatch,
    idle: float | None,
    cadence: float,
    on_report: Callable[[RunReport], None] | None,
    rounds: Callable[[set[int]], AbstractContextManager[Any]] | None = None,
) -> str:
    """Keep every analyzer of ``followed`` up to date on ``store`` until it is finished or idle; why it stopped.

    ``"finished"``, ``"idle"``, or ``"left out"`` when every analyzer was (each optional, none
    applying to the store). Each wake that finds new checkpoints runs the analyzers due, one after the other, inside
    ``rounds(new steps)`` when given (what a watch shares their reads with). Each report's
    ``stopped`` says why.
    """
    known: set[int] = set()
    everyone = followed
    fresh: set[int] = set()  # committed steps not yet computed by every analyzer due
    last_new = last_read = time.monotonic()
    while True:
        store.refresh()
        last_read = time.monotonic()
        steps = {int(s) for s in store.steps}
        if steps - known:
            fresh |= steps - known
            for one in followed:
                one.committed(steps - known)
            known |= steps
            last_new = last_read
        finished = _finished(store)
        followed = [one for one in everyone if not one.left_out]
        if not followed:
            return _stopped(everyone, "left out")
        due = [one for one in followed if len(steps) >= one.needs and one.due(last_read, finished, cadence)]
        if due:
            ran, busy = _round(store, due, on_report, fresh, rounds)
            if ran:
                fresh = set()
                # idle is time without a checkpoint while waiting for one, not the time computing took
                last_new = max(last_new, max(one.last_run for one in ran))
                continue  # a block took time: read what was committed meanwhile before waiting
            if busy:
                watch.wait(BUSY_RETRY)  # another process computes this result: its commit may be all we need
                continue
        if finished:
            return _stopped(everyone, "finished")
        now = time.monotonic()
        if idle is not None and now - last_new >= idle:
            stale = [one for one in followed if one.stale and len(steps) >= one.needs]
            if stale and _round(store, stale, on_report, fresh, rounds)[1]:
                continue  # a per-run result not yet over the last checkpoints, held by another process
            return _stopped(everyone, "idle")
        waits = [RECHECK - (now - last_read)]
        if idle is not None:
            waits.append(idle - (now - last_new))
        waits += [cadence - (now - one.last_run) for one in followed if one.stale and one.on_cadence]
        watch.wait(max(0.0, min(waits)))


def _round(
    store: ckptstore.Store,
    due: list[Followed],
    on_report: Callable[[RunReport], None] | None,
    fresh: set[int],
    rounds: Callable[[set[int]], AbstractContextManager[Any]] | None,
) -> tuple[list[Followed], list[Followed]]:
    """Run each analyzer of ``due`` once; those that ran, and those another process holds (tried again later)."""
    ran, busy = [], []
    with rounds(fresh) if rounds is not None else nullcontext():
        for one in due:
            try:
                done = _run_once(one, store, on_report)
            except AnalysisError as exc:
                if not one.optional or one.report.last is not None:
                    raise
                one.left_out = str(exc)  # its first run: it does not apply to this store
                continue
            if done:
                one.stale, one.changed, one.last_run = False, False, time.monotonic()
                ran.append(one)
            else:
                busy.append(one)
    return ran, busy


def _stopped(followed: list[Followed], why: str) -> str:
    for one in followed:
        one.report.stopped = why
    return why


def _run_once(one: Followed, store: ckptstore.Store, on_report: Callable[[RunReport], None] | None) -> bool:
    """One run; False when another process holds the result (computing it): the follower tries again."""
    try:
        done = run(one.name, store, **one.kwargs)
    except StoreLockedError:
        return False
    one.kwargs["force"] = False  # --force recomputes what was stored before following, not each new checkpoint
    report = one.report
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


__all__ = ["DEFAULT_EVERY", "FollowReport", "Followed", "follow", "follow_loop", "needs", "parse_duration", "schedule"]

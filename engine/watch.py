"""Watching a run: several analyzers followed in one process, each new checkpoint read once for all of them.

:func:`watch` is :func:`ckpt.engine.follow.follow` for several analyzers: the same loop
(:func:`~ckpt.engine.follow.follow_loop`), the same stopping rules (the writer closes the run,
``until_idle``, Ctrl-C with every committed block kept) and the same cadence for per-run
analyzers. Each wake that finds new checkpoints runs the analyzers one after the other on one
:class:`~ckpt.engine.watch_reads.SharedReads` store, which reads each new checkpoint once and
hands every analyzer its tensors from memory. Each analyzer's result is the one
``ckpt analyze NAME`` computes alone: the runs are the same runs, only their reads are shared.

Which analyzers (:func:`default_analyzers`): without names, every registered analyzer that
grows by one row per checkpoint (``per="checkpoint"``) and requires no other result (no basis,
no result of another analyzer): a few passes over each new checkpoint, nothing recomputed
over the whole run. Those whose first run refuses the store (a model without attention for
``attention``) are left out, saying why. A named analyzer may be any; one that requires a
per-run result (a basis: ``polca``, ``fisher``, ``clusters``) is refused while the store holds
none, since each new checkpoint would otherwise recompute that basis over the whole run
(``ckpt analyze NAME STORE --follow`` follows such an analyzer, basis and all).

Every analyzer runs with the options of its stored result, or its defaults where none is
stored, so that a watch extends what is stored instead of replacing it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ckpt.store as ckptstore
from ckpt.engine.follow import Followed, FollowReport, follow_loop, needs, schedule
from ckpt.engine.plan import stored_provenance
from ckpt.engine.runner import RunReport
from ckpt.engine.settings import EngineSettings, with_engine_settings
from ckpt.engine.waiting import DEFAULT_EVERY, RecordWatch, parse_duration
from ckpt.engine.watch_reads import SharedReads
from ckpt.errors import AnalysisError
from ckpt.plugins import PER_CHECKPOINT, PER_RUN, Analyzer
from ckpt.plugins.manager import Registry
from ckpt.plugins.manager import registry as shared_registry

READ_SHARE = 4
"""The checkpoints a watch keeps for its analyzers take at most this fraction (1/N) of the memory budget."""


@dataclass
class WatchReport:
    """What one :func:`watch` did."""

    reports: dict[str, FollowReport] = field(default_factory=dict)
    """Each watched analyzer's :class:`~ckpt.engine.follow.FollowReport`, in the order watched."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Default analyzers left out because their first run refused the store: name -> why."""
    stopped: str = ""
    """``"finished"`` (the writer closed the run) or ``"idle"`` (``until_idle`` passed)."""
    reads: int = 0
    """Checkpoints read once for every analyzer (the shared reads)."""


def default_analyzers(registry: Registry) -> list[str]:
    """The analyzers a watch follows when none is named: per checkpoint, requiring no other result, by name."""
    chosen = []
    for name, cls in sorted(registry.analyzers.items()):
        if cls.per == PER_CHECKPOINT and not _built(cls, {}).requires:
            chosen.append(name)
    return chosen


@with_engine_settings
def watch(
    store: str | os.PathLike[str] | ckptstore.Store,
    names: Sequence[str] = (),
    *,
    until_idle: str | float | None = None,
    rerun_every: str | float = DEFAULT_EVERY,
    on_report: Callable[[RunReport], None] | None = None,
    fastest: float = 0.2,
    slowest: float = 5.0,
    **kwargs: Any,
) -> WatchReport:
    """Keep the analyzers ``names`` (default: :func:`default_analyzers`) up to date on ``store`` as it trains.

    Returns when the writer closed the run, or when ``until_idle`` passed with no new checkpoint;
    Ctrl-C raises ``KeyboardInterrupt`` with every computed block committed.

    Parameters
    ----------
    store
        Path or URL of the checkpoint store (or a :class:`ckpt.store.Store` opened on it: its path
        is opened again to share its reads).
    names
        Registered analyzer names; empty: the default ones.
    until_idle
        Stop after this long without a new checkpoint: seconds, or ``"30s"``, ``"10m"``, ``"1h"``.
    rerun_every
        A per-run analyzer is recomputed at most once per this long while checkpoints arrive.
    on_report
        Called with each run's :class:`~ckpt.engine.runner.RunReport`.
    fastest, slowest
        Polling interval bounds in seconds where the store is polled (object stores).
    {engine_settings}
    **options
        None: each analyzer runs with the options of its stored result, or its defaults.

    Returns
    -------
    WatchReport
        Each analyzer's report, those left out, why it stopped, the checkpoints read.
    """
    idle = None if until_idle is None else parse_duration(until_idle, "--until-idle")
    cadence = parse_duration(rerun_every, "--rerun-every")
    settings, options = EngineSettings.split(kwargs)
    if options:
        msg = (
            f"ckpt watch runs each analyzer with its stored (or default) options, got {sorted(options)[0]!r}: "
            "follow an analyzer with options of its own with ckpt analyze NAME STORE --follow"
        )
        raise AnalysisError(msg)
    if settings.save_as is not None:
        msg = "--as keeps one analyzer's result under another name: follow it with ckpt analyze NAME STORE --follow"
        raise AnalysisError(msg)
    registry = settings.registry if settings.registry is not None else shared_registry()
    resolved = settings.resolve()  # a wrong setting is one error before the store is opened
    where = store.path if isinstance(store, ckptstore.Store) else str(store)
    budget = resolved.budget if resolved.budget is not None else 1 << 32
    shared = SharedReads(where, storage_options=settings.storage_options, limit=budget // READ_SHARE)
    optional = not names
    chosen = list(dict.fromkeys(names)) if names else default_analyzers(registry)
    followed = [_followed(name, shared, registry, kwargs, optional=optional) for name in chosen]
    if not followed:
        msg = "no registered analyzer grows by one row per checkpoint without another result: name the analyzers"
        raise AnalysisError(msg)
    report = WatchReport()
    record = RecordWatch(shared.path, settings.storage_options, fastest=fastest, slowest=slowest)
    try:
        report.stopped = follow_loop(shared, followed, record, idle, cadence, on_report, rounds=shared.round)
    finally:
        record.close()
        report.reads = shared.reads
        report.reports = {one.name: one.report for one in followed if not one.left_out}
        report.left_out = {one.name: one.left_out for one in followed if one.left_out}
    if report.stopped == "left out":
        why = "; ".join(f"{name}: {reason}" for name, reason in report.left_out.items())
        msg = f"none of the default analyzers applies to {shared.path} ({why}): name the analyzers to watch"
        raise AnalysisError(msg)
    return report


def _followed(
    name: str, store: ckptstore.Store, registry: Registry, kwargs: dict[str, Any], *, optional: bool
) -> Followed:
    """What the loop follows of ``name``: its run's keywords, with the options of its stored result."""
    if name not in registry.analyzers:
        known = ", ".join(sorted(registry.analyzers)) or "none"
        msg = f"unknown analyzer {name!r}; registered analyzers: {known} (see `ckpt plugins`)"
        raise AnalysisError(msg)
    cls = registry.analyzers[name]
    stored = dict((stored_provenance(store, name) or {}).get("options") or {})
    chain = _missing_basis(name, _built(cls, stored), store, registry, ())
    if chain:
        missing, through = chain[-1], f" (through {' and '.join(chain[:-1])})" if len(chain) > 1 else ""
        msg = (
            f"{name} requires {missing}{through}, a result over the whole run (a basis), which {store.path} does "
            f"not hold: compute it first (ckpt analyze {missing} {store.path}), or follow {name} with its basis "
            f"(ckpt analyze {name} {store.path} --follow)"
        )
        raise AnalysisError(msg)
    run_kwargs = {**kwargs, "registry": registry, **stored}
    return Followed(name, run_kwargs, *schedule(name, stored, registry), needs=needs(name, registry), optional=optional)


def _built(cls: type[Analyzer], options: dict[str, Any]) -> Analyzer:
    """``cls`` with ``options`` (its ``requires`` may depend on them: ``--basis``)."""
    return cls(**options)


def _missing_basis(
    name: str, analyzer: Analyzer, store: ckptstore.Store, registry: Registry, active: tuple[str, ...]
) -> list[str]:
    """The requirements leading to the first per-run result ``analyzer`` needs and ``store`` lacks (empty: none).

    The last name is the missing result, those before it the requirements through which it is needed.
    """
    given = analyzer.dependency_options()
    for dependency in analyzer.requires:
        cls = registry.analyzers.get(dependency)
        if cls is None or dependency in active:
            continue  # the run says what is wrong, as it does for ckpt analyze
        if cls.per == PER_RUN and dependency not in store.analyses:
            return [dependency]
        options = given.get(dependency) or dict((stored_provenance(store, dependency) or {}).get("options") or {})
        found = _missing_basis(dependency, _built(cls, options), store, registry, (*active, name))
        if found:
            return [dependency, *found]
    return []


__all__ = ["READ_SHARE", "WatchReport", "default_analyzers", "watch"]

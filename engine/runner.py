"""One request, end to end: dependencies first, then plan, compute and commit, then the result read back.

:func:`run` opens the store once and passes that :class:`~ckpt.store.Store` down: to the
dependencies (each run through the same path), to :func:`~ckpt.engine.plan.plan`, to
:func:`~ckpt.engine.compute.compute`, and to the read-back. The store is refreshed (its
commit record read again), not reopened, where it must see what was committed meanwhile:
under the result's lock, and after the result was written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.compute import compute
from ckpt.engine.plan import plan, requirement_identity, stored_provenance
from ckpt.engine.resume import Journal
from ckpt.engine.schedule import local_threads
from ckpt.engine.settings import EngineSettings, with_engine_settings
from ckpt.engine.worker import lend_store
from ckpt.errors import AnalysisError, NonFiniteWarning, UnverifiedStoreWarning
from ckpt.plugins import PER_PAIR, PER_RUN, Analyzer
from ckpt.plugins.manager import Registry
from ckpt.plugins.manager import registry as shared_registry
from ckpt.store.provenance import Provenance
from ckpt.store.results import result_lock


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


@with_engine_settings
def run(name: str, store: str | os.PathLike[str] | ckptstore.Store, **kwargs: Any) -> RunReport:
    """Run analyzer ``name`` on ``store``, computing only what is missing; see :func:`ckpt.analyze`.

    Parameters
    ----------
    name
        Registered analyzer name.
    store
        Path or URL of the checkpoint store, or a :class:`ckpt.store.Store` opened on it
        (refreshed, not reopened).
    {engine_settings}
    **options
        The analyzer's options.

    Returns
    -------
    RunReport
        The steps computed and reused, the dependencies' reports, the stored result (lazy).
    """
    settings, options = EngineSettings.split(kwargs)
    registry = settings.registry if settings.registry is not None else shared_registry()
    analyzer = _analyzer(name, registry, options, ())
    settings = dataclasses.replace(settings.resolve(), registry=registry)
    if isinstance(store, ckptstore.Store):
        opened = store
        opened.refresh()
    else:
        opened = ckptstore.open(str(store), storage_options=settings.storage_options)
    unverifiable = opened.unverifiable_summary()
    if unverifiable is not None:  # once per run, not per dependency, worker or checkpoint
        warnings.warn(unverifiable, UnverifiedStoreWarning, stacklevel=3)
    return _run(analyzer, opened, settings, registry, ())


def _analyzer(name: str, registry: Registry, options: Mapping[str, Any], active: tuple[str, ...]) -> Analyzer:
    """The registered analyzer ``name`` built with ``options`` (its errors name the option)."""
    if name not in registry.analyzers:
        known = ", ".join(sorted(registry.analyzers)) or "none"
        msg = f"unknown analyzer {name!r}; registered analyzers: {known} (see `ckpt plugins`)"
        raise AnalysisError(msg)
    if name in active:
        msg = f"analyzers require each other in a cycle: {' -> '.join([*active, name])}"
        raise AnalysisError(msg)
    return registry.analyzers[name](**options)


def _run(
    analyzer: Analyzer,
    store: ckptstore.Store,
    settings: EngineSettings,
    registry: Registry,
    active: tuple[str, ...],
) -> RunReport:
    """Run ``analyzer`` on the open ``store``: its dependencies, then what its plan computes."""
    name = analyzer.name
    # --as and --force are the request's: a dependency keeps its own name and is reused where it can be
    target = (settings.save_as if not active else None) or name
    force = settings.force and not active
    # user mistakes first: an error after the dependencies ran would leave the store changed
    _check_target(name, target, store, registry)
    _check_pairs(analyzer, store)
    analyzer.preflight(store)
    report = RunReport(target)
    results, requirements = _dependencies(analyzer, store, settings, registry, active, report)
    for _attempt in range(CATCH_UP):
        # one process computes a result at a time (a second one is refused); its workers and journal in this
        # process read through this run's store
        with result_lock(store.path, target), lend_store(store, settings.storage_options):
            store.refresh()  # what another process committed before the lock was taken
            if not _behind(analyzer, store, results, registry):
                _plan_and_compute(analyzer, store, settings, target, force, requirements, results, report)
                break
        # a writer committed checkpoints after the dependencies ran: they compute those first (only those)
        results, requirements = _dependencies(analyzer, store, settings, registry, active, report)
    else:
        msg = (
            f"the checkpoints of {store.path} grow faster than the results {name!r} requires are computed "
            f"({', '.join(analyzer.requires)}): run it again when the writer pauses, or follow the run with "
            f"ckpt analyze {name} {store.path} --follow"
        )
        raise AnalysisError(msg)
    report.dataset = store.analysis(target)
    return report


CATCH_UP = 5
"""Times a run computes its dependencies again when a writer committed checkpoints meanwhile."""


def _dependencies(
    analyzer: Analyzer,
    store: ckptstore.Store,
    settings: EngineSettings,
    registry: Registry,
    active: tuple[str, ...],
    report: RunReport,
) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
    """Run ``analyzer``'s dependencies; their results and what the request records of them.

    Their reports join ``report.dependencies``; a dependency run again (a writer added checkpoints)
    adds the steps it computed to its earlier report.
    """
    name = analyzer.name
    results: dict[str, xr.Dataset] = {}
    requirements: dict[str, Any] = {}
    dependency_options = analyzer.dependency_options()
    earlier = {sub.name: sub for sub in report.dependencies}
    for dependency in analyzer.requires:
        if dependency not in registry.analyzers:
            known = ", ".join(sorted(registry.analyzers)) or "none"
            msg = f"analyzer {name!r} requires {dependency!r}, which is not registered; registered analyzers: {known}"
            raise AnalysisError(msg)
        sub_options = dependency_options.get(dependency, {})
        if sub_options is None:  # "whatever is stored": reuse the stored result's options
            sub_options = dict((stored_provenance(store, dependency) or {}).get("options") or {})
        required = _analyzer(dependency, registry, sub_options, (*active, name))
        sub = _run(required, store, settings, registry, (*active, name))
        if sub.name in earlier:
            before = earlier[sub.name]
            before.computed_steps += [s for s in sub.computed_steps if s not in set(before.computed_steps)]
            before.dataset, before.reused_steps = sub.dataset, sub.reused_steps
        else:
            report.dependencies.append(sub)
        assert sub.dataset is not None
        results[dependency] = sub.dataset
        requirements[dependency] = requirement_identity(sub.dataset, required.per)
    return results, requirements


def _behind(analyzer: Analyzer, store: ckptstore.Store, results: Mapping[str, xr.Dataset], registry: Registry) -> bool:
    """Whether a required result of one row per checkpoint (or pair) lacks a checkpoint the store now holds.

    Checkpoints committed between a dependency's run and this plan would be planned for, and a
    per-run result would claim them, with the dependency's rows missing: never computed on.
    """
    steps = [int(s) for s in store.steps]
    for dependency, result in results.items():
        per = registry.analyzers[dependency].per
        if per == PER_RUN or "step" not in result.dims:
            continue
        wanted = steps[:-1] if per == PER_PAIR else steps
        if not set(wanted) <= {int(s) for s in result["step"].values}:
            return True
    return False


def _plan_and_compute(
    analyzer: Analyzer,
    store: ckptstore.Store,
    settings: EngineSettings,
    target: str,
    force: bool,
    requirements: dict[str, Any],
    results: dict[str, xr.Dataset],
    report: RunReport,
) -> None:
    """Under the result's lock: plan what is missing, compute and commit it."""
    decided = plan(analyzer, store, requirements, target=target, force=force)
    report.reused_steps = list(decided.reused)
    journal = _journal(analyzer, target, store.path, decided.provenance, settings.storage_options)
    if journal is not None and force:
        journal.discard()
    if decided.computes:
        report.resumed = compute(analyzer, decided, store, results, settings, journal)
        report.computed_steps = list(decided.missing)
        store.refresh()  # the result just committed
        _warn_if_nonfinite(store, target, list(decided.missing))


def _journal(
    analyzer: Analyzer, target: str, where: str, provenance: Provenance, storage_options: Any
) -> Journal | None:
    """Where a per-run result's pieces are committed as they are found (None for other analyzers)."""
    from ckpt.store.format import PARTIAL_SUFFIX, check_name

    if analyzer.per != PER_RUN or check_name(f"{target}{PARTIAL_SUFFIX}", "analysis") is not None:
        return None
    digest = hashlib.sha256(json.dumps(provenance.identity(), sort_keys=True, default=str).encode()).hexdigest()
    return Journal(where, target, analyzer.name, digest, storage_options)


def _warn_if_nonfinite(store: ckptstore.Store, target: str, steps: list[int]) -> None:
    """Warn once when the new part of a result is NaN or inf where the checkpoint itself holds NaN or inf.

    Many results hold NaN by design (grad-norms' update at the first checkpoint, a cluster without a
    breakthrough), so a NaN alone says nothing; one computed from weights that are not finite is a
    number no analysis can stand behind. Only the steps just computed are looked at, and only the
    checkpoints of steps whose values are not finite are read again.
    """
    from ckpt.store.reader import describe_nonfinite

    result = store.analysis(target)
    flagged: dict[int, list[str]] = {}
    for name, variable in result.data_vars.items():
        if "step" not in variable.dims or not steps:
            continue
        part = variable.sel(step=[s for s in steps if s in set(result["step"].values.tolist())])
        if part.dtype.kind not in "fc":
            continue
        with local_threads():  # else dask imports distributed to look for a client
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


def _check_pairs(analyzer: Analyzer, store: ckptstore.Store) -> None:
    """Refuse a pair analyzer on a store of fewer than two checkpoints, before its dependencies run."""
    if analyzer.per == PER_PAIR and len(store.steps) < 2:
        msg = (
            f"{analyzer.name} compares pairs of consecutive checkpoints and {store.path} has "
            f"{len(store.steps)}: run it once the store holds two or more"
        )
        raise AnalysisError(msg)


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


__all__ = ["RunReport", "run"]

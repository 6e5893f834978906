"""What a request computes: the stored steps it reuses and the missing ones, decided without computing.

:func:`plan` compares the stored result's provenance (analyzer, version, options, data and
model hashes, the results it was computed from) with the request's; on a match the stored
steps are reused and only the missing ones computed (new checkpoints = new work only),
otherwise everything is. It reads the store's commit record and the stored result's step
coordinate, nothing else: no graph is built and nothing computed, so it is tested without Dask.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt.errors import CkptWarning, MissingDataError
from ckpt.plugins import PER_PAIR, PER_RUN, Analyzer
from ckpt.store.provenance import IDENTITY, Provenance

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

    from ckpt.store import Store

IDENTITY_KEYS = IDENTITY
"""The provenance entries that decide whether a stored result is reused (:data:`ckpt.store.provenance.IDENTITY`)."""


def data_hash(store: Store, splits: Sequence[str] | None = None) -> str:
    """One hash over the content hashes of the store's data splits ``splits`` (None: every split).

    A split that is named but absent counts as absent, so that adding it later changes the hash.
    """
    names = store.splits if splits is None else sorted(set(splits))
    digests = {split: store.split_hash(split) if split in store.splits else None for split in names}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def model_hash(store: Store) -> str:
    """One hash over the store's model spec (factory and config) and objective."""
    spec = store.model
    record = {
        "model": None if spec is None else {"factory": spec.factory, "config": spec.config},
        "objective": store.objective,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def identity(provenance: Mapping[str, Any] | Provenance) -> dict[str, Any]:
    """The part of a provenance record that decides whether a stored result can be reused.

    A stored record is read as it is stored (a damaged one is compared, and so replaced, not
    refused); a request's is its :meth:`~ckpt.store.provenance.Provenance.identity`.
    """
    if isinstance(provenance, Provenance):
        return provenance.identity()
    return {k: provenance.get(k) for k in IDENTITY_KEYS}


def stored_identity(stored: Mapping[str, Any], store: Store, current_model: str) -> dict[str, Any]:
    """The identity of a stored result (what decides its reuse), as computed with the current model when it cannot tell.

    A result from before ckpt recorded the model's hash counts as computed with the current
    model while the store's model was never changed (``ckpt set-model``).
    """
    found = identity(stored)
    changed = any(entry.get("event") == "set-model" for entry in store.history)
    if found["model_sha256"] is None and not changed:
        found["model_sha256"] = current_model
    return found


def stored_result(store: Store, name: str) -> xr.Dataset | None:
    """The stored result ``name``, opened lazily, or None when there is none (or its files are gone)."""
    if name not in store.analyses:
        return None
    try:
        return store.analysis(name)
    except MissingDataError:  # deleted by hand: nothing to reuse, compute it anew
        return None


def stored_provenance(store: Store, name: str) -> dict[str, Any] | None:
    """The provenance attributes of a stored result, or None when there is none (or its files are gone)."""
    result = stored_result(store, name)
    return None if result is None else result.ckpt.provenance


def request_provenance(analyzer: Analyzer, store: Store, requirements: Mapping[str, Any]) -> Provenance:
    """The provenance of a request: the analyzer's own, the hashes of its data and model, its requirements.

    Covering no steps yet: each commit stamps the steps it covers (:class:`~ckpt.store.results.ResultSink`).
    """
    record = {
        **analyzer.provenance(),
        "data_sha256": data_hash(store, analyzer.data_splits(store)),
        "model_sha256": model_hash(store),
        "requires": dict(requirements),
    }
    return Provenance.from_attrs(record, required=(), name=analyzer.name)


def requirement_identity(result: xr.Dataset, per: str) -> dict[str, Any]:
    """What a dependent records of the result it read (a change recomputes the dependent)."""
    record = result.attrs.get("ckpt", {})
    found = identity(record)
    if per == PER_RUN:  # a whole-run result (a basis) changes when checkpoints are added: so do its dependents
        found["steps"] = record.get("steps")
    return found


def wanted_steps(analyzer: Analyzer, store: Store) -> list[int]:
    """The steps a complete result holds: every checkpoint's, or every pair's first."""
    steps = [int(s) for s in store.steps]
    return steps[:-1] if analyzer.per == PER_PAIR else steps


@dataclass(frozen=True)
class Plan:
    """What one request computes and what it takes from the stored result.

    Attributes
    ----------
    target
        The result's name (``analyses/<target>``).
    provenance
        The request's provenance (what the result is saved with), covering the reused steps.
    wanted
        The steps a complete result holds.
    reused
        The stored steps kept (a prefix of ``wanted``).
    missing
        The steps to compute (the rest of ``wanted``).
    computes
        Whether anything is computed: steps are missing, or a per-run result is computed whole
        (also over no steps at all).
    reason
        Why the stored result is not reused as it stands, in words; None when it is (or only
        extended by new steps).
    """

    target: str
    provenance: Provenance = field(repr=False)
    wanted: tuple[int, ...]
    reused: tuple[int, ...]
    missing: tuple[int, ...]
    computes: bool
    reason: str | None = None


def plan(
    analyzer: Analyzer,
    store: Store,
    requirements: Mapping[str, Any] | None = None,
    *,
    target: str | None = None,
    force: bool = False,
) -> Plan:
    """Decide what the request for ``analyzer`` on ``store`` reuses and computes (nothing is computed).

    Parameters
    ----------
    analyzer
        The analyzer, built with the request's options.
    store
        The store, as committed now (a stored result is read lazily: its provenance and steps).
    requirements
        What the request records of each required result (:func:`requirement_identity`).
    target
        The result's name (default: the analyzer's).
    force
        Recompute everything, whatever is stored.

    Returns
    -------
    Plan
        The steps reused and the steps missing, and why a stored result is not reused.
    """
    target = target or analyzer.name
    provenance = request_provenance(analyzer, store, requirements or {})
    wanted = wanted_steps(analyzer, store)
    covered, reason = _covered(analyzer, store, target, provenance, wanted, force)
    missing = [s for s in wanted if s not in set(covered)]
    if covered and missing and min(missing) < max(covered):
        # a hole in the middle: never expected, but never wrong to redo
        covered, missing, reason = [], wanted, "the stored steps leave a gap before the last one"
    reused = [s for s in wanted if s in set(covered)]
    computes = bool(missing) or (not covered and analyzer.per == PER_RUN)
    provenance = dataclasses.replace(provenance, steps=tuple(reused))
    return Plan(target, provenance, tuple(wanted), tuple(reused), tuple(missing), computes, reason)


def _covered(
    analyzer: Analyzer, store: Store, target: str, provenance: Provenance, wanted: list[int], force: bool
) -> tuple[list[int], str | None]:
    """The stored steps the request can keep, and why none can where there is a stored result."""
    result = stored_result(store, target)
    stored = None if result is None else result.ckpt.provenance
    if result is None or stored is None:
        return [], None
    if force:
        return [], "forced"
    found, asked = stored_identity(stored, store, str(provenance.model_sha256)), provenance.identity()
    if found != asked:
        differ = [key for key in IDENTITY_KEYS if found[key] != asked[key]]
        return [], f"the stored result's {', '.join(differ)} differ(s) from the request's"
    covered = [int(s) for s in stored.get("steps", [])]
    if analyzer.per == PER_RUN and covered != wanted:
        return [], "the steps changed: a per-run result is computed whole"
    if covered and analyzer.per != PER_RUN and not _holds_claimed_steps(result, target, store.path, covered):
        return [], "the stored steps are not those its provenance claims"
    return covered, None


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
    warnings.warn(msg, CkptWarning, stacklevel=5)
    return False


__all__ = [
    "IDENTITY_KEYS",
    "Plan",
    "data_hash",
    "identity",
    "model_hash",
    "plan",
    "request_provenance",
    "requirement_identity",
    "stored_identity",
    "stored_provenance",
    "stored_result",
    "wanted_steps",
]

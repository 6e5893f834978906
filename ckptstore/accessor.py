"""The ``ds.ckpt`` accessor: the provenance of an analysis result, read without dict plumbing.

Every result the engine stores carries its provenance in ``attrs["ckpt"]``
(analyzer, version, options, steps, data hash, required results, creation
time, ckpt version). The accessor reads it::

    result = ckpt.open("run.zarr").analysis("polca")
    result.ckpt.options["k"], result.ckpt.steps, result.ckpt.computed_by

It is registered when :mod:`ckpt.store` reads or writes a result, following
xarray's own advice for extensions (an accessor, not a Dataset subclass).

A store is data: the record is checked by type where it is read. Each typed
property raises :class:`~ckpt.errors.CorruptRecordError` for a field of the wrong
type (``options: 5``, ``analyzer: ["x"]``), and :meth:`ProvenanceAccessor.validate`
also names the result and the analyzer a result of its name must come from.
:attr:`ProvenanceAccessor.provenance` stays the record as stored, so that the engine
still compares (and replaces) a damaged one.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import xarray as xr

from ckpt.errors import CorruptRecordError
from ckpt.store.format import ROOT_ATTR

_TEXTS = ("version", "created", "ckpt_version", "data_sha256", "model_sha256")
"""Fields that are strings when recorded (absent or null when not)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def provenance_problem(record: Any) -> str | None:
    """What in a result's provenance record (``attrs["ckpt"]``) has the wrong type, or None when nothing does.

    Only the fields ckpt reads are checked; a field that is absent or null is unrecorded.

    Parameters
    ----------
    record
        The decoded ``attrs["ckpt"]`` of a result.

    Returns
    -------
    str or None
        ``"<field> is <value>, expected <what>"`` for the first field of the wrong type.
    """
    if not isinstance(record, Mapping):
        return f"the record is {_shown(record)}, expected an object"
    analyzer = record.get("analyzer")
    if analyzer is not None and not (isinstance(analyzer, str) and analyzer):
        return f"analyzer is {_shown(analyzer)}, expected a name (a non-empty string)"
    for key in _TEXTS:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is {_shown(record[key])}, expected a string"
    options = record.get("options")
    if options is not None and not (
        isinstance(options, Mapping) and all(isinstance(k, str) and k.isidentifier() for k in options)
    ):
        return f"options is {_shown(options)}, expected an object of option names (identifiers) and values"
    steps = record.get("steps")
    if steps is not None and not (
        isinstance(steps, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    ):
        return f"steps is {_shown(steps)}, expected a list of steps (integers)"
    requires = record.get("requires")
    if requires is not None and not (
        isinstance(requires, Mapping)
        and all(isinstance(key, str) and isinstance(identity, Mapping) for key, identity in requires.items())
    ):
        return f"requires is {_shown(requires)}, expected an object {{result name: its identity (an object)}}"
    return None


@xr.register_dataset_accessor(ROOT_ATTR)
class ProvenanceAccessor:
    """``ds.ckpt``: the provenance record of a result (empty for a Dataset that has none)."""

    def __init__(self, dataset: xr.Dataset) -> None:
        self._dataset = dataset

    @property
    def provenance(self) -> dict[str, Any]:
        """The whole record as stored (a copy of ``attrs["ckpt"]``; ``{}`` when there is none), unchecked.

        Raises
        ------
        CorruptRecordError
            The record is not an object.
        """
        record = self._dataset.attrs.get(ROOT_ATTR)
        if record is not None and not isinstance(record, Mapping):
            raise CorruptRecordError(_invalid(provenance_problem(record)))
        return dict(record or {})

    @property
    def checked(self) -> dict[str, Any]:
        """The whole record, every field ckpt reads of its type (what the typed properties read).

        Raises
        ------
        CorruptRecordError
            Naming the first field of the wrong type.
        """
        record = self.provenance
        problem = provenance_problem(record)
        if problem is not None:
            raise CorruptRecordError(_invalid(problem))
        return record

    def validate(self, name: str, where: str, analyzers: Container[str] = ()) -> None:
        """Raise unless the record of result ``name`` of the store at ``where`` may be read.

        Besides the types: a result stored under the name of an installed analyzer (one of
        ``analyzers``) must be that analyzer's, since analyzers that require it read it there and
        ``ckpt analyze --as`` never stores another analyzer's result under such a name.

        Raises
        ------
        CorruptRecordError
            Naming the result, what is wrong and what to do.
        """
        record = self.provenance
        problem = provenance_problem(record)
        analyzer = record.get("analyzer")
        if problem is None and name in analyzers and analyzer not in (None, name):
            problem = (
                f"it holds a result of analyzer {analyzer!r} by its provenance, under the name of the analyzer "
                f"{name!r}, whose result other analyzers read there"
            )
        if problem is not None:
            msg = (
                f"the provenance (attrs['ckpt']) of analysis {name!r} of {where} is invalid: {problem}; the store "
                f"was damaged or edited by hand: remove the result (ckpt rm {where} {name}) and recompute it"
            )
            raise CorruptRecordError(msg)

    @property
    def analyzer(self) -> str | None:
        """Name of the analyzer that computed the result."""
        return self.checked.get("analyzer")

    @property
    def version(self) -> str | None:
        """Version of that analyzer."""
        return self.checked.get("version")

    @property
    def options(self) -> dict[str, Any]:
        """The analyzer options the result was computed with."""
        return dict(self.checked.get("options") or {})

    def option(self, name: str, default: Any = None) -> Any:
        """One analyzer option, ``default`` when the result does not record it."""
        return self.options.get(name, default)

    @property
    def steps(self) -> list[int]:
        """The steps (first steps of pairs, for pair analyzers) the result covers."""
        return [int(s) for s in self.checked.get("steps") or []]

    @property
    def created(self) -> str | None:
        """When the result (its last block) was written, ISO 8601 UTC."""
        return self.checked.get("created")

    @property
    def computed_by(self) -> str | None:
        """``"ckpt VERSION"`` of the ckpt that computed the result (None when unrecorded)."""
        version = self.checked.get("ckpt_version")
        return None if version is None else f"ckpt {version}"

    @property
    def requires(self) -> dict[str, Any]:
        """Identity of each required result it was computed from (analyzer, version, options ...)."""
        return dict(self.checked.get("requires") or {})


def _invalid(problem: str | None) -> str:
    return (
        f"the provenance (attrs['ckpt']) of a stored result is invalid: {problem}; the store was damaged or "
        "edited by hand: remove the result (ckpt rm STORE NAME) and recompute it"
    )


__all__ = ["ProvenanceAccessor", "provenance_problem"]

"""The ``ds.ckpt`` accessor: the provenance of an analysis result, read without dict plumbing.

Every result the engine stores carries its provenance in ``attrs["ckpt"]``
(analyzer, version, options, steps, data hash, required results, creation
time, ckpt version). The accessor reads it::

    result = ckpt.open("run.zarr").analysis("polca")
    result.ckpt.options["k"], result.ckpt.steps, result.ckpt.computed_by

It is registered when :mod:`ckpt.store` reads or writes a result, following
xarray's own advice for extensions (an accessor, not a Dataset subclass).

A store is data: the record is checked by type where it is read
(:class:`~ckpt.store.provenance.Provenance`, the one type of the record;
:attr:`ProvenanceAccessor.provenance_record` gives it). Each typed property raises
:class:`~ckpt.errors.CorruptRecordError` for a field of the wrong type (``options: 5``,
``analyzer: ["x"]``), and :meth:`ProvenanceAccessor.validate` also names the result and the
analyzer a result of its name must come from.
:attr:`ProvenanceAccessor.provenance` stays the record as stored, so that the engine
still compares (and replaces) a damaged one.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import xarray as xr

from ckpt.errors import CorruptRecordError
from ckpt.store.format import ROOT_ATTR
from ckpt.store.provenance import Provenance, invalid_message, provenance_problem


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
            raise CorruptRecordError(invalid_message(str(provenance_problem(record))))
        return dict(record or {})

    @property
    def provenance_record(self) -> Provenance:
        """The record as a checked :class:`~ckpt.store.provenance.Provenance` (every field None when there is none).

        Raises
        ------
        CorruptRecordError
            Naming the first field of the wrong type.
        """
        return Provenance.from_attrs(self.provenance, required=())

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
            raise CorruptRecordError(invalid_message(problem))
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
            raise CorruptRecordError(invalid_message(problem, name, where))

    @property
    def analyzer(self) -> str | None:
        """Name of the analyzer that computed the result."""
        return self.provenance_record.analyzer

    @property
    def version(self) -> str | None:
        """Version of that analyzer."""
        return self.provenance_record.version

    @property
    def options(self) -> dict[str, Any]:
        """The analyzer options the result was computed with."""
        return dict(self.provenance_record.to_attrs().get("options") or {})

    def option(self, name: str, default: Any = None) -> Any:
        """One analyzer option, ``default`` when the result does not record it."""
        return self.options.get(name, default)

    @property
    def steps(self) -> list[int]:
        """The steps (first steps of pairs, for pair analyzers) the result covers."""
        return list(self.provenance_record.steps or ())

    @property
    def created(self) -> str | None:
        """When the result (its last block) was written, ISO 8601 UTC."""
        return self.provenance_record.created

    @property
    def computed_by(self) -> str | None:
        """``"ckpt VERSION"`` of the ckpt that computed the result (None when unrecorded)."""
        return self.provenance_record.computed_by

    @property
    def requires(self) -> dict[str, Any]:
        """Identity of each required result it was computed from (analyzer, version, options ...)."""
        return dict(self.provenance_record.to_attrs().get("requires") or {})


__all__ = ["ProvenanceAccessor", "provenance_problem"]

"""The ``ds.ckpt`` accessor: the provenance of an analysis result, read without dict plumbing.

Every result the engine stores carries its provenance in ``attrs["ckpt"]``
(analyzer, version, options, steps, data hash, required results, creation
time, ckpt version). The accessor reads it::

    result = ckpt.open("run.zarr").analysis("polca")
    result.ckpt.options["k"], result.ckpt.steps, result.ckpt.computed_by

It is registered when :mod:`ckpt.store` reads or writes a result, following
xarray's own advice for extensions (an accessor, not a Dataset subclass).
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from ckpt.store.format import ROOT_ATTR


@xr.register_dataset_accessor(ROOT_ATTR)
class ProvenanceAccessor:
    """``ds.ckpt``: the provenance record of a result (empty for a Dataset that has none)."""

    def __init__(self, dataset: xr.Dataset) -> None:
        self._dataset = dataset

    @property
    def provenance(self) -> dict[str, Any]:
        """The whole record (a copy of ``attrs["ckpt"]``; ``{}`` when there is none)."""
        return dict(self._dataset.attrs.get(ROOT_ATTR) or {})

    @property
    def analyzer(self) -> str | None:
        """Name of the analyzer that computed the result."""
        return self.provenance.get("analyzer")

    @property
    def version(self) -> str | None:
        """Version of that analyzer."""
        return self.provenance.get("version")

    @property
    def options(self) -> dict[str, Any]:
        """The analyzer options the result was computed with."""
        return dict(self.provenance.get("options") or {})

    def option(self, name: str, default: Any = None) -> Any:
        """One analyzer option, ``default`` when the result does not record it."""
        return self.options.get(name, default)

    @property
    def steps(self) -> list[int]:
        """The steps (first steps of pairs, for pair analyzers) the result covers."""
        return [int(s) for s in self.provenance.get("steps") or []]

    @property
    def created(self) -> str | None:
        """When the result (its last block) was written, ISO 8601 UTC."""
        return self.provenance.get("created")

    @property
    def computed_by(self) -> str | None:
        """``"ckpt VERSION"`` of the ckpt that computed the result (None when unrecorded)."""
        version = self.provenance.get("ckpt_version")
        return None if version is None else f"ckpt {version}"

    @property
    def requires(self) -> dict[str, Any]:
        """Identity of each required result it was computed from (analyzer, version, options ...)."""
        return dict(self.provenance.get("requires") or {})


__all__ = ["ProvenanceAccessor"]

"""Several runs at once: one analyzer over many stores, as one Dataset with a ``run`` dimension."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.runner import run
from ckpt.errors import AnalysisError


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


def _result(name: str, store: str | os.PathLike[str] | ckptstore.Store, **kwargs: Any) -> xr.Dataset:
    report = run(name, store, **kwargs)
    assert report.dataset is not None
    return report.dataset


def analyze_runs(
    name: str, stores: Sequence[str | os.PathLike[str]], *, lineage: bool = False, **kwargs: Any
) -> xr.Dataset:
    """Run an analyzer on several stores: one Dataset with a ``run`` dim (:func:`ckpt.engine.entry.analyze_runs`)."""
    if not stores:
        msg = "analyze_runs needs at least one store"
        raise AnalysisError(msg)
    if lineage:
        from ckpt.engine.lineage import join_lineage

        results = [
            join_lineage(ckptstore.open(str(where)), name, lambda opened: _result(name, opened, **kwargs))
            for where in stores
        ]
    else:
        results = [_result(name, where, **kwargs) for where in stores]
    # a lineage's sources differ from run to run: kept per run, not taken from the first
    along = ["source", "source_step"] if lineage else "minimal"
    combined = xr.concat([r.drop_attrs() for r in results], dim="run", join="outer", coords=along, compat="override")
    combined = combined.assign_coords(run_coordinates(stores))
    combined.attrs["ckpt"] = {"analyzer": name, "runs": [str(s) for s in stores]}
    return combined


__all__ = ["analyze_runs", "run_coordinates"]

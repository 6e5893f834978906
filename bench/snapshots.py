"""Snapshot reads of results: ckpt's commit record with kept versions against Icechunk, same run.

Usage::

    python bench/snapshots.py [--steps 200] [--datapoints 512] [--repeat 5]

One result shaped like ``loss`` (``step`` x ``datapoint`` float64 and a per-step mean) is
committed, then, each timed ``--repeat`` times (median reported):

- **append**: one step's block appended and committed;
- **replace**: the whole result replaced (new values) and committed;
- **held read**: a view opened before a replace, read in full after it (ckpt: from the kept
  version, each chunk found against its digest; Icechunk: a read-only session at the snapshot);
- **fresh read**: the current result opened and read (for reference).

Three stores: **ckpt** (this tree: a replace moves the old folder to ``.snapshots/``), **ckpt-0.2**
(the same commit with the old folder deleted, as before kept versions: a held view after a replace
raises StaleResultError, so it has no held-read figure), and **icechunk** (a local repository,
xarray writing to an Icechunk session's store, one commit per operation). Prints one JSON object with
the medians in milliseconds, the ratios icechunk / ckpt and ckpt / ckpt-0.2, and the bytes a kept
version costs on disk. Icechunk is optional (``pip install icechunk``); without it only ckpt runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr


def _result(steps: list[int], datapoints: int, seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    loss = rng.random((len(steps), datapoints))
    return xr.Dataset(
        {"loss": (("step", "datapoint"), loss), "mean_loss": (("step",), loss.mean(1))},
        coords={"step": steps},
    )


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def _timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_ckpt(root: Path, steps: int, datapoints: int, repeat: int, *, keep: bool) -> dict[str, Any]:
    """Append, replace, held and fresh reads on a ckpt store (``keep=False``: the old folder is deleted)."""
    import ckpt.store as ckptstore
    from ckpt.errors import StaleResultError
    from ckpt.store import results
    from ckpt.store.provenance import Provenance

    path = root / ("ckpt.zarr" if keep else "ckpt-0.2.zarr")
    writer = ckptstore.create(path)
    for step in range(steps + repeat):
        writer.write(step, {"w": np.full(4, step, np.float32)})
    writer.close()
    request = Provenance(
        analyzer="toy", version="1", options={}, data_sha256="d" * 64, model_sha256="m" * 64, requires={}
    )
    retire = results._retire_result_node
    if not keep:
        results._retire_result_node = lambda zstore, where, name: results._delete_result_node(  # type: ignore[assignment]
            zstore, where, f"analyses/{name}"
        )
    figures: dict[str, list[float]] = {"append": [], "replace": [], "held read": [], "fresh read": []}
    try:
        with warnings.catch_warnings(), results.ResultSink.open(path, "toy", request) as sink:
            warnings.simplefilter("ignore")
            sink.replace(_result(list(range(steps)), datapoints, 0))
            for i in range(repeat):
                block = _result([steps + i], datapoints, 100 + i)
                figures["append"].append(_timed(lambda block=block: sink.append(block)))
            covered = list(sink.steps)
            for i in range(repeat):
                held = ckptstore.open(path).analysis("toy")
                new = _result(covered, datapoints, 200 + i)
                figures["replace"].append(_timed(lambda new=new: sink.replace(new)))
                with contextlib.suppress(StaleResultError):  # ckpt-0.2: the held view has nothing to read
                    figures["held read"].append(_timed(held.compute))
                figures["fresh read"].append(_timed(lambda: ckptstore.open(path).analysis("toy").compute()))
    finally:
        results._retire_result_node = retire  # type: ignore[assignment]
    kept = path / ".snapshots"
    out: dict[str, Any] = {k: _median_ms(v) if v else "StaleResultError" for k, v in figures.items()}
    out["kept versions bytes"] = _tree_bytes(kept) if kept.exists() else 0
    out["store bytes"] = _tree_bytes(path)
    return out


def bench_icechunk(root: Path, steps: int, datapoints: int, repeat: int) -> dict[str, Any]:
    """The same operations on an Icechunk repository (one commit each), read back through xarray."""
    import icechunk

    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root / "icechunk")))
    figures: dict[str, list[float]] = {"append": [], "replace": [], "held read": [], "fresh read": []}

    def commit(dataset: xr.Dataset, **how: Any) -> str:
        session = repository.writable_session("main")
        # xarray's own to_zarr on the session's store (icechunk.xarray.to_icechunk, for dask writes,
        # passes xarray an argument newer xarray no longer takes); the values are in memory
        dataset.to_zarr(session.store, group="analyses/toy", consolidated=False, zarr_format=3, **how)
        return str(session.commit("result"))

    def read(snapshot: str | None) -> xr.Dataset:
        session = (
            repository.readonly_session("main")
            if snapshot is None
            else repository.readonly_session(snapshot_id=snapshot)
        )
        return xr.open_zarr(session.store, group="analyses/toy", consolidated=False).compute()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snapshot = commit(_result(list(range(steps)), datapoints, 0), mode="w")
        for i in range(repeat):
            block = _result([steps + i], datapoints, 100 + i)
            figures["append"].append(_timed(lambda block=block: commit(block, append_dim="step")))
        covered = list(range(steps + repeat))
        for i in range(repeat):
            held = repository.readonly_session("main").snapshot_id
            new = _result(covered, datapoints, 200 + i)
            figures["replace"].append(_timed(lambda new=new: commit(new, mode="w")))
            figures["held read"].append(_timed(lambda held=held: read(held)))
            figures["fresh read"].append(_timed(lambda: read(None)))
        del snapshot
    out: dict[str, Any] = {k: _median_ms(v) for k, v in figures.items()}
    out["store bytes"] = _tree_bytes(root / "icechunk")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--datapoints", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        report: dict[str, Any] = {"steps": args.steps, "datapoints": args.datapoints, "repeat": args.repeat}
        for warm in ("warm-ckpt", "warm-0.2"):  # imports and first-use costs out of the figures
            (root / warm).mkdir()
            bench_ckpt(root / warm, 4, 8, 1, keep=warm == "warm-ckpt")
        report["ckpt-0.2"] = bench_ckpt(root, args.steps, args.datapoints, args.repeat, keep=False)
        report["ckpt"] = bench_ckpt(root, args.steps, args.datapoints, args.repeat, keep=True)
        try:
            (root / "warm-icechunk").mkdir()
            bench_icechunk(root / "warm-icechunk", 4, 8, 1)
            report["icechunk"] = bench_icechunk(root, args.steps, args.datapoints, args.repeat)
        except ImportError:
            report["icechunk"] = "not installed (pip install icechunk)"
        ours, old, ice = report["ckpt"], report["ckpt-0.2"], report["icechunk"]
        ratios: dict[str, Any] = {}
        for measure in ("append", "replace", "held read", "fresh read"):
            if isinstance(ice, dict) and isinstance(ours[measure], float):
                ratios[f"icechunk/ckpt {measure}"] = round(ice[measure] / ours[measure], 2)
            if isinstance(old[measure], float) and isinstance(ours[measure], float):
                ratios[f"ckpt/ckpt-0.2 {measure}"] = round(ours[measure] / old[measure], 2)
        report["ratios"] = ratios
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

"""A per-run result written from its journal a stored chunk at a time (``AnalysisContext.write_from_journal``).

hessian-basis's basis is one per-run result. Its pieces are committed to ``<name>.partial`` as they
are found; the engine used to compute the whole result in memory and write it, which for a basis
read back from the journal held it twice (Dask copies a single-chunk result as it hands it over).
Now the engine computes the other variables and copies the journalled ones into the result chunk by
chunk. The analyzer below is a real plugin: a chain of tasks, each committing a piece of random rows.
"""

from __future__ import annotations

import tracemalloc
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.engine.resume import Journal
from ckpt.errors import CkptError
from ckpt.plugins import PER_RUN, AnalysisContext, Analyzer, Option, load_registry
from ckpt.plugins.testing import write_example_run

PIECES, ROWS, WIDTH = 12, 2, 250_000
"""Twelve pieces of two float64 rows of 250,000: 4 MB a piece, 48 MB the whole result."""
WHOLE = PIECES * ROWS * WIDTH * 8


def rows_of(index: int) -> np.ndarray:
    return np.random.default_rng(index).standard_normal((ROWS, WIDTH))


def piece_dataset(index: int, rows: np.ndarray) -> xr.Dataset:
    first = index * ROWS
    return xr.Dataset(
        {"rows": (("row", "column"), rows), "norm": ("row", np.linalg.norm(rows, axis=1))},
        coords={"row": np.arange(first, first + ROWS)},
    )


def make_piece(worker: Any, index: int, previous: Sequence[Any], *, journal: Journal, keys: list) -> dict:
    """Piece ``index`` (after the pieces ``previous``), committed to the journal; its norms returned."""
    rows = rows_of(index)
    journal.append(piece_dataset(index, rows), "row", keys)
    return {"norm": np.linalg.norm(rows, axis=1)}


def read_rows(worker: Any, journal: Journal, keys: list, pieces: Sequence[Any]) -> np.ndarray:
    """Every piece's rows read back from the journal (after ``pieces``): what the engine copies instead."""
    saved, _ = journal.load(keys)
    return np.asarray(saved["rows"].values)


class Chain(Analyzer):
    """Rows found piece by piece, each committed to the journal as it is found."""

    name = "chain-test"
    description = "Random rows, piece by piece (test analyzer of the journal-written result)."
    per = PER_RUN
    stream = Option(bool, True, "Have the engine write the rows from the journal.")

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        import dask.array as da

        keys = [[index, "piece"] for index in range(PIECES)]
        pieces: list[Any] = []
        for index in range(PIECES):
            pieces.append(ctx.delayed(make_piece, index, list(pieces), journal=ctx.journal, keys=keys[: index + 1]))
        norm = da.concatenate([da.from_delayed(p["norm"], shape=(ROWS,), dtype=np.float64) for p in pieces])
        rows = da.from_delayed(
            ctx.delayed(read_rows, ctx.journal, keys, pieces), shape=(PIECES * ROWS, WIDTH), dtype=np.float64
        )
        if self.stream:
            ctx.write_from_journal(["rows"], keys)
        return xr.Dataset(
            {"rows": (("row", "column"), rows), "norm": ("row", norm)}, coords={"row": np.arange(PIECES * ROWS)}
        )


class ChainPlugin:
    @ckpt.plugins.hookimpl
    def ckpt_register_analyzers(self, register) -> None:
        register(Chain)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_example_run(tmp_path / "run.zarr", steps=2, examples=8)


def traced_run(store: Path, **options: Any) -> tuple[xr.Dataset, int]:
    """The stored result of a run and the most bytes Python and numpy held at once during it."""
    registry = load_registry(extra=[ChainPlugin()])
    tracemalloc.start()
    try:
        run("chain-test", store, registry=registry, scheduler="sync", **options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return ckptstore.open(store).analysis(options.get("save_as", "chain-test")).load(), peak


@pytest.mark.slow  # several seconds on its own: CI runs it, the quick suite does not
def test_the_result_is_copied_from_the_journal_never_held_whole(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt.store import chunks as chunks_module

    # digests are read back in slabs of at most DIGEST_READ_BYTES (64 MiB, tests/test_results.py): at this
    # test's 23 MiB that would be one slab, the whole result; scaled down with it, as at real sizes
    monkeypatch.setattr(chunks_module, "DIGEST_READ_BYTES", 2**20)
    traced_run(store, save_as="warm-up")  # what a first run imports and caches is not the result's
    streamed, streamed_peak = traced_run(store)
    held, held_peak = traced_run(store, stream=False, save_as="held")
    expected = np.concatenate([rows_of(index) for index in range(PIECES)])
    np.testing.assert_array_equal(streamed["rows"].values, expected)
    np.testing.assert_array_equal(streamed["norm"].values, np.linalg.norm(expected, axis=1))
    for name in ("rows", "norm", "row"):
        np.testing.assert_array_equal(streamed[name].values, held[name].values, err_msg=name)
    assert not [name for name in ckptstore.open(store).analyses if name.endswith(".partial")]
    # read back whole, the rows are held twice (Dask copies a single-chunk result as it hands it over)
    assert held_peak > 2 * WHOLE, f"{held_peak / 2**20:.1f} MiB"
    # copied a stored chunk at a time: the most held is one piece being encoded for the journal (16 MiB)
    assert streamed_peak < WHOLE / 2, f"{streamed_peak / 2**20:.1f} MiB against {WHOLE / 2**20:.1f} MiB whole"


def test_a_journal_that_does_not_hold_the_whole_result_is_refused(store: Path) -> None:
    keys = [[index, "piece"] for index in range(3)]
    journal = Journal(str(store), "result", "chain-test", "request")
    like = {"rows": xr.Variable(("row", "column"), np.empty((3 * ROWS, WIDTH)))}
    coords = {"row": np.arange(3 * ROWS)}
    for index in range(2):
        journal.append(piece_dataset(index, rows_of(index)), "row", keys[: index + 1])
    with pytest.raises(CkptError, match=r"holds the pieces \[\[0, 'piece'\], \[1, 'piece'\]\], not the 3"):
        journal.variables(keys, like, coords)
    with pytest.raises(CkptError, match="holds no pieces of this request"):
        Journal(str(store), "result", "chain-test", "another request").variables(keys, like, coords)
    journal.append(piece_dataset(2, rows_of(2)), "row", keys)
    copied = journal.variables(keys, like, coords)["rows"]
    assert copied.chunks is not None, "lazy: read a stored chunk at a time"
    np.testing.assert_array_equal(copied.values, np.concatenate([rows_of(i) for i in range(3)]))
    for wrong, message in (
        ({"rows": xr.Variable(("row", "column"), np.empty((3 * ROWS, WIDTH), np.float32))}, "float32"),
        ({"rows": xr.Variable(("row", "other"), np.empty((3 * ROWS, WIDTH)))}, "other"),
        ({"missing": xr.Variable(("row",), np.empty(3 * ROWS))}, "lacks it"),
    ):
        with pytest.raises(CkptError, match=f"does not hold variable .*{message}"):
            journal.variables(keys, wrong, coords)
    with pytest.raises(CkptError, match="coordinate 'row' differs"):
        journal.variables(keys, like, {"row": np.arange(1, 3 * ROWS + 1)})


def test_a_result_whose_journal_lacks_a_variable_is_an_error_and_keeps_the_old_result(store: Path) -> None:
    """The analyzer names a variable its pieces never held: the run fails before the stored result is touched."""

    class Misnamed(Chain):
        name = "chain-test"

        def compute(self, ctx: AnalysisContext) -> xr.Dataset:
            dataset = super().compute(ctx)
            ctx.write_from_journal(["rows", "nowhere"], ctx.from_journal[1])
            return dataset.assign(nowhere=dataset["norm"] * 2)

    before, _ = traced_run(store)
    hook = ckpt.plugins.hookimpl(lambda register: register(Misnamed))
    registry = load_registry(extra=[types.SimpleNamespace(ckpt_register_analyzers=hook)])
    with pytest.raises(CkptError, match="does not hold variable 'nowhere'"):
        run("chain-test", store, registry=registry, scheduler="sync", force=True, stream=True)
    after = ckptstore.open(store).analysis("chain-test").load()
    xr.testing.assert_identical(after, before)


@pytest.mark.slow
def test_a_basis_found_on_a_local_cluster_is_copied_from_the_journal_its_workers_wrote(tmp_path: Path) -> None:
    """hessian-basis on a ``distributed.LocalCluster``: worker processes commit the pieces, the engine copies them."""
    import ckpt

    path = write_example_run(tmp_path / "run.zarr", steps=4, examples=40)
    options = {"every": 1, "k": 2, "dtype": "float64", "tol": 1e-10}
    on_cluster = ckpt.analyze("hessian-basis", path, workers=2, **options).load()
    assert not [name for name in ckptstore.open(path).analyses if name.endswith(".partial")]
    in_process = ckpt.analyze("hessian-basis", path, scheduler="sync", force=True, **options).load()
    assert on_cluster.sizes["basis"] == 8
    for name in in_process.data_vars:
        got, expected = on_cluster[name].values, in_process[name].values
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, err_msg=name)

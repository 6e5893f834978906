"""The journal of independent pieces (``Journal.add`` / ``Journal.pieces``) on a real store on disk.

Pieces computed by parallel tasks finish in any order: each is committed under its own key, and
a rerun takes every committed piece whose key it would compute, wherever it lies in the journal.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import ckpt.store as ckptstore
from ckpt.engine.resume import Journal
from ckpt.plugins.testing import write_example_run


def piece(step: int) -> xr.Dataset:
    """One piece along ``step``, its values telling which step it is."""
    return xr.Dataset({"value": (("step", "x"), np.full((1, 3), float(step)))}, coords={"step": [step]})


def key(step: int) -> list:
    return [step, f"digest-{step}"]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_example_run(tmp_path / "run.zarr", steps=2, examples=8)


def journal(store: Path, identity: str = "request") -> Journal:
    return Journal(str(store), "result", "lca", identity)


def test_pieces_added_out_of_order_are_found_by_key(store: Path) -> None:
    for step in (5, 1, 3):
        journal(store).add(piece(step), "step", key(step))
    loaded = journal(store).pieces([key(s) for s in (0, 1, 2, 3, 4, 5)])
    assert loaded is not None
    saved, found = loaded
    assert sorted(found) == [1, 3, 5], "indices into the keys asked for"
    for index, position in found.items():
        assert saved["value"].values[position].tolist() == [float(index)] * 3


def test_a_piece_already_held_is_not_committed_twice(store: Path) -> None:
    journal(store).add(piece(1), "step", key(1))
    journal(store).add(piece(1), "step", key(1))
    assert ckptstore.open(store).analysis("result.partial").sizes["step"] == 1


def test_parallel_tasks_lose_no_piece(store: Path) -> None:
    steps = list(range(8))
    threads = [threading.Thread(target=journal(store).add, args=(piece(s), "step", key(s))) for s in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loaded = journal(store).pieces([key(s) for s in steps])
    assert loaded is not None
    saved, found = loaded
    assert sorted(found) == steps
    for index, position in found.items():  # each key names its own piece's values
        assert saved["value"].values[position].tolist() == [float(index)] * 3


def test_pieces_of_another_request_or_key_are_not_taken(store: Path) -> None:
    journal(store).add(piece(1), "step", key(1))
    assert journal(store, "another request").pieces([key(1)]) is None
    assert journal(store).pieces([[1, "another digest"]]) is None
    journal(store, "another request").add(piece(2), "step", key(2))  # replaces the other request's journal
    assert journal(store).pieces([key(1)]) is None
    held = journal(store, "another request").pieces([key(1), key(2)])
    assert held is not None and held[1] == {1: 0}


def add_piece(where: str, step: int) -> None:
    """Commit piece ``step`` (in a process of its own)."""
    Journal(where, "result", "lca", "request").add(piece(step), "step", key(step))


def test_parallel_processes_lose_no_piece(store: Path) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    steps = list(range(6))
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(add_piece, [str(store)] * len(steps), steps))
    loaded = journal(store).pieces([key(s) for s in steps])
    assert loaded is not None
    saved, found = loaded
    assert sorted(found) == steps
    for index, position in found.items():
        assert saved["value"].values[position].tolist() == [float(index)] * 3


def add_piece_when_started(where: str, step: int, started) -> None:
    """Tell ``started``, then commit piece ``step`` (in a process of its own)."""
    started.set()
    add_piece(where, step)


def test_a_piece_waits_for_whoever_holds_the_journals_result_lock(store: Path) -> None:
    # `ckpt rm STORE result.partial` (or the engine discarding the journal) holds the lock of the
    # result `result.partial`: a task committing a piece to it meanwhile waits, then commits; the
    # lock of another result holds nobody up
    import multiprocessing

    from ckpt.store.results import result_lock

    # spawn, as the engine's process workers: a forked child would share this process's hold of the lock
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    with result_lock(store, "other.partial"):
        with result_lock(store, "result.partial"):
            child = context.Process(target=add_piece_when_started, args=(str(store), 1, started))
            child.start()
            assert started.wait(60)
            child.join(3)
            waited = child.is_alive()
        child.join(60)
        assert waited, "the piece was committed while another process held the journal's lock"
        assert child.exitcode == 0
    loaded = journal(store).pieces([key(1)])
    assert loaded is not None and loaded[1] == {0: 0}

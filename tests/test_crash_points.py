"""A process killed at ANY file event of a store operation leaves its old or new committed state.

Operations: create, import, overwrite, the append loop, adding and replacing data
splits, and committing or replacing an analysis result; and every other command that
changes a store: repair (with and without dropping checkpoints), rm, set-model, upgrade,
``data add --overwrite`` and an import into an earlier import.

``tests/crash_process.py`` runs one operation in child processes that count their file
events (opens for writing, renames, mkdirs, unlinks ...) through an interposed
``os``/``open`` layer and die just before the N-th; this test does that for every N
of every operation (not random timing) and checks what is left on disk.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.errors import StoreError, StoreExistsError, StoreLockedError
from tests.crash_process import MODEL, provenance, result, split, tensors, write_sources
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # crash trials: every file write of a store killed

CHILD = Path(__file__).with_name("crash_process.py")
ROOT = Path(__file__).resolve().parents[1]


def _batch(operation: str, template: Path, root: Path, mode: str, numbers: list[int]) -> dict[int, int]:
    """Run crash_process.py in ``mode`` for kill points ``numbers``; kill point -> exit status."""
    done = subprocess.run(
        [sys.executable, str(CHILD), operation, str(template), str(root), mode, *map(str, numbers)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},  # no BLAS threads to fork
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = [line.split() for line in done.stdout.splitlines()]
    return {int(n): int(status) for n, status in (p for p in pairs if len(p) == 2)}


def _count(operation: str, template: Path, root: Path) -> int:
    done = subprocess.run(
        [sys.executable, str(CHILD), operation, str(template), str(root), "count"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])


def _holds(path: Path, steps: list[int], run: int) -> bool:
    """Whether ``path`` is a complete store holding exactly ``steps`` of ``run`` (read through every check)."""
    store = ckptstore.open(path)
    if store.steps.tolist() != steps:
        return False
    for step in steps:
        read = store.tensors(step)
        for name, expected in tensors(step, run).items():
            np.testing.assert_array_equal(read[name], expected)
    return True


def _old_store(work: Path) -> None:
    with ckptstore.create(work / "run.zarr") as writer:
        for step in range(2):
            writer.write(step, tensors(step, run=2))


def _old_split_store(work: Path) -> None:
    with ckptstore.create(work / "run.zarr") as writer:
        writer.add_data("eval", **split(2))
        for step in range(3):
            writer.write(step, tensors(step, run=2))


def _old_result_store(work: Path) -> None:
    from ckpt.store.results import write_analysis

    _old_split_store(work)
    write_analysis(work / "run.zarr", "toy", result([0, 1, 2], 2), attrs=provenance([0, 1, 2], 2))


def _split_files_store(work: Path) -> None:
    """The split store, and beside it the ``.npy`` files of split ``eval``'s replacement (run 1)."""
    _old_split_store(work)
    for name in ("inputs", "targets"):
        np.save(work / f"{name}.npy", split(1)[name])


def _damaged_checkpoint_store(work: Path) -> None:
    """Four checkpoints, a split, a result over all four, and checkpoint 2's tensor ``w`` lost."""
    from ckpt.store.results import write_analysis

    path = work / "run.zarr"
    with ckptstore.create(path) as writer:
        writer.add_data("eval", **split(2))
        for step in range(4):
            writer.write(step, tensors(step, run=2), metrics={"loss": float(step)})
    write_analysis(path, "toy", result([0, 1, 2, 3], 2), attrs=provenance([0, 1, 2, 3], 2))
    (chunk,) = (path / "checkpoints" / "w").glob("c.2.*")
    chunk.unlink()


def _damaged_pieces_store(work: Path) -> None:
    """Sound checkpoints; a damaged split, a damaged result, and a crashed writer's leftover."""
    import zarr

    _old_result_store(work)
    path = work / "run.zarr"
    for array in (path / "data" / "eval" / "text", path / "analyses" / "toy" / "v"):
        next(p for p in (array / "c").rglob("*") if p.is_file()).unlink()
    zarr.open_group(path / "data", mode="r+").create_group("half-written")


def _unverified_store(work: Path) -> None:
    """A store whose record lacks its digests, as format v1 wrote it."""
    import json

    _old_result_store(work)
    record = work / "run.zarr" / "zarr.json"
    document = json.loads(record.read_text())
    meta = document["attributes"]["ckpt"]
    meta["format_version"] = 1
    del meta["digests"], meta["metric_digests"]
    record.write_text(json.dumps(document))


def _earlier_import(work: Path) -> None:
    """The import of the first two of the three sources (the run went on training since)."""
    from ckpt.store.importers import import_checkpoints

    src = work.parent / "src"  # beside the template: every copy of the store is an import of this folder
    write_sources(src)
    later = src / "step-2.safetensors"
    later.rename(work.parent / "later")
    import_checkpoints(src, work / "run.zarr", format="safetensors")
    (work.parent / "later").rename(later)


def _verified(path: Path) -> int:
    """``ckpt verify``'s exit status, run in this process."""
    from click.testing import CliRunner

    from ckpt.cli.main import cli

    return CliRunner().invoke(cli, ["verify", str(path), "--no-finite-check"]).exit_code


def _split_is(store: ckptstore.Store, name: str, run: int) -> bool:
    data = store.data(name)  # checked against its sha256
    expected = split(run)
    return (
        np.array_equal(data["inputs"].values, expected["inputs"]) and data["text"].values.tolist() == expected["text"]
    )


def _result_state(path: Path) -> tuple[int, list[int]] | None:
    """(run, steps) of the stored result ``toy``, every chunk read through its digest; None when absent."""
    store = ckptstore.open(path)
    if "toy" not in store.analyses:
        return None
    stored = store.analysis("toy").load()
    record = stored.attrs["ckpt"]
    steps = stored["step"].values.tolist()
    assert record["steps"] == steps, "a result and its provenance change together"
    np.testing.assert_array_equal(stored["v"].values, result(steps, record["run"])["v"].values)
    return record["run"], steps


def _outcome(operation: str, work: Path) -> str:
    """What the killed operation left: its old or new state, or a documented state in between."""
    path = work / "run.zarr"
    if operation == "create":
        if not path.exists():
            return "old"
        assert _holds(path, [], run=0)
        return "new"
    if operation == "import":
        if not path.exists():
            return "old"
        assert _holds(path, [0, 1, 2], run=1), "an import is complete or absent"
        return "new"
    if operation == "reimport":
        if _holds(path, [0, 1], run=2):
            return "old"
        assert _holds(path, [0, 1, 2], run=1), "an overwrite leaves the old store or the new one"
        return "new"
    if operation == "url_import":
        if not (path / "zarr.json").exists():
            return "old"  # nothing, or objects without a root record: not a store
        refusal = ""
        try:
            complete = _holds(path, [0, 1, 2], run=1)
        except StoreError as exc:
            complete, refusal = False, str(exc)
        if complete:
            return "new"
        assert "holds an interrupted import from" in refusal, refusal  # readers refuse it, never a partial run
        return "interrupted"
    if operation == "url_reimport":
        if not (path / "zarr.json").exists():
            staged = [p for p in work.iterdir() if p.name.startswith(".run.zarr.incomplete-")]
            assert len(staged) == 1 and _holds(staged[0], [0, 1, 2], run=1), "the new store is complete aside"
            return "old deleted, new complete aside"
        if _holds(path, [0, 1], run=2):
            return "old"
        assert _holds(path, [0, 1, 2], run=1), "an overwrite at a URL leaves the old store or the new one"
        return "new"
    if operation == "add_data":
        store = ckptstore.open(path)
        assert store.steps.tolist() == [0, 1, 2]
        if store.splits == ["eval"] and _split_is(store, "eval", 2):
            return "old"
        # a replaced split is the old one or the new one, never missing nor a mix
        assert store.splits == ["eval", "train"] and _split_is(store, "train", 1), store.splits
        return "new" if _split_is(store, "eval", 1) else "train added"
    if operation == "data_overwrite":
        store = ckptstore.open(path)
        assert store.steps.tolist() == [0, 1, 2] and _verified(path) == 0
        assert store.splits == ["eval"], "the split replaced is there, old or new, at every kill point"
        if _split_is(store, "eval", 2):
            return "old"
        stored = store.data("eval")
        np.testing.assert_array_equal(stored["inputs"].values, split(1)["inputs"])
        np.testing.assert_array_equal(stored["targets"].values, split(1)["targets"])
        assert "text" not in stored
        return "new"
    if operation == "analysis":
        state = _result_state(path)
        assert state in (None, (1, [0, 1]), (1, [0, 1, 2])), state
        return {None: "old", (1, (0, 1)): "first block"}.get(state and (state[0], tuple(state[1])), "new")
    if operation == "reanalysis":
        state = _result_state(path)
        assert state in ((2, [0, 1, 2]), None, (1, [0, 1, 2])), state
        return {None: "being replaced", 2: "old"}.get(state and state[0], "new")
    if operation == "repair":
        store = ckptstore.open(path)
        if store.steps.tolist() == [0, 1, 2, 3]:
            assert _result_state(path) == (2, [0, 1, 2, 3]) and _verified(path) == 1
            return "old"
        # the checkpoint and the result that covers it are dropped in one step
        assert _holds(path, [0, 1, 3], run=2) and store.analyses == [] and _split_is(store, "eval", 2)
        assert [e.get("dropped_steps") for e in store.history if e["event"] == "repair"][:1] == [[2]]
        assert _verified(path) == 0
        return "new"
    if operation == "repair_in_place":
        store = ckptstore.open(path)
        assert _holds(path, [0, 1, 2], run=2)
        if store.splits == ["eval"]:
            assert store.analyses == ["toy"] and _verified(path) == 1
            return "old"
        assert store.splits == [] and store.analyses == [], (store.splits, store.analyses)
        assert store.history[-1]["event"] == "repair" and _verified(path) == 0
        return "new"
    if operation == "rm":
        assert _holds(path, [0, 1, 2], run=2) and _verified(path) == 0
        return "old" if _result_state(path) == (2, [0, 1, 2]) else "new"
    if operation == "set_model":
        store = ckptstore.open(path)
        assert _verified(path) == 0
        if store.model is None:
            assert store.objective is None
            return "old"
        assert (store.model.factory, store.model.config, store.objective) == (MODEL, {"width": 3}, "cross-entropy")
        return "new"
    if operation == "upgrade":
        store = ckptstore.open(path)
        assert _holds(path, [0, 1, 2], run=2) and _result_state(path) == (2, [0, 1, 2])
        if store.format_version == 1:
            assert _verified(path) == 3  # nothing corrupt, not verifiable
            return "old"
        assert _verified(path) == 0
        return "new"
    if operation == "import_append":
        if _holds(path, [0, 1], run=1):
            return "old"
        assert _holds(path, [0, 1, 2], run=1) and _verified(path) == 0
        return "new"
    # append: whatever was committed is a prefix of the run (rerunning the loop finishes it, below)
    if path.exists():
        committed = ckptstore.open(path).steps.tolist()
        assert committed == list(range(len(committed)))
        assert _holds(path, committed, run=0)
        return f"{len(committed)} committed"
    return "old"


@pytest.mark.slow
@pytest.mark.parametrize(
    "operation",
    ["create", "import", "reimport", "append", "url_import", "url_reimport", "add_data", "analysis", "reanalysis"],
)
def test_killed_at_every_file_event(tmp_path: Path, operation: str) -> None:
    template = tmp_path / "template"
    template.mkdir()
    if operation in ("reimport", "url_reimport"):
        _old_store(template)
    if operation in ("add_data", "analysis"):
        _old_split_store(template)
    if operation == "reanalysis":
        _old_result_store(template)
    if operation in ("import", "reimport", "url_import", "url_reimport"):
        write_sources(template / "src")
    events = _count(operation, template, tmp_path)
    assert events > 10
    statuses = _batch(operation, template, tmp_path, "kill", list(range(1, events + 1)))
    assert statuses == dict.fromkeys(range(1, events + 1), 137), "every child died at its kill point"
    outcomes = {n: _outcome(operation, tmp_path / f"kill-{n}") for n in statuses}
    # the append loop resumes from whatever was committed; an interrupted URL import is replaced by a rerun
    rerun = [n for n, o in outcomes.items() if operation == "append" or o == "interrupted"]
    if rerun:
        assert _batch(operation, template, tmp_path, "finish", rerun) == dict.fromkeys(rerun, 0)
        for n in rerun:
            path = tmp_path / f"kill-{n}" / "run.zarr"
            assert _holds(path, [0, 1, 2], run=0 if operation == "append" else 1)
            if operation == "append":
                np.testing.assert_array_equal(ckptstore.open(path).metrics["loss"].values, [0.0, 1.0, 2.0])
    outcomes = list(outcomes.values())
    print(f"{operation}: killed at each of its {events} file events: {sorted(set(outcomes))}")
    if operation in ("create", "reimport"):
        assert set(outcomes) == {"old", "new"}, "both outcomes occur: the kill points span the whole operation"
    if operation == "add_data":
        assert set(outcomes) == {"old", "train added", "new"}
    if operation == "url_import":
        assert set(outcomes) == {"old", "interrupted"}  # the last event is the commit that completes it
    if operation == "url_reimport":  # killed before its last event, the root put: never a mix
        assert {"old", "old deleted, new complete aside"} <= set(outcomes)
    if operation == "append":
        assert {"old", "0 committed", "1 committed", "2 committed"} <= set(outcomes)
    if operation == "analysis":  # its last event is the commit of the second block: killed before it, one block
        assert set(outcomes) == {"old", "first block"}
    if operation == "reanalysis":  # likewise the commit of the new result; before it, the old one was withdrawn
        assert set(outcomes) == {"old", "being replaced"}
    if operation == "import":  # its last event is the rename that publishes it: killed before it, nothing shows
        assert set(outcomes) == {"old"}


MUTATIONS = {
    "repair": _damaged_checkpoint_store,
    "repair_in_place": _damaged_pieces_store,
    "rm": _old_result_store,
    "set_model": _old_split_store,
    "data_overwrite": _split_files_store,
    "upgrade": _unverified_store,
    "import_append": _earlier_import,
}
"""The commands that change an existing store, and the store each starts from."""

MAX_KILLS = 40
"""Kill points tried per command: every one up to this many, else this many spread evenly (the first and
the last always among them); a store copy swapped in has an event per file copied, alike."""


def kill_points(events: int, most: int = MAX_KILLS) -> list[int]:
    """Every event ``1..events``, or ``most`` of them spread evenly, the first and the last included."""
    if events <= most:
        return list(range(1, events + 1))
    return sorted({round(1 + i * (events - 1) / (most - 1)) for i in range(most)})


@pytest.mark.slow
@pytest.mark.parametrize("operation", list(MUTATIONS))
def test_a_mutating_command_killed_at_any_file_event_leaves_the_old_store_or_the_new(
    tmp_path: Path, operation: str
) -> None:
    template = tmp_path / "template"
    template.mkdir()
    MUTATIONS[operation](template)
    events = _count(operation, template, tmp_path)
    points = kill_points(events)
    statuses = _batch(operation, template, tmp_path, "kill", points)
    assert statuses == dict.fromkeys(points, 137), "every child died at its kill point"
    outcomes = {n: _outcome(operation, tmp_path / f"kill-{n}") for n in points}
    # the command run again on what the kill left gives its answer (rm: on the old state only: the new has none)
    rerun = [n for n, o in outcomes.items() if operation != "rm" or o == "old"]
    assert _batch(operation, template, tmp_path, "finish", rerun) == dict.fromkeys(rerun, 0)
    assert {_outcome(operation, tmp_path / f"kill-{n}") for n in rerun} == {"new"}
    print(f"{operation}: killed at {len(points)} of its {events} file events: {sorted(set(outcomes.values()))}")
    assert set(outcomes.values()) <= {"old", "new"}
    assert "old" in outcomes.values(), "the first kill point comes before anything is changed"


def test_overwrite_refuses_a_folder_that_is_not_a_store(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "precious.txt").write_text("a user's file")
    with pytest.raises(StoreExistsError, match=r"refusing to overwrite .*results: it is not a ckpt store"):
        ckptstore.create(folder, overwrite=True)
    src = tmp_path / "src"
    write_sources(src)
    refused = run_ckpt("import", str(src), str(folder), "--overwrite")
    assert refused.returncode == 1 and "refusing to overwrite" in refused.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["precious.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder is left behind"


def test_overwrite_waits_for_no_one_and_refuses_a_store_being_written(tmp_path: Path) -> None:
    _old_store(tmp_path)
    path = tmp_path / "run.zarr"
    src = tmp_path / "src"
    write_sources(src)
    with ckptstore.open(path, mode="a"):  # a training run is appending to it
        with pytest.raises(StoreLockedError, match="cannot be overwritten until that writer closes"):
            ckptstore.create(path, overwrite=True)
        refused = run_ckpt("import", str(src), str(path), "--overwrite")
        assert refused.returncode == 1 and "cannot be overwritten until that writer closes" in refused.stderr
    assert _holds(path, [0, 1], run=2)
    replaced = invoke_ckpt("import", str(src), str(path), "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert _holds(path, [0, 1, 2], run=1)


def test_a_failed_overwrite_import_leaves_the_old_store(tmp_path: Path) -> None:
    _old_store(tmp_path)
    path = tmp_path / "run.zarr"
    src = tmp_path / "src"
    write_sources(src)
    (src / "step-3.safetensors").write_bytes(b"not a safetensors file")
    failed = run_ckpt("import", str(src), str(path), "--overwrite")
    assert failed.returncode == 1 and "the destination" in failed.stderr and "left as it was" in failed.stderr
    assert _holds(path, [0, 1], run=2)


def test_data_add_overwrite_replaces_the_split_and_leaves_the_old_files_as_they_were(tmp_path: Path) -> None:
    _split_files_store(tmp_path)
    path = tmp_path / "run.zarr"
    # a hard-linked snapshot (cp -al) shares every file with the store: writing the replacement
    # anywhere but into new files (zarr writes each key to a temporary file, renamed over) would show here
    snapshot = tmp_path / "snapshot"
    shutil.copytree(path, snapshot, copy_function=os.link)
    before = tree_digest(snapshot)
    arrays = [f"--{name}={tmp_path / f'{name}.npy'}" for name in ("inputs", "targets")]
    replaced = invoke_ckpt("data", "add", str(path), "eval", *arrays, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    store = ckptstore.open(path)
    np.testing.assert_array_equal(store.data("eval")["inputs"].values, split(1)["inputs"])
    assert _holds(path, [0, 1, 2], run=2) and _verified(path) == 0
    assert tree_digest(snapshot) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inputs.npy", "run.zarr", "snapshot", "targets.npy"]


def test_a_writer_replacing_a_split_stays_the_one_writer_of_the_store(tmp_path: Path) -> None:
    _old_split_store(tmp_path)
    path = tmp_path / "run.zarr"
    with ckptstore.open(path, mode="a") as writer:
        writer.add_data("eval", **split(1), overwrite=True)
        with pytest.raises(StoreLockedError):  # the store swapped in is locked as the old one was
            ckptstore.open(path, mode="a")
        writer.write(3, tensors(3, run=2), metrics={"loss": 3.0})
        assert writer.reader().splits == ["eval"] and _split_is(writer.reader(), "eval", 1)
        writer.add_data("eval", **split(3), overwrite=True)
    store = ckptstore.open(path)
    assert _holds(path, [0, 1, 2, 3], run=2) and _split_is(store, "eval", 3) and _verified(path) == 0
    np.testing.assert_array_equal(store.metrics["loss"].values, [3.0])


def test_a_split_replaced_through_a_link_to_the_store_leaves_the_link_a_link(tmp_path: Path) -> None:
    (tmp_path / "disk").mkdir()
    _old_split_store(tmp_path / "disk")
    link = tmp_path / "run.zarr"
    link.symlink_to(tmp_path / "disk" / "run.zarr")  # the user's own path may be a link
    with ckptstore.open(link, mode="a") as writer:
        writer.add_data("eval", **split(1), overwrite=True)
    assert link.is_symlink() and _split_is(ckptstore.open(tmp_path / "disk" / "run.zarr"), "eval", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "run.zarr"]
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["run.zarr"]


def test_a_split_is_not_replaced_while_a_result_is_being_written(tmp_path: Path) -> None:
    from ckpt.store.results import store_lock

    _old_split_store(tmp_path)
    path = tmp_path / "run.zarr"
    with ckptstore.open(path, mode="a") as writer:
        before = tree_digest(path)
        held = store_lock(path, exclusive=False)  # as ckpt analyze holds it while it writes a result
        try:
            with pytest.raises(StoreLockedError, match="data split 'eval' cannot be replaced until that finishes"):
                writer.add_data("eval", **split(1), overwrite=True)
        finally:
            held.release()
        assert tree_digest(path) == before
        writer.add_data("eval", **split(1), overwrite=True)
    assert _split_is(ckptstore.open(path), "eval", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.zarr"]

"""Results are transactions: gone files are missing data, one writer per result, the result contract is enforced.

Real stores on disk, the real engine and the real ``ckpt`` command; the analyzers
that break the contract are real (tiny) analyzers registered through the hooks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import ckpt
import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.errors import CorruptChunkError, MissingDataError, StoreLockedError
from ckpt.plugins import PER_PAIR, AnalysisContext, AnalysisError, Analyzer, Option, PluginWarning, load_registry
from ckpt.store.format import TOP_LEVEL_GROUPS
from ckpt.store.results import result_lock, store_lock, write_analysis
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

# --------------------------------------------------------------------------- files gone


def test_a_hand_deleted_result_is_missing_not_nan(mlp_store: Path) -> None:
    first = ckpt.analyze("loss", mlp_store).load()
    shutil.rmtree(mlp_store / "analyses" / "loss")  # the commit record still lists it
    with pytest.raises(MissingDataError, match=r"analysis 'loss' of .* is committed but analyses/loss is gone"):
        ckptstore.open(mlp_store).analysis("loss")
    shown = run_ckpt("show", str(mlp_store), "loss")
    assert shown.returncode == 1
    assert shown.stderr.startswith("Error: analysis 'loss'") and "ckpt rm" in shown.stderr
    assert "nan" not in shown.stdout.lower()
    again = invoke_ckpt("analyze", "loss", str(mlp_store), "--no-progress")
    assert again.returncode == 0, again.stderr
    assert "loss: computed 6 step(s), reused 0 stored" in again.stdout
    np.testing.assert_array_equal(ckptstore.open(mlp_store).analysis("loss")["loss"].values, first["loss"].values)


def test_a_result_missing_one_variable_is_refused_and_recomputed(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    shutil.rmtree(mlp_store / "analyses" / "loss" / "mean_loss")
    with pytest.raises(MissingDataError, match=r"analyses/loss/mean_loss is gone .*1 of its"):
        ckptstore.open(mlp_store).analysis("loss")
    report = run("loss", mlp_store)
    assert report.computed_steps == [0, 1, 2, 3, 4, 5] and report.reused_steps == []
    assert np.isfinite(report.dataset["mean_loss"].values).all()


def test_rm_deletes_a_result_and_says_what_it_did(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    removed = invoke_ckpt("rm", str(mlp_store), "loss")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.strip() == f"removed analyses/loss from {mlp_store}"
    assert "loss" not in ckptstore.open(mlp_store).analyses
    assert not (mlp_store / "analyses" / "loss").exists()
    before = tree_digest(mlp_store)
    again = run_ckpt("rm", str(mlp_store), "loss")
    assert again.returncode == 1
    assert again.stderr.strip() == f"Error: no analysis 'loss' in {mlp_store}; stored analyses: (none)"
    assert tree_digest(mlp_store) == before


def test_rm_clears_a_result_whose_files_were_deleted_by_hand(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    shutil.rmtree(mlp_store / "analyses" / "loss")
    assert invoke_ckpt("rm", str(mlp_store), "loss").returncode == 0
    assert ckptstore.open(mlp_store).analyses == []


# --------------------------------------------------------------------------- one writer per result


def test_a_second_process_computing_the_same_result_is_refused(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    before = tree_digest(mlp_store)
    with result_lock(mlp_store, "loss"):  # this process computes `loss` (a real flock on its folder)
        second = run_ckpt("analyze", "loss", str(mlp_store), "--force", "--no-progress")
        removed = run_ckpt("rm", str(mlp_store), "loss")
        other = run_ckpt("analyze", "grad-norms", str(mlp_store), "--no-progress")  # another result: not blocked
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"Error: analysis 'loss' of {mlp_store} is being computed by another process; "
        "wait for it to finish (or stop it), then run again"
    )
    assert removed.returncode == 1 and "being computed by another process" in removed.stderr
    assert other.returncode == 0, other.stderr
    stored = {k: v for k, v in tree_digest(mlp_store).items() if "grad-norms" not in k and k != "zarr.json"}
    assert stored == {k: v for k, v in before.items() if k != "zarr.json"}
    assert run_ckpt("analyze", "loss", str(mlp_store), "--force", "--no-progress").returncode == 0  # released


def test_a_result_replaced_under_its_lock_stays_locked(mlp_store: Path) -> None:
    # a --force run's first block replaces the stored result, and the result's folder is made anew:
    # a lock on that folder would no longer exclude a second `ckpt analyze` of the same result
    ckpt.analyze("loss", mlp_store)
    stored = ckptstore.open(mlp_store).analysis("loss").load()
    with result_lock(mlp_store, "loss"):
        write_analysis(mlp_store, "loss", stored, attrs=stored.attrs)
        second = run_ckpt("analyze", "loss", str(mlp_store), "--force", "--no-progress")
        removed = run_ckpt("rm", str(mlp_store), "loss")
    assert second.returncode == 1, second.stdout
    assert second.stderr.strip() == (
        f"Error: analysis 'loss' of {mlp_store} is being computed by another process; "
        "wait for it to finish (or stop it), then run again"
    )
    assert removed.returncode == 1 and "being computed by another process" in removed.stderr
    np.testing.assert_array_equal(ckptstore.open(mlp_store).analysis("loss")["loss"].values, stored["loss"].values)


def test_the_lock_leaves_nothing_behind(mlp_store: Path) -> None:
    with result_lock(mlp_store, "never-written"):
        assert not (mlp_store / "analyses" / "never-written").exists(), "the lock is not the result's folder"
        with pytest.raises(StoreLockedError), result_lock(mlp_store, "never-written"):
            pass
    assert not (mlp_store / "analyses" / "never-written").exists()
    assert not (mlp_store / ".locks").exists(), "the lock file and its folders go with its holder"


# --------------------------------------------------------------------------- the store replaced under a result


def test_a_store_being_analyzed_is_not_replaced(mlp_store: Path) -> None:
    """A replacement swaps in a new store: a result of the old one must not be committed into it."""
    ckpt.analyze("loss", mlp_store)
    before = tree_digest(mlp_store)
    with result_lock(mlp_store, "grad-norms"):  # this process is computing grad-norms
        repaired = run_ckpt("repair", str(mlp_store))
        with pytest.raises(StoreLockedError, match="an analysis is being computed or removed"):
            ckptstore.create(mlp_store, overwrite=True)
    assert repaired.returncode == 1, repaired.stdout
    assert repaired.stderr.strip() == (
        f"Error: an analysis is being computed or removed in {mlp_store} by another process; it cannot be "
        "replaced until that finishes: wait for it (or stop it), then run again"
    )
    assert tree_digest(mlp_store) == before
    assert not (mlp_store / ".locks").exists()
    assert run_ckpt("repair", str(mlp_store)).returncode == 0  # released: the store is replaceable again


def test_a_store_being_replaced_is_not_analyzed(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    before = tree_digest(mlp_store)
    lock = store_lock(mlp_store, exclusive=True)  # what ckpt import --overwrite holds until its swap
    try:
        analyzed = run_ckpt("analyze", "grad-norms", str(mlp_store), "--no-progress")
        removed = run_ckpt("rm", str(mlp_store), "loss")
        with result_lock(mlp_store, "loss"):  # this process's own writes (ckpt repair dropping results)
            pass
    finally:
        lock.release()
    message = (
        f"Error: {mlp_store} is being replaced by another process (ckpt import or create with --overwrite, "
        "or ckpt repair); run again once it is done"
    )
    assert analyzed.returncode == 1 and analyzed.stderr.strip() == message
    assert removed.returncode == 1 and removed.stderr.strip() == message
    assert tree_digest(mlp_store) == before
    assert not (mlp_store / ".locks").exists()
    assert run_ckpt("analyze", "grad-norms", str(mlp_store), "--no-progress").returncode == 0


def test_the_store_lock_is_shared_by_result_writers_and_goes_with_the_last(mlp_store: Path) -> None:
    with result_lock(mlp_store, "loss"):
        with result_lock(mlp_store, "grad-norms"):
            assert (mlp_store / ".locks" / "store").exists()
        assert (mlp_store / ".locks" / "store").exists(), "the other writer still holds it"
        with pytest.raises(StoreLockedError):
            store_lock(mlp_store, exclusive=True)
    assert not (mlp_store / ".locks").exists()
    store_lock(mlp_store, exclusive=True).release()
    assert not (mlp_store / ".locks").exists()


def hold(where: str, name: str, started, held, release) -> None:
    """Wait for the lock of result ``name``, tell ``held``, keep it until ``release`` (a process of its own)."""
    started.set()
    with result_lock(where, name, blocking=True):
        held.set()
        release.wait(60)


def test_a_waiting_process_never_holds_a_lock_file_its_holder_removed(mlp_store: Path) -> None:
    # the holder removes its lock file as it lets go: a process that was waiting on that file must
    # lock the file now there (or make one), never the removed one next to a third holder
    import multiprocessing
    import time

    # spawn, not fork: a forked child would share this process's hold of the lock (flock is per open file)
    context = multiprocessing.get_context("spawn")
    started, held, release = context.Event(), context.Event(), context.Event()
    first = result_lock(mlp_store, "loss")
    first.__enter__()
    waiting = context.Process(target=hold, args=(str(mlp_store), "loss", started, held, release))
    waiting.start()
    try:
        assert started.wait(60)
        time.sleep(1)  # it opened the lock file and waits for it
        assert not held.is_set()
        first.__exit__(None, None, None)
        try:
            with result_lock(mlp_store, "loss"):  # a third process taking the lock at once
                assert not held.wait(2), "two processes hold the lock of 'loss'"
        except StoreLockedError:  # the waiting one was faster: it holds it, alone
            assert held.wait(10)
        assert held.wait(10), "the waiting process got the lock once the third one let go"
    finally:
        release.set()
        waiting.join(30)
    assert waiting.exitcode == 0


def test_a_lock_held_or_left_by_a_killed_process_is_no_result(mlp_store: Path) -> None:
    import signal
    import subprocess
    import sys

    ckpt.analyze("loss", mlp_store)
    info, listed = run_ckpt("info", str(mlp_store)), ckptstore.open(mlp_store).analyses
    code = "import sys; from ckpt.store.results import result_lock\nwith result_lock(sys.argv[1], 'loss'):\n"
    code += "    print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(mlp_store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        for _ in range(2):  # while it holds the lock, then after it was killed holding it
            assert [p.name for p in (mlp_store / ".locks" / "analyses").iterdir()] == ["loss"]
            assert ckptstore.open(mlp_store).analyses == listed
            assert sorted(zarr.open_group(mlp_store, mode="r").group_keys()) == sorted(TOP_LEVEL_GROUPS)
            shown = run_ckpt("info", str(mlp_store))
            assert (shown.returncode, shown.stdout) == (0, info.stdout)
            verified = run_ckpt("verify", str(mlp_store))
            assert verified.returncode == 0, verified.stdout + verified.stderr
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
    finally:
        holder.kill()
        holder.wait(30)
    again = run_ckpt("analyze", "loss", str(mlp_store), "--force", "--no-progress")  # the kernel released it
    assert again.returncode == 0, again.stderr
    assert not (mlp_store / ".locks").exists(), "its next holder removed the file and its folders"


# --------------------------------------------------------------------------- the result contract


def constant(worker, step: int, *, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A task function returning an array of ``shape`` (whatever the analyzer declared)."""
    return {"value": np.ones(shape)}


class NoStep(Analyzer):
    """Per checkpoint, but its result has no step dim (the issue's case)."""

    name = "no-step"
    description = "d"

    def compute(self, ctx: AnalysisContext):
        per_step = ctx.map_checkpoints(constant, {"value": (("x",), np.float64)}, sizes={"x": 2}, shape=(2,))
        return per_step.sum("step")


class WrongShape(Analyzer):
    """Declares 3 values per step, its task function returns 4."""

    name = "wrong-shape"
    description = "d"

    def compute(self, ctx: AnalysisContext):
        return ctx.map_checkpoints(constant, {"value": (("x",), np.float64)}, sizes={"x": 3}, shape=(4,))


class WrongSteps(Analyzer):
    """A pair analyzer that returns every checkpoint's step."""

    name = "wrong-steps"
    description = "d"
    per = PER_PAIR

    def compute(self, ctx: AnalysisContext):
        steps = [*ctx.steps, ctx.next_step(ctx.steps[-1])]
        return ctx.map_checkpoints(constant, {"value": ((), np.float64)}, steps=steps, shape=())


class ContractPlugin:
    @ckpt.plugins.hookimpl
    def ckpt_register_analyzers(self, register) -> None:
        for analyzer in (NoStep, WrongShape, WrongSteps):
            register(analyzer)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-step", "analyzer 'no-step' is per-checkpoint: its variable 'value' must have 'step' as first dim"),
        (
            "wrong-shape",
            r"task function tests\.test_results\.constant of analyzer 'wrong-shape' returned 'value' shaped \(4,\); "
            r"the analyzer declared \(3,\)",
        ),
        ("wrong-steps", r"analyzer 'wrong-steps' returned 6 steps \(0..5\) where it was asked for 5 steps \(0..4\)"),
    ],
)
def test_a_result_that_breaks_its_contract_is_refused_and_not_stored(mlp_store: Path, name: str, message: str) -> None:
    registry = load_registry(extra=[ContractPlugin()])
    before = tree_digest(mlp_store)
    with pytest.raises(AnalysisError, match=message):
        run(name, mlp_store, registry=registry)
    assert tree_digest(mlp_store) == before
    assert name not in ckptstore.open(mlp_store).analyses


# --------------------------------------------------------------------------- options are validated at registration


def _registered(**attributes) -> tuple[list[str], set[str]]:
    analyzer = type("Checked", (Analyzer,), {"name": "checked", "description": "d", **attributes})

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(analyzer)

    with pytest.warns(PluginWarning):
        registry = load_registry(entry_points=False, extra=[Plugin()])
    return registry.problems, set(registry.analyzers)


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        (Option(list, None, "layers"), "option 'bad' of analyzer 'checked' has type list; an option is int, float"),
        (Option(int, "3", "k"), "option 'bad' of analyzer 'checked': '3' is not a int"),
        (Option(int, 2.5, "k"), "option 'bad' of analyzer 'checked': 2.5 is not a int"),
        (Option(float, True, "x"), "option 'bad' of analyzer 'checked': True is a bool, not a float"),
        (Option(str, "c", "mode", choices=["a", "b"]), "the default 'c' is not one of its choices ['a', 'b']"),
        (Option(int, 1, "k", choices=[1, "two"]), "option 'bad' of analyzer 'checked': 'two' is not a int"),
    ],
)
def test_malformed_options_are_refused_at_registration(option: Option, problem: str) -> None:
    problems, names = _registered(bad=option)
    assert "checked" not in names
    assert any(problem in p for p in problems), problems


def test_well_formed_options_register() -> None:
    options = {
        "k": Option(int, 2, "k"),
        "scale": Option(float, 1, "an int default of a float option is fine"),
        "split": Option(str, None, "None: given by the user or by the store"),
        "mode": Option(str, "a", "m", choices=("a", "b")),
        "flag": Option(bool, False, "f"),
    }
    analyzer = type("Good", (Analyzer,), {"name": "good", "description": "d", **options})

    class Plugin:
        @ckpt.plugins.hookimpl
        def ckpt_register_analyzers(self, register) -> None:
            register(analyzer)

    registry = load_registry(entry_points=False, extra=[Plugin()])
    assert "good" in registry.analyzers and registry.problems == []


def test_verify_names_results_whose_files_are_gone_or_whose_rows_disagree(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    ckpt.analyze("grad-norms", mlp_store)
    assert invoke_ckpt("verify", str(mlp_store)).returncode == 0
    shutil.rmtree(mlp_store / "analyses" / "grad-norms")
    verified = run_ckpt("verify", str(mlp_store))
    assert verified.returncode == 1
    assert "analysis 'grad-norms': analysis 'grad-norms' of" in verified.stdout  # one line per problem
    assert verified.stderr.startswith("Error: 1 problem(s) in") and len(verified.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- chunk digests


def _chunk_files(result: Path, variable: str) -> list[Path]:
    return sorted(p for p in (result / variable / "c").rglob("*") if p.is_file())


def test_every_chunk_of_a_result_is_bound_by_its_digest_also_across_appends(mlp_store: Path) -> None:
    # block_steps=2: the result is committed three times, appending two steps each time
    report = run("loss", mlp_store, block_steps=2)
    assert report.computed_steps == [0, 1, 2, 3, 4, 5]
    truth = report.dataset.load()
    stored = ckptstore.open(mlp_store).analysis("loss")
    assert "ckpt_chunk_digests" not in stored["loss"].attrs
    xr_testing = pytest.importorskip("xarray.testing")
    xr_testing.assert_identical(stored.load().drop_attrs(), truth.drop_attrs())
    result = mlp_store / "analyses" / "loss"
    loss_chunks = _chunk_files(result, "loss")
    assert len(loss_chunks) >= 2
    before = tree_digest(mlp_store)
    # a lost chunk: zarr would read NaN
    lost = loss_chunks[-1]
    saved = lost.read_bytes()
    lost.unlink()
    key = ".".join(lost.relative_to(result / "loss" / "c").parts)
    with pytest.raises(CorruptChunkError, match=rf"analysis 'loss' .* variable 'loss': chunk {key} does not match"):
        ckptstore.open(mlp_store).analysis("loss")["loss"].values  # noqa: B018
    shown = run_ckpt("show", str(mlp_store), "loss")
    assert shown.returncode == 1 and shown.stderr.startswith("Error: analysis 'loss'")
    assert "nan" not in shown.stdout.lower()
    # a chunk copied from another place of the same array (valid crc32c, wrong values)
    lost.write_bytes(loss_chunks[0].read_bytes())
    verified = run_ckpt("verify", str(mlp_store))
    assert verified.returncode == 1 and f"variable 'loss': chunk {key}" in verified.stdout
    lost.write_bytes(saved)
    assert tree_digest(mlp_store) == before
    assert invoke_ckpt("verify", str(mlp_store)).returncode == 0


def test_chunk_digests_read_in_bounded_slabs_are_those_of_the_whole(mlp_store: Path, monkeypatch) -> None:
    """Digests are taken from reads of at most DIGEST_READ_BYTES (whole rows of chunks, or chunk by chunk)."""
    import xarray as xr

    import ckpt.store.chunks as chunks_module
    from ckpt.store import _zarr

    rng = np.random.default_rng(0)
    first = xr.Dataset(
        {
            "tensor": (("basis", "row", "col"), rng.normal(size=(6, 40, 30)).astype(np.float32)),
            "per_step": (("example", "step"), rng.normal(size=(10, 3))),
        },
        coords={"step": [0, 1, 2]},
    ).chunk({"basis": 2, "row": 16, "col": 16, "example": 4, "step": 2})
    more = first.isel(step=slice(0, 2)).assign_coords(step=[3, 4])

    def recorded(name: str, limit: int) -> dict[str, dict[str, str]]:
        monkeypatch.setattr(chunks_module, "DIGEST_READ_BYTES", limit)
        write_analysis(mlp_store, name, first)
        write_analysis(mlp_store, name, more[["per_step"]], append_dim="step")  # digests of the new chunks only
        _, committed = _zarr.read_root(ckptstore.open(mlp_store)._zstore, str(mlp_store))
        return {
            path.rsplit("/", 1)[1]: node["attributes"]["ckpt_chunk_digests"]
            for path, node in committed.items()
            if path.startswith(f"analyses/{name}/") and node.get("node_type") == "array"
        }

    whole = recorded("whole", 2**40)
    row_of_tensor = 40 * 30 * 4
    for limit in (1, 2 * row_of_tensor, 5 * row_of_tensor):
        assert recorded(f"slabs-{limit}", limit) == whole, limit
    assert len(whole["tensor"]) == 3 * 3 * 2 and len(whole["per_step"]) == 3 * 3
    # read back, each chunk checked against its digest (chunks.verified): the values as written
    for name in ("whole", "slabs-1"):
        stored = ckptstore.open(mlp_store).analysis(name)
        np.testing.assert_array_equal(stored["tensor"].values, first["tensor"].values)
        np.testing.assert_array_equal(
            stored["per_step"].values, np.concatenate([first["per_step"].values, more["per_step"].values], axis=1)
        )
    # the reads: whole rows of chunks up to the limit, every chunk once
    regions = list(chunks_module.chunk_regions((6, 40, 30), (2, 16, 16)))
    monkeypatch.setattr(chunks_module, "DIGEST_READ_BYTES", 5 * row_of_tensor)
    slabs = list(chunks_module._slabs(regions, row_of_tensor))
    assert [(rows.start, rows.stop) for rows, _ in slabs] == [(0, 4), (4, 6)]
    assert sorted(key for _, group in slabs for key, _ in group) == sorted(key for key, _ in regions)


def test_a_changed_step_coordinate_of_a_result_is_caught_when_opened(mlp_store: Path) -> None:
    run("loss", mlp_store, block_steps=2)  # step chunks of 2 rows each
    first, second = _chunk_files(mlp_store / "analyses" / "loss", "step")[:2]
    first.write_bytes(second.read_bytes())  # a well-formed chunk (valid crc32c) of the wrong steps
    with pytest.raises(CorruptChunkError, match=r"analysis 'loss' of .*, variable 'step': chunk 0 does not match"):
        ckptstore.open(mlp_store).analysis("loss")
    other = _chunk_files(mlp_store / "analyses" / "loss", "example")[0]
    first.write_bytes(other.read_bytes())  # a chunk of another shape: refused before it is decoded
    with pytest.raises(CorruptChunkError, match=r"corrupt data in analysis 'loss' of .*: its zstd frame declares"):
        ckptstore.open(mlp_store).analysis("loss")


def test_result_chunks_carry_a_crc32c_like_the_rest_of_the_store(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    import json

    for node in (mlp_store / "analyses" / "loss").glob("*/zarr.json"):
        codecs = [c["name"] for c in json.loads(node.read_text())["codecs"]]
        assert codecs[-1] == "crc32c", (node, codecs)


def test_a_refused_analysis_leaves_the_store_folder_as_it_was(mlp_store: Path) -> None:
    """The lock's folders are made for the lock and removed with it: nothing new in the store's listing."""
    before = sorted(p.name for p in mlp_store.iterdir())
    done = run_ckpt("analyze", "loss", str(mlp_store), "--split", "no-such-split")
    assert done.returncode != 0 and done.stderr.startswith("Error:"), done.stderr
    assert sorted(p.name for p in mlp_store.iterdir()) == before

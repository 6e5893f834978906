"""Runs that start from another run (``ckpt train TASK DEST --init-from SRC.zarr[@STEP]``), and d > 2.

Every store here is made by a real short run of the sparse-modular-addition sandbox (or by
``ckpt import`` of real .pt files), and every refusal goes through the real ``ckpt`` command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt
import ckpt.store as ckptstore
from ckpt.errors import AnalysisError, CorruptRecordError
from ckpt.sandboxes.base import train
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition, build_model
from ckpt.store.importers import import_checkpoints
from ckpt.store.lineage import Parent, parent_status
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

SMALL = {"train_size": 64, "test_size": 64}
"""Options of every run here: a few seconds each."""


def run(path: Path, *, steps: int = 20, every: int = 10, seed: int = 0, **options: object) -> ckptstore.Store:
    return train(SparseModularAddition(), path, steps=steps, every=every, seed=seed, **{**SMALL, **options})


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A p=2 run with checkpoints at steps 0, 10 and 20, and its loss result."""
    path = tmp_path_factory.mktemp("lineage") / "parent.zarr"
    run(path)
    ckpt.analyze("loss", str(path), progress=False)
    return path


def assert_refused(done, dest: Path, before: dict[str, str] | None = None) -> str:
    """One ``Error:`` line on stderr, a non-zero exit, no traceback, DEST not created (or unchanged)."""
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert "Traceback" not in done.stderr
    if before is None:
        assert not dest.exists()
    else:
        assert tree_digest(dest) == before
    return lines[0]


# -- weights and lineage -------------------------------------------------------------------------------
def test_child_starts_bit_equal_to_the_chosen_checkpoint_and_records_it(parent: Path, tmp_path: Path) -> None:
    child = run(tmp_path / "child.zarr", steps=10, every=5, seed=1, init_from=f"{parent}@10")
    source = ckptstore.open(parent)
    started, copied = child.tensors(0), source.tensors(10)
    assert list(started) == list(copied)
    for name, tensor in copied.items():
        assert started[name].dtype == tensor.dtype, name
        assert started[name].tobytes() == tensor.tobytes(), name
    assert child.steps.tolist() == [0, 5, 10]  # the child's schedule starts at 0
    assert child.parent == Parent(str(parent), 10, source.checkpoint_digest(10), ())
    assert child.info()["parent"]["step"] == 10
    assert any(entry.get("init_from") == f"{parent}@10" for entry in child.history)
    assert parent_status(child.parent).state == "matches"


def test_without_a_step_the_last_checkpoint_is_taken(parent: Path, tmp_path: Path) -> None:
    child = run(tmp_path / "child.zarr", steps=5, every=5, init_from=str(parent))
    assert child.parent.step == 20
    for name, tensor in ckptstore.open(parent).tensors(20).items():
        assert child.tensors(0)[name].tobytes() == tensor.tobytes(), name


def test_grown_embedding_keeps_the_parents_rows_and_draws_new_rows_as_the_task_does(
    parent: Path, tmp_path: Path
) -> None:
    child = run(tmp_path / "p3.zarr", steps=5, every=5, seed=7, p=3, init_from=str(parent))
    started, copied = child.tensors(0, framework="torch"), ckptstore.open(parent).tensors(20, framework="torch")
    assert child.parent.grown == ("embed.weight",)
    assert started["embed.weight"].shape == (3, 2)
    assert torch.equal(started["embed.weight"][:2], copied["embed.weight"])
    torch.manual_seed(7)  # what `ckpt train --p 3 --seed 7` initialises without a parent
    fresh = build_model(p=3, length=12, hidden=32, dim=2).state_dict()["embed.weight"]
    assert torch.equal(started["embed.weight"][2:], fresh[2:])
    for name in copied:
        if name != "embed.weight":
            assert torch.equal(started[name], copied[name]), name


def test_ckpt_info_shows_the_lineage(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    run(child, steps=5, every=5, init_from=f"{parent}@10")
    digest = ckptstore.open(parent).checkpoint_digest(10)
    done = invoke_ckpt("info", str(child), "--no-finite-check", "--tensors", "0")
    assert done.returncode == 0, done.stderr
    assert f"parent       {parent} at step 10 (checkpoint digest {digest})" in done.stdout
    assert "OK: reachable, checkpoint digest matches" in done.stdout
    as_json = json.loads(invoke_ckpt("info", str(child), "--json", "--no-finite-check").stdout)
    assert as_json["parent"] == {"path": str(parent), "step": 10, "digest": digest, "grown": []}
    assert as_json["parent_status"]["state"] == "matches"


def test_stores_without_lineage_still_read(small_store: Path) -> None:
    store = ckptstore.open(small_store)
    assert store.parent is None
    assert store.info()["parent"] is None
    done = invoke_ckpt("info", str(small_store), "--no-finite-check")
    assert done.returncode == 0, done.stderr
    assert "parent" not in done.stdout


def test_a_hostile_parent_record_is_refused_when_read(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    run(child, steps=5, every=5, init_from=str(parent))
    root = child / "zarr.json"
    record = json.loads(root.read_text())
    for bad in ({"path": str(parent), "step": -1, "digest": None}, {"path": 3, "step": 0}, ["x"]):
        record["attributes"]["ckpt"]["parent"] = bad
        root.write_text(json.dumps(record))
        with pytest.raises(CorruptRecordError, match="parent"):
            ckptstore.open(child)
    done = run_ckpt("info", str(child))
    assert_refused(done, child, tree_digest(child))


# -- refusals --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["modular-addition", "--init-from", "{parent}"], "missing in the parent: hidden.weight"),
        (["sparse-modular-addition", "--hidden", "8", "--init-from", "{parent}"], "mlp.fc1.weight (parent (32, 2)"),
        (["sparse-modular-addition", "--init-from", "{parent}@7"], "its steps are 0, 10, 20"),
        (["sparse-modular-addition", "--init-from", "{parent}@last"], "must be a checkpoint step"),
        (["sparse-modular-addition", "--init-from", "{parent}", "--resume"], "give --resume or --init-from"),
        (["sparse-modular-addition", "--init-from", "{tmp}"], "not a ckpt store"),
        (["sparse-modular-addition", "--init-from", "{tmp}/missing.zarr"], "does not exist"),
    ],
    ids=["other-task", "shape", "missing-step", "bad-step", "with-resume", "not-a-store", "no-such-path"],
)
def test_refusals_are_one_error_line_and_write_nothing(
    parent: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    dest = tmp_path / "child.zarr"
    (tmp_path / "plain").mkdir()
    filled = [a.format(parent=parent, tmp=tmp_path / "plain") for a in args]
    done = run_ckpt("train", filled[0], str(dest), *filled[1:], "--steps", "5", "--no-progress")
    line = assert_refused(done, dest)
    assert expected in line, line


def test_resume_with_init_from_leaves_an_existing_child_unchanged(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    run(child, steps=5, every=5, init_from=str(parent))
    before = tree_digest(child)
    args = ("train", "sparse-modular-addition", str(child), "--resume", "--init-from", str(parent), "--no-progress")
    assert_refused(run_ckpt(*args, "--train-size", "64", "--test-size", "64"), child, before)


# -- a child's life after its birth --------------------------------------------------------------------------
def test_a_resumed_child_continues_and_keeps_its_lineage(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    first = run(child, steps=5, every=5, seed=3, init_from=f"{parent}@10")
    resumed = run(child, steps=10, every=5, seed=3, resume=True)
    assert resumed.steps.tolist() == [0, 5, 10]
    assert resumed.parent == first.parent
    assert resumed.tensors(5)["embed.weight"].tobytes() == first.tensors(5)["embed.weight"].tobytes()


def test_an_imported_store_is_a_parent_too(tmp_path: Path) -> None:
    src = tmp_path / "pt"
    src.mkdir()
    saved = {}
    for step in (0, 100):
        torch.manual_seed(step)
        saved[step] = build_model().state_dict()
        torch.save(saved[step], src / f"step_{step}.pt")
    imported = tmp_path / "imported.zarr"
    import_checkpoints(src, imported)
    child = run(tmp_path / "child.zarr", steps=5, every=5, init_from=f"{imported}@100")
    for name, tensor in saved[100].items():
        assert torch.equal(child.tensors(0, framework="torch")[name], tensor), name
    assert child.parent.digest == ckptstore.open(imported).checkpoint_digest(100)
    assert parent_status(child.parent).state == "matches"


def test_a_changed_or_lost_parent_is_reported_never_taken(parent: Path, tmp_path: Path) -> None:
    copy = tmp_path / "parent.zarr"
    shutil.copytree(parent, copy)
    child = tmp_path / "child.zarr"
    run(child, steps=5, every=5, init_from=f"{copy}@10")
    shutil.rmtree(copy)
    run(copy, seed=1)  # the parent's path now holds another run, with other weights at step 10
    done = invoke_ckpt("info", str(child), "--no-finite-check")
    assert done.returncode == 0, done.stderr
    assert "WARNING: the parent's checkpoint digest no longer matches" in done.stdout
    with pytest.raises(AnalysisError, match="no longer matches"):
        ckpt.analyze_runs("loss", [child], lineage=True, progress=False)
    shutil.rmtree(copy)
    done = invoke_ckpt("info", str(child), "--no-finite-check")
    assert "WARNING: parent not reachable" in done.stdout


# -- one trajectory --------------------------------------------------------------------------------------------
def test_parent_and_child_as_one_trajectory(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    run(child, steps=10, every=5, init_from=f"{parent}@10")  # seed 0: the parent's data, so one measure
    joined = ckpt.analyze_runs("loss", [child], lineage=True, progress=False).isel(run=0)
    assert joined["step"].values.tolist() == [0, 10, 15, 20]  # child step s -> 10 + s
    assert joined["source"].values.tolist() == [str(parent)] + [str(child)] * 3
    assert joined["source_step"].values.tolist() == [0, 0, 5, 10]
    alone = {p: ckptstore.open(p).analysis("loss")["loss"] for p in (parent, child)}
    np.testing.assert_array_equal(joined["loss"].values[0], alone[parent].sel(step=0).values)
    np.testing.assert_array_equal(joined["loss"].values[1:], alone[child].values)
    # the child's step 0 holds the parent's weights at step 10: the same losses, bit for bit
    np.testing.assert_array_equal(alone[child].sel(step=0).values, alone[parent].sel(step=10).values)
    out = tmp_path / "lineage.png"
    done = invoke_ckpt("plot", str(child), "loss", "--with-parent", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 0


def test_a_trajectory_over_other_data_or_without_a_parent_result_is_refused(parent: Path, tmp_path: Path) -> None:
    child = tmp_path / "child.zarr"
    run(child, steps=5, every=5, seed=2, init_from=str(parent))  # another seed draws other data
    with pytest.raises(AnalysisError, match="data_sha256"):
        ckpt.analyze_runs("loss", [child], lineage=True, progress=False)
    copy = tmp_path / "bare.zarr"
    shutil.copytree(parent, copy)
    assert invoke_ckpt("rm", str(copy), "loss").returncode == 0
    other = tmp_path / "other.zarr"
    run(other, steps=5, every=5, init_from=str(copy))
    ckpt.analyze("loss", str(other), progress=False)
    done = run_ckpt("plot", str(other), "loss", "--with-parent", "--out", str(tmp_path / "x.png"))
    line = assert_refused(done, tmp_path / "x.png")
    assert f"{copy} has no stored result 'loss': run `ckpt analyze loss {copy}` first" in line


# -- d > 2 -------------------------------------------------------------------------------------------------------
def test_dim_is_an_option_and_d4_runs_are_analyzed(tmp_path: Path) -> None:
    done = invoke_ckpt("train", "sparse-modular-addition", "--help")
    assert "--dim" in done.stdout
    path = tmp_path / "d4.zarr"
    store = run(path, dim=4)
    assert store.model.config["dim"] == 4
    assert store.schema["embed.weight"].shape == (2, 4)
    geometry = ckpt.analyze("embedding-geometry", str(path), progress=False)
    assert np.isfinite(geometry["circularity"].values).all()
    assert geometry["sequence_embedding"].shape[-1] == 4
    sparsity = ckpt.analyze("sparsity", str(path), modules="mlp.fc1", progress=False)
    assert np.isfinite(sparsity["sparsity"].values).all()
    for name in ("embedding-geometry", "sparsity"):
        done = invoke_ckpt("plot", str(path), name, "--out", str(tmp_path / f"{name}.png"))
        assert done.returncode == 0, done.stderr
    done = invoke_ckpt("animate", str(path), "--out", str(tmp_path / "d4.gif"))
    assert done.returncode == 0, done.stderr

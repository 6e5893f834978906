"""Tests of ckpt.store.trajectory and its printing: duplicated and mislabeled checkpoints are named.

Real stores written with the public writer from a real (tiny) training run, real Trainer and
safetensors folders imported by the real ``ckpt import``; the checks run through ``ckpt verify``,
``ckpt info`` and ``ckpt verify --trajectory --json``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

import ckpt
from ckpt.plugins.testing import write_example_run
from ckpt.store.trajectory import OUTLIER_RATIO, duplicate_steps, trajectory_distances
from tests.helpers import invoke_ckpt, run_ckpt

State = dict[str, torch.Tensor]


def train(steps: int, *, freeze_embedding: bool = True, seed: int = 0) -> list[State]:
    """The state_dict before each of ``steps`` Adam steps of a tiny classifier, the learning rate decaying.

    ``embed.weight`` never changes (frozen, as a tied or frozen embedding), ``head.bias`` only from
    the middle of the run on (a frozen phase): neither may make a step look like a duplicate.
    """
    torch.manual_seed(seed)
    model = torch.nn.ModuleDict(
        {"embed": torch.nn.Embedding(6, 3), "hidden": torch.nn.Linear(3, 8), "head": torch.nn.Linear(8, 4)}
    )
    model["embed"].weight.requires_grad_(not freeze_embedding)
    model["head"].bias.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in model.parameters()], lr=0.03)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - 0.9 * i / steps)
    ids, targets = torch.randint(0, 6, (64,)), torch.randint(0, 4, (64,))
    states = []
    for step in range(steps):
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        if step == steps // 2:
            model["head"].bias.requires_grad_(True)
        logits = model["head"](torch.tanh(model["hidden"](model["embed"](ids))))
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return states


def write(path: Path, states: dict[int, State]) -> Path:
    with ckpt.create(path) as writer:
        for step, state in states.items():
            writer.write(step, state)
    return path


def planted(states: list[State]) -> dict[int, State]:
    """Every second state, with step 6 holding step 2's weights, step 10 the final's, one tensor of 14 step 4's."""
    chosen = {step: states[step] for step in range(0, len(states), 2)}
    final = max(chosen)
    chosen[6] = states[2]
    chosen[10] = chosen[final]
    chosen[14] = {**states[14], "hidden.weight": states[4]["hidden.weight"]}
    return chosen


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Warning:")]


def test_a_clean_run_is_not_flagged(tmp_path: Path) -> None:
    states = train(30)
    store = ckpt.open(write(tmp_path / "run.zarr", dict(enumerate(states))))
    found = duplicate_steps(store)
    assert found.checked and found.groups == () and found.partial == ()
    assert found.message(store.path) is None
    path = trajectory_distances(store)
    assert path.mislabeled == []
    assert np.nanmax(path.ratio) < 1.0  # far below k: the test has room
    example = ckpt.open(write_example_run(tmp_path / "example.zarr", steps=8))  # SGD, no frozen tensor
    assert duplicate_steps(example).groups == () and trajectory_distances(example).mislabeled == []
    done = invoke_ckpt("verify", str(tmp_path / "run.zarr"), "--trajectory", "--json")
    assert done.returncode == 0 and warnings_of(done.stderr) == [], done.stderr
    report = json.loads(done.stdout)
    assert report["duplicates"] == {"checked": True, "groups": [], "identical_to_final": [], "partial": []}
    assert report["trajectory"]["mislabeled"] == []


def test_duplicates_are_found_from_the_record_alone(tmp_path: Path) -> None:
    states = train(20)
    path = write(tmp_path / "run.zarr", planted(states))
    found = duplicate_steps(ckpt.open(path))
    assert found.groups == ((2, 6), (10, 18)) and found.final == 18
    assert [(p.step, p.source, p.tensors, p.changing) for p in found.partial] == [(4, 14, ("hidden.weight",), 4)]
    message = found.message("run.zarr")
    assert "steps 2 and 6 are identical" in message
    assert "step 10 is identical to the final checkpoint (step 18)" in message
    assert "step 4: 1 of 4 tensors that change along the run identical to step 14's" in message
    # no tensor is read: with every tensor's chunks gone, the record alone gives the same answer
    for chunk in (path / "checkpoints").glob("*/c*"):
        if chunk.parent.name != "step":
            chunk.unlink()
    assert duplicate_steps(ckpt.open(path)) == found


def test_a_shard_of_the_final_checkpoint_is_named(tmp_path: Path) -> None:
    states = train(20)
    chosen = {step: states[step] for step in range(0, 20, 2)}
    chosen[6] = {**states[6], **{k: chosen[18][k] for k in ("hidden.weight", "hidden.bias", "head.weight")}}
    found = duplicate_steps(ckpt.open(write(tmp_path / "run.zarr", chosen)))
    assert found.groups == ()
    assert [(p.step, p.source, len(p.tensors)) for p in found.partial] == [(6, 18, 3)]
    assert "step 6: 3 of 4 tensors that change along the run identical to the final checkpoint (step 18)" in (
        found.message("run.zarr") or ""
    )


def test_a_shard_of_the_final_checkpoint_served_under_several_steps_is_named_as_the_finals(tmp_path: Path) -> None:
    """Pythia 205 and 206 at once: steps 12-16 serve the final model, step 6 its first shard."""
    states = train(20)
    chosen = {step: states[step] for step in range(0, 20, 2)}
    for step in (12, 14, 16):
        chosen[step] = chosen[18]
    chosen[6] = {**states[6], **{k: chosen[18][k] for k in ("hidden.weight", "hidden.bias", "head.weight")}}
    found = duplicate_steps(ckpt.open(write(tmp_path / "run.zarr", chosen)))
    assert found.groups == ((12, 14, 16, 18),)
    # the copies of the final's values run longest at 12-16: still named as the final checkpoint's
    assert [(p.step, p.source, len(p.tensors)) for p in found.partial] == [(6, 18, 3)]
    assert "identical to the final checkpoint (step 18)" in found.partial[0].describe(found.final)


def test_import_verify_and_info_name_duplicates(tmp_path: Path) -> None:
    """A Trainer run whose checkpoint-6 holds checkpoint-2's weights: named by import, verify and info."""
    states = train(12)
    src = tmp_path / "out"
    for step in range(2, 12, 2):
        folder = src / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file(states[2 if step == 6 else step], folder / "model.safetensors")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    store = tmp_path / "run.zarr"
    done = invoke_ckpt("import", str(src), str(store))
    assert done.returncode == 0, done.stderr
    (line,) = warnings_of(done.stderr)
    assert "steps 2 and 6 are identical" in line and str(store) in line
    for command in (["verify"], ["info"]):
        done = invoke_ckpt(*command, str(store))
        assert done.returncode == 0, done.stderr
        assert warnings_of(done.stderr) == [line], done.stderr
    info = invoke_ckpt("info", str(store))
    assert "duplicates   WARNING: 1 group(s) of identical checkpoints" in info.stdout
    summary = json.loads(invoke_ckpt("info", str(store), "--json").stdout)
    assert summary["duplicates"]["groups"] == [[2, 6]]


def test_a_safetensors_folder_with_the_final_model_as_a_step(tmp_path: Path) -> None:
    states = train(10)
    src = tmp_path / "weights"
    src.mkdir()
    for step in range(0, 10, 3):
        save_file(states[9] if step == 3 else states[step], src / f"step_{step}.safetensors")
    done = invoke_ckpt("import", str(src), str(tmp_path / "run.zarr"))
    assert done.returncode == 0, done.stderr
    (line,) = warnings_of(done.stderr)
    assert "step 3 is identical to the final checkpoint (step 9)" in line
    clean = invoke_ckpt("info", str(tmp_path / "run.zarr"), "--json")
    assert json.loads(clean.stdout)["duplicates"]["identical_to_final"] == [3]


def test_a_checkpoint_from_far_along_the_run_is_possibly_mislabeled(tmp_path: Path) -> None:
    states = train(120)
    chosen = {step: states[step] for step in range(0, 120, 4)}
    chosen[8] = states[119]  # final-era weights (stored under no other step)
    chosen[80] = states[5]  # weights from early on
    path = write(tmp_path / "run.zarr", chosen)
    found = trajectory_distances(ckpt.open(path))
    assert found.mislabeled == [8, 80]
    # step 80's head.bias is the frozen phase's (steps 0 .. 60, with step 8 foreign in it): a copy, named
    (copy,) = duplicate_steps(ckpt.open(path)).partial
    assert (copy.step, copy.source, copy.tensors) == (80, 60, ("head.bias",))
    done = invoke_ckpt("verify", str(path), "--trajectory", "--json")
    assert done.returncode == 0, done.stderr
    copied, line = warnings_of(done.stderr)  # one line from the record, one from the distances
    assert "step 80: 1 of 4 tensors that change along the run identical to step 60's" in copied
    assert "possibly mislabeled checkpoints: step 8 (" in line and ", step 80 (" in line
    report = json.loads(done.stdout)["trajectory"]
    assert report["mislabeled"] == [8, 80] and report["k"] == OUTLIER_RATIO
    ratio = {row["step"]: row["ratio"] for row in report["steps"]}
    assert ratio[8] > OUTLIER_RATIO and ratio[4] < 1 and ratio[12] < 1  # the neighbours stay on the path
    text = invoke_ckpt("verify", str(path), "--trajectory")
    assert "possibly mislabeled (> 2x)" in next(r for r in text.stdout.splitlines() if r.strip().startswith("80 "))
    stricter = invoke_ckpt("verify", str(path), "--trajectory", "--json", "--outlier-ratio", f"{ratio[80] + 1}")
    assert json.loads(stricter.stdout)["trajectory"]["mislabeled"] == []


def test_a_zigzagging_run_is_not_flagged(tmp_path: Path) -> None:
    """Full-batch SGD at the edge of stability, checkpointed every step: ratios above k, and nothing flagged."""
    store = write_example_run(tmp_path / "run.zarr", steps=40, optimizer=lambda p: torch.optim.SGD(p, lr=5.0))
    found = trajectory_distances(ckpt.open(store))
    assert np.nanmax(found.ratio) > OUTLIER_RATIO  # the path comes back on itself ...
    assert found.mislabeled == []  # ... and so do the neighbours' paths: a zigzag, not a jump


def test_distances_are_the_float64_distances_of_the_weights(tmp_path: Path) -> None:
    states = train(8)
    chosen = {step: {**s, "counter": torch.tensor([step, 2 * step])} for step, s in enumerate(states)}
    for state in chosen.values():  # bf16 tensors too: decoded, then accumulated in float64
        state["hidden.weight"] = state["hidden.weight"].to(torch.bfloat16)
    path = write(tmp_path / "run.zarr", chosen)
    flat = [
        np.concatenate([v.double().numpy().ravel() for k, v in s.items() if k != "counter"]) for s in chosen.values()
    ]
    updates = [b - a for a, b in itertools.pairwise(flat)]
    found = trajectory_distances(ckpt.open(path))
    assert found.tensors == ["embed.weight", "hidden.weight", "hidden.bias", "head.weight", "head.bias"]
    np.testing.assert_allclose(found.distance[1:], [np.linalg.norm(u) for u in updates], rtol=1e-12)
    cosines = [u @ v / np.linalg.norm(u) / np.linalg.norm(v) for u, v in itertools.pairwise(updates)]
    np.testing.assert_allclose(found.cosine[1:-1], cosines, rtol=1e-9)
    spans = [np.linalg.norm(c - a) for a, c in zip(flat, flat[2:], strict=False)]
    np.testing.assert_allclose(found.span[1:-1], spans, rtol=1e-9)
    assert np.isnan(found.distance[0]) and np.isnan(found.cosine[[0, -1]]).all()
    report = json.loads(invoke_ckpt("verify", str(path), "--trajectory", "--json").stdout)["trajectory"]
    np.testing.assert_allclose([r["distance"] for r in report["steps"][1:]], found.distance[1:], rtol=1e-12)
    assert report["steps"][0]["distance"] is None


def test_distances_hold_two_checkpoints_at_most(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    start = {"a": rng.standard_normal(1 << 20, dtype=np.float32), "b": rng.standard_normal(1 << 20, dtype=np.float32)}
    with ckpt.create(tmp_path / "run.zarr") as writer:
        for step in range(12):
            writer.write(step, {k: v + np.float32(step * 1e-3) for k, v in start.items()})
    store = ckpt.open(tmp_path / "run.zarr")
    checkpoint = 8 << 20
    tracemalloc.start()
    try:
        trajectory_distances(store)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # two checkpoints, the tensor being read, three float64 blocks of 2 MiB; all 12 would be 96 MiB
    assert peak < 2 * checkpoint + checkpoint // 2 + 3 * (2 << 20) + (4 << 20), peak


def test_a_store_without_digests_is_said_unchecked(tmp_path: Path) -> None:
    store = tmp_path / "v1.zarr"
    shutil.copytree(Path(__file__).parent / "data" / "v0.1.0-modular-addition.zarr", store)
    assert not duplicate_steps(ckpt.open(store)).checked
    shown = invoke_ckpt("info", str(store))
    assert "duplicates   not checked (no digests: format v1)" in shown.stdout, shown.stdout + shown.stderr
    assert json.loads(invoke_ckpt("info", str(store), "--json").stdout)["duplicates"]["checked"] is False


def test_a_damaged_tensor_is_an_error_and_its_distances_unknown(tmp_path: Path) -> None:
    states = train(10)
    path = write(tmp_path / "run.zarr", dict(enumerate(states)))
    (chunk,) = (path / "checkpoints" / "hidden.weight").glob("c.4.*")
    chunk.write_bytes(chunk.read_bytes()[:-8] + bytes(8))  # damaged in place: fails its checksum
    done = run_ckpt("verify", str(path), "--trajectory", "--json")
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert done.returncode == 1 and len(errors) == 1 and "tensor 'hidden.weight' at step 4" in errors[0]
    report = json.loads(done.stdout)  # stdout stays one JSON object
    assert report["problems"] == ["tensor 'hidden.weight' at step 4"]
    rows = {row["step"]: row for row in report["trajectory"]["steps"]}
    assert rows[4]["distance"] is None and rows[5]["distance"] is None and rows[3]["cosine"] is None
    assert rows[3]["distance"] is not None and rows[7]["cosine"] is not None
    assert report["trajectory"]["mislabeled"] == []

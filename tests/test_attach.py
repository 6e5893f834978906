"""Attaching a model, an objective and evaluation data to a store after the fact; mixed-precision runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes


def weights_only_store(tmp_path: Path, dtype: torch.dtype = torch.float32) -> tuple[Path, list[dict]]:
    """A folder of plain torch checkpoints of the tests' MLP, imported without model, objective or data."""
    from tests.models import mlp

    torch.manual_seed(0)
    model = mlp()
    folder = tmp_path / "weights"
    folder.mkdir()
    states = []
    for step in (0, 10, 20):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
        state = {k: v.detach().clone().to(dtype) for k, v in model.state_dict().items()}
        torch.save(state, folder / f"step_{step}.pt")
        states.append(state)
    path = tmp_path / "run.zarr"
    result = invoke_ckpt("import", str(folder), str(path))
    assert result.returncode == 0, result.stderr
    return path, states


def test_model_objective_and_data_added_after_import_make_loss_work(tmp_path: Path) -> None:
    path, states = weights_only_store(tmp_path)
    rng = np.random.default_rng(0)
    inputs, targets = rng.standard_normal((20, 3)).astype(np.float32), rng.integers(0, 4, 20)
    np.save(tmp_path / "x.npy", inputs)
    np.save(tmp_path / "y.npy", targets)
    np.save(tmp_path / "odd.npy", targets % 2)
    refused = run_ckpt("analyze", "loss", str(path), "--no-progress")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: "), refused.stderr

    added = invoke_ckpt(
        "data", "add", str(path), "eval", "--inputs", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
        "--labels", f"odd={tmp_path / 'odd.npy'}",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "20 examples, 20 datapoints" in added.stdout
    model = invoke_ckpt("set-model", str(path), "--model", "tests.models:mlp", "--objective", "cross-entropy")
    assert model.returncode == 0, model.stderr
    store = ckptstore.open(path)
    assert store.model.factory == "tests.models:mlp" and store.objective == "cross-entropy"
    assert store.history[-1]["event"] == "set-model"
    assert store.data("eval")["odd"].values.tolist() == (targets % 2).tolist()

    analyzed = invoke_ckpt("analyze", "loss", str(path), "--no-progress", "--trust-factory", "tests.models")
    assert analyzed.returncode == 0, analyzed.stderr
    loss = ckptstore.open(path).analysis("loss")["loss"].values
    from tests.models import mlp

    reference = mlp()
    for row, state in enumerate(states):
        reference.load_state_dict(state)
        with torch.no_grad():
            expected = torch.nn.functional.cross_entropy(
                reference(torch.as_tensor(inputs)), torch.as_tensor(targets), reduction="none"
            )
        np.testing.assert_allclose(loss[row], expected.double().numpy(), rtol=1e-6)


def test_a_changed_model_or_data_makes_stored_results_stale_not_wrong(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "mlp.zarr")
    trust = ("--trust-factory", "tests.models")
    first = invoke_ckpt("analyze", "loss", str(path), "--no-progress", *trust)
    assert "computed 6 step(s)" in first.stdout, first.stdout
    again = invoke_ckpt("analyze", "loss", str(path), "--no-progress", *trust)
    assert "computed 0 step(s), reused 6 stored" in again.stdout

    changed = invoke_ckpt("set-model", str(path), "--model", "tests.models:mlp", "--config", '{"hidden": 8}')
    assert changed.returncode == 0, changed.stderr
    page = tmp_path / "report.html"
    reported = invoke_ckpt("report", str(path), "--out", str(page))
    assert reported.returncode == 0, reported.stderr
    assert "stale: the store's data or model changed" in page.read_text()
    rerun = invoke_ckpt("analyze", "loss", str(path), "--no-progress", *trust)
    assert "computed 6 step(s), reused 0 stored" in rerun.stdout, rerun.stdout

    np.save(tmp_path / "x.npy", np.zeros((5, 3), np.float32))
    np.save(tmp_path / "y.npy", np.zeros(5, np.int64))
    arrays = ("--inputs", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"))
    before = tree_digest(path)
    exists = run_ckpt("data", "add", str(path), "eval", *arrays)
    assert exists.returncode == 1 and "already exists" in exists.stderr and "overwrite" in exists.stderr
    assert tree_digest(path) == before
    replaced = invoke_ckpt("data", "add", str(path), "eval", *arrays, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    after = invoke_ckpt("analyze", "loss", str(path), "--no-progress", *trust)
    assert "computed 6 step(s), reused 0 stored" in after.stdout, after.stdout
    assert ckptstore.open(path).analysis("loss").sizes["datapoint"] == 5


def test_attach_commands_refuse_bad_input_with_one_line_and_an_unchanged_store(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "mlp.zarr")
    (tmp_path / "bad.npy").write_text("not an array")
    (tmp_path / "config.json").write_text("{not json")
    before = tree_digest(path)
    for args in (
        ("set-model", str(path)),
        ("set-model", str(path), "--objective", "no-such-loss"),
        ("set-model", str(path), "--model", "no_colon"),
        ("set-model", str(path), "--hf-config", str(tmp_path / "config.json")),
        ("data", "add", str(path), "extra"),
        ("data", "add", str(path), "extra", "--inputs", str(tmp_path / "missing.npy")),
        ("data", "add", str(path), "extra", "--inputs", str(tmp_path / "bad.npy")),
        ("data", "add", str(path), "extra", "--inputs", str(tmp_path / "bad.npy"), "--labels", "oops"),
    ):
        result = run_ckpt(*args)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, result.stderr)
    assert tree_digest(path) == before


def test_bfloat16_checkpoints_are_analyzed_in_float32(tmp_path: Path) -> None:
    path, states = weights_only_store(tmp_path, dtype=torch.bfloat16)
    rng = np.random.default_rng(1)
    inputs, targets = rng.standard_normal((10, 3)).astype(np.float32), rng.integers(0, 4, 10)
    with ckptstore.open(path, mode="a") as writer:
        writer.add_data("eval", inputs=inputs, targets=targets)
        writer.set_model("tests.models:mlp", objective="cross-entropy")
    assert {info.dtype for info in ckptstore.open(path).schema.values()} == {"bfloat16"}
    result = invoke_ckpt("analyze", "loss", str(path), "--no-progress", "--trust-factory", "tests.models")
    assert result.returncode == 0, result.stderr
    grads = invoke_ckpt("analyze", "grad-norms", str(path), "--no-progress", "--trust-factory", "tests.models")
    assert grads.returncode == 0, grads.stderr
    loss = ckptstore.open(path).analysis("loss")["loss"].values
    from tests.models import mlp

    reference = mlp()
    for row, state in enumerate(states):  # the bfloat16 weights, computed in float32
        reference.load_state_dict({k: v.float() for k, v in state.items()})
        with torch.no_grad():
            expected = torch.nn.functional.cross_entropy(
                reference(torch.as_tensor(inputs)), torch.as_tensor(targets), reduction="none"
            )
        np.testing.assert_allclose(loss[row], expected.double().numpy(), rtol=1e-6)
    assert np.isfinite(ckptstore.open(path).analysis("grad-norms")["total_grad_norm"].values).all()


def test_importing_again_appends_the_new_checkpoints_of_a_run_still_training(tmp_path: Path) -> None:
    from tests.models import mlp

    torch.manual_seed(0)
    model = mlp()
    folder = tmp_path / "run"
    folder.mkdir()

    def save(step: int) -> None:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01)
        torch.save({"model": model.state_dict(), "global_step": step}, folder / f"step_{step}.pt")

    for step in (0, 10):
        save(step)
    path = tmp_path / "run.zarr"
    assert invoke_ckpt("import", str(folder), str(path)).returncode == 0
    first = tree_digest(path)
    up_to_date = invoke_ckpt("import", str(folder), str(path))
    assert up_to_date.returncode == 0, up_to_date.stderr
    assert "is up to date" in up_to_date.stdout and "holds all 2 checkpoints" in up_to_date.stdout
    assert tree_digest(path) == first
    for step in (20, 30):
        save(step)
    appended = invoke_ckpt("import", str(folder), str(path))
    assert appended.returncode == 0, appended.stderr
    assert "appended 2 new torch checkpoints (steps 20 .. 30)" in appended.stdout
    store = ckptstore.open(path)
    assert [int(s) for s in store.steps] == [0, 10, 20, 30]
    saved = torch.load(folder / "step_30.pt", weights_only=True)["model"]
    for name, tensor in saved.items():
        np.testing.assert_array_equal(store.tensors(30, [name])[name], tensor.numpy())

    # not the same run: the newest common checkpoint differs; another source; a hole before the end
    before = tree_digest(path)
    torch.save({"model": mlp().state_dict(), "global_step": 30}, folder / "step_30.pt")
    save(40)
    other = run_ckpt("import", str(folder), str(path))
    assert other.returncode == 1 and "is not the checkpoint" in other.stderr and "step 30" in other.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    torch.save({"model": model.state_dict(), "global_step": 50}, elsewhere / "step_50.pt")
    refused = run_ckpt("import", str(elsewhere), str(path))
    assert refused.returncode == 1 and "already exists and is an import of" in refused.stderr
    (folder / "step_30.pt").unlink()
    (folder / "step_40.pt").unlink()
    torch.save({"model": model.state_dict(), "global_step": 15}, folder / "step_15.pt")
    hole = run_ckpt("import", str(folder), str(path))
    assert hole.returncode == 1 and "older than the last one" in hole.stderr and "[15]" in hole.stderr
    assert tree_digest(path) == before


def test_a_factory_in_the_current_folder_gets_a_hint_about_python_s_path(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    path = write_example_run(tmp_path / "mlp.zarr", factory="mymodels:mlp")
    (tmp_path / "mymodels.py").write_text((Path(__file__).parent / "models.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the console script, as users run it: unlike `python -m`, it does not put the current folder on the path
    command = [str(Path(sys.executable).parent / "ckpt"), "analyze", "loss", str(path), "--no-progress"]
    command += ["--trust-factory", "*"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False)
    assert result.returncode == 1, result.stderr
    assert "No module named 'mymodels'" in result.stderr and f"PYTHONPATH={tmp_path}" in result.stderr
    env["PYTHONPATH"] = str(tmp_path)  # what the hint says works
    fixed = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False)
    assert fixed.returncode == 0, fixed.stderr

"""Non-finite weights are named: verify, info, the engine and hessian-basis (issue 28, item 4).

A checkpoint holding NaN or inf is what training wrote (its digests are valid): not damage,
but every number computed from it is meaningless, so each command that meets it says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt, run_ckpt
from tests.models import mlp


def _run(path: Path, *, poisoned: bool) -> Path:
    """Three checkpoints of tests.models:mlp, each its own; with ``poisoned``, step 1 holds a NaN and an inf."""
    torch.manual_seed(0)
    model = mlp()
    inputs, targets = torch.randn(16, 3), torch.randint(0, 4, (16,))
    with ckptstore.create(path, model="tests.models:mlp", config={}, objective="cross-entropy") as writer:
        writer.add_data("eval", inputs=inputs, targets=targets)
        for step in range(3):
            # each step its own weights: identical checkpoints would be named too (ckpt.store.trajectory)
            state = {name: value + 0.01 * step for name, value in model.state_dict().items()}
            if poisoned and step == 1:
                state["0.weight"][0, 0] = float("nan")
                state["2.bias"][1] = float("inf")
            writer.write(step, state)
    return path


NAMED = ("tensor '0.weight' at step 1 (1 NaN, 0 inf)", "tensor '2.bias' at step 1 (0 NaN, 1 inf)")


@pytest.fixture
def poisoned(tmp_path: Path) -> Path:
    return _run(tmp_path / "nan.zarr", poisoned=True)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_verify_and_info_name_the_tensors_and_steps(poisoned: Path) -> None:
    verified = invoke_ckpt("verify", str(poisoned))
    assert verified.returncode == 0, verified.stderr  # what was written, intact: not corruption
    (warning,) = _lines(verified.stderr)
    assert warning.startswith(f"Warning: {poisoned} holds non-finite weights") and all(n in warning for n in NAMED)
    skipped = invoke_ckpt("verify", str(poisoned), "--no-finite-check")
    assert skipped.returncode == 0 and skipped.stderr == ""

    shown = invoke_ckpt("info", str(poisoned))
    assert shown.returncode == 0, shown.stderr
    (weights,) = [line for line in shown.stdout.splitlines() if line.strip().startswith("weights")]
    assert "NaN or inf at 1 checkpoint(s)" in weights and all(n in weights for n in NAMED)
    fast = invoke_ckpt("info", str(poisoned), "--no-finite-check")
    assert "weights      not checked (--no-finite-check)" in fast.stdout


@pytest.mark.parametrize("analyzer", ["loss", "grad-norms"])
def test_the_engine_warns_once_naming_the_result_variables_and_steps(poisoned: Path, analyzer: str) -> None:
    result = invoke_ckpt("analyze", analyzer, str(poisoned), "--no-progress")
    assert result.returncode == 0, result.stderr
    warnings = _lines(result.stderr)
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith(f"Warning: result {analyzer!r} of {poisoned} holds NaN or inf")
    assert "at step(s) [1]" in warnings[0] and NAMED[0] in warnings[0]


def test_a_finite_run_gets_no_warning(tmp_path: Path) -> None:
    store = _run(tmp_path / "ok.zarr", poisoned=False)
    for command in (["verify"], ["analyze", "loss"], ["analyze", "grad-norms"]):
        result = invoke_ckpt(*command, str(store), *(["--no-progress"] if command[0] == "analyze" else []))
        assert result.returncode == 0 and result.stderr == "", (command, result.stderr)
    assert "weights      all finite" in invoke_ckpt("info", str(store)).stdout


def test_hessian_basis_names_the_checkpoint_whose_weights_are_not_finite(poisoned: Path) -> None:
    result = run_ckpt("analyze", "hessian-basis", str(poisoned), "--at-steps", "1", "--no-progress")
    assert result.returncode == 1
    (line,) = _lines(result.stderr)
    assert line.startswith("Error: hessian-basis at the checkpoint of step 1: Hessian-vector product")
    assert "the weights at this step hold NaN or inf ('0.weight', '2.bias')" in line

"""The development analyzers on an imported Hugging Face run: ``llc``, ``spectrum``, ``essential-dynamics``.

A tiny GPT-2 is trained here for a few AdamW steps and saved as a ``Trainer`` output folder
(``checkpoint-N/`` by ``save_pretrained``, with the Trainer's ``trainer_state.json`` log); ``ckpt
import`` makes it a store and ``ckpt data add`` gives it token data. Each analyzer then runs
through the ``ckpt analyze`` command with small options; the results must be finite and hold the
variables of their documented schema, and ``ckpt report`` must draw them on the development page.
Nothing downloads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt, tiny_gpt2

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

pytestmark = pytest.mark.slow  # trains and imports a GPT-2, runs four analyzers and a report

VOCAB = 64
CHECKPOINTS = 4
STEPS_BETWEEN = 3
ANALYZERS = {
    "loss": [],
    "llc": ["--chains", "2", "--draws", "8", "--batch-size", "4", "--epsilon", "1e-4"],
    "spectrum": ["--samples", "8", "--probes", "6", "--slq-runs", "1", "--slq-steps", "4"],
    "essential-dynamics": ["--samples", "8"],
}
SCHEMA = {
    "llc": {
        "llc": ("step",),
        "llc_std": ("step",),
        "llc_chain": ("step", "chain"),
        "loss_trace": ("step", "chain", "draw"),
        "init_loss": ("step",),
        "rhat": ("step",),
        "ess": ("step",),
        "diverged": ("step", "chain"),
        "flat": ("step",),
    },
    "spectrum": {
        "trace": ("step",),
        "trace_stderr": ("step",),
        "block_trace": ("step", "module"),
        "ritz_values": ("step", "slq_run", "node"),
        "ritz_weights": ("step", "slq_run", "node"),
    },
    "essential-dynamics": {
        "projection": ("step", "component"),
        "explained_variance_ratio": ("component",),
        "turning_point": ("step",),
        "stage": ("step",),
    },
}
"""The variables each result must hold, with their dims (the schema the three analyzers were built to)."""


def _trainer_run(folder: Path) -> Path:
    """``folder/out``: ``checkpoint-3``, ``-6``, ... of a tiny GPT-2, as ``transformers.Trainer`` leaves them."""
    import torch

    model = tiny_gpt2(VOCAB).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, VOCAB, (8, 12), generator=torch.Generator().manual_seed(1))
    log = []
    for checkpoint in range(1, CHECKPOINTS + 1):
        for _ in range(STEPS_BETWEEN):
            loss = model(ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        step = checkpoint * STEPS_BETWEEN
        log.append({"step": step, "loss": float(loss.detach()), "learning_rate": 3e-3})
        out = folder / "out" / f"checkpoint-{step}"
        model.save_pretrained(out)
        (out / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": log}))
    np.save(folder / "ids.npy", ids.numpy())
    return folder / "out"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    store = folder / "run.zarr"
    done = invoke_ckpt("import", str(_trainer_run(folder)), str(store))
    assert done.returncode == 0, done.stderr
    done = invoke_ckpt("data", "add", str(store), "eval", "--inputs", str(folder / "ids.npy"))
    assert done.returncode == 0, done.stderr
    for name in ("loss", "spectrum", "essential-dynamics"):  # llc: its own test, on a copy (below)
        _analyze(store, name)
    return store


def _analyze(store: Path, name: str) -> None:
    done = invoke_ckpt("analyze", name, str(store), "--no-progress", *ANALYZERS[name])
    assert done.returncode == 0, f"{name}: {done.stderr}"
    assert f"computed {CHECKPOINTS} step(s)" in done.stdout, done.stdout


def _check_schema(result: xr.Dataset, name: str) -> None:
    assert [int(s) for s in result["step"].values] == [STEPS_BETWEEN * k for k in range(1, CHECKPOINTS + 1)]
    for variable, dims in SCHEMA[name].items():
        assert result[variable].dims == dims, (variable, result[variable].dims)
        values = result[variable].values
        if values.dtype.kind == "f":
            assert np.isfinite(values).all(), f"{name}.{variable} is not finite: {values}"


def test_the_imported_run_holds_the_trainer_checkpoints_and_log(imported: Path) -> None:
    store = ckptstore.open(imported)
    steps = [STEPS_BETWEEN * k for k in range(1, CHECKPOINTS + 1)]
    assert [int(s) for s in store.steps] == steps
    assert store.objective == "causal-lm"
    assert np.isfinite(store.metrics["loss"].values).all()


def test_llc_on_the_imported_run(imported: Path, tmp_path: Path) -> None:
    store = tmp_path / "run.zarr"
    shutil.copytree(imported, store)
    _analyze(store, "llc")
    result = ckptstore.open(store).analysis("llc").load()
    _check_schema(result, "llc")
    assert not result["diverged"].values.any()
    np.testing.assert_allclose(result["llc"].values, result["llc_chain"].values.mean(axis=1))
    np.testing.assert_allclose(result["llc_std"].values, result["llc_chain"].values.std(axis=1, ddof=1))


@pytest.mark.parametrize("name", ["spectrum", "essential-dynamics"])
def test_each_result_is_finite_and_holds_its_schema(imported: Path, name: str) -> None:
    result = ckptstore.open(imported).analysis(name).load()
    _check_schema(result, name)
    if name == "spectrum":
        weights = result["ritz_weights"].values.sum(axis=(1, 2))
        np.testing.assert_allclose(weights, 1.0, rtol=1e-6)  # a normalised density per checkpoint
        assert result.sizes["module"] >= 1
    if name == "essential-dynamics":
        ratio = result["explained_variance_ratio"].values
        assert (ratio >= 0).all() and ratio.sum() <= 1 + 1e-9 and (np.diff(ratio) <= 1e-12).all()
        stage = result["stage"].values
        np.testing.assert_array_equal(stage, np.cumsum(result["turning_point"].values))


def test_the_report_draws_them_on_the_development_page(imported: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = invoke_ckpt("report", str(imported), "--out", str(out), "--no-trajectory")
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    page = out.read_text()
    start = page.index('<h2 id="development">')
    section = page[start : page.index("<h2", start + 1)]
    assert '<img alt="development"' in section and "stale" not in section
    for name in ("loss", "spectrum", "essential-dynamics"):
        assert f"result <code>{name}</code>, {CHECKPOINTS} checkpoints" in section, name
    assert "missing</span>: <code>ckpt analyze llc " in section  # its own test ran on a copy

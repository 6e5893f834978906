"""Every built-in plugin passes the kit plugin authors use (``ckpt.plugins.testing``, ``ckpt.sandboxes.testing``).

The analyzers, objectives, importers and tasks are enumerated from the registry,
so a new built-in is covered the day it is registered: it fails
``test_every_builtin_has_a_setup`` until it is given a store and options here.
One ``Test*`` class per built-in is made from its setup, exactly as a plugin
author subclasses the kit. The stores are tiny and built once per session
(each test gets a copy): CI time is spent on the checks.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ckpt.plugins import load_registry
from ckpt.plugins.testing import AnalyzerTests, ImporterTests, ObjectiveTests, write_example_run
from ckpt.sandboxes.base import train
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition
from ckpt.sandboxes.testing import TaskTests
from tests.helpers import state_dict

BUILTINS = load_registry(entry_points=False)  # ckpt's own plugins, none installed by others

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


# -- the stores the analyzers run on ------------------------------------------------------------------
def mlp_run(path: Path) -> Path:
    """Five checkpoints of the example MLP, 50 eval examples."""
    return write_example_run(path, steps=5)


def small_mlp_run(path: Path) -> Path:
    """Three checkpoints, 12 eval examples: for the Hessian-basis family, whose cost grows with both."""
    return write_example_run(path, steps=3, examples=12)


def sandbox_run(path: Path) -> Path:
    """Sparse modular addition (a d=2 transformer): attention, embeddings and sequence tokens."""
    train(SparseModularAddition(), path, steps=8, every=4, seed=0, train_size=32, test_size=32)
    return path


def copy_of(build: Callable[[Path], Path], tmp_path: Path) -> Path:
    """A fresh copy of ``build``'s store, built once per session in the session's temporary folder."""
    template = tmp_path.parent / "conformance-stores" / build.__name__ / "run.zarr"
    if not template.exists():
        template.parent.mkdir(parents=True, exist_ok=True)
        build(template)
    return Path(shutil.copytree(template, tmp_path / "run.zarr"))


@dataclass(frozen=True)
class Setup:
    """How a built-in analyzer is run by the kit."""

    store: Callable[[Path], Path]
    options: dict[str, Any] = field(default_factory=dict)
    expected_failures: dict[str, str] = field(default_factory=dict)


BASIS = {"every": 2}  # a basis at steps 0 and 2 of the three
ANALYZER_SETUPS = {
    "attention": Setup(sandbox_run, {"examples": 16}),
    "boundary-distance": Setup(sandbox_run, {"directions": 32, "batch_size": 4096}),
    # --on loss: clustering POLCA trajectories would add the basis family's cost to a check of clusters
    "clusters": Setup(mlp_run, {"on": "loss", "split": "eval", "min_cluster_size": 5, "label": "odd"}),
    "curvature": Setup(sandbox_run, {"samples": 16, "lr": 0.003}),
    "embedding-geometry": Setup(sandbox_run, {"suffixes": 2}),  # token and sequence metrics both
    "essential-dynamics": Setup(mlp_run, {"samples": 20}),
    "fisher": Setup(small_mlp_run, BASIS),
    "grad-norms": Setup(mlp_run, {"batch_size": 20, "chunk_size": 8}),
    "hessian-basis": Setup(small_mlp_run, BASIS),
    "lca": Setup(
        small_mlp_run,
        expected_failures={
            "test_result_has_a_step_dim": "lca allocates the change over each pair of checkpoints in one run-level "
            "task: its step dim holds the first step of every pair, not every checkpoint",
        },
    ),
    # 50 examples in blocks of 16: several tasks per step, so their concatenation is covered too
    "llc": Setup(mlp_run, {"chains": 2, "draws": 8, "batch_size": 16, "epsilon": 1e-4, "warn": False}),
    "loss": Setup(mlp_run, {"block_examples": 16}),
    "loss-spikes": Setup(mlp_run),
    "normalization": Setup(sandbox_run, {"lr": 0.003}),
    "polca": Setup(small_mlp_run, BASIS),
    "random-basis": Setup(small_mlp_run, BASIS),
    "sparsity": Setup(mlp_run, {"batch_size": 16, "eps_count": 7}),
    "spectrum": Setup(small_mlp_run, {"samples": 16, "probes": 6, "slq_runs": 1, "slq_steps": 4}),
}


# -- objectives: a batch of each one's shape ---------------------------------------------------------
def classes_batch() -> tuple[Any, Any, Any]:
    return torch.randn(6, 4), torch.randint(0, 4, (6,)), None


def tokens_batch() -> tuple[Any, Any, Any]:
    mask = torch.rand(4, 5) > 0.3
    mask[:, 0] = True  # every example keeps a datapoint
    return torch.randn(4, 5, 7), torch.randint(0, 7, (4, 5)), mask


def causal_batch() -> tuple[Any, Any, Any]:
    targets = torch.randint(0, 7, (4, 6))
    targets[1, 3] = -100  # the Hugging Face "not a datapoint"
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2, 4:] = False  # padding
    return torch.randn(4, 6, 7), targets, mask


def token_cross_entropy(outputs: Any, targets: Any, mask: Any) -> Any:
    return F.cross_entropy(outputs[mask], targets[mask])


def causal_lm_loss(outputs: Any, targets: Any, mask: Any) -> Any:
    labels = targets[:, 1:].masked_fill(~mask[:, 1:], -100)
    return F.cross_entropy(outputs[:, :-1].flatten(0, 1), labels.flatten(), ignore_index=-100)


OBJECTIVE_SETUPS = {
    "cross-entropy": (classes_batch, lambda outputs, targets, mask: F.cross_entropy(outputs, targets)),
    "token-cross-entropy": (tokens_batch, token_cross_entropy),
    "causal-lm": (causal_batch, causal_lm_loss),
}


# -- importers: a folder of each format ----------------------------------------------------------------
def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: the bits, as ml_dtypes'
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def write_source(save: Callable[[dict[str, torch.Tensor], Path], None], name: str, folder: Path) -> dict:
    expected = {}
    for step in (0, 10, 20):
        tensors = state_dict(step)
        target = folder / name.format(step=step)
        target.parent.mkdir(parents=True, exist_ok=True)
        save(tensors, target)
        expected[step] = {key: as_numpy(value) for key, value in tensors.items()}
    return expected


def hf_source(folder: Path) -> dict:
    expected = write_source(save_file, "checkpoint-{step}/model.safetensors", folder)
    for step in expected:  # what else a Trainer leaves in a checkpoint folder
        (folder / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return expected


IMPORTER_SETUPS = {
    "torch": lambda folder: write_source(torch.save, "step_{step}.pt", folder),
    "safetensors": lambda folder: write_source(save_file, "step_{step}.safetensors", folder),
    "hf": hf_source,
}


# -- tasks: tiny runs --------------------------------------------------------------------------------
TASK_SETUPS = {
    "addition": {"layers": 1, "d_model": 16, "heads": 2, "d_mlp": 32, "batch_size": 8},
    "modular-addition": {"n": 7, "hidden": 8},
    "particles": {"n": 5},
    "sparse-modular-addition": {"train_size": 32, "test_size": 32},
    "tiny-lm": {"layers": 1, "d_model": 16, "heads": 2, "d_mlp": 32, "vocab": 64, "context": 8, "batch_size": 4},
}


@pytest.mark.parametrize(
    ("kind", "setups"),
    [
        ("analyzers", ANALYZER_SETUPS),
        ("objectives", OBJECTIVE_SETUPS),
        ("importers", IMPORTER_SETUPS),
        ("tasks", TASK_SETUPS),
    ],
)
def test_every_builtin_has_a_setup(kind: str, setups: dict[str, Any]) -> None:
    """A new built-in fails here until it is given a setup above, and so is run through the kit."""
    assert sorted(setups) == sorted(getattr(BUILTINS, kind))


def _class_name(kind: str, name: str) -> str:
    return f"Test{kind}{''.join(part.title() for part in name.split('-'))}"


def _define(base: type, kind: str, name: str, attributes: dict[str, Any]) -> None:
    """Define ``Test<kind><Name>(base)`` in this module, as a plugin author would write it."""
    class_name = _class_name(kind, name)
    globals()[class_name] = type(
        class_name, (base,), {"__module__": __name__, "__qualname__": class_name, **attributes}
    )


def _store_maker(build: Callable[[Path], Path]) -> Callable[[Any, Path], Path]:
    return lambda self, tmp_path: copy_of(build, tmp_path)


for _name, _setup in ANALYZER_SETUPS.items():
    if _name in BUILTINS.analyzers:  # a setup of an analyzer that is gone fails the test above
        _define(
            AnalyzerTests,
            "Analyzer",
            _name,
            {
                "analyzer_class": BUILTINS.analyzers[_name],
                "options": _setup.options,
                "expected_failures": _setup.expected_failures,
                "make_store": _store_maker(_setup.store),
            },
        )

for _name, (_batch, _reference) in OBJECTIVE_SETUPS.items():
    _define(
        ObjectiveTests,
        "Objective",
        _name,
        {
            "name": _name,
            "make_batch": staticmethod(_batch),
            "reference_loss": staticmethod(_reference),
        },
    )

for _name, _source in IMPORTER_SETUPS.items():
    _define(ImporterTests, "Importer", _name, {"name": _name, "make_source": staticmethod(_source)})

NO_OBJECTIVE = "a pair's potential depends on the whole batch: particles has no per-datapoint objective"
TASK_EXPECTED_FAILURES = {
    "particles": {
        "test_the_model_fits_the_data_and_objective": NO_OBJECTIVE,
        "test_its_runs_can_be_analyzed": f"{NO_OBJECTIVE} (the loss analyzer refuses its runs)",
    },
}

for _name, _options in TASK_SETUPS.items():
    _define(
        TaskTests,
        "Task",
        _name,
        {"name": _name, "options": _options, "expected_failures": TASK_EXPECTED_FAILURES.get(_name, {})},
    )

"""A fourth plugin written from docs/plugins.md alone, through the kit: the proof that the guide suffices.

Issue 70 asked for it: linear CKA of each checkpoint's activations against the final checkpoint's
(``per="run"``, a moving reference), the cosine of consecutive updates (triples of checkpoints,
``per="pair"``) and an MSE objective. It was written as a plugin author would, from the guide only,
and kept here unchanged but for the tests at the end; it needed no workaround once the guide said how
to name modules in ``compute`` (``ctx.store.model.build()``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
import xarray as xr

import ckpt
from ckpt.plugins import (
    PER_PAIR,
    PER_RUN,
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Objective,
    Option,
    Worker,
    hookimpl,
    iter_activations,
    select_modules,
)
from ckpt.plugins.testing import AnalyzerTests, ObjectiveTests, write_example_run


def _activations(worker: Worker, step: int, names: list[str], split: str) -> dict[str, np.ndarray]:
    """Each module's output over the whole split at ``step``, flattened to ``[examples, features]``, float64."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for chunk in iter_activations(worker, step, names, split=split, batch_size=256):
        for name in names:
            (values,) = chunk.outputs[name]  # one call per forward pass
            parts[name].append(values.double().flatten(1).cpu().numpy())
    return {name: np.concatenate(parts[name]) for name in names}


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two ``[n, p]``, ``[n, q]`` representations of the same examples."""
    x = x - x.mean(0)
    y = y - y.mean(0)
    cross = np.linalg.norm(y.T @ x) ** 2
    return float(cross / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def cka_to_final(worker: Worker, step: int, *, final: int, split: str, modules: str | None) -> dict[str, np.ndarray]:
    """CKA of each selected module's activations at ``step`` with its activations at ``final``."""
    names = select_modules(worker.model, modules)
    here = _activations(worker, step, names, split)
    there = _activations(worker, final, names, split)
    return {"cka": np.array([linear_cka(here[name], there[name]) for name in names])}


class CkaToFinal(Analyzer):
    """Linear CKA of each checkpoint's activations with the final checkpoint's."""

    name = "cka-to-final"
    version = "1"
    description = "Linear CKA of each checkpoint's activations against the final checkpoint's."
    per = PER_RUN  # against a moving reference: every value changes when a checkpoint is appended

    split = Option(str, "eval", "Data split whose inputs are fed to the model.")
    modules = Option(str, None, "Module names or globs, comma-separated (default: the activation modules).")

    def data_splits(self, store: Any) -> tuple[str, ...]:
        return (self.split,)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        if self.split not in ctx.store.splits:
            msg = f"no split {self.split!r} in the store; its splits: {', '.join(ctx.store.splits) or '(none)'}"
            raise AnalysisError(msg)
        names = _module_names(ctx, self.modules)
        result = ctx.map_checkpoints(
            cka_to_final,
            {"cka": (("module",), np.float64)},
            sizes={"module": len(names)},
            coords={"module": np.array(names, dtype=object)},
            final=int(ctx.store.steps[-1]),
            split=self.split,
            modules=self.modules,
        )
        result["cka"].attrs.update(long_name="linear CKA to the final checkpoint")
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Any]:
        """``cka``: each module's CKA over steps; ``map``: the same as an image, with a colorbar."""
        from matplotlib.figure import Figure

        steps = result["step"].values
        lines = Figure(figsize=(5, 3), layout="constrained")
        axes = lines.add_subplot()
        for index, module in enumerate(result["module"].values):
            axes.plot(steps, result["cka"].values[:, index], label=str(module))
        axes.set_xlabel("training step")
        axes.set_ylabel("CKA to the final checkpoint")
        axes.legend(fontsize="x-small")
        image = Figure(figsize=(5, 3), layout="constrained")
        axes = image.add_subplot()
        shown = axes.imshow(result["cka"].values.T, aspect="auto", vmin=0, vmax=1, cmap="viridis")
        axes.set_xlabel("checkpoint")
        axes.set_ylabel("module")
        image.colorbar(shown, ax=axes)
        return {"cka": lines, "map": image}


def _module_names(ctx: AnalysisContext, modules: str | None) -> list[str]:
    """The selected module names, from a model built in ``compute`` (the guide: cheap for small models)."""
    if ctx.store.model is None:
        msg = f"{ctx.store.path} records no model: cka-to-final needs one to capture activations"
        raise AnalysisError(msg)
    return select_modules(ctx.store.model.build(), modules)


def flat_weights(worker: Worker, step: int) -> np.ndarray:
    """Every tensor of the checkpoint, in float64, as one flat vector (names in sorted order)."""
    tensors = worker.tensors(step)
    return np.concatenate([tensors[name].astype(np.float64).ravel() for name in sorted(tensors)])


def update_cosine(
    worker: Worker, step: int, next_step: int, *, previous: dict[int, int | None]
) -> dict[str, np.ndarray]:
    """cos(θ_next − θ_step, θ_step − θ_previous): NaN at the first checkpoint."""
    if previous[step] is None:
        return {"cosine": np.array(np.nan)}
    before, here, after = (flat_weights(worker, s) for s in (previous[step], step, next_step))
    arriving, leaving = here - before, after - here
    return {"cosine": np.array(arriving @ leaving / (np.linalg.norm(arriving) * np.linalg.norm(leaving)))}


class UpdateCosine(Analyzer):
    """The cosine of each update with the one before it."""

    name = "update-cosine"
    version = "1"
    description = "Cosine of the update leaving each checkpoint with the one arriving at it."
    per = PER_PAIR

    def data_splits(self, store: Any) -> tuple[str, ...]:
        return ()

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        previous = {step: ctx.previous_step(step) for step in ctx.steps}
        return ctx.map_pairs(update_cosine, {"cosine": ((), np.float64)}, previous=previous)


def per_example_mse(outputs: Any, targets: Any, mask: Any) -> Any:
    """Mean squared error of each example (targets shaped like outputs)."""
    dtype = torch.promote_types(outputs.dtype, torch.float32)
    return ((outputs.to(dtype) - targets.to(dtype)) ** 2).flatten(1).mean(1)


def every_example(targets: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """One datapoint per example: (example, position=-1)."""
    n = len(targets)
    return np.arange(n), np.full(n, -1)


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    register(CkaToFinal)
    register(UpdateCosine)


@hookimpl
def ckpt_register_objectives(register: Callable[[str, Any], None]) -> None:
    register("mse", Objective(per_example_mse, every_example, "per-example mean squared error"))


# -- the kit on it, and its values --------------------------------------------------------------


class TestCkaToFinal(AnalyzerTests):
    analyzer_class = CkaToFinal
    plugin = sys.modules[__name__]

    def make_store(self, tmp_path: Path) -> Path:
        return write_example_run(tmp_path / "run.zarr", steps=3, examples=20)

    def test_the_final_checkpoint_is_itself(self, store: Path, registry: Any) -> None:
        result = ckpt.analyze("cka-to-final", store, registry=registry)
        np.testing.assert_allclose(result["cka"].values[-1], 1.0, rtol=1e-12)
        assert ((result["cka"].values > 0) & (result["cka"].values <= 1 + 1e-12)).all()

    def test_a_split_the_store_lacks_is_named(self, store: Path, registry: Any) -> None:
        with pytest.raises(AnalysisError, match=r"no split 'train' in the store; its splits: eval"):
            ckpt.analyze("cka-to-final", store, registry=registry, split="train")


class TestCkaOfTheLinearLayers(TestCkaToFinal):
    options: ClassVar[dict[str, Any]] = {"modules": "0,2"}


class TestUpdateCosine(AnalyzerTests):
    analyzer_class = UpdateCosine
    plugin = sys.modules[__name__]

    def make_store(self, tmp_path: Path) -> Path:
        return write_example_run(tmp_path / "run.zarr", steps=4, examples=8)


class TestMse(ObjectiveTests):
    name = "mse"
    plugin = sys.modules[__name__]

    def make_batch(self) -> tuple[Any, Any, Any]:
        return torch.randn(6, 3), torch.randn(6, 3), None

    def reference_loss(self, outputs: Any, targets: Any, mask: Any) -> Any:
        return torch.nn.functional.mse_loss(outputs, targets, reduction="none").mean(1).mean()

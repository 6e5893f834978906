"""``sparsity``: ε-smoothed activation sparsity at every checkpoint (Clustering Head, appendix A.2).

For each captured module m, checkpoint t and threshold ε of a log-spaced grid,
``sparsity[t, m, ε]`` is the fraction of the values a produced by m over the
split with ``|a| < ε``: every element of every captured tensor (all examples,
all positions, all units; a module called twice in a forward pass counts both
calls). ``nonpositive[t, m]`` is the fraction of the module's *inputs* that
are ``<= 0``: for an activation function, its pre-activations (for a ReLU, the
fraction of units it switches off).

By default the modules are the model's activation-function modules
(``nn.GELU``, ``nn.ReLU``, ``nn.Tanh``, ... instances; see
:mod:`ckpt.plugins`). Only modules can be captured: a model that calls
``torch.nn.functional.gelu`` directly has none, and the analyzer then stops
with an error asking for ``--modules``. Capture the *input* of the module that
consumes the activation instead: ``--modules mlp.fc2 --capture input`` gives
the sparsity of the GELU outputs of the ``sparse-modular-addition`` sandbox.

Memory: the split is run in chunks of ``--batch-size`` examples under
``torch.no_grad``; each chunk's activations are reduced to counts (one
``searchsorted`` of |a| into the ε grid and a ``bincount``) before the next
chunk runs, so a task never holds more than one chunk's activations. One Dask
task per checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.spike_causes import check_model_and_split
from ckpt.plugins import (
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    iter_activations,
    select_modules,
)
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

CAPTURE = ("output", "input")


def epsilon_grid(eps_min: float, eps_max: float, count: int) -> np.ndarray:
    """``count`` log-spaced thresholds from ``eps_min`` to ``eps_max`` (float64).

    Raises
    ------
    AnalysisError
        Unless ``0 < eps_min <= eps_max`` and ``count >= 1`` (and ``eps_min == eps_max`` only for one value).
    """
    if not (np.isfinite(eps_min) and np.isfinite(eps_max) and 0 < eps_min <= eps_max):
        msg = f"--eps-min and --eps-max must satisfy 0 < eps-min <= eps-max, got {eps_min} and {eps_max}"
        raise AnalysisError(msg)
    if count < 1 or (count > 1 and eps_min == eps_max):
        msg = f"--eps-count must be at least 1 (and 1 when eps-min == eps-max), got {count}"
        raise AnalysisError(msg)
    return np.logspace(np.log10(eps_min), np.log10(eps_max), count)


def below_counts(values: Any, epsilons: Any) -> Any:
    """Counts of ``|values| < ε`` for each ε of the sorted grid ``epsilons`` (torch, int64 ``[K]``).

    ``searchsorted(ε, |a|, right=True)`` is the number of thresholds ``<= |a|``,
    so ``|a| < ε_k`` exactly when it is at most k: the counts are the cumulative
    sum of its histogram. NaN counts as never below.
    """
    import torch

    magnitude = values.detach().reshape(-1).abs().to(torch.float64)
    index = torch.searchsorted(epsilons, magnitude, right=True)
    return torch.bincount(index, minlength=len(epsilons) + 1)[: len(epsilons)].cumsum(0)


def sparsity_counts(
    worker: Worker,
    step: int,
    *,
    modules: list[str],
    capture: str,
    split: str,
    epsilons: np.ndarray,
    batch_size: int,
) -> dict[str, np.ndarray]:
    """Sparsity of each module over the ε grid and its non-positive input fraction at ``step`` (on a worker)."""
    import torch

    grid = torch.as_tensor(epsilons, dtype=torch.float64, device=worker.device)
    below = torch.zeros((len(modules), len(epsilons)), dtype=torch.int64, device=worker.device)
    nonpositive = torch.zeros(len(modules), dtype=torch.int64, device=worker.device)
    values = np.zeros(len(modules), np.int64)
    inputs = np.zeros(len(modules), np.int64)
    batches = iter_activations(
        worker, step, modules, split=split, batch_size=batch_size, outputs=capture == "output", inputs=True
    )
    for batch in batches:
        for i, name in enumerate(modules):
            for tensor in batch.outputs[name] if capture == "output" else batch.inputs[name]:
                below[i] += below_counts(tensor, grid)
                values[i] += tensor.numel()
            for tensor in batch.inputs[name]:
                nonpositive[i] += (tensor <= 0).sum()
                inputs[i] += tensor.numel()
    with np.errstate(invalid="ignore", divide="ignore"):  # a module never called: NaN
        sparsity = below.cpu().numpy() / values[:, None].astype(np.float64)
        fraction = nonpositive.cpu().numpy() / inputs.astype(np.float64)
    return {"sparsity": sparsity, "nonpositive": fraction, "values": values}


class Sparsity(OneSplit, Analyzer):
    """Fraction of activations with |a| < ε over an ε grid, per module, at every checkpoint."""

    name = "sparsity"
    version = "1"
    description = "ε-smoothed activation sparsity (fraction of |a| < ε) per module over an ε grid, per checkpoint."

    modules = Option(str, None, "Modules to capture, names or globs, comma-separated (default: activation modules).")
    capture = Option(str, "output", "Measure the modules' outputs or their inputs.", choices=CAPTURE)
    split = Option(str, "eval", "Data split fed to the model.")
    eps_min = Option(float, 1e-5, "Smallest ε of the grid.", minimum=1e-30)
    eps_max = Option(float, 1e2, "Largest ε of the grid.", minimum=1e-30)
    eps_count = Option(int, 50, "Number of log-spaced ε values.", minimum=1)
    batch_size = Option(int, 1024, "Examples per forward pass (bounds memory).", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; the modules are resolved on the model built here."""
        store = ctx.store
        check_model_and_split(store, self.split, self.name)
        epsilons = epsilon_grid(self.eps_min, self.eps_max, self.eps_count)
        modules = select_modules(store.model.build(), self.modules)
        result = ctx.map_checkpoints(
            sparsity_counts,
            {
                "sparsity": (("module", "epsilon"), np.float64),
                "nonpositive": (("module",), np.float64),
                "values": (("module",), np.int64),
            },
            sizes={"module": len(modules), "epsilon": len(epsilons)},
            coords={"module": np.array(modules, dtype=object), "epsilon": epsilons},
            modules=modules,
            capture=self.capture,
            split=self.split,
            epsilons=epsilons,
            batch_size=self.batch_size,
        )
        measured = "outputs" if self.capture == "output" else "inputs"
        result["sparsity"].attrs.update(
            long_name="activation sparsity",
            description=f"fraction of the module's {measured} on split {self.split!r} with |a| < epsilon",
        )
        result["nonpositive"].attrs.update(
            long_name="non-positive input fraction",
            description="fraction of the module's inputs <= 0 (the pre-activations of an activation function)",
        )
        result["values"].attrs.update(description=f"number of {measured} values counted (all calls, all elements)")
        result["epsilon"].attrs.update(long_name="epsilon", description="threshold on |a|")
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``epsilon``: sparsity against ε per module, a curve per checkpoint (Clustering Head Fig. 17)."""
        from ckpt.analyzers.figures.sparsity import figures

        return figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Per module, at the first and last checkpoints: non-positive inputs and sparsity at a few ε."""
        options = result.ckpt.options
        epsilons = result["epsilon"].values
        steps = result["step"].values
        modules = [str(m) for m in result["module"].values]
        if not len(steps) or not modules:
            return "  (empty result)"
        wanted = [e for e in (1e-3, 1e-2, 1e-1, 1.0) if epsilons.min() <= e <= epsilons.max()] or [epsilons[0]]
        picks = sorted({int(np.argmin(np.abs(np.log(epsilons) - np.log(e)))) for e in wanted})
        measured = "outputs" if options.get("capture", "output") == "output" else "inputs"
        head = (
            f"  {len(modules)} module(s), {len(steps)} checkpoint(s), {len(epsilons)} ε from {epsilons.min():.3g}"
            f" to {epsilons.max():.3g}; sparsity = fraction of |{measured}| < ε"
        )
        width = max(6, *(len(m) for m in modules))
        columns = "".join(f"  {'ε=' + format(epsilons[k], '.3g'):>9}" for k in picks)
        rows = [head, f"  {'module':<{width}}  {'step':>8}  {'nonpos':>7}{columns}"]
        sparsity, nonpositive = result["sparsity"].values, result["nonpositive"].values
        for i, module in enumerate(modules):
            for j in sorted({0, len(steps) - 1}):
                cells = "".join(f"  {sparsity[j, i, k]:>9.4f}" for k in picks)
                label = module if j == 0 else ""
                rows.append(f"  {label:<{width}}  {int(steps[j]):>8}  {nonpositive[j, i]:>7.4f}{cells}")
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Sparsity)


__all__ = ["CAPTURE", "Sparsity", "below_counts", "ckpt_register_analyzers", "epsilon_grid", "sparsity_counts"]

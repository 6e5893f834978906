"""``normalization``: how close the inputs of normalisation layers come to the origin (Clustering Head §4.3).

The paper (§4.3, Fig. 12) traces one kind of loss spike to the normalisation
f(x) = x/‖x‖: its curvature grows like 1/‖x‖ near the origin, and a gradient
step of size η along u = x/‖x‖ leaves f(x) unchanged only while η < ‖x‖; past
that it carries x through the origin and flips f(x). At every checkpoint, for
each normalisation layer, this analyzer gives the distribution of ‖x‖ over the
vectors the layer normalises on ``--split`` (every example, every position, every
call), as quantiles 0, 1, 5, 25, 50, 75, 95, 99 and 100% (the 0% quantile is the
minimum), and the share of those vectors with ‖x‖ < η, η being the learning rate
in force at that step (``--lr``, else a learning-rate metric the run stored).

What is measured is the **plain Euclidean norm** ‖x‖ over the normalised axes
(the last axis, or ``normalized_shape``'s axes for ``nn.LayerNorm`` and
``nn.RMSNorm``), not the RMS that an RMS-norm divides by: x/sqrt(mean x² + eps)
divides by ‖x‖/sqrt(d), which would make the comparison with η depend on the
width d. The paper's condition η < ‖x‖ is about the direction x/‖x‖, which every
such layer computes up to a constant factor, so the plain norm is the one to
compare. ``nn.LayerNorm`` subtracts the mean first: its singular point is any
constant vector, so for it ‖x − mean(x)‖ is measured (``centered`` says which).
With Adam (the sandboxes' optimizer) a step moves each coordinate by about η, so
η is the step's scale there too.

Which modules: ``nn.LayerNorm``, ``nn.RMSNorm`` and modules from other libraries
whose class name ends in ``Norm`` (Hugging Face's ``LlamaRMSNorm``, the
``sparse-modular-addition`` sandbox's ``GainlessRMSNorm``); ``--modules`` chooses
others (their last axis is normalised, not centred). A model with none is an
error naming ``--modules``; one that normalises with a function call has no
module to hook.

Memory: chunks of ``--batch-size`` examples under ``torch.no_grad``; every norm is
kept (8 bytes per normalised vector) for exact quantiles, and an error naming
``--max-memory`` stops a task whose norms would pass a quarter of its budget.
One Dask task per checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.spike_causes import check_model_and_split, learning_rates
from ckpt.engine.memory import format_size
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

QUANTILES = np.array([0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0])
"""Quantiles of ‖x‖ stored (0: the minimum, 1: the maximum)."""
NORMS_SHARE = 4
"""The kept norms may use 1/NORMS_SHARE of the task's memory budget (the forward pass needs the rest)."""


def normalization_layers(model: Any) -> list[str]:
    """Names of the normalisation layers of ``model``: ``nn.LayerNorm``, ``nn.RMSNorm``, other libraries' ``*Norm``.

    ``torch.nn``'s batch, group and instance norms are left out: they normalise over
    other axes than a vector's features, where ‖x‖ of one vector is not what they divide by.
    """
    from torch import nn

    return [
        name
        for name, module in model.named_modules()
        if name
        and (
            isinstance(module, (nn.LayerNorm, nn.RMSNorm))
            or (type(module).__name__.endswith("Norm") and not type(module).__module__.startswith("torch."))
        )
    ]


def normalized_axes(module: Any) -> tuple[int, bool]:
    """(trailing axes the module normalises, whether it centres first) of a normalisation module."""
    from torch import nn

    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return len(module.normalized_shape), isinstance(module, nn.LayerNorm)
    return 1, False


def input_norms(
    worker: Worker,
    step: int,
    *,
    modules: list[str],
    axes: list[int],
    centered: list[bool],
    split: str,
    batch_size: int,
    rates: dict[int, float],
) -> dict[str, np.ndarray]:
    """Quantiles of ‖x‖ at each module's input and the share below η at ``step`` (on a worker)."""
    import torch

    kept: list[list[Any]] = [[] for _ in modules]
    count = 0
    for batch in iter_activations(
        worker, step, modules, split=split, batch_size=batch_size, outputs=False, inputs=True
    ):
        for i, name in enumerate(modules):
            for tensor in batch.inputs[name]:
                x = tensor.detach().to(torch.float64)
                dims = tuple(range(-axes[i], 0))
                if centered[i]:
                    x = x - x.mean(dim=dims, keepdim=True)
                norms = torch.linalg.vector_norm(x, dim=dims).reshape(-1).cpu()
                kept[i].append(norms)
                count += norms.numel()
        if 8 * count > worker.memory_budget // NORMS_SHARE:
            msg = (
                f"normalization keeps every norm for exact quantiles: {count:,} norms so far at step {step} pass "
                f"a quarter of the memory budget ({format_size(worker.memory_budget)}); raise --max-memory, or "
                "use a smaller --split"
            )
            raise AnalysisError(msg)
    eta = rates[step]
    quantiles = np.full((len(modules), len(QUANTILES)), np.nan)
    below = np.full(len(modules), np.nan)
    vectors = np.zeros(len(modules), np.int64)
    for i, parts in enumerate(kept):
        if not parts:  # a module the forward pass never called: NaN, counted as 0 vectors
            continue
        norms = torch.cat(parts).numpy()
        vectors[i] = norms.size
        quantiles[i] = np.quantile(norms, QUANTILES)
        below[i] = float(np.mean(norms < eta))
    return {"norm_quantile": quantiles, "below_lr": below, "vectors": vectors, "learning_rate": np.array(eta)}


class Normalization(OneSplit, Analyzer):
    """Distribution of ‖x‖ at each normalisation layer's input and the share with ‖x‖ < η, per checkpoint."""

    name = "normalization"
    version = "1"
    description = "Norms ‖x‖ reaching each normalisation layer (quantiles) and the share below the learning rate."

    modules = Option(str, None, "Normalisation modules, names or globs, comma-separated (default: *Norm layers).")
    split = Option(str, "eval", "Data split fed to the model.")
    batch_size = Option(int, 1024, "Examples per forward pass (bounds memory).", minimum=1)
    lr = Option(float, None, "Learning rate η (default: the store's lr or learning_rate metric).", minimum=0)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; modules and η are resolved here, before any work."""
        store = ctx.store
        check_model_and_split(store, self.split, self.name)
        model = store.model.build()
        if self.modules:
            modules = select_modules(model, self.modules)
        else:
            modules = normalization_layers(model)
            if not modules:
                msg = (
                    f"the model ({type(model).__name__}) has no normalisation module (nn.LayerNorm, nn.RMSNorm, "
                    "*Norm): pass --modules naming the modules whose inputs are normalised"
                )
                raise AnalysisError(msg)
        rates = learning_rates(store, list(ctx.steps), self.lr, analyzer=self.name, required=True)
        found = dict(model.named_modules())
        axes, centered = zip(*(normalized_axes(found[name]) for name in modules), strict=True)
        result = ctx.map_checkpoints(
            input_norms,
            {
                "norm_quantile": (("module", "quantile"), np.float64),
                "below_lr": (("module",), np.float64),
                "vectors": (("module",), np.int64),
                "learning_rate": ((), np.float64),
            },
            sizes={"module": len(modules), "quantile": len(QUANTILES)},
            coords={
                "module": np.array(modules, dtype=object),
                "quantile": QUANTILES,
                "centered": ("module", np.array(centered, dtype=bool)),
            },
            modules=modules,
            axes=list(axes),
            centered=list(centered),
            split=self.split,
            batch_size=self.batch_size,
            rates=rates,
        )
        result["norm_quantile"].attrs.update(
            long_name="‖x‖ quantile",
            description=(
                f"quantiles of the plain Euclidean norm of each vector reaching the module on split {self.split!r} "
                "(mean-centred where centered); NaN where the module was never called"
            ),
        )
        result["below_lr"].attrs.update(
            long_name="share with ‖x‖ < η",
            description="fraction of the normalised vectors with norm below the learning rate (Clustering Head §4.3)",
        )
        result["vectors"].attrs["description"] = "normalised vectors counted (examples x positions x calls)"
        source = "--lr" if self.lr is not None else "the store's learning-rate metric"
        result["learning_rate"].attrs.update(long_name="learning rate η", description=f"from {source}")
        result["centered"].attrs["description"] = "the module subtracts the mean first (nn.LayerNorm): ‖x - mean x‖"
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``norms`` (quantile bands of ‖x‖ against η) and ``below-lr`` (the share with ‖x‖ < η)."""
        from ckpt.analyzers.figures.spike_causes import normalization_figures

        return normalization_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Per module, at the first and last checkpoints: minimum, median and share below η."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        modules = [str(m) for m in result["module"].values]
        width = max(6, *(len(m) for m in modules))
        rows = [f"  {'module':<{width}}  {'step':>8}  {'min ‖x‖':>10}  {'median':>10}  {'η':>9}  {'< η':>7}"]
        quantiles = result["norm_quantile"]
        for i, module in enumerate(modules):
            for j in sorted({0, len(steps) - 1}):
                q = quantiles.isel(step=j, module=i)
                rows.append(
                    f"  {module if j == 0 else '':<{width}}  {int(steps[j]):>8}  {float(q.sel(quantile=0.0)):>10.4g}"
                    f"  {float(q.sel(quantile=0.5)):>10.4g}  {float(result['learning_rate'][j]):>9.3g}"
                    f"  {float(result['below_lr'][j, i]):>7.2%}"
                )
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Normalization)


__all__ = [
    "NORMS_SHARE",
    "QUANTILES",
    "Normalization",
    "ckpt_register_analyzers",
    "input_norms",
    "normalization_layers",
    "normalized_axes",
]

"""``loss``: the exact loss of every datapoint at every checkpoint (Hidden Breakthroughs, section 3).

The model is rebuilt from the store's model spec and evaluated functionally
with each checkpoint's tensors; the store's objective turns outputs into one
loss per datapoint (one example, or one selected token). One Dask task per
(checkpoint, block of examples).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.plugins import AnalysisContext, Analyzer, Option, Worker, datapoint_index
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


def datapoint_losses(
    worker: Worker, step: int, *, split: str, objective: str | None, batch_size: int, examples: slice
) -> dict[str, np.ndarray]:
    """Losses of the datapoints of ``examples`` at ``step`` (runs on a worker)."""
    losses = worker.losses(step, split, examples, objective=objective, batch_size=batch_size)
    return {"loss": losses}


class Loss(OneSplit, Analyzer):
    """Exact loss per datapoint at every checkpoint, and its mean over the split."""

    name = "loss"
    version = "1"
    description = "Exact loss of every datapoint (example or token) at every checkpoint."

    split = Option(str, "eval", "Data split to evaluate on.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    batch_size = Option(int, 1024, "Examples per forward pass.", minimum=1)
    block_examples = Option(int, 8192, "Examples per Dask task (bounds a task's memory).", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """Per-datapoint losses for ``ctx.steps``, lazily."""
        example, position = datapoint_index(ctx.store, self.split, self.objective)
        blocks = ctx.datapoint_blocks(self.split, self.objective, self.block_examples)
        result = ctx.map_checkpoints(
            datapoint_losses,
            {"loss": (("datapoint",), np.float64)},
            sizes={"datapoint": len(example)},
            coords={"example": ("datapoint", example), "position": ("datapoint", position)},
            datapoint_blocks=blocks,
            split=self.split,
            objective=self.objective,
            batch_size=self.batch_size,
        )
        result["loss"].attrs.update(long_name="loss", description=f"per-datapoint loss on split {self.split!r}")
        result["mean_loss"] = result["loss"].mean("datapoint")
        result["mean_loss"].attrs.update(long_name="mean loss", description=f"mean over the {self.split!r} split")
        return result

    def summarize(self, result: xr.Dataset) -> str:
        """Mean loss at the first, a few middle, and the last steps."""
        mean = result["mean_loss"].values
        steps = result["step"].values
        picks = sorted({0, *np.linspace(0, len(steps) - 1, 6).astype(int).tolist()}) if len(steps) else []
        rows = [f"  {'step':>10}  mean loss"] + [f"  {steps[i]:>10}  {mean[i]:.5f}" for i in picks]
        datapoints = result.sizes["datapoint"]
        return f"  {datapoints} datapoints, {len(steps)} checkpoints\n" + "\n".join(rows)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``curves``: median and quartiles of the loss over steps, overall and per label group."""
        from ckpt.analyzers.figures.loss import figures

        return figures(result, store)


ckpt_register_analyzers = analyzer_hook(Loss)


__all__ = ["Loss", "ckpt_register_analyzers", "datapoint_losses"]

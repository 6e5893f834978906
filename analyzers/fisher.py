"""``fisher``: projected Fisher information ⟨b, ∇ℓ(x)⟩² per datapoint and basis vector (a POLCA baseline).

The baseline of "Hidden Breakthroughs" that clusters datapoints by how
strongly their gradient points along each basis vector, at every checkpoint.
It shares POLCA's per-checkpoint JVP pass (first order only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.basis import BasisReader
from ckpt.analyzers.polca import checkpoint_terms
from ckpt.numerics.basis_format import FOUND_AT, check_basis
from ckpt.plugins import AnalysisContext, Analyzer, Option, datapoint_index, parameter_space
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


class Fisher(OneSplit, BasisReader, Analyzer):
    """Squared projection of every datapoint's gradient on every basis vector, at every checkpoint."""

    name = "fisher"
    version = "1"
    description = "Projected Fisher information <b, grad loss(x)>^2 per datapoint and basis vector."
    requires = ("hessian-basis",)

    split = Option(str, "eval", "Data split whose datapoints are analysed.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    basis_batch = Option(int, 8, "Basis vectors per vectorized JVP pass (bounds memory).", minimum=1)
    block_examples = Option(int, 8192, "Examples per Dask task.", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One first-order JVP pass per checkpoint and block of examples."""
        import xarray as xr

        basis = ctx.result(self.basis)
        count = check_basis(basis, parameter_space(ctx.store), self.basis)
        example, position = datapoint_index(ctx.store, self.split, self.objective)
        terms = ctx.map_checkpoints(
            checkpoint_terms,
            {"first": (("basis", "datapoint"), np.float64)},
            sizes={"basis": count, "datapoint": len(example)},
            datapoint_blocks=ctx.datapoint_blocks(self.split, self.objective, self.block_examples),
            split=self.split,
            objective=self.objective,
            order=1,
            batch_size=self.batch_size,
            basis_batch=self.basis_batch,
            dtype=self.dtype,
            basis=self.basis,
            created=str(basis.ckpt.created or ""),
        )
        fisher = terms["first"] ** 2
        fisher.attrs["description"] = "<b, grad loss(x; theta_t)>^2"
        mean = fisher.mean("datapoint")
        mean.attrs["description"] = "mean over datapoints: b^T F b, F the empirical Fisher"
        coords = {
            "example": ("datapoint", example),
            "position": ("datapoint", position),
            FOUND_AT: basis[FOUND_AT].variable,  # lazy (a dask-backed coordinate)
        }
        return xr.Dataset({"fisher": fisher, "mean_fisher": mean}, coords=coords)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``trajectories``: projected Fisher information per basis vector, median and quartiles."""
        from ckpt.analyzers.figures.basis import projected_figures

        return projected_figures(result, store, "fisher", "projected Fisher information per basis vector")

    def summarize(self, result: xr.Dataset) -> str:
        """Mean projected Fisher information per basis vector at the first and last step."""
        mean = result["mean_fisher"].values
        steps = result["step"].values
        rows = [f"  {'basis':>5}  {'step ' + str(steps[0]):>14}  {'step ' + str(steps[-1]):>14}"]
        rows += [f"  {b:>5}  {mean[0, b]:>14.5g}  {mean[-1, b]:>14.5g}" for b in range(mean.shape[1])]
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Fisher)


__all__ = ["Fisher", "ckpt_register_analyzers"]

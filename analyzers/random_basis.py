"""``random-basis``: random orthonormal directions, POLCA's ablation (Hidden Breakthroughs, section 5).

The same layout as ``hessian-basis`` (and by default as many vectors, found
at the same steps), drawn from a seeded Gaussian and orthonormalized by a QR
decomposition, so that POLCA over it is the paper's random-basis baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import ScheduleOptions, basis_steps
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    basis_dims,
    hookimpl,
    parameter_space,
)

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


def orthonormal_rows(worker: Worker, count: int, size: int, seed: int) -> dict[str, np.ndarray]:
    """``count`` orthonormal rows in R^size from a seeded Gaussian (float32)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(size, count, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return {"vectors": (q * torch.sign(r.diagonal())).T.float().numpy()}


class RandomBasis(ScheduleOptions, Analyzer):
    """Random orthonormal directions in parameter space."""

    name = "random-basis"
    version = "1"
    description = "Random orthonormal basis (POLCA's ablation), laid out like hessian-basis."
    per = PER_RUN

    vectors = Option(
        int, 0, "Number of vectors (0: as many as --every/--at-steps/-k give the Hessian basis).", minimum=0
    )

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task draws all vectors; the result is split back into tensors."""
        import dask.array as da
        import xarray as xr

        space = parameter_space(ctx.store)
        steps = basis_steps(ctx.store, self.every, self.at_steps)
        found_at = np.repeat(np.asarray(steps, np.int64), self.k)
        count = self.vectors or len(found_at)
        if count < 1 or count > space.size:
            msg = f"--vectors must be between 1 and the {space.size} parameters, got {count}"
            raise AnalysisError(msg)
        if self.vectors:
            found_at = np.full(count, int(ctx.store.steps[-1]), np.int64)
        task = ctx.delayed(orthonormal_rows, count, space.size, self.seed)
        vectors = da.from_delayed(task["vectors"], shape=(count, space.size), dtype=np.float32)
        variables = {
            name: (basis_dims(name, len(shape)), vectors[:, start : start + length].reshape(-1, *shape))
            for name, shape, start, length in zip(space.names, space.shapes, space.offsets, space.sizes, strict=True)
        }
        return xr.Dataset(variables, coords={"basis": np.arange(count), "found_at_step": ("basis", found_at)})

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``vectors``: how many vectors each checkpoint added."""
        from ckpt.analyzers.figures.basis import basis_figures

        return basis_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """The number of vectors and the parameters they span."""
        tensors = [name for name in result.data_vars]
        return f"  {result.sizes['basis']} random orthonormal vectors over {len(tensors)} parameter tensors"


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register ``random-basis``."""
    register(RandomBasis)

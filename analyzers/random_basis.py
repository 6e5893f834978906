"""``random-basis``: random orthonormal directions, POLCA's ablation (Hidden Breakthroughs, section 5).

The same layout as ``hessian-basis`` (and by default as many vectors, found
at the same steps), drawn from a seeded Gaussian and orthonormalized by a QR
decomposition, so that POLCA over it is the paper's random-basis baseline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import ScheduleOptions, basis_steps, check_basis_size
from ckpt.engine.memory import format_size
from ckpt.numerics.basis_format import BASIS_DIM, basis_dataset
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    parameter_space,
)
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


BLOCK_ROWS = 1 << 20
"""Coordinates per block of the Gaussian (8 MiB per vector in float64): memory beyond the result."""


def gaussian_block(seed: int, index: int, rows: int, count: int) -> np.ndarray:
    """Block ``index`` of the seeded Gaussian: ``rows`` coordinates of ``count`` vectors (float64)."""
    return np.random.default_rng([seed, index]).standard_normal((rows, count))


def orthonormal_rows(
    worker: Worker | None, count: int, size: int, seed: int, block_rows: int = BLOCK_ROWS
) -> dict[str, np.ndarray]:
    """``count`` orthonormal rows in R^size from a seeded Gaussian A (float32 result, float64 arithmetic).

    The rows are Q of A = QR with R's diagonal positive, the same Q as Householder QR
    (``numpy.linalg.qr`` up to the sign convention), computed without A in memory: the Gram
    matrix AᵀA = RᵀR is summed over blocks of coordinates, and each block of Q is that block of
    A times R⁻¹, the blocks drawn again from their seeds (Cholesky QR). Its loss of
    orthogonality grows with cond(A)²; a Gaussian with D ≥ 2K coordinates has cond(A) ≤ 5.8, so
    it stays near float64 rounding, far below the result's float32. A nearly square A (D < 2K,
    small models only) takes Householder QR. Before, A, Q and their float64 copies were whole:
    28·D·K bytes, 14 GB for 4 vectors of GPT-2 small.
    """
    from scipy.linalg import solve_triangular

    starts = range(0, size, block_rows)

    def blocks() -> Any:
        for index, start in enumerate(starts):
            yield start, gaussian_block(seed, index, min(block_rows, size - start), count)

    if 2 * count > size:
        q, r = np.linalg.qr(np.concatenate([block for _, block in blocks()]))
        return {"vectors": (q * np.sign(np.diag(r))).T.astype(np.float32)}
    gram = np.zeros((count, count))
    for _, block in blocks():
        gram += block.T @ block
    inverse = solve_triangular(np.linalg.cholesky(gram).T, np.eye(count))  # R⁻¹, R = Lᵀ upper triangular
    vectors = np.empty((count, size), np.float32)
    for start, block in blocks():
        vectors[:, start : start + len(block)] = (block @ inverse).T
    return {"vectors": vectors}


class RandomBasis(ScheduleOptions, Analyzer):
    """Random orthonormal directions in parameter space."""

    name = "random-basis"
    version = "2"  # 2: the Gaussian drawn by blocks of coordinates (numpy), orthonormalized by Cholesky QR
    description = "Random orthonormal basis (POLCA's ablation), laid out like hessian-basis."
    per = PER_RUN

    vectors = Option(
        int, 0, "Number of vectors (0: as many as --every/--at-steps/-k give the Hessian basis).", minimum=0
    )

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """None: computed from the weights alone."""
        return ()

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task draws all vectors; the result is split back into tensors."""
        import dask.array as da

        space = parameter_space(ctx.store)
        steps = basis_steps(ctx.store, self.every, self.at_steps)
        if not self.vectors:
            check_basis_size(self.name, steps, self.k, space.size)
        found_at = np.repeat(np.asarray(steps, np.int64), self.k)
        count = self.vectors or len(found_at)
        if count < 1 or count > space.size:
            msg = f"--vectors must be between 1 and the {space.size} parameters, got {count}"
            raise AnalysisError(msg)
        if self.vectors:
            found_at = np.full(count, int(ctx.store.steps[-1]), np.int64)
        need = 4 * count * space.size + 16 * min(BLOCK_ROWS, space.size) * count  # float32 result, 2 float64 blocks
        budget = ctx.spec.max_memory  # None: a remote cluster's machines each have their own
        if budget is not None and need > budget:
            msg = (
                f"random-basis needs {format_size(need)} for {count} vectors of {space.size:,} parameters; the "
                f"memory budget is {format_size(ctx.spec.max_memory)}: raise --max-memory or ask for fewer vectors "
                "(--vectors, -k, --every)"
            )
            raise AnalysisError(msg)
        task = ctx.delayed(orthonormal_rows, count, space.size, self.seed)
        vectors = da.from_delayed(task["vectors"], shape=(count, space.size), dtype=np.float32)
        tensors = {
            name: vectors[:, start : start + length].reshape(-1, *shape)
            for name, shape, start, length in zip(space.names, space.shapes, space.offsets, space.sizes, strict=True)
        }
        return basis_dataset(space, tensors, found_at)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``vectors``: how many vectors each checkpoint added."""
        from ckpt.analyzers.figures.basis import basis_figures

        return basis_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """The number of vectors and the parameters they span."""
        tensors = [name for name in result.data_vars]
        return f"  {result.sizes[BASIS_DIM]} random orthonormal vectors over {len(tensors)} parameter tensors"


ckpt_register_analyzers = analyzer_hook(RandomBasis)


__all__ = ["BLOCK_ROWS", "RandomBasis", "ckpt_register_analyzers", "gaussian_block", "orthonormal_rows"]

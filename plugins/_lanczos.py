"""Top eigenpairs of a matrix-free symmetric operator restricted to a basis' complement (Lanczos).

:func:`top_eigenpairs` finds the largest algebraic eigenpairs of P H P,
P = I - B Bᵀ, from Hessian-vector products alone: the Hessian-basis
analyzer's search at each basis checkpoint (Hidden Breakthroughs, Algorithm 1).

Why a Lanczos of our own rather than scipy's ``eigsh`` (ARPACK), which ckpt
used before: the products are almost all of the time, and ARPACK spends more of
them than the method needs. It tests convergence only once its ``ncv`` vectors
are full and again after each implicit restart, and its residuals cost one more
product per eigenvector. Here every step tests convergence on the projected
matrix (free), and the residuals follow from the Lanczos relation without new
products. Top 4 eigenpairs of the addition default model at tol 1e-6 (256
problems, float32): ARPACK 26 products + 4 for the residuals, this 26 in all;
at tol 1e-7, 35 + 4 against 28; the eigenvalues agree to 1e-8 (bench/polca.py).
Torch has no matrix-free Lanczos (``torch.lobpcg`` takes the matrix itself),
and the vectors stay on the worker's device here, where ARPACK's lived on the host.

Memory is bounded by ``max_vectors``: at most that many Lanczos vectors are
kept, in the products' own precision (4·D bytes each in float32); when they are
full and the search has not converged, it restarts thickly (Wu & Simon's
thick-restart Lanczos, the symmetric case of Stewart's Krylov-Schur): the best
Ritz vectors are kept, the rest dropped, and the recurrence goes on from the
residual. The dot products run in float64 over bounded column blocks, so that
nothing of size 8·D is ever allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError

DOT_BLOCK_BYTES = 16 * 2**20
"""Float64 scratch of one block of a chunked dot product or update (bounded whatever D is)."""
MIN_VECTORS_BEYOND_K = 4
"""A thick restart keeps k Ritz vectors and needs room to grow past them. With k + 2 vectors the top
eigenpair of a 1.7M-parameter GPT-2 (tol 1e-6) had not converged after 100 products; k + 4 took 56,
k + 6 43, k + 8 39, unbounded 35."""


@dataclass
class Eigenpairs:
    """Eigenpairs found by :func:`top_eigenpairs` (numpy)."""

    values: np.ndarray
    """``[k]`` eigenvalues, largest first."""
    vectors: np.ndarray
    """``[k, D]`` orthonormal eigenvectors, orthogonal to the basis they were found against."""
    residuals: np.ndarray
    """``[k]`` ||A v - λ v|| with A = P H P."""
    matvecs: int
    """Hessian-vector products used."""
    restarts: int = 0
    """Thick restarts made because ``max_vectors`` was full."""


def product_limit(free: int, k: int) -> int:
    """Most products one search may make before it gives up (:class:`AnalysisError`: raise ``--tol``)."""
    return min(free, max(100, 20 * k))


def lanczos_bytes(dimension: int, vectors: int, itemsize: int = 4) -> int:
    """Bytes of a search that keeps ``vectors`` Lanczos vectors: those, the residual, the product and scratch."""
    width = _block_width(vectors, dimension)
    # one block of rows in float64, and the block of x, of the update and of the result
    return (vectors + 2) * dimension * itemsize + 8 * width * (vectors + 3)


def _block_width(rows: int, dimension: int) -> int:
    """Columns per block, so that ``rows`` of them in float64 take at most :data:`DOT_BLOCK_BYTES`."""
    return min(dimension, max(1, DOT_BLOCK_BYTES // (8 * max(rows, 1))))


def _dots(rows: Any, x: Any) -> Any:
    """``rows @ x`` accumulated in float64, one bounded block of columns at a time."""
    import torch

    out = torch.zeros(rows.shape[0], dtype=torch.float64, device=x.device)
    if rows.shape[0] == 0:
        return out
    width = _block_width(rows.shape[0], x.shape[0])
    for start in range(0, x.shape[0], width):
        block = slice(start, start + width)
        out += rows[:, block].to(torch.float64) @ x[block].to(torch.float64)
    return out


def _subtract(x: Any, rows: Any, coefficients: Any) -> None:
    """``x -= rowsᵀ coefficients`` in place, computed in float64 block by block."""
    import torch

    if rows.shape[0] == 0:
        return
    width = _block_width(rows.shape[0], x.shape[0])
    for start in range(0, x.shape[0], width):
        block = slice(start, start + width)
        update = coefficients @ rows[:, block].to(torch.float64)
        x[block] = (x[block].to(torch.float64) - update).to(x.dtype)


def _combine_in_place(rows: Any, combination: Any) -> None:
    """``rows[:l] = combinationᵀ rows`` in place (``combination`` is ``[m, l]``), block by block."""
    import torch

    kept = combination.shape[1]
    width = _block_width(rows.shape[0], rows.shape[1])
    for start in range(0, rows.shape[1], width):
        block = slice(start, start + width)
        rows[:kept, block] = (combination.T @ rows[:, block].to(torch.float64)).to(rows.dtype)


def _norm(x: Any) -> float:
    import torch

    return float(torch.sqrt(_dots(x[None], x)[0]))


def top_eigenpairs(
    hvp: Callable[[Any], Any],
    dimension: int,
    k: int,
    *,
    basis: Any = None,
    tol: float = 1e-6,
    seed: int = 0,
    dtype: Any = None,
    device: str = "cpu",
    max_vectors: int | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> Eigenpairs:
    """Top-``k`` eigenpairs of A = P H P, P = I - B Bᵀ, by Lanczos with full reorthogonalization.

    Parameters
    ----------
    hvp
        ``hvp(v) -> H v`` on flat torch vectors ``[D]``.
    dimension
        D.
    k
        Eigenpairs wanted (largest algebraic eigenvalues).
    basis
        ``[m, D]`` orthonormal torch rows B (None: no restriction), in any
        precision; projections against it are computed in float64.
    tol
        Relative accuracy, ARPACK's criterion: stop once every wanted Ritz pair
        has ||A x - θ x|| <= tol·|θ| (0: the dtype's machine epsilon).
    seed
        Seeds the start vector, so that results are reproducible.
    dtype, device
        Of the torch vectors given to ``hvp``, of the Lanczos vectors kept and
        of the eigenvectors returned (default float32). Dot products and the
        projected matrix are float64 whatever ``dtype`` is.
    max_vectors
        Most Lanczos vectors kept at once (at least k + 2; None: as many as
        :func:`product_limit` allows, so that no restart happens). When they are
        full the search restarts thickly from its best Ritz vectors.
    progress
        Called after every product with its number and the worst relative
        residual of the wanted Ritz pairs so far (inf before k products).

    Returns
    -------
    Eigenpairs
        Values largest first; the residuals ||A x - θ x|| = ||r||·|s_last| of
        the Lanczos relation A V = V T + r e_lastᵀ, which full
        reorthogonalization keeps to working precision.

    Raises
    ------
    AnalysisError
        k is not below the complement's dimension, ``max_vectors`` is below
        k + 2, a product is not finite, or the search did not converge within
        :func:`product_limit` products.

    Notes
    -----
    A single start vector finds one copy of a repeated eigenvalue, as ARPACK's
    does. Memory: :func:`lanczos_bytes` of ``max_vectors`` (the products' own
    precision, 4·D bytes a vector in float32), plus the basis given.
    """
    import torch
    from scipy.linalg import eigh
    from threadpoolctl import threadpool_limits

    dtype = dtype or torch.float32
    restrict = basis is not None and basis.shape[0] > 0
    free = dimension - (basis.shape[0] if restrict else 0)
    if k >= free:
        msg = f"cannot find {k} more eigenvectors in a {free}-dimensional complement (D={dimension})"
        raise AnalysisError(msg)
    limit = product_limit(free, k)
    room = min(limit, free) if max_vectors is None else min(int(max_vectors), free)
    if room < min(k + MIN_VECTORS_BEYOND_K, free):
        msg = (
            f"Lanczos needs room for at least {k + MIN_VECTORS_BEYOND_K} vectors of {dimension:,} parameters "
            f"to find {k} eigenpair(s); the memory budget leaves room for {room}: raise --max-memory or lower -k"
        )
        raise AnalysisError(msg)
    earlier = basis.to(device=device) if restrict else None
    tolerance = tol if tol > 0 else float(torch.finfo(dtype).eps)
    rng = np.random.default_rng(seed)

    def project(v: Any) -> Any:
        if earlier is not None:
            _subtract(v, earlier, _dots(earlier, v))
        return v

    def random_unit(against: Any) -> Any:
        v = torch.empty(dimension, dtype=dtype, device=device)
        step = _block_width(1, dimension)  # drawn by blocks: never a float64 vector of size D
        for start in range(0, dimension, step):
            v[start : start + step] = torch.from_numpy(rng.standard_normal(min(step, dimension - start)))
        for _ in range(2):  # twice is enough (Parlett): orthogonal to working precision
            _subtract(v, against, _dots(against, v))
            project(v)
        return (v.to(torch.float64) / _norm(v)).to(dtype)

    # the kept Lanczos vectors; torch.empty only reserves: pages are touched as rows are written
    vectors = torch.empty(room, dimension, dtype=dtype, device=device)
    projected = np.zeros((room, room))  # T = Vᵀ A V, tridiagonal until a restart makes it arrow-shaped
    vectors[0] = random_unit(vectors[:0])
    used = 1  # rows of `vectors` in use
    restarts = 0
    estimates = theta = top = ritz = None
    # scipy's LAPACK between torch's kernels: OpenBLAS threads left spinning after its calls slowed
    # the products 40x when ARPACK drove them (88 products: 371 s instead of 9 s, bench/polca.py)
    with threadpool_limits(limits=1, user_api="blas"):
        for products in range(1, limit + 1):
            v = vectors[used - 1]
            # v is in the complement already (started there, reorthogonalized against B below):
            # P H P v = P H v, one projection per product instead of two
            r = project(hvp(v).to(dtype).clone())
            coefficients = _dots(vectors[:used], r)
            alpha = float(coefficients[-1])
            _subtract(r, vectors[:used], coefficients)
            # full reorthogonalization, a second pass (Parlett: twice is enough); its corrections are
            # rounding, left out of T as in DGKS
            _subtract(r, vectors[:used], _dots(vectors[:used], r))
            project(r)
            beta = _norm(r)
            if not (np.isfinite(alpha) and np.isfinite(beta)):
                msg = (
                    f"Hessian-vector product {products} is not finite (NaN or inf): the loss or its curvature "
                    "overflows at these parameters; try --dtype float64, or leave this checkpoint out"
                )
                raise AnalysisError(msg)
            projected[used - 1, used - 1] = alpha
            theta, ritz = eigh(projected[:used, :used])
            scale = float(np.max(np.abs(theta))) or 1.0
            invariant = beta <= 1e3 * float(torch.finfo(torch.float64).eps) * scale
            top = np.argsort(theta)[::-1][:k]
            estimates = np.abs(beta * ritz[-1, top])  # ||A x - θ x|| of each Ritz pair (A V = V T + r e_lastᵀ)
            worst = float(np.max(estimates / np.maximum(np.abs(theta[top]), 1e-300))) if used >= k else np.inf
            if progress is not None:
                progress(products, worst)
            if used >= k and (invariant or used == free or worst <= tolerance):
                break
            # the next vector: the residual's direction, or (an invariant subspace smaller than k)
            # a new direction orthogonal to it, coupled to nothing
            coupling = 0.0 if invariant else beta
            following = random_unit(vectors[:used]) if invariant else (r.to(torch.float64) / beta).to(dtype)
            if used < room:
                projected[used, used - 1] = projected[used - 1, used] = coupling
                vectors[used] = following
                used += 1
                continue
            # thick restart: A (V S) = (V S) Θ + r (e_lastᵀ S) keeps the best Ritz pairs exactly; the rest
            # of the room lets the recurrence grow again from the residual
            keep = max(k, min(room - 1, (room + k) // 2))  # at least one slot free to grow into
            order = np.argsort(theta)[::-1][:keep]
            _combine_in_place(vectors, torch.as_tensor(ritz[:, order].copy(), device=device))
            projected[:] = 0.0
            projected[np.arange(keep), np.arange(keep)] = theta[order]
            projected[keep, :keep] = projected[:keep, keep] = coupling * ritz[-1, order]
            vectors[keep] = following
            used = keep + 1
            restarts += 1
        else:
            msg = (
                f"Lanczos did not converge to tol {tol} in {limit} Hessian-vector products "
                f"(relative residual {worst:.1e}); raise --tol"
            )
            raise AnalysisError(msg)

    values = theta[top]
    combination = torch.as_tensor(ritz[:, top].T.copy(), device=device)  # [k, used]
    found = torch.empty(k, dimension, dtype=dtype, device=device)
    width = _block_width(used, dimension)
    for start in range(0, dimension, width):
        block = slice(start, start + width)
        found[:, block] = (combination @ vectors[:used, block].to(torch.float64)).to(dtype)
    del vectors
    return Eigenpairs(values, found.cpu().numpy(), estimates.astype(np.float64), products, restarts)

"""Top eigenpairs of a matrix-free symmetric operator restricted to a basis' complement (Lanczos).

:func:`top_eigenpairs` finds the largest algebraic eigenpairs of P H P,
P = I - B Bᵀ, from Hessian-vector products alone: the Hessian-basis
analyzer's search at each basis checkpoint (Hidden Breakthroughs, Algorithm 1).

Why a Lanczos of our own rather than scipy's ``eigsh`` (ARPACK), which ckpt
used before: the products are almost all of the time, and ARPACK spends more of
them than the method needs. It tests convergence only once its ``ncv`` vectors
are full and again after each implicit restart, and its residuals cost one more
product per eigenvector. Here every step tests convergence on the tridiagonal
matrix (free), and the products are kept, so the eigenvectors' residuals follow
by linearity without new products. Top 4 eigenpairs of the addition default
model at tol 1e-6 (256 problems, float32): ARPACK 26 products + 4 for the
residuals, this 26 in all; at tol 1e-7, 35 + 4 against 28; the eigenvalues agree
to 1e-8 (bench/polca.py). Torch has no matrix-free Lanczos (``torch.lobpcg`` takes
the matrix itself), and the vectors stay on the worker's device here, where
ARPACK's lived on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError


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


def product_limit(free: int, k: int) -> int:
    """Most products one search may make: every one is kept with its Lanczos vector."""
    return min(free, max(100, 20 * k))


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
        ``[m, D]`` orthonormal torch rows B (None: no restriction).
    tol
        Relative accuracy, ARPACK's criterion: stop once every wanted Ritz pair
        has ||A x - θ x|| <= tol·|θ| (0: the dtype's machine epsilon).
    seed
        Seeds the start vector, so that results are reproducible.
    dtype, device
        Of the torch vectors given to ``hvp`` and of the eigenvectors returned
        (default float32); the Lanczos recurrence itself runs in float64.

    Returns
    -------
    Eigenpairs
        Values largest first; the residuals ||A x - θ x|| are those of the
        float64 vectors x before they are rounded to ``dtype``, with
        A x = Σ s_j (A v_j) from the kept products (A is linear).

    Raises
    ------
    AnalysisError
        k is not below the complement's dimension, a product is not finite,
        or the search did not converge within :func:`product_limit` products.

    Notes
    -----
    A single start vector finds one copy of a repeated eigenvalue, as ARPACK's
    does. Memory: per product, a float64 Lanczos vector and the product in
    ``dtype`` (12·D bytes for float32).
    """
    import torch
    from scipy.linalg import eigh_tridiagonal
    from threadpoolctl import threadpool_limits

    dtype = dtype or torch.float32
    restrict = basis is not None and basis.shape[0] > 0
    free = dimension - (basis.shape[0] if restrict else 0)
    if k >= free:
        msg = f"cannot find {k} more eigenvectors in a {free}-dimensional complement (D={dimension})"
        raise AnalysisError(msg)
    # the recurrence runs in float64 whatever the products' precision: with float32 vectors its
    # dot products over D = 102,348 lost 5 digits (top eigenvalue off by 5e-6, residuals 1e-3
    # times larger); the products are kept in their own precision, which loses nothing
    exact = torch.float64
    earlier = basis.to(device=device, dtype=exact) if restrict else None
    tolerance = tol if tol > 0 else float(torch.finfo(dtype).eps)
    limit = product_limit(free, k)
    rng = np.random.default_rng(seed)

    def project(v: Any) -> Any:
        return v if earlier is None else v - earlier.T @ (earlier @ v)

    def random_unit(against: Any) -> Any:
        v = torch.from_numpy(rng.standard_normal(dimension)).to(device=device)
        for _ in range(2):  # twice is enough (Parlett): orthogonal to working precision
            v = project(v - against.T @ (against @ v))
        return v / torch.linalg.vector_norm(v)

    # Lanczos vectors v_j and their products A v_j (kept for the residuals), grown as needed:
    # a paper-size model has D = 9.5M, where room for every allowed product would take gigabytes
    vectors = torch.empty(min(limit, 2 * k + 8) + 1, dimension, dtype=exact, device=device)
    products = torch.empty(len(vectors), dimension, dtype=dtype, device=device)
    vectors[0] = random_unit(vectors[:0])
    alphas: list[float] = []
    betas: list[float] = []
    # scipy's LAPACK between torch's kernels: OpenBLAS threads left spinning after its calls slowed
    # the products 40x when ARPACK drove them (88 products: 371 s instead of 9 s, bench/polca.py)
    with threadpool_limits(limits=1, user_api="blas"):
        for m in range(1, limit + 1):
            if m == len(vectors):
                vectors, products = (
                    torch.cat([t, torch.empty_like(t[: min(m, limit + 1 - m)])]) for t in (vectors, products)
                )
            v = vectors[m - 1]
            # v is in the complement already (started there, reorthogonalized against B below):
            # P H P v = P H v, one projection per product instead of two
            product = project(hvp(v.to(dtype)).to(exact))
            products[m - 1] = product
            alpha = float(v @ product)
            r = product - alpha * v - (betas[-1] * vectors[m - 2] if m > 1 else 0)
            for _ in range(2):  # full reorthogonalization: no spurious copies of converged values
                r = project(r - vectors[:m].T @ (vectors[:m] @ r))
            alphas.append(alpha)
            beta = float(torch.linalg.vector_norm(r))
            if not (np.isfinite(alpha) and np.isfinite(beta)):
                msg = (
                    f"Hessian-vector product {m} is not finite (NaN or inf): the loss or its curvature "
                    "overflows at these parameters; try --dtype float64, or leave this checkpoint out"
                )
                raise AnalysisError(msg)
            scale = max(abs(a) for a in alphas) or 1.0
            invariant = beta <= 1e3 * float(torch.finfo(exact).eps) * scale
            if m >= k:
                theta, ritz = eigh_tridiagonal(np.array(alphas), np.array(betas))
                top = np.argsort(theta)[::-1][:k]
                estimates = np.abs(beta * ritz[-1, top])  # ||A x - θ x|| of each Ritz pair
                if invariant or m == free or np.all(estimates <= tolerance * np.abs(theta[top])):
                    break
            betas.append(0.0 if invariant else beta)
            # an invariant subspace smaller than k: go on from a new direction, orthogonal to it
            vectors[m] = random_unit(vectors[:m]) if invariant else r / beta
        else:
            worst = float(np.max(estimates / np.maximum(np.abs(theta[top]), 1e-300)))
            msg = (
                f"Lanczos did not converge to tol {tol} in {limit} Hessian-vector products "
                f"(relative residual {worst:.1e}); raise --tol"
            )
            raise AnalysisError(msg)

    values = theta[top]
    combination = torch.as_tensor(ritz[:, top].T.copy(), device=device)  # [k, m]
    found, found_products = combination @ vectors[:m], combination @ products[:m].to(exact)
    # exact orthogonality to the earlier basis and among themselves; A P = A, so the
    # products stay those of the projected vectors; QR's triangle is applied to both
    found = project(found.T).T
    q, r = torch.linalg.qr(found.T)
    signs = torch.sign(r.diagonal())  # signs kept: QR must not flip a vector
    q, r = q * signs, r * signs[:, None]
    found, found_products = q.T, torch.linalg.solve_triangular(r.T, found_products, upper=False)  # A Q = A X R⁻¹
    residuals = torch.linalg.vector_norm(
        found_products - torch.as_tensor(values, device=device)[:, None] * found, dim=1
    )
    return Eigenpairs(values, found.to(dtype).cpu().numpy(), residuals.cpu().numpy(), m)

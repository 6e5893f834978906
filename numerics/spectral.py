"""Trace and spectral density of a matrix-free symmetric operator, from products alone.

Three randomized estimators over a flat ``hvp(v) -> H v`` (``[D]`` torch vectors):

- :func:`hutchinson`: tr(H) ≈ (1/m) Σ zᵀ H z over m Rademacher probes z (Hutchinson 1990);
- :func:`hutchpp`: Hutch++ (Meyer, Musco, Musco & Woodruff 2021, Algorithm 1): the trace of the
  top of the spectrum exactly, from a sketch Q = orth(H S), and Hutchinson on what is left,
  (I - QQᵀ) H (I - QQᵀ); its error falls as 1/m rather than 1/√m where the spectrum decays;
- :func:`slq`: stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017; Ghorbani, Krishnan & Xiao
  2019): the spectral density (1/D) Σ_i δ(λ - λ_i) ≈ Σ_runs Σ_j τ_j δ(λ - θ_j), with θ_j the
  Ritz values of m Lanczos steps from a Rademacher start and τ_j = (e1ᵀ u_j)² their Gauss weights.

Both trace estimators also give the trace of every diagonal block of H over the same probes: with
z_m the part of a probe on a set of coordinates m, E[z_mᵀ (H z)_m] = tr(H_mm). They take the
``segments`` (contiguous coordinate ranges, one per tensor) that partition [0, D) and return a
per-probe estimate for each, which :meth:`TraceEstimate.block` sums over the segments of a block.

Vectors of D kept: Hutchinson two, Hutch++ its sketch (m/3) and two more, SLQ its m Lanczos vectors
and two more (:func:`ckpt.numerics.lanczos_sizes.lanczos_bytes`), in memory or spilled to a file on
the CPU (:class:`ckpt.numerics.vector_rows.SpilledRows`); dot products run in float64 over bounded
column blocks, as :mod:`ckpt.numerics.lanczos` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError
from ckpt.numerics.lanczos_sizes import accelerator_block_width
from ckpt.numerics.vector_rows import MemoryRows, SpilledRows

METHODS = ("hutchinson", "hutch++")
"""Trace estimators (``--method``)."""


@dataclass
class TraceEstimate:
    """A trace estimate with its per-segment parts (numpy)."""

    method: str
    """``hutchinson`` or ``hutch++``."""
    exact: np.ndarray
    """``[segments]`` the deterministic part on each segment (Hutch++'s sketch; zeros for Hutchinson)."""
    samples: np.ndarray
    """``[probes, segments]`` each Hutchinson probe's estimate on each segment (of H, or of Hutch++'s
    deflated (I - QQᵀ) H (I - QQᵀ)); no rows when Hutch++'s sketch spans the whole space."""
    products: int
    """Products used."""
    rank: int = 0
    """Columns of Hutch++'s sketch Q kept (rank-deficient columns dropped)."""

    def block(self, segments: Sequence[int] | None = None) -> tuple[float, float]:
        """``(trace, standard error)`` of the diagonal block made of ``segments`` (None: all, tr(H)).

        The standard error is the probes' sample standard deviation (ddof 1) over √probes (NaN with
        one probe; 0 when no probe was needed).
        """
        columns = slice(None) if segments is None else list(segments)
        exact = float(self.exact[columns].sum())
        per_probe = self.samples[:, columns].sum(axis=1)
        if len(per_probe) == 0:
            return exact, 0.0
        stderr = float(per_probe.std(ddof=1) / np.sqrt(len(per_probe))) if len(per_probe) > 1 else float("nan")
        return exact + float(per_probe.mean()), stderr


@dataclass
class Quadrature:
    """Stochastic Lanczos quadrature nodes (numpy)."""

    values: np.ndarray
    """``[runs, steps]`` Ritz values θ, ascending per run; NaN past a run's breakdown."""
    weights: np.ndarray
    """``[runs, steps]`` τ / runs, so that all of them sum to 1; 0 past a run's breakdown."""
    products: int
    """Products used."""


def rademacher(dimension: int, generator: Any, dtype: Any, device: Any) -> Any:
    """A ``[D]`` vector of independent ±1 (``generator``: a torch.Generator on ``device``)."""
    import torch

    return torch.randint(0, 2, (dimension,), generator=generator, dtype=dtype, device=device).mul_(2).sub_(1)


def _generator(seed: int, device: Any) -> Any:
    import torch

    return torch.Generator(device=device).manual_seed(int(seed))


def _check_segments(segments: Sequence[slice] | None, dimension: int) -> list[slice]:
    if segments is None:
        return [slice(0, dimension)]
    out = list(segments)
    stops = [0, *(s.stop for s in out)]
    if [s.start for s in out] != stops[:-1] or stops[-1] != dimension:
        msg = f"segments must partition [0, {dimension}) in order"
        raise ValueError(msg)
    return out


def _segment_dots(a: Any, b: Any, segments: Sequence[slice]) -> np.ndarray:
    """``[a[s] · b[s] for s in segments]`` in float64, one synchronisation for all."""
    import torch

    dots = torch.stack([torch.dot(a[s], b[s]).double() for s in segments])
    return dots.cpu().numpy()


def _finite(vector: Any, what: str) -> None:
    import torch

    if not bool(torch.isfinite(vector).all()):
        msg = f"a Hessian-vector product is not finite ({what}); try --dtype float64 or check the checkpoint"
        raise AnalysisError(msg)


def _columns(dimension: int, count: int) -> list[slice]:
    """Column blocks of ``count`` rows whose float64 copy stays bounded whatever D is."""
    width = accelerator_block_width(count, dimension)
    return [slice(start, min(start + width, dimension)) for start in range(0, dimension, width)]


def _dots(rows: Any, count: int, x: Any) -> Any:
    """``rows[:count] @ x`` in float64, block of columns by block."""
    import torch

    out = torch.zeros(count, dtype=torch.float64, device=x.device)
    for columns in _columns(x.shape[0], count) if count else ():
        out += rows.block(count, columns).double() @ x[columns].double()
    return out


def _norm(x: Any) -> float:
    import torch

    square = torch.zeros((), dtype=torch.float64, device=x.device)
    for columns in _columns(x.shape[0], 1):
        part = x[columns].double()
        square += part @ part
    return float(square) ** 0.5


def _subtract(x: Any, rows: Any, count: int, coefficients: Any) -> None:
    """``x -= rows[:count]ᵀ coefficients`` in float64, block of columns by block, in place."""
    for columns in _columns(x.shape[0], count) if count else ():
        x[columns] = x[columns].double() - rows.block(count, columns).double().T @ coefficients


def _orthogonalize(x: Any, rows: Any, count: int, source: Any) -> tuple[Any, float]:
    """``x = source`` less its components along ``rows[:count]`` (unit rows), by classical Gram-Schmidt twice.

    Twice is enough (Parlett): orthogonal to working precision. Returns the first pass's coefficients and
    ||x|| after. Why not :mod:`ckpt.numerics.lanczos`' selective passes: its helpers are private to it, and
    with the few tens of vectors here the second pass costs little beside a product.
    """
    rows.wait()  # a spilled row may still be being written from x
    x.copy_(source)
    first = _dots(rows, count, x)
    _subtract(x, rows, count, first)
    _subtract(x, rows, count, _dots(rows, count, x))
    return first, _norm(x)


def hutchinson(
    hvp: Callable[[Any], Any],
    dimension: int,
    probes: int,
    *,
    segments: Sequence[slice] | None = None,
    seed: int = 0,
    dtype: Any = None,
    device: Any = "cpu",
) -> TraceEstimate:
    """tr(H) from ``probes`` Rademacher probes: the mean of zᵀ H z, per segment.

    Parameters
    ----------
    hvp
        ``hvp(v) -> H v`` on flat ``[D]`` torch vectors (it may return the same buffer each call).
    dimension
        D.
    probes
        Products (one per probe).
    segments
        Contiguous ranges that partition [0, D) (default: one, the whole).
    seed, dtype, device
        The probes' seed (a torch generator on ``device``), precision and device.

    Raises
    ------
    AnalysisError
        When a product is not finite.
    """
    import torch

    dtype = dtype or torch.float32
    parts = _check_segments(segments, dimension)
    generator = _generator(seed, device)
    samples = np.empty((probes, len(parts)))
    for index in range(probes):
        z = rademacher(dimension, generator, dtype, device)
        y = hvp(z)
        _finite(y, f"probe {index + 1} of {probes}")
        samples[index] = _segment_dots(z, y, parts)
    return TraceEstimate("hutchinson", np.zeros(len(parts)), samples, probes)


def _rows(capacity: int, dimension: int, dtype: Any, device: Any, spill: bool) -> MemoryRows | SpilledRows:
    if spill and str(device) != "cpu":
        msg = f"vectors are spilled to a file only on the CPU, not on {device}: raise --max-memory"
        raise AnalysisError(msg)
    return SpilledRows(capacity, dimension, dtype) if spill else MemoryRows(capacity, dimension, dtype, str(device))


def hutchpp(
    hvp: Callable[[Any], Any],
    dimension: int,
    probes: int,
    *,
    segments: Sequence[slice] | None = None,
    seed: int = 0,
    dtype: Any = None,
    device: Any = "cpu",
    spill: bool = False,
) -> TraceEstimate:
    """Hutch++ with ``probes`` products (Meyer et al. 2021, Algorithm 1), per segment.

    k = ``probes // 3`` (at most D) sketch products H s give Q = orth(H S) (Gram-Schmidt twice, a
    column whose norm falls to rounding dropped); k more give tr(Qᵀ H Q) exactly; the remaining
    ``probes - 2k`` are Hutchinson probes g of (I - QQᵀ) H (I - QQᵀ). Per segment m, from
    H = QQᵀH + (I - QQᵀ) H QQᵀ + (I - QQᵀ) H (I - QQᵀ) (H symmetric):
    tr_m(H) = Σ_j Σ_{i∈m} q_ji (2 (H q_j)_i - (Q Qᵀ H q_j)_i) + E[g_mᵀ ((I - QQᵀ) H (I - QQᵀ) g)_m].
    Once k = D, Q spans the space and the trace is exact: 2D products, no probe.

    Parameters are those of :func:`hutchinson`; ``spill`` keeps Q in a temporary file (CPU only).
    ``probes`` must be at least 3.

    Raises
    ------
    AnalysisError
        When a product is not finite.
    """
    import torch

    dtype = dtype or torch.float32
    if probes < 3:
        msg = f"Hutch++ needs at least 3 products (a sketch, its products, a probe), not {probes}"
        raise ValueError(msg)
    parts = _check_segments(segments, dimension)
    generator = _generator(seed, device)
    k = min(probes // 3, dimension)
    eps = float(torch.finfo(dtype).eps)
    q = _rows(k, dimension, dtype, device, spill)
    x = torch.empty(dimension, dtype=dtype, device=device)
    rank = 0
    try:
        for index in range(k):
            y = hvp(rademacher(dimension, generator, dtype, device))
            _finite(y, f"sketch product {index + 1} of {k}")
            before = _norm(y)
            _, norm = _orthogonalize(x, q, rank, y)
            if norm > 100 * eps * before and norm > 0:  # else H s lies in span(Q) already: nothing new
                q.write(rank, x.div_(norm))
                rank += 1
        exact = np.zeros(len(parts))
        qj = torch.empty(dimension, dtype=dtype, device=device)
        for j in range(rank):
            qj.copy_(q.block(1, slice(0, dimension), j)[0])
            y = hvp(qj)
            _finite(y, f"product {j + 1} of the sketch's {rank}")
            # x = 2 H q_j - Q Qᵀ H q_j; its dots with q_j over a segment are tr_m(QQᵀH) + tr_m((I-QQᵀ)HQQᵀ)'s part
            x.copy_(y)
            _subtract(x, q, rank, _dots(q, rank, y))
            x.add_(y)
            exact += _segment_dots(qj, x, parts)
        products = k + rank
        residual = 0 if k == dimension else probes - 2 * k
        samples = np.empty((residual, len(parts)))
        for index in range(residual):
            g = rademacher(dimension, generator, dtype, device)
            _orthogonalize(x, q, rank, g)
            y = hvp(x)
            _finite(y, f"probe {index + 1} of {residual}")
            _orthogonalize(x, q, rank, y)
            samples[index] = _segment_dots(g, x, parts)
        return TraceEstimate("hutch++", exact, samples, products + residual, rank)
    finally:
        q.close()


def slq(
    hvp: Callable[[Any], Any],
    dimension: int,
    runs: int,
    steps: int,
    *,
    seed: int = 0,
    dtype: Any = None,
    device: Any = "cpu",
    spill: bool = False,
) -> Quadrature:
    """Stochastic Lanczos quadrature: ``runs`` Lanczos runs of ``steps`` steps from Rademacher starts.

    Each run starts from v = z/√D and orthogonalizes every product against all its Lanczos vectors
    (classical Gram-Schmidt, twice: full reorthogonalization, so that no ghost copies of converged
    Ritz values distort the weights). The tridiagonal T's eigenpairs (θ_j, u_j)
    (``scipy.linalg.eigh_tridiagonal``) give the Gauss quadrature of the run's spectral measure:
    Σ_j τ_j θ_j^p = vᵀ H^p v for every p <= 2·steps - 1, τ_j = (e1ᵀ u_j)² (Golub & Meurant;
    Ubaru et al. 2017, eq. 3.3), whose expectation over z is tr(H^p)/D. A run stops early where the
    Krylov space is invariant (β below 100 ε times the largest |α|, β so far): its remaining nodes
    are NaN with weight 0. ``steps`` above D are D.

    Parameters are those of :func:`hutchinson`; ``spill`` keeps the Lanczos vectors in a temporary
    file (CPU only).

    Raises
    ------
    AnalysisError
        When a product is not finite.
    """
    import torch
    from scipy.linalg import eigh_tridiagonal

    dtype = dtype or torch.float32
    steps = min(steps, dimension)
    generator = _generator(seed, device)
    eps = float(torch.finfo(dtype).eps)
    values = np.full((runs, steps), np.nan)
    weights = np.zeros((runs, steps))
    products = 0
    if runs == 0:
        return Quadrature(values, weights, products)
    rows = _rows(steps, dimension, dtype, device, spill)
    v = torch.empty(dimension, dtype=dtype, device=device)
    try:
        for run in range(runs):
            v.copy_(rademacher(dimension, generator, dtype, device)).div_(float(np.sqrt(dimension)))
            rows.write(0, v)
            alpha, beta = np.zeros(steps), np.zeros(steps)
            nodes = steps
            for j in range(steps):
                w = hvp(v)
                products += 1
                _finite(w, f"Lanczos step {j + 1} of run {run + 1}")
                coefficients, beta[j] = _orthogonalize(v, rows, j + 1, w)
                alpha[j] = float(coefficients[j])
                scale = max(float(np.abs(alpha[: j + 1]).max()), float(beta[:j].max(initial=0.0)))
                if j == steps - 1:
                    break
                if beta[j] <= 100 * eps * scale:  # an invariant Krylov space: T's nodes are exact
                    nodes = j + 1
                    break
                rows.write(j + 1, v.div_(beta[j]))
            theta, u = eigh_tridiagonal(alpha[:nodes], beta[: nodes - 1])
            values[run, :nodes] = theta
            weights[run, :nodes] = u[0] ** 2 / runs
    finally:
        rows.close()
    return Quadrature(values, weights, products)


__all__ = ["METHODS", "Quadrature", "TraceEstimate", "hutchinson", "hutchpp", "rademacher", "slq"]

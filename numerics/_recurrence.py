"""The small side of a Lanczos search: the projected matrix T and the overlaps Ω of its vectors.

Simon's ω recurrence estimates how far rounding has taken the next Lanczos vector from the
kept ones (:func:`next_overlaps`, against the vectors T couples it to: :func:`first_coupled`),
so that :func:`ckpt.numerics.lanczos.top_eigenpairs` reorthogonalizes against all of them only
when needed; :func:`restart_recurrence` is T and Ω after a thick restart. Numpy on
``[room, room]`` matrices: nothing here is of size D.
"""

from __future__ import annotations

import numpy as np


def first_coupled(projected: np.ndarray, used: int) -> int:
    """The first kept vector that T couples the newest one (row ``used - 1``) to; that one itself when none."""
    coupled = np.flatnonzero(projected[: used - 1, used - 1])
    return int(coupled[0]) if coupled.size else used - 1


def next_overlaps(
    projected: np.ndarray, overlaps: np.ndarray, first: int, beta: float, noise: float, eps: float
) -> np.ndarray:
    """Estimated overlaps of the next Lanczos vector with the kept ones (Simon's ω recurrence, any T).

    With A V = V T + β q eᵀ and A symmetric, q's overlaps with the kept vectors satisfy
    β Vᵀq = (T Ω - Ω T) e_last + rounding, where Ω = VᵀV: the three-term ω recurrence of
    partial reorthogonalization (Simon 1984) when T is tridiagonal, and the same relation for
    the arrow T a thick restart leaves. ``noise`` bounds the rounding a product adds (ε||A||, or
    the product's own asymmetry measured against T when larger), given each estimate's sign so
    that it only grows. The vectors the residual was just orthogonalized against (``first`` on)
    are at ``eps``.
    """
    last = projected.shape[0] - 1
    commutator = projected @ overlaps[:, last] - overlaps @ projected[:, last]
    estimate = (commutator + np.copysign(noise, commutator)) / max(beta, 1e-300)
    estimate[first:] = eps
    return estimate


def restart_recurrence(
    projected: np.ndarray,
    overlaps: np.ndarray,
    theta: np.ndarray,
    ritz: np.ndarray,
    order: np.ndarray,
    overlap: np.ndarray,
    *,
    used: int,
    coupling: float,
) -> None:
    """T and Ω, in place, after a thick restart that keeps the Ritz vectors ``order`` of ``used`` vectors.

    A (V S) = (V S) Θ + r (e_lastᵀ S) keeps the best Ritz pairs exactly: T becomes the arrow of
    their values, coupled to the next vector by ``coupling`` times the last row of S. The kept
    Ritz vectors' overlaps follow from the Lanczos vectors' (Sᵀ Ω S, unit diagonal), the next
    vector's from its estimated ``overlap`` with the Lanczos vectors.
    """
    keep = len(order)
    projected[:] = 0.0
    projected[np.arange(keep), np.arange(keep)] = theta[order]
    projected[keep, :keep] = projected[:keep, keep] = coupling * ritz[-1, order]
    kept = ritz[:, order]
    restarted = kept.T @ overlaps[:used, :used] @ kept
    np.fill_diagonal(restarted, 1.0)
    overlaps[:] = 0.0
    overlaps[:keep, :keep] = restarted
    overlaps[keep, :keep] = overlaps[:keep, keep] = kept.T @ overlap
    overlaps[keep, keep] = 1.0

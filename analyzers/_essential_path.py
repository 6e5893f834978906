"""The path of ``essential-dynamics`` in plain numpy: PCA from a Gram matrix, smoothing, turns, stages.

See :mod:`ckpt.analyzers.essential_dynamics` for the method (Hoogland et al. 2024, as devinterp
implements it) and the definitions these functions follow.
"""

from __future__ import annotations

import math

import numpy as np

from ckpt.errors import AnalysisError

MIN_SPEED = 0.02
"""A turn is measured only where both displacements are at least this fraction of the path's largest."""

EXTREMUM_PROMINENCE = 0.05
"""A component's extremum is marked when it stands out by this fraction of the component's range."""


def pca_from_gram(gram: np.ndarray, components: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Principal-component scores and variances of centred rows F_c from their Gram matrix F_c F_cᵀ.

    Parameters
    ----------
    gram
        ``[T, T]`` symmetric positive semi-definite: G = F_c F_cᵀ.
    components
        How many leading components.

    Returns
    -------
    scores : numpy.ndarray
        ``[T, components]``: F_c V = U Λ^½ (the rows projected on the principal axes). Each
        column's sign makes its largest entry in absolute value positive (scikit-learn's
        ``svd_flip`` on U).
    ratio : numpy.ndarray
        ``[components]``: λ_k / tr G, the explained variance ratio.
    variance : numpy.ndarray
        ``[components]``: λ_k / (T - 1), the explained variance (scikit-learn's ``explained_variance_``).

    Raises
    ------
    AnalysisError
        When G is not finite, or is zero (every row equal: no dynamics to decompose).
    """
    gram = np.asarray(gram, dtype=np.float64)
    if not np.isfinite(gram).all():
        raise AnalysisError("the Gram matrix of the outputs is not finite: an output overflowed float64")
    total = float(np.trace(gram))
    if total <= 0:
        msg = "the outputs are the same at every checkpoint: there is no path to decompose"
        raise AnalysisError(msg)
    values, vectors = np.linalg.eigh((gram + gram.T) / 2)
    order = np.argsort(values)[::-1][:components]
    values = np.clip(values[order], 0.0, None)  # rounding leaves tiny negative eigenvalues of a PSD matrix
    vectors = vectors[:, order]
    largest = np.argmax(np.abs(vectors), axis=0)
    vectors = vectors * np.sign(vectors[largest, np.arange(vectors.shape[1])])
    scores = vectors * np.sqrt(values)
    return scores, values / total, values / max(1, gram.shape[0] - 1)


def smoothed(path: np.ndarray, sigma: float) -> np.ndarray:
    """Each column of ``path`` ``[T, k]`` smoothed over rows by a Gaussian of ``sigma`` rows (0: unchanged)."""
    path = np.asarray(path, dtype=np.float64)
    if sigma <= 0:
        return path.copy()
    from scipy.ndimage import gaussian_filter1d

    return gaussian_filter1d(path, sigma, axis=0, mode="nearest")


def window_of(sigma: float) -> int:
    """Checkpoints on each side of a turning angle: max(1, round(2σ))."""
    return max(1, math.floor(2 * sigma + 0.5))


def turning_angles(path: np.ndarray, window: int) -> np.ndarray:
    """The angle (degrees) between p_t - p_(t-w) and p_(t+w) - p_t at each row t; NaN where undefined.

    Undefined within ``window`` rows of either end, and where either displacement is shorter than
    :data:`MIN_SPEED` of the longest displacement over ``window`` rows on the path.
    """
    path = np.asarray(path, dtype=np.float64)
    count = len(path)
    angles = np.full(count, np.nan)
    if count < 2 * window + 1:
        return angles
    steps = path[window:] - path[:-window]  # steps[i] = p_(i+w) - p_i
    lengths = np.linalg.norm(steps, axis=1)
    floor = MIN_SPEED * float(lengths.max())
    if floor <= 0:
        return angles
    before, after = steps[:-window], steps[window:]  # at t = w .. T-1-w: p_t - p_(t-w) and p_(t+w) - p_t
    low = np.minimum(lengths[:-window], lengths[window:])
    cosine = np.einsum("ij,ij->i", before, after) / np.maximum(lengths[:-window] * lengths[window:], 1e-300)
    inner = np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))
    angles[window : count - window] = np.where(low >= floor, inner, np.nan)
    return angles


def turning_points(angles: np.ndarray, window: int, min_angle: float) -> np.ndarray:
    """Rows whose angle is at least ``min_angle`` and the largest within ±``window`` rows (first on ties)."""
    angles = np.asarray(angles, dtype=np.float64)
    found = np.zeros(len(angles), dtype=bool)
    valued = np.where(np.isfinite(angles), angles, -np.inf)
    for t in np.flatnonzero(valued >= min_angle):
        near = valued[max(0, t - window) : t + window + 1]
        first = int(np.argmax(near)) + max(0, t - window)
        found[t] = first == t
    return found


def stages(turning: np.ndarray) -> np.ndarray:
    """Stage of each row: the turning points at or before it (a turning point opens the next stage)."""
    return np.cumsum(np.asarray(turning, dtype=np.int64))


def extrema(path: np.ndarray, prominence: float = EXTREMUM_PROMINENCE) -> np.ndarray:
    """``[T, k]`` bool: each column's local maxima and minima (where its derivative changes sign).

    Only those standing out by at least ``prominence`` times the column's range (scipy's
    ``find_peaks`` prominence): the wiggles of a path at rest are not marked.
    """
    from scipy.signal import find_peaks

    path = np.asarray(path, dtype=np.float64)
    found = np.zeros(path.shape, dtype=bool)
    for k in range(path.shape[1]):
        column = path[:, k]
        span = float(np.ptp(column)) if len(column) else 0.0
        if span <= 0:
            continue
        for signed in (column, -column):
            peaks, _ = find_peaks(signed, prominence=prominence * span)
            found[peaks, k] = True
    return found


def llc_boundaries(
    steps: np.ndarray, llc: np.ndarray, sigma: float = 1.0, tolerance: float = 0.05, min_change: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    """Plateaus of a local learning coefficient curve λ̂(t), and the stage boundaries they mark.

    The paper's stages lie between critical points of λ̂(t): where dλ̂/dt ≈ 0 after a growth (or
    shrinking) phase. λ̂ is smoothed by a Gaussian of ``sigma`` checkpoints; a checkpoint is on a
    plateau where the magnitude of its slope per checkpoint (``numpy.gradient``) is below
    ``tolerance`` times the largest. A stretch between plateaus whose smoothed λ̂ changes by less
    than ``min_change`` times λ̂'s whole range is estimator noise, not a phase: it joins the
    plateau. Each plateau that follows a phase is one boundary, at its first checkpoint.

    Returns
    -------
    plateau : numpy.ndarray
        ``[T]`` bool.
    boundary : numpy.ndarray
        ``[T]`` bool.
    """
    values = np.asarray(llc, dtype=np.float64)
    count = len(values)
    plateau = np.zeros(count, dtype=bool)
    boundary = np.zeros(count, dtype=bool)
    if count < 3 or not np.isfinite(values).all() or len(steps) != count:
        return plateau, boundary
    curve = smoothed(values[:, None], sigma)[:, 0]
    slope = np.abs(np.gradient(curve))
    span = float(np.ptp(curve))
    if slope.max() <= 0 or span <= 0:
        return plateau, boundary
    plateau = slope < tolerance * slope.max()
    for start, stop in _runs(~plateau):  # a phase that hardly moves λ̂ is noise on the plateau
        if np.ptp(curve[max(0, start - 1) : stop + 1]) < min_change * span:
            plateau[start:stop] = True
    for start, _ in _runs(plateau):
        boundary[start] = start > 0
    return plateau, boundary


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, stop) of each run of True in ``mask``."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


__all__ = [
    "EXTREMUM_PROMINENCE",
    "MIN_SPEED",
    "extrema",
    "llc_boundaries",
    "pca_from_gram",
    "smoothed",
    "stages",
    "turning_angles",
    "turning_points",
    "window_of",
]

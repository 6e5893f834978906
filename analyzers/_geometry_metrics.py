"""The pure metrics of ``embedding-geometry``, on numpy arrays: circles, pair sums, grids, clusters.

Defined in :mod:`ckpt.analyzers.embedding_geometry`'s docstring (circularity, radial
variation, pair-sum shares, silhouettes and neighbours, grid imperfection, single-linkage
cluster counts); the analyzer computes them per checkpoint. No store, no torch.
"""

from __future__ import annotations

import math

import numpy as np


def fourier_spectrum(embedding: np.ndarray) -> np.ndarray:
    """Share of the centred embeddings' power at each frequency ``k = 1 .. N//2`` over the token index.

    Parameters
    ----------
    embedding
        ``[N, d]`` embedding rows, in token order.

    Returns
    -------
    np.ndarray
        ``[N//2]`` float64 shares summing to 1 (NaN when the rows are all equal).
    """
    centred = np.asarray(embedding, dtype=np.float64)
    centred = centred - centred.mean(0)
    n = len(centred)
    power = (np.abs(np.fft.fft(centred, axis=0)) ** 2).sum(1)
    shares = np.array([power[k] + (power[n - k] if 2 * k != n else 0.0) for k in range(1, n // 2 + 1)])
    total = power[1:].sum()
    return shares / total if total > 0 else np.full(len(shares), np.nan)


def circularity(embedding: np.ndarray) -> tuple[float, int]:
    """Largest share of variance held by one Fourier frequency, and that frequency (1-based).

    Parameters
    ----------
    embedding
        ``[N, d]`` embedding rows.

    Returns
    -------
    tuple[float, int]
        ``(share, frequency)``; ``(nan, 0)`` when the rows are all equal.
    """
    spectrum = fourier_spectrum(embedding)
    if not len(spectrum) or not np.isfinite(spectrum).all():
        return math.nan, 0
    best = int(np.argmax(spectrum))
    return float(spectrum[best]), best + 1


def radial_cv(embedding: np.ndarray) -> float:
    """Coefficient of variation (population std / mean) of the distances of the rows to their mean."""
    rows = np.asarray(embedding, dtype=np.float64)
    radii = np.linalg.norm(rows - rows.mean(0), axis=1)
    mean = radii.mean()
    return float(radii.std() / mean) if mean > 0 else math.nan


def pair_sums(embedding: np.ndarray, modulus: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``E_a + E_b`` for every ``a <= b`` (lexicographic) and their classes ``(a + b) mod modulus``."""
    rows = np.asarray(embedding, dtype=np.float64)
    n = len(rows)
    a, b = np.triu_indices(n)
    return rows[a] + rows[b], (a + b) % (modulus or n)


def within_share(points: np.ndarray, labels: np.ndarray) -> float:
    """Sum of squared distances to the group means over the sum of squared distances to the grand mean."""
    points = np.asarray(points, dtype=np.float64)
    total = float(((points - points.mean(0)) ** 2).sum())
    if total <= 0:
        return math.nan
    _, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse)
    means = np.zeros((len(counts), points.shape[1]))
    np.add.at(means, inverse, points)
    means /= counts[:, None]
    return float(((points - means[inverse]) ** 2).sum() / total)


def silhouette(points: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette of ``points`` under ``labels`` (NaN when undefined: <2 labels, all singletons, no spread)."""
    from sklearn.metrics import silhouette_score

    points = np.asarray(points, dtype=np.float64)
    n_labels = len(np.unique(labels))
    if not 2 <= n_labels <= len(points) - 1 or not np.ptp(points, axis=0).any():
        return math.nan
    return float(silhouette_score(points, labels, metric="euclidean"))


def neighbor_agreement(points: np.ndarray, labels: np.ndarray) -> float:
    """Share of points whose nearest other point (Euclidean; ties broken arbitrarily) has the same label."""
    from scipy.spatial import cKDTree

    points = np.asarray(points, dtype=np.float64)
    labels = np.asarray(labels)
    if len(points) < 2:
        return math.nan
    _, index = cKDTree(points).query(points, k=2)
    own = np.arange(len(points))
    other = np.where(index[:, 0] != own, index[:, 0], index[:, 1])  # a duplicate may come before the point itself
    return float((labels[other] == labels).mean())


def _units(n: int) -> list[int]:
    return [g for g in range(1, n) if math.gcd(g, n) == 1] or [1]


def grid_labelings(n: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The reading-order lattice labelings of ``n`` residues with ``rows`` residues per row.

    Parameters
    ----------
    n
        Residues.
    rows
        Row length ``m`` in ``2 .. n``; ``m = n`` is the line.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        ``z`` int64 ``[labelings, n, 2]``, the lattice coordinates
        ``(i mod m, i div m)`` of every residue (the line: ``(i, 0)``), and
        ``params`` int64 ``[labelings, 3]``: ``(offset a0, generator g, rows m)``,
        generators ascending, then offsets ascending.
    """
    units = np.array(_units(n), dtype=np.int64)
    inverses = np.array([pow(int(g), -1, n) for g in units], dtype=np.int64)
    offsets = np.arange(n, dtype=np.int64)
    residues = np.arange(n, dtype=np.int64)
    # index[g, a0, a] = (a - a0) * g^{-1} mod n
    index = ((residues[None, None, :] - offsets[None, :, None]) * inverses[:, None, None]) % n
    index = index.reshape(-1, n)
    z = np.stack([index, np.zeros_like(index)] if rows == n else [index % rows, index // rows], axis=-1)
    params = np.stack(
        [np.tile(offsets, len(units)), np.repeat(units, n), np.full(len(units) * n, rows, dtype=np.int64)], axis=1
    )
    return z, params


def grid_imperfection(embedding: np.ndarray) -> tuple[float, tuple[int, int, int]]:
    """Share of the pair sums' spread left by the best reading-order lattice (0 for ideal grids).

    Parameters
    ----------
    embedding
        ``[N, d]`` embedding rows of the residues ``0 .. N-1``.

    Returns
    -------
    tuple[float, tuple[int, int, int]]
        The imperfection in [0, 1] (NaN when the rows are all equal) and the best
        lattice's ``(offset, generator, row length)``: the first minimum in the
        order lines, then row lengths ``2 .. N-1``; generators, then offsets ascending.
    """
    rows = np.asarray(embedding, dtype=np.float64)
    n = len(rows)
    centred = rows - rows.mean(0)
    total = float((centred**2).sum())
    if total <= 0:
        return math.nan, (0, 1, n)
    if n <= 2:  # any two points are an evenly spaced line
        return 0.0, (0, 1, n)
    # only the span of the rows matters: work in their (at most N-1)-dimensional principal coordinates
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    coords = u * s  # [N, r]
    best_value, best_params = math.inf, (0, 1, n)
    for m in [n, *range(2, n)]:
        z, params = grid_labelings(n, m)
        x = (z - z.mean(1, keepdims=True)).astype(np.float64)  # [B, N, 2]
        if m == n:  # one regressor
            line = x[:, :, 0]
            explained = ((line @ coords) ** 2).sum(1) / (line**2).sum(1)
        else:  # two regressors: tr(C^T G^-1 C)
            gram = np.einsum("bnk,bnl->bkl", x, x)
            cross = np.einsum("bnk,nr->bkr", x, coords)
            explained = np.einsum("bkr,bkr->b", cross, np.linalg.solve(gram, cross))
        residual = np.clip(1.0 - explained / total, 0.0, 1.0)
        first = int(np.argmin(residual))
        if residual[first] < best_value - 1e-12:  # ties keep the earlier labeling
            best_value, best_params = float(residual[first]), tuple(int(v) for v in params[first])
    return best_value, best_params


def cluster_count(points: np.ndarray, tolerance: float) -> int:
    """Single-linkage clusters of ``points`` at distance ``tolerance`` times their RMS spread.

    Two points are in one cluster when a chain of points, each closer than the
    threshold to the next, joins them (the connected components of that graph).
    """
    from scipy.cluster.hierarchy import fcluster, linkage

    points = np.asarray(points, dtype=np.float64)
    if len(points) < 2:
        return len(points)
    spread = math.sqrt(((points - points.mean(0)) ** 2).sum(1).mean())
    if spread == 0:
        return 1
    labels = fcluster(linkage(points, method="single"), t=tolerance * spread, criterion="distance")
    return int(labels.max())


def ideal_cluster_count(p: int, k: int) -> int:
    """Multisets of ``k`` tokens from ``p`` symbols, ``C(k + p - 1, k)``."""
    return math.comb(k + p - 1, k)

"""Pure numpy helpers of the ``clusters`` analyzer: filtering, clustering and breakthroughs of trajectories.

A *trajectory* is one datapoint's curve over the stored steps (its exact loss,
its projected loss along a basis vector, ...). The functions here take plain
arrays, so that each step of "Hidden Breakthroughs in Language Model
Training"'s clustering can be used and tested on its own:

- :func:`from_origin`: per-transition allocations as eq. 10 trajectories over checkpoints;
- :func:`polca_filter`: the paper's filters of POLCA trajectories;
- :func:`cluster_matrix`: HDBSCAN on the rows of a matrix (``hdbscan`` library);
- :func:`cluster_statistics`: size, medoid, median and quartile trajectories of each cluster;
- :func:`breakthrough`: the breakthrough step of a curve, and
  :func:`hidden_flags`: whether it is hidden in the aggregate curve (the
  definitions ckpt was specified with: they are not in our reference text of the
  paper, whose eq. 9 is the POLCA decomposition and eq. 10 the projected loss);
- :func:`datapoint_labels`, :func:`label_scores`, :func:`place_fractions` and
  :func:`top_homogeneities`: how well clusters match a stored label.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ckpt.errors import AnalysisInputError

MEDOID_BLOCK = 1024
"""Rows per block of the pairwise distances of :func:`medoid` (bounds memory to block x rows)."""


def polca_filter(trajectories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's filters of projected-loss trajectories ``L_b(x, θ_t)``, shaped ``[step, basis, datapoint]``.

    The trajectories are eq. 10 of "Hidden Breakthroughs" taken at every
    checkpoint t = 0..T: ``L_b(x, θ_t) = Σ_{i<t} POLCA(x, b; θ_i)``, so the first
    row is ``L_b(x, θ_0) = 0``. Section 4.1 keeps "the basis vectors for which the
    mean projected loss decreases" and, in them, drops "the tokens for which the
    decomposed loss increases": from 0 to its final value. So a basis vector is
    kept when the mean over datapoints of ``L_b(x, θ_T)`` is below 0, and in a
    kept vector a datapoint is kept unless ``L_b(x, θ_T) > 0``. Datapoints with
    non-finite values are dropped (and left out of the mean).

    Comparing the final value with the one after the *first transition* instead
    (``L_b(x, θ_1)``) is a different filter: it drops a vector whose projected loss
    fell in the first transition and crept back a little afterwards.

    Parameters
    ----------
    trajectories
        ``[step, basis, datapoint]``, starting at θ_0 (a first row of zeros).

    Returns
    -------
    basis_kept : numpy.ndarray
        ``[basis]`` bool.
    kept : numpy.ndarray
        ``[basis, datapoint]`` bool: the datapoints that are clustered (all False
        for a dropped basis vector).

    Raises
    ------
    AnalysisInputError
        When the trajectories are not shaped so, or do not start at L_b(x, θ_0) = 0.
    """
    values = np.asarray(trajectories, dtype=np.float64)
    if values.ndim != 3 or values.shape[0] < 1:
        msg = f"trajectories must be shaped [step, basis, datapoint], got shape {values.shape}"
        raise AnalysisInputError(msg)
    finite = np.isfinite(values).all(axis=0)
    if np.any(values[0][finite] != 0):
        msg = "projected-loss trajectories must start at L_b(x, θ_0) = 0 (eq. 10): prepend the θ_0 row"
        raise AnalysisInputError(msg)
    final = values[-1]
    basis_kept = np.array([final[b][finite[b]].mean() < 0 for b in range(values.shape[1])], dtype=bool)
    kept = basis_kept[:, None] & finite & ~(final > 0)
    return basis_kept, kept


def from_origin(allocations: np.ndarray, *, cumulative: bool) -> np.ndarray:
    """Eq. 10 trajectories at every checkpoint, from per-transition rows ``[transition, ...]``.

    ``allocations[i]`` is what transition θ_i → θ_(i+1) contributed (``cumulative``:
    POLCA or LCA of that transition) or the running sum through it
    (``projected_loss``, as ``polca`` stores it). The result has one more row:
    ``L(θ_0) = 0`` and then ``L(θ_(i+1)) = Σ_(j≤i) allocations[j]``, so that row t
    belongs to checkpoint t.
    """
    values = np.asarray(allocations, dtype=np.float64)
    if cumulative:
        values = np.cumsum(values, axis=0)
    return np.concatenate([np.zeros((1, *values.shape[1:])), values], axis=0)


def default_min_samples(count: int) -> int:
    """The paper's HDBSCAN ``min_samples``: the number of datapoints / 15, rounded half up, at least 1."""
    return max(1, int(np.floor(count / 15 + 0.5)))


def relabel_by_size(labels: np.ndarray) -> np.ndarray:
    """Renumber clusters 0, 1, ... by decreasing size (ties: smallest member index first); -1 stays -1."""
    labels = np.asarray(labels)
    found = [c for c in np.unique(labels) if c >= 0]
    order = sorted(found, key=lambda c: (-int(np.sum(labels == c)), int(np.argmax(labels == c))))
    result = np.full(labels.shape, -1, dtype=np.int64)
    for new, old in enumerate(order):
        result[labels == old] = new
    return result


def cluster_matrix(
    rows: np.ndarray,
    *,
    min_cluster_size: int = 150,
    min_samples: int | None = None,
    selection: str = "eom",
    allow_single_cluster: bool = False,
) -> np.ndarray:
    """HDBSCAN cluster labels of the rows of ``rows`` (-1: outlier), numbered by decreasing size.

    Parameters
    ----------
    rows
        ``[datapoint, feature]`` finite values (features: the steps of a trajectory).
    min_cluster_size
        HDBSCAN's ``min_cluster_size`` (at least 2; the paper: 150).
    min_samples
        HDBSCAN's ``min_samples``; default :func:`default_min_samples` of the row
        count. At most the row count minus one.
    selection
        HDBSCAN's ``cluster_selection_method``: ``"eom"`` (default) or ``"leaf"``.
    allow_single_cluster
        HDBSCAN's ``allow_single_cluster``.

    Returns
    -------
    numpy.ndarray
        ``[datapoint]`` int64 labels. Fewer rows than ``min_cluster_size`` (or than
        two) give no cluster. HDBSCAN is deterministic: equal inputs give equal labels.
    """
    import hdbscan

    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        msg = f"rows must be a [datapoint, feature] matrix, got shape {rows.shape}"
        raise AnalysisInputError(msg)
    if min_cluster_size < 2:
        msg = f"min_cluster_size must be at least 2, got {min_cluster_size}"
        raise AnalysisInputError(msg)
    if not np.isfinite(rows).all():
        raise AnalysisInputError("rows must be finite")
    count = rows.shape[0]
    if count < max(2, min_cluster_size):
        return np.full(count, -1, dtype=np.int64)
    samples = default_min_samples(count) if min_samples is None else int(min_samples)
    if samples < 1:
        msg = f"min_samples must be at least 1, got {samples}"
        raise AnalysisInputError(msg)
    samples = min(samples, count - 1)
    clusterer = hdbscan.HDBSCAN(
        min_cluster_size=int(min_cluster_size),
        min_samples=samples,
        cluster_selection_method=selection,
        allow_single_cluster=bool(allow_single_cluster),
        approx_min_span_tree=False,  # the exact minimum spanning tree
        core_dist_n_jobs=1,
    )
    return relabel_by_size(clusterer.fit_predict(rows))


def max_clusters(count: int, min_cluster_size: int) -> int:
    """Slots for clusters: HDBSCAN's clusters hold at least ``min_cluster_size`` datapoints each (at least 1)."""
    return max(1, int(count) // max(1, int(min_cluster_size)))


def medoid(rows: np.ndarray) -> int:
    """Index of the row whose summed Euclidean distance to all rows is smallest (first on ties)."""
    from scipy.spatial.distance import cdist

    rows = np.asarray(rows, dtype=np.float64)
    totals = np.concatenate(
        [cdist(rows[start : start + MEDOID_BLOCK], rows).sum(axis=1) for start in range(0, len(rows), MEDOID_BLOCK)]
    )
    return int(np.argmin(totals))


def cluster_statistics(rows: np.ndarray, labels: np.ndarray, slots: int) -> dict[str, np.ndarray]:
    """Per cluster: size, medoid (row index), median and quartile trajectories, padded to ``slots``.

    Parameters
    ----------
    rows
        ``[datapoint, step]`` trajectories.
    labels
        ``[datapoint]`` cluster labels (-1: not in a cluster), clusters numbered 0..K-1.
    slots
        Length of the cluster axis (K <= slots); unused slots hold -1 (sizes, medoids) and NaN.

    Returns
    -------
    dict
        ``size`` and ``medoid`` ``[slots]`` int64; ``median``, ``lower_quartile`` and
        ``upper_quartile`` ``[slots, step]`` float64 (the 50th, 25th and 75th
        percentiles over the cluster's datapoints at each step, numpy's linear rule).
    """
    rows = np.asarray(rows, dtype=np.float64)
    labels = np.asarray(labels)
    count = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0
    if count > slots:
        msg = f"{count} clusters do not fit in {slots} slots"
        raise AnalysisInputError(msg)
    steps = rows.shape[1]
    result = {
        "size": np.full(slots, -1, dtype=np.int64),
        "medoid": np.full(slots, -1, dtype=np.int64),
        "median": np.full((slots, steps), np.nan),
        "lower_quartile": np.full((slots, steps), np.nan),
        "upper_quartile": np.full((slots, steps), np.nan),
    }
    for c in range(count):
        members = np.flatnonzero(labels == c)
        block = rows[members]
        result["size"][c] = len(members)
        result["medoid"][c] = members[medoid(block)]
        lower, middle, upper = np.percentile(block, [25, 50, 75], axis=0)
        result["median"][c], result["lower_quartile"][c], result["upper_quartile"][c] = middle, lower, upper
    return result


def delta_checkpoints(steps: Sequence[float], delta: float) -> tuple[int, float]:
    """Δ (in training steps) as a whole number of checkpoints k, and the Δ' = k·h used.

    h is the median spacing of ``steps``; k = Δ/h rounded half up, at least 1.
    With evenly spaced checkpoints Δ' is exactly k checkpoints; with uneven
    spacing :func:`breakthrough` interpolates the curve at t ± Δ'.
    """
    steps = np.asarray(steps, dtype=np.float64)
    if delta <= 0:
        msg = f"delta must be a positive number of steps, got {delta}"
        raise AnalysisInputError(msg)
    if len(steps) < 2:
        return 1, float("nan")
    spacing = float(np.median(np.diff(steps)))
    k = max(1, int(np.floor(delta / spacing + 0.5)))
    return k, k * spacing


def breakthrough_scores(curve: np.ndarray, steps: Sequence[float], delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The breakthrough score [f(t+Δ') − f(t)] − [f(t) − f(t−Δ')] at every candidate checkpoint t.

    Candidates are the checkpoints t with t − Δ' and t + Δ' within the stored
    steps (Δ' from :func:`delta_checkpoints`); f(t ± Δ') is linearly
    interpolated on the step axis (exact at checkpoints when they are evenly spaced).

    Returns
    -------
    candidates : numpy.ndarray
        The candidate steps (float64; empty when the run is shorter than 2Δ').
    scores : numpy.ndarray
        The score at each candidate.
    """
    steps = np.asarray(steps, dtype=np.float64)
    curve = np.asarray(curve, dtype=np.float64)
    if curve.shape != steps.shape:
        msg = f"curve has shape {curve.shape}; expected one value per step {steps.shape}"
        raise AnalysisInputError(msg)
    _, shift = delta_checkpoints(steps, delta)
    if not np.isfinite(shift):
        return np.zeros(0), np.zeros(0)
    tolerance = 1e-9 * max(1.0, abs(shift))
    inside = (steps - shift >= steps[0] - tolerance) & (steps + shift <= steps[-1] + tolerance)
    candidates = steps[inside]
    ahead = np.interp(np.minimum(candidates + shift, steps[-1]), steps, curve)
    behind = np.interp(np.maximum(candidates - shift, steps[0]), steps, curve)
    return candidates, (ahead - curve[inside]) - (curve[inside] - behind)


def breakthrough(curve: np.ndarray, steps: Sequence[float], delta: float) -> tuple[float, float]:
    """The breakthrough step of ``curve`` and its score (:func:`breakthrough_scores`).

    The argmax over the candidate checkpoints of :func:`breakthrough_scores`
    (the first one on ties): for a loss that drops sharply, the checkpoint
    where the drop ends (the largest positive curvature). ``(nan, nan)`` when
    there is no candidate or the curve is not finite.
    """
    candidates, scores = breakthrough_scores(curve, steps, delta)
    if not candidates.size or not np.isfinite(scores).all():
        return float("nan"), float("nan")
    best = int(np.argmax(scores))
    return float(candidates[best]), float(scores[best])


def hidden_flags(steps: np.ndarray, aggregate_step: float, tau: float) -> np.ndarray:
    """Whether each breakthrough step is hidden: farther than ``tau`` steps from the aggregate's breakthrough.

    A NaN breakthrough (no breakthrough) is never hidden; every breakthrough is
    hidden when the aggregate curve has none.
    """
    steps = np.asarray(steps, dtype=np.float64)
    if not np.isfinite(aggregate_step):
        return np.isfinite(steps)
    return np.isfinite(steps) & (np.abs(steps - aggregate_step) > tau)


def datapoint_labels(values: np.ndarray, example: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The label of each datapoint: ``values[example]``, or ``values[example, position]`` for tokens.

    Parameters
    ----------
    values
        A stored label: ``[example]`` or ``[example, position]``.
    example, position
        The datapoints (position -1 for whole examples).
    """
    values = np.asarray(values)
    example = np.asarray(example, dtype=np.int64)
    position = np.asarray(position, dtype=np.int64)
    if values.ndim == 1:
        return values[example]
    if (position < 0).any():
        msg = f"a label shaped {values.shape} (per token) cannot label whole-example datapoints (position -1)"
        raise AnalysisInputError(msg)
    if values.ndim != 2:
        msg = f"labels must be [example] or [example, position], got shape {values.shape}"
        raise AnalysisInputError(msg)
    return values[example, position]


def is_binary(values: np.ndarray) -> bool:
    """Whether a label only takes the values 0 and 1 (then 1 marks the datapoints that carry it)."""
    return bool(np.isin(np.unique(values), (0, 1)).all())


def label_scores(labels: np.ndarray, values: np.ndarray, slots: int, *, binary: bool) -> dict[str, np.ndarray]:
    """Homogeneity, recall and F1 of each cluster against a label, padded to ``slots``.

    Parameters
    ----------
    labels
        ``[datapoint]`` cluster labels (-1: none), clusters 0..K-1.
    values
        ``[datapoint]`` label of every datapoint of the dataset.
    slots
        Length of the cluster axis.
    binary
        For a 0/1 label the cluster's label value is 1 (the datapoints carrying it);
        otherwise the majority value in the cluster (the smallest one on ties).

    Returns
    -------
    dict
        ``value`` ``[slots]`` int64 (-1 in unused slots); ``homogeneity`` = the fraction
        of the cluster with that value; ``recall`` = the fraction of all datapoints of the
        dataset with that value that are in the cluster; ``f1`` = 2hr/(h+r) (0 when both
        are 0); NaN in unused slots.
    """
    labels = np.asarray(labels)
    values = np.asarray(values)
    result = {
        "value": np.full(slots, -1, dtype=np.int64),
        "homogeneity": np.full(slots, np.nan),
        "recall": np.full(slots, np.nan),
        "f1": np.full(slots, np.nan),
    }
    count = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0
    for c in range(min(count, slots)):
        members = values[labels == c]
        if not members.size:
            continue
        if binary:
            value = 1
        else:
            found, counts = np.unique(members, return_counts=True)
            value = found[int(np.argmax(counts))]
        hits = int(np.sum(members == value))
        homogeneity = hits / members.size
        total = int(np.sum(values == value))
        recall = hits / total if total else 0.0
        result["value"][c] = value
        result["homogeneity"][c] = homogeneity
        result["recall"][c] = recall
        result["f1"][c] = 2 * homogeneity * recall / (homogeneity + recall) if homogeneity + recall else 0.0
    return result


def place_fractions(
    labels: np.ndarray, values: np.ndarray, cluster_values: np.ndarray, places: np.ndarray, allowed: Sequence[int]
) -> np.ndarray:
    """Per cluster, the fraction of its datapoints with its label value whose place is in ``allowed``.

    The paper's restriction: a carry cluster counts only when >= 85% of its carry
    tokens are in the 10s or 100s place. NaN for a cluster without such datapoints
    and for unused slots (``cluster_values`` -1 there; ``labels`` has no datapoint there).
    """
    labels = np.asarray(labels)
    cluster_values = np.asarray(cluster_values)
    result = np.full(cluster_values.shape, np.nan)
    for c in range(len(cluster_values)):
        chosen = (labels == c) & (values == cluster_values[c])
        if chosen.any():
            result[c] = float(np.isin(places[chosen], list(allowed)).mean())
    return result


def value_shares(labels: np.ndarray, values: np.ndarray, slots: int, kinds: Sequence[int]) -> np.ndarray:
    """``[slot, kind]``: the fraction of each cluster's datapoints whose ``values`` is each of ``kinds``.

    A cluster's make-up by a categorical label (addition: the place of each answer
    token). NaN for unused slots.
    """
    labels, values = np.asarray(labels), np.asarray(values)
    result = np.full((slots, len(kinds)), np.nan)
    for c in range(slots):
        members = values[labels == c]
        if members.size:
            result[c] = [float((members == kind).mean()) for kind in kinds]
    return result


def top_homogeneities(
    homogeneity: np.ndarray, allowed: np.ndarray | None = None, k: int = 3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` highest homogeneities over all (basis, cluster), highest first.

    Parameters
    ----------
    homogeneity
        ``[basis, cluster]`` (NaN: no cluster).
    allowed
        ``[basis, cluster]`` bool: the clusters that may be ranked (default: all).
    k
        How many.

    Returns
    -------
    values, basis, cluster : numpy.ndarray
        ``[k]`` each; ties go to the lower basis, then cluster; NaN and -1 when fewer
        than ``k`` clusters qualify.
    """
    homogeneity = np.asarray(homogeneity, dtype=np.float64)
    ok = np.isfinite(homogeneity)
    if allowed is not None:
        ok &= np.asarray(allowed, dtype=bool)
    basis, cluster = np.nonzero(ok)
    order = np.lexsort((cluster, basis, -homogeneity[basis, cluster]))[:k]
    values = np.full(k, np.nan)
    top_basis = np.full(k, -1, dtype=np.int64)
    top_cluster = np.full(k, -1, dtype=np.int64)
    values[: len(order)] = homogeneity[basis[order], cluster[order]]
    top_basis[: len(order)] = basis[order]
    top_cluster[: len(order)] = cluster[order]
    return values, top_basis, top_cluster


__all__ = [
    "MEDOID_BLOCK",
    "breakthrough",
    "breakthrough_scores",
    "cluster_matrix",
    "cluster_statistics",
    "datapoint_labels",
    "default_min_samples",
    "delta_checkpoints",
    "from_origin",
    "hidden_flags",
    "is_binary",
    "label_scores",
    "max_clusters",
    "medoid",
    "place_fractions",
    "polca_filter",
    "relabel_by_size",
    "top_homogeneities",
    "value_shares",
]

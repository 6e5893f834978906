"""Loss and gradient spikes on 1-D series, for ``loss-spikes`` (pure numpy).

A value is a spike when it lies above a rolling median of the values before it by more
than a threshold times their MAD (:func:`rolling_baseline`, :func:`detect_spikes`);
:func:`cooccurrence` and :func:`chance_cooccurrence` say how often the loss's spikes fall
near the gradient's, and how often they would by chance (see
:mod:`ckpt.analyzers.grad_norms`' docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ckpt.errors import AnalysisInputError

MAD_SCALE = 1.4826
"""MAD times this estimates the standard deviation of Gaussian noise."""
MIN_PERIODS = 5
"""Earlier values a checkpoint needs before it can be a spike."""


def rolling_baseline(values: Sequence[float], window: int, min_periods: int = MIN_PERIODS) -> tuple[Any, Any]:
    """Trailing rolling median and scaled MAD of ``values``, from the previous ``window`` finite values.

    Parameters
    ----------
    values
        A 1-D series.
    window
        How many earlier values (not counting the current one) form the baseline.
    min_periods
        Fewer earlier finite values than this give NaN.

    Returns
    -------
    tuple of numpy.ndarray
        ``median`` and ``1.4826 * MAD`` at every position (NaN where undefined).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        msg = f"spike detection works on 1-D series, got shape {x.shape}"
        raise AnalysisInputError(msg)
    if window < 1:
        msg = f"window must be at least 1, got {window}"
        raise AnalysisInputError(msg)
    median = np.full(x.shape, np.nan)
    scale = np.full(x.shape, np.nan)
    for t in range(len(x)):
        past = x[max(0, t - window) : t]
        past = past[np.isfinite(past)]
        if len(past) >= max(1, min_periods):
            median[t] = np.median(past)
            scale[t] = MAD_SCALE * np.median(np.abs(past - median[t]))
    return median, scale


def detect_spikes(
    values: Sequence[float],
    *,
    window: int = 20,
    threshold: float = 5.0,
    floor: float = 0.01,
    min_periods: int = MIN_PERIODS,
) -> np.ndarray:
    """Where a series rises more than ``threshold`` robust deviations above its trailing median.

    Parameters
    ----------
    values
        A 1-D series (loss or gradient norm per checkpoint).
    window
        Earlier values forming the baseline (see :func:`rolling_baseline`).
    threshold
        Spike when ``x_t - median_t > threshold * scale_t``.
    floor
        ``scale_t = max(1.4826 * MAD_t, floor * |median_t|, 1e-12)``: the smallest
        scale, relative to the median, so a flat stretch (MAD 0) does not flag noise.
    min_periods
        Earlier finite values needed; positions with fewer are never spikes.

    Returns
    -------
    numpy.ndarray
        Boolean, one per value. NaN values are never spikes; ``+inf`` always is
        (once a baseline exists).
    """
    x = np.asarray(values, dtype=np.float64)
    median, scale = rolling_baseline(x, window, min_periods)
    scale = np.fmax(np.fmax(scale, floor * np.abs(median)), 1e-12)
    with np.errstate(invalid="ignore"):
        return np.asarray((x - median) > threshold * scale) & np.isfinite(median) & ~np.isnan(x)


def near(steps: Sequence[int], targets: Sequence[int], tolerance: int) -> np.ndarray:
    """For each of ``steps``, whether some step of ``targets`` is within ``±tolerance`` of it (boolean)."""
    s = np.asarray(steps, dtype=np.int64).reshape(-1)
    g = np.sort(np.asarray(targets, dtype=np.int64).reshape(-1))
    if not len(g):
        return np.zeros(s.shape, bool)
    index = np.clip(np.searchsorted(g, s), 1, len(g)) - 1  # the target at or before s (or the first)
    after = np.clip(index + 1, 0, len(g) - 1)
    distance = np.minimum(np.abs(s - g[index]), np.abs(g[after] - s))
    return distance <= tolerance


def cooccurrence(loss_spike_steps: Sequence[int], grad_spike_steps: Sequence[int], tolerance: int = 0) -> float:
    """Fraction of loss spikes with a gradient-norm spike within ``±tolerance`` steps (NaN without loss spikes)."""
    hits = near(loss_spike_steps, grad_spike_steps, tolerance)
    return float(hits.mean()) if hits.size else float("nan")


def chance_cooccurrence(steps: Sequence[int], grad_spike_steps: Sequence[int], tolerance: int = 0) -> float:
    """The :func:`cooccurrence` expected of a loss spike at a uniformly random one of ``steps``.

    That is the fraction of ``steps`` within ``±tolerance`` of a gradient-norm
    spike (NaN when there are no steps).
    """
    hits = near(steps, grad_spike_steps, tolerance)
    return float(hits.mean()) if hits.size else float("nan")


def spike_table(
    loss: Any, grad: Any, *, steps: Sequence[int], window: int, threshold: float, floor: float, tolerance: int
) -> dict[str, Any]:
    """Baselines, spikes and co-occurrence of the loss and gradient-norm series (runs in a Dask task)."""
    steps = np.asarray(steps, dtype=np.int64)
    out: dict[str, Any] = {}
    spikes = {}
    for key, series in (("loss", loss), ("grad_norm", grad)):
        x = np.asarray(series, dtype=np.float64) if series is not None else np.full(len(steps), np.nan)
        median, scale = rolling_baseline(x, window)
        spikes[key] = detect_spikes(x, window=window, threshold=threshold, floor=floor)
        out[key] = x
        out[f"{key}_median"] = median
        out[f"{key}_mad"] = scale
        out[f"{key}_spike"] = spikes[key]
    loss_at, grad_at = steps[spikes["loss"]], steps[spikes["grad_norm"]]
    out["cooccurrence"] = np.float64(cooccurrence(loss_at, grad_at, tolerance) if grad is not None else np.nan)
    out["chance"] = np.float64(chance_cooccurrence(steps, grad_at, tolerance) if grad is not None else np.nan)
    return out

"""Diagnostics of SGLD loss traces ``[chain, draw]``: R-hat, ESS, flattening, divergence, warnings.

The ``llc`` analyzer estimates λ̂ from the mean of each chain's recorded minibatch losses; these
functions say whether those means can be trusted (docs/llc-diagnostics.md says what each one
means and what it points to when ε, nβ, γ or ``--draws`` are wrong):

- :func:`split_rhat`: rank-normalized split R-hat (Vehtari et al. 2021, "Rank-normalization,
  folding, and localization", eqs. 4 and 14), near 1 when the chains agree and do not trend;
- :func:`effective_sample_size`: bulk ESS over all chains (the same paper, section 3.2);
- :func:`has_flattened`: Geweke's z of the first 10% against the last 50% of each chain's draws;
- :func:`diverged_chains`: non-finite draws, a blow-up far above the chains' typical loss, or a
  chain that ends far below ``init_loss`` against its own spread;
- :func:`chain_warnings`: one line per problem of an ``llc`` result, naming the checkpoint's step.

R-hat and ESS come from ``arviz-stats`` (the array-level ``arviz_stats.base.array_stats``), the
reference implementation of that paper; only Geweke's test and the divergence rule are ours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

RHAT_MAX = 1.1
"""R-hat above this is a warning that the chains disagree (Gelman & Rubin's 1.1). Vehtari et al. (2021)
ask 1.01 of a posterior summary; SGLD at the step sizes the LLC uses takes thousands of draws to reach
it, while the error of λ̂ itself is judged by :data:`MCSE_MAX` (and shown as ``llc_std``), so the
stricter bound would flag nearly every checkpoint of a usable run (docs/llc-diagnostics.md)."""

MCSE_MAX = 0.1
"""λ̂'s Monte-Carlo standard error, nβ · sd(draws) / √ESS, above this fraction of |λ̂| (and above this
value itself, a fifth of one regular parameter's 1/2, so that a λ̂ near 0 is not held to a vanishing
error) is a warning: too few effective draws for the value to mean what it says. The ESS itself is reported, not judged
alone: a long autocorrelation is harmless when the error it leaves is small."""

GEWEKE_FIRST, GEWEKE_LAST = 0.1, 0.5
"""Geweke's (1992) segments: the first 10% of the draws against the last 50%."""

GEWEKE_Z_MAX = 3.0
"""A chain has flattened while its Geweke |z| stays below 3 (a two-sided 0.3% false alarm per chain
for a stationary chain: about 1% for 4 chains)."""

SPREAD_FLOOR = 1e-9
"""Robust spreads below this fraction of max(1, |loss|) count as this: a chain that does not move
at all must not make every other deviation look infinitely large."""

BLOWUP_SPREADS = 50.0
"""A chain blew up when a draw is more than 50 typical spreads above the median of all draws."""

BELOW_SPREADS = 10.0
"""A chain fell away when the median of its last quarter is more than 10 of its own spreads below
``init_loss``: a chain drifting down a valley spans its drift (at most about 3 spreads), a chain that
jumped to a lower basin sits far below it with a small spread."""


def _robust_std(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """1.4826 × the median absolute deviation: the standard deviation for Gaussian draws, blind to outliers."""
    median = np.median(x, axis=axis, keepdims=True)
    return 1.4826 * np.median(np.abs(x - median), axis=axis)


def _check(traces: np.ndarray) -> np.ndarray:
    traces = np.asarray(traces, dtype=np.float64)
    if traces.ndim != 2:
        msg = f"traces must be [chain, draw], got shape {traces.shape}"
        raise ValueError(msg)
    return traces


def _arviz(traces: np.ndarray, statistic: str, method: str) -> float:
    """arviz-stats' ``statistic`` (``rhat`` or ``ess``) of ``[chain, draw]`` traces; NaN when it is undefined."""
    from arviz_stats.base import array_stats

    traces = _check(traces)
    if traces.shape[1] < 4 or not np.isfinite(traces).all():
        return float("nan")
    return float(getattr(array_stats, statistic)(traces, chain_axis=0, draw_axis=1, method=method))


def split_rhat(traces: np.ndarray) -> float:
    """Rank-normalized split R-hat of ``traces`` ``[chain, draw]`` (Vehtari et al. 2021, eq. 14).

    Parameters
    ----------
    traces : np.ndarray
        Loss traces, one row per chain; at least 4 draws.

    Returns
    -------
    float
        The larger of the bulk and folded (tail) split R-hat; NaN when a draw is non-finite or
        there are fewer than 4 draws.
    """
    return _arviz(traces, "rhat", "rank")


def effective_sample_size(traces: np.ndarray) -> float:
    """Bulk effective sample size of ``traces`` ``[chain, draw]`` over all chains (Vehtari et al. 2021, §3.2).

    Parameters
    ----------
    traces : np.ndarray
        As for :func:`split_rhat`.

    Returns
    -------
    float
        How many independent draws the chains' mean is worth: for AR(1) chains of lag-one correlation ρ,
        about n (1 − ρ) / (1 + ρ), n the number of draws in all. NaN where R-hat is.
    """
    return _arviz(traces, "ess", "bulk")


def geweke_z(traces: np.ndarray) -> np.ndarray:
    """Geweke's (1992) z per chain: (mean of the first 10% − mean of the last 50%) over its standard error.

    Each segment's variance of the mean is its sample variance over its own ESS, so that correlated draws
    do not make a stationary chain look like it drifts.

    Parameters
    ----------
    traces : np.ndarray
        Loss traces ``[chain, draw]``.

    Returns
    -------
    np.ndarray
        One z per chain; NaN where a segment has fewer than 4 draws or a non-finite one, 0 where both
        segments are constant and equal.
    """
    from arviz_stats.base import array_stats

    traces = _check(traces)
    draws = traces.shape[1]
    first, last = traces[:, : int(GEWEKE_FIRST * draws)], traces[:, draws - int(GEWEKE_LAST * draws) :]
    z = np.full(traces.shape[0], np.nan)
    if first.shape[1] < 4 or not np.isfinite(traces).all():
        return z
    for c in range(traces.shape[0]):
        parts = []
        for segment in (first[c], last[c]):
            variance = segment.var(ddof=1)
            ess = array_stats.ess(segment[None], chain_axis=0, draw_axis=1, method="mean") if variance > 0 else 1.0
            parts.append((segment.mean(), variance / max(float(ess), 1.0)))
        (m1, v1), (m2, v2) = parts
        gap = m1 - m2
        z[c] = 0.0 if gap == 0 else gap / np.sqrt(v1 + v2) if v1 + v2 > 0 else np.copysign(np.inf, gap)
    return z


def has_flattened(traces: np.ndarray) -> bool:
    """Whether every chain's trace has stopped drifting: Geweke's |z| < :data:`GEWEKE_Z_MAX` for each.

    Parameters
    ----------
    traces : np.ndarray
        Loss traces ``[chain, draw]`` after burn-in; at least 40 draws (4 in the first 10%).

    Returns
    -------
    bool
        False when a chain drifts, a draw is non-finite or there are too few draws to tell.
    """
    z = geweke_z(traces)
    return bool(len(z) and np.isfinite(z).all() and (np.abs(z) < GEWEKE_Z_MAX).all())


def diverged_chains(traces: np.ndarray, init_loss: float) -> np.ndarray:
    """The chains of ``traces`` ``[chain, draw]`` that diverged.

    A chain diverged when any of its draws is non-finite; when a draw is more than
    :data:`BLOWUP_SPREADS` typical spreads above the median of all finite draws (the typical spread:
    the median over chains of each chain's robust standard deviation, so one blown-up chain does not
    hide itself); or when the median of its last quarter lies more than :data:`BELOW_SPREADS` of its
    own robust standard deviations below ``init_loss`` (it left w*'s basin for a lower one). Spreads
    are floored at :data:`SPREAD_FLOOR` × max(1, |init_loss|).

    Parameters
    ----------
    traces : np.ndarray
        Loss traces, one row per chain.
    init_loss : float
        L_n(w*), the loss at the checkpoint the chains start from.

    Returns
    -------
    np.ndarray
        Boolean, one per chain.
    """
    traces = _check(traces)
    bad = ~np.isfinite(traces).all(axis=1)
    if not np.isfinite(init_loss):
        return np.ones(traces.shape[0], bool)
    good = traces[~bad]
    if good.shape[1] == 0 or not len(good):
        return bad
    floor = SPREAD_FLOOR * max(1.0, abs(float(init_loss)))
    own = np.maximum(_robust_std(good), floor)
    typical = float(np.median(own))
    blown = good.max(axis=1) > np.median(good) + BLOWUP_SPREADS * typical
    tail = good[:, -max(1, good.shape[1] // 4) :]
    fell = np.median(tail, axis=1) < init_loss - BELOW_SPREADS * own
    bad[np.flatnonzero(~bad)] = blown | fell
    return bad


def chain_warnings(result: xr.Dataset) -> list[str]:
    """One line per problem of an ``llc`` result, each naming the checkpoint's step.

    The problems: chains that diverged, traces that have not flattened, λ̂ < 0, R-hat above
    :data:`RHAT_MAX`, a Monte-Carlo error of λ̂ over :data:`MCSE_MAX` of it (and a non-finite λ̂ that
    none of these explains).

    Parameters
    ----------
    result : xr.Dataset
        An ``llc`` result: ``llc`` (with its ``nbeta`` attribute), ``diverged``, ``flat``, ``rhat``,
        ``ess`` over ``step``, ``diverged`` over ``chain`` too and ``loss_trace`` over ``draw``.

    Returns
    -------
    list[str]
        The lines, step by step; empty when nothing is wrong.
    """
    lines = []
    chains = int(result.sizes.get("chain", 1))
    nbeta = float(result["llc"].attrs["nbeta"])
    for i, step in enumerate(result["step"].values.tolist()):
        at = f"step {step}"
        diverged = np.flatnonzero(np.asarray(result["diverged"].values[i], bool)).tolist()
        llc = float(result["llc"].values[i])
        rhat, ess = float(result["rhat"].values[i]), float(result["ess"].values[i])
        if diverged:
            lines.append(f"{at}: chains {diverged} of {chains} diverged (λ̂ is NaN): lower --epsilon or raise --gamma")
        elif not np.isfinite(llc):
            lines.append(f"{at}: λ̂ is not finite")
        if not bool(result["flat"].values[i]) and len(diverged) < chains:
            lines.append(f"{at}: the loss traces still drift (not flat): more --burn-in, or a smaller --epsilon")
        if llc < 0:
            lines.append(f"{at}: λ̂ = {llc:.4g} < 0: the chains found lower loss than w*; raise --gamma")
        if rhat > RHAT_MAX:
            lines.append(f"{at}: R-hat {rhat:.3f} > {RHAT_MAX}: the chains disagree; more --draws or --burn-in")
        kept = np.asarray(result["loss_trace"].values[i])[~np.asarray(result["diverged"].values[i], bool)]
        if np.isfinite(llc) and llc != 0 and ess > 0 and kept.size > 1:
            mcse = nbeta * float(kept.std(ddof=1)) / np.sqrt(ess)
            if mcse > MCSE_MAX * max(abs(llc), 1.0):
                share = f"{MCSE_MAX:.0%} of |λ̂|" if abs(llc) > 1 else f"{MCSE_MAX}"
                lines.append(f"{at}: λ̂'s Monte-Carlo error {mcse:.3g} (ESS {ess:.0f}) is over {share}: more --draws")
    return lines


__all__ = [
    "GEWEKE_Z_MAX",
    "MCSE_MAX",
    "RHAT_MAX",
    "chain_warnings",
    "diverged_chains",
    "effective_sample_size",
    "geweke_z",
    "has_flattened",
    "split_rhat",
]

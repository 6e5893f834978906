"""Chain diagnostics against theory: AR(1) ESS, R-hat of iid and shifted chains, flatness, divergence."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from ckpt.numerics.chain_diagnostics import (
    chain_warnings,
    diverged_chains,
    effective_sample_size,
    geweke_z,
    has_flattened,
    split_rhat,
)


def ar1(rho: float, chains: int, draws: int, seed: int) -> np.ndarray:
    """Stationary AR(1) chains x_t = ρ x_{t-1} + √(1−ρ²) ε_t of unit variance."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((chains, draws)) * np.sqrt(1 - rho**2)
    x = np.empty((chains, draws))
    x[:, 0] = rng.standard_normal(chains)
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_ess_of_ar1_chains_is_n_1_minus_rho_over_1_plus_rho(rho: float) -> None:
    traces = ar1(rho, chains=4, draws=5000, seed=1)
    expected = traces.size * (1 - rho) / (1 + rho)
    assert effective_sample_size(traces) == pytest.approx(expected, rel=0.12)


def test_rhat_is_one_for_iid_chains_and_large_for_shifted_means() -> None:
    rng = np.random.default_rng(2)
    iid = rng.standard_normal((4, 1000))
    assert abs(split_rhat(iid) - 1) < 0.01
    shifted = iid + np.array([0.0, 0.0, 0.0, 2.0])[:, None]
    assert split_rhat(shifted) > 1.2
    # a trend within each chain shows in the split halves even when the chains agree
    trend = iid + np.linspace(0, 3, 1000)
    assert split_rhat(trend) > 1.1
    assert np.isnan(split_rhat(np.where(iid > 3, np.nan, iid)))


def test_drifting_traces_are_not_flat_stationary_ones_are() -> None:
    rng = np.random.default_rng(3)
    flat = rng.standard_normal((4, 400)) * 0.1 + 2.0
    assert has_flattened(flat)
    assert has_flattened(2.0 + 0.1 * ar1(0.9, chains=4, draws=2000, seed=4))  # correlated, yet stationary
    # a warm-up from w* (the loss rising to its plateau, as with --burn-in 0), and a slow decline
    rising = flat + 0.5 * np.exp(-np.arange(400) / 20)[None] * -1
    assert not has_flattened(rising)
    declining = flat - np.linspace(0, 0.3, 400)
    assert not has_flattened(declining)
    assert np.abs(geweke_z(declining)).min() > 3
    assert not has_flattened(flat[:, :20])  # too few draws to tell


def test_diverged_chains_flags_non_finite_blow_ups_and_far_below() -> None:
    rng = np.random.default_rng(5)
    init = 1.0
    traces = init + 0.05 + 0.02 * rng.standard_normal((6, 300))
    traces[1, 200:] = np.inf
    traces[2, 150] = np.nan
    traces[3, 250:] = init * 1e3  # blew up
    traces[4, 100:] = init - 0.5 + 0.02 * rng.standard_normal(200)  # left for a lower basin
    # healthy, though drifting down a little below init: negative λ̂, not a divergence
    traces[5] = init - np.linspace(0, 0.1, 300) + 0.02 * rng.standard_normal(300)
    assert diverged_chains(traces, init).tolist() == [False, True, True, True, True, False]
    assert not diverged_chains(traces[[0, 5]], init).any()
    assert diverged_chains(traces[[0]], float("nan")).all()
    still = np.full((2, 50), init)  # chains that never moved: no spread, nothing diverged
    assert not diverged_chains(still, init).any()


def llc_result(steps: list[int], chains: int = 4, draws: int = 200) -> xr.Dataset:
    """An llc result in the analyzer's schema, healthy at every step."""
    rng = np.random.default_rng(6)
    n = len(steps)
    trace = 1.0 + 0.01 * rng.standard_normal((n, chains, draws))
    return xr.Dataset(
        {
            "llc": ("step", np.full(n, 3.0), {"nbeta": 100.0}),
            "llc_std": ("step", np.full(n, 0.1)),
            "llc_chain": (("step", "chain"), np.full((n, chains), 3.0)),
            "loss_trace": (("step", "chain", "draw"), trace),
            "init_loss": ("step", np.full(n, 0.99)),
            "rhat": ("step", np.full(n, 1.001)),
            "ess": ("step", np.full(n, 700.0)),
            "diverged": (("step", "chain"), np.zeros((n, chains), bool)),
            "flat": ("step", np.ones(n, bool)),
        },
        coords={"step": steps, "chain": np.arange(chains), "draw": np.arange(draws)},
    )


def test_chain_warnings_name_each_problem_and_its_step() -> None:
    result = llc_result([0, 10, 20, 30, 40, 50])
    assert chain_warnings(result) == []
    result["diverged"][1, 2] = True
    result["llc"][1] = np.nan
    result["flat"][2] = False
    result["llc"][3] = -0.5
    result["rhat"][4] = 1.2
    result["ess"][5] = 5.0  # MCSE = nβ sd / √ESS = 100 · 0.01 / √5 = 0.45 > 0.3, 10% of λ̂ (at ESS 700: 0.04)
    lines = chain_warnings(result)
    assert len(lines) == 5
    assert lines[0].startswith("step 10: chains [2] of 4 diverged")
    assert lines[1].startswith("step 20: the loss traces still drift")
    assert lines[2].startswith("step 30: λ̂ = -0.5 < 0")
    assert lines[3].startswith("step 40: R-hat 1.200 > 1.1")
    assert lines[4].startswith("step 50: λ̂'s Monte-Carlo error 0.44")

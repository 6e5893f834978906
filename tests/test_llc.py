"""``llc``: the SGLD estimate of the local learning coefficient against models whose λ is known.

Each theory test builds a real store of a model from tests/llc_models.py at a minimum of its
loss and runs the analyzer through the engine. With the full split as the minibatch, the loss
near a regular minimum is exactly quadratic, and SGLD is then an Euler-Maruyama chain on a
Gaussian whose stationary law is known in closed form: :func:`expected_regular` is what the
sampler converges to at the finite ε, nβ and γ used (the bias against d/2 is docs/llc.md's
"Tolerances"), and the tests check the estimate against it within a few standard errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import integrate

import ckpt
import ckpt.plugins.manager as manager
import ckpt.store as ckptstore
from ckpt.errors import AnalysisError, LLCWarning
from ckpt.plugins.examples import write_example_run
from ckpt.plugins.manager import load_registry
from tests.helpers import assert_refused
from tests.llc_models import MSE_PLUGIN

pytestmark = pytest.mark.usefixtures("one_thread", "mse")

N = 200
"""Examples in every theory store; the minibatch is the whole split."""


@pytest.fixture(scope="module")
def mse() -> Iterator[None]:
    """The objective ``mse`` registered in the process's registry (the workers read that one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manager, "_registry", load_registry(extra=[MSE_PLUGIN]))
        yield


def write_store(path: Path, factory: str, config: dict[str, Any], tensors: dict[str, Any], x: Any, y: Any) -> Path:
    """One checkpoint (step 0) of ``factory`` at ``tensors``, with the train split (x, y)."""
    with ckptstore.create(path, model=f"tests.llc_models:{factory}", config=config, objective="mse") as writer:
        writer.write(0, {k: np.asarray(v, np.float64) for k, v in tensors.items()})
        writer.add_data("train", inputs=np.asarray(x, np.float64), targets=np.asarray(y, np.float64)[:, None])
    return path


def least_squares(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The exact minimum of the mean squared error: there the gradient of L_n is zero."""
    return np.linalg.lstsq(design, y, rcond=None)[0]


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """y = 1·x1 − 2·x2 + 0.5 + noise, at its least-squares fit; with the design [x1, x2, 1]."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 2))
    y = x @ [1.0, -2.0] + 0.5 + 0.3 * rng.standard_normal(N)
    design = np.c_[x, np.ones(N)]
    fit = least_squares(design, y)
    tensors = {"weight": fit[:2].reshape(1, 2), "bias": fit[2:]}
    return write_store(tmp_path_factory.mktemp("llc") / "linear.zarr", "linear", {"inputs": 2}, tensors, x, y), design


def expected_regular(design: np.ndarray, nbeta: float, gamma: float, epsilon: float) -> float:
    """E[nβ (L_n(w) − L_n(w*))] under full-batch SGLD's stationary law, for L_n = mean squared error.

    L_n − L_n(w*) = ½ δᵀHδ with H = 2 XᵀX / n. Along an eigenvector of H with eigenvalue h the
    chain is δ ← δ − (ε/2) a δ + √ε ξ with a = nβ h + γ, whose stationary variance is
    1 / (a (1 − ε a / 4)); so the direction adds ½ nβ h / (a (1 − ε a / 4)), which tends to ½
    as ε → 0 and γ / (nβ h) → 0, and is 0 for a direction the loss does not see (h = 0).
    """
    h = np.clip(np.linalg.eigvalsh(2 * design.T @ design / len(design)), 0, None)
    a = nbeta * h + gamma
    return float(np.sum(0.5 * nbeta * h / (a * (1 - epsilon * a / 4))))


def llc(path: Path, **options: Any) -> Any:
    """The analyzer's result on ``path``, recomputed, in float64 over the whole split.

    Without warnings unless asked for (``warn=True``): the diagnostics' thresholds are set for real
    runs (100 effective draws per chain, R-hat 1.01), and these tests check the diagnostics' values.
    """
    options = {"warn": False, **options}
    return ckpt.analyze("llc", path, force=True, dtype="float64", batch_size=N, **options).load()


def standard_error(result: Any) -> float:
    """The standard error of ``llc``: the spread of the chains' estimates over √chains."""
    per_chain = result["llc_chain"].values[0]
    return float(per_chain.std(ddof=1) / np.sqrt(len(per_chain)))


REGULAR = {"nbeta": 100.0, "gamma": 1.0, "epsilon": 1e-3, "chains": 8, "draws": 1000, "burn_in": 50, "seed": 1}
"""ε a ≈ 0.2 along the sharpest direction (h ≈ 2): a 5% bias of the chain's variance, which
:func:`expected_regular` includes. About 800 effective draws: a standard error near 3% of d/2,
so that 4 of them tell d/2 from (d ± 1)/2."""


def test_a_regular_model_counts_half_its_parameters(regression: tuple[Path, np.ndarray]) -> None:
    path, design = regression
    result = llc(path, **REGULAR)
    estimate, error = float(result["llc"].values[0]), standard_error(result)
    expected = expected_regular(design, REGULAR["nbeta"], REGULAR["gamma"], REGULAR["epsilon"])
    assert abs(expected - 1.5) < 0.1, "at these settings the sampler's bias against d/2 is a few percent"
    assert abs(estimate - expected) < 4 * error + 0.02, (estimate, expected, error)
    assert error < 0.07
    assert not result["diverged"].values.any()
    assert result["rhat"].values[0] < 1.05, "the chains mix"
    assert result["ess"].values[0] > 400


def test_restrict_moves_only_the_tensors_it_names(regression: tuple[Path, np.ndarray]) -> None:
    path, design = regression
    result = llc(path, restrict="wei*", **REGULAR)  # the two weights move, the bias stays at w*
    expected = expected_regular(design[:, :2], REGULAR["nbeta"], REGULAR["gamma"], REGULAR["epsilon"])
    assert abs(expected - 1.0) < 0.06
    estimate = float(result["llc"].values[0])
    assert abs(estimate - expected) < 4 * standard_error(result) + 0.02, (estimate, expected)
    assert result["llc"].attrs["moving"] == "weight"


def test_a_direction_the_loss_does_not_see_is_not_counted(tmp_path: Path) -> None:
    # y = (a + b)·x + c: three parameters, two identifiable, so λ = 1, not 3/2
    rng = np.random.default_rng(1)
    x = rng.standard_normal(N)
    y = 0.7 * x - 0.2 + 0.3 * rng.standard_normal(N)
    (slope, intercept) = least_squares(np.c_[x, np.ones(N)], y)
    tensors = {"a": slope / 2, "b": slope / 2, "c": intercept}
    path = write_store(tmp_path / "sum.zarr", "sum_of_two", {}, tensors, x[:, None], y)
    result = llc(path, **{**REGULAR, "epsilon": 5e-4})
    expected = expected_regular(np.c_[x, x, np.ones(N)], REGULAR["nbeta"], REGULAR["gamma"], 5e-4)
    assert abs(expected - 1.0) < 0.06
    estimate = float(result["llc"].values[0])
    assert abs(estimate - expected) < 4 * standard_error(result) + 0.02, (estimate, expected)


def deep_line_expected(t: float, gamma: float) -> float:
    """E[t w1² w2²] under ∝ exp(−t w1² w2² − (γ/2)|w|²), by quadrature.

    Given w1, w2 is Gaussian with precision 2 t w1² + γ, so E[t w1² w2² | w1] = t w1² / (2 t w1² + γ)
    and w1's marginal is ∝ exp(−γ w1² / 2) (2 t w1² + γ)^(−1/2).
    """

    def weight(w: float) -> float:
        return float(np.exp(-gamma * w * w / 2) / np.sqrt(2 * t * w * w + gamma))

    total = integrate.quad(lambda w: weight(w) * t * w * w / (2 * t * w * w + gamma), -np.inf, np.inf, limit=200)[0]
    return total / integrate.quad(weight, -np.inf, np.inf, limit=200)[0]


def test_a_singular_deep_linear_network_is_below_its_parameter_count(tmp_path: Path) -> None:
    # y = w1·w2·x at the true product 0: K ∝ (w1 w2)², λ = 1/2 with multiplicity 2, where counting
    # parameters says 1. At a finite t = nβ·mean(x²) the localized posterior's value sits below 1/2
    # (by about 1/log t); quadrature gives it exactly.
    rng = np.random.default_rng(2)
    x = rng.standard_normal(N)
    y = rng.standard_normal(N)
    y -= x * (x @ y) / (x @ x)  # mean(x·y) = 0: w = 0 is the exact minimum, L_n(w) − L_n(0) = mean(x²)(w1 w2)²
    path = write_store(tmp_path / "line.zarr", "deep_line", {"depth": 2}, {"w": np.zeros(2)}, x[:, None], y)
    options = {"nbeta": 1000.0, "gamma": 10.0, "epsilon": 1e-3, "chains": 4, "draws": 1500, "burn_in": 200, "seed": 3}
    result = llc(path, **options)
    expected = deep_line_expected(options["nbeta"] * float(np.mean(x**2)), options["gamma"])
    estimate = float(result["llc"].values[0])
    assert 0.2 < expected < 0.5
    assert abs(estimate - expected) < 4 * standard_error(result) + 0.03, (estimate, expected)
    assert estimate < 0.5, "a singular model's λ is below half its parameter count (here 1)"


def test_a_seed_reproduces_its_chains_and_another_seed_does_not(regression: tuple[Path, np.ndarray]) -> None:
    path, _ = regression
    options = {"nbeta": 50.0, "gamma": 10.0, "chains": 2, "draws": 30, "init_loss": "batches"}
    first, again = llc(path, seed=5, **options), llc(path, seed=5, **options)
    np.testing.assert_array_equal(first["loss_trace"].values, again["loss_trace"].values)
    other = llc(path, seed=6, **options)
    assert not np.array_equal(first["loss_trace"].values, other["loss_trace"].values)
    # each chain is its seed's alone: two chains are the first two of four
    more = llc(path, seed=5, **{**options, "chains": 4})
    np.testing.assert_array_equal(more["loss_trace"].values[:, :2], first["loss_trace"].values)


def test_the_full_init_loss_is_the_loss_at_the_checkpoint(regression: tuple[Path, np.ndarray]) -> None:
    path, design = regression
    store = ckptstore.open(path)
    tensors = store.tensors(0)
    data = store.data("train")
    fit = np.r_[tensors["weight"].ravel(), tensors["bias"]]
    exact = np.mean((design @ fit - data["targets"].values[:, 0]) ** 2)
    result = llc(path, init_loss="full", chains=2, draws=4, nbeta=10.0)
    np.testing.assert_allclose(result["init_loss"].values[0], exact, rtol=1e-12)


def test_diverging_chains_are_named_and_their_estimate_is_nan(regression: tuple[Path, np.ndarray]) -> None:
    path, _ = regression
    with pytest.warns(LLCWarning, match=r"step 0"):
        result = llc(path, epsilon=10.0, nbeta=100.0, chains=2, draws=150, warn=True)
    assert result["diverged"].values.all()
    assert np.isnan(result["llc"].values[0]) and np.isnan(result["llc_chain"].values).all()
    assert np.isnan(result["llc_std"].values[0])


def test_bad_options_are_refused_in_one_line(regression: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, _ = regression
    for options, expected in (
        ({"restrict": "nothing*"}, "--restrict pattern 'nothing*' matches no trainable parameter"),
        ({"nbeta": 0.0}, "--nbeta must be > 0"),
        ({"split": "eval"}, "has no data split 'eval'"),
    ):
        with pytest.raises(AnalysisError, match=expected.replace("*", r"\*")):
            llc(path, **options)
    with pytest.raises(AnalysisError, match=r"raise --max-memory or lower --chains"):
        ckpt.analyze("llc", path, force=True, chains=100_000, draws=2, max_memory=1_000_000)
    example = write_example_run(tmp_path / "mlp.zarr", steps=1, examples=8)
    assert_refused(example, "llc", ["--epsilon", "0"], "--epsilon must be > 0")

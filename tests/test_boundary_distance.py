"""``boundary-distance`` (Clustering Head §4.3, Fig. 13-14) against brute force.

The distances are checked against a dense grid search over the ξ plane (a tiny
GELU read-out, and the sandbox's own read-out on a real run) and against the
closed form of a linear read-out, |(w_c − w_j)·ξ + b_c − b_j| / ‖w_c − w_j‖
minimised over j (the region of class c is an intersection of half-spaces), at
d = 8; the Jacobian norms against ``torch.autograd.functional.jacobian`` and
``torch.linalg.svdvals``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers.boundary_distance import (
    FOUND,
    NO_BOUNDARY,
    declared_logits,
    nearest_boundary,
    readout_logits,
)
from ckpt.engine.pipeline import run
from ckpt.plugins import AnalysisError
from ckpt.plugins.testing import write_example_run
from tests.helpers import assert_refused, sparse_modular_store

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

SMALL = {"steps": 8, "every": 8, "seed": 0, "train_size": 32, "test_size": 32}
"""Checkpoints at steps 0 and 8; 64 eval sequences."""
FAST = {"directions": 32, "batch_size": 4096}


store = sparse_modular_store("boundary", SMALL)


def grid_distance(logits_of_points: Any, xi: np.ndarray, predicted: int, half: float, n: int = 2000) -> float:
    """Distance from ξ to the nearest point of an n x n grid (half-width ``half``) predicted otherwise."""
    axis = np.linspace(-half, half, n)
    best = np.inf
    for rows in np.array_split(np.arange(n), 8):  # 500k points at a time: bounded memory
        x, y = np.meshgrid(axis, axis[rows])
        points = np.stack([x.ravel(), y.ravel()], -1) + xi
        with torch.no_grad():
            other = logits_of_points(torch.from_numpy(points)).numpy().argmax(-1) != predicted
        if other.any():
            best = min(best, float(np.linalg.norm(points[other] - xi, axis=1).min()))
    return best


def test_a_gelu_readout_matches_a_2000_by_2000_grid_search() -> None:
    torch.manual_seed(3)
    readout = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.GELU(), torch.nn.Linear(8, 3)).double()
    xi = torch.randn(6, 2, dtype=torch.float64)
    with torch.no_grad():
        distance, status, predicted, _ = nearest_boundary(
            lambda points: readout(points), xi, directions=64, radius=8.0, tol=1e-9
        )
    assert (status == FOUND).all()
    for b in range(len(xi)):
        d = float(distance[b])
        half = 1.25 * d
        spacing = 2 * half / 1999
        expected = grid_distance(readout, xi[b].numpy(), int(predicted[b]), half)
        # the grid's nearest other-class point lies within one cell diagonal of the true boundary;
        # ours is a boundary point within tol, so never below the truth
        assert expected - spacing * 1.5 <= d <= expected + 1e-9, (b, d, expected, spacing)


def test_a_linear_readout_at_d8_matches_the_closed_form(tmp_path: Path) -> None:
    # tests.models:mlp = Linear(3, 8), Tanh, Linear(8, 4): module "2" reads ξ = tanh(...) in R^8 linearly
    path = write_example_run(tmp_path / "mlp.zarr", steps=2, examples=20)
    result = run("boundary-distance", path, readout="2", directions=64, tol=1e-9, radius=50.0).dataset.load()
    assert result.sizes["component"] == 8
    store = ckptstore.open(path)
    for step in (0, 1):
        w = {k: np.asarray(v, np.float64) for k, v in store.tensors(step).items()}
        xi = np.tanh(store.data("eval")["inputs"].values.astype(np.float64) @ w["0.weight"].T + w["0.bias"])
        np.testing.assert_allclose(result["xi"].sel(step=step).values, xi, rtol=1e-6, atol=1e-7)
        logits = xi @ w["2.weight"].T + w["2.bias"]
        c = logits.argmax(-1)
        np.testing.assert_array_equal(result["predicted"].sel(step=step).values, c)
        weight = w["2.weight"]
        expected = np.array(
            [
                min(
                    (logits[n, c[n]] - logits[n, j]) / np.linalg.norm(weight[c[n]] - weight[j])
                    for j in range(4)
                    if j != c[n]
                )
                for n in range(len(xi))
            ]
        )
        np.testing.assert_allclose(result["distance"].sel(step=step).values, expected, rtol=1e-6, atol=1e-8)
        # a linear module's Jacobian is its weight: ‖W‖₂ at every example
        np.testing.assert_allclose(result["jacobian_norm"].sel(step=step).values, np.linalg.norm(weight, 2), rtol=1e-10)


def test_the_sandbox_distances_and_jacobians_match_brute_force(store: Path) -> None:
    result = run("boundary-distance", store, tol=1e-9, **FAST).dataset.load()
    assert (result["status"].values == FOUND).all()
    source = ckptstore.open(store)
    model = source.model.build().double().eval()
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in source.tensors(8).items()})
    row = result.sel(step=8)
    for example in (0, 40):
        xi = row["xi"].values[example]
        d = float(row["distance"].values[example])
        predicted = int(row["predicted"].values[example])
        with torch.no_grad():
            assert int(model.output_logits(torch.from_numpy(xi)[None]).argmax()) == predicted
        half = 1.25 * d
        expected = grid_distance(model.output_logits, xi, predicted, half)
        assert expected - 1.5 * 2 * half / 1999 <= d <= expected + 1e-9
        jacobian = torch.autograd.functional.jacobian(lambda x: model.mlp(x[None])[0], torch.from_numpy(xi))
        np.testing.assert_allclose(
            float(row["jacobian_norm"].values[example]), float(torch.linalg.svdvals(jacobian)[0]), rtol=1e-10
        )
    np.testing.assert_allclose(
        result["distance_quantile"].sel(quantile=0.5).values, np.median(result["distance"].values, axis=1)
    )


def test_the_declared_readout_function_equals_the_hooked_model(store: Path) -> None:
    # the analyzer evaluates the sandbox through output_logits; any other model by re-running it with
    # the read-out's input swapped by a pre-hook: both must be the same function of ξ
    source = ckptstore.open(store)
    model = source.model.build().double().eval()
    params = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in source.tensors(8).items()}
    inputs = torch.from_numpy(source.data("eval")["inputs"].values[:5])
    points = torch.randn(5, 7, 2, dtype=torch.float64)
    hooked = readout_logits(model, params, model.mlp, inputs)(points)
    declared = declared_logits(model, params, 5)(points)
    torch.testing.assert_close(hooked, declared, rtol=1e-12, atol=1e-12)


def test_no_boundary_within_the_radius_is_nan_with_a_status(store: Path) -> None:
    result = run("boundary-distance", store, radius=1e-7, **FAST).dataset.load()
    assert (result["status"].values == NO_BOUNDARY).all()
    assert np.isnan(result["distance"].values).all() and np.isnan(result["distance_quantile"].values).all()
    assert "no_boundary_within_radius_1e-07" in result["status"].attrs["flag_meanings"]
    assert np.isfinite(result["jacobian_norm"].values).all()


def test_a_zero_radius_or_tolerance_is_refused(store: Path) -> None:
    for options in ({"radius": 0.0}, {"tol": 0.0}):
        with pytest.raises(AnalysisError, match="--radius and --tol must be positive"):
            run("boundary-distance", store, **options)


def test_bad_input_is_one_error_line_and_leaves_the_store(store: Path, tmp_path: Path) -> None:
    mlp_store = write_example_run(tmp_path / "mlp.zarr", steps=2)
    for path, args, expected in (
        (mlp_store, [], "declares no read-out module: pass --readout MODULE"),
        (store, ["--readout", "nothing"], "--readout: the model has no module 'nothing'"),
        (store, ["--readout", "attn"], "--readout 'attn': its input must be one vector ξ per example"),
        (store, ["--split", "test"], "pass --split one of"),
        (mlp_store, ["--readout", "2", "--directions", "8"], "--directions must be at least 2d + 1 = 17"),
    ):
        assert_refused(path, "boundary-distance", args, expected)

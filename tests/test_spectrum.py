"""``spectrum`` and its estimators (:mod:`ckpt.numerics.spectral`) against explicit Hessians.

The estimators run on explicit symmetric matrices (``hvp = H @ v``) where every number has a closed
form; the analyzer runs through the real engine on a real store written by a short training run of
the ``sparse-modular-addition`` sandbox (196 parameters), against the explicit Hessian of the mean
train loss (``torch.autograd.functional.hessian``) and ``torch.linalg.eigvalsh``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers.basis import sample_examples
from ckpt.analyzers.figures.spectrum import smoothed_density
from ckpt.engine.pipeline import run
from ckpt.errors import AnalysisError
from ckpt.numerics.spectral import hutchinson, hutchpp, rademacher, slq
from tests.helpers import assert_refused, sparse_modular_store

pytestmark = [pytest.mark.usefixtures("one_thread")]

SMALL = {"steps": 16, "every": 8, "seed": 0, "train_size": 128, "test_size": 64}
"""Checkpoints at steps 0, 8 and 16; 128 train sequences."""

store = sparse_modular_store("spectrum", SMALL)


def symmetric(dimension: int, rank: int | None = None, seed: int = 0, *, flat: bool = False) -> torch.Tensor:
    """A symmetric float64 matrix with a decaying spectrum of both signs (of ``rank``; evenly spread if ``flat``)."""
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(dimension, dimension, generator=generator, dtype=torch.float64))
    values = torch.linspace(-2, 30, dimension, dtype=torch.float64) ** 3 / 900
    if flat:
        values = torch.linspace(-3, 5, dimension, dtype=torch.float64)
    if rank is not None:
        values[rank:] = 0
    return (basis * values) @ basis.T


SEGMENTS = [slice(0, 7), slice(7, 25), slice(25, 40)]


def diagonal_blocks(matrix: torch.Tensor) -> list[float]:
    return [float(matrix[s, s].trace()) for s in SEGMENTS]


# -- estimators on explicit matrices -------------------------------------------------------------------


@pytest.mark.parametrize("rank", [None, 9])
def test_hutchpp_with_a_sketch_of_every_dimension_is_exact_for_the_trace_and_each_block(rank: int | None) -> None:
    # rank 9: the sketch's columns past the range fall to rounding and are dropped, and it stays exact
    matrix = symmetric(40, rank)
    estimate = hutchpp(lambda v: matrix @ v, 40, 120, segments=SEGMENTS, dtype=torch.float64)
    assert estimate.rank == (40 if rank is None else 9)
    assert estimate.products == 40 + estimate.rank  # no probe: nothing is left outside the sketch
    np.testing.assert_allclose(estimate.block(), (float(matrix.trace()), 0.0), atol=1e-10)
    for index, expected in enumerate(diagonal_blocks(matrix)):
        np.testing.assert_allclose(estimate.block([index])[0], expected, atol=1e-10)
    np.testing.assert_allclose(estimate.block([0, 2])[0], sum(diagonal_blocks(matrix)[::2]), atol=1e-10)


def test_hutchinson_and_hutchpp_are_within_their_standard_errors_and_hutchpp_has_less_error() -> None:
    matrix = symmetric(40)
    off = matrix - torch.diag(torch.diag(matrix))
    for seed in range(3):
        plain = hutchinson(lambda v: matrix @ v, 40, 60, segments=SEGMENTS, seed=seed, dtype=torch.float64)
        sketched = hutchpp(lambda v: matrix @ v, 40, 60, segments=SEGMENTS, seed=seed, dtype=torch.float64)
        for estimate in (plain, sketched):
            trace, stderr = estimate.block()
            assert abs(trace - float(matrix.trace())) < 4 * stderr
            for index, expected in enumerate(diagonal_blocks(matrix)):
                value, error = estimate.block([index])
                assert abs(value - expected) < 4 * error
        # Rademacher: Var(zᵀHz) = 2 Σ_{i≠j} H_ij²; the sample stderr agrees with it to its own noise
        expected = float(torch.sqrt(2 * (off**2).sum() / 60))
        assert 0.6 * expected < plain.block()[1] < 1.5 * expected
        # a decaying spectrum: the sketch holds most of the trace and the residual's error is smaller
        assert sketched.block()[1] < 0.5 * plain.block()[1]


def test_each_slq_run_integrates_polynomials_up_to_degree_2m_minus_1_exactly() -> None:
    matrix = symmetric(40, flat=True)  # no few eigenvalues dominate the high moments
    runs, steps, seed = 3, 6, 5
    nodes = slq(lambda v: matrix @ v, 40, runs, steps, seed=seed, dtype=torch.float64)
    np.testing.assert_allclose(nodes.weights.sum(), 1.0, rtol=1e-12)
    generator = torch.Generator().manual_seed(seed)
    for run_index in range(runs):  # run r starts from the r-th Rademacher vector of the seeded generator
        v = rademacher(40, generator, torch.float64, "cpu") / np.sqrt(40)
        theta, tau = nodes.values[run_index], nodes.weights[run_index] * runs
        for degree in range(2 * steps + 1):
            exact = float(v @ torch.linalg.matrix_power(matrix, degree) @ v)
            quadrature = float((tau * theta**degree).sum())
            if degree <= 2 * steps - 1:  # Gauss quadrature with m nodes: exact up to degree 2m - 1
                np.testing.assert_allclose(quadrature, exact, rtol=1e-9)
            else:  # and not beyond: the test above could fail
                assert abs(quadrature - exact) > 1e-4 * abs(exact)


def test_slq_with_as_many_steps_as_dimensions_gives_the_eigenvalues_and_stops_at_an_invariant_space() -> None:
    matrix = symmetric(12)
    nodes = slq(lambda v: matrix @ v, 12, 2, 50, dtype=torch.float64)
    assert nodes.values.shape == (2, 12)  # steps above D are D
    np.testing.assert_allclose(nodes.values[0], torch.linalg.eigvalsh(matrix).numpy(), rtol=1e-8, atol=1e-10)
    # three distinct eigenvalues: the Krylov space is invariant after three steps
    low = torch.diag(torch.tensor([1.0, 1.0, 2.0, 2.0, 5.0, 5.0], dtype=torch.float64))
    nodes = slq(lambda v: low @ v, 6, 1, 6, dtype=torch.float64)
    np.testing.assert_allclose(nodes.values[0, :3], [1.0, 2.0, 5.0], rtol=1e-10)
    assert np.isnan(nodes.values[0, 3:]).all() and (nodes.weights[0, 3:] == 0).all()
    np.testing.assert_allclose(nodes.weights[0, :3], [1 / 3, 1 / 3, 1 / 3], rtol=1e-10)  # ±1 start: equal mass


def test_vectors_spilled_to_a_file_give_the_same_numbers() -> None:
    matrix = symmetric(40)
    for spill in (False, True):
        sketched = hutchpp(lambda v: matrix @ v, 40, 30, segments=SEGMENTS, dtype=torch.float64, spill=spill)
        nodes = slq(lambda v: matrix @ v, 40, 2, 8, dtype=torch.float64, spill=spill)
        if not spill:
            expected = (sketched.exact, sketched.samples, nodes.values, nodes.weights)
    for got, want in zip((sketched.exact, sketched.samples, nodes.values, nodes.weights), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_non_finite_product_is_a_named_error() -> None:
    def broken(v: torch.Tensor) -> torch.Tensor:
        return torch.full_like(v, float("nan"))

    for estimate in (
        lambda: hutchinson(broken, 5, 3),
        lambda: hutchpp(broken, 5, 6),
        lambda: slq(broken, 5, 1, 3),
    ):
        with pytest.raises(AnalysisError, match="Hessian-vector product is not finite"):
            estimate()


def test_the_smoothed_density_integrates_to_the_weights() -> None:
    grid = np.linspace(-5, 15, 4001)
    density = smoothed_density(np.array([[0.0, 10.0, np.nan]]), np.array([[0.25, 0.75, 0.0]]), grid, 0.5)
    np.testing.assert_allclose(np.trapezoid(density, grid), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.trapezoid(density[grid < 5], grid[grid < 5]), 0.25, rtol=1e-6)


# -- the analyzer on a real store -----------------------------------------------------------------------


def explicit_hessian(
    path: Path, step: int, rows: np.ndarray | None = None
) -> tuple[torch.Tensor, list[str], list[int]]:
    """The Hessian of the mean train loss (over ``rows``, default all) over every parameter, float64, with the
    tensors' names and sizes."""
    opened = ckptstore.open(path)
    model = opened.model.build().double()
    params = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in opened.tensors(step).items()}
    names = list(opened.tensor_names)
    data = opened.data("train")
    inputs, targets = (torch.from_numpy(data[key].values) for key in ("inputs", "targets"))
    if rows is not None:
        inputs, targets = inputs[rows], targets[rows]
    shapes, sizes = [params[n].shape for n in names], [params[n].numel() for n in names]

    def loss(flat: torch.Tensor) -> torch.Tensor:
        tensors = {n: part.reshape(s) for n, part, s in zip(names, flat.split(sizes), shapes, strict=True)}
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, tensors, (inputs,)), targets)

    flat = torch.cat([params[n].reshape(-1) for n in names])
    return torch.autograd.functional.hessian(loss, flat), names, sizes


def test_spectrum_against_the_explicit_hessian(store: Path) -> None:
    # every train example (--samples above the split's 128), float64
    result = run("spectrum", store, samples=1000, dtype="float64", method="hutchinson", probes=40).dataset.load()
    assert result["module"].values.tolist() == ["embed", "pos", "attn", "mlp"]
    assert result["trace"].attrs["method"] == "hutchinson"
    runs = result.sizes["slq_run"]
    for step in (0, 16):
        hessian, names, sizes = explicit_hessian(store, step)
        row = result.sel(step=step)
        dimension = hessian.shape[0]
        trace = float(hessian.trace())
        assert abs(float(row["trace"]) - trace) < 4 * float(row["trace_stderr"])
        np.testing.assert_allclose(float(np.nanmean(row["probe_trace"])), float(row["trace"]), rtol=1e-12)
        ends = np.cumsum([0, *sizes])
        for module in ("attn", "mlp"):
            owned = [i for i, n in enumerate(names) if n.startswith(module + ".")]
            coords = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in owned])
            block = float(hessian[coords][:, coords].trace())
            cell = row.sel(module=module)
            assert abs(float(cell["block_trace"]) - block) < 4 * float(cell["block_trace_stderr"]) + 1e-12
        # SLQ: Σ w θ^k estimates tr(H^k)/D within the runs' Monte Carlo error, which for a Rademacher start is
        # Var(zᵀBz)/D² = 2 Σ_{i≠j} B_ij² / D² per run (B = H^k); k <= 2·nodes - 1, so the quadrature is exact
        values, weights = row["ritz_values"].values, row["ritz_weights"].values
        np.testing.assert_allclose(np.nansum(weights), 1.0, rtol=1e-12)
        for degree in (1, 2, 3):
            power = torch.linalg.matrix_power(hessian, degree)
            off = power - torch.diag(torch.diag(power))
            error = float(torch.sqrt(2 * (off**2).sum())) / dimension / np.sqrt(runs)
            moment = float(np.nansum(weights * values**degree))
            assert abs(moment - float(power.trace()) / dimension) < 4 * error
        # the extreme Ritz values converge first: those of 32 steps are the extreme eigenvalues
        eigenvalues = torch.linalg.eigvalsh(hessian).numpy()
        np.testing.assert_allclose(np.nanmax(values), eigenvalues[-1], rtol=1e-6)
        np.testing.assert_allclose(np.nanmin(values), eigenvalues[0], rtol=1e-3, atol=1e-6)


def test_hutchpp_block_density_and_the_figures(store: Path, tmp_path: Path) -> None:
    # probes 3·D: the sketch spans the Hessian's range and Hutch++ is exact, the blocks too; 16 examples of the
    # 128, as the analyzer draws them, keep the 3 × 2D products quick
    options = {"samples": 16, "dtype": "float64", "probes": 588, "slq_runs": 1, "slq_steps": 6}
    result = run("spectrum", store, modules="attn,mlp.fc2", block_density=True, **options).dataset.load()
    assert result["trace"].attrs["method"] == "hutch++"
    assert result["module"].values.tolist() == ["attn", "mlp.fc2"]
    hessian, names, sizes = explicit_hessian(store, 8, sample_examples(128, 16, 0))
    row = result.sel(step=8)
    np.testing.assert_allclose(float(row["trace"]), float(hessian.trace()), rtol=1e-9)
    ends = np.cumsum([0, *sizes])
    for module in ("attn", "mlp.fc2"):
        owned = [i for i, n in enumerate(names) if n.startswith(module + ".")]
        coords = np.concatenate([np.arange(ends[i], ends[i + 1]) for i in owned])
        block = hessian[coords][:, coords]
        np.testing.assert_allclose(float(row["block_trace"].sel(module=module)), float(block.trace()), rtol=1e-9)
        # the block's density: 6 steps on the 6 attention parameters are its whole spectrum
        values = row["block_ritz_values"].sel(module=module).values
        weights = row["block_ritz_weights"].sel(module=module).values
        np.testing.assert_allclose(np.nansum(weights), 1.0, rtol=1e-12)
        np.testing.assert_allclose(np.nanmax(values), float(torch.linalg.eigvalsh(block)[-1]), rtol=1e-6)
        if module == "attn":
            np.testing.assert_allclose(np.sort(values[0]), torch.linalg.eigvalsh(block).numpy(), atol=1e-8)
    from ckpt.analyzers.spectrum import Spectrum

    figures = Spectrum().plot(result, ckptstore.open(store))
    assert sorted(figures) == ["density", "trace"]
    for name, figure in figures.items():
        figure.savefig(tmp_path / f"{name}.png")


def test_spectrum_bad_input_is_one_error_line_and_leaves_the_store(store: Path) -> None:
    for args, expected in (
        (["--modules", "nothing"], "--modules pattern 'nothing' matches no module"),
        (["--max-memory", "1KiB"], "raise --max-memory"),
        (["--probes", "4"], "hutch++ needs at least 6"),
    ):
        assert_refused(store, "spectrum", ["--samples", "8", *args], expected)


def test_a_lone_top_level_module_is_split_into_its_children() -> None:
    from ckpt.analyzers.spectrum import spectrum_blocks
    from ckpt.numerics.params import ParamSpace

    class Wrapped(torch.nn.Module):  # as a Hugging Face LM: one child owns every parameter
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    model = Wrapped()
    named = dict(model.named_parameters())
    space = ParamSpace(tuple(named), tuple(tuple(p.shape) for p in named.values()))
    blocks = spectrum_blocks(model, space, None)
    assert [(name, block.size) for name, block in blocks] == [("inner.0", 16), ("inner.2", 10)]
    assert [name for name, _ in spectrum_blocks(model, space, "inner")] == ["inner"]  # --modules as given

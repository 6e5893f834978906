"""POLCA, the Hessian basis, Fisher and LCA against brute-force computations on a tiny model.

Brute force = a loop of ``torch.autograd.grad`` per example (per-example
gradients), explicit per-example Hessians from
``torch.autograd.functional.hessian`` and ``torch.linalg.eigh``; the analyzers
run through the real engine on a real store written by a real training run.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from torch.nn.attention import SDPBackend, sdpa_kernel

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.engine.worker import clear_cache
from ckpt.numerics.compiled import directional_derivatives
from ckpt.numerics.derivatives import BlockLoss, MeanLossHessian, hessian_vector_product
from ckpt.plugins import (
    CROSS_ENTROPY,
    PER_RUN,
    AnalysisContext,
    Analyzer,
    basis_dims,
    hookimpl,
    load_registry,
    parameter_space,
)
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest
from tests.models import mlp

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

EXAMPLES = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-checkpoint training run of the tiny MLP (68 parameters, 12 examples)."""
    return write_example_run(tmp_path_factory.mktemp("polca") / "mlp.zarr", steps=4, examples=EXAMPLES)


@pytest.fixture
def store(run_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the run (analyses write into the store)."""
    path = tmp_path / "mlp.zarr"
    shutil.copytree(run_dir, path)
    yield path
    clear_cache()


# --------------------------------------------------------------------------- brute force


def flat_params(path: Path, step: int) -> tuple[torch.Tensor, list[str], list[torch.Size]]:
    """θ at ``step`` as one float64 vector, with the tensor names and shapes."""
    opened = ckptstore.open(path)
    space = parameter_space(opened)
    tensors = opened.tensors(step, list(space.names))
    flat = torch.cat([torch.from_numpy(tensors[n]).double().reshape(-1) for n in space.names])
    return flat, list(space.names), [torch.Size(s) for s in space.shapes]


def example_loss(path: Path) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``loss(θ_flat, i)``: the cross-entropy of example i, computed directly (no ckpt code)."""
    data = ckptstore.open(path).data("eval")
    inputs = torch.from_numpy(data["inputs"].values).double()
    targets = torch.from_numpy(data["targets"].values).long()
    model = mlp().double()
    _, names, shapes = flat_params(path, 0)

    def loss(theta: torch.Tensor, i: int) -> torch.Tensor:
        params, start = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            params[name] = theta[start : start + shape.numel()].view(shape)
            start += shape.numel()
        logits = torch.func.functional_call(model, params, (inputs[i : i + 1],))
        return torch.nn.functional.cross_entropy(logits, targets[i : i + 1])

    return loss


def per_example_gradients(path: Path, theta: torch.Tensor) -> torch.Tensor:
    """``[examples, D]``: one ``torch.autograd.grad`` call per example."""
    loss = example_loss(path)
    rows = []
    for i in range(EXAMPLES):
        point = theta.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(loss(point, i), point)
        rows.append(gradient)
    return torch.stack(rows)


def per_example_hessians(path: Path, theta: torch.Tensor) -> torch.Tensor:
    """``[examples, D, D]``: explicit Hessians."""
    loss = example_loss(path)
    return torch.stack([torch.autograd.functional.hessian(lambda t, i=i: loss(t, i), theta) for i in range(EXAMPLES)])


def basis_matrix(result: xr.Dataset, names: list[str]) -> torch.Tensor:
    """``[K, D]`` float64 rows of a stored basis."""
    return torch.cat(
        [torch.from_numpy(result[n].values).double().reshape(result.sizes["basis"], -1) for n in names], dim=1
    )


# --------------------------------------------------------------------------- POLCA


def test_polca_matches_per_example_gradients_and_explicit_hessians(store: Path) -> None:
    """First order to 1e-5 against an autograd loop; exact second order equals bᵀ H(x) b ⟨Δ,b⟩²/2."""
    result = ckpt.analyze("polca", store, second_order="exact", dtype="float64", k=2).load()
    basis = ckptstore.open(store).analysis("hessian-basis").load()
    steps = [int(s) for s in ckptstore.open(store).steps]
    assert result["step"].values.tolist() == steps[:-1]
    for index, (step, following) in enumerate(itertools.pairwise(steps)):
        theta, names, _ = flat_params(store, step)
        delta = flat_params(store, following)[0] - theta
        b = basis_matrix(basis, names)
        gradients = per_example_gradients(store, theta)
        hessians = per_example_hessians(store, theta)
        projection = b @ delta
        expected_first = (gradients @ b.T).T * projection[:, None]
        curvature = torch.einsum("kd,xde,ke->kx", b, hessians, b)
        expected_second = 0.5 * curvature * projection[:, None] ** 2
        np.testing.assert_allclose(result["first_order"][index].values, expected_first.numpy(), rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(result["second_order"][index].values, expected_second.numpy(), rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(result["step_projection"][index].values, projection.numpy(), rtol=1e-9)


def test_paper_second_order_matches_its_formula(store: Path) -> None:
    """(λ_t(X,b)/2)⟨Δ,b⟩² ⟨g_t+1(x) - g_t(x), b⟩ / ⟨g_t+1(X) - g_t(X), b⟩, brute force."""
    result = ckpt.analyze("polca", store, dtype="float64", k=2).load()
    basis = ckptstore.open(store).analysis("hessian-basis").load()
    steps = [int(s) for s in ckptstore.open(store).steps]
    theta, names, _ = flat_params(store, steps[1])
    after = flat_params(store, steps[2])[0]
    b = basis_matrix(basis, names)
    projection = b @ (after - theta)
    change = (per_example_gradients(store, after) - per_example_gradients(store, theta)) @ b.T  # [X, K]
    mean_hessian = per_example_hessians(store, theta).mean(0)
    curvature = torch.einsum("kd,de,ke->k", b, mean_hessian, b)
    expected = (curvature / 2 * projection**2)[:, None] * (change / change.mean(0)).T
    np.testing.assert_allclose(result["second_order"][1].values, expected.numpy(), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(result["curvature"][1].values, curvature.numpy(), rtol=1e-5)


def test_the_curvature_is_skipped_only_where_no_pair_starts(store: Path) -> None:
    """The run's last checkpoint gets the first-order pass alone; its loss and slopes are unchanged."""
    from ckpt.analyzers.polca import checkpoint_terms
    from ckpt.engine.worker import TaskSpec, worker_for

    ckpt.analyze("polca", store, second_order="exact", dtype="float64", k=2)
    basis = ckptstore.open(store).analysis("hessian-basis").load()
    last = int(ckpt.open(store).steps[-1])
    options = {
        "examples": slice(0, EXAMPLES),
        "basis": "hessian-basis",
        "created": basis.attrs["ckpt"]["created"],
        "split": "eval",
        "objective": None,
        "order": 2,
        "batch_size": 5,
        "basis_batch": 2,
        "dtype": "float64",
    }
    worker = worker_for(TaskSpec(str(store)))
    full = checkpoint_terms(worker, last, **options)
    reduced = checkpoint_terms(worker, last, first_order_at=(last,), **options)
    assert np.abs(full["second"]).max() > 0
    assert not reduced["second"].any()
    np.testing.assert_array_equal(reduced["first"], full["first"])
    np.testing.assert_array_equal(reduced["loss"], full["loss"])


def test_complete_basis_first_order_sums_to_the_gradient_step(store: Path) -> None:
    """With K = D orthonormal vectors, Σ_b first-order POLCA = ⟨∇ℓ(x), Δθ⟩ for every datapoint."""
    dimension = parameter_space(ckpt.open(store)).size
    result = ckpt.analyze("polca", store, basis="random-basis", vectors=dimension, second_order="none", dtype="float64")
    steps = [int(s) for s in ckptstore.open(store).steps]
    theta = flat_params(store, steps[0])[0]
    delta = flat_params(store, steps[1])[0] - theta
    expected = per_example_gradients(store, theta) @ delta
    np.testing.assert_allclose(result["polca"][0].sum("basis").values, expected.numpy(), rtol=1e-5, atol=1e-10)
    np.testing.assert_allclose(result["second_order"].values, 0.0)


class DeltaBasis(Analyzer):
    """A plugin basis: the one unit vector along θ_last - θ_first (spans the step of a 2-checkpoint run)."""

    name = "delta-basis"
    per = PER_RUN

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        import dask.array as da

        space = parameter_space(ctx.store)
        first, last = (ctx.store.tensors(int(s), list(space.names)) for s in (ctx.store.steps[0], ctx.store.steps[-1]))
        delta = np.concatenate([(last[n].astype(np.float64) - first[n]).reshape(-1) for n in space.names])
        delta /= np.linalg.norm(delta)
        variables = {
            name: (basis_dims(name, len(shape)), da.from_array(delta[None, start : start + size].reshape(1, *shape)))
            for name, shape, start, size in zip(space.names, space.shapes, space.offsets, space.sizes, strict=True)
        }
        return xr.Dataset(variables, coords={"found_at_step": ("basis", [int(ctx.store.steps[0])])})


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register the test basis."""
    register(DeltaBasis)


def small_step_run(path: Path, lr: float) -> Path:
    """Two checkpoints one SGD step of size ``lr`` apart."""
    with ckptstore.create(path, model="tests.models:mlp", config={}, objective="cross-entropy") as writer:
        torch.manual_seed(3)
        model = mlp()
        inputs, targets = torch.randn(EXAMPLES, 3), torch.randint(0, 4, (EXAMPLES,))
        writer.add_data("eval", inputs=inputs, targets=targets)
        writer.write(0, model)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        writer.write(1, model)
    return path


def test_loss_change_is_explained_when_the_basis_spans_the_step(tmp_path: Path) -> None:
    """loss change = Σ_b POLCA + unexplained; unexplained is third order when b spans Δθ, small for a complete basis."""
    registry = load_registry(extra=[__import__(__name__, fromlist=["DeltaBasis"])])
    unexplained_share = []
    for lr in (0.1, 0.05):
        path = small_step_run(tmp_path / f"run-{lr}.zarr", lr)
        result = ckpt.analyze(
            "polca", path, basis="delta-basis", second_order="exact", dtype="float64", registry=registry
        )
        change = result["loss_change"][0].values
        explained = result["polca"][0].sum("basis").values
        np.testing.assert_allclose(change, explained + result["unexplained"][0].values, rtol=1e-12, atol=1e-15)
        unexplained_share.append(np.abs(result["unexplained"][0].values).max() / np.abs(change).max())
        clear_cache()
    # third order in the step: halving the step divides the unexplained share by about 4 (Δ³ / Δ)
    assert unexplained_share[0] < 1e-3
    assert unexplained_share[1] < unexplained_share[0] / 3
    path = small_step_run(tmp_path / "complete.zarr", 0.01)
    dimension = parameter_space(ckpt.open(path)).size
    result = ckpt.analyze("polca", path, basis="random-basis", vectors=dimension, second_order="exact", dtype="float64")
    share = np.abs(result["unexplained"][0].values).max() / np.abs(result["loss_change"][0].values).max()
    assert share < 1e-2


# --------------------------------------------------------------------------- Hessian basis


def explicit_mean_hessian(path: Path, step: int) -> torch.Tensor:
    """The Hessian of the mean loss over the 12 examples, explicitly."""
    theta = flat_params(path, step)[0]
    loss = example_loss(path)
    return torch.autograd.functional.hessian(lambda t: sum(loss(t, i) for i in range(EXAMPLES)) / EXAMPLES, theta)


def test_hessian_basis_matches_eigh_of_the_projected_explicit_hessian(store: Path) -> None:
    """Top eigenvalues to 1e-4, overlaps > 0.999, each vector orthogonal to the earlier ones."""
    result = ckpt.analyze("hessian-basis", store, at_steps="1,2", k=2, dtype="float64").load()
    names = list(parameter_space(ckpt.open(store)).names)
    vectors = basis_matrix(result, names)
    assert result["found_at_step"].values.tolist() == [1, 1, 2, 2]
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(4), atol=1e-6)
    earlier = torch.zeros(0, vectors.shape[1], dtype=torch.float64)
    for step, rows in ((1, slice(0, 2)), (2, slice(2, 4))):
        projector = torch.eye(vectors.shape[1], dtype=torch.float64) - earlier.T @ earlier
        values, eigenvectors = torch.linalg.eigh(projector @ explicit_mean_hessian(store, step) @ projector)
        top_values, top_vectors = values.flip(0)[:2], eigenvectors.flip(1)[:, :2].T
        np.testing.assert_allclose(result["eigenvalue"].values[rows], top_values.numpy(), rtol=1e-4)
        overlaps = (vectors[rows] * top_vectors).sum(1).abs()
        assert (overlaps > 0.999).all(), overlaps
        assert (result["residual"].values[rows] < 1e-5 * top_values.abs().max().item()).all()
        earlier = torch.cat([earlier, vectors[rows]])


def test_a_shuffled_hessian_basis_follows_algorithm_1_in_the_seeded_order(store: Path) -> None:
    """--order shuffled: the same checkpoints, each deflated against those visited before it (App. E)."""
    steps = [int(s) for s in ckpt.open(store).steps]
    result = ckpt.analyze("hessian-basis", store, order="shuffled", seed=3, dtype="float64").load()
    visited = [int(s) for s in np.random.default_rng(3).permutation(steps)]
    assert visited != sorted(visited), "the seed must give an order other than the chronological one"
    assert result["found_at_step"].values.tolist() == visited
    names = list(parameter_space(ckpt.open(store)).names)
    vectors = basis_matrix(result, names)
    earlier = torch.zeros(0, vectors.shape[1], dtype=torch.float64)
    for row, step in enumerate(visited):
        projector = torch.eye(vectors.shape[1], dtype=torch.float64) - earlier.T @ earlier
        values, eigenvectors = torch.linalg.eigh(projector @ explicit_mean_hessian(store, step) @ projector)
        np.testing.assert_allclose(result["eigenvalue"].values[row], values[-1].item(), rtol=1e-4)
        assert abs(float(vectors[row] @ eigenvectors[:, -1])) > 0.999
        earlier = torch.cat([earlier, vectors[row : row + 1]])
    assert run_ckpt("analyze", "hessian-basis", str(store), "--order", "sideways").stderr.startswith("Error:")


def test_random_basis_is_orthonormal_and_seeded(store: Path) -> None:
    """Same seed, same vectors; rows orthonormal; as many as the Hessian schedule gives."""
    first = ckpt.analyze("random-basis", store, every=2, k=3).load()
    names = list(parameter_space(ckpt.open(store)).names)
    vectors = basis_matrix(first, names)
    assert first["found_at_step"].values.tolist() == [0, 0, 0, 2, 2, 2]
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(6), atol=1e-6)
    again = ckpt.analyze("random-basis", store, every=2, k=3, force=True).load()
    np.testing.assert_array_equal(basis_matrix(again, names).numpy(), vectors.numpy())


def test_random_basis_by_blocks_is_the_qr_of_its_gaussian() -> None:
    """Cholesky QR over blocks of coordinates gives Householder QR's Q (positive diagonal) of the same Gaussian."""
    from ckpt.analyzers.random_basis import gaussian_block, orthonormal_rows

    for count, size in ((7, 3000), (5, 8), (3, 1)):  # tall (blocks), nearly square (Householder), one coordinate
        count = min(count, size)
        got = orthonormal_rows(None, count, size, seed=4, block_rows=512)["vectors"]
        gaussian = np.concatenate(
            [gaussian_block(4, i, min(512, size - start), count) for i, start in enumerate(range(0, size, 512))]
        )
        q, r = np.linalg.qr(gaussian)
        np.testing.assert_allclose(got, (q * np.sign(np.diag(r))).T, atol=2e-7)
        rows = got.astype(np.float64)
        np.testing.assert_allclose(rows @ rows.T, np.eye(count), atol=1e-6)
    split = orthonormal_rows(None, 3, 3000, seed=4, block_rows=512)["vectors"]
    assert not np.array_equal(split, orthonormal_rows(None, 3, 3000, seed=5, block_rows=512)["vectors"])


def test_random_basis_larger_than_the_budget_is_one_error_line(store: Path) -> None:
    done = run_ckpt("analyze", "random-basis", str(store), "--vectors", "60", "--max-memory", "10KiB")
    assert done.returncode == 1 and done.stderr.startswith("Error: random-basis needs 79.7 KiB for 60 vectors")
    assert "--max-memory" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "random-basis" not in ckptstore.open(store).analyses


# --------------------------------------------------------------------------- baselines


def test_fisher_is_the_squared_projected_gradient(store: Path) -> None:
    """⟨b, ∇ℓ(x)⟩² at every checkpoint, against the autograd loop."""
    result = ckpt.analyze("fisher", store, every=2, dtype="float64").load()
    basis = ckptstore.open(store).analysis("hessian-basis").load()
    for index, step in enumerate(int(s) for s in result["step"].values):
        theta, names, _ = flat_params(store, step)
        expected = ((per_example_gradients(store, theta) @ basis_matrix(basis, names).T) ** 2).T
        np.testing.assert_allclose(result["fisher"][index].values, expected.numpy(), rtol=1e-5, atol=1e-14)


def test_lca_first_order_and_path_integral(store: Path) -> None:
    """LCA of the largest parameters: gradient x step, and Simpson's rule along the straight path."""
    result = ckpt.analyze("lca", store, parameters=5, dtype="float64").load()
    steps = [int(s) for s in ckptstore.open(store).steps]
    final = flat_params(store, steps[-1])[0]
    selected = torch.argsort(final.abs(), descending=True)[:5].sort().values
    theta, names, _ = flat_params(store, steps[0])
    after = flat_params(store, steps[1])[0]
    delta = (after - theta)[selected]
    points = {"start": theta, "middle": (theta + after) / 2, "end": after}
    gradients = {key: per_example_gradients(store, point)[:, selected] for key, point in points.items()}
    first = (gradients["start"] * delta).T
    simpson = ((gradients["start"] + 4 * gradients["middle"] + gradients["end"]) / 6 * delta).T
    np.testing.assert_allclose(result["first_order"][0].values, first.numpy(), rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(result["lca"][0].values, simpson.numpy(), rtol=1e-5, atol=1e-12)
    owners = [
        (name, index)
        for name, shape in zip(names, flat_params(store, 0)[2], strict=True)
        for index in range(shape.numel())
    ]
    assert [(str(t), int(i)) for t, i in zip(result["tensor"].values, result["index"].values, strict=True)] == [
        owners[i] for i in selected.tolist()
    ]
    np.testing.assert_allclose(result["final_magnitude"].values, final.abs()[selected].numpy(), rtol=1e-6)


# --------------------------------------------------------------------------- engine behaviour


def test_polca_is_identical_on_threads_processes_and_a_distributed_cluster(store: Path, tmp_path: Path) -> None:
    """The same numbers (1e-6) whatever runs the graph."""
    expected = ckpt.analyze("polca", store, every=2, scheduler="sync").load()
    results = {}
    for label, engine in {
        "threads": {"scheduler": "threads"},
        "processes": {"scheduler": "processes", "workers": 2},
        "cluster": {"workers": 2},
    }.items():
        copy = tmp_path / f"{label}.zarr"
        shutil.copytree(store, copy)
        results[label] = ckpt.analyze("polca", copy, every=2, force=True, **engine).load()
        clear_cache()
    for label, result in results.items():
        for name in ("polca", "projected_loss", "unexplained"):
            np.testing.assert_allclose(result[name].values, expected[name].values, rtol=1e-6, atol=1e-9, err_msg=label)


def test_projected_loss_continues_across_blocks_and_new_checkpoints(store: Path, tmp_path: Path) -> None:
    """Running sums are the same computed in one block, in blocks of one step, or after the run grew."""
    whole = ckpt.analyze("polca", store, at_steps="0", force=True).load()
    np.testing.assert_allclose(whole["projected_loss"].values, np.cumsum(whole["polca"].values, axis=0), rtol=1e-12)
    blocks = ckpt.analyze("polca", store, at_steps="0", force=True, block_steps=1).load()
    np.testing.assert_allclose(blocks["projected_loss"].values, whole["projected_loss"].values, rtol=1e-12)
    grown = tmp_path / "grown.zarr"
    write_example_run(grown, steps=3, examples=EXAMPLES)
    first = ckpt.analyze("polca", grown, at_steps="0").load()
    assert first.sizes["step"] == 2
    clear_cache()
    shutil.rmtree(grown)
    write_example_run(grown, steps=4, examples=EXAMPLES)  # the same run, one checkpoint longer
    report = run("polca", grown, at_steps="0")
    assert report.dataset.sizes["step"] == 3
    np.testing.assert_allclose(report.dataset["projected_loss"].values, whole["projected_loss"].values, rtol=1e-6)


def test_cli_polca_computes_the_basis_first_and_rejects_bad_input(store: Path) -> None:
    """`ckpt analyze polca STORE` runs hessian-basis, then POLCA; mistakes are one Error: line, store unchanged."""
    before = tree_digest(store)
    for args, words in (
        (["--at-steps", "7"], "--at-steps 7 is not a checkpoint step"),
        (["--every", "0"], "'--every': 0 is not in the range x>=1"),
        (["--basis", "nosuch"], "nosuch"),
        (["--dtype", "float16"], "float16"),
    ):
        done = run_ckpt("analyze", "polca", str(store), *args, "--no-progress")
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr
        assert words in done.stderr, done.stderr
        assert tree_digest(store) == before
    done = invoke_ckpt("analyze", "polca", str(store), "--every", "2", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "hessian-basis: computed" in done.stdout
    assert "polca: computed 3 step(s)" in done.stdout
    shown = invoke_ckpt("show", str(store), "polca")
    assert shown.returncode == 0 and "explained by the basis" in shown.stdout
    shown = invoke_ckpt("show", str(store), "hessian-basis")
    assert shown.returncode == 0 and "eigenvalue" in shown.stdout


def _model_with(layer: str) -> torch.nn.Module:
    """Linear(3, 8) -> ``layer`` -> tanh -> Linear(8, 4), in float64, in eval mode."""
    layers = {
        "layer-norm": [torch.nn.LayerNorm(8)],
        # each example's statistics over 4 positions of 2 channels
        "instance-norm": [torch.nn.Unflatten(1, (2, 4)), torch.nn.InstanceNorm1d(2, affine=True), torch.nn.Flatten()],
        # batch statistics even in eval mode
        "batch-norm": [torch.nn.BatchNorm1d(8, track_running_stats=False)],
        # torch's own attention block: fused kernels and fast paths without forward-mode rules
        "torch-attention": [
            torch.nn.Unflatten(1, (2, 4)),
            torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True),
            torch.nn.Flatten(),
        ],
    }[layer]
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), *layers, torch.nn.Tanh(), torch.nn.Linear(8, 4))
    with torch.no_grad():  # affine parameters away from (1, 0), so that they matter
        for layer in model:
            if getattr(layer, "weight", None) is not None and not isinstance(layer, torch.nn.Linear):
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.5, 0.5)
    return model.double().eval()


class _BranchOnData(torch.nn.Module):
    """tanh where the inputs sum above zero, else sin: Python control flow on data values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(inputs)
        return hidden.tanh() if float(inputs.sum()) > 0 else hidden.sin()


def test_compiled_directional_derivatives_equal_explicit_hessians_and_never_freeze_a_branch() -> None:
    """--compile's traced and compiled JVP pass against explicit Hessians; a model branching on data runs eagerly."""
    torch.manual_seed(0)
    model = _model_with("layer-norm")
    inputs, targets = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 4, (6,))
    block = BlockLoss(model, CROSS_ENTROPY.losses, {"fixed": {}, "inputs": inputs, "targets": targets, "mask": None})
    primal = {name: p.detach() for name, p in model.named_parameters()}
    directions = {name: torch.randn(2, *p.shape, dtype=torch.float64) for name, p in primal.items()}
    flat = torch.cat([p.reshape(-1) for p in primal.values()])
    flat_directions = torch.cat([d.reshape(2, -1) for d in directions.values()], dim=1)
    sizes = [p.numel() for p in primal.values()]

    def loss_of(v: torch.Tensor, i: int) -> torch.Tensor:
        parts = torch.split(v, sizes)
        return block({name: part.view(p.shape) for (name, p), part in zip(primal.items(), parts, strict=True)})[i]

    for call in range(3):  # compiling and checking, checked once more, then the program alone
        shifted = {name: t + 0.1 * call for name, t in primal.items()}
        point = torch.cat([t.reshape(-1) for t in shifted.values()])
        loss, first, second = directional_derivatives(block, shifted, directions, order=2, compiled=True)
        for i in range(len(targets)):
            hessian = torch.autograd.functional.hessian(lambda v, i=i: loss_of(v, i), point)
            gradient = torch.autograd.functional.jacobian(lambda v, i=i: loss_of(v, i), point)
            np.testing.assert_allclose(float(loss[i]), float(loss_of(point, i)), rtol=1e-10)
            for k in range(2):
                b = flat_directions[k]
                np.testing.assert_allclose(float(second[k, i]), float(b @ hessian @ b), rtol=1e-9)
                np.testing.assert_allclose(float(first[k, i]), float(gradient @ b), rtol=1e-9)
    assert flat.shape[0] == sum(sizes)

    # a branch on the data's values: not traced (it would freeze tanh), so data summing below zero get sin
    branching = _BranchOnData()
    params = {name: p.detach() for name, p in branching.named_parameters()}
    tangents = {name: torch.randn(1, *p.shape, dtype=torch.float64) for name, p in params.items()}
    positive, negative = torch.ones(4, 3, dtype=torch.float64), -torch.ones(4, 3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3])

    def block_of(x: torch.Tensor) -> BlockLoss:
        return BlockLoss(branching, CROSS_ENTROPY.losses, {"fixed": {}, "inputs": x, "targets": labels, "mask": None})

    with pytest.warns(UserWarning, match=r"compiled JVP pass is not used, the model cannot be traced \(RuntimeError"):
        directional_derivatives(block_of(positive), params, tangents, order=1, compiled=True)
    loss, first, _ = directional_derivatives(block_of(negative), params, tangents, order=1, compiled=True)
    eager_loss, eager_first, _ = directional_derivatives(block_of(negative), params, tangents, order=1)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=0)
    torch.testing.assert_close(first, eager_first, rtol=0, atol=0)


@pytest.mark.parametrize("layer", ["layer-norm", "instance-norm", "batch-norm", "torch-attention"])
def test_directional_derivatives_and_hvps_through_norms_and_attention_equal_explicit_hessians(layer: str) -> None:
    """⟨g(x), b⟩, bᵀ H(x) b and H(X) v through norms and torch's attention, against explicit Hessians.

    torch's own forward-mode rules of layer, instance and batch-statistics norms are
    wrong under forward-over-forward (7-112% off), and its fused attention has none:
    without ckpt.numerics.derivatives.forward_mode this test fails for all four.
    """
    torch.manual_seed(0)
    model = _model_with(layer)
    inputs, targets = torch.randn(6, 3, dtype=torch.float64), torch.randint(0, 4, (6,))
    primal = {name: p.detach() for name, p in model.named_parameters()}

    def losses(params):
        logits = torch.func.functional_call(model, params, (inputs,))
        return torch.nn.functional.cross_entropy(logits, targets, reduction="none")

    directions = {name: torch.randn(2, *p.shape, dtype=torch.float64) for name, p in primal.items()}
    _, first, second = directional_derivatives(losses, primal, directions, order=2)
    _, first_only, _ = directional_derivatives(losses, primal, directions, order=1)

    sizes = [p.numel() for p in primal.values()]

    def unflatten(flat):
        parts = torch.split(flat, sizes)
        return {name: part.view(p.shape) for (name, p), part in zip(primal.items(), parts, strict=True)}

    flat = torch.cat([p.reshape(-1) for p in primal.values()])
    flat_directions = torch.cat([d.reshape(2, -1) for d in directions.values()], dim=1)
    mean_hessian = torch.zeros(len(flat), len(flat), dtype=torch.float64)
    for i in range(len(targets)):
        # brute force by reverse over reverse, through attention's math kernel (the fused one has no double backward)
        with sdpa_kernel(SDPBackend.MATH):
            hessian = torch.autograd.functional.hessian(lambda v, i=i: losses(unflatten(v))[i], flat)
            gradient = torch.autograd.functional.jacobian(lambda v, i=i: losses(unflatten(v))[i], flat)
        mean_hessian += hessian / len(targets)
        for k in range(2):
            b = flat_directions[k]
            np.testing.assert_allclose(float(second[k, i]), float(b @ hessian @ b), rtol=1e-10)
            np.testing.assert_allclose(float(first[k, i]), float(gradient @ b), rtol=1e-10)
            np.testing.assert_allclose(float(first_only[k, i]), float(gradient @ b), rtol=1e-10)
    hv = hessian_vector_product([(losses, 1.0 / len(targets))], primal, unflatten(flat_directions[0]))
    np.testing.assert_allclose(
        torch.cat([hv[name].reshape(-1) for name in primal]).numpy(),
        (mean_hessian @ flat_directions[0]).numpy(),
        rtol=1e-9,
        atol=1e-12,
    )
    # the graph-reusing operator of hessian-basis, over two blocks, for two vectors in turn
    # and the same with each block's graph rebuilt per product (what a tight --max-memory chooses),
    # and with the first block's graph kept and the second's rebuilt (a budget between the two)
    blocks = [(losses, 0.25 / len(targets)), (losses, 0.75 / len(targets))]
    operators = [MeanLossHessian(blocks, primal), MeanLossHessian(blocks, primal, keep_graphs=False)]
    operators.append(MeanLossHessian(blocks, primal, kept_blocks=1))
    assert [op.keep_graphs for op in operators] == [True, False, False]
    for operator in operators:
        for k in range(2):
            hv = operator(unflatten(flat_directions[k]))
            np.testing.assert_allclose(
                torch.cat([hv[name].reshape(-1) for name in primal]).numpy(),
                (mean_hessian @ flat_directions[k]).numpy(),
                rtol=1e-9,
                atol=1e-12,
            )

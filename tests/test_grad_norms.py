"""``grad-norms`` and ``loss-spikes``: norms against direct autograd and numpy, spike detection, conformance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers import grad_norms
from ckpt.analyzers.grad_norms import (
    GradNorms,
    LossSpikes,
    chance_cooccurrence,
    cooccurrence,
    detect_spikes,
    minibatches,
    rolling_baseline,
)
from ckpt.engine.pipeline import run
from ckpt.plugins import AnalysisError, load_registry
from ckpt.plugins.testing import write_example_run
from tests.models import mlp

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def registry() -> Any:
    return load_registry(extra=[grad_norms])


def direct_norms(store: ckptstore.Store, step: int, rows: np.ndarray) -> tuple[dict[str, float], float]:
    """Squared gradient norm of each parameter of the mean cross-entropy over ``rows``, by plain autograd."""
    model = mlp()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in store.tensors(step).items()})
    data = store.data("eval")
    inputs = torch.from_numpy(data["inputs"].values[rows])
    targets = torch.from_numpy(data["targets"].values[rows])
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    return {k: float(p.grad.double().pow(2).sum()) for k, p in model.named_parameters()}, float(loss.detach())


def layer_norms(squares: dict[str, float]) -> dict[str, float]:
    layers: dict[str, float] = {}
    for name, value in squares.items():
        layers[name.rsplit(".", 1)[0]] = layers.get(name.rsplit(".", 1)[0], 0.0) + value
    return {k: float(np.sqrt(v)) for k, v in layers.items()}


def test_full_batch_norms_equal_direct_autograd(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr")
    # chunks of 7 examples: the gradient is accumulated over 8 forward/backward passes
    result = run("grad-norms", path, registry=registry, chunk_size=7).dataset.load()
    store = ckptstore.open(path)
    assert result["grad_norm"].attrs["split"] == "eval"  # no train split in this store
    assert list(result["tensor"].values) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert list(result["layer"].values) == ["0", "2"]
    for i, step in enumerate(store.steps):
        squares, loss = direct_norms(store, int(step), np.arange(50))
        expected = [np.sqrt(squares[str(t)]) for t in result["tensor"].values]
        np.testing.assert_allclose(result["grad_norm"].values[i], expected, rtol=1e-5)
        layers = layer_norms(squares)
        np.testing.assert_allclose(result["layer_grad_norm"].values[i], [layers["0"], layers["2"]], rtol=1e-5)
        np.testing.assert_allclose(result["total_grad_norm"].values[i], np.sqrt(sum(squares.values())), rtol=1e-5)
        np.testing.assert_allclose(result["loss"].values[i], loss, rtol=1e-6)


def test_minibatch_norms_are_the_mean_of_per_minibatch_norms(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=3)
    result = run("grad-norms", path, registry=registry, batch_size=16, seed=3, chunk_size=5).dataset.load()
    store = ckptstore.open(path)
    groups = minibatches(50, 16, 3)
    assert [len(g) for g in groups] == [16, 16, 16]  # the last 2 examples are dropped
    np.testing.assert_array_equal(np.concatenate(groups), np.random.default_rng(3).permutation(50)[:48])
    for i, step in enumerate(store.steps):
        per_batch = [direct_norms(store, int(step), rows) for rows in groups]
        tensors = [[np.sqrt(sq[str(t)]) for t in result["tensor"].values] for sq, _ in per_batch]
        np.testing.assert_allclose(result["grad_norm"].values[i], np.mean(tensors, axis=0), rtol=1e-5)
        layers = [list(layer_norms(sq).values()) for sq, _ in per_batch]
        np.testing.assert_allclose(result["layer_grad_norm"].values[i], np.mean(layers, axis=0), rtol=1e-5)
        totals = [np.sqrt(sum(sq.values())) for sq, _ in per_batch]
        np.testing.assert_allclose(result["total_grad_norm"].values[i], np.mean(totals), rtol=1e-5)
        np.testing.assert_allclose(result["loss"].values[i], np.mean([loss for _, loss in per_batch]), rtol=1e-6)
    # a stochastic gradient is longer than the full-batch one on average: the noise adds to it
    full = run("grad-norms", path, registry=registry, force=True).dataset
    assert (result["total_grad_norm"].values > full["total_grad_norm"].values).all()


def test_update_norms_equal_numpy_differences(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr")
    result = run("grad-norms", path, registry=registry).dataset.load()
    store = ckptstore.open(path)
    steps = [int(s) for s in store.steps]
    assert np.isnan(result["update_norm"].values[0]).all()
    assert np.isnan(result["total_update_norm"].values[0])
    for i in range(1, len(steps)):
        before, after = store.tensors(steps[i - 1]), store.tensors(steps[i])
        diffs = {k: after[k].astype(np.float64) - before[k].astype(np.float64) for k in before}
        expected = [np.linalg.norm(diffs[str(t)]) for t in result["tensor"].values]
        np.testing.assert_allclose(result["update_norm"].values[i], expected, rtol=1e-12)
        total = np.sqrt(sum((d**2).sum() for d in diffs.values()))
        np.testing.assert_allclose(result["total_update_norm"].values[i], total, rtol=1e-12)
        layer0 = np.sqrt((diffs["0.weight"] ** 2).sum() + (diffs["0.bias"] ** 2).sum())
        np.testing.assert_allclose(result["layer_update_norm"].sel(layer="0").values[i], layer0, rtol=1e-12)


def write_weights_only(path: Path, losses: np.ndarray) -> Path:
    """A store without model spec: random-walk weights, an int counter and a ``loss`` metric."""
    rng = np.random.default_rng(0)
    weights = {"enc.w": rng.standard_normal((3, 2)), "enc.b": rng.standard_normal(2), "head": rng.standard_normal(4)}
    with ckptstore.create(path) as writer:
        for i, loss in enumerate(losses):
            weights = {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in weights.items()}
            writer.write(10 * i, {**weights, "counter": np.asarray(i)}, metrics={"loss": float(loss)})
    return path


def test_stores_without_a_model_get_update_norms_and_metric_spikes(tmp_path: Path, registry: Any) -> None:
    losses = np.exp(-0.02 * np.arange(12))
    losses[8] += 0.5
    path = write_weights_only(tmp_path / "run.zarr", losses)
    norms = run("grad-norms", path, registry=registry).dataset.load()
    assert set(norms.data_vars) == {"update_norm", "layer_update_norm", "total_update_norm"}
    assert list(norms["tensor"].values) == ["enc.w", "enc.b", "head"]  # the int counter is no weight
    assert list(norms["layer"].values) == ["enc", "head"]
    spikes = run("loss-spikes", path, registry=registry).dataset.load()
    assert list(spikes["step"].values[spikes["loss_spike"].values]) == [80]
    assert not spikes["grad_norm_spike"].values.any()
    assert np.isnan(spikes["cooccurrence"].values)
    assert "metric 'loss'" in spikes["loss"].attrs["description"]
    with pytest.raises(AnalysisError, match=r"no model spec.*--metric"):
        run("loss-spikes", path, registry=registry, metric="evaluated")


def test_incremental_runs_compute_update_norms_of_new_checkpoints_only(tmp_path: Path, registry: Any) -> None:
    path = write_weights_only(tmp_path / "run.zarr", np.ones(3))
    run("grad-norms", path, registry=registry)
    rng = np.random.default_rng(5)
    with ckptstore.open(path, mode="a") as writer:  # training goes on
        for step in (30, 40):
            weights = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in _shapes(path).items()}
            writer.write(step, {**weights, "counter": np.asarray(step)})
    report = run("grad-norms", path, registry=registry)
    assert report.computed_steps == [30, 40]
    store = ckptstore.open(path)
    steps = [int(s) for s in store.steps]
    totals = report.dataset["total_update_norm"].values
    for i in range(1, len(steps)):
        before, after = store.tensors(steps[i - 1]), store.tensors(steps[i])
        names = ["enc.w", "enc.b", "head"]
        expected = np.sqrt(sum(((after[k].astype(np.float64) - before[k]) ** 2).sum() for k in names))
        np.testing.assert_allclose(totals[i], expected, rtol=1e-12)


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    store = ckptstore.open(path)
    return {name: np.zeros(info.shape) for name, info in store.schema.items() if "float" in info.dtype}


# -- spike detection on synthetic series -------------------------------------------------------


def test_rolling_baseline_is_the_trailing_median_and_scaled_mad() -> None:
    x = np.array([1.0, 2.0, 4.0, 8.0, 3.0])
    median, scale = rolling_baseline(x, window=3, min_periods=3)
    np.testing.assert_array_equal(median[:3], [np.nan] * 3)
    assert median[3] == 2.0  # median of 1, 2, 4
    assert scale[3] == pytest.approx(1.4826 * 1.0)  # |1-2|, |2-2|, |4-2| -> median 1
    assert median[4] == 4.0  # median of 2, 4, 8
    assert scale[4] == pytest.approx(1.4826 * 2.0)


def test_planted_spikes_are_found() -> None:
    rng = np.random.default_rng(1)
    x = 2.0 * np.exp(-np.arange(300) / 50) + 0.1 + 0.005 * rng.standard_normal(300)
    assert not detect_spikes(x).any()
    planted = [100, 180, 250]
    # the trailing window lags the falling curve and its spread grows with the slope, so a spike must clear
    # more where the curve is steep: ~0.32 at t=100 (x=0.37), ~0.065 at t=180 and ~0.037 at t=250 (x~0.11)
    x[planted] += [0.45, 0.1, 0.06]
    assert list(np.flatnonzero(detect_spikes(x))) == planted
    x[planted] -= [0.2, 0.04, 0.03]  # now below what each position needs
    assert not detect_spikes(x).any()
    # a shorter window follows the curve closer: the reduced spikes clear it again
    x[40] += 0.7
    assert list(np.flatnonzero(detect_spikes(x, window=10))) == [40, *planted]


def test_smooth_curves_have_no_spikes() -> None:
    rng = np.random.default_rng(2)
    t = np.arange(500)
    decay = 3.0 * np.exp(-t / 80) + 0.1 + 0.002 * rng.standard_normal(500)
    assert not detect_spikes(decay).any()
    assert not detect_spikes(3.0 * np.exp(-t / 80)).any()  # noiseless decay
    assert not detect_spikes(np.full(100, 0.25)).any()  # flat: the floor keeps MAD 0 from flagging anything
    assert not detect_spikes(0.25 + 1e-9 * rng.standard_normal(100)).any()  # rounding noise on a plateau
    assert not detect_spikes(np.linspace(0.0, 1.0, 100)).any()  # a steady rise is no spike


def test_spike_edge_cases() -> None:
    assert not detect_spikes([1.0, 1.0, 1.0, 1.0, 9.0]).any()  # fewer than 5 earlier values: never a spike
    flat = [1.0] * 5
    assert list(detect_spikes([*flat, np.inf, np.nan, 1.0])) == [False] * 5 + [True, False, False]
    # the floor: a rise of 6% on a flat stretch is 6 floors (0.01 * median) above it, over the threshold 5
    assert detect_spikes([*flat, 1.06])[-1]
    assert not detect_spikes([*flat, 1.04])[-1]
    assert not detect_spikes([*flat, 1.06], floor=0.02)[-1]


def test_cooccurrence_on_a_planted_example() -> None:
    steps = np.arange(0, 100, 10)  # 10 checkpoints
    loss_spikes = [20, 50, 90]
    grad_spikes = [20, 60]
    # exact: 20 only; within 10 steps: 20 (20) and 50 (60); 90 is 30 steps from 60
    assert cooccurrence(loss_spikes, grad_spikes, tolerance=0) == pytest.approx(1 / 3)
    assert cooccurrence(loss_spikes, grad_spikes, tolerance=10) == pytest.approx(2 / 3)
    assert cooccurrence(loss_spikes, grad_spikes, tolerance=30) == 1.0
    # chance: the checkpoints within the tolerance of 20 or 60, out of 10
    assert chance_cooccurrence(steps, grad_spikes, tolerance=0) == pytest.approx(2 / 10)
    assert chance_cooccurrence(steps, grad_spikes, tolerance=10) == pytest.approx(6 / 10)  # 10,20,30,50,60,70
    assert np.isnan(cooccurrence([], grad_spikes))
    assert cooccurrence(loss_spikes, []) == 0.0


def write_run_with_metric(path: Path, losses: np.ndarray) -> Path:
    """A real SGD run of ``tests.models:mlp`` whose logged ``train_loss`` metric is ``losses``."""
    torch.manual_seed(0)
    model = mlp()
    inputs, targets = torch.randn(40, 3), torch.randint(0, 4, (40,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    with ckptstore.create(path, model="tests.models:mlp", config={}, objective="cross-entropy") as writer:
        writer.add_data("train", inputs=inputs, targets=targets)
        writer.add_data("eval", inputs=inputs[:10], targets=targets[:10])
        for step, loss_value in enumerate(losses):
            writer.write(5 * step, model, metrics={"train_loss": float(loss_value)})
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return path


def test_loss_spikes_end_to_end(tmp_path: Path, registry: Any) -> None:
    losses = 0.3 * np.exp(-np.arange(16) / 20) + 0.5
    losses[11] *= 1.5
    path = write_run_with_metric(tmp_path / "run.zarr", losses)
    result = run("loss-spikes", path, registry=registry, window=5, tolerance=5).dataset.load()
    norms = ckptstore.open(path).analysis("grad-norms")
    assert norms["loss"].attrs["split"] == "train"  # the train split is preferred when stored
    steps = result["step"].values
    np.testing.assert_array_equal(result["loss"].values, losses)  # the metric, not the evaluated loss
    np.testing.assert_array_equal(result["grad_norm"].values, norms["total_grad_norm"].values)
    assert list(steps[result["loss_spike"].values]) == [55]
    expected_grad = detect_spikes(norms["total_grad_norm"].values, window=5)
    np.testing.assert_array_equal(result["grad_norm_spike"].values, expected_grad)
    grad_at = steps[expected_grad]
    assert float(result["cooccurrence"]) == cooccurrence([55], grad_at, 5)
    assert float(result["chance"]) == chance_cooccurrence(steps, grad_at, 5)
    text = LossSpikes().summarize(result)
    assert "loss spikes:      1 at steps 55" in text
    # the evaluated loss instead of the metric
    evaluated = run("loss-spikes", path, registry=registry, metric="evaluated").dataset
    np.testing.assert_allclose(evaluated["loss"].values, norms["loss"].values)


def test_bad_input_is_an_analysis_error(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2)
    with pytest.raises(AnalysisError, match="no data split 'nope'; pass --split one of: eval"):
        run("grad-norms", path, registry=registry, split="nope")
    with pytest.raises(AnalysisError, match="option 'batch_size' of analyzer 'grad-norms' must be at least 1, got 0"):
        run("grad-norms", path, registry=registry, batch_size=0)
    with pytest.raises(AnalysisError, match=r"no metric 'lr'.*pass --metric one of"):
        run("loss-spikes", path, registry=registry, metric="lr")
    with pytest.raises(AnalysisError, match="option 'window' of analyzer 'loss-spikes' must be at least 5, got 4"):
        run("loss-spikes", path, registry=registry, window=4)
    assert "loss-spikes" not in ckptstore.open(path).analyses  # bad input writes nothing


def test_summary_is_readable(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=3)
    text = GradNorms().summarize(run("grad-norms", path, registry=registry).dataset)
    assert "4 tensors in 2 layers, 3 checkpoints" in text
    assert "layer_grad_norm at step 2:" in text


# -- conformance ------------------------------------------------------------------------------------------

"""``essential-dynamics``: PCA of the outputs over checkpoints, turning points and stages, on real stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers import essential_dynamics as ed
from ckpt.engine.runner import run
from ckpt.errors import AnalysisError
from ckpt.plugins.examples import EXAMPLE_FACTORY, mlp, write_example_run
from tests.helpers import assert_refused, tree_digest

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "essential-dynamics"


def explicit_outputs(path: Path) -> np.ndarray:
    """F[t, :]: every eval example's logits at checkpoint t, flattened, by the model itself."""
    store = ckptstore.open(path)
    inputs = torch.from_numpy(np.asarray(store.data("eval")["inputs"].values))
    model = mlp()
    rows = []
    for step in store.steps:
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in store.tensors(int(step)).items()})
        with torch.no_grad():
            rows.append(model(inputs).double().flatten().numpy())
    return np.stack(rows)


def test_pca_equals_numpy_svd_of_the_explicit_outputs(tmp_path: Path) -> None:
    """Projections (up to sign) and explained variance ratios are the SVD of the centred F, in one block or many."""
    path = write_example_run(tmp_path / "run.zarr", steps=6, examples=20)
    outputs = explicit_outputs(path)
    centred = outputs - outputs.mean(axis=0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    scores, ratio = u[:, :3] * s[:3], s[:3] ** 2 / np.sum(s**2)
    # 20 examples x 4 logits x 6 checkpoints: 2 KiB makes blocks of 5 examples, summed in order
    for memory in (None, 2048):
        report = run(NAME, path, outputs="logits", smoothing=0.0, max_memory=memory, force=True)
        result = report.dataset
        assert result is not None and result["projection"].attrs["outputs"] == "logits"
        found = result["projection"].values
        for k in range(3):
            sign = np.sign(found[:, k] @ scores[:, k])
            np.testing.assert_allclose(sign * found[:, k], scores[:, k], rtol=1e-4, atol=1e-5 * s[0])
        np.testing.assert_allclose(result["explained_variance_ratio"].values, ratio, rtol=1e-5)
        np.testing.assert_allclose(result["smoothed"].values, found)  # σ = 0: the path itself
        assert result["projection"].attrs["features"] == 80


def test_token_logits_are_those_of_the_datapoints(tmp_path: Path) -> None:
    """A token objective: each checkpoint's vector is the logits at the masked-in positions only."""
    from tests.models import tiny_lm

    tokens = torch.randint(0, 7, (5, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[:, 3:] = True
    path = tmp_path / "lm.zarr"
    rows = []
    with ckptstore.create(path, model="tests.models:tiny_lm", objective="token-cross-entropy") as writer:
        writer.add_data("eval", inputs=tokens, targets=tokens.roll(-1, 1), mask=mask)
        for step in range(4):
            torch.manual_seed(step)
            model = tiny_lm()
            writer.write(step, model)
            with torch.no_grad():
                rows.append(model(tokens)[mask].double().flatten().numpy())
    outputs = np.stack(rows)
    centred = outputs - outputs.mean(axis=0)
    s = np.linalg.svd(centred, compute_uv=False)
    result = run(NAME, path, components=2, batch_size=2).dataset
    assert result["projection"].attrs["features"] == 15 * 7 and result["projection"].attrs["outputs"] == "logits"
    np.testing.assert_allclose(result["explained_variance_ratio"].values, s[:2] ** 2 / np.sum(s**2), rtol=1e-5)


def test_auto_takes_the_losses_of_a_large_vocabulary(tmp_path: Path) -> None:
    """Above 1,024 logits per datapoint, ``auto`` decomposes the per-token losses (the loss analyzer's)."""
    from tests.models import tiny_lm

    config = {"vocab": 2048, "d": 4}
    path = tmp_path / "lm.zarr"
    torch.manual_seed(0)
    model = tiny_lm(**config)
    ids = np.random.default_rng(0).integers(0, 2048, (4, 8))
    with ckptstore.create(path, model="tests.models:tiny_lm", config=config, objective="causal-lm") as writer:
        writer.add_data("eval", inputs=ids)
        for step in range(4):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(torch.randn_like(parameter) * 0.1)
            writer.write(step, model)
    result = run(NAME, path, components=2).dataset
    assert result["projection"].attrs["outputs"] == "loss" and result["projection"].attrs["features"] == 28
    losses = run("loss", path).dataset["loss"].values
    s = np.linalg.svd(losses - losses.mean(axis=0), compute_uv=False)
    np.testing.assert_allclose(result["explained_variance_ratio"].values, s[:2] ** 2 / np.sum(s**2), rtol=1e-6)


def write_turning_run(path: Path, steps: list[int], corner: int) -> Path:
    """A run of the example MLP whose last bias moves along one direction, then (from ``corner``) another.

    The logits are linear in that bias, so the outputs draw the same polyline: one turn of 90 degrees.
    """
    torch.manual_seed(0)
    model = mlp()
    base = {name: value.detach().clone() for name, value in model.state_dict().items()}
    first, second = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0, 0.0])
    inputs, targets = torch.randn(12, 3), torch.randint(0, 4, (12,))
    with ckptstore.create(path, model=EXAMPLE_FACTORY, config={}, objective="cross-entropy") as writer:
        writer.add_data("eval", inputs=inputs, targets=targets)
        for index in range(len(steps)):
            along = min(index, corner) * first + max(0, index - corner) * second
            writer.write(steps[index], {**base, "2.bias": base["2.bias"] + 0.5 * along})
    return path


def test_a_turn_of_the_path_is_the_turning_point_and_opens_a_stage(tmp_path: Path) -> None:
    """Checkpoints moving along one direction and then another: one turning point, at the corner."""
    steps = [10 * i for i in range(21)]
    path = write_turning_run(tmp_path / "run.zarr", steps, corner=12)
    result = run(NAME, path).dataset.load()
    turning = result["step"].values[result["turning_point"].values]
    assert turning.tolist() == [120]
    stage = result["stage"].values
    assert stage.tolist() == [0] * 12 + [1] * 9
    assert np.nanmax(result["turning_angle"].values) == pytest.approx(result["turning_angle"].sel(step=120).item())
    # two directions: two components hold the variance, a third none
    ratio = result["explained_variance_ratio"].values
    assert ratio[:2].sum() == pytest.approx(1.0) and ratio[2] < 1e-9
    assert not result["extremum"].values[:, 2].any()  # rounding error has no extrema
    figures = ed.EssentialDynamics().plot(result, ckptstore.open(path))
    assert sorted(figures) == ["components", "path", "variance"]


def test_turning_points_stages_and_extrema_of_plain_paths() -> None:
    """The numpy helpers: a right angle found, a straight line none, stages counting turning points."""
    line = np.column_stack([np.arange(20.0), np.zeros(20)])
    assert not ed.turning_points(ed.turning_angles(line, 1), 1, 45).any()
    corner = np.concatenate([line[:10], line[9] + np.column_stack([np.zeros(10), np.arange(1.0, 11)])])
    angles = ed.turning_angles(corner, 2)
    assert angles[9] == pytest.approx(90.0, abs=1e-9) and np.isnan(angles[:2]).all()
    found = ed.turning_points(angles, 2, 45)
    assert np.flatnonzero(found).tolist() == [9]
    assert ed.stages(found).tolist() == [0] * 9 + [1] * 11
    bump = np.column_stack([np.sin(np.linspace(0, np.pi, 9))])
    assert np.flatnonzero(ed.extrema(bump)[:, 0]).tolist() == [4]
    at_rest = np.zeros((10, 2))
    assert np.isnan(ed.turning_angles(at_rest, 1)).all()


def test_llc_plateaus_after_growth_phases_are_boundaries() -> None:
    """λ̂ rising, flat, rising again, flat with noise: a boundary where each plateau begins."""
    wiggle = 0.2 * np.sin(np.arange(10.0) * 2.5)
    llc = np.concatenate([np.linspace(0, 10, 10), np.full(10, 10.0), np.linspace(10, 20, 10), 20 + wiggle])
    plateau, boundary = ed.llc_boundaries(np.arange(len(llc)), llc, sigma=1.0)
    assert plateau[11:19].all() and plateau[32:].all() and not plateau[:9].any() and not plateau[21:29].any()
    assert np.flatnonzero(boundary).tolist() == [11, 31]  # the corners at 10 and 30, smoothed by one checkpoint


def test_pca_from_gram_refuses_a_path_at_rest() -> None:
    """Equal outputs at every checkpoint: no variance, an error rather than NaN ratios."""
    with pytest.raises(AnalysisError, match="same at every checkpoint"):
        ed.pca_from_gram(np.zeros((4, 4)), 2)


def test_reuse_and_staleness_as_a_per_run_analyzer(tmp_path: Path) -> None:
    """Same request: reused; other options: recomputed; a new checkpoint: recomputed whole."""
    path = write_example_run(tmp_path / "run.zarr", steps=4, examples=10)
    first = run(NAME, path, components=2)
    assert first.computed_steps == [0, 1, 2, 3]
    assert run(NAME, path, components=2).computed_steps == []
    assert run(NAME, path, components=2, smoothing=2.0).computed_steps == [0, 1, 2, 3]
    store = ckptstore.open(path)
    moved = {k: v + np.float32(0.01) if v.dtype.kind == "f" else v for k, v in store.tensors(3).items()}
    with ckptstore.open(path, mode="a") as writer:
        writer.write(4, moved)
    again = run(NAME, path, components=2, smoothing=2.0)
    assert again.computed_steps == [0, 1, 2, 3, 4]
    assert again.dataset is not None and again.dataset.sizes["step"] == 5


def test_an_interrupted_run_resumes_from_its_committed_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks whose Gram was committed before a failure are taken by the rerun; the result is the same."""
    path = write_example_run(tmp_path / "run.zarr", steps=4, examples=20)
    options = {"outputs": "logits", "max_memory": 1280, "scheduler": "sync"}  # 20 examples: 4 blocks of 5
    calls: list[int] = []
    compute = ed.block_outputs

    def counting(worker: Any, step: int, **kwargs: Any) -> np.ndarray:
        if fail and int(kwargs["examples"][0]) >= 10:
            raise AnalysisError("interrupted")
        calls.append(step)
        return compute(worker, step, **kwargs)

    monkeypatch.setattr(ed, "block_outputs", counting)
    fail = True
    with pytest.raises(AnalysisError, match="interrupted"):
        run(NAME, path, **options)
    committed = ckptstore.open(path).analysis(f"{NAME}.partial").sizes["block"]
    assert committed >= 1
    fail, calls[:] = False, []
    resumed = run(NAME, path, **options).dataset.load()
    assert len(calls) == 4 * (4 - committed), "the committed blocks' outputs are not computed again"
    assert f"{NAME}.partial" not in ckptstore.open(path).analyses, "the journal goes with the whole result"
    fresh = run(NAME, path, force=True, **options).dataset.load()
    np.testing.assert_allclose(resumed["projection"].values, fresh["projection"].values, rtol=1e-12)


def test_a_diverged_checkpoint_is_named(tmp_path: Path) -> None:
    """NaN weights at one checkpoint: an error naming its step, no result with NaN components."""
    path = write_example_run(tmp_path / "run.zarr", steps=4, examples=6)
    store = ckptstore.open(path)
    broken = {k: np.full_like(v, np.nan) if v.dtype.kind == "f" else v for k, v in store.tensors(3).items()}
    with ckptstore.open(path, mode="a") as writer:
        writer.write(4, broken)
    with pytest.raises(AnalysisError, match="at step 4 are NaN or inf"):
        run(NAME, path)
    assert NAME not in ckptstore.open(path).analyses


def test_bad_input_is_one_error_line(tmp_path: Path) -> None:
    """One or two checkpoints, too many components, a missing split, a small budget: one line each, store kept."""
    two = write_example_run(tmp_path / "two.zarr", steps=2, examples=6)
    assert_refused(two, NAME, [], "needs at least 3")
    five = write_example_run(tmp_path / "five.zarr", steps=5, examples=6)
    assert_refused(five, NAME, ["--max-memory", "100", "--outputs", "logits"], "or use --outputs loss")
    one = write_example_run(tmp_path / "one.zarr", steps=1, examples=6)
    refusals = [
        (one, {}, "needs at least 3 .* has 1:"),
        (five, {"components": 5}, "choose --components 4 or fewer"),
        (five, {"split": "train"}, "no data split 'train'"),
    ]
    for path, options, expected in refusals:
        before = tree_digest(path)
        with pytest.raises(AnalysisError, match=expected) as refused:
            run(NAME, path, **options)
        assert "\n" not in str(refused.value) and tree_digest(path) == before

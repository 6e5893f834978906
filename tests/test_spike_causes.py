"""``curvature`` and ``normalization`` (Clustering Head §4.3) against brute force, on a real sandbox run.

Every test reads a real Zarr store written by a short training run of the
``sparse-modular-addition`` sandbox and runs the real engine (in process or the
``ckpt`` command); the numbers are checked against an explicit Hessian
(``torch.autograd.functional.hessian`` + ``numpy.linalg.eigvalsh``) and norms
computed by hand in numpy from the stored weights.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers.normalization import QUANTILES
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition
from tests.helpers import assert_refused, run_ckpt, sparse_modular_store, tree_digest

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

SMALL = {"steps": 16, "every": 8, "seed": 0, "train_size": 128, "test_size": 64}
"""Checkpoints at steps 0, 8 and 16; 128 train and 192 eval sequences."""


store = sparse_modular_store("spikes", SMALL)


def weights(path: Path, step: int) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in ckptstore.open(path).tensors(step).items()}


# -- curvature ------------------------------------------------------------------------------------


def explicit_top_eigenvalue(path: Path, step: int, names: list[str]) -> float:
    """λ_max of the Hessian of the mean train loss restricted to ``names``, from the explicit matrix."""
    store = ckptstore.open(path)
    model = store.model.build().double()
    params = weights(path, step)
    data = store.data("train")
    inputs = torch.from_numpy(data["inputs"].values)
    targets = torch.from_numpy(data["targets"].values)
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]

    def loss(flat: torch.Tensor) -> torch.Tensor:
        block = {n: part.reshape(s) for n, part, s in zip(names, flat.split(sizes), shapes, strict=True)}
        logits = torch.func.functional_call(model, {**params, **block}, (inputs,))
        return torch.nn.functional.cross_entropy(logits, targets)

    flat = torch.cat([params[n].reshape(-1) for n in names])
    hessian = torch.autograd.functional.hessian(loss, flat).numpy()
    np.testing.assert_allclose(hessian, hessian.T, atol=1e-10)
    return float(np.linalg.eigvalsh(hessian)[-1])


def test_curvature_equals_the_explicit_hessian_of_each_block(store: Path) -> None:
    # every train example (--samples above the split's 128), float64: Lanczos against eigvalsh
    result = run("curvature", store, samples=1000, dtype="float64", tol=1e-10).dataset.load()
    names = ckptstore.open(store).tensor_names
    assert result["module"].values.tolist() == ["embed", "pos", "attn", "mlp"]  # the norms own no parameters
    assert result["parameters"].values.tolist() == [4, 24, 6, 162]
    for step in (0, 16):
        row = result.sel(step=step)
        for module in ("attn", "mlp"):
            block = [n for n in names if n.startswith(module + ".")]
            expected = explicit_top_eigenvalue(store, step, block)
            np.testing.assert_allclose(float(row["eigenvalue"].sel(module=module)), expected, rtol=1e-7)
        whole = explicit_top_eigenvalue(store, step, list(names))
        np.testing.assert_allclose(float(row["model_eigenvalue"]), whole, rtol=1e-7)
        # Cauchy interlacing: a principal block's top eigenvalue never exceeds the whole Hessian's
        assert (row["eigenvalue"].values <= float(row["model_eigenvalue"]) * (1 + 1e-9)).all()
    # no --lr: η is the `lr` metric `ckpt train` logged at every checkpoint
    np.testing.assert_array_equal(result["learning_rate"].values, ckptstore.open(store).metrics["lr"].values)


def test_curvature_modules_option_and_a_one_parameter_block(store: Path) -> None:
    result = run("curvature", store, modules="attn,mlp.fc2", samples=1000, dtype="float64", lr=0.01).dataset
    result = result.load()
    assert result["module"].values.tolist() == ["attn", "mlp.fc2"]
    np.testing.assert_array_equal(result["learning_rate"].values, 0.01)
    names = [n for n in ckptstore.open(store).tensor_names if n.startswith("mlp.fc2.")]
    expected = explicit_top_eigenvalue(store, 8, names)
    np.testing.assert_allclose(float(result["eigenvalue"].sel(step=8, module="mlp.fc2")), expected, rtol=1e-7)


def test_curvature_bad_input_is_one_error_line_and_leaves_the_store(store: Path) -> None:
    for args, expected in (
        (["--modules", "nothing"], "--modules pattern 'nothing' matches no module"),
        (["--modules", "mlp.norm"], "--modules: module 'mlp.norm' has no trainable parameters"),
        (["--max-memory", "1KiB"], "raise --max-memory"),
        (["--split", "test"], "pass --split one of"),
    ):
        assert_refused(store, "curvature", ["--samples", "8", *args], expected)


# -- normalization --------------------------------------------------------------------------------


def norms_by_hand(path: Path, step: int) -> dict[str, np.ndarray]:
    """‖x‖ of every vector reaching ``norm`` (token + position embeddings) and ``mlp.norm`` (ξ), in numpy."""
    w = {k: v.numpy() for k, v in weights(path, step).items()}
    tokens = ckptstore.open(path).data("eval")["inputs"].values
    embedded = w["embed.weight"][tokens] + w["pos.weight"][None]  # [N, L, 2], what `norm` receives
    z = embedded / np.sqrt((embedded**2).mean(-1, keepdims=True) + 1e-12)
    scores = z @ w["attn.query"] / math.sqrt(2)
    attention = np.exp(scores - scores.max(1, keepdims=True))
    attention /= attention.sum(1, keepdims=True)
    xi = np.einsum("nt,ntd->nd", attention, z @ w["attn.value.weight"].T)  # [N, 2], what `mlp.norm` receives
    return {"norm": np.linalg.norm(embedded, axis=-1).ravel(), "mlp.norm": np.linalg.norm(xi, axis=-1)}


def test_normalization_quantiles_and_share_below_lr_match_norms_by_hand(store: Path) -> None:
    by_hand = norms_by_hand(store, 16)
    lr = float(np.median(by_hand["mlp.norm"]))  # about half of ξ below η: the share is not trivially 0 or 1
    result = run("normalization", store, lr=lr).dataset.load()
    assert result["module"].values.tolist() == ["norm", "mlp.norm"]  # the sandbox's GainlessRMSNorm modules
    assert not result["centered"].values.any()
    row = result.sel(step=16)
    for module, norms in by_hand.items():
        np.testing.assert_allclose(
            row["norm_quantile"].sel(module=module).values, np.quantile(norms, QUANTILES), rtol=1e-5
        )
        assert int(row["vectors"].sel(module=module)) == norms.size
        np.testing.assert_allclose(float(row["below_lr"].sel(module=module)), np.mean(norms < lr), atol=1 / norms.size)
    # plain ‖x‖, not the RMS the layer divides by (‖x‖ / sqrt(2) at d = 2)
    assert float(row["norm_quantile"].sel(module="norm", quantile=0.5)) == pytest.approx(
        np.median(by_hand["norm"]), rel=1e-5
    )
    np.testing.assert_array_equal(result["learning_rate"].values, lr)


def test_normalization_reads_a_stored_learning_rate_metric(store: Path, tmp_path: Path) -> None:
    # the same run rewritten with an `lr` metric per checkpoint, as a loop with a schedule would log it
    source = ckptstore.open(store)
    path = tmp_path / "scheduled.zarr"
    rates = {0: 1.0, 8: 0.1, 16: 1e-3}
    with ckptstore.create(
        path, model=source.model.factory, config=source.model.config, objective=source.objective
    ) as w:
        for step in source.steps.tolist():
            w.write(step, source.tensors(step), metrics={"lr": rates[step]})
        data = source.data("eval")
        w.add_data("eval", inputs=data["inputs"].values, targets=data["targets"].values)
    result = run("normalization", path).dataset.load()
    np.testing.assert_array_equal(result["learning_rate"].values, [1.0, 0.1, 1e-3])
    for step, lr in rates.items():
        for module, norms in norms_by_hand(path, step).items():
            share = float(result["below_lr"].sel(step=step, module=module))
            np.testing.assert_allclose(share, np.mean(norms < lr), atol=1 / norms.size)


def without_lr_metric(store: Path, path: Path) -> Path:
    """``store`` rewritten without its ``lr`` metric, as a loop that logs no learning rate leaves it."""
    source = ckptstore.open(store)
    with ckptstore.create(
        path,
        model=source.model.factory,
        config=source.model.config,
        objective=source.objective,
        attrs={"config": source.attrs["config"]},
    ) as w:
        for step in source.steps.tolist():
            w.write(step, source.tensors(step), metrics={"train_loss": 1.0})
        data = source.data("eval")
        w.add_data("eval", inputs=data["inputs"].values, targets=data["targets"].values)
    return path


def test_a_fresh_ckpt_train_run_gives_normalization_its_learning_rate(store: Path) -> None:
    # `ckpt train` logs the rate in force as the `lr` metric at every checkpoint: no --lr needed
    metrics = ckptstore.open(store).metrics
    np.testing.assert_array_equal(metrics["step"].values, [0, 8, 16])
    np.testing.assert_array_equal(metrics["lr"].values, SparseModularAddition.presets["default"]["lr"])
    result = run("normalization", store).dataset.load()
    np.testing.assert_array_equal(result["learning_rate"].values, metrics["lr"].values)
    assert result["learning_rate"].attrs["description"] == "from the store's learning-rate metric"
    for module, norms in norms_by_hand(store, 16).items():
        share = float(result["below_lr"].sel(step=16, module=module))
        np.testing.assert_allclose(share, np.mean(norms < 3e-3), atol=1 / norms.size)


def test_curvature_without_a_learning_rate_metric_leaves_eta_unknown(store: Path, tmp_path: Path) -> None:
    unlogged = without_lr_metric(store, tmp_path / "unlogged.zarr")
    result = run("curvature", unlogged, samples=16, modules="attn").dataset.load()
    assert np.isnan(result["learning_rate"].values).all(), "no --lr and no lr metric: η unknown, NaN"


def test_normalization_bad_input_is_one_error_line_and_leaves_the_store(store: Path, tmp_path: Path) -> None:
    mlp_store = write_example_run(tmp_path / "mlp.zarr", steps=2)  # nn.Sequential of Linear and Tanh: no norm
    unlogged = without_lr_metric(store, tmp_path / "unlogged.zarr")
    for path, args, expected in (
        (
            unlogged,
            [],
            "stores no learning-rate metric (lr or learning_rate) (its training config records lr=0.003): pass --lr",
        ),
        (mlp_store, ["--lr", "0.1"], "has no normalisation module (nn.LayerNorm, nn.RMSNorm, *Norm): pass --modules"),
        (store, ["--lr", "0.1", "--modules", "nothing"], "--modules pattern 'nothing' matches no module"),
        (store, ["--lr", "-1"], "--lr"),
    ):
        before = tree_digest(path)
        done = run_ckpt("analyze", "normalization", str(path), "--no-progress", *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert lines[0].startswith("Error:") and expected in lines[0], lines[0]
        assert tree_digest(path) == before


def test_layer_norm_inputs_are_measured_centred(tmp_path: Path) -> None:
    # a LayerNorm's singular point is every constant vector: the analyzer measures ‖x - mean x‖
    path = write_example_run(tmp_path / "ln.zarr", steps=2, factory="tests.models:layer_norm_mlp")
    result = run("normalization", path, lr=0.5).dataset.load()
    assert result["module"].values.tolist() == ["1"] and result["centered"].values.tolist() == [True]
    store = ckptstore.open(path)
    w = {k: np.asarray(v, np.float64) for k, v in store.tensors(int(store.steps[-1])).items()}
    hidden = store.data("eval")["inputs"].values.astype(np.float64) @ w["0.weight"].T + w["0.bias"]
    norms = np.linalg.norm(hidden - hidden.mean(-1, keepdims=True), axis=-1)
    np.testing.assert_allclose(
        result["norm_quantile"].isel(step=-1, module=0).values, np.quantile(norms, QUANTILES), rtol=1e-5
    )


# -- the conformance kit --------------------------------------------------------------------------

"""The ``sparse-modular-addition`` sandbox (Clustering Head): data, model, and a real short run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.errors import TaskError
from ckpt.sandboxes.base import train
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition, build_model
from tests.helpers import invoke_ckpt

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def data_for(seed: int = 0, **options: object):
    task = SparseModularAddition()
    config = task.config("default", options)
    return task, config, task.make_data(config, seed)


def test_data_matches_definition() -> None:
    _, _, data = data_for(seed=3)
    assert data.train_inputs.shape == (2048, 12)
    assert data.test_inputs.shape == (2048, 12)
    for inputs, targets in ((data.train_inputs, data.train_targets), (data.test_inputs, data.test_targets)):
        rows = inputs.tolist()
        assert set(np.unique(inputs.numpy())) == {0, 1}
        # recomputed one sequence at a time, in plain Python
        assert targets.tolist() == [sum(row[:5]) % 2 for row in rows]
    # uniform draws: each token value about half the time, targets balanced
    assert abs(data.train_inputs.float().mean().item() - 0.5) < 0.02
    assert abs(data.test_targets.float().mean().item() - 0.5) < 0.05


def test_stored_splits() -> None:
    _, _, data = data_for(seed=1)
    ev, tr = data.splits["eval"], data.splits["train"]
    inputs = np.concatenate([data.train_inputs.numpy(), data.test_inputs.numpy()])
    np.testing.assert_array_equal(ev["inputs"], inputs)
    np.testing.assert_array_equal(ev["targets"], np.concatenate([data.train_targets, data.test_targets]))
    np.testing.assert_array_equal(ev["labels"]["target"], ev["targets"])
    np.testing.assert_array_equal(ev["labels"]["split"], [0] * 2048 + [1] * 2048)
    # prefix: the first k=5 tokens read as a base-2 number, first token most significant
    expected = [int("".join(str(t) for t in row[:5]), 2) for row in inputs.tolist()]
    assert ev["labels"]["prefix"].tolist() == expected
    np.testing.assert_array_equal(tr["inputs"], data.train_inputs.numpy())
    np.testing.assert_array_equal(tr["targets"], data.train_targets.numpy())


def test_data_is_seeded() -> None:
    _, _, a = data_for(seed=7)
    _, _, b = data_for(seed=7)
    _, _, c = data_for(seed=8)
    assert torch.equal(a.train_inputs, b.train_inputs)
    assert torch.equal(a.test_inputs, b.test_inputs)
    assert not torch.equal(a.train_inputs, c.train_inputs)
    assert not torch.equal(a.train_inputs, a.test_inputs)


def test_p3_and_other_options() -> None:
    task, config, data = data_for(seed=0, p=3, k=4, length=9)
    assert data.train_inputs.shape == (2048, 9)
    assert set(np.unique(data.train_inputs.numpy())) == {0, 1, 2}
    assert data.train_targets.tolist() == [sum(r[:4]) % 3 for r in data.train_inputs.tolist()]
    prefixes = data.splits["eval"]["labels"]["prefix"]
    assert prefixes.max() < 3**4
    rows = data.splits["eval"]["inputs"]
    assert prefixes.tolist() == [((r[0] * 3 + r[1]) * 3 + r[2]) * 3 + r[3] for r in rows.tolist()]
    model = task.build_model(config)
    assert model(data.test_inputs[:5]).shape == (5, 3)


def test_bad_options_are_refused() -> None:
    with pytest.raises(TaskError, match="'k'"):
        data_for(k=13)
    with pytest.raises(TaskError, match="'p'"):
        data_for(p=1)


def test_model_parameters() -> None:
    model = build_model(p=3, length=12, hidden=32)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert shapes == {
        "embed.weight": (3, 2),
        "pos.weight": (12, 2),
        "attn.query": (2,),
        "attn.value.weight": (2, 2),
        "mlp.fc1.weight": (32, 2),
        "mlp.fc1.bias": (32,),
        "mlp.fc2.weight": (2, 32),
        "mlp.fc2.bias": (2,),
    }
    assert dict(model.named_parameters()).keys() == shapes.keys()  # no buffers, nothing frozen


def test_query_starts_like_a_linear_weight() -> None:
    # the paper's query is a bias-free Linear(2, 1): torch draws it uniformly in [-1/sqrt(2), 1/sqrt(2)]
    torch.manual_seed(0)
    queries = torch.stack([build_model().attn.query.detach() for _ in range(200)])
    assert queries.abs().max() <= 1 / math.sqrt(2)
    assert abs(queries.std().item() - (1 / math.sqrt(2)) / math.sqrt(3)) < 0.03  # std of U(-b, b) is b/sqrt(3)


def test_forward_matches_hand_computation() -> None:
    torch.manual_seed(0)
    model = build_model(p=2, length=12, hidden=8).eval()
    tokens = torch.randint(0, 2, (4, 12))
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    x = tokens.numpy()

    def rms(v: np.ndarray) -> np.ndarray:
        # RMS-norm without gain: divide by the root of the mean square, so |result| = sqrt(d)
        return v / np.sqrt((v**2).mean(axis=-1, keepdims=True))

    z = rms(w["embed.weight"][x] + w["pos.weight"][None])  # [4, 12, 2]
    scores = np.einsum("btd,d->bt", z, w["attn.query"]) / math.sqrt(2)
    a = np.exp(scores - scores.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    pooled = np.einsum("bt,btd->bd", a, z @ w["attn.value.weight"].T)

    with torch.no_grad():
        z_model = model.embeddings(tokens)
        # the paper's RMS-norm puts d=2 vectors on the circle of radius sqrt(2), not the unit circle
        np.testing.assert_allclose(np.linalg.norm(z_model.numpy(), axis=-1), math.sqrt(2), rtol=1e-6)
        np.testing.assert_allclose(model.attn.weights(z_model).numpy(), a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model.attn(z_model).numpy(), pooled, rtol=1e-5, atol=1e-6)
        logits = model(tokens).numpy()

    pre = rms(pooled) @ w["mlp.fc1.weight"].T + w["mlp.fc1.bias"]
    gelu = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    out = pooled + gelu @ w["mlp.fc2.weight"].T + w["mlp.fc2.bias"]
    np.testing.assert_allclose(logits, out @ w["embed.weight"].T, rtol=1e-5, atol=1e-6)


def test_forward_mode_ad() -> None:
    model = build_model()
    params = {k: v.detach() for k, v in model.named_parameters()}
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    tokens = torch.randint(0, 2, (3, 12))

    def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, p, (tokens,))

    _, jvp = torch.func.jvp(f, (params,), (tangents,))
    eps = 1e-3
    shifted = {k: params[k] + eps * tangents[k] for k in params}
    np.testing.assert_allclose(jvp, (f(shifted) - f(params)) / eps, rtol=0.05, atol=5e-3)


def test_short_run_writes_a_store_the_cli_reads(tmp_path: Path) -> None:
    path = tmp_path / "sma.zarr"
    task = SparseModularAddition()
    # smaller data than the preset's 2048 + 2048 keeps the run short; everything else is the default preset
    train(task, path, epochs=2, seed=0, train_size=512, test_size=256)
    store = ckptstore.open(path)
    assert store.steps.tolist() == [0, 16, 32]  # every epoch (512 / 32 steps)
    assert store.attrs["config"]["epochs"] == 100
    assert store.model.factory == "ckpt.sandboxes.sparse_modular_addition:build_model"
    assert store.objective == "cross-entropy"
    assert set(store.splits) == {"eval", "train"}
    metrics = store.metrics
    for name in ("train_loss", "test_loss", "train_accuracy", "test_accuracy"):
        assert metrics[name].shape == (3,)

    info = invoke_ckpt("info", str(path))
    assert info.returncode == 0, info.stderr
    result = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert result.returncode == 0, result.stderr

    stored = ckptstore.open(path).analysis("loss")
    step = 16
    row = int(np.flatnonzero(stored["step"].values == step)[0])
    model = store.model.build()
    model.load_state_dict(store.tensors(step, framework="torch"))
    data = store.data("eval")
    with torch.no_grad():
        logits = model(torch.from_numpy(data["inputs"].values))
        direct = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["targets"].values), reduction="none")
    np.testing.assert_allclose(stored["loss"].values[row], direct.double().numpy(), rtol=1e-5, atol=1e-6)
    # the test half of the eval split agrees with the metric the training loop wrote
    split = data["split"].values
    assert (split == 0).sum() == 512 and (split == 1).sum() == 256
    np.testing.assert_allclose(direct.numpy()[split == 1].mean(), metrics["test_loss"].values[1], rtol=1e-5)

"""The ``modular-addition`` sandbox: data, model, optimizer, and a real run through the real CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ckpt.store as ckptstore
from ckpt.sandboxes.base import train
from ckpt.sandboxes.modular_addition import ModularAddition, ModularAdditionModel, build_model
from tests.helpers import invoke_ckpt

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

N = 17


@pytest.fixture
def task() -> ModularAddition:
    return ModularAddition()


def test_data_is_every_unordered_pair_with_its_modular_sum(task: ModularAddition) -> None:
    data = task.make_data(task.config("default", {}), seed=0)
    eval_split = data.splits["eval"]
    inputs = np.asarray(eval_split["inputs"])
    assert inputs.dtype == np.int64 and inputs.shape == (153, 2)
    expected = {(a, b) for a in range(N) for b in range(a, N)}
    assert len(expected) == N * (N + 1) // 2 == 153
    pairs = [tuple(int(v) for v in row) for row in inputs]
    assert len(set(pairs)) == 153 and set(pairs) == expected
    targets = np.asarray(eval_split["targets"])
    assert targets.shape == (153,)
    assert [int(t) for t in targets] == [(a + b) % N for a, b in pairs]
    assert np.array_equal(np.asarray(eval_split["labels"]["sum"]), targets)


def test_split_is_80_20_disjoint_and_seeded(task: ModularAddition) -> None:
    config = task.config("default", {})
    data = task.make_data(config, seed=0)
    train_pairs = {tuple(r) for r in data.train_inputs.tolist()}
    test_pairs = {tuple(r) for r in data.test_inputs.tolist()}
    assert (len(train_pairs), len(test_pairs)) == (122, 31)  # round(0.8 * 153) training pairs
    assert len(data.train_inputs) == 122 and len(data.test_inputs) == 31  # no duplicates
    assert not train_pairs & test_pairs
    assert train_pairs | test_pairs == {(a, b) for a in range(N) for b in range(a, N)}
    for inputs, targets in ((data.train_inputs, data.train_targets), (data.test_inputs, data.test_targets)):
        assert targets.tolist() == [(a + b) % N for a, b in inputs.tolist()]
    # the stored split label agrees with the tensors the loop trains and tests on
    split = np.asarray(data.splits["eval"]["labels"]["split"])
    eval_pairs = [tuple(r) for r in np.asarray(data.splits["eval"]["inputs"]).tolist()]
    assert {p for p, s in zip(eval_pairs, split, strict=True) if s == 0} == train_pairs
    assert {p for p, s in zip(eval_pairs, split, strict=True) if s == 1} == test_pairs
    assert np.array_equal(np.asarray(data.splits["train"]["inputs"]), data.train_inputs.numpy())
    assert np.array_equal(np.asarray(data.splits["train"]["targets"]), data.train_targets.numpy())
    # seeded: the same seed gives the same split, another seed another one
    again = task.make_data(config, seed=0)
    assert torch.equal(again.train_inputs, data.train_inputs) and torch.equal(again.test_inputs, data.test_inputs)
    other = task.make_data(config, seed=1)
    assert {tuple(r) for r in other.test_inputs.tolist()} != test_pairs


def test_train_fraction_sets_the_split_and_refuses_an_empty_side(task: ModularAddition) -> None:
    data = task.make_data(task.config("default", {"train_fraction": 0.5}), seed=0)
    assert (len(data.train_inputs), len(data.test_inputs)) == (76, 77)  # round(0.5 * 153) = 76 (to even)
    from ckpt.errors import TaskError

    for fraction in (0.0, 1.0):
        with pytest.raises(TaskError, match="no training or no validation pair"):
            task.make_data(task.config("default", {"train_fraction": fraction}), seed=0)


def test_model_has_the_described_parameters(task: ModularAddition) -> None:
    model = task.build_model(task.config("default", {}))
    assert isinstance(model, ModularAdditionModel)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "embed.weight": (17, 2),
        "hidden.weight": (64, 2),
        "hidden.bias": (64,),
        "out.weight": (17, 64),
        "out.bias": (17,),
    }
    wide = task.build_model(task.config("default", {"n": 7, "d": 3, "hidden": 5}))
    assert {name: tuple(p.shape) for name, p in wide.named_parameters()}["hidden.weight"] == (5, 3)
    assert task.model_config(task.config("default", {})) == {"n": 17, "d": 2, "hidden": 64}


def test_constant_attention_adds_the_two_embeddings() -> None:
    torch.manual_seed(3)
    model = build_model(n=N, d=2, hidden=64)
    pairs = torch.tensor([[0, 0], [2, 5], [5, 2], [16, 16], [7, 11]])
    emb = model.embed.weight.detach()
    w1, b1 = model.hidden.weight.detach(), model.hidden.bias.detach()
    w2, b2 = model.out.weight.detach(), model.out.bias.detach()
    expected = []
    for a, b in pairs.tolist():
        h = emb[a] + emb[b]
        expected.append(w2 @ torch.clamp(w1 @ h + b1, min=0) + b2)
    with torch.no_grad():
        logits = model(pairs)
    torch.testing.assert_close(logits, torch.stack(expected))
    torch.testing.assert_close(logits[1], logits[2])  # a sum: order of the pair does not matter


def test_weight_decay_and_lr_reach_the_optimizer(task: ModularAddition) -> None:
    for decay in (0.0, 0.3, 1.0):
        config = task.config("default", {"weight_decay": decay, "lr": "0.02"})  # CLI strings are converted
        optimizer, scheduler = task.make_optimizer(task.build_model(config), config)
        assert isinstance(optimizer, torch.optim.AdamW) and scheduler is None
        assert [g["weight_decay"] for g in optimizer.param_groups] == [decay]
        assert [g["lr"] for g in optimizer.param_groups] == [0.02]
    # and weight decay acts: with lr > 0 and zero gradient, AdamW shrinks the weights by lr * decay
    config = task.config("default", {"weight_decay": 1.0, "lr": 0.1})
    model = task.build_model(config)
    before = model.hidden.weight.detach().clone()
    optimizer, _ = task.make_optimizer(model, config)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    torch.testing.assert_close(model.hidden.weight.detach(), before * (1 - 0.1 * 1.0))


def test_presets_and_registration() -> None:
    from ckpt.plugins.manager import registry
    from ckpt.plugins.tasks import resolve_task

    assert isinstance(resolve_task(registry().tasks["modular-addition"]), ModularAddition)
    for preset in ("default", "paper"):
        config = ModularAddition.presets[preset]
        assert (config["n"], config["d"], config["hidden"], config["batch_size"]) == (17, 2, 64, None)


def test_short_run_writes_a_store_the_cli_accepts(task: ModularAddition, tmp_path: Path) -> None:
    path = tmp_path / "run.zarr"
    store = train(task, path, steps=60, every=20, seed=5, weight_decay=0.6)
    assert store.attrs["config"]["weight_decay"] == 0.6  # the option was applied to this run
    assert store.model.factory == "ckpt.sandboxes.modular_addition:build_model"
    info = invoke_ckpt("info", str(path))
    assert info.returncode == 0, info.stderr
    analyzed = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr

    store = ckptstore.open(path)
    assert set(store.splits) >= {"eval", "train"}
    eval_data = store.data("eval")
    assert eval_data["inputs"].shape == (153, 2)
    split = eval_data["split"].values
    metrics = store.metrics.sel(step=60)
    result = store.analysis("loss")
    steps = [int(s) for s in result["step"].values]
    assert steps == [0, 20, 40, 60]
    mean_loss = float(result["mean_loss"].sel(step=60))
    # eval = train pairs + validation pairs, so its mean loss is the size-weighted mean of the
    # train and test losses the training loop logged
    n_train, n_test = int((split == 0).sum()), int((split == 1).sum())
    logged = (n_train * float(metrics["train_loss"]) + n_test * float(metrics["test_loss"])) / (n_train + n_test)
    assert mean_loss == pytest.approx(logged, rel=1e-5)
    # and it is the loss of the model rebuilt by hand from the stored weights
    model = build_model(**store.model.config)
    model.load_state_dict(store.tensors(60, framework="torch"))
    with torch.no_grad():
        direct = F.cross_entropy(
            model(torch.as_tensor(eval_data["inputs"].values)),
            torch.as_tensor(eval_data["targets"].values),
            reduction="none",
        )
    np.testing.assert_allclose(result["loss"].sel(step=60).values, direct.numpy(), rtol=1e-5, atol=1e-7)
    # training moved the weights and lowered the training loss
    assert float(store.metrics["train_loss"].sel(step=60)) < float(store.metrics["train_loss"].sel(step=0))

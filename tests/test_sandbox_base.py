"""The shared training loop of the sandboxes, on a small classification task."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.errors import TaskError
from ckpt.plugins import Dataset, Option, Task
from ckpt.sandboxes.base import checkpoint_steps, train


class Blobs(Task):
    """Four Gaussian blobs in 3-D, classified by tests.models:mlp (SGD, so a resume is exact)."""

    name = "blobs"
    description = "test task"
    factory = "tests.models:mlp"
    presets: ClassVar[dict] = {"default": {"steps": 12, "every": 4, "batch_size": 16, "lr": 0.1, "hidden": 8}}
    lr = Option(float, None, "learning rate")
    hidden = Option(int, None, "hidden units")

    def model_config(self, config):
        return {"d_in": 3, "hidden": config["hidden"], "classes": 4}

    def make_data(self, config, seed):
        g = torch.Generator().manual_seed(seed)
        centers = torch.randn(4, 3, generator=g) * 3
        targets = torch.randint(0, 4, (96,), generator=g)
        inputs = centers[targets] + torch.randn(96, 3, generator=g)
        return Dataset(
            inputs[:64],
            targets[:64],
            inputs[64:],
            targets[64:],
            splits={
                "eval": {"inputs": inputs, "targets": targets, "labels": {"split": (torch.arange(96) >= 64).long()}}
            },
        )

    def make_optimizer(self, model, config):
        return torch.optim.SGD(model.parameters(), lr=config["lr"]), None


class HalvingBlobs(Blobs):
    """Blobs under a schedule: the rate halves every 4 steps."""

    def make_optimizer(self, model, config):
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # resume's catch-up
def test_lr_metric_is_the_rate_in_force_at_each_checkpoint(tmp_path: Path) -> None:
    # the rate the next step uses, after the schedule stepped: 0.1 from step 0, 0.05 from step 4, ...
    store = train(HalvingBlobs(), tmp_path / "run.zarr", seed=1)
    np.testing.assert_allclose(store.metrics["lr"].sel(step=[0, 4, 8, 12]).values, [0.1, 0.05, 0.025, 0.0125])
    resumed = train(HalvingBlobs(), tmp_path / "run.zarr", steps=16, seed=1, resume=True)
    assert float(resumed.metrics["lr"].sel(step=16)) == pytest.approx(0.00625)


def test_checkpoint_schedule() -> None:
    assert checkpoint_steps(10, 4, False) == [0, 4, 8, 10]
    dense = checkpoint_steps(1000, 500, True)
    assert dense[:5] == [0, 1, 2, 3, 4] and dense[-1] == 1000 and 500 in dense


def test_train_writes_checkpoints_metrics_and_data(tmp_path: Path) -> None:
    store = train(Blobs(), tmp_path / "run.zarr", seed=1)
    assert store.steps.tolist() == [0, 4, 8, 12]
    assert store.model == ckptstore.ModelSpec("tests.models:mlp", {"d_in": 3, "hidden": 8, "classes": 4})
    assert set(store.metrics.data_vars) == {"train_loss", "train_accuracy", "test_loss", "test_accuracy", "lr"}
    assert store.metrics["train_loss"].values[-1] < store.metrics["train_loss"].values[0]
    assert store.data("eval").attrs["labels"] == ["split"]
    assert store.attrs["task"] == "blobs" and store.attrs["seed"] == 1


def test_options_override_presets_and_are_checked(tmp_path: Path) -> None:
    store = train(Blobs(), tmp_path / "a.zarr", hidden=5, steps=4, every=2)
    assert store.schema["0.weight"].shape == (5, 3)
    assert store.steps.tolist() == [0, 2, 4]
    with pytest.raises(TaskError, match="has no option 'width'"):
        train(Blobs(), tmp_path / "b.zarr", width=3)
    with pytest.raises(TaskError, match="has no preset 'paper'"):
        train(Blobs(), tmp_path / "c.zarr", preset="paper")


def test_existing_store_is_refused_unless_resumed_and_resume_is_exact(tmp_path: Path) -> None:
    whole = train(Blobs(), tmp_path / "whole.zarr", steps=12, every=4)
    train(Blobs(), tmp_path / "part.zarr", steps=6, every=4)
    with pytest.raises(TaskError, match="already exists; pass --resume"):
        train(Blobs(), tmp_path / "part.zarr", steps=12, every=4)
    resumed = train(Blobs(), tmp_path / "part.zarr", steps=12, every=4, resume=True)
    assert resumed.steps.tolist() == [0, 4, 6, 8, 12]
    for name, value in whole.tensors(12).items():  # plain SGD has no state: resuming is exact
        np.testing.assert_allclose(resumed.tensors(12)[name], value, rtol=1e-6, atol=1e-7)


class WarmBlobs(Blobs):
    """Blobs with a linear warm-up schedule; records the learning rate of every optimizer step."""

    rates: ClassVar[list[float]] = []

    def make_optimizer(self, model, config):
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.rates.append(opt.param_groups[0]["lr"]))
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(step / 8, 1.0))


def test_a_resumed_schedule_gives_every_step_the_uninterrupted_rate_without_warning(tmp_path: Path) -> None:
    WarmBlobs.rates = []
    train(WarmBlobs(), tmp_path / "whole.zarr", steps=12, every=4)
    whole, WarmBlobs.rates = WarmBlobs.rates, []
    train(WarmBlobs(), tmp_path / "part.zarr", steps=6, every=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "lr_scheduler.step() before optimizer.step()" was printed
        train(WarmBlobs(), tmp_path / "part.zarr", steps=12, every=4, resume=True)
    assert WarmBlobs.rates == whole and len(whole) == 12
    assert whole[:2] == [0.0, 0.1 / 8]


def test_small_cpu_model_trains_on_one_thread_and_restores_the_count(tmp_path: Path) -> None:
    seen: list[int] = []

    class CountingBlobs(Blobs):
        def per_datapoint_loss(self, outputs, targets, mask):
            seen.append(torch.get_num_threads())
            return super().per_datapoint_loss(outputs, targets, mask)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(CountingBlobs(), tmp_path / "threads.zarr", steps=4, every=4)
        assert seen and set(seen) == {1}  # a ~100-parameter model: one thread for every step
        assert torch.get_num_threads() == 2  # and the caller's setting is back afterwards
    finally:
        torch.set_num_threads(before)

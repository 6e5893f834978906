"""The ``addition`` sandbox: data as defined, a causal jvp-able model, and a real store the CLI accepts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.sandboxes import TASKS
from ckpt.sandboxes.addition import ANSWER_POSITIONS, Addition, build_model, split_arrays
from ckpt.sandboxes.base import train
from tests.helpers import assert_causal, invoke_ckpt

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

TINY = {"layers": 1, "d_model": 16, "heads": 2, "d_mlp": 32}


@pytest.fixture(scope="module")
def data():
    task = Addition()
    return task.make_data(task.config("default", {}), seed=0)


def test_the_task_is_registered_where_the_package_looks() -> None:
    assert TASKS["addition"][0] == "ckpt.sandboxes.addition:Addition"
    assert Addition.objective == "token-cross-entropy"
    assert Addition.factory == "ckpt.sandboxes.addition:build_model"
    assert {"default", "paper"} <= set(Addition.presets)
    assert set(Addition.option_spec()) == {
        "layers",
        "d_model",
        "heads",
        "d_mlp",
        "lr",
        "weight_decay",
        "batch_size",
        "warmup",
    }


def test_eval_split_matches_the_definition(data) -> None:
    split = data.splits["eval"]
    inputs, targets, mask = split["inputs"], split["targets"], split["mask"]
    assert inputs.shape == targets.shape == mask.shape == (1250, 11)
    assert inputs.dtype == targets.dtype == np.int64 and mask.dtype == np.bool_
    assert mask.sum() == 5000
    assert (mask.sum(1) == 4).all() and mask[:, 7:].all() and not mask[:, :7].any()
    place, carry = split["labels"]["place"], split["labels"]["carry"]
    assert place.shape == carry.shape == (1250, 11)
    for i, text in enumerate(split["text"]):
        # recompute everything from the string alone
        assert len(text) == 12 and text[3] == "+" and text[7] == "="
        a, b, answer = int(text[:3]), int(text[4:7]), text[8:]
        assert int(answer) == a + b and len(answer) == 4
        sequence = [int(c) if c.isdigit() else {"+": 10, "=": 11}[c] for c in text]
        assert inputs[i].tolist() == sequence[:11]
        assert targets[i].tolist() == sequence[1:]
        assert [str(t) for t in targets[i, 7:]] == list(answer)
        assert place[i, 7:].tolist() == [0, 1, 2, 3]
        expected = [a + b >= 1000, a % 100 + b % 100 >= 100, a % 10 + b % 10 >= 10, False]
        assert carry[i, 7:].tolist() == [int(c) for c in expected], text
    assert len(set(split["text"])) == 1250, "distinct problems"
    # both carry values occur at the three places that can receive one
    assert {0, 1} <= set(carry[:, 7].tolist()) and {0, 1} <= set(carry[:, 9].tolist())


def test_train_and_held_out_problems_are_disjoint(data) -> None:
    def ids(inputs: torch.Tensor | np.ndarray) -> set[int]:
        digits = np.asarray(inputs)
        a = digits[:, 0] * 100 + digits[:, 1] * 10 + digits[:, 2]
        b = digits[:, 4] * 100 + digits[:, 5] * 10 + digits[:, 6]
        return set((a * 1000 + b).tolist())

    held_out = ids(data.test_inputs)
    training = ids(data.train_inputs)
    config = Addition().config("default", {})
    assert len(data.train_inputs) == config["steps"] * config["batch_size"] == len(training), "no repeats"
    assert len(held_out) == 1250 and not held_out & training
    assert ids(data.splits["train"]["inputs"]) <= training
    assert torch.equal(data.test_inputs, torch.from_numpy(data.splits["eval"]["inputs"]))
    assert data.train_mask.sum() == 4 * len(data.train_inputs)
    assert torch.equal(data.train_targets[:, :-1], data.train_inputs[:, 1:]), "targets are the next tokens"


def test_split_arrays_on_hand_picked_problems() -> None:
    split = split_arrays(np.array([999, 5, 50, 123]), np.array([1, 5, 50, 456]))
    assert split["text"] == ["999+001=1000", "005+005=0010", "050+050=0100", "123+456=0579"]
    carry = split["labels"]["carry"][:, list(ANSWER_POSITIONS)]
    assert carry.tolist() == [[1, 1, 1, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]


def test_model_parameter_names_and_shapes() -> None:
    model = build_model(layers=2, d_model=16, heads=2, d_mlp=32)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    expected = {"embed.weight": (12, 16), "pos.weight": (11, 16), "unembed.weight": (12, 16), "unembed.bias": (12,)}
    expected |= {"ln_final.weight": (16,), "ln_final.bias": (16,)}
    # each block's layers: (name, output width, input width); every layer has a bias of its output width
    block = (("ln1", 16, None), ("qkv", 48, 16), ("out", 16, 16), ("ln2", 16, None))
    block += (("fc_in", 32, 16), ("fc_out", 16, 32))
    for i in range(2):
        for layer, width, fan_in in block:
            expected[f"blocks.{i}.{layer}.weight"] = (width,) if fan_in is None else (width, fan_in)
            expected[f"blocks.{i}.{layer}.bias"] = (width,)
    assert shapes == expected
    assert set(model.state_dict()) == set(shapes), "no buffers: the store holds exactly the parameters"
    with pytest.raises(ValueError, match="divisible"):
        build_model(layers=1, d_model=10, heads=3, d_mlp=8)


def test_model_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model(**TINY).eval()
    assert_causal(model, vocab=12, length=11, position=6, batch=4)


def test_paper_preset_has_about_9_5_million_parameters() -> None:
    task = Addition()
    config = task.config("paper", {})
    assert (config["layers"], config["d_model"], config["heads"], config["d_mlp"]) == (3, 512, 4, 2048)
    assert (config["lr"], config["weight_decay"], config["batch_size"], config["steps"]) == (1e-5, 0.1, 64, 10_000)
    count = sum(p.numel() for p in task.build_model(config).parameters())
    print(f"paper preset: {count:,} parameters")
    assert count == 9_476_108  # 3 * 12 * 512**2 weights + biases, LayerNorms, embeddings
    assert 9.4e6 < count < 9.6e6


def test_options_override_the_preset_and_the_optimizer_follows_the_paper() -> None:
    task = Addition()
    config = task.config("default", {"d_model": "32", "lr": 0.01, "warmup": 10, "heads": None})
    assert config["d_model"] == 32 and config["lr"] == 0.01 and config["heads"] == Addition.presets["default"]["heads"]
    model = build_model(**{**TINY, "d_model": 32})
    optimizer, scheduler = task.make_optimizer(model, config)
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.95) and group["weight_decay"] == config["weight_decay"]
    lrs = []
    for _ in range(12):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    np.testing.assert_allclose(lrs, [0.01 * min(i / 10, 1) for i in range(12)])


def test_forward_mode_ad_through_the_model() -> None:
    from torch.func import functional_call, jvp

    torch.manual_seed(0)
    inputs = torch.randint(0, 12, (3, 11))
    for dtype in (torch.float32, torch.float64):
        model = build_model(**TINY).to(dtype).eval()
        params = {k: v.detach() for k, v in model.named_parameters()}
        tangents = {k: torch.randn_like(v) for k, v in params.items()}

        def logits(p: dict[str, torch.Tensor], model: torch.nn.Module = model) -> torch.Tensor:
            return functional_call(model, p, (inputs,))

        outputs, derivative = jvp(logits, (params,), (tangents,))
        assert derivative.shape == outputs.shape == (3, 11, 12)
        assert derivative.dtype == dtype and torch.isfinite(derivative).all()
    # in float64 the directional derivative agrees with a central finite difference
    eps = 1e-6
    plus = logits({k: v + eps * tangents[k] for k, v in params.items()})
    minus = logits({k: v - eps * tangents[k] for k, v in params.items()})
    torch.testing.assert_close(derivative, (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-5)


def test_short_run_writes_a_store_the_cli_accepts(tmp_path: Path) -> None:
    path = tmp_path / "addition.zarr"
    store = train(Addition(), path, steps=20, every=10, **TINY, batch_size=32)
    assert store.steps.tolist() == [0, 10, 20]
    assert store.objective == "token-cross-entropy"
    assert set(store.splits) == {"eval", "train"}
    assert {"train_accuracy", "test_accuracy", "train_loss", "test_loss"} <= set(store.metrics.data_vars)
    eval_data = store.data("eval")
    assert eval_data.attrs["datapoints"] == 5000 and eval_data.attrs["labels"] == ["carry", "place"]

    info = invoke_ckpt("info", str(path))
    assert info.returncode == 0, info.stderr
    analyzed = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert analyzed.returncode == 0, analyzed.stderr

    loss = ckptstore.open(path).analysis("loss")
    assert loss.sizes["datapoint"] == 5000
    assert sorted(set(loss["position"].values.tolist())) == list(ANSWER_POSITIONS)
    assert loss["example"].values.tolist() == np.repeat(np.arange(1250), 4).tolist()
    # the analyzer's losses are the training loop's: test_loss is the mean over the same 5,000 tokens
    np.testing.assert_allclose(
        loss["mean_loss"].values, ckptstore.open(path).metrics["test_loss"].values, rtol=1e-5, atol=1e-6
    )


def test_a_run_longer_than_its_preset_draws_fresh_problems_for_every_step(tmp_path: Path) -> None:
    drawn: list[torch.Tensor] = []

    class ShortPreset(Addition):
        presets: ClassVar[dict] = {"default": {**Addition.presets["default"], **TINY, "steps": 3, "batch_size": 4}}

        def make_data(self, config, seed):
            data = super().make_data(config, seed)
            drawn.append(data.train_inputs)
            return data

    train(ShortPreset(), tmp_path / "long.zarr", steps=6, every=6)
    train(ShortPreset(), tmp_path / "short.zarr", steps=2, every=2)
    long_run, short_run = drawn
    # 6 steps of 4: 24 distinct problems (one epoch), not the preset's 12 seen twice
    assert long_run.shape[0] == 24 and len({tuple(row.tolist()) for row in long_run}) == 24
    assert short_run.shape[0] == 12  # a shorter run keeps the preset's data (the demo's --steps 400 unchanged)


PINNED_RUN = """
import hashlib, sys
from ckpt.sandboxes.reproducible import pin_cpu_kernels
if sys.argv[1] == "pin":
    assert pin_cpu_kernels() is None
from ckpt.sandboxes.addition import Addition
from ckpt.sandboxes.base import train
store = train(Addition(), sys.argv[2], steps=30, every=30, seed=0, device="cpu")
print(store.attrs["cpu_kernels"])
print(hashlib.sha256(b"".join(v.tobytes() for v in store.tensors(30).values())).hexdigest())
"""


def test_pinned_kernels_train_the_same_weights_whatever_the_instruction_set(tmp_path: Path) -> None:
    def trained(mode: str, name: str, **environ: str) -> list[str]:
        unset = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
        env = {key: value for key, value in os.environ.items() if key not in unset}
        done = subprocess.run(
            [sys.executable, "-c", PINNED_RUN, mode, str(tmp_path / name)],
            capture_output=True,
            text=True,
            env={**env, **environ},
            check=True,
            timeout=300,
        )
        return done.stdout.split()

    pinned = trained("pin", "pinned.zarr")
    assert pinned[0] == "DEFAULT/2" and pinned[1] == "threads"
    # MKL allowed another instruction set (what another CPU would pick): the same weights
    assert trained("pin", "pinned-avx512.zarr", MKL_ENABLE_INSTRUCTIONS="AVX512")[-1] == pinned[-1]
    # the control: unpinned, torch's AVX2 and AVX-512 kernels train other weights
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("the control needs an AVX-512 CPU")
    fast = trained("fast", "avx512.zarr", ATEN_CPU_CAPABILITY="avx512")
    assert fast[0].startswith("AVX512/")
    assert trained("fast", "avx2.zarr", ATEN_CPU_CAPABILITY="avx2")[-1] != fast[-1]

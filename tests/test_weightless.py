"""A worker's model is built without weights (``ckpt.numerics.weightless``): what it must still get right.

Every parameter comes from the checkpoints: a tied pair stored under either of its
names, a buffer the model computes itself (not in any checkpoint) kept, a parameter the
checkpoints lack refused with one ``Error:`` line, and no other thread's modules touched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ckpt
import ckpt.store as ckptstore
from ckpt.engine.worker import TaskSpec, clear_cache
from ckpt.numerics.weightless import _parameters_on_meta, unstored_parameters, weightless_model
from ckpt.plugins import Worker
from tests.helpers import assert_refused
from tests.models import mlp, tied_lm

VOCAB, D = 7, 4


def write_store(
    path: Path, factory: str, tensors_of: Callable[[int], dict[str, np.ndarray]], steps: int = 2, **data: Any
) -> Path:
    writer = ckptstore.create(path, model=factory, objective=data.pop("objective", "cross-entropy"))
    writer.add_data("eval", **data)
    for step in range(steps):
        writer.write(step, tensors_of(step))
    writer.close()
    return path


def tied_tensors(step: int, name: str) -> dict[str, np.ndarray]:
    torch.manual_seed(step)
    model = tied_lm(VOCAB, D)
    # state_dict holds the tied table twice; keep it under one name only, as safetensors files do
    tensors = {k: v.numpy() for k, v in model.state_dict().items() if k not in ("embed.weight", "out.weight")}
    tensors[name] = model.embed.weight.detach().numpy()
    return tensors


@pytest.mark.parametrize("stored_as", ["embed.weight", "out.weight"])
def test_a_tied_pair_stored_under_either_name_gives_the_true_losses(tmp_path: Path, stored_as: str) -> None:
    ids = np.random.default_rng(0).integers(0, VOCAB, (5, 6))
    path = write_store(
        tmp_path / "run.zarr",
        "tests.models:tied_lm",
        lambda step: tied_tensors(step, stored_as),
        inputs=ids,
        objective="causal-lm",
    )
    result = ckpt.analyze("loss", path, progress=False)
    for step in (0, 1):
        reference = tied_lm(VOCAB, D).eval()
        tensors = {k: torch.from_numpy(v) for k, v in tied_tensors(step, stored_as).items()}
        reference.load_state_dict(tensors, strict=False)  # either name fills the one tied parameter
        assert torch.equal(reference.embed.weight, tensors[stored_as])
        with torch.no_grad():
            logits = reference(torch.from_numpy(ids))[:, :-1]
            expected = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(ids)[:, 1:].flatten(), reduction="none")
        np.testing.assert_allclose(result["loss"].sel(step=step).values, expected.double().numpy(), rtol=1e-6)


def test_the_worker_model_keeps_the_buffers_its_code_computes_and_ties_the_stand_ins(tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, VOCAB, (3, 4))
    path = write_store(
        tmp_path / "run.zarr",
        "tests.models:tied_lm",
        lambda step: tied_tensors(step, "embed.weight"),
        inputs=ids,
        objective="causal-lm",
    )
    clear_cache()
    try:
        model = Worker(TaskSpec(str(path))).model
        torch.testing.assert_close(model.scale, torch.linspace(0.5, 1.5, D), rtol=0, atol=0)
        assert model.out.weight is model.embed.weight, "one stand-in for the tied pair"
        for name, parameter in model.named_parameters():
            assert parameter.device.type == "cpu" and parameter.untyped_storage().nbytes() <= 4, name
    finally:
        clear_cache()


def test_a_parameter_the_checkpoints_lack_is_one_error_line(tmp_path: Path) -> None:
    def tensors(step: int) -> dict[str, np.ndarray]:
        torch.manual_seed(step)
        return {k: v.numpy() for k, v in mlp().state_dict().items() if k != "2.bias"}

    rng = np.random.default_rng(0)
    path = write_store(
        tmp_path / "run.zarr",
        "tests.models:mlp",
        tensors,
        inputs=rng.standard_normal((6, 3)).astype(np.float32),
        targets=rng.integers(0, 4, 6),
    )
    # before, the module's own random bias stood in for the missing one, silently
    assert_refused(path, "loss", [], "1 parameter(s) its checkpoints do not hold: '2.bias'")


def test_unstored_parameters_counts_a_tied_pair_once() -> None:
    model = tied_lm()
    stored = {"mix.weight", "mix.bias"}
    assert unstored_parameters(model, stored) == ["embed.weight"]
    assert unstored_parameters(model, stored | {"out.weight"}) == []


def test_only_the_building_thread_gets_weightless_parameters() -> None:
    inside, done = threading.Event(), threading.Event()
    original = torch.nn.Module.register_parameter
    built: dict[str, torch.nn.Module] = {}

    def build_weightless() -> None:
        with _parameters_on_meta():
            built["weightless"] = torch.nn.Linear(3, 2)
            inside.set()
            done.wait(timeout=30)

    thread = threading.Thread(target=build_weightless)
    thread.start()
    assert inside.wait(timeout=30)
    other = torch.nn.Linear(3, 2)  # in this thread, while the other one builds
    done.set()
    thread.join()
    assert built["weightless"].weight.device.type == "meta"
    assert other.weight.device.type == "cpu" and other.weight.abs().sum() > 0, "initialised as usual"
    assert torch.nn.Module.register_parameter is original, "put back once no thread builds"


def test_weightless_model_of_gpt2_ties_head_and_embedding() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=11, n_positions=8)
    stored = set(transformers.GPT2LMHeadModel(config).state_dict()) - {"lm_head.weight"}
    model = weightless_model(lambda: transformers.GPT2LMHeadModel(config), stored, "cpu", torch.float64)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert all(p.dtype == torch.float64 and p.device.type == "cpu" for p in model.parameters())

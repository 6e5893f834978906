"""``attention`` (Clustering Head Fig. 8) against weights recomputed by hand or by the module itself.

The sparse-modular-addition sandbox's weights are recomputed in numpy from the stored
tensors (softmax(z·q/√d)); an ``nn.MultiheadAttention`` model's equal the module's own
``need_weights=True`` output; the addition sandbox's causal heads are recomputed in numpy;
the start-to-end correlation equals ``numpy.corrcoef``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run
from ckpt.sandboxes.addition import Addition
from ckpt.sandboxes.base import train
from tests.helpers import assert_refused, sparse_modular_store

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

SMALL = {"steps": 8, "every": 4, "seed": 0, "train_size": 32, "test_size": 32}
"""Checkpoints at steps 0, 4 and 8; 64 eval sequences."""


store = sparse_modular_store("attention", SMALL)


def weights(path: Path, step: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in ckptstore.open(path).tensors(step).items()}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_the_sandbox_query_weights_equal_a_softmax_by_hand(store: Path) -> None:
    result = run("attention", store, examples=40).dataset.load()
    assert result["weights"].dims == ("step", "layer", "head", "example", "query", "key")
    assert result["layer"].values.tolist() == ["attn"] and result.sizes["example"] == 40
    tokens = ckptstore.open(store).data("eval")["inputs"].values[:40]
    by_hand = {}
    for step in (0, 4, 8):
        w = weights(store, step)
        embedded = w["embed.weight"][tokens] + w["pos.weight"][None]
        z = embedded / np.sqrt((embedded**2).mean(-1, keepdims=True) + 1e-12)
        by_hand[step] = softmax(z @ w["attn.query"] / math.sqrt(2))  # [examples, positions]
        stored = result["weights"].sel(step=step).values[0, 0, :, 0]
        np.testing.assert_allclose(stored, by_hand[step], rtol=1e-5, atol=1e-7)
    for step in (4, 8):
        expected = np.corrcoef(by_hand[0].ravel(), by_hand[step].ravel())[0, 1]
        np.testing.assert_allclose(float(result["start_end_correlation"].sel(step=step)[0, 0]), expected, rtol=1e-5)
    assert float(result["start_end_correlation"].sel(step=0)[0, 0]) == pytest.approx(1.0)


def test_multihead_attention_weights_equal_the_modules_own(tmp_path: Path) -> None:
    torch.manual_seed(0)
    from tests.models import multihead_classifier

    model = multihead_classifier()
    tokens = torch.randint(0, 5, (12, 6))
    targets = torch.randint(0, 3, (12,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    path = tmp_path / "mha.zarr"
    with ckptstore.create(path, model="tests.models:multihead_classifier", objective="cross-entropy") as writer:
        writer.add_data("eval", inputs=tokens.numpy(), targets=targets.numpy())
        for step in range(2):
            writer.write(step, model)
            loss = torch.nn.functional.cross_entropy(model(tokens), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    result = run("attention", path, batch_size=5).dataset.load()  # chunks of 5, 5 and 2 examples
    assert result["layer"].values.tolist() == ["attn"] and result.sizes["head"] == 2
    for step in (0, 1):
        fresh = multihead_classifier()
        fresh.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in ckptstore.open(path).tensors(step).items()})
        x = fresh.embed(tokens)
        with torch.no_grad():
            _, own = fresh.attn(x, x, x, need_weights=True, average_attn_weights=False)
        np.testing.assert_allclose(result["weights"].sel(step=step).values[0], own.numpy().transpose(1, 0, 2, 3))


def test_the_addition_sandbox_causal_heads_equal_a_softmax_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "addition.zarr"
    train(Addition(), path, steps=2, every=2, batch_size=16, layers=1, d_model=8, heads=2, d_mlp=16)
    result = run("attention", path, examples=6).dataset.load()
    assert result["layer"].values.tolist() == ["blocks.0"]
    w = weights(path, 2)
    tokens = ckptstore.open(path).data("eval")["inputs"].values[:6]
    seq = tokens.shape[1]
    x = w["embed.weight"][tokens] + w["pos.weight"][:seq][None]
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    h = h * w["blocks.0.ln1.weight"] + w["blocks.0.ln1.bias"]
    q, k, _ = np.split(h @ w["blocks.0.qkv.weight"].T + w["blocks.0.qkv.bias"], 3, axis=-1)
    q, k = q.reshape(6, seq, 2, 4).transpose(0, 2, 1, 3), k.reshape(6, seq, 2, 4).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / 2.0
    scores[..., np.triu(np.ones((seq, seq), bool), 1)] = -np.inf
    expected = softmax(scores)  # [example, head, query, key]
    np.testing.assert_allclose(
        result["weights"].sel(step=2).values[0], expected.transpose(1, 0, 2, 3), rtol=1e-4, atol=1e-6
    )


def test_bad_input_is_one_error_line_and_leaves_the_store(store: Path, tmp_path: Path) -> None:
    mlp_store = write_example_run(tmp_path / "mlp.zarr", steps=2)
    for path, args, expected in (
        (
            mlp_store,
            [],
            "has no attention the attention analyzer can read: looked for modules with an attention_weights",
        ),
        (store, ["--max-memory", "1KiB"], "pass a smaller --examples or raise --max-memory"),
        (store, ["--split", "test"], "pass --split one of"),
    ):
        assert_refused(path, "attention", args, expected)


def test_gpt2_attentions_equal_the_models_own_eager_output(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.helpers import write_gpt2_run

    path = write_gpt2_run(tmp_path, checkpoints=1, sequences=3, length=8)
    result = run("attention", path).dataset.load()
    assert result["layer"].values.tolist() == ["attentions.0", "attentions.1"]
    assert [result.sizes[d] for d in ("head", "example", "query", "key")] == [4, 3, 8, 8]
    store = ckptstore.open(path)
    step = int(store.steps[-1])
    model = store.model.build()
    model.set_attn_implementation("eager")
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in store.tensors(step).items()}, strict=False)
    tokens = torch.from_numpy(store.data("eval")["inputs"].values)
    with torch.no_grad():
        own = model(tokens, output_attentions=True).attentions
    for layer, expected in enumerate(own):
        np.testing.assert_allclose(
            result["weights"].sel(step=step).values[layer], expected.numpy().transpose(1, 0, 2, 3), atol=1e-6
        )

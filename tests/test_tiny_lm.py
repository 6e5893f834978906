"""The ``tiny-lm`` sandbox: its bundled text, data as defined (recomputed here), the model, a real store."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.errors import TaskError
from ckpt.sandboxes import TASKS
from ckpt.sandboxes.base import train
from ckpt.sandboxes.tiny_lm import TEXT_PATH, TinyLM, build_model
from tests.helpers import assert_causal, run_ckpt

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"layers": 1, "d_model": 16, "heads": 2, "d_mlp": 32, "vocab": 128, "context": 12, "eval_sequences": 8}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def data():
    task = TinyLM()
    return task.make_data(task.config("default", {}), seed=0)


def reference_windows(context: int, vocab: int) -> tuple[str, list[tuple[int, int]], list[int], list[str]]:
    """The task's definition recomputed from the file: text, token spans, token ids, vocabulary."""
    text = re.sub(r"\s+", " ", TEXT_PATH.read_text()).strip()
    spans = [m.span() for m in re.finditer(r"[A-Za-z]+(?:'[A-Za-z]+)*|\d+|[^\sA-Za-z\d]", text)]
    counts = Counter(text[a:b].lower() for a, b in spans)
    words = ["<unk>", *sorted(counts, key=lambda w: (-counts[w], w))[: vocab - 1]]
    index = {w: i for i, w in enumerate(words)}
    ids = [index.get(text[a:b].lower(), 0) for a, b in spans]
    return text, spans, ids, words


def test_the_task_is_registered_where_the_package_looks() -> None:
    assert TASKS["tiny-lm"][0] == "ckpt.sandboxes.tiny_lm:TinyLM"
    assert TinyLM.objective == "token-cross-entropy"
    assert TinyLM.factory == "ckpt.sandboxes.tiny_lm:build_model"
    assert {"default", "large"} <= set(TinyLM.presets)
    for preset in TinyLM.presets.values():
        assert set(TinyLM.option_spec()) <= set(preset), "every option has a preset value"


def test_the_text_is_bundled_small_public_domain_and_packaged() -> None:
    raw = TEXT_PATH.read_bytes()
    assert 100_000 <= len(raw) <= 300_000
    raw.decode("ascii")
    assert raw.startswith(b"THE BROTHERS GRIMM FAIRY TALES")
    readme = (TEXT_PATH.parent / "README.md").read_text()
    assert "Project Gutenberg" in readme and "#2591" in readme and "public domain" in readme
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "data/*.txt" in pyproject["tool"]["setuptools"]["package-data"]["ckpt.sandboxes"]


def test_eval_split_matches_the_definition(data) -> None:
    config = TinyLM().config("default", {})
    context, vocab = config["context"], config["vocab"]
    text, spans, ids, words = reference_windows(context, vocab)
    windows = list(range(0, len(spans) - context, context + 1))
    held_out = windows[9::10][: config["eval_sequences"]]
    split = data.splits["eval"]
    assert split["inputs"].shape == split["targets"].shape == (config["eval_sequences"], context)
    assert split["mask"].all() and split["mask"].shape == (config["eval_sequences"], context), "every token counts"
    for row, first in enumerate(held_out):
        sequence = ids[first : first + context + 1]
        assert split["inputs"][row].tolist() == sequence[:-1]
        assert split["targets"][row].tolist() == sequence[1:]
        window_text = text[spans[first][0] : spans[first + context][1]]
        assert split["text"][row] == window_text
        offset = spans[first][0]
        for p in range(context):
            a, b = spans[first + 1 + p]
            start, end = split["labels"]["char_start"][row, p], split["labels"]["char_end"][row, p]
            assert (start, end) == (a - offset, b - offset)
            word = window_text[start:end]
            target = int(split["targets"][row, p])
            # the stored word decodes the target: its vocabulary entry, or <unk> for rare words
            assert words[target] == (word.lower() if word.lower() in words else "<unk>")
    assert len(words) == vocab and (np.asarray(ids) == 0).mean() < 0.2


def test_training_windows_are_the_others(data) -> None:
    held_out = {tuple(row) for row in data.splits["eval"]["inputs"].tolist()}
    training = {tuple(row) for row in data.train_inputs.tolist()}
    assert not held_out & training
    assert len(data.train_inputs) == 681 and torch.equal(data.train_targets[:, :-1], data.train_inputs[:, 1:])
    assert data.train_mask is None and bool(data.test_mask.all())
    assert np.array_equal(data.splits["train"]["inputs"], data.train_inputs[:64].numpy())


def test_model_shapes_causality_and_forward_mode_ad() -> None:
    from torch.func import functional_call, jvp

    torch.manual_seed(0)
    model = build_model(layers=1, d_model=16, heads=2, d_mlp=32, vocab=50, max_len=12).eval()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["embed.weight"] == (50, 16) and shapes["pos.weight"] == (12, 16)
    assert shapes["unembed.weight"] == (50, 16)
    inputs = assert_causal(model, vocab=50, length=12, position=5)
    params = {k: v.detach() for k, v in model.named_parameters()}
    tangents = {k: torch.randn_like(v) for k, v in params.items()}
    _, derivative = jvp(lambda p: functional_call(model, p, (inputs,)), (params,), (tangents,))
    assert derivative.shape == (3, 12, 50) and torch.isfinite(derivative).all()


def test_options_override_the_preset_and_bad_sizes_say_what_fits() -> None:
    task = TinyLM()
    config = task.config("default", {"context": "8", "vocab": 64})
    assert config["context"] == 8 and config["vocab"] == 64 and config["layers"] == 2
    assert task.model_config(config)["max_len"] == 8 and task.model_config(config)["vocab"] == 64
    with pytest.raises(TaskError, match=r"--eval-sequences must be between 1 and \d+"):
        task.make_data(task.config("default", {"eval_sequences": 10_000}), seed=0)
    with pytest.raises(TaskError, match="option 'vocab' of task 'tiny-lm' must be at least 2, got 1"):
        task.config("default", {"vocab": 1})


def test_short_run_writes_a_store_the_cli_accepts(tmp_path: Path) -> None:
    path = tmp_path / "tiny-lm.zarr"
    store = train(TinyLM(), path, steps=20, every=10, batch_size=16, **SMALL)
    assert store.steps.tolist() == [0, 10, 20]
    assert store.objective == "token-cross-entropy" and set(store.splits) == {"eval", "train"}
    eval_data = store.data("eval")
    assert eval_data.attrs["datapoints"] == 8 * 12
    assert eval_data.attrs["labels"] == ["char_end", "char_start"]
    train_loss = store.metrics["train_loss"].values
    assert train_loss[-1] < train_loss[0] - 0.1, train_loss

    info = run_ckpt("info", str(path), extra_env=ONE_THREAD)
    assert info.returncode == 0, info.stderr
    analyzed = run_ckpt("analyze", "loss", str(path), "--no-progress", "--scheduler", "sync", extra_env=ONE_THREAD)
    assert analyzed.returncode == 0, analyzed.stderr
    loss = ckptstore.open(path).analysis("loss")
    assert loss.sizes["datapoint"] == 96
    assert loss["position"].values.tolist() == list(range(12)) * 8
    np.testing.assert_allclose(loss["mean_loss"].values, store.metrics["test_loss"].values, rtol=1e-5, atol=1e-6)

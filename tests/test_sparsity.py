"""``sparsity`` and the activation capture helper: hand-computed values, errors, conformance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import ckpt.store as ckptstore
from ckpt.analyzers import sparsity
from ckpt.analyzers.sparsity import Sparsity, epsilon_grid
from ckpt.engine.pipeline import run
from ckpt.numerics.activations import activation_modules, capture
from ckpt.plugins import AnalysisError, load_registry, select_modules
from ckpt.plugins.testing import write_example_run
from ckpt.sandboxes.sparse_modular_addition import build_model, rms_normalize

VALUES = np.array([-3.0, -0.5, -1e-4, 0.0, 3e-5, 2e-3, 0.25, 4.0, 50.0], dtype=np.float32)


def relu_net() -> nn.Module:
    """Model factory of the hand-computed store (``tests.test_sparsity:relu_net``)."""
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


@pytest.fixture(scope="module")
def registry() -> Any:
    return load_registry(extra=[sparsity])


def write_relu_store(path: Path) -> tuple[Path, np.ndarray]:
    """Checkpoints whose first layer is ``2**step * I``: the ReLU sees exactly ``2**step * x``."""
    rng = np.random.default_rng(0)
    inputs = rng.choice(VALUES, size=(30, 4))
    with ckptstore.create(path, model="tests.test_sparsity:relu_net", config={}, objective="cross-entropy") as w:
        w.add_data("eval", inputs=inputs, targets=np.arange(30) % 2)
        for step in range(3):
            w.write(
                step,
                {
                    "0.weight": (2.0**step * np.eye(4)).astype(np.float32),
                    "0.bias": np.zeros(4, np.float32),
                    "2.weight": rng.standard_normal((2, 4)).astype(np.float32),
                    "2.bias": np.zeros(2, np.float32),
                },
            )
    return path, inputs


def below(values: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
    """Fraction of ``|values| < eps`` for each eps, in float64."""
    magnitude = np.abs(values.astype(np.float64)).reshape(-1)
    return (magnitude[None, :] < epsilons[:, None]).mean(1)


def test_sparsity_of_known_activations(tmp_path: Path, registry: Any) -> None:
    path, x = write_relu_store(tmp_path / "run.zarr")
    result = run("sparsity", path, registry=registry).dataset.load()
    epsilons = result["epsilon"].values
    np.testing.assert_allclose(epsilons, np.logspace(-5, 2, 50))
    assert list(result["module"].values) == ["1"]  # the nn.ReLU
    for step in range(3):
        pre = 2.0**step * x  # exact in float32: a power of two times the inputs
        np.testing.assert_array_equal(result["sparsity"].values[step, 0], below(np.maximum(pre, 0), epsilons))
        assert result["nonpositive"].values[step, 0] == (pre <= 0).mean()
        assert result["values"].values[step, 0] == x.size
    # 4 of the 9 values are <= 0, and relu of them is exactly 0: below every eps
    assert (result["sparsity"].values[:, 0, 0] >= (x <= 0).mean()).all()


def test_other_modules_inputs_and_chunks(tmp_path: Path, registry: Any) -> None:
    path, x = write_relu_store(tmp_path / "run.zarr")
    grid = {"eps_min": 1e-4, "eps_max": 10.0, "eps_count": 9}
    epsilons = epsilon_grid(1e-4, 10.0, 9)
    default = run("sparsity", path, registry=registry, **grid).dataset.load()
    # the input of the layer after the ReLU is the ReLU's output; chunks of 4 examples change nothing
    after = run("sparsity", path, registry=registry, modules="2", capture="input", batch_size=4, force=True, **grid)
    np.testing.assert_array_equal(after.dataset["sparsity"].values, default["sparsity"].values)
    # the output of the first layer is the pre-activation; its input is x
    both = run("sparsity", path, registry=registry, modules="0,1", force=True, **grid).dataset.load()
    assert list(both["module"].values) == ["0", "1"]
    for step in range(3):
        np.testing.assert_array_equal(both["sparsity"].values[step, 0], below(2.0**step * x, epsilons))
        assert both["nonpositive"].values[step, 0] == (x <= 0).mean()
    np.testing.assert_array_equal(both["sparsity"].values[:, 1], default["sparsity"].values[:, 0])
    text = Sparsity().summarize(both)
    assert "2 module(s), 3 checkpoint(s), 9 ε" in text
    assert "nonpos" in text


def test_functional_activations_need_modules(tmp_path: Path, registry: Any) -> None:
    """The sparse-modular-addition model calls F.gelu: an error says to pass --modules; fc2's input works."""
    path = tmp_path / "sma.zarr"
    tokens = np.random.default_rng(0).integers(0, 2, size=(40, 12))
    models = []
    with ckptstore.create(path, model="ckpt.sandboxes.sparse_modular_addition:build_model", config={}) as writer:
        writer.add_data("eval", inputs=tokens, targets=tokens[:, :5].sum(1) % 2)
        for step in range(2):
            torch.manual_seed(step)
            models.append(build_model())
            writer.write(step, models[-1])
    with pytest.raises(AnalysisError, match=r"no activation-function modules.*pass --modules GLOB") as error:
        run("sparsity", path, registry=registry)
    assert "mlp.fc2" in str(error.value)  # the message lists the modules to choose from
    assert "\n" not in str(error.value)
    result = run("sparsity", path, registry=registry, modules="mlp.fc2", capture="input").dataset.load()
    for step, model in enumerate(models):
        with torch.no_grad():
            hidden = model.mlp.fc1(rms_normalize(model.attn(model.embeddings(torch.from_numpy(tokens)))))
            gelu = torch.nn.functional.gelu(hidden)
        expected = below(gelu.numpy(), result["epsilon"].values)
        np.testing.assert_array_equal(result["sparsity"].values[step, 0], expected)
        assert result["nonpositive"].values[step, 0] == (gelu.numpy() <= 0).mean()


def test_bad_input_is_an_analysis_error(tmp_path: Path, registry: Any) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2)
    with pytest.raises(AnalysisError, match=r"--modules pattern 'blocks\.\*' matches no module.*its modules: 0, 1, 2"):
        run("sparsity", path, registry=registry, modules="1,blocks.*")
    with pytest.raises(AnalysisError, match="no data split 'train'; pass --split one of: eval"):
        run("sparsity", path, registry=registry, split="train")
    with pytest.raises(AnalysisError, match="option 'eps_min' of analyzer 'sparsity' must be at least 1e-30"):
        run("sparsity", path, registry=registry, eps_min=0.0)
    with pytest.raises(AnalysisError, match="0 < eps-min <= eps-max"):
        run("sparsity", path, registry=registry, eps_min=2.0, eps_max=1.0)
    with pytest.raises(AnalysisError, match="capture"):
        run("sparsity", path, registry=registry, capture="both")
    assert "sparsity" not in ckptstore.open(path).analyses  # bad input writes nothing


def test_a_hugging_face_models_activation_modules_are_found() -> None:
    """GPT-2 applies its GELU through ``NewGELUActivation`` modules, not ``nn.GELU``: they count."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    assert activation_modules(model) == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    with_weights = nn.Sequential(nn.Linear(2, 2))
    with_weights.__class__ = type("LearnedActivation", (nn.Sequential,), {})  # parameters: not a function
    assert activation_modules(nn.Sequential(with_weights)) == []


def test_selection_and_hooks() -> None:
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Sequential(nn.Linear(5, 5), nn.GELU()))
    assert activation_modules(model) == ["1", "2.1"]
    assert select_modules(model) == ["1", "2.1"]
    assert select_modules(model, "2.*, 0") == ["0", "2.0", "2.1"]  # model order, each once
    x = torch.randn(7, 3)
    with torch.no_grad():
        out, found = capture(model, ["1", "2.1"], lambda: model(x), inputs=True)
        pre = model[0](x)
    # the in-place ReLU overwrote its input tensor, but the copy was taken before it ran
    torch.testing.assert_close(found.inputs["1"][0], pre)
    torch.testing.assert_close(found.outputs["1"][0], pre.clamp(min=0))
    torch.testing.assert_close(found.outputs["2.1"][0], out)

    def broken() -> None:
        model(x)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture(model, ["1", "2.1"], broken, inputs=True)
    for module in model.modules():  # the hooks are gone, also after the error
        assert not module._forward_hooks
        assert not module._forward_pre_hooks
    # a module applied twice gives one tensor per call
    shared = nn.Sequential(nn.Linear(3, 3))
    act = nn.Tanh()
    shared.add_module("act", act)
    _, found = capture(shared, ["act"], lambda: act(act(x)))
    assert len(found.outputs["act"]) == 2


# -- conformance ------------------------------------------------------------------------------------------

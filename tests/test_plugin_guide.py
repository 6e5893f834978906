"""The plugin guide's friction points, each held by a test: what docs/plugins.md shows passes the kit."""

from __future__ import annotations

import itertools
import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.plugins.manager import Registry
from ckpt.plugins.testing import AnalyzerTests, ObjectiveTests, check_figure, write_example_run

ROOT = Path(__file__).resolve().parents[1]


def guide_block(defines: str) -> str:
    """The one ```python block of docs/plugins.md that contains ``defines``."""
    guide = (ROOT / "docs" / "plugins.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.+?)```", guide, flags=re.S) if defines in b]
    assert len(blocks) == 1, f"{len(blocks)} blocks of docs/plugins.md contain {defines!r}"
    return blocks[0]


def guide_module(defines: str, name: str) -> types.ModuleType:
    """The block containing ``defines``, run as a module called ``name`` (a plugin, as an author copies it)."""
    module = types.ModuleType(name)
    exec(compile(guide_block(defines), f"docs/plugins.md:{name}", "exec"), module.__dict__)
    return module


GUIDE_OBJECTIVES = guide_module("def per_example_mse(", "guide_mse")


class TestTheGuidesMseObjective(ObjectiveTests):
    """The guide's own MSE objective passes the kit, float64 check included."""

    name = "mse"
    plugin = GUIDE_OBJECTIVES

    def make_batch(self) -> tuple[Any, Any, Any]:
        import torch

        return torch.randn(6, 3), torch.randn(6, 3), None

    def reference_loss(self, outputs: Any, targets: Any, mask: Any) -> Any:
        import torch.nn.functional as F

        return F.mse_loss(outputs, targets)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_the_guides_mse_computes_in_float32_at_least(dtype: str) -> None:
    import torch

    outputs = torch.randn(4, 3).to(getattr(torch, dtype))
    losses = GUIDE_OBJECTIVES.per_example_mse(outputs, torch.randn(4, 3), None)
    assert losses.dtype == (torch.float64 if dtype == "float64" else torch.float32)


def _image_with_colorbar(*, label: str | None = None, cax: bool = False) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4, 3), layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(np.arange(64.0).reshape(8, 8), cmap="viridis")
    axes.set_xlabel("column")
    axes.set_ylabel("row")
    if cax:  # an axes of the author's own, given to the colorbar
        bar = figure.colorbar(image, cax=figure.add_axes((0.85, 0.1, 0.05, 0.8)))
    else:
        bar = figure.colorbar(image, ax=axes)
    if label is not None:
        bar.set_label(label)
    return figure


@pytest.mark.parametrize("cax", [False, True], ids=["ax", "cax"])
@pytest.mark.parametrize("label", [None, "value"])
def test_a_colorbar_is_part_of_its_panel(label: str | None, cax: bool) -> None:
    check_figure(_image_with_colorbar(label=label, cax=cax), panels=1)


def test_a_colorbar_does_not_hide_an_unlabelled_panel() -> None:
    figure = _image_with_colorbar()
    figure.axes[0].set_ylabel("")
    with pytest.raises(AssertionError, match="no y label"):
        check_figure(figure)
    with pytest.raises(AssertionError, match="expected 2 panels, found 1"):
        check_figure(_image_with_colorbar(), panels=2)


GUIDE_TRIPLES = guide_module("def update_cosine(", "guide_update_cosine")


class TestTheGuidesUpdateCosine(AnalyzerTests):
    """The guide's consecutive-triples idiom passes the kit, the appended-checkpoint check included."""

    analyzer_class = GUIDE_TRIPLES.UpdateCosine
    plugin = GUIDE_TRIPLES

    def make_store(self, tmp_path: Path) -> Path:
        return write_example_run(tmp_path / "run.zarr", steps=4, examples=8)

    def test_cosines_are_those_of_consecutive_updates(self, store: Path, registry: Registry) -> None:
        import ckpt

        result = ckpt.analyze("update-cosine", store, registry=registry)
        opened = ckptstore.open(store)
        steps = [int(s) for s in opened.steps]
        flat = [
            np.concatenate([t.astype(np.float64).ravel() for _, t in sorted(opened.tensors(s).items())]) for s in steps
        ]
        updates = np.diff(np.stack(flat), axis=0)
        expected = [np.nan] + [a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in itertools.pairwise(updates)]
        assert list(result["step"].values) == steps[:-1]
        np.testing.assert_allclose(result["cosine"].values, expected, rtol=1e-12)


def _guide_text() -> str:
    """docs/plugins.md with every run of whitespace as one space (so wrapped lines read as one)."""
    return " ".join((ROOT / "docs" / "plugins.md").read_text().split())


def _plain_signature(name: str, fn: Any) -> str:
    """``name(a, b, *, c=None)``: the signature a reader types, without annotations."""
    import inspect

    parts, star = [], False
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        default = "" if parameter.default is parameter.empty else f"={parameter.default!r}"
        parts.append(f"{parameter.name}{default}")
    return f"{name}({', '.join(parts)})"


def test_the_guide_gives_the_signatures_of_the_code() -> None:
    import ckpt.plugins
    import ckpt.plugins.testing

    guide = _guide_text()
    for name in ("select_modules", "iter_activations", "capture"):
        signature = _plain_signature(name, getattr(ckpt.plugins, name))
        assert f"`{signature}" in guide, f"docs/plugins.md does not give {signature}"
    signature = _plain_signature("mlp", ckpt.plugins.testing.mlp)
    assert f"`{signature}`" in guide, f"docs/plugins.md does not give {signature}"


def test_select_modules_never_returns_an_empty_list() -> None:
    from ckpt.errors import AnalysisError
    from ckpt.plugins import select_modules
    from ckpt.plugins.testing import mlp

    assert select_modules(mlp()) == ["1"]
    assert select_modules(mlp(), "0,2") == ["0", "2"]
    with pytest.raises(AnalysisError, match=r"matches no module of the model; its modules: 0, 1, 2"):
        select_modules(mlp(), "blocks.*")


def _attention_block() -> Any:
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 1, batch_first=True)  # returns (output, weights)

        def forward(self, x: Any) -> Any:
            return self.attn(x, x, x)[0]

    return Block()


def test_capture_records_the_first_element_of_a_tuple_and_each_call() -> None:
    import torch

    from ckpt.plugins import capture
    from ckpt.plugins.testing import mlp

    block = _attention_block()
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        result, found = capture(block, ["attn"], lambda: block(x), inputs=True)
    assert len(found.outputs["attn"]) == 1
    torch.testing.assert_close(found.outputs["attn"][0], result)  # the output, not the weights
    torch.testing.assert_close(found.inputs["attn"][0], x)  # the first positional argument
    model = mlp()
    with torch.no_grad():
        _, twice = capture(model, ["1"], lambda: (model(torch.randn(5, 3)), model(torch.randn(7, 3))))
    assert [len(t) for t in twice.outputs["1"]] == [5, 7]
    assert twice.inputs == {"1": []}  # not asked for


def test_capture_refuses_a_module_that_returns_no_tensor() -> None:
    import torch
    from torch import nn

    from ckpt.errors import AnalysisError
    from ckpt.plugins import capture

    class Named(nn.Module):
        def forward(self, x: Any) -> Any:
            return {"hidden": x}

    model = nn.Sequential(Named())
    with pytest.raises(AnalysisError, match=r"module '0' returned dict, not a tensor"):
        capture(model, ["0"], lambda: model(torch.randn(2, 3)))


def _sandbox_table() -> dict[str, list[str]]:
    """The guide's table of what to capture in each built-in sandbox: {sandbox: [module pattern, ...]}."""
    guide = (ROOT / "docs" / "plugins.md").read_text()
    section = guide[guide.index("**The built-in sandboxes have no activation-function module**") :]
    table: dict[str, list[str]] = {}
    for names, what in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|$", section.split("\n\n")[1], flags=re.M):
        patterns = [quoted for quoted in re.findall(r"`([^`]+)`", what) if "=" not in quoted]  # not inputs=True
        table.update(dict.fromkeys(re.findall(r"`([^`]+)`", names), patterns))
    return table


def _sandbox_model(name: str) -> Any:
    """The model of a built-in sandbox's default preset, from the factory its stores record."""
    import importlib

    from ckpt.plugins import load_registry
    from ckpt.plugins.tasks import resolve_task

    task = resolve_task(load_registry(entry_points=False).tasks[name])
    preset = task.presets.get("default") or next(iter(task.presets.values()))
    module, factory = task.factory.split(":")
    return getattr(importlib.import_module(module), factory)(**task.model_config(dict(preset)))


def test_the_guide_says_what_to_capture_in_each_sandbox() -> None:
    import torch

    from ckpt.errors import AnalysisError
    from ckpt.plugins import capture, load_registry, select_modules

    table = _sandbox_table()
    assert sorted(table) == sorted(load_registry(entry_points=False).tasks), "a sandbox the guide's table misses"
    for sandbox, patterns in table.items():
        model = _sandbox_model(sandbox)
        with pytest.raises(AnalysisError, match="no activation-function modules"):
            select_modules(model)
        if sandbox == "particles":
            assert patterns == ["embed"]
            pairs = torch.tensor([[0, 1], [2, 3]])
            with torch.no_grad():
                _, found = capture(model, ["embed"], lambda model=model, pairs=pairs: model(pairs))
            assert found.outputs == {"embed": []}, "particles' embed is called: update the guide"
            continue
        for pattern in patterns:
            assert select_modules(model, pattern), f"{sandbox}: {pattern}"


def test_the_guides_append_example_appends_a_checkpoint(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=2)
    namespace: dict[str, Any] = {"path": path}
    exec(compile(guide_block('mode="a") as writer'), "docs/plugins.md:append", "exec"), namespace)
    steps = [int(s) for s in ckptstore.open(path).steps]
    assert steps == [0, 1, 2]
    assert ckptstore.open(path).splits == ["eval"]  # the guide's way to list a store's splits
    assert "`splits` (the names of its data splits, sorted" in _guide_text()
    with ckptstore.open(path, mode="a") as writer:
        assert isinstance(writer, ckptstore.Writer)
        assert [int(s) for s in writer.reader().steps] == steps


def test_the_guides_activation_examples_capture_the_example_mlps_tanh(tmp_path: Path) -> None:
    import torch

    from ckpt.engine.worker import TaskSpec
    from ckpt.plugins import Worker, capture, iter_activations, select_modules

    path = write_example_run(tmp_path / "run.zarr", steps=2, examples=20)
    opened = ckptstore.open(path)
    tensors = {name: torch.from_numpy(value).double() for name, value in opened.tensors(1).items()}
    inputs = torch.from_numpy(opened.data("eval")["inputs"].values).double()
    tanh = torch.tanh(inputs @ tensors["0.weight"].T + tensors["0.bias"])  # Linear 3->8, Tanh: by hand
    namespace: dict[str, Any] = {
        "worker": Worker(TaskSpec(str(path))),
        "step": 1,
        "torch": torch,
        "select_modules": select_modules,
        "capture": capture,
        "iter_activations": iter_activations,
    }
    for defines in ("_, found = capture(", "for chunk in iter_activations("):
        exec(compile(guide_block(defines), "docs/plugins.md:activations", "exec"), namespace)
    assert namespace["names"] == ["1"]
    np.testing.assert_allclose(namespace["active"]["1"], float((tanh.abs() > 0.5).double().mean()), rtol=1e-6)
    np.testing.assert_allclose(namespace["squares"], tanh.pow(2).sum(0), rtol=1e-5)

"""The plugin guide's friction points, each held by a test: what docs/plugins.md shows passes the kit."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt.plugins.testing import ObjectiveTests, check_figure

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

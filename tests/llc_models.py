"""Models whose local learning coefficient is known, as ``tests.llc_models:NAME`` model specs, and an MSE objective.

- :func:`linear`: y = Wx + b, regular: λ = (inputs + 1)/2.
- :func:`sum_of_two`: y = (a + b)·x + c: three parameters, two identifiable: λ = 1.
- :func:`deep_line`: y = w1·w2·…·wH·x at the true product 0: K ∝ Π w_i², λ = 1/2 for any H
  (multiplicity H, so at a finite nβ the estimate sits below 1/2 by about (H − 1)/log(nβ·s)).

:data:`MSE_PLUGIN` registers the objective ``mse`` (per-example squared error), as a third party would.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from ckpt.plugins import Objective, hookimpl


def linear(inputs: int = 2) -> nn.Module:
    """Linear regression with a bias: ``inputs + 1`` identifiable parameters."""
    return nn.Linear(inputs, 1)


class SumOfTwo(nn.Module):
    """y = (a + b)·x + c: the direction a − b changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(()))
        self.c = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.a + self.b) * x + self.c


def sum_of_two() -> nn.Module:
    """Factory of :class:`SumOfTwo`."""
    return SumOfTwo()


class DeepLine(nn.Module):
    """A width-1 deep linear network y = w1·w2·…·wH·x."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.prod() * x


def deep_line(depth: int = 2) -> nn.Module:
    """Factory of :class:`DeepLine`."""
    return DeepLine(depth)


def per_example_mse(outputs: Any, targets: Any, mask: Any) -> Any:
    """Squared error of each example, averaged over its outputs."""
    return ((outputs - targets.to(outputs.dtype)) ** 2).reshape(len(outputs), -1).mean(1)


def every_example(targets: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
    """One datapoint per example."""
    n = len(targets)
    return np.arange(n), np.full(n, -1)


@hookimpl
def ckpt_register_objectives(register: Callable[[str, Objective], None]) -> None:
    register("mse", Objective(per_example_mse, every_example, "per-example mean squared error"))


MSE_PLUGIN = types.SimpleNamespace(ckpt_register_objectives=ckpt_register_objectives)
"""A plugin object registering ``mse``: ``load_registry(extra=[MSE_PLUGIN])``."""

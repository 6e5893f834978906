"""Training every seed of a sandbox at once, for the ``--vectorize`` mode of the repro scripts.

The seeds' models are stacked with ``torch.func.stack_module_state`` and run by
one ``vmap`` of ``functional_call``; the task's own optimizer is rebuilt over
the stacked parameters. Adam and AdamW work element by element, so this trains
each seed as its own run would, up to rounding order.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StackedSeeds:
    """The seeds' models and data, their stacked parameters, the batched forward and the optimizer."""

    models: list[torch.nn.Module]
    datas: list[Any]
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    forward: Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    scheduler: Any


def stack_seeds(task: Any, config: Mapping[str, Any], seeds: Sequence[int]) -> StackedSeeds:
    """Build every seed's data and model in the seeding order of ``train()``, and stack them."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.set_num_threads(1)
    models, datas = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        datas.append(task.make_data(config, seed))
        models.append(task.build_model(config))
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    forward = vmap(lambda prm, buf, x: functional_call(skeleton, (prm, buf), (x,)))
    optimizer, scheduler = task.make_optimizer(models[0], config)  # the task's optimizer and its settings
    accepted = inspect.signature(type(optimizer)).parameters  # defaults may hold keys __init__ does not take
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    optimizer = type(optimizer)(list(params.values()), **settings)
    return StackedSeeds(models, datas, params, buffers, forward, optimizer, scheduler)

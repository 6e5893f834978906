"""A small real training run for plugin tests and examples, the model it trains, and a folder digest.

:func:`write_example_run` writes what an analyzer usually needs: checkpoints of
a model, the model spec that rebuilds it, an objective and an eval split. Its
model factory, :func:`mlp`, is recorded in the store as
``"ckpt.plugins.examples:mlp"`` and registered in ckpt's ``ckpt.factories``
entry points, so analyzers rebuild it without ``--trust-factory``. This module
imports no pytest (workers import it to rebuild the model) and no torch until
it is called.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpt.store.factory_config import config_bounds

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["EXAMPLE_FACTORY", "mlp", "tree_digest", "write_example_run"]

EXAMPLE_FACTORY = "ckpt.plugins.examples:mlp"
"""The model factory :func:`write_example_run` records (registered, hence trusted)."""


@config_bounds(d_in=(1, 1 << 20), hidden=(1, 1 << 20), classes=(1, 1 << 20))
def mlp(d_in: int = 3, hidden: int = 8, classes: int = 4) -> torch.nn.Module:
    """A classifier of ``[N, d_in]`` features into ``classes``: Linear, Tanh, Linear.

    Parameters
    ----------
    d_in, hidden, classes
        Input features, hidden units and classes.

    Returns
    -------
    torch.nn.Module
        ``Sequential(Linear(d_in, hidden), Tanh(), Linear(hidden, classes))``, freshly initialised.
    """
    from torch import nn

    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def write_example_run(
    path: str | os.PathLike[str],
    steps: int = 6,
    *,
    examples: int = 50,
    seed: int = 0,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    attrs: Mapping[str, Any] | None = None,
    factory: str = EXAMPLE_FACTORY,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Train :func:`mlp` for a few full-batch steps and write the run to a new store at ``path``.

    The store holds a checkpoint before every optimizer step (steps ``0 .. steps-1``),
    the objective ``"cross-entropy"`` (the loss it was trained on, one datapoint per
    example) and an ``"eval"`` split of ``examples`` random 3-feature inputs (float32,
    ``[examples, 3]``) with 4-class targets (int64, ``[examples]``), which is also the
    training data, and a label ``"odd"`` (target parity). Everything is seeded: the same
    arguments write the same weights.

    Parameters
    ----------
    path
        Where to create the store (it must not exist).
    steps
        Checkpoints to write.
    examples
        Datapoints in the eval split.
    seed
        Seeds torch before the model and the data are drawn.
    optimizer
        ``optimizer(parameters)`` builds the optimizer (default: SGD with learning rate 0.5).
    attrs
        The run's recorded settings (``ckpt.create(attrs=...)``).
    factory, config
        The model spec the store records. The default is the model that was trained; another
        factory must build a model with the same state-dict keys (and, to be analyzed, be
        registered or allowed, see :mod:`ckpt.store.trust`).

    Returns
    -------
    pathlib.Path
        The store's path.
    """
    import torch

    import ckpt.store as ckptstore

    torch.manual_seed(seed)
    model = mlp()
    inputs, targets = torch.randn(examples, 3), torch.randint(0, 4, (examples,))
    built = (optimizer or (lambda parameters: torch.optim.SGD(parameters, lr=0.5)))(model.parameters())
    with ckptstore.create(
        path, model=factory, config=dict(config or {}), objective="cross-entropy", attrs=attrs
    ) as writer:
        writer.add_data("eval", inputs=inputs, targets=targets, labels={"odd": targets % 2})
        for step in range(steps):
            writer.write(step, model)
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            built.zero_grad()
            loss.backward()
            built.step()
    return Path(path)


def tree_digest(path: str | os.PathLike[str]) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``path``: equal digests mean an unchanged folder or store.

    Parameters
    ----------
    path
        A local folder (a store, an import's source ...).

    Returns
    -------
    dict
        ``{relative path: hex digest}``, in sorted order.
    """
    root = Path(path)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }

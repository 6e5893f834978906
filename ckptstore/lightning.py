"""A Lightning ``Callback`` that writes the run into a ckpt store while it trains.

>>> from ckpt.store.lightning import CkptCallback                         # doctest: +SKIP
>>> trainer = lightning.Trainer(callbacks=[CkptCallback("run.zarr", every=50, model="mypkg.models:build",
...                                                    objective="cross-entropy", data={"eval": {...}})])

The store records the initial weights (step 0), the module's ``state_dict`` every ``every`` optimizer
steps and at the end, and the logged scalars (``self.log``) at those steps as metrics. Lightning
modules are your code: name the factory that rebuilds the module (``model``, with ``config``; by
default the module's ``hparams``) for analyzers that run the model. Imports ``lightning``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning

from ckpt.errors import InvalidArgumentError
from ckpt.store.followers import check_names
from ckpt.store.writer import Writer, create


class CkptCallback(lightning.pytorch.Callback):
    """Write a Lightning run into the ckpt store at ``path`` as it trains.

    Parameters
    ----------
    path
        The store to create (local path or fsspec URL).
    every
        Checkpoint every this many optimizer steps (``trainer.global_step``).
    model
        Model factory ``"package.module:function"`` that rebuilds the LightningModule (or None).
    config
        Its keyword arguments (default: the module's ``hparams``).
    objective
        Per-datapoint loss to record.
    data
        Evaluation splits, ``{split: {"inputs": ..., "targets": ..., ...}}`` (:meth:`ckpt.store.Writer.add_data`).
    overwrite
        Replace an existing store at ``path``.
    follow
        Analyzers to run beside training, each in a process of its own that computes every checkpoint
        as it is committed (``ckpt.create(follow=...)``); unknown names fail here, before training.
    """

    def __init__(
        self,
        path: str,
        every: int,
        model: str | None = None,
        config: Mapping[str, Any] | None = None,
        objective: str | None = None,
        data: Mapping[str, Mapping[str, Any]] | None = None,
        overwrite: bool = False,
        follow: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.follow = check_names(follow)
        if every < 1:
            msg = f"every must be at least 1, got {every}"
            raise InvalidArgumentError(msg)
        self.path, self.every, self.model, self.config = str(path), every, model, config
        self.objective, self.data, self.overwrite = objective, dict(data or {}), overwrite
        self.writer: Writer | None = None
        self.written = -1

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Create the store with the model spec, objective and data; write the initial weights."""
        config = self.config if self.config is not None else dict(getattr(pl_module, "hparams", {}) or {})
        self.writer = create(
            self.path,
            model=self.model,
            config=config if self.model else None,
            objective=self.objective,
            framework="torch",
            attrs={"trained_with": "lightning", "every": self.every},
            overwrite=self.overwrite,
            follow=self.follow,
        )
        for split, arrays in self.data.items():
            self.writer.add_data(split, **arrays)
        self._checkpoint(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Write a checkpoint every ``every`` optimizer steps, with the scalars logged so far."""
        if trainer.global_step % self.every == 0:
            self._checkpoint(trainer, pl_module)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Write the final weights (when not written already) and close the store."""
        if self.writer is None:
            return
        self._checkpoint(trainer, pl_module)
        self.writer.close()
        self.writer = None

    def _checkpoint(self, trainer: Any, pl_module: Any) -> None:
        step = int(trainer.global_step)
        if step <= self.written:
            return
        metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if getattr(value, "numel", lambda: 1)() == 1
        }
        assert self.writer is not None  # opened by on_fit_start, before any step is saved
        self.writer.write(step, pl_module.state_dict(), metrics=metrics or None)
        self.written = step


__all__ = ["CkptCallback"]

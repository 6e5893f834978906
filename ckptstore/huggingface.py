"""A Hugging Face ``TrainerCallback`` that writes the run into a ckpt store while it trains.

>>> from ckpt.store.huggingface import CkptCallback
>>> trainer = Trainer(model, args, train_dataset=data,  # doctest: +SKIP
...                   callbacks=[CkptCallback("run.zarr", every=50, data={"eval": {"inputs": ids}})])

The store records the model spec (rebuilt from the model's config with ``transformers``, as for an
imported ``Trainer`` folder), the ``causal-lm`` objective for causal LMs, the initial weights (step
0), a checkpoint every ``every`` steps and at the end, and the Trainer's log as metrics. Analyzers
run on it as on any store. Imports ``transformers`` (``pip install 'ckpt-dynamics[hf]'``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import TrainerCallback

from ckpt.store.followers import check_names
from ckpt.store.importers import HF_CAUSAL_LM, HF_FACTORY, hf_model_config
from ckpt.store.writer import Writer, create


def untied_state(model: Any) -> dict[str, Any]:
    """The model's ``state_dict`` with each tied tensor once, under its first name.

    GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``: the Trainer saves it once, and so
    does this callback. Twice, it would be two parameters to the Hessian and the functional calls
    of analyzers, which refuse tied tensors given twice.
    """
    kept: dict[str, Any] = {}
    seen: set[tuple[int, Any, tuple[int, ...]]] = set()
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            kept[name] = tensor
    return kept


def _numbers(logs: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in logs.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class CkptCallback(TrainerCallback):
    """Write a ``Trainer`` run into the ckpt store at ``path`` as it trains.

    Parameters
    ----------
    path
        The store to create (local path or fsspec URL).
    every
        Checkpoint every this many optimizer steps (default: the Trainer's ``save_steps``).
    data
        Evaluation splits to store, ``{split: {"inputs": ..., "targets": ..., "mask": ..., "labels": {...}}}``
        (arguments of :meth:`ckpt.store.Writer.add_data`).
    objective
        Per-datapoint loss to record (default: ``causal-lm`` for a causal LM, else none).
    overwrite
        Replace an existing store at ``path``.
    follow
        Analyzers to run beside training, each in a process of its own that computes every checkpoint
        as it is committed (``ckpt.create(follow=...)``); unknown names fail here, before training.
    """

    def __init__(
        self,
        path: str,
        every: int | None = None,
        data: Mapping[str, Mapping[str, Any]] | None = None,
        objective: str | None = None,
        overwrite: bool = False,
        follow: Sequence[str] | None = None,
    ) -> None:
        self.follow = check_names(follow)
        self.path, self.every, self.data = str(path), every, dict(data or {})
        self.objective, self.overwrite = objective, overwrite
        self.writer: Writer | None = None
        self.written = -1
        self.pending: dict[int, dict[str, float]] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Create the store with the model spec, objective and data; write the initial weights."""
        config = model.config.to_dict()
        architecture = (config.get("architectures") or [type(model).__name__])[0]
        config["architectures"] = [architecture]
        objective = self.objective or ("causal-lm" if architecture.endswith(HF_CAUSAL_LM) else None)
        self.every = self.every or int(args.save_steps)
        self.writer = create(
            self.path,
            model=HF_FACTORY,
            config=hf_model_config(config),
            objective=objective,
            framework="torch",
            attrs={"trained_with": "transformers Trainer", "every": self.every, "seed": int(args.seed)},
            overwrite=self.overwrite,
            follow=self.follow,
        )
        for split, arrays in self.data.items():
            self.writer.add_data(split, **arrays)
        self._checkpoint(state.global_step, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Keep the logged numbers of this step (a step may log twice: training, then evaluation)."""
        self.pending.setdefault(state.global_step, {}).update(_numbers(logs or {}))

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Write a checkpoint every ``every`` steps."""
        if state.global_step % self.every == 0:
            self._checkpoint(state.global_step, model)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Write the final weights (when not written already) and every pending log; close the store."""
        if self.writer is None:
            return
        self._checkpoint(state.global_step, model)
        self._flush(float("inf"))
        self.writer.close()
        self.writer = None

    def _checkpoint(self, step: int, model: Any) -> None:
        if step <= self.written:
            return
        self._flush(step)  # the logs of earlier steps first: metric steps strictly increase
        assert self.writer is not None  # opened by on_train_begin, before any step is saved
        self.writer.write(step, untied_state(model))
        self.written = step

    def _flush(self, before: float) -> None:
        for step in sorted(s for s in self.pending if s < before):
            metrics = self.pending.pop(step)
            if metrics:
                assert self.writer is not None  # metrics are logged between on_train_begin and its close
                self.writer.log(step, metrics)


__all__ = ["CkptCallback", "untied_state"]

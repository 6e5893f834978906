"""What the analyzers of loss-spike causes (Clustering Head §4.3) share: η, and the model and split checks.

``normalization`` compares the norms reaching a normalisation layer with the step size η
(Clustering Head §4.3: a step is safe only while η < ‖x‖), and ``curvature`` draws the
2/η stability line of gradient descent. Both read η the same way: ``--lr`` when given,
else a learning-rate metric the training loop stored (``lr`` or ``learning_rate``, on
the checkpoint steps). ``ckpt train`` logs ``lr`` at every checkpoint (the rate the
next step uses, after the schedule); a store without such a metric needs ``--lr``, and
the error message quotes the rate its training config records, without using it:
under a schedule it is not the rate in force.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckpt.plugins import AnalysisError

LR_METRICS = ("lr", "learning_rate")
"""Metric names read as the learning rate, in order of preference."""


def learning_rates(
    store: Any, steps: list[int], lr: float | None, *, analyzer: str, required: bool
) -> dict[int, float]:
    """η at each of ``steps``: ``lr`` when given, else the store's learning-rate metric.

    Parameters
    ----------
    store
        The :class:`ckpt.store.Store`.
    steps
        The checkpoints analysed.
    lr
        ``--lr`` (None: not given).
    analyzer
        Name for error messages.
    required
        Raise when no rate is known; otherwise those steps get NaN.

    Raises
    ------
    AnalysisError
        When ``required`` and neither ``--lr`` nor a metric gives η at every step.
    """
    if lr is not None:
        return {int(step): float(lr) for step in steps}
    metrics = store.metrics
    for name in LR_METRICS:
        if name in metrics:
            logged = dict(zip(metrics["step"].values.tolist(), metrics[name].values.astype(np.float64), strict=True))
            missing = [step for step in steps if step not in logged or not np.isfinite(logged[step])]
            if missing and required:
                msg = (
                    f"{analyzer}: the learning-rate metric {name!r} of {store.path} has no value at step "
                    f"{missing[0]}; pass --lr"
                )
                raise AnalysisError(msg)
            return {int(step): float(logged.get(step, np.nan)) for step in steps}
    if required:
        config = store.attrs.get("config") if isinstance(store.attrs.get("config"), dict) else {}
        recorded = f" (its training config records lr={config['lr']})" if "lr" in config else ""
        msg = (
            f"{analyzer} compares norms with the learning rate, and {store.path} stores no learning-rate metric "
            f"({' or '.join(LR_METRICS)}){recorded}: pass --lr"
        )
        raise AnalysisError(msg)
    return {int(step): float("nan") for step in steps}


def check_model_and_split(store: Any, split: str, analyzer: str) -> None:
    """Raise an :class:`AnalysisError` unless ``store`` records a model spec and holds ``split``."""
    if store.model is None:
        msg = f"{store.path} records no model spec; {analyzer} needs the model (create the store with model=...)"
        raise AnalysisError(msg)
    if split not in store.splits:
        msg = f"{store.path} has no data split {split!r}; pass --split one of: {', '.join(store.splits) or '(none)'}"
        raise AnalysisError(msg)


__all__ = ["LR_METRICS", "check_model_and_split", "learning_rates"]

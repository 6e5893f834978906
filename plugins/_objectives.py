"""Per-datapoint losses: what "the loss of a datapoint" means for a store.

A datapoint is one example, or one selected token: the (example, position)
pairs where the split's mask is true, in row-major order (every token when a
token-level split has no mask). An :class:`Objective` turns model outputs into
one loss per datapoint and says which (example, position) each one is, so
every per-datapoint result can carry the coordinates ``example`` and
``position`` back to the data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.plugins.hookspecs import hookimpl


@dataclass(frozen=True)
class Objective:
    """A per-datapoint loss.

    Attributes
    ----------
    losses
        ``losses(outputs, targets, mask) -> 1-D tensor``: one loss per datapoint
        of the examples in the batch, in row-major (example, position) order.
    datapoints
        ``datapoints(targets, mask) -> (example, position)``: integer numpy
        arrays of equal length; position is -1 for whole-example datapoints.
    description
        One line for ``ckpt plugins``.
    """

    losses: Callable[[Any, Any, Any], Any]
    datapoints: Callable[[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray]]
    description: str = ""


def _example_datapoints(targets: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    n = len(targets)
    return np.arange(n), np.full(n, -1)


def logits_of(outputs: Any) -> Any:
    """The logits tensor of a model's outputs.

    The tensor itself, a ``ModelOutput``'s ``.logits`` (Hugging Face models), or the first
    element of a tuple.
    """
    logits = getattr(outputs, "logits", None)
    if logits is not None:
        return logits
    if isinstance(outputs, tuple | list) and outputs:
        return outputs[0]
    return outputs


def _at_least_float32(outputs: Any) -> Any:
    # half/bfloat16 logits in float32 for a stable log-softmax; float64 stays float64,
    # so that analyzers run in double precision (``--dtype float64``) lose nothing here
    import torch

    return outputs if outputs.dtype == torch.float64 else outputs.float()


def _cross_entropy(outputs: Any, targets: Any, mask: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(_at_least_float32(logits_of(outputs)), targets.long(), reduction="none")


def _token_datapoints(targets: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    selected = np.ones(targets.shape[:2], bool) if mask is None else np.asarray(mask, bool)
    example, position = np.nonzero(selected)  # row-major order
    return example, position


def _token_cross_entropy(outputs: Any, targets: Any, mask: Any) -> Any:
    import torch.nn.functional as F

    logits = _at_least_float32(logits_of(outputs))
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.long().flatten(), reduction="none")
    per_token = per_token.view(targets.shape[:2])
    return per_token.flatten() if mask is None else per_token[mask.bool()]


def _causal_lm(outputs: Any, targets: Any, mask: Any) -> Any:
    import torch.nn.functional as F

    logits = _at_least_float32(logits_of(outputs))[:, :-1]  # position t predicts token t + 1
    labels = targets.long()[:, 1:]
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    selected = labels != IGNORE_INDEX
    if mask is not None:
        selected = selected & mask.bool()[:, 1:]
    return per_token.view(labels.shape)[selected]


def _causal_lm_datapoints(targets: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    selected = np.asarray(targets) != IGNORE_INDEX
    selected[:, 0] = False  # the first token is never predicted
    if mask is not None:
        selected &= np.asarray(mask, bool)
    example, position = np.nonzero(selected)
    return example, position


IGNORE_INDEX = -100
"""A target of -100 is not a datapoint (the Hugging Face convention for padding and prompts)."""
CROSS_ENTROPY = Objective(
    _cross_entropy,
    _example_datapoints,
    "per-example cross-entropy of [N, classes] logits against [N] class targets",
)
TOKEN_CROSS_ENTROPY = Objective(
    _token_cross_entropy,
    _token_datapoints,
    "per-token cross-entropy of [N, seq, vocab] logits against [N, seq] targets, on the tokens the mask selects",
)
CAUSAL_LM = Objective(
    _causal_lm,
    _causal_lm_datapoints,
    "next-token cross-entropy of a causal LM: logits at t against token t+1 of the targets (default: the inputs), "
    "as model(ids, labels=ids).loss; targets -100 and masked tokens are not datapoints",
)


@hookimpl
def ckpt_register_objectives(register: Callable[[str, Objective], None]) -> None:
    """Register the built-in objectives."""
    register("cross-entropy", CROSS_ENTROPY)
    register("token-cross-entropy", TOKEN_CROSS_ENTROPY)
    register("causal-lm", CAUSAL_LM)

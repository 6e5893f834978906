"""Per-datapoint losses: what "the loss of a datapoint" means for a store.

A datapoint is one example, or one selected token: the (example, position)
pairs where the split's mask is true, in row-major order (every token when a
token-level split has no mask). An :class:`Objective` turns model outputs into
one loss per datapoint and says which (example, position) each one is, so
every per-datapoint result can carry the coordinates ``example`` and
``position`` back to the data.
"""

from __future__ import annotations

import math
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


LOGITS_BLOCK = 1 << 24
"""Logits (16 Mi floats, 64 MiB in float32) that one cross-entropy call of a token objective takes without autograd.

Cross-entropy copies the logits it is given ([B, T-1, V], a slice, copied to be
flattened) and makes its log-softmax, two more tensors of the logits' size:
2 x 266 MB at vocabulary 16,384 for 32 x 128 tokens, 2 x 823 MB at GPT-2's
50,257. Without autograd (the ``loss`` analyzer) they are made for blocks of
whole sequences of at most this many logits, with the same values bit for bit
(log-softmax works row by row). With autograd the whole batch goes in one call:
slices of the logits would each back-propagate a logits-sized gradient.
"""


def _per_token_cross_entropy(logits: Any, labels: Any, block: int = LOGITS_BLOCK) -> Any:
    """``cross_entropy(logits[b, t], labels[b, t])`` for [B, T, V] logits and [B, T] labels, as [B, T].

    Without autograd, in calls of whole sequences of at most ``block`` logits (see :data:`LOGITS_BLOCK`).
    """
    import torch
    import torch.nn.functional as F

    def of(rows: slice) -> Any:
        return F.cross_entropy(logits[rows].flatten(0, 1), labels[rows].flatten(), reduction="none")

    per_sequence = max(1, math.prod(logits.shape[1:]))
    rows = max(1, block // per_sequence)
    if torch.is_grad_enabled():
        from ckpt.plugins._cross_entropy import TokenCrossEntropy, use_twice_differentiable

        if use_twice_differentiable():  # the kept graphs of Hessian-vector products
            return TokenCrossEntropy.apply(logits.flatten(0, 1), labels.flatten()).view(labels.shape)
    if torch.is_grad_enabled() or rows >= len(logits):
        return of(slice(None)).view(labels.shape)
    return torch.cat([of(slice(i, i + rows)) for i in range(0, len(logits), rows)]).view(labels.shape)


def _cross_entropy(outputs: Any, targets: Any, mask: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(_at_least_float32(logits_of(outputs)), targets.long(), reduction="none")


def _token_datapoints(targets: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    selected = np.ones(targets.shape[:2], bool) if mask is None else np.asarray(mask, bool)
    example, position = np.nonzero(selected)  # row-major order
    return example, position


def _token_cross_entropy(outputs: Any, targets: Any, mask: Any) -> Any:
    logits = _at_least_float32(logits_of(outputs))
    per_token = _per_token_cross_entropy(logits, targets.long())
    return per_token.flatten() if mask is None else per_token[mask.bool()]


def _causal_lm(outputs: Any, targets: Any, mask: Any) -> Any:
    logits = _at_least_float32(logits_of(outputs))[:, :-1]  # position t predicts token t + 1
    labels = targets.long()[:, 1:]
    per_token = _per_token_cross_entropy(logits, labels.clamp(min=0))
    selected = labels != IGNORE_INDEX
    if mask is not None:
        selected = selected & mask.bool()[:, 1:]
    return per_token[selected]


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

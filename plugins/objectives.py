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
    token_rows
        Optional, for objectives that are the cross-entropy of each selected token's logits
        against a label: ``token_rows(targets, mask) -> (index, labels)``, the datapoints as
        rows of the model's flattened ``[B·T, ...]`` positions (in the order of ``losses``) and
        each one's label. With it, first-order JVPs of known language models skip the logits'
        tangents (:mod:`ckpt.numerics._head`).
    """

    losses: Callable[[Any, Any, Any], Any]
    datapoints: Callable[[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray]]
    description: str = ""
    token_rows: Callable[[Any, Any], tuple[Any, Any]] | None = None


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


LOGITS_BLOCK_BYTES = 8 * 2**20
"""Bytes of logits (2 Mi floats in float32) that one cross-entropy call of a token objective takes without autograd.

Cross-entropy copies the logits it is given where they cannot be flattened as
they lie ([B, T-1, V], a slice) and makes their log-softmax, tensors of the
logits' size: 2 x 823 MB at GPT-2's vocabulary of 50,257 for 32 x 128 tokens.
Without autograd (the ``loss`` analyzer) they are made for blocks of whole
sequences of at most this size, or of positions of one sequence where one
sequence is larger (a view of it: nothing copied), with the same values bit for
bit (log-softmax works row by row). With autograd the whole batch goes in one
call: slices of the logits would each back-propagate a logits-sized gradient.

Why 8 MiB: larger tensors were given back to the system when freed and mapped
anew by the next call, page by page, which made per-token cross-entropy several
times slower than calls whose tensors stay in the heap (docs/performance.md,
"Derivative passes"). The same numbers bit for bit in each case.
"""


def _per_token_cross_entropy(logits: Any, labels: Any, block: int | None = None) -> Any:
    """``cross_entropy(logits[b, t], labels[b, t])`` for [B, T, V] logits and [B, T] labels, as [B, T].

    Without autograd, in calls of at most ``block`` logits (default :data:`LOGITS_BLOCK_BYTES`
    of them): whole sequences while one fits, else positions of one sequence.
    """
    import torch
    import torch.nn.functional as F

    if torch.is_grad_enabled():
        from ckpt.numerics.cross_entropy import TokenCrossEntropy, use_twice_differentiable

        if use_twice_differentiable():  # the kept graphs of Hessian-vector products
            return TokenCrossEntropy.apply(logits.flatten(0, 1), labels.flatten()).view(labels.shape)
    block = max(1, LOGITS_BLOCK_BYTES // logits.element_size() if block is None else block)
    per_sequence = max(1, math.prod(logits.shape[1:]))
    if torch.is_grad_enabled() or per_sequence * len(logits) <= block:  # one call (an empty batch too)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)
    if per_sequence <= block:
        rows = block // per_sequence
        pieces = [
            F.cross_entropy(logits[i : i + rows].flatten(0, 1), labels[i : i + rows].flatten(), reduction="none")
            for i in range(0, len(logits), rows)
        ]
    else:
        positions = max(1, block // max(1, logits.shape[-1]))
        pieces = [
            F.cross_entropy(logits[b, t : t + positions], labels[b, t : t + positions], reduction="none")
            for b in range(len(logits))
            for t in range(0, logits.shape[1], positions)
        ]
    return torch.cat(pieces).view(labels.shape)


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
    import torch

    from ckpt.numerics.cross_entropy import use_twice_differentiable

    logits = _at_least_float32(logits_of(outputs))
    labels = targets.long()[:, 1:]  # position t predicts token t + 1
    if torch.is_grad_enabled() and use_twice_differentiable():
        # The kept graphs of Hessian-vector products score all T positions: the model's own contiguous
        # [B·T, V] logits flatten to a view, where logits[:, :-1] flattened is a copy, and every product's
        # backward pass put its gradient back in a zeroed [B, T, V] tensor and copied it twice more
        # (docs/performance.md, "Derivative passes"); the products are equal to the bit. The last position's
        # placeholder label (0) is dropped from the losses, so its gradient is zero.
        following = torch.nn.functional.pad(labels.clamp(min=0), (0, 1))
        per_token = _per_token_cross_entropy(logits, following)[:, :-1]
    else:
        per_token = _per_token_cross_entropy(logits[:, :-1], labels.clamp(min=0))
    selected = labels != IGNORE_INDEX
    if mask is not None:
        selected = selected & mask.bool()[:, 1:]
    return per_token[selected]


def _token_rows(targets: Any, mask: Any) -> tuple[Any, Any]:
    labels = targets.long().flatten()
    if mask is None:
        return _arange(labels), labels
    selected = mask.bool().flatten()
    return _arange(labels)[selected], labels[selected]


def _causal_lm_rows(targets: Any, mask: Any) -> tuple[Any, Any]:
    import torch

    labels = targets.long()
    selected = torch.zeros_like(labels, dtype=torch.bool)  # position t predicts token t + 1: the last one nothing
    selected[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    if mask is not None:
        selected[:, :-1] &= mask.bool()[:, 1:]
    following = torch.zeros_like(labels)
    following[:, :-1] = labels[:, 1:]
    return _arange(labels)[selected.flatten()], following.flatten()[selected.flatten()]


def _arange(like: Any) -> Any:
    import torch

    return torch.arange(like.numel(), device=like.device)


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
    _token_rows,
)
CAUSAL_LM = Objective(
    _causal_lm,
    _causal_lm_datapoints,
    "next-token cross-entropy of a causal LM: logits at t against token t+1 of the targets (default: the inputs), "
    "as model(ids, labels=ids).loss; targets -100 and masked tokens are not datapoints",
    _causal_lm_rows,
)


@hookimpl
def ckpt_register_objectives(register: Callable[[str, Objective], None]) -> None:
    """Register the built-in objectives."""
    register("cross-entropy", CROSS_ENTROPY)
    register("token-cross-entropy", TOKEN_CROSS_ENTROPY)
    register("causal-lm", CAUSAL_LM)


__all__ = [
    "CAUSAL_LM",
    "CROSS_ENTROPY",
    "IGNORE_INDEX",
    "LOGITS_BLOCK_BYTES",
    "TOKEN_CROSS_ENTROPY",
    "Objective",
    "ckpt_register_objectives",
    "logits_of",
]

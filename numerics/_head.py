"""First-order JVPs of a language model's token loss without vocabulary-sized tangents.

A causal or token language model ends in a linear head, z = h Wᵀ + c, from its last hidden
state h, and a token's loss is ℓ = logsumexp(z) − z_y. Along a direction (dθ, dW, dc) of the
parameters, with p = softmax(z) and r = p − e_y,

    dℓ = r · dz,   dz = dh Wᵀ + h dWᵀ + dc,
    dℓ = dh · (r W) + h · (r dW) + r · dc,

where dh is the hidden state's own tangent. Forward mode through the head, as
``torch.func.jvp`` runs it, makes each direction's tangent of the logits, a [tokens, V]
tensor per direction, then the log-softmax's tangent of each: at GPT-2 small (V = 50,257,
16 sequences of 128 tokens, 4 directions) four tensors of 1.6 GB, and two products with
W or dW per direction. Written as above, the logits' tangents are never made: r W is one
product shared by every direction, r dW one per direction with a [tokens, d] result, and
the rest is a dot product per token.

At GPT-2 small the first-order pass is about a quarter faster this way (docs/performance.md,
"Derivative passes"); the first derivatives agree to 5e-7 of their largest magnitude.

Used only where both the model and the objective say how: the model is one of
:data:`FUSED_CLASSES` (Hugging Face causal LMs whose forward is ``lm_head`` of the base
model's last hidden state and nothing more) and the objective selects tokens
(:attr:`ckpt.plugins.Objective.token_rows`). Each model is checked once: its losses
through the split must equal its own on the first example of the first block, else the
ordinary JVP runs for it (a logit scale, a soft cap, a head this module does not know).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt.numerics.derivatives import chunks

FUSED_CLASSES = frozenset(
    {
        "GPT2LMHeadModel",
        "GPTNeoForCausalLM",
        "GPTNeoXForCausalLM",
        "GPTJForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "OlmoForCausalLM",
        "Olmo2ForCausalLM",
        "OPTForCausalLM",
        "Qwen2ForCausalLM",
    }
)
"""Hugging Face causal LMs whose logits are ``lm_head(base_model(ids).last_hidden_state)``, unscaled."""

HEAD_BLOCK_BYTES = 64 * 2**20
"""Logits computed at once by the split head (a block of tokens; 334 tokens at V = 50,257 in float32)."""

AGREEMENT = 1e-5
"""Largest difference between the split and the whole model's losses, relative to the largest loss."""

_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHECKED_LOCK = threading.Lock()


@dataclass(frozen=True)
class HeadSplit:
    """Where a model's last hidden state and its linear head are.

    Attributes
    ----------
    prefix
        The base model's attribute (``transformer``, ``model``, ``gpt_neox`` ...): its
        parameters are named ``prefix.*``.
    weights, biases
        The names the head's weight (and bias) go by, the tied ones too
        (``lm_head.weight``, ``transformer.wte.weight``).
    """

    prefix: str
    weights: tuple[str, ...]
    biases: tuple[str, ...]


def head_split(model: Any) -> HeadSplit | None:
    """The split of ``model`` into base model and linear head, or None when it is not known to be one."""
    import torch

    if type(model).__name__ not in FUSED_CLASSES or not type(model).__module__.startswith("transformers."):
        return None
    head = model.get_output_embeddings()
    prefix = getattr(model, "base_model_prefix", "")
    if not isinstance(head, torch.nn.Linear) or not isinstance(getattr(model, prefix, None), torch.nn.Module):
        return None
    named = list(model.named_parameters(remove_duplicate=False))
    weights = tuple(name for name, p in named if p is head.weight)
    biases = tuple(name for name, p in named if head.bias is not None and p is head.bias)
    return HeadSplit(prefix, weights, biases)


def split_first_order(f: Any, primal: Mapping[str, Any], directions: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """``(loss [X], first [K, X])`` of the block loss ``f`` (a ``derivatives.BlockLoss``) by the split head.

    None when the model or the objective has no split, or the model failed its check:
    the caller then runs the ordinary JVP. Runs inside :func:`ckpt.numerics.derivatives.forward_mode`.
    """
    split = head_split(f.model) if f.token_rows is not None else None
    if split is None:
        return None
    params = {**f.batch["fixed"], **primal}
    weight = next((name for name in split.weights if name in params), None)
    if weight is None:
        return None
    bias = next((name for name in split.biases if name in params), None)
    head = (params[weight], params[bias] if bias else None)
    with _CHECKED_LOCK:
        verdict = _CHECKED.get(f.model)
    if verdict is None:
        verdict = _agrees(f, split, primal, head)
        with _CHECKED_LOCK:
            _CHECKED[f.model] = verdict
    if not verdict:
        return None
    # absent when held fixed
    head_directions = (directions.get(weight), directions.get(bias) if bias else None)
    return _first_order(f, split, primal, directions, head, head_directions)


def _hidden(f: Any, split: HeadSplit, batch: Mapping[str, Any]) -> Any:
    """``trainable -> [B, T, d]`` last hidden states of ``batch``."""
    from torch.func import functional_call

    base = getattr(f.model, split.prefix)
    start = len(split.prefix) + 1

    def hidden(trainable: Mapping[str, Any]) -> Any:
        params = {**batch["fixed"], **trainable}
        inner = {name[start:]: value for name, value in params.items() if name.startswith(split.prefix + ".")}
        out = functional_call(base, inner, (batch["inputs"],))
        state = getattr(out, "last_hidden_state", None)
        return out[0] if state is None else state

    return hidden


def _rows(f: Any, batch: Mapping[str, Any]) -> tuple[Any, Any]:
    """The objective's datapoints: rows of the flattened ``[B·T, d]`` hidden states, and their labels."""
    index, labels = f.token_rows(batch["targets"], batch["mask"])
    return index.to(batch["inputs"].device), labels.to(batch["inputs"].device).long()


def _agrees(f: Any, split: HeadSplit, primal: Mapping[str, Any], head: tuple[Any, Any]) -> bool:
    """Whether the split gives the model's own losses on the block's first example (whole block if it has none)."""
    import torch

    batch = f.batch
    one = {**batch, **{key: batch[key][:1] for key in ("inputs", "targets", "mask") if batch[key] is not None}}
    index, labels = _rows(f, one)
    if len(index):
        batch = one
    else:
        index, labels = _rows(f, batch)
    with torch.no_grad():
        expected = f.of(primal, batch)
        h = _hidden(f, split, batch)(primal)
        got = _head_losses(h.flatten(0, 1)[index], labels, *head)
    if got.shape != expected.shape:
        return False
    if not got.numel():
        return True
    scale = max(float(expected.abs().max()), 1.0)
    return float((got - expected).abs().max()) <= AGREEMENT * scale  # False for NaN too: the ordinary JVP runs


def _head_losses(rows: Any, labels: Any, weight: Any, bias: Any) -> Any:
    import torch

    losses = torch.empty(len(rows), dtype=rows.dtype, device=rows.device)
    for block in chunks(len(rows), _block_rows(weight)):
        z = torch.nn.functional.linear(rows[block], weight, bias)
        losses[block] = torch.logsumexp(z, 1) - z.gather(1, labels[block, None]).squeeze(1)
    return losses


def _block_rows(weight: Any) -> int:
    """Tokens whose logits take :data:`HEAD_BLOCK_BYTES`."""
    return max(1, HEAD_BLOCK_BYTES // (weight.shape[0] * weight.element_size()))


def _first_order(
    f: Any,
    split: HeadSplit,
    primal: Mapping[str, Any],
    directions: Mapping[str, Any],
    head: tuple[Any, Any],
    head_directions: tuple[Any, Any],
) -> tuple[Any, Any]:
    import torch
    from torch.func import jvp, vmap

    hidden = _hidden(f, split, f.batch)
    # torch's annotations: jvp's admits 3 items (has_aux's) where it returns 2; vmap's omits None in out_dims
    batched = vmap(lambda direction: jvp(hidden, (primal,), (direction,)), out_dims=(None, 0))  # type: ignore[arg-type]
    h, dh = batched(directions)  # type: ignore[misc]
    index, labels = _rows(f, f.batch)
    rows, tangents = h.flatten(0, 1)[index], dh.flatten(1, 2)[:, index]  # [X, d], [K, X, d]
    (w, c), (dw, dc) = head, head_directions
    losses = torch.empty(len(rows), dtype=rows.dtype, device=rows.device)
    first = torch.empty(tangents.shape[0], len(rows), dtype=rows.dtype, device=rows.device)
    for block in chunks(len(rows), _block_rows(w)):
        z = torch.nn.functional.linear(rows[block], w, c)  # [n, V]
        lse = torch.logsumexp(z, 1)
        y = labels[block, None]
        losses[block] = lse - z.gather(1, y).squeeze(1)
        r = z.sub_(lse[:, None]).exp_()  # p, in place of z
        r.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=r.dtype, device=r.device))  # p − e_y
        along = (tangents[:, block] * (r @ w)).sum(-1)  # dh · (r W), [K, n]
        if dw is not None:  # h · (r dW), one vector at a time: torch.matmul would copy r for each of them
            along += torch.stack([(rows[block] * (r @ dw[k])).sum(-1) for k in range(len(dw))])
        if dc is not None:
            along += dc @ r.T  # r · dc
        first[:, block] = along
    return losses, first

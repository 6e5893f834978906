"""Normalization layers and embedding lookups as elementary ops, for forward-mode AD.

:func:`composite_norms` is the torch-function mode that :func:`ckpt.numerics.derivatives.forward_mode`
runs every JVP and HVP in: torch's own forward-mode rules for layer, batch and instance norm
are wrong under forward-over-forward, and an embedding lookup is cheaper as a row gather in
passes that take no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _normalized(input: Any, dims: tuple[int, ...], eps: float) -> Any:  # noqa: A002 (torch's argument name)
    """(x - mean) / sqrt(biased variance + eps) over ``dims``, from elementary ops."""
    centered = input - input.mean(dim=dims, keepdim=True)
    variance = (centered * centered).mean(dim=dims, keepdim=True)
    return centered * (variance + eps).rsqrt()


def _per_channel(out: Any, weight: Any, bias: Any) -> Any:
    """The affine map of batch and instance norm: ``weight``, ``bias`` of shape [C] on dim 1."""
    shape = (1, -1) + (1,) * (out.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _layer_norm(
    input: Any,  # noqa: A002 (F.layer_norm's own argument names, passed by keyword too)
    normalized_shape: Sequence[int],
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Any:
    """``F.layer_norm`` from elementary ops, whose forward-mode rules compose to second order."""
    out = _normalized(input, tuple(range(-len(normalized_shape), 0)), eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _batch_norm(
    input: Any,  # noqa: A002
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Any | None:
    """``F.batch_norm`` with batch statistics from elementary ops; None where it uses running statistics.

    Running statistics make batch norm an affine map, whose forward-mode rule is
    exact. The running statistics are not updated here (an analysis must not
    change the model).
    """
    if not training and running_mean is not None and running_var is not None:
        return None
    dims = (0, *range(2, input.ndim))
    return _per_channel(_normalized(input, dims, eps), weight, bias)


def _instance_norm(
    input: Any,  # noqa: A002
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Any | None:
    """``F.instance_norm`` with each instance's statistics from elementary ops; None otherwise."""
    if not use_input_stats:
        return None
    return _per_channel(_normalized(input, tuple(range(2, input.ndim)), eps), weight, bias)


def _gathered_embedding(
    input: Any,  # noqa: A002 (F.embedding's own argument names, passed by keyword too)
    weight: Any,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Any | None:
    """``F.embedding`` as ``weight.index_select`` in a forward-mode pass; None (torch's own) with ``max_norm``.

    Why: under ``vmap`` of a JVP the weight's tangent is batched, ``[K, V, d]``, and the
    embedding's batching rule reshapes it to ``[V, K·d]``, a copy of every direction's whole
    table in each pass (at GPT-2 small 147 MiB a direction, the largest block of a pass over
    a few examples; forward mode keeps the tangent in the weight's own layout, so no layout
    of the directions avoids it). A gather along dim 1 of the batched tangent reads only the
    rows looked up. Forward values and tangents are the embedding's, ``padding_idx`` included
    (it changes gradients only, which these passes do not take); ``max_norm`` rescales rows of
    the weight in place and is left to torch.
    """
    if max_norm is not None:
        return None
    return weight.index_select(0, input.reshape(-1)).view(*input.shape, weight.shape[-1])


def composite_norms(*, replace: bool = True, gather: bool = False) -> Any:
    """A context in which normalization layers run as elementary ops inside nested JVPs.

    With ``replace=False`` it changes nothing but being a torch-function mode
    (see :func:`forward_mode`); with ``gather``, embedding lookups run as
    :func:`_gathered_embedding` (forward-mode passes only).

    torch's forward-mode rules for ``native_layer_norm`` and for batch norm with
    batch statistics (which ``instance_norm`` uses too) are right to first order
    but not under forward-over-forward: on the addition transformer the nested
    JVP gave bᵀH b = 517.04 where central finite differences and the
    forward-over-reverse HVP both gave 509.32 (float64), and ``sin`` of a layer
    norm, instance norm or batch norm in training mode is off by 20%, 20% and 7%
    (torch 2.13; ``group_norm``, ``rms_norm`` and the activations were exact).
    The elementary ops' rules compose exactly; they cost the same work in this
    (already unfused) forward-mode pass. Batch norm with running statistics
    (``nn.BatchNorm`` in eval mode, how analyzers run models) is affine and
    left to torch.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    replacements: dict[Callable[..., Any], Callable[..., Any]] = (
        {
            torch.nn.functional.layer_norm: _layer_norm,
            torch.nn.functional.batch_norm: _batch_norm,
            torch.nn.functional.instance_norm: _instance_norm,
        }
        if replace
        else {}
    )
    if gather:
        replacements[torch.nn.functional.embedding] = _gathered_embedding

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            replacement = replacements.get(func)
            if replacement is not None:
                out = replacement(*args, **(kwargs or {}))
                if out is not None:
                    return out
            return func(*args, **(kwargs or {}))

    return _Mode()


__all__ = ["composite_norms"]

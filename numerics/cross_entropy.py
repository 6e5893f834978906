"""Token cross-entropy whose gradient is cheap to differentiate again (Hessian-vector products).

With ``F.cross_entropy``, a product of :class:`ckpt.numerics.derivatives.MeanLossHessian`
differentiates the backward of ``log_softmax`` a second time: at GPT-2 small's
vocabulary that node alone is a large share of a product, in logits-sized
multiplications and exponentials (docs/performance.md, "Derivative passes"). The second
derivative of the loss in the logits is known in closed form,

    ∂/∂z [g (softmax(z) - onehot(y))] along u = g (p ⊙ u - p (p · u)),  p = softmax(z),

so :class:`TokenCrossEntropy` computes the gradient with one custom node whose own
backward is that formula: a few passes over the logits instead of a chain of
generic nodes: the logits' share of a product falls to a fraction, equal to
float32 rounding (docs/performance.md, "Derivative passes").

Used only while :func:`differentiated_twice` is active (the kept Hessian graphs):
the node has no forward-mode rule and no third derivative, which POLCA's JVPs
and ``torch.func`` transforms would need; everywhere else ``F.cross_entropy`` runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

_TWICE = contextvars.ContextVar("ckpt_cross_entropy_twice", default=False)


@contextlib.contextmanager
def differentiated_twice() -> Iterator[None]:
    """Within it, token cross-entropy under autograd runs as :class:`TokenCrossEntropy`."""
    token = _TWICE.set(True)
    try:
        yield
    finally:
        _TWICE.reset(token)


def use_twice_differentiable() -> bool:
    """Whether :func:`differentiated_twice` is active."""
    return _TWICE.get()


class _SoftmaxMinusOneHot(torch.autograd.Function):
    """``(z, lse, y, g) -> g (softmax(z) - onehot(y))`` row by row; ``lse`` = logsumexp(z), held fixed.

    Its backward is the full Jacobian in ``z`` (the path through ``lse`` included) and ``g``;
    it is differentiable once, all a Hessian-vector product needs.
    """

    @staticmethod
    def forward(ctx: Any, z: Any, lse: Any, y: Any, g: Any) -> Any:
        ctx.save_for_backward(z, lse, y, g)
        out = (z - lse[:, None]).exp_().mul_(g[:, None])
        return out.scatter_add_(1, y[:, None], -g[:, None])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, u: Any) -> tuple[Any, None, None, Any]:
        z, lse, y, g = ctx.saved_tensors
        p = (z - lse[:, None]).exp_()  # recomputed each product: kept, it would add logits to every graph
        p_u = p * u
        along = p_u.sum(1)  # p · u, per row
        dz = p_u.sub_(p.mul_(along[:, None])).mul_(g[:, None])  # g (p ⊙ u - p (p · u))
        dg = along - u.gather(1, y[:, None]).squeeze(1)  # (p - onehot(y)) · u
        return dz, None, None, dg


class TokenCrossEntropy(torch.autograd.Function):
    """``cross_entropy(z, y, reduction="none")`` for ``[N, V]`` logits and ``[N]`` labels (no ignore index)."""

    @staticmethod
    def forward(ctx: Any, z: Any, y: Any) -> Any:
        """The per-row loss, ``logsumexp(z) - z[y]``; saves what :meth:`backward` needs."""
        lse = torch.logsumexp(z, 1)
        ctx.save_for_backward(z, lse, y)
        return lse - z.gather(1, y[:, None]).squeeze(1)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple[Any, None]:
        """``g (softmax(z) - onehot(y))``, itself differentiable once more (Hessian-vector products)."""
        z, lse, y = ctx.saved_tensors
        return _SoftmaxMinusOneHot.apply(z, lse, y, g), None


__all__ = [
    "TokenCrossEntropy",
    "differentiated_twice",
    "use_twice_differentiable",
]

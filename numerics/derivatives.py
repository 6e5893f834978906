"""Derivatives of per-datapoint losses along directions in parameter space (analyzer helpers).

What the Hessian-basis, POLCA, Fisher and LCA analyzers share, usable by any
analyzer plugin that works in parameter space:

- :func:`loss_function`: the per-datapoint loss of a block of examples as a
  function of the parameters (the store's model and objective, functionally),
  over a :class:`ckpt.numerics.params.ParamSpace`.
- :func:`eager_directional_derivatives` (the entry point, with the compiled
  variant, is :func:`ckpt.numerics.compiled.directional_derivatives`): for K
  directions b at once, every datapoint's loss, ⟨∇ℓ(x), b⟩ and, optionally,
  bᵀ∇²ℓ(x)b, by forward-mode AD (``torch.func.jvp``, nested for the second order)
  vectorized over the directions with ``torch.func.vmap``: the primal is computed
  once and shared.
- :func:`hessian_vector_product` and :class:`MeanLossHessian`: one Hessian-vector
  product by forward-over-reverse AD, and many at one point through kept gradient
  graphs (:mod:`ckpt.numerics.lanczos` finds eigenpairs from them).

The parameter space (:mod:`ckpt.numerics.params`) and the stored basis format
(:mod:`ckpt.numerics.basis_format`) have their own modules; their names are
importable from here too, as they were before they moved.

Why forward mode for per-datapoint projections: the number of directions K
(tens) is far below the number of datapoints (thousands), so K JVPs of the
per-datapoint loss vector give every datapoint's projected gradient, where
reverse mode would need one backward pass per datapoint.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.numerics.basis_format import basis_dims, check_basis, held_basis, load_basis, load_basis_rows, stored_basis
from ckpt.numerics.norms import composite_norms
from ckpt.numerics.params import DTYPES, ParamSpace, cast_floating, chunks, parameter_space, torch_dtype, trainable

# torch's forward-mode AD levels are process-global, not per thread: two threads running
# jvp at once fail ("Trying to access a forward AD level with an invalid index", seen
# with the threads scheduler). JVPs of one process therefore run one at a time; each
# still uses torch's intra-op threads, and processes or a cluster run checkpoints in parallel.
FORWARD_AD_LOCK = threading.Lock()


def loss_function(
    worker: Any,
    params: Mapping[str, Any],
    space: ParamSpace,
    *,
    split: str,
    examples: Sequence[int] | slice,
    objective: str | None = None,
    dtype: str = "float32",
) -> BlockLoss:
    """``f(trainable) -> per-datapoint losses`` of ``examples`` of ``split`` (a :class:`BlockLoss`).

    The tensors of ``params`` outside ``space`` (buffers) are held fixed. The
    datapoints are those of the objective (one per example, or one per
    selected token), in row-major order.

    Parameters
    ----------
    worker
        The :class:`ckpt.plugins.Worker` of the task.
    params
        Every tensor of the checkpoint: ``worker.params(step)``.
    space
        Which of them are the function's arguments (:func:`parameter_space`).
    split, examples
        The data: a split and a slice or index array of its examples.
    objective
        Per-datapoint loss (default: the store's).
    dtype
        ``"float32"`` or ``"float64"``: the precision of the whole computation (the
        model of ``worker.model_for``, the floating-point inputs and the held buffers).

    Returns
    -------
    BlockLoss
        ``f(trainable) -> [X]``, the losses of the block's X datapoints; ``trainable`` is a
        dict ``{name: tensor}`` of the tensors of ``space`` (:func:`trainable`), not a flat
        vector (``space.unflatten`` turns one into it).

    Examples
    --------
    >>> f = loss_function(worker, params, space, split="eval", examples=slice(0, 64))  # doctest: +SKIP
    >>> losses = f(trainable(params, space))  # [X] torch  # doctest: +SKIP
    """
    import torch

    precision = torch_dtype(dtype)
    model = worker.model_for(None if precision == torch.float32 else precision)
    data = worker.data(split)
    rows = examples if isinstance(examples, slice) else torch.as_tensor(np.asarray(examples), device=worker.device)
    inputs = data["inputs"][rows]
    targets = data["targets"][rows] if "targets" in data else inputs
    mask = data["mask"][rows] if "mask" in data else None
    if inputs.is_floating_point():
        inputs = inputs.to(precision)
    fixed = {k: cast_floating(v, precision) for k, v in params.items() if k not in space.names}
    batch = {"fixed": fixed, "inputs": inputs, "targets": targets, "mask": mask}
    chosen = worker.objective(objective)
    return BlockLoss(model, chosen.losses, batch, chosen.token_rows)


@dataclass(frozen=True, eq=False)
class BlockLoss:
    """The per-datapoint losses of one block of data, as a function of the trainable parameters.

    Calling it, ``f(trainable)``, gives the losses; :meth:`of` takes the
    block's tensors as arguments too, so that one traced or compiled program
    serves every block and checkpoint of the same shapes (see
    :func:`directional_derivatives`, ``compiled``).

    Attributes
    ----------
    model
        The module, called functionally (its own weights are unused).
    losses
        The objective's ``losses(outputs, targets, mask)``.
    batch
        ``{"fixed": {name: buffer}, "inputs", "targets", "mask"}`` of the block.
    token_rows
        The objective's :attr:`ckpt.plugins.Objective.token_rows`, when it has one.
    """

    model: Any
    losses: Callable[[Any, Any, Any], Any]
    batch: Mapping[str, Any]
    token_rows: Callable[[Any, Any], tuple[Any, Any]] | None = None

    def __call__(self, trainable: Mapping[str, Any]) -> Any:
        """Per-datapoint losses ``[X]`` at ``trainable``."""
        return self.of(trainable, self.batch)

    def of(self, trainable: Mapping[str, Any], batch: Mapping[str, Any]) -> Any:
        """Per-datapoint losses of ``batch`` (shaped like :attr:`batch`) at ``trainable``."""
        from torch.func import functional_call

        outputs = functional_call(self.model, {**batch["fixed"], **trainable}, (batch["inputs"],))
        return self.losses(outputs, batch["targets"], batch["mask"])


def eager_directional_derivatives(
    f: Callable[[Mapping[str, Any]], Any], primal: Mapping[str, Any], directions: Mapping[str, Any], order: int
) -> tuple[Any, Any, Any]:
    """``directional_derivatives`` uncompiled: ``vmap`` over nested ``jvp`` (see ``ckpt.numerics.compiled``)."""
    from torch.func import jvp, vmap

    # the ignores below are torch's annotations: jvp's admits 3 items (has_aux's) where it returns 2,
    # and vmap's omits the None that out_dims takes (an output not batched)

    if order == 1:

        def along(direction: Mapping[str, Any]) -> tuple[Any, Any]:
            return jvp(f, (primal,), (direction,))  # type: ignore[return-value]

        loss, first = vmap(along, out_dims=(None, 0))(directions)  # type: ignore[arg-type]
        return loss, first, None

    def along2(direction: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        def slope(params: Mapping[str, Any]) -> tuple[Any, Any]:
            loss, first = jvp(f, (params,), (direction,))  # type: ignore[misc]
            return first, loss

        (first, loss), (second, _) = jvp(slope, (primal,), (direction,))  # type: ignore[misc]
        return loss, first, second

    loss, first, second = vmap(along2, out_dims=(None, 0, 0))(directions)  # type: ignore[arg-type]
    return loss, first, second


@contextlib.contextmanager
def forward_mode(*, composite: bool, lock: bool = True, forward_only: bool = False) -> Iterator[None]:
    """What forward-mode AD through any model needs; every JVP and HVP here runs in it.

    - :data:`FORWARD_AD_LOCK`;
    - attention's math backend: the fused ``scaled_dot_product_attention``
      kernels have no forward-mode rule;
    - a torch-function mode (:func:`composite_norms`): while one is active,
      ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` skip their
      fused inference paths (``_native_multi_head_attention``,
      ``_transformer_encoder_layer_fwd``), which have no forward-mode rule either;
      with ``composite``, normalization layers run as elementary ops (needed for
      the second order of a nested JVP); with ``forward_only`` (passes that
      take no gradient: the directional derivatives), embedding lookups run as
      row gathers (:func:`_gathered_embedding`).

    ``lock=False`` leaves out the lock, for reverse-mode passes that take the
    rest for the same model (the math attention kernel has a double backward).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    held = FORWARD_AD_LOCK if lock else contextlib.nullcontext()
    with held, sdpa_kernel(SDPBackend.MATH), composite_norms(replace=composite, gather=forward_only):
        yield


@contextlib.contextmanager
def hessian_graph_mode() -> Iterator[None]:
    """How a gradient graph that Hessian-vector products differentiate again is built.

    :func:`forward_mode` without its lock (reverse mode only), and token cross-entropy
    with its second derivative in closed form (:mod:`ckpt.numerics.cross_entropy`).
    """
    from ckpt.numerics.cross_entropy import differentiated_twice

    with forward_mode(composite=False, lock=False), differentiated_twice():
        yield


def hessian_vector_product(
    fs: Sequence[tuple[Callable[[Mapping[str, Any]], Any], float]],
    primal: Mapping[str, Any],
    vector: Mapping[str, Any],
) -> dict[str, Any]:
    """H v for the loss ``Σ_i weight_i · sum(f_i(θ))``, by forward-over-reverse AD.

    Parameters
    ----------
    fs
        ``[(f, weight), ...]``: per-datapoint loss functions of blocks of data
        and their weights (``1 / datapoints`` for a mean over all blocks).
    primal
        θ.
    vector
        v, shaped like θ.
    """
    from torch.func import grad, jvp

    total: dict[str, Any] | None = None
    for f, weight in fs:

        def scalar(params: Mapping[str, Any], f: Callable = f, weight: float = weight) -> Any:
            return f(params).sum() * weight

        with forward_mode(composite=False):
            # jvp's annotation admits 3 items (has_aux's); it returns 2
            _, hv = jvp(grad(scalar), (primal,), (vector,))  # type: ignore[misc]
        total = dict(hv) if total is None else {k: total[k] + hv[k] for k in total}
    assert total is not None
    return total


class MeanLossHessian:
    """``v -> H v`` for the loss ``Σ_i weight_i · sum(f_i(θ))`` at a fixed θ, for many v.

    Each block's gradient is built once with its graph kept (reverse mode,
    ``create_graph=True``), and every product differentiates those gradients
    again along v (reverse over reverse, PyHessian's scheme): a product costs
    one backward pass through the kept graphs instead of a forward, a backward
    and their tangents, about half the time of :func:`hessian_vector_product`;
    ``torch.func.linearize`` matched it but its trace per block costs more than
    a checkpoint's products save (bench/polca.py; docs/performance.md,
    "Derivative passes"). The kept graphs hold every block's
    activations and their derivatives at once: memory grows with the data,
    which ``--samples`` bounds. Reverse mode takes no forward-AD level, so
    operators of different threads run at the same time.

    Parameters
    ----------
    fs
        ``[(f, weight), ...]`` as for :func:`hessian_vector_product`.
    primal
        θ, ``{name: tensor}``.
    keep_graphs
        Keep every block's graph (default), or rebuild each block's graph per product
        (memory of one block, at the cost of a forward and a backward pass more per block
        and product).
    kept_blocks
        Keep the graphs of the first this many blocks only and rebuild the rest per
        product (overrides ``keep_graphs``): where the budget holds most of the graphs
        but not all, a product rebuilds only the blocks that do not fit.
    """

    def __init__(
        self,
        fs: Sequence[tuple[Callable[[Mapping[str, Any]], Any], float]],
        primal: Mapping[str, Any],
        *,
        keep_graphs: bool = True,
        kept_blocks: int | None = None,
    ):
        import torch

        self.names = tuple(primal)
        blocks = list(fs)
        kept = (len(blocks) if keep_graphs else 0) if kept_blocks is None else max(0, min(kept_blocks, len(blocks)))
        self.keep_graphs = kept == len(blocks)
        self._kept_fs, self._rebuilt_fs = blocks[:kept], blocks[kept:]
        self._leaves = [primal[name].detach().requires_grad_(True) for name in self.names]
        self._gradient: list[Any] = []
        if self._kept_fs:
            with torch.enable_grad():
                for f, weight in self._kept_fs:
                    grads = self._block_gradient(f, weight)
                    self._gradient = (
                        list(grads)
                        if not self._gradient
                        else [t + g for t, g in zip(self._gradient, grads, strict=True)]
                    )

    def _block_gradient(self, f: Callable[[Mapping[str, Any]], Any], weight: float) -> tuple[Any, ...]:
        import torch

        params = dict(zip(self.names, self._leaves, strict=True))
        with hessian_graph_mode():
            loss = f(params).sum() * weight
        return torch.autograd.grad(loss, self._leaves, create_graph=True)

    def release(self) -> None:
        """Free the kept gradient graphs, for a caller done with its products; a later product raises."""
        self._gradient, self._kept_fs, self._rebuilt_fs = [], [], []
        self._released = True

    def __call__(self, vector: Mapping[str, Any]) -> dict[str, Any]:
        """H v, ``{name: tensor}`` like θ."""
        import torch

        if getattr(self, "_released", False):
            msg = "this Hessian's graphs were released (release()): it has no products any more"
            raise RuntimeError(msg)
        direction = [vector[name] for name in self.names]
        with torch.enable_grad():
            if self._gradient:
                kept = torch.autograd.grad(self._gradient, self._leaves, grad_outputs=direction, retain_graph=True)
                if not self._rebuilt_fs:
                    return dict(zip(self.names, kept, strict=True))
                total = list(kept)
            else:
                total = [torch.zeros_like(leaf) for leaf in self._leaves]
            # the other blocks' graphs one at a time, built and freed per product: memory of one
            # block, at the cost of a forward and a backward pass more per block and product
            for f, weight in self._rebuilt_fs:
                grads = self._block_gradient(f, weight)
                block = torch.autograd.grad(grads, self._leaves, grad_outputs=direction)
                total = [t.add_(b) for t, b in zip(total, block, strict=True)]
        return dict(zip(self.names, total, strict=True))

    def flat(self, space: ParamSpace) -> Callable[[Any], Any]:
        """``v -> H v`` on flat ``[D]`` vectors of ``space``, every product written into one kept buffer.

        The same buffer is returned by every call (what :func:`ckpt.numerics.lanczos.top_eigenpairs` allows).
        Why: a fresh ``[D]`` tensor per product is mapped and zeroed page by page, several times the
        cost of flattening into a kept buffer (docs/performance.md, "Derivative passes").
        """
        import torch

        leaf = self._leaves[0]
        out = torch.empty(space.size, dtype=leaf.dtype, device=leaf.device)

        def hvp(v: Any) -> Any:
            return space.flatten(self(space.unflatten(v)), out=out)

        return hvp


def graph_bytes(f: Callable[[Mapping[str, Any]], Any], primal: Mapping[str, Any]) -> int:
    """Bytes the autograd graph of ``f``'s gradient holds when kept for Hessian-vector products.

    The storages allocated while ``f`` runs and its gradient is built with
    ``create_graph=True`` that are still held once the gradient exists
    (:func:`ckpt.numerics.footprint.held_bytes`; the parameters themselves excluded): what
    :class:`MeanLossHessian` keeps per block. Measured on a small block, it sizes
    the blocks a memory budget allows (it grows linearly with the examples).

    Why not ``saved_tensors_hooks``, which this used before: a pack hook that
    returns the tensor it is given makes a reference cycle through autograd's C++
    nodes when the tensor is the node's own output, which Python's collector
    cannot see. Every measured graph stayed alive: 60 MiB per call at 5M
    parameters, about 1.5 GiB per basis checkpoint at GPT-2 small, which is how
    hessian-basis overshot its plan there.
    """
    import torch

    from ckpt.numerics.footprint import held_bytes

    leaves = {name: value.detach().requires_grad_(True) for name, value in primal.items()}

    def build() -> Any:
        with torch.enable_grad():
            with hessian_graph_mode():  # as MeanLossHessian builds its graphs
                loss = f(leaves).sum()
            return torch.autograd.grad(loss, list(leaves.values()), create_graph=True)

    return held_bytes(build)


__all__ = [
    "DTYPES",
    "FORWARD_AD_LOCK",
    "BlockLoss",
    "MeanLossHessian",
    "ParamSpace",
    "basis_dims",
    "cast_floating",
    "check_basis",
    "chunks",
    "composite_norms",
    "eager_directional_derivatives",
    "forward_mode",
    "graph_bytes",
    "held_basis",
    "hessian_graph_mode",
    "hessian_vector_product",
    "load_basis",
    "load_basis_rows",
    "loss_function",
    "parameter_space",
    "stored_basis",
    "torch_dtype",
    "trainable",
]

"""Derivatives of per-datapoint losses along directions in parameter space (analyzer helpers).

What the Hessian-basis, POLCA, Fisher and LCA analyzers share, usable by any
analyzer plugin that works in parameter space:

- :class:`ParamSpace`: the trainable tensors of a model as one flat vector
  (names, shapes, offsets), to go between ``{name: tensor}`` and ``[D]``.
- :func:`loss_function`: the per-datapoint loss of a block of examples as a
  function of the parameters (the store's model and objective, functionally).
- :func:`directional_derivatives` (its entry point, with the compiled
  variant, is in ``_compiled``): for K directions b at once, every
  datapoint's loss, ⟨∇ℓ(x), b⟩ and, optionally, bᵀ∇²ℓ(x)b, by forward-mode AD
  (``torch.func.jvp``, nested for the second order) vectorized over the
  directions with ``torch.func.vmap``: the primal is computed once and shared.
- :func:`hessian_vector_product`, :class:`MeanLossHessian` and
  :func:`top_eigenpairs`: one Hessian-vector product by forward-over-reverse AD,
  many at one point through kept gradient graphs, and (``_lanczos``) the top
  eigenpairs of the Hessian restricted to the orthogonal complement of a basis.
- :func:`load_basis`: a stored basis result (``hessian-basis``, ``random-basis``
  or a plugin's) as torch tensors on a worker, cached per worker;
  :func:`load_basis_rows` some of its vectors, read when needed.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.errors import AnalysisError
from ckpt.numerics.weightless import built_on_meta
from ckpt.store.arrays import read_here

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store import Store

# torch's forward-mode AD levels are process-global, not per thread: two threads running
# jvp at once fail ("Trying to access a forward AD level with an invalid index", seen
# with the threads scheduler). JVPs of one process therefore run one at a time; each
# still uses torch's intra-op threads, and processes or a cluster run checkpoints in parallel.
FORWARD_AD_LOCK = threading.Lock()

DTYPES = ("float32", "float64")
"""Computation precisions analyzers accept (``--dtype``)."""


@dataclass(frozen=True)
class ParamSpace:
    """The trainable tensors of a model, laid out as one flat vector.

    Attributes
    ----------
    names
        Tensor names, in store order.
    shapes
        Shape of each tensor.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def sizes(self) -> list[int]:
        """Elements of each tensor."""
        return [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]

    @property
    def size(self) -> int:
        """D, the number of trainable parameters."""
        return int(sum(self.sizes))

    @property
    def offsets(self) -> list[int]:
        """Start of each tensor in the flat vector."""
        return [int(x) for x in np.cumsum([0, *self.sizes[:-1]])]

    def flatten(self, tensors: Mapping[str, Any], batch_dims: int = 0, out: Any = None) -> Any:
        """``{name: [*batch, *shape]}`` -> ``[*batch, D]`` (torch), into ``out`` when given."""
        import torch

        flat = [tensors[n].reshape(*tensors[n].shape[:batch_dims], -1) for n in self.names]
        return torch.cat(flat, dim=-1) if out is None else torch.cat(flat, dim=-1, out=out)

    def unflatten(self, flat: Any) -> dict[str, Any]:
        """``[*batch, D]`` -> ``{name: [*batch, *shape]}`` (views, torch or numpy)."""
        batch = tuple(flat.shape[:-1])
        out = {}
        for name, shape, start, size in zip(self.names, self.shapes, self.offsets, self.sizes, strict=True):
            out[name] = flat[..., start : start + size].reshape(*batch, *shape)
        return out


def parameter_space(store: Store, model: Any = None) -> ParamSpace:
    """The floating-point checkpoint tensors that are parameters of the store's model.

    Buffers (running statistics, masks) are held fixed: they are not
    directions of training. Without a model spec every floating-point tensor
    counts as a parameter.

    Parameters
    ----------
    store
        A :class:`ckpt.store.Store` (``ctx.store``, ``worker.store``).
    model
        The built model, when the caller has it: in a task, ``worker.model`` (cached per thread).
        None: the model is built from the store's spec, which runs its factory (it must be
        trusted) and allocates a full set of weights; cheap for small models, but in a task
        pass ``worker.model`` and cache the result with ``worker.cached``.

    Returns
    -------
    ParamSpace
        The trainable tensors' names (in store order) and shapes.

    Raises
    ------
    AnalysisError
        When the store has no floating-point parameter.

    Examples
    --------
    >>> space = worker.cached(("space",), lambda: parameter_space(worker.store, worker.model))  # doctest: +SKIP
    >>> space.names, space.size  # doctest: +SKIP
    (('0.weight', '0.bias', '2.weight', '2.bias'), 68)
    """
    floating = [name for name, info in store.schema.items() if "float" in info.dtype]
    if model is None and store.model is not None:
        model = built_on_meta(store.model.build)  # which parameters train, not their values
    if model is not None:
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        floating = [name for name in floating if name in trainable]
    if not floating:
        msg = f"{store.path} has no floating-point parameters to differentiate"
        raise AnalysisError(msg)
    return ParamSpace(tuple(floating), tuple(tuple(store.schema[n].shape) for n in floating))


def cast_floating(tensor: Any, dtype: Any) -> Any:
    """``tensor`` in ``dtype`` when it is floating-point (integer token ids and masks stay as they are)."""
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def torch_dtype(name: str) -> Any:
    """The torch dtype of a ``--dtype`` value: ``torch_dtype("float64") is torch.float64``.

    Parameters
    ----------
    name
        One of :data:`DTYPES`.

    Raises
    ------
    AnalysisError
        When ``name`` is not one of :data:`DTYPES`.
    """
    import torch

    if name not in DTYPES:
        msg = f"dtype must be one of {', '.join(DTYPES)}, got {name!r}"
        raise AnalysisError(msg)
    return getattr(torch, name)


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


def trainable(params: Mapping[str, Any], space: ParamSpace, dtype: str = "float32") -> dict[str, Any]:
    """The tensors of ``space`` from ``params``, in the computation precision: the point to differentiate at.

    Parameters
    ----------
    params
        Every tensor of the checkpoint: ``worker.params(step)``.
    space
        The trainable tensors (:func:`parameter_space`).
    dtype
        One of :data:`DTYPES`.

    Returns
    -------
    dict
        ``{name: tensor}`` for the names of ``space``, in its order; ``space.flatten`` of it is
        the flat ``[D]`` vector.
    """
    precision = torch_dtype(dtype)
    return {name: params[name].to(precision) for name in space.names}


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


def chunks(total: int, size: int) -> Iterator[slice]:
    """``slice``s of at most ``size`` covering ``range(total)``, as even as they can be.

    Their lengths differ by at most one (1,250 in blocks of 256: five of 250),
    so that a program traced or compiled per shape serves every block.

    Parameters
    ----------
    total
        Items to cover (examples of a split, directions).
    size
        Most items per slice (at least 1).

    Examples
    --------
    >>> [(s.start, s.stop) for s in chunks(10, 4)]
    [(0, 4), (4, 7), (7, 10)]
    """
    size = max(1, int(size))
    count = -(-total // size)
    start = 0
    for index in range(count):
        stop = start + total // count + (index < total % count)
        yield slice(start, stop)
        start = stop


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


def stored_basis(worker: Any, name: str, created: str) -> Any:
    """The stored basis result ``name`` (lazy), the one created at ``created`` (re-read when it was recomputed).

    Opened once per worker: opening a result reads its commit record and index coordinates, which
    per call made a small POLCA run markedly slower (docs/performance.md, "POLCA passes").
    """

    def opened() -> Any:
        result = worker.analysis(name)
        if result.ckpt.created != created:
            worker.store.refresh()
            result = worker.store.analysis(name)
        return result

    return worker.cached(("stored-basis", name, created), opened)


def load_basis(worker: Any, name: str, created: str, space: ParamSpace, dtype: str = "float32") -> dict[str, Any]:
    """A stored basis result as ``{tensor: [K, *shape]}`` torch tensors on the worker's device.

    Cached per worker for (name, created): a recomputed basis is read again.
    """
    import torch

    precision = torch_dtype(dtype)

    def read() -> dict[str, Any]:
        result = stored_basis(worker, name, created)
        return {
            tensor: torch.from_numpy(read_here(result[tensor])).to(device=worker.device, dtype=precision)
            for tensor in space.names
        }

    return worker.cached(_basis_key(name, created, dtype), read)


def held_basis(worker: Any, name: str, created: str, dtype: str = "float32") -> dict[str, Any] | None:
    """The basis :func:`load_basis` holds on this worker, or None where it holds none (nothing is read)."""
    return worker.held(_basis_key(name, created, dtype))


def _basis_key(name: str, created: str, dtype: str) -> tuple[str, ...]:
    """The worker cache's key of a whole basis (:func:`load_basis`, :func:`held_basis`)."""
    return ("basis", name, created, dtype)


def load_basis_rows(
    worker: Any, name: str, created: str, space: ParamSpace, rows: slice, dtype: str = "float32", tensors: Any = None
) -> dict[str, Any]:
    """Rows ``rows`` of a stored basis result as ``{tensor: [rows, *shape]}`` torch tensors, read now (not cached).

    For a basis too large to hold whole beside the passes that use it (:func:`load_basis` holds it
    for the worker's life): only the stored chunks holding these rows are read, each checked
    against its digest. ``tensors``: read only these tensors (default: every tensor of ``space``).
    """
    import torch

    precision = torch_dtype(dtype)
    result = stored_basis(worker, name, created)
    return {
        tensor: torch.from_numpy(read_here(result[tensor].isel(basis=rows))).to(device=worker.device, dtype=precision)
        for tensor in (space.names if tensors is None else tensors)
    }


def basis_dims(name: str, ndim: int) -> tuple[str, ...]:
    """Dims of a basis variable: ``basis`` and the checkpoint tensor's own dims (``NAME.0`` ...)."""
    return ("basis", *(f"{name}.{axis}" for axis in range(ndim)))


def check_basis(result: Any, space: ParamSpace, name: str) -> int:
    """Validate a basis result against the parameters; return K."""
    missing = [tensor for tensor in space.names if tensor not in result.data_vars]
    if missing or "basis" not in result.dims:
        msg = (
            f"analysis {name!r} is not a basis: it needs a 'basis' dim and one variable per parameter "
            f"tensor (missing {missing[:3]})"
        )
        raise AnalysisError(msg)
    for tensor, shape in zip(space.names, space.shapes, strict=True):
        if tuple(result[tensor].shape[1:]) != shape:
            msg = f"basis {name!r}: {tensor} has shape {tuple(result[tensor].shape[1:])}, parameters have {shape}"
            raise AnalysisError(msg)
    return int(result.sizes["basis"])


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

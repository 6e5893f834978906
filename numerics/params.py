"""A model's trainable tensors as one flat vector, and the precisions analyzers compute in.

:class:`ParamSpace` (names, shapes, offsets) goes between ``{name: tensor}`` and
``[D]``; :func:`parameter_space` finds it in a store; :func:`trainable` takes a
checkpoint's tensors of it in a ``--dtype`` (:data:`DTYPES`, :func:`torch_dtype`);
:func:`chunks` splits a count into even blocks. Beneath every other numerics module
that works in parameter space (derivatives, the basis format, Lanczos' callers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.errors import AnalysisError
from ckpt.numerics.weightless import built_on_meta

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store import Store


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


__all__ = ["DTYPES", "ParamSpace", "cast_floating", "chunks", "parameter_space", "torch_dtype", "trainable"]

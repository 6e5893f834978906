"""Shapes before memory: a store's model is built on ``meta`` and compared with its checkpoints first.

:meth:`ckpt.store.ModelSpec.build` calls :func:`build_model`, which

1. checks the config against the factory's schema (:mod:`ckpt.store.factory_config`);
2. builds the model with torch's default device set to ``meta`` (shapes and dtypes, no memory),
   while every parameter and buffer the build registers is counted: a build that registers more
   parameter elements than twice the checkpoints hold (plus :data:`PARAMETER_SLACK`), or more
   buffer bytes than :func:`buffer_budget`, is stopped there (a million layers take no minutes);
3. compares that model with the checkpoints: every parameter must be stored (tied names count as
   one), with the stored shape, and so must every buffer the checkpoints hold; the buffers the
   model makes itself (causal masks, rotary tables) must fit the budget;
4. only then builds the model for real, counted the same way.

A factory whose code cannot run on ``meta`` (it reads a value it computed, ``.item()``) is built
for real at step 2, counted, and compared after. Whatever a factory raises is one
:class:`~ckpt.errors.ModelConfigError` naming it and the store.

A store imported with ``--tensors`` (:mod:`ckpt.store.selection`) holds some of the model's tensors:
:func:`check_model` compares only those (each a tensor of the model, of its shape and kind of dtype),
bounded by the whole checkpoint's recorded size; :func:`build_model` still needs every parameter,
and says which ones the selection left out.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ckpt.errors import ModelConfigError
from ckpt.store.factory_config import check_config
from ckpt.store.selection import TensorSelection, missing_message

__all__ = [
    "BUFFER_FACTOR",
    "BUFFER_FLOOR",
    "PARAMETER_SLACK",
    "buffer_budget",
    "build_model",
    "check_model",
    "model_on_meta",
    "unstored_parameters",
]

BUFFER_FLOOR = 64 << 20
"""Bytes of buffers any model may make, however small its checkpoints (a causal mask of 4,096 positions: 16 MiB)."""
BUFFER_FACTOR = 4
"""Beyond the floor, a model's own buffers may total this many times its checkpoint's bytes."""
PARAMETER_SLACK = 1 << 20
"""Parameter elements a build may register beyond twice the stored ones (heads created, then tied)."""


def buffer_budget(stored_bytes: int) -> int:
    """Bytes the buffers of a model whose checkpoint holds ``stored_bytes`` may total."""
    return max(BUFFER_FLOOR, BUFFER_FACTOR * stored_bytes)


def _size(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""  # pragma: no cover


class _Counter:
    """Parameter elements and buffer bytes registered by one thread's build, stopped at their limits."""

    def __init__(self, parameters: int, buffers: int, describe: Callable[[str], str]) -> None:
        self.limits = parameters, buffers
        self.describe = describe
        self.owner = threading.get_ident()
        self.parameters: dict[int, int] = {}
        self.buffers: dict[int, int] = {}
        self.exceeded = False
        """Set when a limit stopped the build (so that it is not retried off ``meta``)."""

    def stop(self, what: str) -> None:
        self.exceeded = True
        raise ModelConfigError(self.describe(what))

    def on_parameter(self, module: Any, name: str, parameter: Any) -> None:
        if parameter is None or threading.get_ident() != self.owner or id(parameter) in self.parameters:
            return
        self.parameters[id(parameter)] = parameter.numel()
        limit = self.limits[0]
        if sum(self.parameters.values()) > limit:
            what = f"parameters beyond the {limit:,} elements its checkpoints allow (at {type(module).__name__}.{name})"
            self.stop(what)

    def on_buffer(self, module: Any, name: str, buffer: Any) -> None:
        if buffer is None or threading.get_ident() != self.owner:
            return
        self.buffers[id(buffer)] = buffer.numel() * buffer.element_size()
        limit = self.limits[1]
        if sum(self.buffers.values()) > limit:
            shape = list(buffer.shape)
            what = (
                f"buffers beyond the {_size(limit)} its checkpoints' size allows (at the buffer {name!r} of "
                f"{type(module).__name__}, {shape}, {_size(self.buffers[id(buffer)])})"
            )
            self.stop(what)


@contextlib.contextmanager
def _counted(counter: _Counter) -> Iterator[None]:
    """Every parameter and buffer this thread registers meanwhile goes through ``counter``."""
    from torch.nn.modules import module

    handles = [
        module.register_module_parameter_registration_hook(counter.on_parameter),
        module.register_module_buffer_registration_hook(counter.on_buffer),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def unstored_parameters(model: Any, stored: set[str] | Mapping[str, Any]) -> list[str]:
    """Names of the parameters of ``model`` that no name in ``stored`` holds (tied names count as one)."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group[0] for group in names.values() if not any(name in stored for name in group)]


def _shown(items: list[str]) -> str:
    return ", ".join(items[:5]) + (f" (and {len(items) - 5} more)" if len(items) > 5 else "")


def _kind(dtype: Any) -> str:
    """float, complex, bool or int: what a stored dtype and the model's must agree on (widths may differ)."""
    text = str(dtype).removeprefix("torch.")
    return next((k for k in ("complex", "float", "bool") if k in text), "int")


def compare(
    model: Any,
    stored: Mapping[str, tuple[int, ...]],
    budget: int,
    name: str,
    where: str,
    selection: TensorSelection | None = None,
    whole: bool = True,
    dtypes: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`ModelConfigError` unless ``model`` (on any device) is the model of these checkpoints.

    ``selection``: the checkpoints are that subset of the model's tensors. Then each stored tensor
    must be one of the model's, of its kind of dtype (``dtypes``: stored name -> logical dtype);
    ``whole`` False compares only them, True (a model to evaluate) still needs every parameter.
    """
    missing = unstored_parameters(model, stored) if whole or selection is None else []
    if missing:
        raise ModelConfigError(missing_message(len(missing), _shown([repr(m) for m in missing]), where, selection))
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    if selection is not None:
        own = dict(tensors)
        lacks = [key for key in stored if key not in own]
        if lacks:
            msg = (
                f"{name} builds, from the model config of {where}, a model without {len(lacks)} of the tensors "
                f"{where} holds ({selection.option}): {_shown([repr(k) for k in lacks])}; record the config these "
                "checkpoints were written with (ckpt set-model)"
            )
            raise ModelConfigError(msg)
        kinds = [
            f"{key!r} is {dtypes[key]} (the model's is {str(own[key].dtype).removeprefix('torch.')})"
            for key in stored
            if dtypes and key in dtypes and _kind(dtypes[key]) != _kind(own[key].dtype)
        ]
        if kinds:
            msg = (
                f"{name} builds, from the model config of {where}, a model its checkpoints do not fit: {_shown(kinds)}"
            )
            raise ModelConfigError(f"{msg}; record the config these checkpoints were written with (ckpt set-model)")
    wrong = [
        f"{key!r} of shape {list(tensor.shape)} (stored {list(stored[key])})"
        for key, tensor in tensors
        if key in stored and tuple(tensor.shape) != tuple(stored[key])
    ]
    if wrong:
        msg = (
            f"{name} builds, from the model config of {where}, a model its checkpoints do not fit: {_shown(wrong)}; "
            "record the config these checkpoints were written with (ckpt set-model)"
        )
        raise ModelConfigError(msg)
    own = {id(b): (key, b) for key, b in model.named_buffers(remove_duplicate=False) if key not in stored}
    total = sum(b.numel() * b.element_size() for _, b in own.values())
    if total > budget:
        largest = sorted(own.values(), key=lambda kb: -kb[1].numel() * kb[1].element_size())
        listed = [f"{key} {list(b.shape)} {_size(b.numel() * b.element_size())}" for key, b in largest]
        msg = (
            f"{name} builds, from the model config of {where}, buffers of {_size(total)} (more than the "
            f"{_size(budget)} its checkpoints' size allows): {_shown(listed)}; record the config these checkpoints "
            "were written with (ckpt set-model)"
        )
        raise ModelConfigError(msg)


def _called(factory: Callable[..., Any], config: Mapping[str, Any], name: str, where: str) -> Any:
    """``factory(**config)``, whatever it raises turned into one :class:`ModelConfigError` naming it."""
    try:
        return factory(**config)
    except ModelConfigError:
        raise
    except Exception as exc:  # a factory's failure on a store's config is bad input, CkptError or not
        msg = f"the model factory {name} failed on the model config of {where}: {type(exc).__name__}: {exc}"
        raise ModelConfigError(" ".join(msg.split())) from exc


def build_model(
    factory: Callable[..., Any],
    config: Mapping[str, Any],
    name: str,
    where: str,
    checkpoint: Mapping[str, tuple[tuple[int, ...], int]] | None = None,
    selection: TensorSelection | None = None,
) -> Any:
    """``factory(**config)``, once the config fits the factory's schema and, built on ``meta``, the checkpoint.

    Parameters
    ----------
    factory
        The imported (trusted) factory.
    config
        Its keyword arguments, as the store records them.
    name, where
        The factory's ``module:function`` name and the store, for messages.
    checkpoint
        Tensor name -> (shape, bytes) of one stored checkpoint, or (shape, bytes, logical dtype);
        None (a model built to be trained, not read from a store): only the schema is checked.
    selection
        The store's tensor selection (``ckpt import --tensors``): the checkpoint is that subset.

    Returns
    -------
    torch.nn.Module
        The factory's model.

    Raises
    ------
    ModelConfigError
        The config breaks the schema, describes another model or too many buffers, or the factory failed.
    """
    check_config(factory, config, name, where)
    if checkpoint is None:
        return _called(factory, config, name, where)
    return _built(factory, config, name, where, checkpoint, selection, for_real=True)


def check_model(
    factory: Callable[..., Any],
    config: Mapping[str, Any],
    name: str,
    where: str,
    checkpoint: Mapping[str, tuple[tuple[int, ...], int]],
    selection: TensorSelection | None = None,
) -> bool:
    """Steps 1-3 of :func:`build_model`, allocating nothing: whether the model could be checked on ``meta``.

    ``ckpt verify`` checks a store's model spec this way. A factory whose code cannot run on
    ``meta`` returns False (checking it would mean building it). For a store with a tensor
    ``selection``, only the stored tensors are compared.

    Raises
    ------
    ModelConfigError
        As :func:`build_model`.
    """
    return model_on_meta(factory, config, name, where, checkpoint, selection) is not None


def model_on_meta(
    factory: Callable[..., Any],
    config: Mapping[str, Any],
    name: str,
    where: str,
    checkpoint: Mapping[str, tuple[tuple[int, ...], int]],
    selection: TensorSelection | None = None,
) -> Any:
    """The model :func:`check_model` checks, on ``meta``: its modules, names, shapes and dtypes, no values.

    None when the factory's code cannot run on ``meta``. For code that looks the model's structure
    up (which module is the embedding), on a store with a tensor ``selection`` too: nothing on
    ``meta`` can be evaluated, so a subset's missing weights cannot stand in silently.

    Raises
    ------
    ModelConfigError
        As :func:`check_model`.
    """
    check_config(factory, config, name, where)
    return _built(factory, config, name, where, checkpoint, selection, for_real=False)


def _built(
    factory: Callable[..., Any],
    config: Mapping[str, Any],
    name: str,
    where: str,
    checkpoint: Mapping[str, tuple[Any, ...]],
    selection: TensorSelection | None,
    *,
    for_real: bool,
) -> Any:
    import torch

    shapes = {key: tuple(entry[0]) for key, entry in checkpoint.items()}
    dtypes = {key: str(entry[2]) for key, entry in checkpoint.items() if len(entry) > 2}
    stored_elements = sum(math.prod(shape) for shape in shapes.values())
    stored_bytes = sum(int(entry[1]) for entry in checkpoint.values())
    if selection is not None:  # a subset: the model may be as large as the checkpoint it was taken from
        stored_elements = max(stored_elements, selection.elements or 0)
        stored_bytes = max(stored_bytes, selection.nbytes or 0)
    budget = buffer_budget(stored_bytes)
    limit = 2 * stored_elements + PARAMETER_SLACK

    def describe(what: str) -> str:
        return (
            f"{name} builds, from the model config of {where}, {what}; record the config these checkpoints were "
            "written with (ckpt set-model)"
        )

    def counted_build(counter: _Counter, device: str | None) -> Any:
        with _counted(counter), torch.device(device) if device else contextlib.nullcontext():
            return _called(factory, config, name, where)

    counter = _Counter(limit, budget, describe)
    try:
        on_meta = counted_build(counter, "meta")
    except ModelConfigError as exc:
        if counter.exceeded or exc.__cause__ is None:  # a limit, or the factory refusing its config
            raise
        on_meta = None  # code that cannot run on meta: built for real, counted, then compared
    if on_meta is not None:
        compare(on_meta, shapes, budget, name, where, selection, whole=for_real, dtypes=dtypes)
        if not for_real:
            return on_meta
        del on_meta
    if not for_real:
        return None
    model = counted_build(_Counter(limit, budget, describe), None)
    compare(model, shapes, budget, name, where, selection, whole=for_real, dtypes=dtypes)
    return model

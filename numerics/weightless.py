"""A worker's model built without weights: the checkpoints supply every parameter.

A worker evaluates its model functionally (``functional_call`` with a checkpoint's
tensors), so the module's own parameters are never read. Building the module the
usual way still allocated and randomly initialised all of them first: at GPT-2 small,
124M random numbers drawn per thread and dtype, 7.7 of grad-norms' thread-seconds in
``GPT2LMHeadModel.__init__`` and ``post_init`` (py-spy, bench/scale.py's L run).

:func:`weightless_model` builds the module with its parameters on torch's ``meta``
device (shape and dtype, no memory; initialisers on them do nothing) while its
buffers are built as usual: a buffer the checkpoints lack (a causal mask, rotary
frequencies) is computed by the model's own code and must stay real. This is the
technique of accelerate's ``init_empty_weights`` (``include_buffers=False``), which
ckpt does not depend on. Each parameter then becomes a memoryless stand-in of its
shape on the device; a parameter no checkpoint tensor names is an error, where the
module's random values used to stand in for it silently.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ckpt.errors import AnalysisError
from ckpt.store.model_build import unstored_parameters
from ckpt.store.selection import TensorSelection, missing_message

__all__ = ["built_on_meta", "unstored_parameters", "weightless_model"]

_building = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_original_register: Callable[..., Any] | None = None


def _register_on_meta(module: Any, name: str, param: Any) -> None:
    """``Module.register_parameter``, moving a plain parameter to ``meta`` in a thread that builds weightless."""
    import torch

    if (
        getattr(_building, "active", False)
        and type(param) is torch.nn.Parameter  # subclasses (lazy, quantized) are left as they are
        and param.device.type != "meta"
    ):
        param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    assert _original_register is not None
    _original_register(module, name, param)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters registered by this thread go to ``meta`` while it runs; other threads are untouched.

    ``Module.register_parameter`` is replaced on the class while any thread is inside (counted), and
    the replacement acts only for the threads that are.
    """
    import torch

    global _patch_users, _original_register
    with _patch_lock:
        if _patch_users == 0:
            _original_register = torch.nn.Module.register_parameter
            # replaced on the class on purpose (see above): mypy rightly refuses it elsewhere
            torch.nn.Module.register_parameter = _register_on_meta  # type: ignore[method-assign, assignment]
        _patch_users += 1
    outer = getattr(_building, "active", False)  # a factory may itself build through here
    _building.active = True
    try:
        yield
    finally:
        _building.active = outer
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                torch.nn.Module.register_parameter = _original_register  # type: ignore[method-assign, assignment]
                _original_register = None


def built_on_meta(build: Callable[[], Any]) -> Any:
    """``build()``'s module with its parameters on ``meta`` (names, shapes, dtypes, ``requires_grad``; no values).

    For code that reads a model's structure, not its weights (:func:`ckpt.plugins.parameter_space`).
    """
    with _parameters_on_meta():
        return build()


def weightless_model(
    build: Callable[[], Any],
    stored: set[str],
    device: str,
    dtype: Any = None,
    source: str = "",
    selection: TensorSelection | None = None,
) -> Any:
    """``build()``'s module with every parameter a memoryless stand-in of its shape on ``device``.

    The stand-ins (a single zero, expanded) are made in ``dtype`` for floating-point
    parameters (when given), so that moving the module copies nothing: ``.to`` would turn
    an expanded tensor into a full one. Tied parameters (a language model's head and
    embedding) get one stand-in, so that ``functional_call`` keeps them tied. Writing into
    a stand-in (``load_state_dict``) fails loudly.

    Parameters
    ----------
    build
        Builds the module (the store's model spec).
    stored
        The tensor names the checkpoints hold.
    device, dtype
        Where the stand-ins live, and the floating-point dtype to give them (None: the parameter's).
    source
        The store, named in the error.
    selection
        The store's tensor selection (``ckpt import --tensors``), which the error then names.

    Raises
    ------
    AnalysisError
        When a parameter of the module is not among the checkpoints' tensors: no value for it exists.
    """
    import torch

    model = built_on_meta(build)  # a store's ModelSpec.build has compared it with the checkpoints already
    missing = unstored_parameters(model, stored)
    if missing:
        shown = ", ".join(repr(name) for name in missing[:5]) + (
            f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        )
        raise AnalysisError(missing_message(len(missing), shown, source or "the store", selection))
    standins: dict[int, Any] = {}  # one stand-in per parameter object: tied parameters stay tied
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is None:
                continue
            if id(parameter) not in standins:
                kind = dtype if dtype is not None and parameter.is_floating_point() else parameter.dtype
                empty = torch.zeros((), dtype=kind, device=device).expand(parameter.shape)
                standins[id(parameter)] = torch.nn.Parameter(empty, requires_grad=parameter.requires_grad)
            module._parameters[name] = standins[id(parameter)]
    return model

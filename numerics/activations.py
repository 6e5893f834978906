"""Activation capture for analyzers: the outputs (or inputs) of chosen modules, chunk by chunk.

An analyzer of activations (sparsity, probes, clustering of hidden states)
needs the values that named submodules of the model produce on a data split at
a checkpoint. This module gives them without keeping the whole split's
activations or any autograd graph:

- :func:`select_modules` picks modules by name or glob (``fnmatch`` on the
  names of ``model.named_modules()``, e.g. ``blocks.*.mlp.act``), and by
  default the activation-function modules (:func:`activation_modules`:
  instances of the classes of :data:`ACTIVATION_TYPE_NAMES` such as ``nn.GELU`` or ``nn.ReLU``).
- :func:`capture` runs one forward pass with hooks on those modules and returns
  copies of what they received and produced; the hooks are removed afterwards,
  also when the forward pass raises.
- :func:`iter_activations` does that for a checkpoint over a data split, in
  chunks of ``batch_size`` examples, under ``torch.no_grad``, with the
  checkpoint's tensors swapped in by ``torch.func.functional_call``. Reduce each
  chunk (count, sum, histogram) before asking for the next one.

Only *modules* can be captured: a model that calls ``torch.nn.functional.gelu``
(or ``torch.relu``, ``x.tanh()``) directly has no module whose output is that
activation. Capture the input of the module that consumes it instead (e.g.
``--modules mlp.fc2`` with inputs), or wrap the function in a module
(``nn.GELU()``) in the model's code.

Example, on a Dask worker::

    from ckpt.numerics.activations import iter_activations, select_modules

    names = select_modules(worker.model, "blocks.*.mlp.act")
    for batch in iter_activations(worker, step, names, split="eval", batch_size=512):
        for name in names:
            for values in batch.outputs[name]:  # one tensor per call of the module
                ...
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ckpt.errors import AnalysisError

ACTIVATION_TYPE_NAMES: tuple[str, ...] = (
    "ReLU",
    "ReLU6",
    "LeakyReLU",
    "PReLU",
    "RReLU",
    "ELU",
    "SELU",
    "CELU",
    "GELU",
    "SiLU",
    "Mish",
    "Tanh",
    "Sigmoid",
    "Hardtanh",
    "Hardswish",
    "Hardsigmoid",
    "Softplus",
    "Softsign",
    "Softshrink",
    "Hardshrink",
    "Tanhshrink",
    "LogSigmoid",
    "Threshold",
    "GLU",
)
"""Names of the ``torch.nn`` classes counted as activation functions (elementwise nonlinearities;
``Softmax`` and attention modules are not). Parameterless modules whose class name ends in
``Activation`` count too (Hugging Face's ``NewGELUActivation`` and friends)."""


def activation_types() -> tuple[type, ...]:
    """The ``torch.nn`` activation-function classes of :data:`ACTIVATION_TYPE_NAMES` (imports torch)."""
    from torch import nn

    return tuple(getattr(nn, name) for name in ACTIVATION_TYPE_NAMES if hasattr(nn, name))


def module_names(model: Any) -> list[str]:
    """Names of every submodule of ``model`` (``named_modules`` order, without the root ``""``)."""
    return [name for name, _ in model.named_modules() if name]


def activation_modules(model: Any) -> list[str]:
    """Names of the submodules of ``model`` that are activation functions (``nn.GELU``, ``nn.ReLU``, ...).

    Parameters
    ----------
    model
        A ``torch.nn.Module``.

    Returns
    -------
    list of str
        In ``named_modules`` order; empty when the model applies its
        nonlinearities as functions (``torch.nn.functional.gelu``), which no
        hook can see.
    """
    types = activation_types()
    return [
        name
        for name, module in model.named_modules()
        if name and (isinstance(module, types) or _library_activation(module))
    ]


def _library_activation(module: Any) -> bool:
    """A parameterless module whose class says it is an activation function (``*Activation``).

    Hugging Face models wrap their nonlinearities in such classes (GPT-2's ``NewGELUActivation``
    as ``mlp.act``, ``GELUActivation``, ``SiLUActivation``) instead of ``torch.nn``'s.
    """
    return type(module).__name__.endswith("Activation") and not any(True for _ in module.parameters())


def parse_globs(patterns: str | Sequence[str] | None) -> list[str]:
    """``"a,b.*"`` or ``["a", "b.*"]`` -> ``["a", "b.*"]`` (blank entries dropped)."""
    if patterns is None:
        return []
    items = patterns.split(",") if isinstance(patterns, str) else list(patterns)
    return [item.strip() for item in items if item.strip()]


def _listing(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit]) or "(none)"
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def select_modules(model: Any, patterns: str | Sequence[str] | None = None) -> list[str]:
    """Names of the modules of ``model`` matched by ``patterns``, default its activation modules.

    Parameters
    ----------
    model
        A ``torch.nn.Module``.
    patterns
        Module names or ``fnmatch`` globs, as a comma-separated string or a
        sequence (``"blocks.*.act,head"``). ``None`` or empty: the
        activation-function modules (:func:`activation_modules`).

    Returns
    -------
    list of str
        Matched names, in ``named_modules`` order, each once.

    Raises
    ------
    AnalysisError
        When a pattern matches no module, or (without patterns) when the model
        has no activation-function module; the message lists the model's modules.
    """
    names = module_names(model)
    globs = parse_globs(patterns)
    if not globs:
        found = activation_modules(model)
        if not found:
            msg = (
                f"the model ({type(model).__name__}) has no activation-function modules (nn.GELU, nn.ReLU, ...): "
                "it calls them as functions, which cannot be captured; pass --modules GLOB[,GLOB] naming modules "
                f"to capture (its modules: {_listing(names)})"
            )
            raise AnalysisError(msg)
        return found
    for glob in globs:
        if not any(fnmatch.fnmatchcase(name, glob) for name in names):
            msg = f"--modules pattern {glob!r} matches no module of the model; its modules: {_listing(names)}"
            raise AnalysisError(msg)
    return [name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in globs)]


@dataclass
class Activations:
    """What the captured modules received and produced during one forward pass.

    Attributes
    ----------
    examples
        The examples of the split this forward pass covered.
    outputs
        ``{module name: [tensor per call]}``: copies of each module's output
        (the first tensor of a tuple output), one per call in the forward pass
        (usually one; a module applied twice gives two); empty lists when not requested.
    inputs
        The same for each module's first positional input, taken *before* the
        module runs (so ``inplace=True`` activations do not overwrite it).
    """

    examples: slice = field(default_factory=lambda: slice(0, 0))
    outputs: dict[str, list[Any]] = field(default_factory=dict)
    inputs: dict[str, list[Any]] = field(default_factory=dict)


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def capture(
    model: Any,
    names: Sequence[str],
    forward: Callable[[], Any],
    *,
    outputs: bool = True,
    inputs: bool = False,
) -> tuple[Any, Activations]:
    """Run ``forward()`` with hooks copying the outputs (and inputs) of the modules ``names``.

    Parameters
    ----------
    model
        The ``torch.nn.Module`` whose submodules are hooked (the one ``forward`` runs).
    names
        Submodule names (see :func:`select_modules`).
    forward
        Runs the forward pass, e.g. ``lambda: functional_call(model, params, (x,))``.
    outputs, inputs
        What to capture.

    Returns
    -------
    tuple
        ``forward()``'s result and the :class:`Activations` (its ``examples`` unset).

    Raises
    ------
    AnalysisError
        When a module's output (or first input) is not a tensor.

    Notes
    -----
    The hooks copy (``detach().clone()``) what they see, so later in-place
    operations cannot change it; they are removed before this returns or
    raises. Autograd is whatever the caller set (wrap in ``torch.no_grad()``
    to keep no graph).
    """
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        msg = f"the model has no module {missing[0]!r}; its modules: {_listing(module_names(model))}"
        raise AnalysisError(msg)
    found = Activations(outputs={name: [] for name in names}, inputs={name: [] for name in names})

    def output_hook(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            found.outputs[name].append(_copied(output, name, f"returned {type(output).__name__}, not a tensor"))

        return hook

    def input_hook(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            found.inputs[name].append(_copied(args, name, "has no tensor as its first positional input"))

        return hook

    handles = []
    try:
        for name in names:
            if outputs:
                handles.append(modules[name].register_forward_hook(output_hook(name)))
            if inputs:
                handles.append(modules[name].register_forward_pre_hook(input_hook(name)))
        result = forward()
    finally:
        for handle in handles:
            handle.remove()
    return result, found


def _copied(seen: Any, name: str, problem: str) -> Any:
    """A copy of the first tensor module ``name`` was seen with, so that later in-place operations cannot change it."""
    tensor = _first_tensor(seen)
    if tensor is None:
        msg = f"module {name!r} {problem}; capture another module"
        raise AnalysisError(msg)
    return tensor.detach().clone()


def iter_activations(
    worker: Any,
    step: int,
    names: Sequence[str],
    *,
    split: str,
    examples: slice | None = None,
    batch_size: int = 1024,
    outputs: bool = True,
    inputs: bool = False,
    dtype: Any = None,
) -> Iterator[Activations]:
    """The activations of modules ``names`` at ``step`` over ``split``, one chunk of examples at a time.

    Parameters
    ----------
    worker
        The :class:`ckpt.plugins.Worker` of the task (its model, data and checkpoint tensors).
    step
        The checkpoint.
    names
        Module names (see :func:`select_modules`).
    split
        Data split whose ``inputs`` are fed to the model.
    examples
        The examples to cover (default: all of the split).
    batch_size
        Examples per forward pass: bounds the memory of one chunk.
    outputs, inputs
        Capture the modules' outputs, their first inputs, or both.
    dtype
        Torch dtype to run the model in (default: the checkpoint's).

    Yields
    ------
    Activations
        Per chunk, with ``examples`` set to the chunk's slice of the split.

    Notes
    -----
    Runs under ``torch.no_grad`` with the model in eval mode; hooks exist only
    during each chunk's forward pass (never while the caller holds a chunk), so
    an exception anywhere leaves the model unhooked.
    """
    import torch
    from torch.func import functional_call

    if batch_size < 1:
        msg = f"batch_size must be at least 1, got {batch_size}"
        raise AnalysisError(msg)
    model = worker.model_for(dtype)
    params = worker.params(step)
    if dtype is not None:
        params = {k: v.to(dtype) if v.is_floating_point() else v for k, v in params.items()}
    data = worker.data(split)["inputs"]
    start, stop, _ = (examples or slice(0, len(data))).indices(len(data))
    for begin in range(start, stop, batch_size):
        rows = slice(begin, min(begin + batch_size, stop))
        chunk = data[rows]
        if dtype is not None and chunk.is_floating_point():
            chunk = chunk.to(dtype)
        with torch.no_grad():
            _, found = capture(
                model,
                names,
                partial(functional_call, model, params, (chunk,)),
                outputs=outputs,
                inputs=inputs,
            )
        found.examples = rows
        yield found


__all__ = [
    "ACTIVATION_TYPE_NAMES",
    "Activations",
    "activation_modules",
    "activation_types",
    "capture",
    "iter_activations",
    "module_names",
    "parse_globs",
    "select_modules",
]

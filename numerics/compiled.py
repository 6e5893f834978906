"""Directional derivatives, eagerly or as one compiled program per shape (POLCA's ``--compile``).

:func:`directional_derivatives` lives here, above :mod:`ckpt.numerics.derivatives`,
so that the two modules import each other in one direction only.

:func:`ckpt.numerics.compiled.directional_derivatives` runs a nested JVP under
``torch.func.vmap`` eagerly: every aten op passes through the vmap and
forward-AD interpreters, and forward over forward computes the first-order
tangents twice (once as the inner JVP's tangent, once as the outer JVP's
tangent of the primal). Here the same function is traced once per shape into
an aten graph (``make_fx``), its duplicated subexpressions are merged (fx's
CSE pass) and the graph is compiled by ``torch.compile`` (inductor), which
fuses the elementwise tangent arithmetic. The program takes the parameters,
the directions and the block's data as inputs, so one program serves every
block and checkpoint of those shapes (:func:`ckpt.plugins.chunks` makes the
blocks equal).

Compiled passes are the fastest, traced ones with CSE next, eager ones the
slowest (bench/polca.py); the compile itself costs far more than one block
(inductor's on-disk cache makes a second process's compile of the same program
cheaper), so it pays for runs of tens of checkpoints; see ``docs/analyzers.md``
("What it costs") and docs/performance.md ("Derivative passes").

Tracing runs the model's Python once and refuses to read a value out of a
traced tensor, so a model whose control flow depends on the values of its data
or weights (``if x.sum() > 0``) is not traced; it runs eagerly, with a warning.
The first two calls of every program (two blocks of data, or two checkpoints)
are checked against the eager computation too; a program that disagrees or
fails to compile is dropped the same way. The program runs no
forward-mode AD, so it takes no forward-AD lock: threads run programs at once.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ckpt.numerics._head import split_first_order
from ckpt.numerics.derivatives import BlockLoss, eager_directional_derivatives, forward_mode

# keyed by the model's id: each program holds its model, so the id stays its own
_PROGRAMS: dict[tuple, _Program] = {}
_PROGRAMS_LOCK = threading.Lock()

AGREEMENT = 1e-4
"""Largest difference from the eager result, relative to its largest magnitude, a program may show."""


def compiled_directional_derivatives(
    f: BlockLoss, primal: Mapping[str, Any], directions: Mapping[str, Any], order: int
) -> tuple[Any, Any, Any]:
    """:func:`ckpt.numerics.compiled.directional_derivatives` by the compiled program of these shapes."""
    key = (id(f.model), order, f.losses, _signature((primal, directions, f.batch)))
    with _PROGRAMS_LOCK:
        program = _PROGRAMS.get(key)
        if program is None:
            program = _PROGRAMS[key] = _Program(f, order)
    return program(primal, directions, f.batch)


def directional_derivatives(
    f: Callable[[Mapping[str, Any]], Any],
    primal: Mapping[str, Any],
    directions: Mapping[str, Any],
    *,
    order: int = 1,
    compiled: bool = False,
) -> tuple[Any, Any, Any]:
    """Per-datapoint loss and its first (and second) derivatives along K directions.

    Parameters
    ----------
    f
        ``f(params) -> [X]`` per-datapoint losses (see :func:`loss_function`).
    primal
        The point θ, ``{name: tensor}``.
    directions
        ``{name: [K, *shape]}``: K directions b.
    order
        1: ⟨∇ℓ(x), b⟩ only; 2: also bᵀ∇²ℓ(x)b (a nested JVP: forward over forward).
    compiled
        Run the pass as one program per shape, traced once and compiled with
        ``torch.compile`` (``f`` a :class:`BlockLoss`; see
        this module for what it costs and when it pays). First-order passes of a
        language model with a split head (:mod:`ckpt.numerics._head`) run the split
        eagerly instead.

    Returns
    -------
    tuple
        ``loss [X]``, ``first [K, X]``, ``second [K, X]`` (None for order 1).
    """
    if order == 1 and isinstance(f, BlockLoss):
        # a language model's head without its logits' tangents (ckpt.numerics._head), `compiled` or not:
        # the traced pass is the ordinary one, with the [vectors, tokens, V] tangents the split leaves
        # out (eagerly at GPT-2 small 131 MiB per example and vector against the split's 21 MiB), over
        # the memory plan, which measures the split; the split's cost is the head's matrix products,
        # which compiling does not fuse
        with forward_mode(composite=False, forward_only=True):
            split = split_first_order(f, primal, directions)
        if split is not None:
            return (*split, None)
    if compiled and isinstance(f, BlockLoss):
        return compiled_directional_derivatives(f, primal, directions, order)
    with forward_mode(composite=order == 2, forward_only=True):
        return eager_directional_derivatives(f, primal, directions, order)


def compile_seconds() -> float:
    """Seconds spent tracing and compiling programs in this process so far."""
    with _PROGRAMS_LOCK:
        return sum(program.seconds for program in _PROGRAMS.values())


def _signature(tree: Any) -> tuple:
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(tree)
    return (
        str(spec),
        tuple(
            (tuple(leaf.shape), leaf.dtype, str(leaf.device)) if isinstance(leaf, torch.Tensor) else leaf
            for leaf in leaves
        ),
    )


class _Program:
    """One shape's traced and compiled pass; eager when it cannot be trusted."""

    def __init__(self, f: BlockLoss, order: int) -> None:
        self.f, self.order = f, order
        self.compiled: Any = None
        self.eager = False
        self.seconds = 0.0
        self.checks_left = 1
        self._lock = threading.Lock()

    def run_eagerly(self, primal: Any, directions: Any, batch: Any) -> tuple[Any, Any, Any]:
        with forward_mode(composite=self.order == 2, forward_only=True):
            return _pass(self.f, self.order)(primal, directions, batch)

    def __call__(self, primal: Any, directions: Any, batch: Any) -> tuple[Any, Any, Any]:
        with self._lock:
            if self.compiled is None and not self.eager:
                return self._build(primal, directions, batch)
            compiled, check = self.compiled, self.checks_left > 0
            self.checks_left -= check
        if compiled is None:
            return self.run_eagerly(primal, directions, batch)
        got = compiled(primal, directions, batch)
        if check:  # the second call too: other data, or another checkpoint
            expected = self.run_eagerly(primal, directions, batch)
            problem = _disagreement(got, expected)
            if problem:
                with self._lock:
                    self._drop(problem)
                return expected
        return got

    def _drop(self, problem: str) -> None:
        """Run this shape eagerly from now on (the caller holds the lock)."""
        warnings.warn(f"--compile: the compiled JVP pass is not used, {problem}; running eagerly", stacklevel=5)
        self.eager, self.compiled = True, None

    def _build(self, primal: Any, directions: Any, batch: Any) -> tuple[Any, Any, Any]:
        """Trace, merge, compile and check against the eager pass; return the eager result."""
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.passes.dialect.common.cse_pass import CSEPass

        began = time.perf_counter()
        expected = self.run_eagerly(primal, directions, batch)

        problem, compiled = "", None
        try:
            with forward_mode(composite=self.order == 2, forward_only=True):  # tracing runs the JVPs
                traced = make_fx(_pass(self.f, self.order))(primal, directions, batch)
        except Exception as exc:  # control flow on data values, an op tracing cannot take: eager stands
            problem = f"the model cannot be traced ({_first_line(exc)})"
        if not problem:
            try:
                cse = CSEPass()(traced)
                assert cse is not None  # CSEPass.call returns a PassResult (the base class allows None)
                merged = cse.graph_module
                merged.graph._codegen = traced.graph._codegen  # the pytree calling convention of the trace
                merged.recompile()
                compiled = torch.compile(merged, dynamic=False)
                problem = _disagreement(compiled(primal, directions, batch), expected)
            except Exception as exc:  # any failure of the compiler: eager stands
                problem = f"it failed to compile ({_first_line(exc)})"
        self.seconds += time.perf_counter() - began
        if problem:
            self._drop(problem)
        else:
            self.compiled = compiled
        return expected


def _pass(f: BlockLoss, order: int) -> Any:
    """The pass as a function of (primal, directions, batch), to run or trace (in :func:`forward_mode`)."""

    def traced(primal: Any, directions: Any, batch: Any) -> tuple[Any, Any, Any]:
        def loss(trainable: Mapping[str, Any]) -> Any:
            return f.of(trainable, batch)

        return eager_directional_derivatives(loss, primal, directions, order)

    return traced


def _disagreement(got: tuple, expected: tuple) -> str:
    """Why ``got`` does not stand for ``expected`` (empty when it does)."""
    for name, a, b in zip(("loss", "first", "second"), got, expected, strict=True):
        if b is None:
            continue
        if a is None or a.shape != b.shape:
            return f"its {name} has shape {None if a is None else tuple(a.shape)}, not {tuple(b.shape)}"
        scale = float(b.abs().max()) if b.numel() else 0.0
        difference = float((a - b).abs().max()) if b.numel() else 0.0
        if not difference <= AGREEMENT * max(scale, 1e-30):
            return f"its {name} differs from the eager pass by {difference:.3g} (largest value {scale:.3g})"
    return ""


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


__all__ = [
    "AGREEMENT",
    "compile_seconds",
    "compiled_directional_derivatives",
    "directional_derivatives",
]

"""How POLCA's forward-mode passes fit the memory budget: their measured cost and their plan.

:class:`PassCost` is a pass's peak bytes as a line in its examples and vectors, fitted to
small passes measured on the worker (:func:`measure_passes`); :func:`plan_passes` and
:func:`plan_basis` choose the examples and basis vectors per pass, and whether the whole
basis is held, from it and the budget, or name the knob to turn. Used by
:mod:`ckpt.analyzers.polca` (and ``lca``'s passes through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckpt.engine.memory import format_size
from ckpt.errors import AnalysisError
from ckpt.numerics.compiled import directional_derivatives
from ckpt.numerics.footprint import peak_bytes
from ckpt.plugins import Worker


@dataclass(frozen=True)
class PassCost:
    """Peak bytes of one forward-mode pass over b examples along k basis vectors: a + b·p + k·w + b·k·q.

    Every tensor of the pass is either the primal's (one per example) or a
    tangent's (one per example and vector), or belongs to the weights' tangents
    (one per vector); fitted to passes measured by :func:`ckpt.numerics.footprint.peak_bytes`
    at 2 and 3 examples and 1 and 2 vectors. Exact to the MiB at GPT-2 small from 1 to
    16 examples along 1 to 4 vectors (first order), and exact from 2 examples on at S; a
    nested (second-order) pass over one example is cheaper than the line says (0.76 of it
    on a tiny GPT-2). What made it linear: embedding lookups are row gathers in these
    passes (see ``ckpt.numerics.norms._gathered_embedding``); the copy of the whole
    table's directions that the embedding's batching rule made was a block that hid the
    body's growth from the four small passes (the fit missed the real peak at GPT-2 small both ways).
    """

    constant: float
    per_example: float
    per_vector: float
    per_example_vector: float

    def __call__(self, examples: int, vectors: int) -> float:
        """Bytes of a pass over ``examples`` examples along ``vectors`` vectors."""
        return (
            self.constant
            + examples * self.per_example
            + vectors * self.per_vector
            + examples * vectors * self.per_example_vector
        )

    @classmethod
    def fit(cls, measured: dict[tuple[int, int], int]) -> PassCost:
        """The cost through ``{(examples, vectors): peak bytes}`` at one or two of each (a flat line where one)."""

        def line(points: list[tuple[int, float]]) -> tuple[float, float]:
            (x0, y0), (x1, y1) = points[0], points[-1]
            slope = max((y1 - y0) / (x1 - x0), 0.0) if x1 != x0 else 0.0
            return y1 - slope * x1, slope

        examples = sorted({b for b, _ in measured})
        vectors = sorted({k for _, k in measured})
        # per vector count: a line in the examples; then the intercepts and slopes as lines in the vectors
        lines = {k: line([(b, measured[b, k]) for b in examples]) for k in vectors}
        constant, per_vector = line([(k, lines[k][0]) for k in vectors])
        per_example, per_example_vector = line([(k, lines[k][1]) for k in vectors])
        return cls(max(constant, 0.0), per_example, per_vector, per_example_vector)


@dataclass(frozen=True)
class PassPlan:
    """How one checkpoint's forward-mode passes fit the memory budget (:func:`plan_passes`)."""

    block_examples: int
    """Examples per pass (at most ``--batch-size``)."""
    vectors: int
    """Basis vectors per vectorized pass (at most ``--basis-batch``)."""
    estimate: int
    """Bytes the plan is expected to peak at."""
    basis_held: bool = True
    """The whole basis is held (read once per worker); else each pass's vectors are read for it (:func:`plan_basis`)."""


PASS_PEAK = 1.25
"""Measured pass bytes (tensors, op by op) to what the process holds: ops' workspaces and the allocator."""
CPU_TOKEN_VECTORS = 2048
"""Most tokens × vectors a forward-mode pass of a language model holds on the CPU (a preference below the budget).

Why: a pass's tangents are [vectors, tokens, width] tensors, and on the CPU those larger than glibc's
largest mmap threshold (32 MiB) are mapped afresh and zeroed page by page each time: a pass over 32
sequences of 128 tokens spent half its time in the kernel. Passes of 2,048 tokens × vectors (4 sequences
along 4 vectors) were the fastest or close to it at every GPT-2 size of bench/scale.py, first and second
order (docs/performance.md, "POLCA passes")."""
PREFERRED_EXAMPLES = 8
"""Examples per pass below which fewer vectors per pass are chosen first: every vector pass repeats the
primal, but a pass over very few examples (a single row each, for a per-example model) runs at a
fraction of the speed of a batched one."""


def plan_passes(
    budget: int,
    fixed: int,
    cost: PassCost,
    *,
    examples: int,
    vectors: int,
    batch_size: int,
    basis_batch: int,
    analyzer: str = "polca",
    fewer_vectors: str = "use fewer basis vectors",
    tokens: int = 0,
) -> PassPlan:
    """Fit a checkpoint's passes into ``budget`` bytes, or say which knob to turn.

    As many vectors per pass as ``--basis-batch`` allows while a pass still
    takes :data:`PREFERRED_EXAMPLES` examples (or all of them, or
    ``--batch-size``), with as many examples as fit; else the pair of the two
    that covers the most example-vectors per pass.

    Parameters
    ----------
    budget
        Bytes the task may use (``--max-memory`` shared by parallel tasks).
    fixed
        Bytes held outside the passes: the checkpoint's tensors and the basis.
    cost
        Bytes of one pass (:class:`PassCost`), before the :data:`PASS_PEAK` margin.
    examples, vectors
        Examples of the task and basis vectors K.
    batch_size, basis_batch
        The user's upper bounds (``--batch-size``, ``--basis-batch``).
    analyzer, fewer_vectors
        The analyzer the error names, and how its user asks for fewer vectors.
    tokens
        Tokens per example of a language model's passes on the CPU: each pass then holds at most
        :data:`CPU_TOKEN_VECTORS` tokens × vectors (at least one example). 0: no such bound.

    Raises
    ------
    AnalysisError
        When even one example along one vector does not fit.
    """
    room = (budget - fixed) / PASS_PEAK
    most = min(batch_size, examples)

    def block(k: int) -> int:
        """Most examples (at most ``most``) whose pass along ``k`` vectors fits in the room."""
        per_example = cost.per_example + k * cost.per_example_vector
        left = room - cost.constant - k * cost.per_vector
        if left < per_example:
            return 0
        fits = most if per_example <= 0 else int(min(most, left // per_example))
        return min(fits, token_bound(k))

    def token_bound(k: int) -> int:
        return max(1, CPU_TOKEN_VECTORS // (k * tokens)) if tokens else most

    options = [(k, block(k)) for k in range(min(basis_batch, vectors), 0, -1)]
    # the token bound is a preference too: a pass that reaches it is as fast as a larger one would be
    preferred = [(k, b) for k, b in options if b >= min(most, PREFERRED_EXAMPLES, token_bound(k))]
    fitting = [(k, b) for k, b in options if b >= 1]
    if preferred or fitting:
        k, b = preferred[0] if preferred else max(fitting, key=lambda option: option[0] * option[1])
        return PassPlan(b, k, int(fixed + PASS_PEAK * cost(b, k)))
    need = fixed + PASS_PEAK * cost(1, 1)
    msg = (
        f"{analyzer} needs at least {format_size(need)} per task ({format_size(fixed)} held beside its passes: "
        f"checkpoints and {vectors} directions; a forward-mode pass over one example along one direction "
        f"{format_size(PASS_PEAK * cost(1, 1))}); the memory budget is {format_size(budget)}: "
        f"raise --max-memory, or {fewer_vectors}"
    )
    raise AnalysisError(msg)


def plan_basis(
    budget: int,
    checkpoints: int,
    cost: PassCost,
    *,
    direction_bytes: int,
    examples: int,
    vectors: int,
    batch_size: int,
    basis_batch: int,
    tokens: int = 0,
) -> PassPlan:
    """Fit a checkpoint's passes with the whole basis held, or with each pass's vectors read when it needs them.

    The whole basis (K·D·s, read once per worker and kept for every checkpoint) while holding it
    leaves passes as large as reading would: a basis read a pass of vectors at a time costs a read
    of K·D·s per checkpoint (every chunk decompressed and checked), small beside a checkpoint's
    passes at GPT-2 small (docs/performance.md, "POLCA passes"). Read,
    only one pass's vectors (v·D·s) are held beside it, so the basis no longer bounds the passes:
    at GPT-2 small 20 vectors are 9.2 GiB, most of the default budget.

    Parameters
    ----------
    budget, cost, examples, vectors, batch_size, basis_batch, tokens
        As for :func:`plan_passes`.
    checkpoints
        Bytes held outside the passes and the basis: the checkpoint's tensors.
    direction_bytes
        Bytes of one basis vector in ``--dtype`` (D·s).

    Raises
    ------
    AnalysisError
        When even one example along one vector read for it does not fit.
    """
    sizes = {"examples": examples, "vectors": vectors, "batch_size": batch_size, "basis_batch": basis_batch}
    # read for its pass, each vector of a pass is held with it: v·D·s more a pass (the cost is scaled by PASS_PEAK)
    with_directions = PassCost(
        cost.constant, cost.per_example, cost.per_vector + direction_bytes / PASS_PEAK, cost.per_example_vector
    )
    try:
        read = plan_passes(budget, checkpoints, with_directions, **sizes, tokens=tokens)
    except AnalysisError:
        one = PASS_PEAK * with_directions(1, 1)
        msg = (
            f"polca needs at least {format_size(checkpoints + one)} per task ({format_size(checkpoints)} for the "
            f"checkpoints; a forward-mode pass over one example along one basis vector, with that vector, "
            f"{format_size(one)}); the memory budget is {format_size(budget)}: raise --max-memory"
        )
        raise AnalysisError(msg) from None
    try:
        held = plan_passes(budget, checkpoints + vectors * direction_bytes, cost, **sizes, tokens=tokens)
    except AnalysisError:
        return replace(read, basis_held=False)
    if held.block_examples * held.vectors >= read.block_examples * read.vectors:
        return held
    return replace(read, basis_held=False)


def measure_passes(
    f_of: Callable[[slice], Any], examples: int, primal: Mapping[str, Any], directions: Mapping[str, Any], order: int
) -> PassCost:
    """The :class:`PassCost` of this model and data, from passes over 2 and 3 examples along 1 and 2 vectors.

    ``f_of(rows)`` is the loss function of the examples ``rows`` (a slice of the ``examples`` there are);
    with fewer examples or vectors, those there are.
    """
    count = next(iter(directions.values())).shape[0]
    measured = {}
    for b in sorted({min(2, examples), min(3, examples)}):
        f = f_of(slice(0, b))
        for k in sorted({1, min(2, count)}):
            part = {name: tensor[:k] for name, tensor in directions.items()}
            measured[b, k] = peak_bytes(lambda f=f, part=part: directional_derivatives(f, primal, part, order=order))
    return PassCost.fit(measured)


def cpu_tokens(worker: Worker, split: str, objective: str | None) -> int:
    """Tokens per example when the passes are a language model's on the CPU (:data:`CPU_TOKEN_VECTORS`), else 0."""
    inputs = worker.data(split)["inputs"]
    language = worker.objective(objective).token_rows is not None and inputs.ndim == 2
    return int(inputs.shape[1]) if language and str(worker.device) == "cpu" else 0

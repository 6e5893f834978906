"""How a ``hessian-basis`` search fits the memory budget: its plan, and whether the whole run fits.

:func:`plan_search` sizes one basis checkpoint's search (kept or rebuilt gradient graphs,
Lanczos vectors in memory or spilled, the earlier basis held or read from the journal);
:func:`check_the_run_fits` stops a run before its first search when a later basis
checkpoint, or the end of the run, could not fit. Used by :mod:`ckpt.analyzers.hessian_basis`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ckpt.engine.memory import format_size
from ckpt.errors import AnalysisError
from ckpt.numerics.lanczos_sizes import DOT_BLOCK_BYTES, MIN_VECTORS_BEYOND_K, lanczos_bytes, product_limit


@dataclass(frozen=True)
class SearchPlan:
    """How one basis checkpoint's search fits the memory budget (:func:`plan_search`)."""

    keep_graphs: bool
    """Keep every block's gradient graph for all products (fast) or rebuild one block per product."""
    block_examples: int
    """Examples per data block."""
    vectors: int
    """Lanczos vectors kept at once (fewer than the search may need: thick restarts)."""
    estimate: int
    """Bytes the plan is expected to peak at."""
    spill: bool = False
    """Lanczos vectors kept in a temporary file rather than memory (:class:`ckpt.numerics.lanczos.SpilledRows`)."""
    kept_examples: int = 0
    """Without ``keep_graphs``: the first this many examples still keep their graphs (in blocks of the batch
    size), and only the rest are rebuilt per product, in blocks of ``block_examples``."""
    spill_basis: bool = False
    """The earlier basis vectors are read from a temporary file at every projection, not held in memory."""

    def describe(self) -> str:
        """How the graphs are held, for a progress bar."""
        if self.keep_graphs:
            return "kept graphs"
        if self.kept_examples:
            rebuilt = f"the rest rebuilt per product in blocks of {self.block_examples}"
            return f"graphs of {self.kept_examples} examples kept, {rebuilt}"
        return f"graphs rebuilt per product, blocks of {self.block_examples}"


PREFERRED_EXTRA_VECTORS = 8
"""Room beyond k that keeps thick restarts cheap. Products at tol 1e-6, unbounded against bounded: top-1 of
a 1.7M-parameter GPT-2 35 against 39 with 9 vectors, 43 with 7, 56 with 5; top-4 of the bench model 49
against 51 with 24 vectors and 58 with 12 (bench/lanczos.py). Spilled vectors cost disk, not memory, but more
of them is not faster either: GPT-2 small's first basis checkpoint (--samples 8 --tol 1e-2) took 16 products
with 9 spilled vectors or with 25, and more vector work per product with 25 (no restart, but its passes over
all kept vectors read more of them; docs/performance.md, "Hessian basis")."""
GRAPH_PEAK = 2.3
"""A product differentiates the kept graphs again, and its backward pass holds about as much again: the
ratio of what a product holds to the graphs' bytes (:func:`ckpt.numerics.derivatives.graph_bytes`), measured at GPT-2
small, --samples 8 (docs/performance.md, "Hessian basis")."""
REBUILT_PEAK = 2.3
"""A rebuilt block holds its graph and the product's backward buffers at once (the same measurement)."""
GRAPH_AT_REST = 1.35
"""Kept graphs between their products, from the same measurement: what the process holds once they are
built, less the model, weights and vectors, to the graphs' bytes. What they hold while a product rebuilds
the blocks that did not fit."""
BASIS_BLOCK_BYTES = DOT_BLOCK_BYTES
"""What an earlier basis spilled to a file holds in memory: one block of its columns as read, at most one
block of float64 scratch (:class:`ckpt.numerics.lanczos.SpilledRows`)."""
FIXED_VECTORS = 2
"""Vectors of D held beside the search: the checkpoint's tensors (cached by the worker; θ's leaves share
them) and the product being made, tensor by tensor. Its flat copy and the residual copied from it are
the search's (:func:`ckpt.numerics.lanczos.lanczos_bytes`). This counted them too (5 vectors) until the result's
tensors stopped copying each basis checkpoint's vectors: the extra vectors at GPT-2 small hid that
uncounted copy, which outgrew them from the third basis checkpoint on; counted once, bench/scale.py's L run
stays within its plan (docs/performance.md, "Hessian basis"). It was 3 while the worker also kept the
previous basis checkpoint's tensors, which no search reads (:meth:`ckpt.plugins.Worker.params` with
``alone``): at GPT-2 small that vector made the later basis checkpoints of bench/scale.py's L run rebuild
graphs per product."""


def plan_search(
    budget: int,
    dimension: int,
    k: int,
    earlier: int,
    examples: int,
    batch_size: int,
    graph: tuple[float, float],
    itemsize: int,
    limit: int,
    *,
    can_spill: bool = True,
    can_spill_basis: bool = False,
) -> SearchPlan:
    """Fit one basis checkpoint's search into ``budget`` bytes, or say which knob to turn.

    In order of speed: kept graphs with the Lanczos vectors in memory (as many as fit; fewer
    vectors cost more products, in thick restarts, so on the CPU at least k + 8, and on a GPU,
    which cannot spill, at least k + 4); kept graphs with the vectors spilled to
    a temporary file (a product reads them back from the page cache, cheaper than rebuilding a block's
    graph, a forward and a backward pass more per product); with the vectors spilled, the
    graphs of as many examples as fit kept and the rest rebuilt per product; then blocks rebuilt
    per product, as large as fit, with the vectors in memory (as many as above), then spilled.

    Why the third: each basis checkpoint adds its vectors to what the search holds, so a budget
    that keeps every graph at the first checkpoints stops doing so at a later one, by a few
    vectors of D. At GPT-2 small (``--samples 8``, the default budget of a modest machine) the third
    and fourth checkpoints fell to rebuilding every block, doubling a product's time
    (docs/performance.md, "Hessian basis").

    With ``can_spill_basis``, where the earlier basis vectors in memory would leave fewer graphs
    kept, they are put in a temporary file instead and read back by blocks of columns at every
    projection (from the page cache), if that keeps more graphs. At GPT-2 small
    (``-k 5 --samples 8``) the basis checkpoint after the first, with 5 earlier vectors (2.3 GiB)
    in memory, kept the graphs of 7 of 8 examples, and its products were markedly slower than the
    first's (docs/performance.md, "Hessian basis").

    Parameters
    ----------
    budget
        Bytes the task may use (``--max-memory`` shared by parallel tasks).
    dimension, k, earlier
        D, eigenpairs wanted, basis vectors found before (deflated against).
    examples, batch_size
        The Hessian's subsample (``--samples``) and its block size (``--batch-size``).
    graph
        ``(constant, per_example)`` bytes of one block's kept gradient graph
        (:func:`ckpt.numerics.derivatives.graph_bytes` at two block sizes).
    itemsize
        Bytes per parameter in the computation's dtype.
    limit
        Most Lanczos vectors the search could use (no restart).
    can_spill
        Whether the vectors may be spilled to a file (on the CPU only).
    can_spill_basis
        Whether the earlier basis vectors may be spilled to a file (on the CPU, read from the journal).

    Raises
    ------
    AnalysisError
        When even one example's graph and k + 4 Lanczos vectors do not fit.
    """
    vector = dimension * itemsize
    in_memory = FIXED_VECTORS * vector + earlier * vector
    constant, per_example = graph
    smallest = min(limit, k + MIN_VECTORS_BEYOND_K)
    preferred = min(limit, k + PREFERRED_EXTRA_VECTORS)

    def graphs(count: int, peak: float) -> int:
        return int(peak * (constant + per_example * count))

    def room(left: float) -> int:
        """Most Lanczos vectors (at most ``limit``) whose search fits in ``left`` bytes."""
        most = min(limit, max(int(left // vector) - 2, 0))
        while most > 0 and lanczos_bytes(dimension, most, itemsize) > left:
            most -= 1
        return most

    def spilled(vectors: int) -> int:
        return lanczos_bytes(dimension, vectors, itemsize, spilled=True)

    # Where vectors can be spilled, fewer than `preferred` in memory lose to `preferred` spilled: at GPT-2
    # small's first basis checkpoint k + 4 in memory took 38 products, k + 8 spilled 30, at about the same
    # time a product. Spilled always needs less memory, so fewer in memory is for a GPU only.
    enough = preferred if can_spill else smallest

    def fit(fixed: int) -> SearchPlan | None:
        """The fastest plan beside ``fixed`` bytes whose end fits too, or None.

        Its end: once the search converges the graphs are freed (:func:`_release_graphs`), and the k
        eigenvectors are formed beside the Lanczos vectors.
        """
        plan = fastest(fixed)
        if plan is None:
            return None
        end = fixed + (spilled(plan.vectors) if plan.spill else lanczos_bytes(dimension, plan.vectors, itemsize))
        end += k * vector
        return dataclasses.replace(plan, estimate=max(plan.estimate, end)) if end <= budget else None

    def fastest(fixed: int) -> SearchPlan | None:
        """The fastest plan of the search beside ``fixed`` bytes, or None."""
        kept = sum(graphs(min(batch_size, examples - start), GRAPH_PEAK) for start in range(0, examples, batch_size))
        vectors = room(budget - fixed - kept)
        if vectors >= enough:
            return SearchPlan(True, batch_size, vectors, fixed + kept + lanczos_bytes(dimension, vectors, itemsize))
        if can_spill and fixed + kept + spilled(preferred) <= budget:
            return SearchPlan(True, batch_size, preferred, fixed + kept + spilled(preferred), spill=True)
        if can_spill:
            partly = _partly_kept(budget - fixed - spilled(preferred), examples, batch_size, graph)
            if partly is not None:
                kept_examples, block, peak = partly
                estimate = fixed + spilled(preferred) + peak
                return SearchPlan(False, block, preferred, estimate, spill=True, kept_examples=kept_examples)
        for spill in (False, True) if can_spill else (False,):
            vectors = preferred if spill else min(preferred, room(budget - fixed - graphs(1, REBUILT_PEAK)))
            search = spilled(vectors) if spill else lanczos_bytes(dimension, vectors, itemsize)
            if vectors >= enough and fixed + graphs(1, REBUILT_PEAK) + search <= budget:
                left = budget - fixed - search
                block = int(min(batch_size, examples, max(1, (left / REBUILT_PEAK - constant) // max(per_example, 1))))
                return SearchPlan(False, block, vectors, fixed + graphs(block, REBUILT_PEAK) + search, spill=spill)
        return None

    plan = fit(in_memory)
    if earlier and can_spill_basis and (plan is None or not plan.keep_graphs):
        # the earlier basis in a file costs its reads at every projection, a rebuilt graph a forward and a
        # backward pass more per product: spilled where that keeps more graphs
        spilled_basis = fit(FIXED_VECTORS * vector + BASIS_BLOCK_BYTES)
        if spilled_basis is not None and (plan is None or _kept(spilled_basis, examples) > _kept(plan, examples)):
            return dataclasses.replace(spilled_basis, spill_basis=True)
    if plan is not None:
        return plan
    fixed = FIXED_VECTORS * vector + (BASIS_BLOCK_BYTES if earlier and can_spill_basis else earlier * vector)
    search = spilled(smallest) if can_spill else lanczos_bytes(dimension, smallest, itemsize)
    need = fixed + max(graphs(1, REBUILT_PEAK), k * vector) + search
    msg = (
        f"hessian-basis needs at least {format_size(need)} per task for {dimension:,} parameters "
        f"({smallest} Lanczos vectors of {format_size(vector)}{' spilled to disk' if can_spill else ''}, one "
        f"example's Hessian graph {format_size(graphs(1, REBUILT_PEAK))}, the model and {earlier} earlier basis "
        f"vectors{' spilled to disk' if earlier and can_spill_basis else ''}); the memory budget is "
        f"{format_size(budget)}: raise --max-memory, or lower -k"
    )
    raise AnalysisError(msg)


def _kept(plan: SearchPlan, examples: int) -> int:
    """Examples whose graphs ``plan`` keeps for all products."""
    return examples if plan.keep_graphs else plan.kept_examples


def check_the_run_fits(
    budget: int,
    dimension: int,
    k: int,
    total: int,
    largest_tensor: int,
    examples: int,
    batch_size: int,
    graph: tuple[float, float],
    itemsize: int,
    *,
    cpu: bool = True,
    journal: bool = True,
) -> None:
    """Raise now, not hours later, when a later basis checkpoint or the end of the run cannot fit ``budget``.

    Each basis checkpoint holds every vector found before it, so the run's last search
    (``total - k`` earlier vectors) is the largest, unless it spills its earlier basis (on the CPU,
    with a journal). With a journal the end of the run holds no basis: the engine copies the
    result's tensors from the journal into the result a stored chunk at a time
    (:meth:`ckpt.plugins.AnalysisContext.write_from_journal`). Without one the vectors the searches
    returned are held to the end and copied into the result's tensors: counted as 2·K·D·s +
    K·(largest tensor)·s + D·s, the last two terms from when each tensor was read back whole for its
    digests (an upper bound now; host memory: checked on the CPU only, where the budget is the
    host's). A run that would stop at a later basis checkpoint, or go over its budget at the end,
    stops at its first, with the knobs named.

    Parameters
    ----------
    budget, dimension, k, examples, batch_size, graph, itemsize
        As for :func:`plan_search`.
    total
        Basis vectors the whole run finds (its basis checkpoints times k).
    largest_tensor
        Parameters of the model's largest tensor.
    cpu
        The search runs on the CPU: its vectors may be spilled (``can_spill`` of
        :func:`plan_search`), and the budget is the host memory the end of the run takes.
    journal
        The pieces are committed to a journal as they are found (:func:`eigenvectors_at`), from
        which the searches read the earlier vectors and the engine writes the result.
    """
    fewer = "or take fewer basis checkpoints (--every, --at-steps)"
    earlier = total - k
    try:
        plan_search(
            budget,
            dimension,
            k,
            earlier,
            examples,
            batch_size,
            graph,
            itemsize,
            product_limit(dimension - earlier, k),
            can_spill=cpu,
            can_spill_basis=cpu and journal,
        )
    except AnalysisError as exc:
        msg = str(exc).replace("hessian-basis needs", "hessian-basis's last basis checkpoint needs", 1)
        raise AnalysisError(f"{msg}, {fewer}") from None
    if journal:  # the end holds a few stored chunks of the copy from the journal and one slab of digests
        return
    vector = dimension * itemsize
    end = 2 * total * vector + total * largest_tensor * itemsize + vector
    if cpu and end > budget:
        msg = (
            f"hessian-basis needs {format_size(end)} at the end of the run, to put its {total} basis vectors of "
            f"{dimension:,} parameters into the result beside them; the memory budget is "
            f"{format_size(budget)}: "
            f"raise --max-memory, lower -k, {fewer}"
        )
        raise AnalysisError(msg)


def _partly_kept(
    left: float, examples: int, batch_size: int, graph: tuple[float, float]
) -> tuple[int, int, int] | None:
    """``(kept examples, rebuilt block, peak bytes)`` keeping as many examples' graphs as ``left`` bytes allow.

    The kept graphs (in blocks of ``batch_size``) peak at :data:`GRAPH_PEAK` times their bytes during
    their part of a product; the blocks rebuilt after it hold their own graph (:data:`REBUILT_PEAK`)
    beside the kept graphs at rest (:data:`GRAPH_AT_REST`). None when not even one example's graph is
    kept with one example rebuilt beside it.
    """
    constant, per_example = graph

    def held(count: int) -> float:
        return sum(constant + per_example * min(batch_size, count - start) for start in range(0, count, batch_size))

    for kept in range(examples - 1, 0, -1):
        graphs = held(kept)
        if GRAPH_PEAK * graphs > left:
            continue
        room = (left - GRAPH_AT_REST * graphs) / REBUILT_PEAK - constant
        block = int(min(batch_size, examples - kept, room // max(per_example, 1)))
        if block >= 1:
            peak = max(GRAPH_PEAK * graphs, GRAPH_AT_REST * graphs + REBUILT_PEAK * (constant + per_example * block))
            return kept, block, int(peak)
    return None

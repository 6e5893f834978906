"""``hessian-basis``: a basis of the training subspace from Hessian eigenvectors (Hidden Breakthroughs, Algorithm 1).

Start with an empty basis B. At each basis checkpoint t (``--every`` /
``--at-steps``, in step order; ``--order shuffled`` visits them in a seeded
random order, the paper's shuffled-checkpoint ablation), take the Hessian H_t of the mean loss over a seeded subsample
of a split (``--samples`` examples of ``--hessian-split``), restrict it to the
orthogonal complement of B in the symmetric form P H_t P, P = I - B Bᵀ, and
append its top ``-k`` eigenvectors to B.

Hessian-vector products differentiate each data block's gradient graph,
built once per checkpoint, again along the vector (reverse over reverse,
:class:`ckpt.numerics.derivatives.MeanLossHessian`); the eigenvectors come from Lanczos
with partial reorthogonalization (:func:`ckpt.numerics.lanczos.top_eigenpairs`), which tests
convergence after every product and takes the residuals from the products it
kept: the products are almost all of the time (bench/polca.py). The checkpoints depend on each other
(each needs the basis so far), so the Dask graph is a chain of one task per
basis checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import ComputeOptions, HessianOptions, basis_steps, check_basis_size, sample_examples
from ckpt.engine.memory import format_size
from ckpt.engine.resume import Journal
from ckpt.errors import AnalysisError
from ckpt.numerics.basis_format import BASIS_DIM, FOUND_AT, basis_dataset, basis_problem, basis_rows
from ckpt.numerics.derivatives import MeanLossHessian, ParamSpace, graph_bytes
from ckpt.numerics.lanczos import (
    DOT_BLOCK_BYTES,
    MIN_VECTORS_BEYOND_K,
    SpilledRows,
    lanczos_bytes,
    product_limit,
    top_eigenpairs,
)
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    Analyzer,
    Option,
    Worker,
    chunks,
    datapoint_index,
    hookimpl,
    loss_function,
    parameter_space,
    torch_dtype,
    trainable,
)
from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory
from ckpt.store.arrays import read_here

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

SEARCH_COLUMNS = ("eigenvalue", "residual", "matvecs")
"""What each search records per vector beside it, along ``basis``: its Ritz value, residual and products."""


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


def hessian_operator(
    plan: SearchPlan,
    block_loss: Callable[[np.ndarray], Any],
    examples: np.ndarray,
    weight: float,
    primal: Any,
    batch_size: int,
) -> MeanLossHessian:
    """The mean loss's Hessian over ``examples`` as ``plan`` holds its graphs (kept, rebuilt, or partly kept).

    ``block_loss(rows)`` is the per-datapoint loss of those examples, each weighted by ``weight``.
    """
    kept = len(examples) if plan.keep_graphs else plan.kept_examples
    kept_rows = [examples[rows] for rows in chunks(kept, batch_size)] if kept else []  # slices of [0, kept)
    rest = examples[kept:]
    rebuilt_rows = [rest[rows] for rows in chunks(len(rest), plan.block_examples)] if len(rest) else []
    fs = [(block_loss(rows), weight) for rows in kept_rows + rebuilt_rows]
    return MeanLossHessian(fs, primal, kept_blocks=len(kept_rows))


def graph_growth(block_loss: Callable[[np.ndarray], Any], examples: np.ndarray, primal: Any) -> tuple[int, int]:
    """``(constant, per_example)`` bytes of a block's kept gradient graph, from the graphs of one and two examples.

    ``block_loss(rows)`` is the per-datapoint loss of those examples; ``primal`` the parameters
    (:func:`ckpt.numerics.derivatives.graph_bytes`). The ``graph`` that :func:`plan_search` takes.
    """
    one, two = (graph_bytes(block_loss(examples[:n]), primal) for n in (1, min(2, len(examples))))
    per_example = max(two - one, 0) if len(examples) > 1 else one
    release_freed_memory()  # the two graphs, freed, would stay in the heap beside the search
    return max(one - per_example, 0), per_example


def eigenvectors_at(
    worker: Worker,
    step: int,
    previous: Sequence[dict[str, np.ndarray]],
    *,
    space: ParamSpace,
    split: str,
    examples: np.ndarray,
    objective: str | None,
    k: int,
    tol: float,
    seed: int,
    batch_size: int,
    dtype: str,
    journal: Journal | None = None,
    keys: Sequence[Any] = (),
    found_at: Sequence[int] = (),
    total: int | None = None,
) -> dict[str, np.ndarray]:
    """Top-k eigenpairs of P H_step P against the vectors found at earlier checkpoints (on a worker).

    With a ``journal``, the piece is committed to it and returned without its vectors (``keys``:
    the journal keys of this and every earlier piece; ``found_at``: their steps), so that a
    run killed later resumes after it; the earlier vectors are read from it, not from
    ``previous``, which then holds each piece's eigenvalues, residuals and products only.
    ``total``: the basis vectors the whole run finds; when given, a run whose later checkpoints
    or end cannot fit the budget stops here (:func:`check_the_run_fits`).
    """
    import torch

    precision = torch_dtype(dtype)
    params = worker.params(step, alone=True)  # the previous basis checkpoint's tensors: not read, not held
    primal = trainable(params, space, dtype)
    example_of, _ = datapoint_index(worker.store, split, objective)
    datapoints = int(np.isin(example_of, examples).sum())
    if datapoints == 0:
        msg = f"the Hessian subsample of split {split!r} has no datapoints"
        raise AnalysisError(msg)

    def block_loss(rows: np.ndarray) -> Any:
        return loss_function(worker, params, space, split=split, examples=rows, objective=objective, dtype=dtype)

    earlier = sum(len(p["eigenvalue"]) for p in previous)
    graph = graph_growth(block_loss, examples, primal)
    can_spill = str(worker.device) == "cpu"
    budget = worker.memory_budget  # one reading for both plans (without --max-memory it measures free memory)
    plan = plan_search(
        budget,
        space.size,
        k,
        earlier,
        len(examples),
        batch_size,
        graph,
        precision.itemsize,
        product_limit(space.size - earlier, k),
        can_spill=can_spill,
        can_spill_basis=can_spill and journal is not None,
    )
    if total is not None:  # after this checkpoint's own plan, whose error says more when it is this one
        check_the_run_fits(
            budget,
            space.size,
            k,
            total,
            max(space.sizes),
            len(examples),
            batch_size,
            graph,
            precision.itemsize,
            cpu=can_spill,
            journal=journal is not None,
        )
    if journal is not None and earlier:
        basis = journal_basis(
            journal, keys[:-1], earlier, space=space, device=worker.device, dtype=dtype, spill=plan.spill_basis
        )
    else:
        basis = earlier_basis(previous, worker.device, precision)
    hessian = hessian_operator(plan, block_loss, examples, 1.0 / datapoints, primal, batch_size)

    hvp = hessian.flat(space)
    seconds: list[float] = []  # each product's own time, apart from the search's vector work

    def timed_hvp(vector: Any) -> Any:
        start = time.perf_counter()
        product = hvp(vector)
        if product.is_cuda:  # kernels run asynchronously: the product's time ends when they do
            torch.cuda.synchronize(product.device)
        seconds.append(time.perf_counter() - start)
        return product

    # On the CPU, the ~2 GB that each product allocates and frees is kept in the heap for the next product
    # instead of being unmapped and mapped afresh (zeroed by the kernel): 7-19% a product at GPT-2 small.
    # Run by the engine, the whole run holds this already (keeps_freed_memory); here for callers outside it.
    reuse = freed_memory_kept_for_reuse() if not str(worker.device).startswith("cuda") else contextlib.nullcontext()
    with _product_progress(worker, step, tol, plan, seconds) as progress, _closed(basis), reuse:
        try:
            pairs = top_eigenpairs(
                timed_hvp,
                space.size,
                k,
                basis=basis,
                tol=tol,
                seed=seed + step,
                dtype=precision,
                device=worker.device,
                max_vectors=plan.vectors,
                spill=plan.spill,
                progress=progress,
                products_done=lambda: _release_graphs(hessian),
            )
        except AnalysisError as exc:
            if "is not finite" not in str(exc):
                raise
            bad = [n for n, value in params.items() if value.is_floating_point() and not bool(value.isfinite().all())]
            cause = (
                f"the weights at this step hold NaN or inf ({', '.join(repr(n) for n in bad[:5])})"
                if bad
                else "the weights are finite, so the loss or its curvature overflows there"
            )
            msg = f"hessian-basis at the checkpoint of step {step}: {exc}; {cause}"
            raise AnalysisError(msg) from None
    piece = {
        "vectors": pairs.vectors,
        "eigenvalue": pairs.values.astype(np.float64),
        "residual": pairs.residuals.astype(np.float64),
        "matvecs": np.full(k, pairs.matvecs, np.int64),
    }
    if journal is not None:
        journal.append(search_dataset(piece, space, found_at[-1:], first=(len(found_at) - 1) * k), BASIS_DIM, keys)
        # The journal holds the vectors now: the later searches read them from it, and the engine copies them
        # into the result. Held as Dask's result of this task instead, every piece stayed in memory to the end
        # of the run, where the result's tensors copied them once more (check_the_run_fits).
        del piece["vectors"]
    return piece


def _release_graphs(hessian: MeanLossHessian) -> None:
    """Free the search's kept graphs once it has converged, before its eigenvectors are formed and committed.

    Why: the k eigenvectors (k·D·s) were formed, and the piece written to the journal, beside the graphs.
    At GPT-2 small with ``-k 5 --samples 8`` that run peaked far above its plans (docs/performance.md,
    "Hessian basis"): the plans count the graphs or the eigenvectors, not both (:func:`plan_search`).
    """
    hessian.release()
    release_freed_memory()  # the heap's freed pages back to the system, so that the eigenvectors take their place


def earlier_basis(previous: Sequence[Mapping[str, Any]], device: str, precision: Any) -> list[Any]:
    """The vectors of the earlier pieces as torch rows on ``device``, for the search's deflation.

    Where they can be used as they are (the CPU, the same dtype), one view per piece: a
    concatenated copy would hold them twice (0.5 GB each at GPT-2 small). Where they are
    copied anyway (to a GPU, or to another dtype), into one ``[earlier, D]`` tensor: each
    column block of a Lanczos pass then copies one source, not one per piece. On a GPU one
    view per piece made the paper preset's searches several times slower by the last basis
    checkpoints, with 40-50 earlier pieces: about 50 small copies for every 16 MiB block,
    some 15,000 kernel launches a pass. (On a CPU one strided source was slower, so views
    stay; docs/performance.md, "Hessian basis".)
    """
    import torch

    pieces = [torch.as_tensor(p["vectors"]) for p in previous]
    if all(str(device) == "cpu" and piece.dtype == precision for piece in pieces):
        return pieces
    rows = torch.empty(sum(len(piece) for piece in pieces), pieces[0].shape[1], dtype=precision, device=device)
    first = 0
    for piece in pieces:
        rows[first : first + len(piece)].copy_(piece)
        first += len(piece)
    return [rows]


def _read_journal(journal: Journal, keys: Sequence[Any], into: Mapping[str, Any], *, space: ParamSpace) -> None:
    """Fill ``into`` with the vectors of the pieces ``keys`` from the journal.

    ``into``: each tensor's ``[count, *shape]`` array, or all of them in one ``[count, D]`` array
    ``"vectors"``, or in :class:`ckpt.numerics.lanczos.SpilledRows` ``"spilled"``.

    The journal must hold exactly the pieces of ``keys``. It is read a piece at a time, so that at most one
    piece of one tensor is held beside ``into`` (a whole tensor read at once is read into chunks and then
    joined, twice its size).
    """
    import torch

    loaded = journal.load(keys)
    if loaded is None or len(loaded[1]) != len(keys):
        msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
        raise AnalysisError(msg)
    saved = loaded[0]
    target = next(iter(into.values()))
    count = target.capacity if "spilled" in into else target.shape[0]
    if saved.sizes.get(BASIS_DIM) != count:
        msg = f"{journal.partial} holds {saved.sizes.get(BASIS_DIM)} basis vectors where {count} were committed"
        raise AnalysisError(msg)
    per_piece = count // len(keys)
    for first in range(0, count, per_piece):
        rows = basis_rows(saved, slice(first, first + per_piece))
        for name, start, length in zip(space.names, space.offsets, space.sizes, strict=True):
            values = read_here(rows[name])
            if "vectors" in into:
                into["vectors"][first : first + per_piece, start : start + length] = values.reshape(per_piece, length)
            elif "spilled" in into:
                flat = torch.from_numpy(values.reshape(per_piece, length))
                into["spilled"].write_block(per_piece, slice(start, start + length), flat, first=first)
            else:
                into[name][first : first + per_piece] = values


def journal_basis(
    journal: Journal,
    keys: Sequence[Any],
    count: int,
    *,
    space: ParamSpace,
    device: Any,
    dtype: str,
    spill: bool = False,
) -> list[Any]:
    """The ``count`` vectors of the earlier pieces (``keys``), read from the journal, as one torch ``[count, D]``.

    ``spill``: into :class:`ckpt.numerics.lanczos.SpilledRows` instead (an unlinked temporary file; the CPU only),
    which the caller closes.
    """
    import torch

    if spill:
        rows = SpilledRows(count, space.size, torch_dtype(dtype))
        try:
            _read_journal(journal, keys, {"spilled": rows}, space=space)
        except BaseException:
            rows.close()
            raise
        return [rows]
    vectors = np.empty((count, space.size), np.dtype(dtype))
    _read_journal(journal, keys, {"vectors": vectors}, space=space)
    rows = torch.from_numpy(vectors)
    return [rows if str(device) == "cpu" else rows.to(device)]


@contextlib.contextmanager
def _closed(basis: Sequence[Any]) -> Iterator[None]:
    """Close the spilled rows among ``basis`` (their files) however the search ends."""
    try:
        yield
    finally:
        for rows in basis:
            if isinstance(rows, SpilledRows):
                rows.close()


def journal_tensors(
    worker: Worker, journal: Journal, keys: Sequence[Any], pieces: Sequence[Any], *, space: ParamSpace, dtype: str
) -> dict[str, np.ndarray]:
    """The whole basis split into the space's tensors, read from the journal once every piece is in it (a task).

    ``pieces``: the values of every piece's task, so that this runs after them (their vectors are in the journal).
    """
    count = sum(len(p["eigenvalue"]) for p in pieces)
    shapes = zip(space.names, space.shapes, strict=True)
    tensors = {name: np.empty((count, *shape), np.dtype(dtype)) for name, shape in shapes}
    _read_journal(journal, keys, tensors, space=space)
    return tensors


def search_dataset(
    piece: Mapping[str, Any],
    space: ParamSpace,
    steps: Sequence[int],
    first: int = 0,
    *,
    tensors: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Vectors found by the searches in the basis layout (:func:`ckpt.numerics.basis_format.basis_dataset`).

    ``piece``'s arrays (numpy or dask) hold the vectors found at ``steps``, k per step, in
    order, and their :data:`SEARCH_COLUMNS`; ``first`` is the index of its first vector in the
    whole basis. ``tensors``: the vectors already split into the space's tensors
    (``[count, *shape]`` each), in place of ``piece["vectors"]``.
    """
    if tensors is None:
        tensors = space.unflatten(piece["vectors"])
    count = piece["eigenvalue"].shape[0]
    found_at = np.repeat(np.asarray(steps, np.int64), count // max(len(steps), 1))
    columns = {name: piece[name] for name in SEARCH_COLUMNS}
    result = basis_dataset(space, tensors, found_at, first=first, columns=columns)
    result["eigenvalue"].attrs["description"] = f"eigenvalue of P H P at {FOUND_AT} (P: complement of earlier vectors)"
    result["residual"].attrs["description"] = "||P H P v - eigenvalue v||"
    return result


def _lazy_tensors(pieces: Sequence[Any], space: ParamSpace, k: int, dtype: np.dtype) -> dict[str, Any]:
    """Each tensor of the basis as dask rows, one chunk per piece, each a view of that piece's vectors.

    Why not slices of one dask array of the vectors: dask copies a slice that is at most half of its
    chunk (``dask.array.chunk.getitem``), so every piece was held twice, once for the later searches'
    deflation and once in the copies of its tensors, until the run ended: a piece's vectors more at
    every basis checkpoint. Held once, the four basis
    checkpoints of bench/scale.py's L run (``--samples 8 --tol 1e-2``, default budget) peaked lower,
    with the same products and residuals (docs/performance.md, "Hessian basis").
    """
    import dask
    import dask.array as da

    # one delayed dict of views per piece: a Delayed's item is a plain dict lookup, never a copy
    split = [dask.delayed(space.unflatten, pure=True)(p["vectors"]) for p in pieces]
    return {
        name: da.concatenate([da.from_delayed(views[name], shape=(k, *shape), dtype=dtype) for views in split])
        for name, shape in zip(space.names, space.shapes, strict=True)
    }


def saved_eigenpairs(
    worker: Worker, journal: Journal, keys: Sequence[Any], index: int, *, k: int
) -> dict[str, np.ndarray]:
    """Piece ``index`` of the basis as an interrupted run committed it to ``journal`` (on a worker).

    Its eigenvalues, residuals and products: its vectors stay in the journal, from which the later
    searches and the result read them.
    """
    loaded = journal.load(keys)
    if loaded is None or len(loaded[1]) <= index:
        msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
        raise AnalysisError(msg)
    rows = basis_rows(loaded[0], slice(index * k, (index + 1) * k))
    return {name: read_here(rows[name]) for name in SEARCH_COLUMNS}


@contextlib.contextmanager
def _product_progress(
    worker: Worker, step: int, tol: float, plan: SearchPlan, seconds: Sequence[float]
) -> Iterator[Any]:
    """A bar of Hessian-vector products for one basis checkpoint (``--progress``), with the worst residual.

    ``seconds``: each product's own time so far, whose median the bar shows beside its rate. Why:
    the rate counts the search's vector work too (orthogonalization, restarts, vectors spilled to
    disk), and a product's own cost is what a forward + backward pass is compared with
    (bench/scale.py reads both).
    """
    where = " spilled to disk" if plan.spill else ""
    basis = ", the earlier basis spilled to disk" if plan.spill_basis else ""
    postfix = f"{plan.describe()}, {plan.vectors} vectors{where}{basis}, ~{format_size(plan.estimate)}"
    with worker.progress_bar(f"hessian-basis step {step}", unit="product", postfix=postfix) as bar:

        def progress(products: int, worst: float) -> None:
            bar.update(1)
            state = [f"residual {worst:.1e} (tol {tol:g})"] if np.isfinite(worst) else []
            if seconds:
                state.append(f"a product alone {np.median(seconds):.3g} s (median)")
            if state:  # until then the bar shows the memory plan
                bar.set_postfix_str(", ".join(state), refresh=False)

        yield progress


class HessianBasis(HessianOptions, ComputeOptions, Analyzer):
    """Top Hessian eigenvectors found checkpoint by checkpoint, each orthogonal to those before."""

    name = "hessian-basis"
    version = "1"
    description = "Basis of top Hessian eigenvectors grown over the run (POLCA's Algorithm 1)."
    per = PER_RUN
    # each basis checkpoint's graphs and Lanczos vectors are built in the pages the one before freed, not in
    # fresh ones faulted in page by page (ckpt.runtime.freed_memory_kept_for_reuse), which makes the searches
    # after the first faster (docs/performance.md, "Memory and the allocator")
    keeps_freed_memory = True

    split = Option(str, "eval", "Split for the Hessian when --hessian-split is not given and no train split exists.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")

    def hessian_split(self, store: Any) -> str:
        """``--hessian-split``, else ``train`` when the store has it, else ``--split``."""
        if self.options["hessian_split"]:
            return str(self.options["hessian_split"])
        return "train" if "train" in store.splits else str(self.options["split"])

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """Only the Hessian's split."""
        return (self.hessian_split(store),)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """A chain of one Dask task per basis checkpoint; the vectors split back into tensors."""
        import dask.array as da

        store = ctx.store
        space = parameter_space(store)
        steps = basis_steps(store, self.every, self.at_steps)
        check_basis_size(self.name, steps, self.k, space.size)
        if self.order == "shuffled":  # the same checkpoints, each deflated against those visited before it
            steps = [int(s) for s in np.random.default_rng(self.seed).permutation(steps)]
        split = self.hessian_split(store)
        if split not in store.splits:
            from ckpt.plugins import AnalysisError

            msg = f"{store.path} has no data split {split!r}; its splits: {', '.join(store.splits) or '(none)'}"
            raise AnalysisError(msg)
        examples = sample_examples(store.data(split).sizes["example"], self.samples, self.seed)
        keys = [[step, store.checkpoint_digest(step)] for step in steps]
        resumed = self._resumable(ctx, keys, space, steps)
        ctx.resumed = steps[:resumed]
        pieces: list[Any] = []
        for index, step in enumerate(steps):
            if index < resumed:
                pieces.append(ctx.delayed(saved_eigenpairs, ctx.journal, keys, index, k=self.k))
                continue
            pieces.append(
                ctx.delayed(
                    eigenvectors_at,
                    step,
                    list(pieces),
                    space=space,
                    split=split,
                    examples=examples,
                    objective=self.objective,
                    k=self.k,
                    tol=self.tol,
                    seed=self.seed,
                    batch_size=self.batch_size,
                    dtype=self.dtype,
                    journal=ctx.journal,
                    keys=keys[: index + 1],
                    found_at=steps[: index + 1],
                    total=len(steps) * self.k,
                )
            )
        k = self.k

        def column(key: str, shape: tuple[int, ...], dtype: Any) -> Any:
            return da.concatenate([da.from_delayed(p[key], shape=shape, dtype=dtype) for p in pieces])

        columns = {
            "eigenvalue": column("eigenvalue", (k,), np.float64),
            "residual": column("residual", (k,), np.float64),
            "matvecs": column("matvecs", (k,), np.int64),
        }
        dtype = np.dtype(self.dtype)
        if ctx.journal is not None:  # the pieces' vectors are in the journal, read back once the last is found
            # and copied into the result by the engine, a stored chunk at a time. The `read` below is only what
            # a caller outside the engine computes: read back whole, then copied once more by Dask as it hands it
            # over (dask.array.core.finalize copies a single-chunk result). The engine used it before, and
            # bench/scale.py's L run with -k 5 peaked there (docs/performance.md, "Hessian basis").
            ctx.write_from_journal(space.names, keys)
            read = ctx.delayed(journal_tensors, ctx.journal, keys, pieces, space=space, dtype=self.dtype)
            total = len(steps) * k
            tensors = {
                name: da.from_delayed(read[name], shape=(total, *shape), dtype=dtype)
                for name, shape in zip(space.names, space.shapes, strict=True)
            }
        else:
            tensors = _lazy_tensors(pieces, space, k, dtype)
        result = search_dataset(columns, space, steps, tensors=tensors)
        result.attrs["hessian_split"] = split
        return result

    def _resumable(self, ctx: AnalysisContext, keys: list[Any], space: ParamSpace, steps: list[int]) -> int:
        """How many pieces an interrupted run of this request committed that this one can take.

        A journal of another request, or one whose content does not have the layout this
        request would write, is discarded: nothing is taken from it.
        """
        journal = ctx.journal
        if journal is None:
            return 0
        loaded = journal.load(keys)
        if loaded is None:
            journal.discard()
            return 0
        saved, held = loaded
        count = len(held) * self.k
        found_at = np.repeat(steps[: len(held)], self.k).tolist()
        if basis_problem(saved, space, count=count, found_at=found_at) is not None or any(
            name not in saved or saved[name].shape != (count,) for name in SEARCH_COLUMNS
        ):
            journal.discard()
            return 0
        return len(held)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``eigenvalues``: eigenvalue and residual of each vector against the step it was found at."""
        from ckpt.analyzers.figures.basis import basis_figures

        return basis_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """One line per basis vector: where it was found, its eigenvalue and residual."""
        rows = [f"  {'basis':>5}  {'found at':>9}  {'eigenvalue':>12}  {'residual':>10}"]
        for i in range(result.sizes[BASIS_DIM]):
            rows.append(
                f"  {i:>5}  {int(result[FOUND_AT][i]):>9}  {float(result['eigenvalue'][i]):>12.5g}"
                f"  {float(result['residual'][i]):>10.3g}"
            )
        return "\n".join(rows)


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register ``hessian-basis``."""
    register(HessianBasis)


__all__ = [
    "BASIS_BLOCK_BYTES",
    "FIXED_VECTORS",
    "GRAPH_PEAK",
    "PREFERRED_EXTRA_VECTORS",
    "REBUILT_PEAK",
    "SEARCH_COLUMNS",
    "HessianBasis",
    "SearchPlan",
    "check_the_run_fits",
    "ckpt_register_analyzers",
    "eigenvectors_at",
    "graph_growth",
    "journal_basis",
    "journal_tensors",
    "plan_search",
    "saved_eigenpairs",
    "search_dataset",
]

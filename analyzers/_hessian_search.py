"""One ``hessian-basis`` search: the top eigenpairs of P H P at a basis checkpoint (a task, on a worker).

:func:`eigenvectors_at` builds the Hessian operator its plan allows (:mod:`ckpt.analyzers._hessian_plan`),
deflates it against the earlier vectors (held, or read from the journal), runs Lanczos
(:func:`ckpt.numerics.lanczos.top_eigenpairs`) with a bar of products, and commits the piece
to the run's journal. Used by :mod:`ckpt.analyzers.hessian_basis`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ckpt.analyzers._hessian_journal import journal_basis, search_dataset
from ckpt.analyzers._hessian_plan import SearchPlan, check_the_run_fits, plan_search
from ckpt.engine.memory import format_size
from ckpt.engine.resume import Journal
from ckpt.errors import AnalysisError
from ckpt.numerics.basis_format import BASIS_DIM
from ckpt.numerics.derivatives import MeanLossHessian, ParamSpace, graph_bytes
from ckpt.numerics.lanczos import top_eigenpairs
from ckpt.numerics.lanczos_sizes import product_limit
from ckpt.numerics.vector_rows import SpilledRows
from ckpt.plugins import Worker, chunks, datapoint_index, loss_function, torch_dtype, trainable
from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory


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


@contextlib.contextmanager
def _closed(basis: Sequence[Any]) -> Iterator[None]:
    """Close the spilled rows among ``basis`` (their files) however the search ends."""
    try:
        yield
    finally:
        for rows in basis:
            if isinstance(rows, SpilledRows):
                rows.close()


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

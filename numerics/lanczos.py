"""Top eigenpairs of a matrix-free symmetric operator restricted to a basis' complement (Lanczos).

:func:`top_eigenpairs` finds the largest algebraic eigenpairs of P H P,
P = I - B Bᵀ, from Hessian-vector products alone: the Hessian-basis
analyzer's search at each basis checkpoint (Hidden Breakthroughs, Algorithm 1).

Why a Lanczos of our own rather than scipy's ``eigsh`` (ARPACK), which ckpt
used before: the products are almost all of the time, and ARPACK spends more of
them than the method needs. It tests convergence only once its ``ncv`` vectors
are full and again after each implicit restart, and its residuals cost one more
product per eigenvector. Here every step tests convergence on the projected
matrix (free), and the residuals follow from the Lanczos relation without new
products. Top 4 eigenpairs of the addition default model at tol 1e-6 (256
problems, float32): ARPACK 26 products + 4 for the residuals, this 26 in all;
at tol 1e-7, 35 + 4 against 28; the eigenvalues agree to 1e-8 (bench/polca.py).
Torch has no matrix-free Lanczos (``torch.lobpcg`` takes the matrix itself),
and the vectors stay on the worker's device here, where ARPACK's lived on the host.

Memory is bounded by ``max_vectors``: at most that many Lanczos vectors are
kept, in the products' own precision (4·D bytes each in float32); when they are
full and the search has not converged, it restarts thickly (Wu & Simon's
thick-restart Lanczos, the symmetric case of Stewart's Krylov-Schur): the best
Ritz vectors are kept, the rest dropped, and the recurrence goes on from the
residual. The dot products run in float64 over bounded column blocks, so that
nothing of size 8·D is ever allocated. When even k + 4 vectors do not fit beside
what the products hold (GPT-2 small's kept Hessian graphs), they are spilled to an
unlinked temporary file and read back one block of columns at a time
(:class:`SpilledRows`): the same numbers, slower by the reads. Each product is
orthogonalized against all kept vectors only where rounding has made it necessary
(partial reorthogonalization, Simon's ω recurrence): at GPT-2 small that pass, made
every product, was over a third of a product (docs/performance.md, "Lanczos vectors").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError
from ckpt.numerics._recurrence import first_coupled, next_overlaps, restart_recurrence
from ckpt.numerics.lanczos_sizes import (
    DOT_BLOCK_BYTES,
    MIN_VECTORS_BEYOND_K,
    RITZ_VECTORS_BEYOND_K,
    SPILLED_VECTORS,
    accelerator_block_width,
    lanczos_bytes,
    product_limit,
)
from ckpt.numerics.vector_rows import MemoryRows, SpilledRows, Tail

CPU_DOT_BLOCK_BYTES = 1 * 2**20
"""DOT_BLOCK_BYTES on the CPU, for the rows and two vectors (x as read and as updated): small enough that a block
stays in a typical L2 cache between its conversion to float64 and its use; larger blocks made a search's
vector work measurably slower (docs/performance.md, "Lanczos vectors")."""


@dataclass
class Eigenpairs:
    """Eigenpairs found by :func:`top_eigenpairs` (numpy)."""

    values: np.ndarray
    """``[k]`` eigenvalues, largest first."""
    vectors: np.ndarray
    """``[k, D]`` orthonormal eigenvectors, orthogonal to the basis they were found against."""
    residuals: np.ndarray
    """``[k]`` ||A v - λ v|| with A = P H P."""
    matvecs: int
    """Hessian-vector products used."""
    restarts: int = 0
    """Thick restarts made because ``max_vectors`` was full."""
    full_passes: int = 0
    """Products whose residual was reorthogonalized against all kept vectors (the rest: against B and the
    vectors T couples it to only, while Simon's estimate kept them semi-orthogonal)."""


def _block_width(rows: int, dimension: int, device: Any = None) -> int:
    """Columns per block, so that ``rows`` of them in float64 take at most :data:`DOT_BLOCK_BYTES`.

    On the CPU (``device`` None or ``cpu``): ``rows`` and two vectors of them at most :data:`CPU_DOT_BLOCK_BYTES`.
    """
    if device is None or str(device) == "cpu":
        return min(dimension, max(1, CPU_DOT_BLOCK_BYTES // (8 * (max(rows, 0) + 2))))
    return accelerator_block_width(rows, dimension)


class _Stacked:
    """Rows of several sources, stacked, read by blocks of columns into reused float64 buffers.

    Why reused buffers: a fresh float64 block per read is a fresh allocation that the
    allocator maps and the kernel zeroes, page by page; at GPT-2 small (124M columns, 10
    rows) that churn, not the arithmetic, made a pass take seconds.
    """

    def __init__(self, sources: Sequence[tuple[Any, int]], dimension: int, device: Any) -> None:
        import torch

        self.sources = [(rows, count) for rows, count in sources if count]
        self.count = sum(count for _, count in self.sources)
        self.dimension = dimension
        self.width = _block_width(self.count, dimension, device)
        self.rows = torch.empty(self.count, self.width if self.count else 0, dtype=torch.float64, device=device)
        self.x = torch.empty(self.width if self.count else 0, dtype=torch.float64, device=device)

    def columns(self) -> Iterator[slice]:
        """The blocks of columns, in order."""
        for start in range(0, self.dimension, self.width):
            yield slice(start, min(start + self.width, self.dimension))

    def block(self, columns: slice) -> Any:
        """``[count, width]`` float64 rows of ``columns`` (valid until the next call)."""
        width = columns.stop - columns.start
        first = 0
        for rows, count in self.sources:
            self.rows[first : first + count, :width].copy_(rows.block(count, columns))
            first += count
        return self.rows[:, :width]

    def of(self, x: Any, columns: slice) -> Any:
        """``x[columns]`` in float64 (valid until the next call)."""
        return self.x[: columns.stop - columns.start].copy_(x[columns])


def _dots(sources: Sequence[tuple[Any, int]], x: Any) -> Any:
    """``rows @ x`` over the stacked rows of ``sources``, accumulated in float64 block by block."""
    import torch

    stacked = _Stacked(sources, x.shape[0], x.device)
    out = torch.zeros(stacked.count, dtype=torch.float64, device=x.device)
    if stacked.count == 0:
        return out
    for columns in stacked.columns():
        out.addmv_(stacked.block(columns), stacked.of(x, columns))
    return out


def _subtract(
    x: Any,
    sources: Sequence[tuple[Any, int]],
    coefficients: Any,
    *,
    then_dots: bool = False,
    then_norm: bool = False,
    source: Any = None,
) -> Any:
    """``x = source - rowsᵀ coefficients`` (``source`` defaults to ``x``: in place), in float64 block by block.

    With ``then_dots``, the same read of each block also accumulates ``rows @ x`` of the updated
    ``x`` (the next reorthogonalization pass's coefficients) and returns them with ``||x||²``;
    with ``then_norm``, ``||x||²`` alone. Each is of ``x`` as stored (rounded to its dtype).
    """
    import torch

    source = x if source is None else source
    stacked = _Stacked(sources, x.shape[0], x.device)
    dots = torch.zeros(stacked.count, dtype=torch.float64, device=x.device)
    square = torch.zeros((), dtype=torch.float64, device=x.device)
    if stacked.count == 0:  # nothing to subtract
        if source is not x:
            x.copy_(source)
        if then_dots or then_norm:
            square += _norm(x) ** 2
    for columns in stacked.columns() if stacked.count else ():
        rows = stacked.block(columns)
        updated = stacked.of(source, columns).addmv_(rows.T, coefficients, alpha=-1)
        x[columns] = updated
        if then_dots or then_norm:
            updated.copy_(x[columns])  # as stored: the next pass sees the rounded values
            if then_dots:
                dots.addmv_(rows, updated)
            square += updated @ updated
    if then_dots:
        return dots, float(square)
    return float(square) if then_norm else None


def _orthogonalize(
    x: Any,
    sources: Sequence[tuple[Any, int]],
    *,
    always_twice: bool = False,
    source: Any = None,
    again_from: Sequence[tuple[Any, int]] | None = None,
) -> tuple[Any, float]:
    """Classical Gram-Schmidt of ``source`` (default ``x``: in place) against the rows of ``sources``, into ``x``.

    The rows are unit vectors (a basis, Lanczos vectors). A second pass follows only where the first
    left ``x`` with an overlap larger than its own rounding (ε ||x||, ε of ``x``'s dtype) with a row,
    or always with ``always_twice``. Those overlaps are measured, not estimated: the first pass's
    read of each block of the rows, after it has updated that block of ``x``, also takes their dot
    products with ``x`` as stored, in float64, and they are the second pass's coefficients. Why not
    Daniel, Gragg, Kaufman and Stewart's test (a second pass when the first removed more than 1 - 1/√2
    of the norm, ARPACK's), which this module used before: it stands in for these overlaps where
    computing them is a pass of its own, and errs on the safe side; here they come free, and the first
    pass is computed in float64, far more accurately than ``x`` is stored. Measured
    on a 41-product search at D = 2M (a diagonal operator whose top eigenvectors lie on 50 coordinates,
    float32, k 1): DGKS asked for 42 second passes; after 89% of those first passes the overlaps were
    below ε ||x|| already. With the measured criterion 7 were made, the products and full passes
    stayed the same (41, 2), and the top eigenvalue 10 came out as 9.99999993 against 9.99999992.
    At D = 124M the vector work per product fell by an eighth in memory, a fifth spilled
    (docs/performance.md, "Lanczos vectors").

    Why ``source``: the Lanczos loop orthogonalizes each Hessian-vector product into a buffer of
    its own; reading the product where it lies saves the copy, a pass over D. With the norm taken
    from the first pass's read and the next vector divided straight into its row, three passes
    fewer a product (a small gain; the block size mattered more, :data:`CPU_DOT_BLOCK_BYTES`).

    ``again_from``: the same rows, from where the second pass may read them (default ``sources``).
    Why: one of ``sources`` may be ``x`` itself, as it was before this call. The first pass reads
    each block of the rows before it writes that block of ``x``, so that is safe there; a
    second pass would read ``x``'s new values.

    Returns
    -------
    tuple
        The first pass's coefficients, and ||x|| afterwards (from the read of the last pass made:
        each norm of its own is a pass over D).
    """
    import torch

    source = x if source is None else source
    coefficients = _dots(sources, source)
    again, square = _subtract(x, sources, coefficients, then_dots=True, source=source)
    rounding = float(torch.finfo(x.dtype).eps) * square**0.5
    if always_twice or (again.numel() > 0 and float(again.abs().max()) > rounding):
        square = _subtract(x, sources if again_from is None else again_from, again, then_norm=True)
    return coefficients, square**0.5


def _orthonormalize_rows(rows: Any) -> None:
    """Gram-Schmidt of the ``[k, D]`` rows among themselves, twice, in float64 blocks, in place.

    Ritz vectors of semi-orthogonal Lanczos vectors are accurate eigenvector directions with
    norms and mutual overlaps off by up to √ε: this makes them orthonormal to working precision.
    """
    for index in range(rows.shape[0]):
        _, norm = _orthogonalize(rows[index], [(MemoryRows.of(rows[:index]), index)], always_twice=True)
        _divide(rows[index], norm)


def _combine_in_place(rows: Any, count: int, combination: Any, dimension: int) -> None:
    """``rows[:l] = combinationᵀ rows[:count]`` in place (``combination`` is ``[count, l]``), block by block."""
    kept = combination.shape[1]
    stacked = _Stacked([(rows, count)], dimension, combination.device)
    for columns in stacked.columns():
        rows.write_block(kept, columns, (combination.T @ stacked.block(columns)).to(rows.dtype))


def _divide(x: Any, divisor: float, out: Any = None) -> Any:
    """``out = x / divisor`` in float64 block by block, stored in ``out``'s dtype (default: ``x``, in place).

    The same numbers as a whole float64 copy of ``x`` would give, without allocating one (1 GB at
    GPT-2 small), nor a new vector of ``x``'s own: a fresh 0.5 GB tensor is mapped and zeroed page by
    page, in every product. ``out``: the row where the result is kept, written in the
    same pass (dividing in place and copying after is a second pass over D).
    """
    import torch

    out = x if out is None else out
    step = _block_width(1, x.shape[0], x.device)
    part = torch.empty(min(step, x.shape[0]), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], step):
        block = part[: min(step, x.shape[0] - start)].copy_(x[start : start + step])
        out[start : start + step] = block.div_(divisor)
    return out


def _norm(x: Any) -> float:
    import torch

    total = torch.zeros((), dtype=torch.float64, device=x.device)
    step = _block_width(1, x.shape[0], x.device)
    part = torch.empty(min(step, x.shape[0]), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], step):
        block = part[: min(step, x.shape[0] - start)].copy_(x[start : start + step])
        total += block @ block
    return float(torch.sqrt(total))


def top_eigenpairs(
    hvp: Callable[[Any], Any],
    dimension: int,
    k: int,
    *,
    basis: Any = None,
    tol: float = 1e-6,
    seed: int = 0,
    dtype: Any = None,
    device: str = "cpu",
    max_vectors: int | None = None,
    spill: bool = False,
    spill_dir: str | None = None,
    progress: Callable[[int, float], None] | None = None,
    products_done: Callable[[], None] | None = None,
) -> Eigenpairs:
    """Top-``k`` eigenpairs of A = P H P, P = I - B Bᵀ, by Lanczos with partial reorthogonalization.

    Parameters
    ----------
    hvp
        ``hvp(v) -> H v`` on flat torch vectors ``[D]``. It may return the same buffer each
        call: a product is used up before the next is asked for.
    dimension
        D.
    k
        Eigenpairs wanted (largest algebraic eigenvalues).
    basis
        B: ``[m, D]`` orthonormal torch rows, or a sequence of such blocks (taken
        as they are, never concatenated), in any precision; a block may also be
        :class:`SpilledRows` (on the CPU), read back by blocks of columns at every
        projection; None: no restriction. Projections against it are computed in float64.
    tol
        Relative accuracy, ARPACK's criterion: stop once every wanted Ritz pair
        has ||A x - θ x|| <= tol·|θ| (0: the dtype's machine epsilon).
    seed
        Seeds the start vector, so that results are reproducible.
    dtype, device
        Of the torch vectors given to ``hvp``, of the Lanczos vectors kept and
        of the eigenvectors returned (default float32). Dot products and the
        projected matrix are float64 whatever ``dtype`` is.
    max_vectors
        Most Lanczos vectors kept at once (at least k + 2; None: as many as
        :func:`product_limit` allows, so that no restart happens). When they are
        full the search restarts thickly from its best Ritz vectors.
    spill, spill_dir
        Keep the Lanczos vectors in an unlinked temporary file (in ``spill_dir``,
        default the system's temporary directory) instead of memory
        (:class:`SpilledRows`; CPU only): the same numbers, at the cost of the bytes
        read back: none on most products (the two newest vectors are still in
        memory), the previous one for a second Gram-Schmidt pass, the kept ones
        on the product after a thick restart, all of them at a full pass or a
        restart.
    progress
        Called after every product with its number and the worst relative
        residual of the wanted Ritz pairs so far (inf before k products).
    products_done
        Called once the search has converged, before the k eigenvectors (k·D more)
        are formed from the Lanczos vectors: no product follows, so the caller may
        free what its products held (hessian-basis: the kept Hessian graphs).

    Returns
    -------
    Eigenpairs
        Values largest first; the residuals ||A x - θ x|| = ||r||·|s_last| of
        the Lanczos relation A V = V T + r e_lastᵀ, which semi-orthogonal
        vectors keep to working precision (Simon 1984); vectors orthonormal
        to working precision.

    Raises
    ------
    AnalysisError
        k is not below the complement's dimension, ``max_vectors`` is below
        k + 2, a product is not finite, or the search did not converge within
        :func:`product_limit` products.

    Notes
    -----
    A single start vector finds one copy of a repeated eigenvalue, as ARPACK's
    does. Each product's residual is orthogonalized against B and the vectors T
    couples the current one to (the three-term recurrence) by classical
    Gram-Schmidt, a second pass only where the first left overlaps above the
    residual's rounding (measured: :func:`_orthogonalize`). Against all kept
    vectors only where Simon's ω recurrence
    (generalized to the arrow T of a thick restart) estimates that an overlap
    has passed √ε, and on the product after: partial reorthogonalization, which
    keeps the Lanczos vectors semi-orthogonal, enough for Ritz values accurate
    to working precision and for the residuals above. The returned vectors are
    then orthonormalized among themselves. On the test problems this finds
    the same eigenpairs in the same number of products as full
    reorthogonalization with 2-4 full passes a search instead of one a product
    (:attr:`Eigenpairs.full_passes`). Memory:
    :func:`lanczos_bytes` of ``max_vectors`` (the products' own precision, 4·D
    bytes a vector in float32), plus the basis given. Threads: on the CPU the
    vector work runs on one torch thread and ``hvp`` on the caller's; the
    caller's count is restored however the search ends.
    """
    import torch
    from scipy.linalg import eigh
    from threadpoolctl import threadpool_limits

    dtype = dtype or torch.float32
    blocks = [] if basis is None else [basis] if hasattr(basis, "shape") else list(basis)
    projection: list[tuple[SpilledRows | MemoryRows, int]] = [
        (block, block.capacity)
        if isinstance(block, SpilledRows)
        else (MemoryRows.of(block.to(device=device)), len(block))
        for block in blocks
    ]
    projection = [(rows, count) for rows, count in projection if count]
    free = dimension - sum(count for _, count in projection)
    if k >= free:
        msg = f"cannot find {k} more eigenvectors in a {free}-dimensional complement (D={dimension})"
        raise AnalysisError(msg)
    limit = product_limit(free, k)
    room = min(limit, free) if max_vectors is None else min(int(max_vectors), free)
    if room < min(k + MIN_VECTORS_BEYOND_K, free):
        msg = (
            f"Lanczos needs room for at least {k + MIN_VECTORS_BEYOND_K} vectors of {dimension:,} parameters "
            f"to find {k} eigenpair(s); the memory budget leaves room for {room}: raise --max-memory or lower -k"
        )
        raise AnalysisError(msg)
    if spill and str(device) != "cpu":
        msg = f"Lanczos vectors are spilled to a file only on the CPU, not on {device}: raise --max-memory or lower -k"
        raise AnalysisError(msg)
    tolerance = tol if tol > 0 else float(torch.finfo(dtype).eps)
    rng = np.random.default_rng(seed)
    vectors = SpilledRows(room, dimension, dtype, spill_dir) if spill else MemoryRows(room, dimension, dtype, device)

    def random_unit(used: int) -> Any:
        v = torch.empty(dimension, dtype=dtype, device=device)
        step = _block_width(1, dimension, device)  # drawn by blocks: never a float64 vector of size D
        for start in range(0, dimension, step):
            v[start : start + step] = torch.from_numpy(rng.standard_normal(min(step, dimension - start)))
        # twice is enough (Parlett): orthogonal to working precision
        _, norm = _orthogonalize(v, [*projection, (vectors, used)], always_twice=True)
        return _divide(v, norm)

    projected = np.zeros((room, room))  # T = Vᵀ A V, tridiagonal until a restart makes it arrow-shaped
    overlaps = np.eye(room)  # Ω ≈ Vᵀ V as Simon's recurrence estimates it (not computed: that is a pass)
    eps = float(torch.finfo(dtype).eps)
    semi_orthogonal = eps**0.5
    scale = 0.0  # the largest |Ritz value| so far, ||A|| as far as it is known
    again = False  # the last product's vector was reorthogonalized because Ω had passed √ε
    passes = 0  # passes over all kept vectors
    current = random_unit(0)  # the last Lanczos vector, also kept in memory: the next product's input
    # Each product is orthogonalized into `spare`. Kept in memory, the next Lanczos vector is divided
    # from it straight into its row, and `current` is that row: `spare` is reused every product. Spilled,
    # `spare` becomes the next vector in place, and the vector it was made from the next `spare`. Either
    # way no vector of D is allocated per product: a fresh tensor per product and per division was
    # mapped and zeroed page by page, a visible share of every product at GPT-2 small (docs/performance.md,
    # "Lanczos vectors"), and dividing in place then copying into the row was one more pass over D.
    in_memory = isinstance(vectors, MemoryRows)

    def keep_row(index: int, vector: Any) -> Any:
        """Row ``index`` = ``vector``; returns what the next product reads: the row itself when in memory."""
        if not isinstance(vectors, MemoryRows):
            vectors.write(index, vector)
            return vector
        row = vectors.data[index]
        if vector.data_ptr() != row.data_ptr():
            row.copy_(vector)
        return row

    spare = torch.empty(dimension, dtype=dtype, device=device)
    spare_row = None  # spilled: the kept row whose values `spare` still holds, until r overwrites them
    current = keep_row(0, current)
    used = 1  # rows of `vectors` in use
    restarts = 0
    estimates = theta = top = ritz = None
    # On the CPU the vector work runs on one torch thread, the products on the caller's. Why: its passes
    # are thousands of small parallel regions a product (a few per column block), and with two threads
    # some processes ran them several times slower than others, for their whole life; one thread never
    # did (docs/performance.md, "Lanczos vectors").
    caller_threads = torch.get_num_threads()
    vector_threads = 1 if str(device) == "cpu" else caller_threads

    def product_of(vector: Any) -> Any:
        torch.set_num_threads(caller_threads)
        try:
            return hvp(vector)
        finally:
            torch.set_num_threads(vector_threads)

    try:
        torch.set_num_threads(vector_threads)
        # scipy's LAPACK between torch's kernels: OpenBLAS threads left spinning after its calls slowed
        # the products by more than an order of magnitude when ARPACK drove them (bench/polca.py)
        with threadpool_limits(limits=1, user_api="blas"):
            for products in range(1, limit + 1):
                # current is in the complement already (started there, reorthogonalized against B
                # below): P H P v = P H v, and B and the kept vectors are taken out in one pass
                product = product_of(current)
                vectors.wait()  # `spare` may be the row a spilled search is still writing
                r = spare  # the orthogonalized product goes here: ours to update, whatever hvp returns
                # The three-term recurrence: B and the vectors T couples the current one to (the previous
                # one, or after a thick restart the kept Ritz vectors) hold all of r but the rounding; a
                # second pass where they left overlaps above r's rounding. Rounding then makes r lose
                # orthogonality to the older vectors slowly, and Simon's recurrence says when: a pass over
                # all of them only then (partial reorthogonalization). At GPT-2 small that pass, made
                # every product, read every spilled vector and cost over a third of the product.
                # The current vector is taken from memory, not read back from the (maybe spilled) rows;
                # spilled, so is the previous one: `spare` still holds it. The first pass reads each block
                # of it before writing that block of r there; a second pass reads it from the file.
                # Two reads of a vector of D fewer a product (docs/performance.md, "Lanczos vectors").
                first = first_coupled(projected, used)
                current_row = (MemoryRows.of(current[None]), 1)
                older = [(Tail(vectors, first), used - 1 - first)]
                older_now = [(MemoryRows.of(spare[None]), 1)] if (spare_row == first == used - 2) else older
                local, beta = _orthogonalize(
                    r,
                    [*projection, *older_now, current_row],
                    source=product,
                    again_from=[*projection, *older, current_row],
                )
                del product
                alpha = float(local[-1])
                projected[used - 1, used - 1] = alpha
                # Simon's estimate of the new vector's overlaps with the kept ones: one pass over all of
                # them only when it passes √ε, or the pass before was made for that (his two in a row)
                coupled = local[len(local) - (used - first) : -1].cpu().numpy()
                asymmetry = np.abs(coupled - projected[first : used - 1, used - 1])  # H's rounding, seen
                noise = max(eps * scale, float(np.max(asymmetry, initial=0.0)))
                overlap = next_overlaps(projected[:used, :used], overlaps[:used, :used], first, beta, noise, eps)
                lost = bool(np.max(np.abs(overlap), initial=0.0) > semi_orthogonal)
                if again or lost:
                    coefficients, beta = _orthogonalize(r, [(vectors, used)])
                    # its corrections are rounding, left out of T, but for the diagonal
                    alpha += float(coefficients[-1])
                    projected[used - 1, used - 1] = alpha
                    overlap[:] = eps
                    passes += 1
                again = lost and not again
                if not (np.isfinite(alpha) and np.isfinite(beta)):
                    msg = (
                        f"Hessian-vector product {products} is not finite (NaN or inf): the loss or its "
                        "curvature overflows at these parameters; try --dtype float64, or leave this checkpoint out"
                    )
                    raise AnalysisError(msg)
                theta, ritz = eigh(projected[:used, :used])
                scale = max(scale, float(np.max(np.abs(theta))))
                invariant = beta <= 1e3 * float(torch.finfo(torch.float64).eps) * (scale or 1.0)
                top = np.argsort(theta)[::-1][:k]
                estimates = np.abs(beta * ritz[-1, top])  # ||A x - θ x|| of each Ritz pair (A V = V T + r e_lastᵀ)
                worst = float(np.max(estimates / np.maximum(np.abs(theta[top]), 1e-300))) if used >= k else np.inf
                if progress is not None:
                    progress(products, worst)
                if used >= k and (invariant or used == free or worst <= tolerance):
                    break
                # the next vector: the residual's direction, or (an invariant subspace smaller than k)
                # a new direction orthogonal to it, coupled to nothing
                coupling = 0.0 if invariant else beta
                previous = current
                if invariant:
                    current = random_unit(used)
                elif isinstance(vectors, MemoryRows) and used < room:
                    current = _divide(r, beta, out=vectors.data[used])  # the next row, written in this pass
                else:
                    current = _divide(r, beta)
                if not in_memory:
                    spare, spare_row = (r, None) if invariant else (previous, used - 1)
                del r, previous
                if invariant:
                    overlap[:] = eps  # random_unit orthogonalized it against everything, twice
                if used < room:
                    projected[used, used - 1] = projected[used - 1, used] = coupling
                    overlaps[used, :used] = overlaps[:used, used] = overlap
                    current = keep_row(used, current)
                    used += 1
                    continue
                # thick restart: A (V S) = (V S) Θ + r (e_lastᵀ S) keeps the best Ritz pairs exactly; the
                # rest of the room lets the recurrence grow again from the residual
                # k + 2, with at least one slot free to grow into; half the room only where that is less
                # (a complement too small for k + 4 vectors)
                keep = max(k, min(room - 1, (room + k) // 2, k + RITZ_VECTORS_BEYOND_K))
                order = np.argsort(theta)[::-1][:keep]
                _combine_in_place(vectors, used, torch.as_tensor(ritz[:, order].copy(), device=device), dimension)
                restart_recurrence(projected, overlaps, theta, ritz, order, overlap, used=used, coupling=coupling)
                current = keep_row(keep, current)
                spare_row = None  # its row was combined into the kept ones
                used = keep + 1
                restarts += 1
            else:
                msg = (
                    f"Lanczos did not converge to tol {tol} in {limit} Hessian-vector products "
                    f"(relative residual {worst:.1e}); raise --tol"
                )
                raise AnalysisError(msg)

        if products_done is not None:
            products_done()
        values = theta[top]
        combination = torch.as_tensor(ritz[:, top].T.copy(), device=device)  # [k, used]
        found = torch.empty(k, dimension, dtype=dtype, device=device)
        stacked = _Stacked([(vectors, used)], dimension, device)
        for columns in stacked.columns():
            found[:, columns] = (combination @ stacked.block(columns)).to(dtype)
        _orthonormalize_rows(found)
    finally:
        torch.set_num_threads(caller_threads)
        vectors.close()
    return Eigenpairs(values, found.cpu().numpy(), estimates.astype(np.float64), products, restarts, passes)


__all__ = [
    "CPU_DOT_BLOCK_BYTES",
    "DOT_BLOCK_BYTES",
    "MIN_VECTORS_BEYOND_K",
    "RITZ_VECTORS_BEYOND_K",
    "SPILLED_VECTORS",
    "Eigenpairs",
    "MemoryRows",
    "SpilledRows",
    "lanczos_bytes",
    "product_limit",
    "top_eigenpairs",
]

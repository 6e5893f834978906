"""What a Lanczos search costs: the vectors it needs room for, the bytes they take, its products.

The memory plans (``hessian-basis``'s :func:`ckpt.analyzers.hessian_basis.plan_search`)
size a search from these alone, before it runs; :func:`ckpt.numerics.lanczos.top_eigenpairs`
holds to them.
"""

from __future__ import annotations

DOT_BLOCK_BYTES = 16 * 2**20
"""Float64 scratch of one block of a chunked dot product or update on an accelerator (bounded whatever D is):
large, so that a pass over D launches few kernels."""
MIN_VECTORS_BEYOND_K = 4
"""A thick restart keeps k Ritz vectors and needs room to grow past them. With k + 2 vectors the top
eigenpair of a 1.7M-parameter GPT-2 (tol 1e-6) had not converged after 100 products; k + 4 took 56,
k + 6 43, k + 8 39, unbounded 35."""
RITZ_VECTORS_BEYOND_K = 2
"""Ritz vectors a thick restart keeps beyond the k wanted (the room allowing). Why not half the room, as
this module kept before: a restart reads every kept Lanczos vector and rewrites those it keeps,
and the product after it is orthogonalized against all of them, so keeping fewer makes restarts both
rarer and cheaper, at almost no cost in products. Products at tol 1e-6 on the Hessians of a 1.3M-parameter
GPT-2 at init, after 5 and after 20 AdamW steps, half the room against k + 2: k 1 with 9 vectors 35, 16,
24 against 35, 16, 25; k 1 with 7 37, 16, 26 against 37, 16, 27; k 2 with 10 57, 28, 32 against 57, 31,
32; k 4 with 12 71, 30, 36 against 71, 30, 37 (k + 1: up to 9 more; k + 3 no better than k + 2). With
vectors spilled, k + 2 cut a search's vector work per product by about a third, for the same eigenvalue
to 9 digits (docs/performance.md, "Lanczos vectors")."""
SPILLED_VECTORS = 3
"""Vectors of D a spilled search still holds in memory: the current Lanczos vector, the buffer each product
is copied into (the residual, then the next vector, in place) and the product as ``hvp`` returns it."""


def accelerator_block_width(rows: int, dimension: int) -> int:
    """Columns per block on an accelerator, so that ``rows`` of them in float64 take at most :data:`DOT_BLOCK_BYTES`."""
    return min(dimension, max(1, DOT_BLOCK_BYTES // (8 * max(rows, 1))))


def product_limit(free: int, k: int) -> int:
    """Most products one search may make before it gives up (:class:`AnalysisError`: raise ``--tol``)."""
    return min(free, max(100, 20 * k))


def lanczos_bytes(dimension: int, vectors: int, itemsize: int = 4, *, spilled: bool = False) -> int:
    """Bytes of a search that keeps ``vectors`` Lanczos vectors: those, the residual, the product and scratch.

    ``spilled``: the vectors live in a temporary file (:class:`ckpt.numerics.vector_rows.SpilledRows`) and only
    :data:`SPILLED_VECTORS` of them, and a block of the rest, are in memory at once.
    """
    width = accelerator_block_width(vectors, dimension)  # the larger blocks: a bound on any device
    # one block of rows in float64 (and, spilled, as read), and the block of x, of the update and of the result
    scratch = 8 * width * (vectors + 3) + (itemsize * width * vectors if spilled else 0)
    return (SPILLED_VECTORS if spilled else vectors + 2) * dimension * itemsize + scratch


__all__ = [
    "DOT_BLOCK_BYTES",
    "MIN_VECTORS_BEYOND_K",
    "RITZ_VECTORS_BEYOND_K",
    "SPILLED_VECTORS",
    "accelerator_block_width",
    "lanczos_bytes",
    "product_limit",
]

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

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._hessian_journal import (
    SEARCH_COLUMNS,
    journal_basis,
    journal_tensors,
    lazy_tensors,
    saved_eigenpairs,
    search_dataset,
)
from ckpt.analyzers._hessian_plan import (
    BASIS_BLOCK_BYTES,
    FIXED_VECTORS,
    GRAPH_AT_REST,
    GRAPH_PEAK,
    PREFERRED_EXTRA_VECTORS,
    REBUILT_PEAK,
    SearchPlan,
    check_the_run_fits,
    plan_search,
)
from ckpt.analyzers._hessian_search import earlier_basis, eigenvectors_at, graph_growth, hessian_operator
from ckpt.analyzers.basis import ComputeOptions, HessianOptions, basis_steps, check_basis_size, sample_examples
from ckpt.numerics.basis_format import BASIS_DIM, FOUND_AT, basis_problem
from ckpt.numerics.derivatives import ParamSpace
from ckpt.plugins import PER_RUN, AnalysisContext, Analyzer, Option, parameter_space
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


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

    def recomputes_at(self, step: int) -> bool:
        """Whether a new checkpoint at ``step`` grows the basis (a follower recomputes it then): a basis checkpoint."""
        if self.at_steps:
            return step in {int(part) for part in str(self.at_steps).replace(" ", "").split(",") if part.isdigit()}
        return self.every is None or step % self.every == 0

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
            tensors = lazy_tensors(pieces, space, k, dtype)
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


ckpt_register_analyzers = analyzer_hook(HessianBasis)


__all__ = [
    "BASIS_BLOCK_BYTES",
    "FIXED_VECTORS",
    "GRAPH_AT_REST",
    "GRAPH_PEAK",
    "PREFERRED_EXTRA_VECTORS",
    "REBUILT_PEAK",
    "SEARCH_COLUMNS",
    "HessianBasis",
    "SearchPlan",
    "check_the_run_fits",
    "ckpt_register_analyzers",
    "earlier_basis",
    "eigenvectors_at",
    "graph_growth",
    "hessian_operator",
    "journal_basis",
    "journal_tensors",
    "plan_search",
    "saved_eigenpairs",
    "search_dataset",
]

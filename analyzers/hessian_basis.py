"""``hessian-basis``: a basis of the training subspace from Hessian eigenvectors (Hidden Breakthroughs, Algorithm 1).

Start with an empty basis B. At each basis checkpoint t (``--every`` /
``--at-steps``, in step order; ``--order shuffled`` visits them in a seeded
random order, the paper's shuffled-checkpoint ablation), take the Hessian H_t of the mean loss over a seeded subsample
of a split (``--samples`` examples of ``--hessian-split``), restrict it to the
orthogonal complement of B in the symmetric form P H_t P, P = I - B Bᵀ, and
append its top ``-k`` eigenvectors to B.

Hessian-vector products differentiate each data block's gradient graph,
built once per checkpoint, again along the vector (reverse over reverse,
:class:`ckpt.plugins.MeanLossHessian`); the eigenvectors come from Lanczos
with full reorthogonalization (:func:`ckpt.plugins.top_eigenpairs`), which tests
convergence after every product and takes the residuals from the products it
kept: the products are almost all of the time (bench/polca.py). The checkpoints depend on each other
(each needs the basis so far), so the Dask graph is a chain of one task per
basis checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import ComputeOptions, HessianOptions, basis_steps, sample_examples
from ckpt.errors import AnalysisError
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    Analyzer,
    MeanLossHessian,
    Option,
    ParamSpace,
    Worker,
    basis_dims,
    chunks,
    datapoint_index,
    hookimpl,
    loss_function,
    parameter_space,
    top_eigenpairs,
    torch_dtype,
    trainable,
)

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure


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
) -> dict[str, np.ndarray]:
    """Top-k eigenpairs of P H_step P against the vectors found at earlier checkpoints (on a worker)."""
    import torch

    precision = torch_dtype(dtype)
    params = worker.params(step)
    primal = trainable(params, space, dtype)
    example_of, _ = datapoint_index(worker.store, split, objective)
    datapoints = int(np.isin(example_of, examples).sum())
    if datapoints == 0:
        msg = f"the Hessian subsample of split {split!r} has no datapoints"
        raise ValueError(msg)
    fs = [
        (
            loss_function(
                worker, params, space, split=split, examples=examples[rows], objective=objective, dtype=dtype
            ),
            1.0 / datapoints,
        )
        for rows in chunks(len(examples), batch_size)
    ]
    found = [torch.as_tensor(p["vectors"]) for p in previous]
    basis = torch.cat(found).to(device=worker.device, dtype=precision) if found else None

    hessian = MeanLossHessian(fs, primal)

    def hvp(v: Any) -> Any:
        return space.flatten(hessian(space.unflatten(v)))

    try:
        pairs = top_eigenpairs(
            hvp, space.size, k, basis=basis, tol=tol, seed=seed + step, dtype=precision, device=worker.device
        )
    except AnalysisError as exc:
        if "is not finite" not in str(exc):
            raise
        bad = [name for name, value in params.items() if value.is_floating_point() and not bool(value.isfinite().all())]
        cause = (
            f"the weights at this step hold NaN or inf ({', '.join(repr(n) for n in bad[:5])})"
            if bad
            else "the weights are finite, so the loss or its curvature overflows there"
        )
        msg = f"hessian-basis at the checkpoint of step {step}: {exc}; {cause}"
        raise AnalysisError(msg) from None
    return {
        "vectors": pairs.vectors,
        "eigenvalue": pairs.values.astype(np.float64),
        "residual": pairs.residuals.astype(np.float64),
        "matvecs": np.full(k, pairs.matvecs, np.int64),
    }


class HessianBasis(HessianOptions, ComputeOptions, Analyzer):
    """Top Hessian eigenvectors found checkpoint by checkpoint, each orthogonal to those before."""

    name = "hessian-basis"
    version = "1"
    description = "Basis of top Hessian eigenvectors grown over the run (POLCA's Algorithm 1)."
    per = PER_RUN

    split = Option(str, "eval", "Split for the Hessian when --hessian-split is not given and no train split exists.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")

    def hessian_split(self, store: Any) -> str:
        """``--hessian-split``, else ``train`` when the store has it, else ``--split``."""
        if self.options["hessian_split"]:
            return str(self.options["hessian_split"])
        return "train" if "train" in store.splits else str(self.options["split"])

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """A chain of one Dask task per basis checkpoint; the vectors split back into tensors."""
        import dask.array as da
        import xarray as xr

        store = ctx.store
        space = parameter_space(store)
        steps = basis_steps(store, self.every, self.at_steps)
        if self.order == "shuffled":  # the same checkpoints, each deflated against those visited before it
            steps = [int(s) for s in np.random.default_rng(self.seed).permutation(steps)]
        split = self.hessian_split(store)
        if split not in store.splits:
            from ckpt.plugins import AnalysisError

            msg = f"{store.path} has no data split {split!r}; its splits: {', '.join(store.splits) or '(none)'}"
            raise AnalysisError(msg)
        examples = sample_examples(store.data(split).sizes["example"], self.samples, self.seed)
        numpy_dtype = np.dtype(self.dtype)
        pieces: list[Any] = []
        for step in steps:
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
                )
            )
        k, size = self.k, space.size

        def column(key: str, shape: tuple[int, ...], dtype: Any) -> Any:
            return da.concatenate([da.from_delayed(p[key], shape=shape, dtype=dtype) for p in pieces])

        vectors = column("vectors", (k, size), numpy_dtype)
        variables: dict[str, Any] = {}
        for name, shape, start, length in zip(space.names, space.shapes, space.offsets, space.sizes, strict=True):
            variables[name] = (basis_dims(name, len(shape)), vectors[:, start : start + length].reshape(-1, *shape))
        variables["eigenvalue"] = ("basis", column("eigenvalue", (k,), np.float64))
        variables["residual"] = ("basis", column("residual", (k,), np.float64))
        variables["matvecs"] = ("basis", column("matvecs", (k,), np.int64))
        found_at = np.repeat(np.asarray(steps, np.int64), k)
        result = xr.Dataset(variables, coords={"basis": np.arange(len(found_at)), "found_at_step": ("basis", found_at)})
        result["eigenvalue"].attrs["description"] = (
            "eigenvalue of P H P at found_at_step (P: complement of earlier vectors)"
        )
        result["residual"].attrs["description"] = "||P H P v - eigenvalue v||"
        result.attrs["hessian_split"] = split
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``eigenvalues``: eigenvalue and residual of each vector against the step it was found at."""
        from ckpt.analyzers.figures.basis import basis_figures

        return basis_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """One line per basis vector: where it was found, its eigenvalue and residual."""
        rows = [f"  {'basis':>5}  {'found at':>9}  {'eigenvalue':>12}  {'residual':>10}"]
        for i in range(result.sizes["basis"]):
            rows.append(
                f"  {i:>5}  {int(result['found_at_step'][i]):>9}  {float(result['eigenvalue'][i]):>12.5g}"
                f"  {float(result['residual'][i]):>10.3g}"
            )
        return "\n".join(rows)


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register ``hessian-basis``."""
    register(HessianBasis)

"""``curvature``: the sharpness of the loss per module and of the whole model, at every checkpoint.

Clustering Head §4.3 traces loss spikes to regions of high curvature (the
normalisation near the origin, Fig. 12; the MLP near its decision boundaries,
Fig. 13-14). This analyzer measures where the curvature sits: at checkpoint t,
for each module m, the top (largest algebraic) eigenvalue of H_mm, the block of
the Hessian of the mean loss over a split that belongs to m's parameters (the
other parameters held fixed), and the top eigenvalue of the whole Hessian H.
By Cauchy's interlacing theorem λ_max(H_mm) <= λ_max(H): a module whose block
comes close to the whole carries the sharpest direction.

Gradient descent with step η is stable along a direction of curvature λ only
while λ < 2/η (the "edge of stability" of Cohen et al., which the paper relates
its spikes to); the figure draws that line when η is known (``--lr``, or a
learning-rate metric the run stored). Under Adam, which the sandboxes train
with, the threshold applies to the preconditioned Hessian instead: the line is
a reference, not a verdict.

Each top eigenvalue comes from Lanczos with partial reorthogonalization on
Hessian-vector products (:func:`ckpt.numerics.lanczos.top_eigenpairs` and
:class:`ckpt.numerics.derivatives.MeanLossHessian`, as in ``hessian-basis``) over the
:class:`ckpt.numerics.derivatives.ParamSpace` of the module's parameters alone; a block of one
parameter is its single Hessian entry. The Hessian is that of the mean loss over
``--samples`` seeded examples of ``--split``.

Memory: per module the plan of ``hessian-basis`` with k = 1 (kept gradient
graphs of the subsample when they fit beside the Lanczos vectors, else graphs
rebuilt per product in blocks), one module at a time; an impossible budget is an
error naming ``--max-memory``. One Dask task per checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import sample_examples
from ckpt.analyzers.hessian_basis import graph_growth, hessian_operator, plan_search
from ckpt.analyzers.spike_causes import check_model_and_split, learning_rates
from ckpt.engine.memory import format_size
from ckpt.numerics.derivatives import DTYPES, ParamSpace
from ckpt.numerics.lanczos import top_eigenpairs
from ckpt.numerics.lanczos_sizes import product_limit
from ckpt.plugins import (
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    datapoint_index,
    loss_function,
    parameter_space,
    select_modules,
    torch_dtype,
    trainable,
)
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

MODEL = "(model)"
"""Label of the whole model in messages."""


def module_blocks(model: Any, space: ParamSpace, patterns: str | None) -> list[tuple[str, ParamSpace]]:
    """The modules whose Hessian blocks are measured, each with the trainable tensors it owns.

    Default: every top-level child module owning trainable parameters; with ``patterns``
    (``--modules``), the modules they match. A tensor shared by two modules (tied
    weights) is registered under the first, as ``named_parameters`` lists it.

    Raises
    ------
    AnalysisError
        When a pattern matches no module, a chosen module owns no trainable parameter,
        or (by default) no child module does.
    """
    names = select_modules(model, patterns) if patterns else [name for name, _ in model.named_children()]
    blocks = []
    for name in names:
        owned = [i for i, tensor in enumerate(space.names) if tensor.startswith(name + ".")]
        if owned:
            blocks.append(
                (name, ParamSpace(tuple(space.names[i] for i in owned), tuple(space.shapes[i] for i in owned)))
            )
        elif patterns:
            msg = f"--modules: module {name!r} has no trainable parameters; choose modules that own some"
            raise AnalysisError(msg)
    if not blocks:
        msg = f"the model ({type(model).__name__}) has no child module with trainable parameters: pass --modules"
        raise AnalysisError(msg)
    return blocks


def top_curvature(
    worker: Worker,
    step: int,
    params: dict[str, Any],
    space: ParamSpace,
    what: str,
    *,
    split: str,
    examples: np.ndarray,
    datapoints: int,
    objective: str | None,
    tol: float,
    seed: int,
    batch_size: int,
    dtype: str,
) -> tuple[float, float, int]:
    """(top eigenvalue, residual, products) of the mean-loss Hessian restricted to ``space`` at ``step``."""
    import torch

    precision = torch_dtype(dtype)
    primal = trainable(params, space, dtype)

    def block_loss(rows: np.ndarray) -> Any:
        return loss_function(worker, params, space, split=split, examples=rows, objective=objective, dtype=dtype)

    try:
        plan = plan_search(
            worker.memory_budget,
            space.size,
            1,
            0,
            len(examples),
            batch_size,
            graph_growth(block_loss, examples, primal),
            precision.itemsize,
            product_limit(space.size, 1),
            can_spill=str(worker.device) == "cpu",
        )
    except AnalysisError:
        msg = (
            f"curvature of {what} ({space.size:,} parameters) at step {step} does not fit the memory budget of "
            f"{format_size(worker.memory_budget)} per task, even one example at a time with the fewest Lanczos "
            "vectors: raise --max-memory"
        )
        raise AnalysisError(msg) from None
    hessian = hessian_operator(plan, block_loss, examples, 1.0 / datapoints, primal, batch_size)

    hvp = hessian.flat(space)

    if space.size == 1:  # a 1x1 Hessian is its own eigenvalue (Lanczos needs a complement of k + 1)
        return float(hvp(torch.ones(1, dtype=precision, device=worker.device))[0]), 0.0, 1
    pairs = top_eigenpairs(
        hvp,
        space.size,
        1,
        tol=tol,
        seed=seed + step,
        dtype=precision,
        device=worker.device,
        max_vectors=plan.vectors,
        spill=plan.spill,
        products_done=hessian.release,  # the eigenvector is formed without the graphs, as the plan counts it
    )
    value = float(pairs.values[0])
    if not np.isfinite(value):
        msg = f"curvature of {what} at step {step} is not finite; try --dtype float64"
        raise AnalysisError(msg)
    return value, float(pairs.residuals[0]), int(pairs.matvecs)


def curvature_at(
    worker: Worker,
    step: int,
    *,
    blocks: list[tuple[str, ParamSpace]],
    space: ParamSpace,
    rates: dict[int, float],
    **search: Any,
) -> dict[str, np.ndarray]:
    """Top Hessian eigenvalue of each module's block and of the whole model at ``step`` (on a worker)."""
    params = worker.params(step)
    found = [top_curvature(worker, step, params, block, name, **search) for name, block in blocks]
    whole = top_curvature(worker, step, params, space, MODEL, **search)
    return {
        "eigenvalue": np.array([f[0] for f in found], np.float64),
        "residual": np.array([f[1] for f in found], np.float64),
        "matvecs": np.array([f[2] for f in found], np.int64),
        "model_eigenvalue": np.array(whole[0], np.float64),
        "model_residual": np.array(whole[1], np.float64),
        "model_matvecs": np.array(whole[2], np.int64),
        "learning_rate": np.array(rates[step], np.float64),
    }


class Curvature(Analyzer):
    """Top Hessian eigenvalue of the mean loss per module block and for the whole model, per checkpoint."""

    name = "curvature"
    version = "1"
    description = "Top Hessian eigenvalue per module block and of the whole model, per checkpoint, against 2/lr."

    modules = Option(str, None, "Modules whose parameter blocks are measured, names or globs (default: top-level).")
    split = Option(str, None, "Split the Hessian is taken over (default: train when stored, else eval).")
    samples = Option(int, 1250, "Examples subsampled for the Hessian.", minimum=1)
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    lr = Option(float, None, "Learning rate for the 2/lr line (default: the store's lr metric, if any).", minimum=0)
    tol = Option(float, 1e-6, "Lanczos stops when the residual is below tol times the eigenvalue.", minimum=0)
    seed = Option(int, 0, "Seed of the data subsample and the Lanczos start vectors.", minimum=0)
    dtype = Option(str, "float32", "Precision of the computation.", choices=DTYPES)
    batch_size = Option(int, 256, "Examples per forward pass (bounds memory).", minimum=1)

    def hessian_split(self, store: Any) -> str:
        """``--split``, else ``train`` when the store has it, else ``eval``."""
        if self.split:
            return str(self.split)
        return "train" if "train" in store.splits else "eval"

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """Only the Hessian's split."""
        return (self.hessian_split(store),)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; the module blocks are resolved on the model built here."""
        store = ctx.store
        split = self.hessian_split(store)
        check_model_and_split(store, split, self.name)
        model = store.model.build()
        space = parameter_space(store, model)
        blocks = module_blocks(model, space, self.modules)
        examples = sample_examples(store.data(split).sizes["example"], self.samples, self.seed)
        example_of, _ = datapoint_index(store, split, self.objective)
        datapoints = int(np.isin(example_of, examples).sum())
        if datapoints == 0:
            msg = f"the Hessian subsample of split {split!r} has no datapoints; raise --samples or choose --split"
            raise AnalysisError(msg)
        rates = learning_rates(store, list(ctx.steps), self.lr, analyzer=self.name, required=False)
        names = [name for name, _ in blocks]
        result = ctx.map_checkpoints(
            curvature_at,
            {
                "eigenvalue": (("module",), np.float64),
                "residual": (("module",), np.float64),
                "matvecs": (("module",), np.int64),
                "model_eigenvalue": ((), np.float64),
                "model_residual": ((), np.float64),
                "model_matvecs": ((), np.int64),
                "learning_rate": ((), np.float64),
            },
            sizes={"module": len(blocks)},
            coords={
                "module": np.array(names, dtype=object),
                "parameters": ("module", np.array([block.size for _, block in blocks], np.int64)),
            },
            blocks=blocks,
            space=space,
            rates=rates,
            split=split,
            examples=examples,
            datapoints=datapoints,
            objective=self.objective,
            tol=self.tol,
            seed=self.seed,
            batch_size=self.batch_size,
            dtype=self.dtype,
        )
        mean = f"the mean loss over {len(examples)} examples of split {split!r}"
        result["eigenvalue"].attrs.update(
            long_name="top Hessian eigenvalue of the module's block",
            description=f"largest eigenvalue of the block of the Hessian of {mean} on the module's parameters",
        )
        result["model_eigenvalue"].attrs.update(
            long_name="top Hessian eigenvalue", description=f"largest eigenvalue of the Hessian of {mean}"
        )
        for name in ("residual", "model_residual"):
            result[name].attrs["description"] = "||H v - eigenvalue v|| of the eigenvector found"
        for name in ("matvecs", "model_matvecs"):
            result[name].attrs["description"] = "Hessian-vector products used"
        source = "--lr" if self.lr is not None else "the store's learning-rate metric (NaN: none stored)"
        result["learning_rate"].attrs.update(
            long_name="learning rate η", description=f"from {source}; gradient descent is stable below 2/η"
        )
        result["parameters"].attrs["description"] = "trainable parameters in the module's block"
        result.attrs["hessian_split"] = split
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``sharpness``: each block's and the whole model's top eigenvalue over steps, with 2/η."""
        from ckpt.analyzers.figures.spike_causes import curvature_figures

        return curvature_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Top eigenvalue per module and of the model at the first and last checkpoints."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        modules = [str(m) for m in result["module"].values]
        width = max(8, *(len(m) for m in modules))
        rows = [
            f"  {'module':<{width}}  {'params':>8}" + "".join(f"  {'step ' + str(int(s)):>12}" for s in steps[[0, -1]])
        ]
        for i, module in enumerate(modules):
            cells = "".join(f"  {result['eigenvalue'].values[j, i]:>12.5g}" for j in (0, -1))
            rows.append(f"  {module:<{width}}  {int(result['parameters'].values[i]):>8}{cells}")
        cells = "".join(f"  {result['model_eigenvalue'].values[j]:>12.5g}" for j in (0, -1))
        rows.append(f"  {MODEL:<{width}}  {'':>8}{cells}")
        eta = result["learning_rate"].values[[0, -1]]
        if np.isfinite(eta).all():
            rows.append(f"  {'2/η':<{width}}  {'':>8}" + "".join(f"  {2 / e:>12.5g}" for e in eta))
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Curvature)


__all__ = ["MODEL", "Curvature", "ckpt_register_analyzers", "curvature_at", "module_blocks", "top_curvature"]

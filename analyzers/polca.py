"""``polca``: Projection Oriented Loss Change Allocation (Hidden Breakthroughs in Language Model Training).

For each pair of consecutive checkpoints (θ_t, θ_t+1), each vector b of the
final basis (also for transitions before b was found, as in the paper) and
each datapoint x, with Δ = θ_t+1 - θ_t and g_t(x) = ∇ℓ(x; θ_t):

- ``first_order`` = ⟨b, g_t(x)⟩ · ⟨b, Δ⟩
- ``second_order`` (``--second-order paper``, the paper's approximation)
  = (λ_t(X,b) / 2) · ⟨Δ, b⟩² · ⟨g_t+1(x) - g_t(x), b⟩ / ⟨g_t+1(X) - g_t(X), b⟩,
  with λ_t(X,b) = bᵀ H_t(X) b over the analysed datapoints X (g(X): mean
  gradient). When the denominator vanishes against the datapoints' own
  changes (|⟨g_t+1(X) - g_t(X), b⟩| <= ``--ratio-guard`` · mean_x
  |⟨g_t+1(x) - g_t(x), b⟩|), the ratio is replaced by 1: every datapoint gets
  the mean second-order term λ/2 · ⟨Δ, b⟩², so that the terms still sum to the
  mean loss's second-order term over the datapoints.
- ``--second-order exact``: (1/2) · bᵀ H_t(x) b · ⟨Δ, b⟩², the true
  per-datapoint term, from a nested JVP; ``none``: first order only.
- ``polca`` = first + second order; ``projected_loss`` = its running sum over
  steps: at the step of transition θ_i → θ_(i+1) it is L_b(x, θ_(i+1)) of the
  paper's eq. 10, the loss change along b accumulated to the end of that
  transition (L_b(x, θ_0) = 0 is not stored); ``loss_change`` = ℓ(x; θ_t+1) - ℓ(x; θ_t) and
  ``unexplained`` = loss_change - Σ_b polca.

The ``step`` of a transition θ_t → θ_t+1 is t. Every checkpoint's quantities
(loss, ⟨g(x), b⟩ and, where a pair starts, bᵀH(x)b for all x and b) are
computed once, by one JVP pass vectorized over the basis vectors
(``torch.func.vmap`` shares the primal), and used by both pairs that contain
it; ⟨b, Δ⟩ comes from the two checkpoints' weights in float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers._polca_plan import (
    CPU_TOKEN_VECTORS,
    PASS_PEAK,
    PREFERRED_EXAMPLES,
    PassCost,
    PassPlan,
    cpu_tokens,
    measure_passes,
    plan_basis,
    plan_passes,
)
from ckpt.analyzers.basis import BasisReader
from ckpt.engine.memory import format_size
from ckpt.numerics.basis_format import (
    BASIS_DIM,
    FOUND_AT,
    check_basis,
    held_basis,
    load_basis,
    load_basis_rows,
    stored_basis,
)
from ckpt.numerics.compiled import directional_derivatives
from ckpt.numerics.derivatives import ParamSpace
from ckpt.plugins import (
    PER_PAIR,
    AnalysisContext,
    Analyzer,
    Option,
    Worker,
    chunks,
    datapoint_index,
    loss_function,
    parameter_space,
    torch_dtype,
    trainable,
)
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

SECOND_ORDER = ("paper", "exact", "none")


def worker_space(worker: Worker) -> ParamSpace:
    """The parameter space of the worker's store (cached per worker)."""
    return worker.cached(("parameter-space",), lambda: parameter_space(worker.store, worker.model))


def checkpoint_terms(
    worker: Worker,
    step: int,
    *,
    examples: slice,
    basis: str,
    created: str,
    split: str,
    objective: str | None,
    order: int,
    batch_size: int,
    basis_batch: int,
    dtype: str,
    first_order_at: tuple[int, ...] = (),
    compiled: bool = False,
) -> dict[str, np.ndarray]:
    """Loss, ⟨g(x), b⟩ and (order 2) bᵀH(x)b of the datapoints of ``examples`` at ``step`` (on a worker).

    At the steps of ``first_order_at`` (checkpoints that only end a pair, whose
    curvature no term uses) order 2 is lowered to 1 and bᵀH(x)b is returned as 0.
    The passes take as many examples and vectors as the task's memory budget
    allows (:func:`plan_basis`), ``batch_size`` and ``basis_batch`` at most, with
    the whole basis held or each pass's vectors read for it.
    """
    import torch

    if step in first_order_at:
        order = 1

    space = worker_space(worker)
    count = int(stored_basis(worker, basis, created).sizes[BASIS_DIM])
    params = worker.params(step)
    primal = trainable(params, space, dtype)
    start, stop, _ = examples.indices(len(worker.data(split)["inputs"]))

    def f_of(rows: slice) -> Any:
        begin, end, _ = rows.indices(stop - start)
        block = slice(start + begin, start + end)
        return loss_function(worker, params, space, split=split, examples=block, objective=objective, dtype=dtype)

    itemsize = torch_dtype(dtype).itemsize
    # the worker's two cached checkpoints (widened to float32), θ in --dtype where it is a copy
    checkpoints = space.size * (2 * 4 + (itemsize if itemsize != 4 else 0))
    with worker.computing():
        # the pass's bytes depend on the shapes only: measured once per worker, order and data
        cost = worker.cached(
            ("polca-pass-cost", split, objective, order, dtype, min(3, stop - start), min(2, count)),
            lambda: measure_passes(
                f_of,
                stop - start,
                primal,
                basis_directions(worker, basis, created, space, dtype, slice(0, 2), held=False),
                order,
            ),
        )
        plan = plan_basis(
            worker.memory_budget,
            checkpoints,
            cost,
            direction_bytes=space.size * itemsize,
            examples=stop - start,
            vectors=count,
            batch_size=batch_size,
            basis_batch=basis_batch,
            tokens=cpu_tokens(worker, split, objective),
        )
        blocks = list(chunks(stop - start, plan.block_examples))
        batches = list(chunks(count, plan.vectors))
        held = "basis held" if plan.basis_held else "basis read per pass"
        postfix = f"{plan.block_examples} examples x {plan.vectors} vectors a pass, {held}"
        postfix += f", ~{format_size(plan.estimate)}"
        total = len(blocks) * len(batches)
        losses: list[Any] = []
        first_rows, second_rows = [], []
        with worker.progress_bar(f"polca step {step}", unit="pass", total=total, postfix=postfix) as bar:
            # vectors outer, examples inner: a basis read a batch at a time is read once per checkpoint
            for vectors in batches:
                part = basis_directions(worker, basis, created, space, dtype, vectors, held=plan.basis_held)
                first_parts, second_parts, losses = [], [], []  # every pass gives the loss: the last one's kept
                for rows in blocks:
                    loss, first, second = directional_derivatives(
                        f_of(rows), primal, part, order=order, compiled=compiled
                    )
                    losses.append(loss)
                    first_parts.append(first)
                    if second is not None:
                        second_parts.append(second)
                    bar.update(1)
                del part
                first_rows.append(torch.cat(first_parts, dim=1))
                if second_parts:
                    second_rows.append(torch.cat(second_parts, dim=1))
    first_all = torch.cat(first_rows).double().cpu().numpy()
    second_all = torch.cat(second_rows).double().cpu().numpy() if second_rows else np.zeros_like(first_all)
    return {"loss": torch.cat(losses).double().cpu().numpy(), "first": first_all, "second": second_all}


def basis_directions(
    worker: Worker, basis: str, created: str, space: ParamSpace, dtype: str, vectors: slice, *, held: bool = True
) -> dict[str, Any]:
    """Basis vectors ``vectors`` as ``{tensor: [vectors, *shape]}``: views of the basis the worker holds, or read now.

    ``held``: from the whole basis, read once and held for the worker's life (:func:`load_basis`);
    else only these vectors, read from the store (:func:`load_basis_rows`) and dropped after their passes.
    """
    if held:
        return {name: tensor[vectors] for name, tensor in load_basis(worker, basis, created, space, dtype).items()}
    return load_basis_rows(worker, basis, created, space, vectors, dtype)


def recent_checkpoint_terms(worker: Worker, step: int, **options: object) -> dict[str, np.ndarray]:
    """:func:`checkpoint_terms`, reused when this worker computed them for the previous block of pairs.

    A block of pairs ends at the checkpoint the next block starts from; the
    worker keeps its last few checkpoints' terms instead of recomputing them.
    """
    examples = options["examples"]
    assert isinstance(examples, slice)
    key = (
        "polca-terms",
        step,
        examples.start,
        examples.stop,
        *sorted((k, v) for k, v in options.items() if k != "examples"),
    )
    return worker.recent(key, lambda: checkpoint_terms(worker, step, **options))  # type: ignore[arg-type]


PROJECTION_BLOCK = 1 << 22
"""Parameters per block of ⟨Δ, b⟩: the float64 copies are K·32 MiB at most, not K·8·D bytes (at GPT-2
small, 4 vectors of the 38.6M-entry embedding were 1.2 GB of float64 copies beside a running pass)."""
PROJECTION_ROWS_BYTES = 64 * 2**20
"""Bytes of one tensor's basis rows a projection takes at a time (at least one row): read from the store
where the worker does not hold the whole basis (a basis larger than memory), sliced from it where it does,
with the same arithmetic both ways."""


def step_projections(
    worker: Worker, step: int, next_step: int, *, basis: str, created: str, dtype: str
) -> dict[str, np.ndarray]:
    """⟨θ_next - θ_step, b⟩ for every basis vector, accumulated in float64 (on a worker).

    The basis is taken from the worker where a checkpoint's passes hold it whole
    (:func:`plan_basis`), else read a few rows of one tensor at a time: it is never loaded whole here.
    """
    import torch

    space = worker_space(worker)
    whole = held_basis(worker, basis, created, dtype)
    count = int(stored_basis(worker, basis, created).sizes[BASIS_DIM])
    before, after = worker.params(step), worker.params(next_step)
    total = torch.zeros(count, dtype=torch.float64, device=worker.device)
    itemsize = torch_dtype(dtype).itemsize
    with worker.computing():  # its copies are not made while another thread's pass holds its peak
        for name, size in zip(space.names, space.sizes, strict=True):
            start_flat, end_flat = before[name].reshape(-1), after[name].reshape(-1)
            for rows in chunks(count, max(1, PROJECTION_ROWS_BYTES // max(1, size * itemsize))):
                if whole is not None:
                    vectors = whole[name][rows].reshape(rows.stop - rows.start, -1)
                else:
                    read = load_basis_rows(worker, basis, created, space, rows, dtype, tensors=[name])[name]
                    vectors = read.reshape(rows.stop - rows.start, -1)
                for block in chunks(len(start_flat), PROJECTION_BLOCK):
                    # in float64, where the difference of two float32 weights is exact (a float32
                    # difference was off by up to 6e-8 relative on the tiny MLP of the tests)
                    delta = end_flat[block].double() - start_flat[block].double()
                    total[rows] += vectors[:, block].double() @ delta.to(total.device)
    return {"delta": total.cpu().numpy()}


class Polca(OneSplit, BasisReader, Analyzer):
    """Per-datapoint loss change allocated to the directions of a basis."""

    name = "polca"
    version = "1"
    description = "POLCA: per-datapoint loss change projected on a (Hessian) basis, per checkpoint pair."
    requires = ("hessian-basis",)
    per = PER_PAIR
    running_sums = {"projected_loss": "polca"}  # noqa: RUF012 (a ClassVar of the base class)

    split = Option(str, "eval", "Data split whose datapoints are analysed.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    second_order = Option(
        str, "paper", "Second-order term: the paper's approximation, exact, or none.", choices=SECOND_ORDER
    )
    ratio_guard = Option(
        float, 1e-3, "Paper second order: ratio replaced by 1 when its denominator is this small.", minimum=0
    )
    basis_batch = Option(int, 8, "Basis vectors per vectorized JVP pass (bounds memory).", minimum=1)
    compile = Option(
        bool,
        False,
        "Run the JVP pass as one torch.compile'd program per shape: 2.3x faster second order on a CPU, "
        "~80 s to compile per worker (pays from ~50 checkpoints).",
    )
    block_examples = Option(int, 8192, "Examples per Dask task.", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """Per-checkpoint terms once per checkpoint, combined lazily into per-pair POLCA."""
        import xarray as xr

        basis = ctx.result(self.basis)
        space = parameter_space(ctx.store)
        count = check_basis(basis, space, self.basis)
        created = str(basis.ckpt.created or "")
        example, position = datapoint_index(ctx.store, self.split, self.objective)
        pairs = ctx.steps
        following = [ctx.next_step(s) for s in pairs]
        needed = sorted(set(pairs) | set(following))
        shared = {"basis": self.basis, "created": created}
        terms = ctx.map_checkpoints(
            recent_checkpoint_terms,
            {
                "loss": (("datapoint",), np.float64),
                "first": (("basis", "datapoint"), np.float64),
                "second": (("basis", "datapoint"), np.float64),
            },
            sizes={"basis": count, "datapoint": len(example)},
            datapoint_blocks=ctx.datapoint_blocks(self.split, self.objective, self.block_examples),
            steps=needed,
            split=self.split,
            objective=self.objective,
            order=1 if self.second_order == "none" else 2,
            batch_size=self.batch_size,
            basis_batch=self.basis_batch,
            dtype=self.dtype,
            compiled=self.compile,
            # a checkpoint that starts no pair (the run's last) needs no curvature: for a single
            # pair this halves the second-order work
            first_order_at=tuple(sorted(set(following) - set(pairs))),
            **shared,
        )
        delta = ctx.map_pairs(
            step_projections, {"delta": (("basis",), np.float64)}, sizes={"basis": count}, dtype=self.dtype, **shared
        )["delta"]
        index = {s: i for i, s in enumerate(needed)}
        at_t = terms.isel(step=[index[s] for s in pairs]).assign_coords(step=pairs)
        at_next = terms.isel(step=[index[s] for s in following]).assign_coords(step=pairs)
        first_order = at_t["first"] * delta
        second_order = self._second_order(at_t, at_next, delta)
        polca = first_order + second_order
        loss_change = at_next["loss"] - at_t["loss"]
        result = xr.Dataset(
            {
                "polca": polca,
                "first_order": first_order,
                "second_order": second_order,
                "loss_change": loss_change,
                "unexplained": loss_change - polca.sum("basis"),
                "step_projection": delta,
                "curvature": at_t["second"].mean("datapoint"),
            },
            coords={
                "example": ("datapoint", example),
                "position": ("datapoint", position),
                FOUND_AT: basis[FOUND_AT].variable,  # lazy (a dask-backed coordinate)
            },
        )
        self._describe(result)
        return result

    def _second_order(self, at_t: xr.Dataset, at_next: xr.Dataset, delta: xr.DataArray) -> xr.DataArray:
        import xarray as xr

        if self.second_order == "none":
            return xr.zeros_like(at_t["first"])
        if self.second_order == "exact":
            return 0.5 * at_t["second"] * delta**2
        curvature = at_t["second"].mean("datapoint")  # λ_t(X, b) = bᵀ H_t(X) b, H of the mean loss
        change = at_next["first"] - at_t["first"]
        denominator = change.mean("datapoint")
        sound = abs(denominator) > self.ratio_guard * abs(change).mean("datapoint")
        ratio = xr.where(sound, change / denominator.where(sound), 1.0)
        return 0.5 * curvature * delta**2 * ratio

    def _describe(self, result: xr.Dataset) -> None:
        descriptions = {
            "polca": "first_order + second_order: loss change of the datapoint allocated to basis vector b",
            "first_order": "<b, grad loss(x; theta_t)> <b, theta_t+1 - theta_t>",
            "second_order": f"second-order term ({self.second_order})",
            "loss_change": "loss(x; theta_t+1) - loss(x; theta_t)",
            "unexplained": "loss_change - sum of polca over the basis",
            "step_projection": "<theta_t+1 - theta_t, b>",
            "curvature": "b^T H_t(X) b over the analysed datapoints",
        }
        for name, text in descriptions.items():
            result[name].attrs["description"] = text

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``trajectories`` (projected loss per basis vector) and ``explained`` (loss change left unexplained)."""
        from ckpt.analyzers.figures.basis import polca_figures

        return polca_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Per basis vector: where it was found and its total POLCA; how much of the loss change the basis explains."""
        total_change = float(result["loss_change"].sum("step").mean("datapoint"))
        per_vector = result["polca"].sum("step").mean("datapoint").values
        found = result[FOUND_AT].values
        rows = [f"  {'basis':>5}  {'found at':>9}  {'total POLCA (mean over datapoints)':>36}"]
        rows += [f"  {i:>5}  {int(found[i]):>9}  {per_vector[i]:>36.5g}" for i in range(len(per_vector))]
        explained = float(per_vector.sum())
        share = f"{explained / total_change:.1%}" if total_change else "-"
        rows.append(
            f"  loss change over the run (mean) {total_change:.5g}; explained by the basis {explained:.5g} ({share})"
        )
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Polca)


__all__ = [
    "CPU_TOKEN_VECTORS",
    "PASS_PEAK",
    "PREFERRED_EXAMPLES",
    "PROJECTION_BLOCK",
    "SECOND_ORDER",
    "PassCost",
    "PassPlan",
    "Polca",
    "checkpoint_terms",
    "ckpt_register_analyzers",
    "measure_passes",
    "plan_basis",
    "plan_passes",
    "recent_checkpoint_terms",
    "step_projections",
    "worker_space",
]

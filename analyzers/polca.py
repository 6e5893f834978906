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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.basis import BasisReader
from ckpt.plugins import (
    PER_PAIR,
    AnalysisContext,
    Analyzer,
    Option,
    ParamSpace,
    Worker,
    check_basis,
    chunks,
    datapoint_index,
    directional_derivatives,
    hookimpl,
    load_basis,
    loss_function,
    parameter_space,
    trainable,
)

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
    """
    import torch

    if step in first_order_at:
        order = 1

    space = worker_space(worker)
    directions = load_basis(worker, basis, created, space, dtype)
    count = next(iter(directions.values())).shape[0]
    params = worker.params(step)
    primal = trainable(params, space, dtype)
    start, stop, _ = examples.indices(len(worker.data(split)["inputs"]))
    losses, firsts, seconds = [], [], []
    for rows in chunks(stop - start, batch_size):
        block = slice(start + rows.start, start + rows.stop)
        f = loss_function(worker, params, space, split=split, examples=block, objective=objective, dtype=dtype)
        first_parts, second_parts = [], []
        loss = None
        for vectors in chunks(count, basis_batch):
            part = {name: tensor[vectors] for name, tensor in directions.items()}
            loss, first, second = directional_derivatives(f, primal, part, order=order, compiled=compiled)
            first_parts.append(first)
            if second is not None:
                second_parts.append(second)
        losses.append(loss)
        firsts.append(torch.cat(first_parts))
        if second_parts:
            seconds.append(torch.cat(second_parts))
    first_all = torch.cat(firsts, dim=1).double().cpu().numpy()
    second_all = torch.cat(seconds, dim=1).double().cpu().numpy() if seconds else np.zeros_like(first_all)
    return {"loss": torch.cat(losses).double().cpu().numpy(), "first": first_all, "second": second_all}


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


def step_projections(
    worker: Worker, step: int, next_step: int, *, basis: str, created: str, dtype: str
) -> dict[str, np.ndarray]:
    """⟨θ_next - θ_step, b⟩ for every basis vector, accumulated in float64 (on a worker)."""
    space = worker_space(worker)
    directions = load_basis(worker, basis, created, space, dtype)
    before, after = worker.params(step), worker.params(next_step)
    total = None
    for name in space.names:
        # in float64, where the difference of two float32 weights is exact (a float32
        # difference was off by up to 6e-8 relative on the tiny MLP of the tests)
        delta = (after[name].double() - before[name].double()).reshape(-1)
        term = directions[name].double().reshape(directions[name].shape[0], -1) @ delta
        total = term if total is None else total + term
    assert total is not None
    return {"delta": total.cpu().numpy()}


class Polca(BasisReader, Analyzer):
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
                "found_at_step": basis["found_at_step"].variable,  # lazy (a dask-backed coordinate)
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
        found = result["found_at_step"].values
        rows = [f"  {'basis':>5}  {'found at':>9}  {'total POLCA (mean over datapoints)':>36}"]
        rows += [f"  {i:>5}  {int(found[i]):>9}  {per_vector[i]:>36.5g}" for i in range(len(per_vector))]
        explained = float(per_vector.sum())
        share = f"{explained / total_change:.1%}" if total_change else "-"
        rows.append(
            f"  loss change over the run (mean) {total_change:.5g}; explained by the basis {explained:.5g} ({share})"
        )
        return "\n".join(rows)


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register ``polca``."""
    register(Polca)

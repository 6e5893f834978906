"""``lca``: Loss Change Allocation per datapoint for selected parameters (Lan et al., 2019; a POLCA baseline).

For each pair of consecutive checkpoints and each selected parameter i (the
``--parameters`` largest in magnitude at the last checkpoint), the change of
every datapoint's loss allocated to i:

- ``first_order`` = ∂ℓ(x; θ_t)/∂θ_i · (θ_t+1 - θ_t)_i;
- ``lca``, the LCA paper's path integral ∫₀¹ ∂ℓ(x; θ_t + sΔ)/∂θ_i ds · Δ_i
  by Simpson's rule (gradients at θ_t, the midpoint and θ_t+1, weights 1/6,
  4/6, 1/6), the paper's fourth-order Runge-Kutta rule along a straight path.

These are POLCA's first order with coordinate directions b = e_i, so the same
vectorized JVPs compute them. The selection depends on the last checkpoint, so
the result is recomputed whole when checkpoints are added (``per = "run"``).

Each pair's allocation is committed to the journal (``analyses/lca.partial``,
:class:`ckpt.engine.resume.Journal`) as soon as it is computed, keyed by the pair's steps,
both checkpoints' digests and a digest of the selection; a rerun of the same request
after a kill takes those pairs and computes only the others.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.basis import ComputeOptions
from ckpt.analyzers.polca import measure_passes, plan_passes, worker_space
from ckpt.engine.resume import Journal
from ckpt.numerics.compiled import directional_derivatives
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    AnalysisError,
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


def allocate(
    worker: Worker,
    step: int,
    next_step: int,
    *,
    selected: np.ndarray,
    split: str,
    objective: str | None,
    batch_size: int,
    basis_batch: int,
    dtype: str,
) -> dict[str, np.ndarray]:
    """First-order and Simpson-rule LCA of every datapoint for the selected flat parameter indices."""
    import torch

    space = worker_space(worker)
    before, after = worker.params(step), worker.params(next_step)
    start_point, end_point = trainable(before, space, dtype), trainable(after, space, dtype)
    midpoint = {name: (start_point[name] + end_point[name]) / 2 for name in space.names}
    delta = space.flatten({n: after[n].double() - before[n].double() for n in space.names})[selected]
    examples = len(worker.data(split)["inputs"])
    precision = start_point[space.names[0]].dtype

    def one_hot(columns: slice) -> dict[str, Any]:
        """Coordinate directions e_i of the selected parameters in ``columns`` (dense: a JVP's tangents)."""
        flat = torch.zeros(columns.stop - columns.start, space.size, dtype=precision, device=worker.device)
        flat[torch.arange(flat.shape[0]), torch.as_tensor(selected[columns])] = 1.0
        return space.unflatten(flat)

    def f_of(rows: slice) -> Any:
        return loss_function(worker, before, space, split=split, examples=rows, objective=objective, dtype=dtype)

    gradients: dict[str, list[Any]] = {"start": [], "middle": [], "end": []}
    with worker.computing():
        # the same plan as polca's passes; each vector also brings its dense one-hot direction
        cost = worker.cached(
            ("lca-pass-cost", split, objective, dtype, min(3, examples), min(2, len(selected))),
            lambda: measure_passes(f_of, examples, start_point, one_hot(slice(0, min(2, len(selected)))), 1),
        )
        cost = replace(cost, per_vector=cost.per_vector + space.size * precision.itemsize)
        itemsize = torch_dtype(dtype).itemsize
        # the worker's two cached checkpoints (float32), the three points θ_t, midpoint, θ_t+1 in --dtype
        fixed = space.size * (2 * 4 + 3 * itemsize)
        plan = plan_passes(
            worker.memory_budget,
            fixed,
            cost,
            examples=examples,
            vectors=len(selected),
            batch_size=batch_size,
            basis_batch=basis_batch,
            analyzer="lca",
            fewer_vectors="use fewer basis vectors (--parameters)",
        )
        for rows in chunks(examples, plan.block_examples):
            per_point: dict[str, list[Any]] = {key: [] for key in gradients}
            # buffers (the tensors held fixed) from θ_t for the start and the midpoint, from θ_t+1 at the end
            f_before = f_of(rows)
            f_after = loss_function(worker, after, space, split=split, examples=rows, objective=objective, dtype=dtype)
            for columns in chunks(len(selected), plan.vectors):
                directions = one_hot(columns)
                for key, point, f in (
                    ("start", start_point, f_before),
                    ("middle", midpoint, f_before),
                    ("end", end_point, f_after),
                ):
                    _, first, _ = directional_derivatives(f, point, directions, order=1)
                    per_point[key].append(first)
                directions = None
            for key in gradients:
                gradients[key].append(torch.cat(per_point[key]))
    g = {key: torch.cat(parts, dim=1).double().cpu() for key, parts in gradients.items()}
    scale = delta.cpu().unsqueeze(1)
    simpson = (g["start"] + 4 * g["middle"] + g["end"]) / 6
    return {"first_order": (g["start"] * scale).numpy(), "lca": (simpson * scale).numpy(), "delta": delta.cpu().numpy()}


def journaled_allocation(
    worker: Worker,
    step: int,
    next_step: int,
    *,
    journal: Journal | None,
    keys: Mapping[int, Any],
    resumed: frozenset[int],
    **options: Any,
) -> dict[str, np.ndarray]:
    """The pair's allocation from ``journal`` when it was ``resumed``, else computed and committed to it."""
    import xarray as xr

    if step in resumed:
        assert journal is not None
        loaded = journal.pieces([keys[step]])
        if loaded is None:
            msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
            raise AnalysisError(msg)
        saved, found = loaded
        piece = saved.isel(step=found[0])
        return {name: piece[name].values for name in PIECE}
    allocation = allocate(worker, step, next_step, **options)
    if journal is not None:
        variables = {name: (("step", *dims), allocation[name][None]) for name, dims in PIECE.items()}
        journal.add(xr.Dataset(variables, coords={"step": [step]}), "step", keys[step])
    return allocation


PIECE = {"first_order": ("parameter", "datapoint"), "lca": ("parameter", "datapoint"), "delta": ("parameter",)}
"""The variables of one pair's allocation, and their dims (without ``step``)."""


class Lca(OneSplit, ComputeOptions, Analyzer):
    """Loss Change Allocation of the largest parameters, per datapoint and checkpoint pair."""

    name = "lca"
    version = "1"
    description = "Loss Change Allocation per datapoint for the largest parameters (first order and path integral)."
    per = PER_RUN

    split = Option(str, "eval", "Data split whose datapoints are analysed.")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    parameters = Option(
        int, 32, "Parameters allocated to: the N largest in magnitude at the last checkpoint.", minimum=1
    )
    basis_batch = Option(int, 8, "Parameters per vectorized JVP pass (bounds memory).", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """Select the parameters (reads the last checkpoint), then one task per checkpoint pair."""
        store = ctx.store
        if len(store.steps) < 2:
            msg = f"lca needs at least two checkpoints; {store.path} has {len(store.steps)}"
            raise AnalysisError(msg)
        space = parameter_space(store)
        if not 1 <= self.parameters <= space.size:
            msg = f"--parameters must be between 1 and the {space.size} parameters, got {self.parameters}"
            raise AnalysisError(msg)
        final = store.tensors(int(store.steps[-1]), list(space.names))
        magnitude = np.concatenate([np.abs(final[n].astype(np.float64)).reshape(-1) for n in space.names])
        selected = np.sort(np.argsort(-magnitude, kind="stable")[: self.parameters])
        owner = np.searchsorted(np.asarray(space.offsets), selected, side="right") - 1
        example, position = datapoint_index(store, self.split, self.objective)
        sizes = {"parameter": len(selected), "datapoint": len(example)}
        steps = [int(s) for s in store.steps[:-1]]
        keys = pair_keys(store, selected)
        # a store recording no digests cannot tie a piece to its checkpoints: nothing is journaled
        journal = ctx.journal if all(key is not None for key in keys.values()) else None
        ctx.resumed = self._resumable(journal, keys, sizes)
        result = ctx.map_pairs(
            journaled_allocation,
            {name: (dims, np.float64) for name, dims in PIECE.items()},
            sizes=sizes,
            steps=steps,
            journal=journal,
            keys=keys,
            resumed=frozenset(ctx.resumed),
            selected=selected,
            split=self.split,
            objective=self.objective,
            batch_size=self.batch_size,
            basis_batch=self.basis_batch,
            dtype=self.dtype,
        )
        result = result.assign_coords(
            example=("datapoint", example),
            position=("datapoint", position),
            tensor=("parameter", np.asarray([space.names[i] for i in owner], dtype=object)),
            index=("parameter", selected - np.asarray(space.offsets)[owner]),
            final_magnitude=("parameter", magnitude[selected]),
        )
        result["lca"].attrs["description"] = "path integral (Simpson) of dloss/dtheta_i times the step of theta_i"
        result["first_order"].attrs["description"] = "dloss/dtheta_i at theta_t times the step of theta_i"
        return result

    def _resumable(self, journal: Journal | None, keys: Mapping[int, Any], sizes: Mapping[str, int]) -> list[int]:
        """The pairs (first steps) an interrupted run of this request committed that this one can take.

        A journal of another request, or holding none of these pairs, or whose pieces do not
        have the layout this request writes, is discarded: nothing is taken from it.
        """
        if journal is None:
            return []
        steps = list(keys)
        loaded = journal.pieces([keys[step] for step in steps])
        if loaded is None:
            journal.discard()
            return []
        saved, found = loaded
        shapes = {name: tuple(sizes[d] for d in dims) for name, dims in PIECE.items()}
        held = saved["step"].values.tolist() if "step" in saved.coords else []
        if any(name not in saved or saved[name].shape[1:] != shape for name, shape in shapes.items()) or any(
            held[position] != steps[index] for index, position in found.items()
        ):
            journal.discard()
            return []
        return sorted(steps[index] for index in found)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``trajectories``: cumulative LCA per parameter, median and quartiles over datapoints."""
        from ckpt.analyzers.figures.basis import projected_figures

        return projected_figures(result, store, "lca", "cumulative LCA per parameter", per_pair="sum")

    def summarize(self, result: xr.Dataset) -> str:
        """Total LCA over the run (mean over datapoints) of the parameters that helped and hurt most."""
        total = result["lca"].sum("step").mean("datapoint").values
        order = np.argsort(total)
        rows = [f"  {'tensor':<28} {'index':>7}  {'total LCA':>12}"]
        for i in [*order[:3], *order[-3:]]:
            rows.append(f"  {result['tensor'].values[i]:<28} {int(result['index'].values[i]):>7}  {total[i]:>12.5g}")
        return "\n".join(rows)


def pair_keys(store: Any, selected: np.ndarray) -> dict[int, Any]:
    """Journal key of each pair (by first step): what its allocation is computed from besides the request.

    The pair's steps, both checkpoints' digests and a digest of the selected parameters (which
    the last checkpoint decides); None when the store records no digests (nothing is resumed).
    """
    selection = hashlib.sha256(np.ascontiguousarray(selected, dtype=np.int64).tobytes()).hexdigest()
    checkpoints = [int(s) for s in store.steps]
    digests = {step: store.checkpoint_digest(step) for step in checkpoints}
    keys: dict[int, Any] = {}
    for step, after in itertools.pairwise(checkpoints):
        known = digests[step] is not None and digests[after] is not None
        keys[step] = [step, after, digests[step], digests[after], selection] if known else None
    return keys


ckpt_register_analyzers = analyzer_hook(Lca)


__all__ = ["Lca", "allocate", "ckpt_register_analyzers"]

"""``boundary-distance``: how far each sequence embedding ξ sits from the read-out's decision boundaries.

Clustering Head §4.3 (Fig. 13-14) traces a second kind of loss spike to the
feedforward read-out: when the decision boundaries of the MLP pass close to the
sequence embeddings ξ (the attention output, the MLP's input), a small change of
ξ from one step to the next changes their class, and the heavy or correlated MLP
weights make the response ζ vary fast with ξ (Fig. 14). At every checkpoint, for
every example of ``--split``, this analyzer gives

- ``distance``: the Euclidean distance from ξ to the nearest decision boundary of
  the read-out, the set where the top logit ties with another. The read-out is
  ξ ↦ logits with everything else held fixed: the ``--readout`` module (whose
  input is ξ) and all that follows it (in the sparse-modular-addition sandbox,
  the MLP block ``mlp`` and the tied decoding ``logits = h · Eᵀ``). With c the
  class predicted at ξ and g(x) = logit_c(x) − max_{j≠c} logit_j(x), the nearest
  boundary point is the nearest zero of g: a straight path from ξ to any tie
  between two other classes crosses g = 0 first.
- ``jacobian_norm``: the spectral norm ‖∂ζ/∂ξ‖₂ of the read-out module's own
  input-output Jacobian at ξ (ζ = the module's output: the MLP response, what
  the paper draws in Fig. 14 as a function of ξ). Not ∂logits/∂ξ: that adds the
  fixed decoding matrix, and at a language model's vocabulary it would be a
  V x d matrix per example.
- ``predicted`` (c), ``margin`` (g(ξ)) and ``xi`` itself (drawn at d = 2).

The read-out is GELU, not ReLU: no piecewise-linear formula gives the distance.
It is searched for, with this guarantee: **the reported distance is attained by
a point of the boundary** (a sign change of g bracketed by bisection to
``--tol``), so it is an upper bound of the true distance, within ``--tol`` of a
boundary point; it is the least over a set of directions, then refined to a
local minimum:

1. directions from ξ: towards the nearest point of each linearised tie plane
   logit_c = logit_j (−∇(logit_c − logit_j) at ξ, for up to 64 classes j: exact
   for a linear read-out, whose class region is the intersection of those
   half-spaces); then at d = 2, ``--directions`` angles evenly spaced; at d > 2,
   ±e_i for every axis and seeded random directions, ``--directions`` in all
   (at least 2d + 1);
2. along each, g is sampled at radii growing quadratically up to ``--radius``
   (finer near ξ, where a spike needs the boundary), and the first sign change
   is bisected to ``--tol``;
3. from the best direction, projected-gradient steps on the sphere of
   directions (the gradient of the crossing radius r(u) is −r ∇g⊥/(∇g·u))
   rotate it while that shortens the crossing, halving the rotation on failure,
   until a rotation by an arc of ``--tol`` no longer helps or ∇g is parallel
   to x − ξ (the first-order condition of the nearest point).

A thin boundary excursion narrower than the sampling between two radii can be
missed (the distance is then too large, never too small). ``distance`` is NaN
where no boundary was found within ``--radius`` (``status`` 1) or the logits
at ξ are not finite (``status`` 2); a tie at ξ is distance 0.

Evaluating the read-out at a point x re-runs the model on the example with the
read-out module's input replaced by x (a forward pre-hook); a model that declares
its read-out (a ``readout`` attribute naming the module, as the
sparse-modular-addition sandbox's ``readout = "mlp"``) and an ``output_logits(ξ)``
method computing it is evaluated through that method instead, skipping what comes
before (same values, a third of the cost). Any other model needs ``--readout``.
Supported: read-outs whose input is one vector per example, ``[examples, d]``, in
one call, and models whose output is one row of class logits per example.

Memory: ``--batch-size`` bounds the points evaluated per forward pass (examples
x directions). One Dask task per checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._boundary_search import (
    FOUND,
    LOCAL,
    MARCH,
    MAX_TIE_PLANES,
    NO_BOUNDARY,
    NOT_FINITE,
    REFINE,
    margin,
    nearest_boundary,
)
from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.spike_causes import check_model_and_split
from ckpt.numerics.derivatives import DTYPES
from ckpt.plugins import (
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    capture,
    iter_activations,
    torch_dtype,
)
from ckpt.plugins.manager import analyzer_hook
from ckpt.plugins.objectives import logits_of

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

QUANTILES = np.array([0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0])
"""Quantiles of the distances and Jacobian norms stored per checkpoint (over examples)."""


def declared_readout(model: Any) -> str | None:
    """The read-out module a model declares (its ``readout`` attribute: a module name), else None."""
    name = getattr(model, "readout", None)
    return name if isinstance(name, str) else None


def readout_logits(model: Any, params: dict[str, Any], module: Any, inputs: Any) -> Callable[[Any], Any]:
    """ξ ↦ logits of ``inputs`` with the read-out module's input replaced by ξ.

    Parameters
    ----------
    model, params
        The model and the checkpoint's tensors (``functional_call``).
    module
        The read-out module: its first positional input is replaced.
    inputs
        ``[B, ...]`` inputs of the B examples.

    Returns
    -------
    callable
        ``points [B, K, d] -> logits [B, K, C]``: row b evaluated on example b's input
        (everything the read-out does not see held fixed); differentiable in ``points``.
    """
    from torch.func import functional_call

    def evaluate(points: Any) -> Any:
        rows, k, d = points.shape
        repeated = inputs.repeat_interleave(k, dim=0)

        def replace(mod: Any, args: Any) -> Any:
            return (points.reshape(rows * k, d), *args[1:])

        handle = module.register_forward_pre_hook(replace)
        try:
            logits = logits_of(functional_call(model, params, (repeated,)))
        finally:
            handle.remove()
        return logits.reshape(rows, k, -1)

    return evaluate


def declared_logits(model: Any, params: dict[str, Any], rows: int) -> Callable[[Any], Any]:
    """ξ ↦ logits through the model's own ``output_logits(ξ)`` (the declared read-out as a function).

    Same values as :func:`readout_logits` on the declared read-out, without re-running what
    comes before it (in the sandbox, the embeddings and attention: ~2/3 of the cost).
    """
    from torch import nn
    from torch.func import functional_call

    class Readout(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, points: Any) -> Any:
            return self.model.output_logits(points)

    wrapper = Readout()
    prefixed = {f"model.{name}": value for name, value in params.items()}

    def evaluate(points: Any) -> Any:
        k, d = points.shape[1], points.shape[2]
        return functional_call(wrapper, prefixed, (points.reshape(rows * k, d),)).reshape(rows, k, -1)

    return evaluate


def module_jacobian_norms(model: Any, params: dict[str, Any], module: Any, inputs: Any, xi: Any) -> Any:
    """‖∂ζ/∂ξ‖₂ per example: ζ the read-out module's output, ξ its input, in the model's own forward pass.

    One backward pass per output component (d_out, 2 in the sandbox); the module is
    called as the model calls it, with ξ swapped in by a pre-hook.
    """
    import torch
    from torch.func import functional_call

    point = xi.detach().clone().requires_grad_(True)
    outputs: list[Any] = []

    def replace(mod: Any, args: Any) -> Any:
        return (point, *args[1:])

    def keep(mod: Any, args: Any, output: Any) -> None:
        outputs.append(output)

    handles = [module.register_forward_pre_hook(replace), module.register_forward_hook(keep)]
    try:
        with torch.enable_grad():
            functional_call(model, params, (inputs,))
    finally:
        for handle in handles:
            handle.remove()
    zeta = outputs[0].reshape(len(xi), -1)
    rows = [
        torch.autograd.grad(zeta[:, i].sum(), point, retain_graph=i + 1 < zeta.shape[1])[0]
        for i in range(zeta.shape[1])
    ]
    jacobian = torch.stack(rows, 1)  # [B, d_out, d_in]
    return torch.linalg.matrix_norm(jacobian, ord=2)


def distances_at(
    worker: Worker,
    step: int,
    *,
    readout: str,
    split: str,
    batch_size: int,
    directions: int,
    radius: float,
    tol: float,
    seed: int,
    dtype: str,
) -> dict[str, np.ndarray]:
    """Per example of ``split`` at ``step``: distance, status, Jacobian norm, class, margin, ξ (on a worker)."""
    precision = torch_dtype(dtype)
    model = worker.model_for(precision)
    params = {k: v.to(precision) if v.is_floating_point() else v for k, v in worker.params(step).items()}
    module = dict(model.named_modules())[readout]
    inputs = worker.data(split)["inputs"]
    per_chunk = max(1, batch_size // directions)
    parts: dict[str, list[np.ndarray]] = {}
    with worker.computing():
        for batch in iter_activations(
            worker, step, [readout], split=split, batch_size=per_chunk, outputs=False, inputs=True, dtype=precision
        ):
            xi = batch.inputs[readout][0]
            chunk = inputs[batch.examples]
            if chunk.is_floating_point():
                chunk = chunk.to(precision)
            if readout == declared_readout(model) and callable(getattr(model, "output_logits", None)):
                fn = declared_logits(model, params, len(xi))
            else:
                fn = readout_logits(model, params, module, chunk)
            distance, status, predicted, g0 = nearest_boundary(
                fn, xi, directions=directions, radius=radius, tol=tol, seed=seed
            )
            norms = module_jacobian_norms(model, params, module, chunk, xi)
            found = {
                "distance": distance.detach(),
                "status": status,
                "jacobian_norm": norms.detach(),
                "predicted": predicted,
                "margin": g0,
                "xi": xi,
            }
            for name, value in found.items():
                parts.setdefault(name, []).append(value.cpu().numpy())
    result = {name: np.concatenate(values) for name, values in parts.items()}
    result["predicted"] = result["predicted"].astype(np.int64)
    result["status"] = result["status"].astype(np.int8)
    for name in ("distance", "jacobian_norm", "margin", "xi"):
        result[name] = result[name].astype(np.float64)
    finite = result["distance"][result["status"] == FOUND]
    result["distance_quantile"] = np.quantile(finite, QUANTILES) if finite.size else np.full(len(QUANTILES), np.nan)
    result["jacobian_quantile"] = np.quantile(result["jacobian_norm"], QUANTILES)
    return result


def check_readout(store: Any, model: Any, readout: str | None, split: str) -> tuple[str, int]:
    """The read-out module's name and ξ's dimension, checked on one example before any work.

    Raises
    ------
    AnalysisError
        When no read-out is given or declared, the module does not exist, or its input
        is not one vector per example or the model's output not one logit row per example.
    """
    import torch

    name = readout or declared_readout(model)
    if name is None:
        msg = (
            f"the model ({type(model).__name__}) declares no read-out module: pass --readout MODULE naming the "
            "module whose input is the sequence embedding ξ"
        )
        raise AnalysisError(msg)
    modules = dict(model.named_modules())
    if name not in modules or not name:
        listing = ", ".join(n for n in list(modules)[1:21] if n)
        msg = f"--readout: the model has no module {name!r}; its modules: {listing}"
        raise AnalysisError(msg)
    example = torch.from_numpy(np.asarray(store.data(split)["inputs"][:2].values))
    with torch.no_grad():
        outputs, found = capture(model.eval(), [name], lambda: model(example), outputs=False, inputs=True)
    logits = logits_of(outputs)
    calls = found.inputs[name]
    if len(calls) != 1 or calls[0].shape[0] != 2 or calls[0].ndim != 2:
        shapes = [tuple(c.shape) for c in calls]
        msg = (
            f"--readout {name!r}: its input must be one vector ξ per example, [examples, d], in one call; "
            f"got {shapes or 'no call'} for 2 examples: choose another --readout"
        )
        raise AnalysisError(msg)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[0] != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        msg = (
            f"boundary-distance needs one row of class logits per example, [examples, classes]; the model gives {shape}"
        )
        raise AnalysisError(msg)
    return name, int(calls[0].shape[1])


class BoundaryDistance(OneSplit, Analyzer):
    """Distance of each sequence embedding ξ to the read-out's nearest decision boundary, and ‖∂ζ/∂ξ‖₂."""

    name = "boundary-distance"
    version = "1"
    description = "Distance of each ξ to the nearest decision boundary of the read-out, and the read-out's Jacobian."

    readout = Option(str, None, "Module whose input is ξ (default: the model's declared read-out, e.g. mlp).")
    split = Option(str, "eval", "Data split whose examples are measured.")
    batch_size = Option(int, 16384, "Points per forward pass, examples x directions (bounds memory).", minimum=1)
    directions = Option(int, 128, "Search directions from each ξ (angles at d = 2).", minimum=4)
    radius = Option(float, 10.0, "Search radius: NaN where no boundary is this close.", minimum=0)
    tol = Option(float, 1e-6, "Bisection tolerance on the distance.", minimum=0)
    seed = Option(int, 0, "Seed of the random search directions (d > 2).", minimum=0)
    dtype = Option(str, "float64", "Precision of the search.", choices=DTYPES)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; the read-out and its shapes are checked here, before any work."""
        store = ctx.store
        check_model_and_split(store, self.split, self.name)
        if not self.radius > 0 or not self.tol > 0:
            msg = f"--radius and --tol must be positive, got {self.radius} and {self.tol}"
            raise AnalysisError(msg)
        readout, dim = check_readout(store, store.model.build(), self.readout, self.split)
        if dim > 2 and self.directions < 2 * dim + 1:
            msg = (
                f"--directions must be at least 2d + 1 = {2 * dim + 1} at d = {dim} (the axes, both ways, and one more)"
            )
            raise AnalysisError(msg)
        examples = store.data(self.split).sizes["example"]
        result = ctx.map_checkpoints(
            distances_at,
            {
                "distance": (("example",), np.float64),
                "status": (("example",), np.int8),
                "jacobian_norm": (("example",), np.float64),
                "predicted": (("example",), np.int64),
                "margin": (("example",), np.float64),
                "xi": (("example", "component"), np.float64),
                "distance_quantile": (("quantile",), np.float64),
                "jacobian_quantile": (("quantile",), np.float64),
            },
            sizes={"example": examples, "component": dim, "quantile": len(QUANTILES)},
            coords={"example": np.arange(examples), "component": np.arange(dim), "quantile": QUANTILES},
            readout=readout,
            split=self.split,
            batch_size=self.batch_size,
            directions=self.directions,
            radius=self.radius,
            tol=self.tol,
            seed=self.seed,
            dtype=self.dtype,
        )
        result["distance"].attrs.update(
            long_name="distance to the nearest decision boundary",
            description=(
                f"Euclidean distance from ξ (the input of {readout!r}) to the nearest point where the predicted "
                f"class's logit ties with another, within --tol={self.tol} (an upper bound attained by a boundary "
                "point); NaN where status is not 0 (Clustering Head §4.3, Fig. 13)"
            ),
        )
        result["status"].attrs.update(
            flag_values=[FOUND, NO_BOUNDARY, NOT_FINITE],
            flag_meanings=f"found no_boundary_within_radius_{self.radius} logits_not_finite",
        )
        result["jacobian_norm"].attrs.update(
            long_name="‖∂ζ/∂ξ‖₂",
            description=f"spectral norm of the Jacobian of {readout!r}'s output ζ in its input ξ (Fig. 14)",
        )
        result["predicted"].attrs["description"] = "class of the top logit at ξ"
        result["margin"].attrs["description"] = "top logit minus the runner-up's at ξ"
        result["xi"].attrs["description"] = f"the sequence embedding ξ: the input of {readout!r}"
        result["distance_quantile"].attrs["description"] = "quantiles of distance over the examples where it is found"
        result["jacobian_quantile"].attrs["description"] = "quantiles of jacobian_norm over the examples"
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``distances`` (quantile bands over steps) and, at d = 2, ``boundaries`` (ξ and the boundaries)."""
        from ckpt.analyzers.figures.boundaries import boundary_figures

        return boundary_figures(result, store, readout=self.readout, split=self.split)

    def summarize(self, result: xr.Dataset) -> str:
        """At the first and last checkpoints: distance quantiles, the share not found, the median Jacobian norm."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        rows = [f"  {'step':>8}  {'min':>9}  {'5%':>9}  {'median':>9}  {'not found':>9}  {'‖∂ζ/∂ξ‖ med':>11}"]
        for j in sorted({0, len(steps) - 1}):
            q = result["distance_quantile"].isel(step=j)
            missing = float((result["status"].isel(step=j) != FOUND).mean())
            rows.append(
                f"  {int(steps[j]):>8}  {float(q.sel(quantile=0.0)):>9.4g}  {float(q.sel(quantile=0.05)):>9.4g}"
                f"  {float(q.sel(quantile=0.5)):>9.4g}  {missing:>9.1%}"
                f"  {float(result['jacobian_quantile'].isel(step=j).sel(quantile=0.5)):>11.4g}"
            )
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(BoundaryDistance)


__all__ = [
    "FOUND",
    "LOCAL",
    "MARCH",
    "MAX_TIE_PLANES",
    "NOT_FINITE",
    "NO_BOUNDARY",
    "QUANTILES",
    "REFINE",
    "BoundaryDistance",
    "check_readout",
    "ckpt_register_analyzers",
    "declared_logits",
    "declared_readout",
    "distances_at",
    "margin",
    "module_jacobian_norms",
    "nearest_boundary",
    "readout_logits",
]

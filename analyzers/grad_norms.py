"""``grad-norms`` and ``loss-spikes``: gradient and update norms per tensor and layer, loss spikes (Clustering Head).

Design: two analyzers, because spike detection needs the whole run while the
norms do not.

- ``grad-norms`` (``per="checkpoint"``) computes, with one Dask task per
  checkpoint (``ctx.map_checkpoints``), the expensive part: the gradient of the
  mean loss over a split at each checkpoint, its norm per tensor, per layer and
  in total, the mean loss itself, and the update norms. Adding checkpoints and
  rerunning computes only the new ones.
- ``loss-spikes`` (``per="run"``) requires ``grad-norms`` (run with the
  ``--split``, ``--batch-size`` and ``--seed`` given to ``loss-spikes``, its
  defaults otherwise) and runs the spike detection on the whole series: cheap
  numpy on two 1-D arrays, recomputed whole whenever the steps change, so the
  result is never stale.

Gradient norms. The gradient is taken in the model's eval mode (no dropout),
with the checkpoint's tensors swapped in by ``torch.func.functional_call``, of
the mean of the store's objective over the datapoints of ``--split`` (default
``train`` when the store has it, else ``eval``), with respect to the model's
trainable floating-point parameters (buffers have none: NaN). It is
accumulated in float64 over chunks of ``--chunk-size`` examples, so memory is
bounded while the value is that of the full batch. With ``--batch-size B`` the
examples are instead permuted by ``np.random.default_rng(seed).permutation(n)``
and cut into consecutive minibatches of B examples (a last incomplete
minibatch is dropped, unless it is the only one); each minibatch's gradient
(of its own mean loss) is normed, and every reported norm is the *mean over
minibatches of the per-minibatch norm* (per tensor, per layer and in total,
each averaged separately: the expected norm of a stochastic gradient of batch
size B, which exceeds the full-batch norm by the gradient noise). ``loss`` is
the mean loss of the datapoints used (the mean of the minibatch losses).

A *layer* is a tensor name up to its last dot (``blocks.0.attn.q.weight`` ->
``blocks.0.attn.q``; a name without a dot is its own layer); a layer's norm is
the norm of all its tensors' entries together.

Update norms ``||θ_t - θ_prev||`` (per tensor, per layer, in total, float64)
need only the weights, so they are computed on every store, with or without a
model. ``update_norm`` at step t is the update *into* t, from the previous
checkpoint (NaN at the first checkpoint), not the update out of t: a stored
per-checkpoint value must not depend on checkpoints written later, or an
incremental run would keep a stale NaN at the old last step. The update out of
t is ``update_norm.shift(step=-1)``. For a store without a model spec,
``grad-norms`` holds the update norms only.

Spikes (``loss-spikes``). For a series x over the checkpoints, the baseline at
t is the median of the previous ``--window`` finite values (a trailing window:
a spike is a rise above the recent past, and a smoothly decreasing loss always
lies below it), and the scale is ``max(1.4826 * MAD, floor * |median|, 1e-12)``
with MAD the median absolute deviation from that median in the same window
(1.4826 makes it the standard deviation for Gaussian noise; the floor keeps a
flat stretch with zero MAD from flagging rounding noise). t is a spike when
``x_t - median > threshold * scale``: a robust z-score above ``--threshold``.
The default, 5, is above the 3.5 usual for the modified z-score of Iglewicz
and Hoaglin because the median and MAD of 20 values are themselves noisy: on
pure Gaussian noise, threshold 3.5 flagged 0.5% of the points (1.6% with a
window of 10), threshold 5 flagged 0.05%. Checkpoints with fewer than 5
earlier finite values are never spikes. A trailing window lags a falling
curve, and its spread grows with the slope, so during a steep descent only
large spikes clear the threshold (a smaller ``--window`` follows it closer).
The loss series is the training metric stored by the run (``train_loss``,
else ``loss``, in ``store.metrics``, when it covers every checkpoint; or
``--metric NAME``), otherwise the mean loss evaluated by ``grad-norms``; the gradient
series is its ``total_grad_norm``. ``cooccurrence`` is the fraction of loss
spikes with a gradient-norm spike within ±``--tolerance`` training steps;
``chance`` is the same fraction for a loss spike placed at a uniformly random
checkpoint: the fraction of all checkpoints within ±tolerance of a
gradient-norm spike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._spikes import (
    MAD_SCALE,
    MIN_PERIODS,
    chance_cooccurrence,
    cooccurrence,
    detect_spikes,
    near,
    rolling_baseline,
    spike_table,
)
from ckpt.engine.worker import objective_for
from ckpt.numerics.derivatives import DTYPES, ParamSpace
from ckpt.plugins import (
    PER_RUN,
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
    chunks,
    loss_function,
    parameter_space,
)
from ckpt.plugins import trainable as trainable_tensors
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

LOSS_METRICS = ("train_loss", "loss")
"""Training metrics used as the loss series, in order of preference."""
EVALUATED = "evaluated"
"""``--metric`` value for the mean loss evaluated by ``grad-norms``."""


# -- norms (on workers) -----------------------------------------------------------------------------------


def layer_of(name: str) -> str:
    """The layer of a tensor: its name up to the last dot (``blocks.0.attn.q.weight`` -> ``blocks.0.attn.q``)."""
    return name.rsplit(".", 1)[0] if "." in name else name


def layer_index(names: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The layers of ``names`` (first-appearance order) and the layer index of each name."""
    layers: list[str] = []
    for name in names:
        if layer_of(name) not in layers:
            layers.append(layer_of(name))
    return layers, np.array([layers.index(layer_of(name)) for name in names], dtype=np.int64)


def _grouped(squares: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """Square roots of the sums of ``squares`` within each group (NaN entries skipped; NaN for an all-NaN group)."""
    valid = np.isfinite(squares)
    sums = np.bincount(groups[valid], weights=squares[valid], minlength=count)
    present = np.bincount(groups[valid], minlength=count) > 0
    return np.where(present, np.sqrt(sums), np.nan)


def minibatches(n: int, batch_size: int | None, seed: int) -> list[np.ndarray]:
    """The example groups whose gradients are normed: all of them, or seeded minibatches.

    ``batch_size=None``: one group, ``arange(n)``. Otherwise
    ``np.random.default_rng(seed).permutation(n)`` cut into consecutive groups of
    ``batch_size``; a last incomplete group is dropped unless it is the only one.
    """
    if batch_size is None or batch_size >= n:
        return [np.arange(n)]
    order = np.random.default_rng(seed).permutation(n)
    return [order[start : start + batch_size] for start in range(0, n - batch_size + 1, batch_size)]


def _update_norms(worker: Worker, step: int, names: list[str]) -> np.ndarray:
    """Squared ``||θ_step - θ_prev||`` per tensor (NaN at the first checkpoint), in float64."""
    after = worker.params(step)  # first: it refreshes the worker's view of the store when step is new to it
    steps = np.asarray(worker.store.steps)
    index = int(np.searchsorted(steps, step))
    if index == 0:
        return np.full(len(names), np.nan)
    before = worker.params(int(steps[index - 1]))
    return np.array([_squared_distance(after[n], before[n]) for n in names])


UPDATE_BLOCK = 1 << 18
"""Entries per block of an update norm: 2 MiB of float64, cache-sized. Whole-tensor float64 copies (four
of 309 MB for GPT-2 small's embedding) were an order of magnitude slower (docs/performance.md, "Gradient
norms memory")."""


def _squared_distance(after: Any, before: Any) -> float:
    """``||after - before||²`` in float64 (the difference of two float32 tensors is exact there), by blocks."""
    a, b = after.reshape(-1), before.reshape(-1)
    total = 0.0
    for start in range(0, a.numel(), UPDATE_BLOCK):
        difference = a[start : start + UPDATE_BLOCK].double() - b[start : start + UPDATE_BLOCK].double()
        total += float(difference.dot(difference))
    return total


def checkpoint_norms(
    worker: Worker,
    step: int,
    *,
    names: list[str],
    trainable: list[str],
    split: str | None,
    objective: str | None,
    batch_size: int | None,
    seed: int,
    chunk_size: int,
    dtype: str,
) -> dict[str, np.ndarray]:
    """Gradient norms (when ``split``) and update norms of every tensor at ``step`` (runs on a worker)."""
    layers, groups = layer_index(names)
    update = _update_norms(worker, step, names)
    out = {
        "update_norm": np.sqrt(update),
        "layer_update_norm": _grouped(update, groups, len(layers)),
        "total_update_norm": np.float64(np.sqrt(update.sum())),
    }
    if split is None:
        return out
    squares, loss = _gradient_squares(worker, step, trainable, split, objective, batch_size, seed, chunk_size, dtype)
    position = {name: i for i, name in enumerate(names)}
    per_tensor = np.full((len(squares), len(names)), np.nan)
    per_tensor[:, [position[n] for n in trainable]] = squares
    out["grad_norm"] = np.sqrt(per_tensor).mean(0)
    out["layer_grad_norm"] = np.mean([_grouped(row, groups, len(layers)) for row in per_tensor], axis=0)
    out["total_grad_norm"] = np.float64(np.sqrt(squares.sum(1)).mean())
    out["loss"] = np.float64(loss)
    return out


def _gradient_squares(
    worker: Worker,
    step: int,
    trainable: list[str],
    split: str,
    objective: str | None,
    batch_size: int | None,
    seed: int,
    chunk_size: int,
    dtype: str,
) -> tuple[np.ndarray, float]:
    """Squared gradient norm of each trainable tensor per minibatch ``[B, tensors]``, and the mean loss."""
    import torch

    params = worker.params(step)
    space = ParamSpace(tuple(trainable), tuple(tuple(params[k].shape) for k in trainable))
    n = len(worker.data(split)["inputs"])
    rows_squares, batch_losses = [], []
    # the parameters are loaded above, outside the slot: another thread reads while this one computes
    with worker.computing():
        for group in minibatches(n, batch_size, seed):
            primal = {k: v.detach().requires_grad_() for k, v in trainable_tensors(params, space, dtype).items()}
            parts = list(chunks(len(group), chunk_size))
            # one pass needs no accumulator: its gradient is already the sum over its examples. Several
            # are summed in float64, in place (no float64 copy of each gradient): at GPT-2 small the
            # accumulator is most of what grad-norms holds beyond a plain backward loop.
            total: dict[str, Any] = (
                {k: torch.zeros(v.shape, dtype=torch.float64, device=v.device) for k, v in primal.items()}
                if len(parts) > 1
                else {}
            )
            loss_sum, count = 0.0, 0
            for part in parts:
                f = loss_function(
                    worker, params, space, split=split, examples=group[part], objective=objective, dtype=dtype
                )
                with torch.enable_grad():
                    values = f(primal)
                    grads = torch.autograd.grad(values.sum(), list(primal.values()), allow_unused=True)
                for name, grad in zip(primal, grads, strict=True):
                    if grad is None:
                        continue
                    if len(parts) > 1:
                        total[name].add_(grad)
                    else:
                        total[name] = grad
                loss_sum += float(values.detach().double().sum())
                count += int(values.numel())
                values = grads = f = None  # before the next pass allocates its own
            if count == 0:
                msg = f"split {split!r} has no datapoints under the objective; pass another --split"
                raise AnalysisError(msg)
            rows_squares.append([_squared_norm(total[k], count) if k in total else 0.0 for k in trainable])
            batch_losses.append(loss_sum / count)
        # dropped inside the slot, so that its release of freed memory runs after them, before the next
        # thread computes (otherwise, beside another large job, grad-norms peaked well above a plain loop)
        primal = total = None
    return np.array(rows_squares, dtype=np.float64), float(np.mean(batch_losses))


def _squared_norm(summed: Any, count: int, block: int = 1 << 22) -> float:
    """``||summed / count||²`` in float64, a block of entries at a time (no float64 copy of the whole tensor)."""
    flat = summed.reshape(-1)
    return float(sum((flat[i : i + block].double() / count).pow(2).sum() for i in range(0, flat.numel(), block)))


# -- the analyzers ------------------------------------------------------------------------------------


class GradNorms(Analyzer):
    """Gradient norm of the mean loss per tensor and layer, and update norms, at every checkpoint."""

    name = "grad-norms"
    version = "1"
    description = "Gradient norm of the mean loss per tensor/layer, and update norms, at every checkpoint."

    split = Option(str, None, "Data split of the loss (default: train when the store has it, else eval).")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    batch_size = Option(
        int, None, "Minibatch size: average the per-minibatch gradient norms (default: full batch).", minimum=1
    )
    seed = Option(int, 0, "Seed of the minibatch permutation (with --batch-size).", minimum=0)
    chunk_size = Option(int, 1024, "Examples per forward/backward pass (bounds memory, not the result).", minimum=1)
    dtype = Option(str, "float32", "Precision of the gradient computation.", choices=DTYPES)

    def resolved_split(self, store: Any) -> str:
        """``--split``, else ``train`` when the store has it, else ``eval``."""
        if self.split:
            return str(self.split)
        return "train" if "train" in store.splits else "eval"

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """The split of the loss (none for a store without a model: update norms only)."""
        return (self.resolved_split(store),) if store.model is not None else ()

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint: gradient norms (when the store has a model) and update norms."""
        store = ctx.store
        names = [name for name, info in store.schema.items() if "float" in info.dtype]
        if not names:
            msg = f"{store.path} has no floating-point tensors; grad-norms needs weights"
            raise AnalysisError(msg)
        layers, groups = layer_index(names)
        split, trainable = None, []
        if store.model is not None:
            split = self.resolved_split(store)
            if split not in store.splits:
                msg = f"{store.path} has no data split {split!r}; pass --split one of: {', '.join(store.splits)}"
                raise AnalysisError(msg)
            objective_for(store, self.objective)  # an unknown or missing objective fails here, not on a worker
            trainable = list(parameter_space(store).names)
        outputs: dict[str, Any] = {
            "update_norm": (("tensor",), np.float64),
            "layer_update_norm": (("layer",), np.float64),
            "total_update_norm": ((), np.float64),
        }
        if split is not None:
            outputs |= {
                "grad_norm": (("tensor",), np.float64),
                "layer_grad_norm": (("layer",), np.float64),
                "total_grad_norm": ((), np.float64),
                "loss": ((), np.float64),
            }
        result = ctx.map_checkpoints(
            checkpoint_norms,
            outputs,
            sizes={"tensor": len(names), "layer": len(layers)},
            coords={
                "tensor": np.array(names, dtype=object),
                "layer": np.array(layers, dtype=object),
                "tensor_layer": ("tensor", np.array([layers[g] for g in groups], dtype=object)),
            },
            names=names,
            trainable=trainable,
            split=split,
            objective=self.objective,
            batch_size=self.batch_size,
            seed=self.seed,
            chunk_size=self.chunk_size,
            dtype=self.dtype,
        )
        self._describe(result, split)
        return result

    def _describe(self, result: xr.Dataset, split: str | None) -> None:
        how = "full batch" if self.batch_size is None else f"mean over batches of {self.batch_size}, seed {self.seed}"
        texts = {
            "update_norm": "||theta_t - theta_prev|| (float64), the update into this checkpoint; NaN at the first",
            "layer_update_norm": "update norm of all tensors of the layer together",
            "total_update_norm": "update norm of all floating-point tensors together",
            "grad_norm": f"norm of the gradient of the mean loss on {split!r} ({how}); NaN for non-parameters",
            "layer_grad_norm": f"gradient norm of all parameters of the layer together ({how})",
            "total_grad_norm": f"gradient norm of all parameters together ({how})",
            "loss": f"mean loss on {split!r} of the datapoints used",
        }
        for name, text in texts.items():
            if name in result:
                result[name].attrs["description"] = text
        for name in ("grad_norm", "layer_grad_norm", "total_grad_norm", "loss"):
            if name in result:
                result[name].attrs["split"] = split  # variable attrs are stored; the Dataset's are the engine's

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``norms``: loss and gradient norm over steps, overall and per layer."""
        from ckpt.analyzers.figures.spikes import grad_norm_figures

        return grad_norm_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Loss, total gradient and update norms at a few steps; per-layer gradient norms at the last."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        picks = sorted({0, *np.linspace(0, len(steps) - 1, 6).astype(int).tolist()})
        has_grad = "total_grad_norm" in result
        header = f"  {'step':>10}" + (f"  {'loss':>10}  {'grad norm':>10}" if has_grad else "") + f"  {'update':>10}"
        rows = [f"  {result.sizes['tensor']} tensors in {result.sizes['layer']} layers, {len(steps)} checkpoints"]
        if not has_grad:
            rows.append("  (no model spec in the store: update norms only)")
        rows.append(header)
        loss = result["loss"].values if has_grad else None
        grad = result["total_grad_norm"].values if has_grad else None
        update = result["total_update_norm"].values
        for i in picks:
            cells = f"  {loss[i]:>10.5g}  {grad[i]:>10.4g}" if has_grad else ""  # type: ignore[index]
            rows.append(f"  {int(steps[i]):>10}{cells}  {update[i]:>10.4g}")
        variable = "layer_grad_norm" if has_grad else "layer_update_norm"
        last = result[variable].isel(step=-1).values
        rows.append(f"  {variable} at step {int(steps[-1])}:")
        rows += [f"    {layer!s:<32} {value:.4g}" for layer, value in zip(result["layer"].values, last, strict=True)]
        return "\n".join(rows)


class LossSpikes(Analyzer):
    """Loss and gradient-norm spikes over the run, and how often they coincide."""

    name = "loss-spikes"
    version = "1"
    description = "Loss and gradient-norm spikes (rolling median + MAD) and their co-occurrence over the run."
    requires = ("grad-norms",)
    per = PER_RUN

    metric = Option(str, None, "Loss series: a stored metric or 'evaluated' (default: train_loss, loss, evaluated).")
    window = Option(int, 20, "Earlier checkpoints in the rolling median and MAD.", minimum=MIN_PERIODS)
    threshold = Option(float, 5.0, "Spike when the rise above the median exceeds this many scaled MADs.", minimum=0)
    floor = Option(float, 0.01, "Smallest scale, as a fraction of |median| (guards against a zero MAD).", minimum=0)
    tolerance = Option(int, 0, "Loss and gradient spikes at most this many training steps apart co-occur.", minimum=0)

    split = Option(str, None, "Passed on to grad-norms: data split (default: train when stored, else eval).")
    batch_size = Option(int, None, "Passed on to grad-norms: minibatch size (default: full batch).", minimum=1)
    seed = Option(int, 0, "Passed on to grad-norms: seed of the minibatch permutation.", minimum=0)

    def dependency_options(self) -> dict[str, Any]:
        """``grad-norms`` with this analyzer's ``split``, ``batch_size`` and ``seed`` (its defaults otherwise)."""
        return {"grad-norms": {"split": self.split, "batch_size": self.batch_size, "seed": self.seed}}

    def loss_series(self, store: Any, norms: xr.Dataset) -> tuple[str, Any]:
        """The loss series (numpy or lazy) on the checkpoints and where it comes from."""
        steps = norms["step"].values
        metrics = store.metrics
        candidates = [self.metric] if self.metric else [*LOSS_METRICS, EVALUATED]
        for name in candidates:
            if name == EVALUATED:
                if "loss" not in norms:
                    msg = f"{store.path} records no model spec, so no loss can be evaluated; pass --metric NAME"
                    raise AnalysisError(msg)
                return "mean loss evaluated by grad-norms", norms["loss"].data
            if name in metrics and np.isin(steps, metrics["step"].values).all():
                return f"metric {name!r}", metrics[name].sel(step=steps).values.astype(np.float64)
            if self.metric:
                known = ", ".join([*metrics.data_vars, EVALUATED])
                msg = f"no metric {name!r} at every checkpoint of {store.path}; pass --metric one of: {known}"
                raise AnalysisError(msg)
        msg = f"{store.path} has no loss metric and no model to evaluate one; pass --metric NAME"
        raise AnalysisError(msg)

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """None of its own: the series come from grad-norms (whose provenance covers its split) and the metrics."""
        return ()

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One Dask task over the whole series (the norms come lazily from ``grad-norms``)."""
        import dask
        import dask.array as da
        import xarray as xr

        if self.threshold <= 0 or self.floor < 0 or self.tolerance < 0:
            msg = "--threshold must be positive, --floor and --tolerance non-negative"
            raise AnalysisError(msg)
        norms = ctx.result("grad-norms")
        steps = [int(s) for s in norms["step"].values]
        source, loss = self.loss_series(ctx.store, norms)
        grad = norms["total_grad_norm"].data if "total_grad_norm" in norms else None
        task = dask.delayed(spike_table, pure=True)(
            loss,
            grad,
            steps=steps,
            window=self.window,
            threshold=self.threshold,
            floor=self.floor,
            tolerance=self.tolerance,
        )
        n = len(steps)
        variables = {}
        for key in ("loss", "grad_norm"):
            for suffix, dtype in (("", np.float64), ("_median", np.float64), ("_mad", np.float64), ("_spike", bool)):
                variables[key + suffix] = ("step", da.from_delayed(task[key + suffix], shape=(n,), dtype=dtype))
        for key in ("cooccurrence", "chance"):
            variables[key] = ((), da.from_delayed(task[key], shape=(), dtype=np.float64))
        result = xr.Dataset(variables, coords={"step": ("step", steps)})
        texts = {
            "loss": f"loss series: {source}",
            "grad_norm": "total_grad_norm of grad-norms (NaN without a model)",
            "cooccurrence": f"fraction of loss spikes with a gradient-norm spike within +-{self.tolerance} steps",
            "chance": "the same fraction for a loss spike at a uniformly random checkpoint",
        }
        for key in ("loss", "grad_norm"):
            result[f"{key}_median"].attrs["description"] = f"median of the previous {self.window} values"
            result[f"{key}_mad"].attrs["description"] = "1.4826 * median absolute deviation in the same window"
            result[f"{key}_spike"].attrs["description"] = (
                f"{key} - median > {self.threshold} * max(mad, {self.floor} * |median|)"
            )
        for key, text in texts.items():
            result[key].attrs["description"] = text
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``spikes``: loss and gradient norm with their detected spikes (Clustering Head Fig. 15-16)."""
        from ckpt.analyzers.figures.spikes import spike_figures

        return spike_figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Spike steps of both series, and their co-occurrence against chance."""
        options = result.ckpt.options
        steps = result["step"].values
        loss_at = steps[result["loss_spike"].values.astype(bool)]
        grad_at = steps[result["grad_norm_spike"].values.astype(bool)]

        def listing(at: np.ndarray) -> str:
            shown = ", ".join(str(int(s)) for s in at[:20])
            return f"{len(at)}" + (f" at steps {shown}" if len(at) else "") + (" ..." if len(at) > 20 else "")

        source = result["loss"].attrs.get("description", "loss")
        tolerance = options.get("tolerance", 0)
        co, chance = float(result["cooccurrence"]), float(result["chance"])
        return "\n".join(
            [
                f"  {len(steps)} checkpoints; window {options.get('window', 20)}, threshold"
                f" {options.get('threshold', 5.0)}; {source}",
                f"  loss spikes:      {listing(loss_at)}",
                f"  grad-norm spikes: {listing(grad_at)}",
                f"  loss spikes within +-{tolerance} steps of a grad-norm spike: {co:.3g} (chance {chance:.3g})",
            ]
        )


ckpt_register_analyzers = analyzer_hook(GradNorms, LossSpikes)


__all__ = [
    "EVALUATED",
    "LOSS_METRICS",
    "MAD_SCALE",
    "MIN_PERIODS",
    "UPDATE_BLOCK",
    "GradNorms",
    "LossSpikes",
    "chance_cooccurrence",
    "checkpoint_norms",
    "ckpt_register_analyzers",
    "cooccurrence",
    "detect_spikes",
    "layer_index",
    "layer_of",
    "minibatches",
    "near",
    "rolling_baseline",
    "spike_table",
]

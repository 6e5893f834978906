"""``spectrum``: the Hessian's trace and spectral density, of the whole model and per module block, per checkpoint.

At checkpoint t, for H the Hessian of the mean loss over ``--samples`` seeded examples of ``--split``:

- ``trace``: tr(H) by Hutchinson's estimator or Hutch++ (``--method``; Meyer, Musco, Musco &
  Woodruff 2021) over ``--probes`` Hessian-vector products, with its standard error;
- ``block_trace``: tr(H_mm) of each module's diagonal block, from the same probes and no product
  more (the part of a probe on a block's coordinates estimates that block's trace);
- ``ritz_values``, ``ritz_weights``: the spectral density (1/D) Σ_i δ(λ - λ_i) ≈
  Σ_runs Σ_nodes w δ(λ - θ) by stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017;
  Ghorbani, Krishnan & Xiao 2019): ``--slq-runs`` Lanczos runs of ``--slq-steps`` steps with full
  reorthogonalization from Rademacher starts; all weights together sum to 1;
- with ``--block-density``, the same density of every block H_mm
  (``block_ritz_values``/``block_ritz_weights``), at ``--slq-runs`` × ``--slq-steps`` products per
  module more: off by default.

The estimators are :mod:`ckpt.numerics.spectral`'s, over the products of
:class:`ckpt.numerics.derivatives.MeanLossHessian` as ``curvature`` and ``hessian-basis`` build
it. docs/spectrum.md says what the numbers mean and how to choose probes, steps and widths.

Memory: the kept gradient graphs of the subsample and the vectors the estimators keep (Hutch++'s
sketch, the Lanczos vectors) fit ``--max-memory``, or the vectors are spilled to a file (on the
CPU), or the graphs are rebuilt per product in blocks (:func:`plan_spectrum`); an impossible
budget is an error naming ``--max-memory``. One Dask task per checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._hessian_plan import GRAPH_PEAK, REBUILT_PEAK, SearchPlan
from ckpt.analyzers._hessian_search import graph_growth, hessian_operator
from ckpt.analyzers.basis import sample_examples
from ckpt.analyzers.curvature import Curvature, module_blocks
from ckpt.analyzers.spike_causes import check_model_and_split
from ckpt.engine.memory import format_size
from ckpt.numerics.derivatives import DTYPES, ParamSpace
from ckpt.numerics.lanczos_sizes import lanczos_bytes
from ckpt.numerics.spectral import METHODS, hutchinson, hutchpp, slq
from ckpt.plugins import (
    AnalysisContext,
    AnalysisError,
    Analyzer,
    Option,
    Worker,
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

HELD_VECTORS = 2
"""Vectors of D beside the estimators' own: the checkpoint's tensors and the product being made, tensor by tensor."""


def plan_spectrum(
    budget: int,
    dimension: int,
    vectors: int,
    examples: int,
    batch_size: int,
    graph: tuple[float, float],
    itemsize: int,
    *,
    extra: int = 0,
    can_spill: bool = True,
) -> SearchPlan:
    """Fit one checkpoint's products and ``vectors`` kept vectors of D into ``budget`` bytes.

    In order of speed: every example's graph kept with the vectors in memory; kept graphs with the
    vectors spilled (CPU); graphs rebuilt per product in blocks, the vectors in memory, then spilled.
    (``hessian-basis`` also keeps some graphs and rebuilds the rest; here the vectors are fewer and
    the whole search is one checkpoint's, so that middle step is left out.)
    The costs are those ``hessian-basis`` measured (:data:`GRAPH_PEAK`, :data:`REBUILT_PEAK`,
    :func:`lanczos_bytes`); ``extra`` bytes are held beside them (``--block-density``'s buffers).

    Raises
    ------
    AnalysisError
        When even one example's graph rebuilt per product with the vectors spilled does not fit.
    """
    fixed = HELD_VECTORS * dimension * itemsize + extra
    constant, per_example = graph
    in_memory = lanczos_bytes(dimension, vectors, itemsize)
    spilled = lanczos_bytes(dimension, vectors, itemsize, spilled=True)
    kept = sum(
        GRAPH_PEAK * (constant + per_example * min(batch_size, examples - start))
        for start in range(0, examples, batch_size)
    )
    if fixed + kept + in_memory <= budget:
        return SearchPlan(True, batch_size, vectors, int(fixed + kept + in_memory))
    if can_spill and fixed + kept + spilled <= budget:
        return SearchPlan(True, batch_size, vectors, int(fixed + kept + spilled), spill=True)
    for spill, search in ((False, in_memory), (True, spilled)) if can_spill else ((False, in_memory),):
        left = budget - fixed - search
        if REBUILT_PEAK * (constant + per_example) <= left:
            block = int(min(batch_size, examples, max(1, (left / REBUILT_PEAK - constant) // max(per_example, 1))))
            estimate = int(fixed + search + REBUILT_PEAK * (constant + per_example * block))
            return SearchPlan(False, block, vectors, estimate, spill=spill)
    msg = "does not fit"
    raise AnalysisError(msg)


def spectrum_blocks(model: Any, space: ParamSpace, patterns: str | None) -> list[tuple[str, ParamSpace]]:
    """:func:`ckpt.analyzers.curvature.module_blocks`, but a lone default block holding every parameter is split.

    A Hugging Face causal LM has one top-level child owning parameters (GPT-2's ``transformer``: its
    ``lm_head`` is tied to the embedding), whose block trace would be the trace again; by default its
    children are the blocks instead (``transformer.wte``, ``.wpe``, ``.h``, ``.ln_f``), level by level.
    """
    blocks = module_blocks(model, space, patterns)
    while patterns is None and len(blocks) == 1 and blocks[0][1].size == space.size:
        name = blocks[0][0]
        children = [f"{name}.{child}" for child, _ in model.get_submodule(name).named_children()]
        owning = [c for c in children if any(tensor.startswith(c + ".") for tensor in space.names)]
        if not owning:
            break
        blocks = module_blocks(model, space, ",".join(owning))
    return blocks


def kept_vectors(method: str, probes: int, slq_runs: int, slq_steps: int, dimension: int) -> int:
    """Vectors of D the estimators keep at once: Hutch++'s sketch, or the Lanczos vectors, whichever is more."""
    sketch = min(probes // 3, dimension) if method == "hutch++" else 0
    lanczos = min(slq_steps, dimension) if slq_runs else 0
    return max(sketch, lanczos, 1)


def _block_operator(hvp: Any, dimension: int, pieces: list[slice], dtype: Any, device: Any) -> Any:
    """``v_m -> (H [v_m; 0])_m``: the product of the diagonal block on ``pieces`` of the flat space."""
    import torch

    padded = torch.zeros(dimension, dtype=dtype, device=device)
    size = sum(s.stop - s.start for s in pieces)
    out = torch.empty(size, dtype=dtype, device=device)
    places = []
    start = 0
    for piece in pieces:
        places.append((piece, slice(start, start + piece.stop - piece.start)))
        start += piece.stop - piece.start

    def product(v: Any) -> Any:
        for piece, place in places:
            padded[piece] = v[place]
        full = hvp(padded)
        for piece, place in places:
            out[place] = full[piece]
        return out

    return product


def spectrum_at(
    worker: Worker,
    step: int,
    *,
    space: ParamSpace,
    blocks: list[list[int]],
    split: str,
    examples: np.ndarray,
    datapoints: int,
    objective: str | None,
    method: str,
    probes: int,
    slq_runs: int,
    slq_steps: int,
    block_density: bool,
    seed: int,
    batch_size: int,
    dtype: str,
) -> dict[str, np.ndarray]:
    """Trace, block traces and SLQ nodes of the mean-loss Hessian at ``step`` (on a worker).

    ``blocks``: each module's tensors, as indices into ``space.names``.
    """
    precision = torch_dtype(dtype)
    params = worker.params(step)
    primal = trainable(params, space, dtype)
    segments = [slice(o, o + s) for o, s in zip(space.offsets, space.sizes, strict=True)]
    steps = min(slq_steps, space.size)

    def block_loss(rows: np.ndarray) -> Any:
        return loss_function(worker, params, space, split=split, examples=rows, objective=objective, dtype=dtype)

    vectors = kept_vectors(method, probes, slq_runs, slq_steps, space.size)
    extra = 2 * space.size * precision.itemsize if block_density else 0
    try:
        plan = plan_spectrum(
            worker.memory_budget,
            space.size,
            vectors,
            len(examples),
            batch_size,
            graph_growth(block_loss, examples, primal),
            precision.itemsize,
            extra=extra,
            can_spill=str(worker.device) == "cpu",
        )
    except AnalysisError:
        msg = (
            f"spectrum at step {step} ({space.size:,} parameters, {vectors} vectors kept) does not fit the memory "
            f"budget of {format_size(worker.memory_budget)} per task, even one example at a time: raise --max-memory "
            "or lower --slq-steps / --probes"
        )
        raise AnalysisError(msg) from None
    hessian = hessian_operator(plan, block_loss, examples, 1.0 / datapoints, primal, batch_size)
    hvp = hessian.flat(space)
    common = {"dtype": precision, "device": worker.device}
    # the trace's probes and the Lanczos starts from different seeds: the first start is no probe's copy
    probe_seed, start_seed = 2 * (seed + step), 2 * (seed + step) + 1
    try:
        if method == "hutch++":
            estimate = hutchpp(hvp, space.size, probes, segments=segments, spill=plan.spill, seed=probe_seed, **common)
        else:
            estimate = hutchinson(hvp, space.size, probes, segments=segments, seed=probe_seed, **common)
        density = slq(hvp, space.size, slq_runs, steps, spill=plan.spill, seed=start_seed, **common)
        block_nodes = []
        if block_density:
            for tensors in blocks:
                pieces = [segments[i] for i in tensors]
                size = sum(s.stop - s.start for s in pieces)
                product = _block_operator(hvp, space.size, pieces, precision, worker.device)
                nodes = slq(product, size, slq_runs, min(steps, size), spill=plan.spill, seed=start_seed, **common)
                block_nodes.append(nodes)
    except AnalysisError as error:
        msg = f"spectrum at step {step}: {error}"
        raise AnalysisError(msg) from None
    finally:
        hessian.release()
    trace, stderr = estimate.block()
    per_block = [estimate.block(tensors) for tensors in blocks]
    probe_trace = np.full(probes, np.nan)
    probe_trace[: len(estimate.samples)] = estimate.exact.sum() + estimate.samples.sum(axis=1)
    values = np.full((slq_runs, slq_steps), np.nan)
    weights = np.zeros((slq_runs, slq_steps))
    values[:, :steps], weights[:, :steps] = density.values, density.weights
    out = {
        "trace": np.array(trace),
        "trace_stderr": np.array(stderr),
        "block_trace": np.array([b[0] for b in per_block]),
        "block_trace_stderr": np.array([b[1] for b in per_block]),
        "probe_trace": probe_trace,
        "ritz_values": values,
        "ritz_weights": weights,
        "products": np.array(estimate.products + density.products + sum(n.products for n in block_nodes), np.int64),
    }
    if block_density:
        block_values = np.full((len(blocks), slq_runs, slq_steps), np.nan)
        block_weights = np.zeros((len(blocks), slq_runs, slq_steps))
        for index, nodes in enumerate(block_nodes):
            width = nodes.values.shape[1]
            block_values[index, :, :width], block_weights[index, :, :width] = nodes.values, nodes.weights
        out["block_ritz_values"], out["block_ritz_weights"] = block_values, block_weights
    for name, value in out.items():
        if name in ("trace", "block_trace") and not np.isfinite(value).all():
            msg = f"spectrum at step {step}: the {name.replace('_', ' ')} is not finite; try --dtype float64"
            raise AnalysisError(msg)
    return out


class Spectrum(Analyzer):
    """Hessian trace (Hutchinson / Hutch++) and spectral density (SLQ), whole and per module block, per checkpoint."""

    name = "spectrum"
    version = "1"
    description = "Hessian trace (Hutchinson, Hutch++) and spectral density (Lanczos quadrature), per checkpoint."

    modules = Option(str, None, "Modules whose block traces are estimated (default: top-level; a lone one's children).")
    split = Option(str, None, "Split the Hessian is taken over (default: train when stored, else eval).")
    samples = Option(int, 1250, "Examples subsampled for the Hessian.", minimum=1)
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    method = Option(str, "hutch++", "Trace estimator.", choices=METHODS)
    probes = Option(int, 30, "Hessian-vector products of the trace estimate.", minimum=2)
    slq_runs = Option(int, 4, "Lanczos runs (random starts) of the spectral density (0: the traces alone).", minimum=0)
    slq_steps = Option(int, 32, "Lanczos steps per run: the quadrature nodes.", minimum=2)
    block_density = Option(bool, False, "Also each module block's density (slq-runs x slq-steps products a block).")
    seed = Option(int, 0, "Seed of the data subsample and the probes (plus the step).", minimum=0)
    dtype = Option(str, "float32", "Precision of the computation.", choices=DTYPES)
    batch_size = Option(int, 256, "Examples per forward pass (bounds memory).", minimum=1)

    # the same defaults as curvature's: --split, else train when stored, else eval; only that split is read
    hessian_split = Curvature.hessian_split
    data_splits = Curvature.data_splits

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; the module blocks are resolved on the model built here."""
        store = ctx.store
        split = self.hessian_split(store)
        check_model_and_split(store, split, self.name)
        if self.method == "hutch++" and self.probes < 6:
            msg = f"--probes {self.probes}: hutch++ needs at least 6 (a sketch, its products, probes: a third each)"
            raise AnalysisError(msg)
        model = store.model.build()
        space = parameter_space(store, model)
        named = spectrum_blocks(model, space, self.modules)
        index = {name: i for i, name in enumerate(space.names)}
        blocks = [[index[n] for n in block.names] for _, block in named]
        examples = sample_examples(store.data(split).sizes["example"], self.samples, self.seed)
        example_of, _ = datapoint_index(store, split, self.objective)
        datapoints = int(np.isin(example_of, examples).sum())
        if datapoints == 0:
            msg = f"the Hessian subsample of split {split!r} has no datapoints; raise --samples or choose --split"
            raise AnalysisError(msg)
        schema: dict[str, Any] = {
            "trace": ((), np.float64),
            "trace_stderr": ((), np.float64),
            "block_trace": (("module",), np.float64),
            "block_trace_stderr": (("module",), np.float64),
            "probe_trace": (("probe",), np.float64),
            "ritz_values": (("slq_run", "node"), np.float64),
            "ritz_weights": (("slq_run", "node"), np.float64),
            "products": ((), np.int64),
        }
        if self.block_density:
            schema["block_ritz_values"] = (("module", "slq_run", "node"), np.float64)
            schema["block_ritz_weights"] = (("module", "slq_run", "node"), np.float64)
        result = ctx.map_checkpoints(
            spectrum_at,
            schema,
            sizes={"module": len(named), "probe": self.probes, "slq_run": self.slq_runs, "node": self.slq_steps},
            coords={
                "module": np.array([name for name, _ in named], dtype=object),
                "parameters": ("module", np.array([block.size for _, block in named], np.int64)),
            },
            space=space,
            blocks=blocks,
            split=split,
            examples=examples,
            datapoints=datapoints,
            objective=self.objective,
            method=self.method,
            probes=self.probes,
            slq_runs=self.slq_runs,
            slq_steps=self.slq_steps,
            block_density=self.block_density,
            seed=self.seed,
            batch_size=self.batch_size,
            dtype=self.dtype,
        )
        self._describe(result, f"the mean loss over {len(examples)} examples of split {split!r}", space.size)
        for name in ("trace", "block_trace", "probe_trace"):  # variables' attrs are stored, a dataset's are not
            result[name].attrs["method"] = self.method
        result.attrs.update(method=self.method, hessian_split=split)
        return result

    def _describe(self, result: xr.Dataset, mean: str, dimension: int) -> None:
        estimator = "Hutch++" if self.method == "hutch++" else "Hutchinson's estimator"
        attrs = {
            "trace": ("Hessian trace", f"tr(H), H the Hessian of {mean}, by {estimator}"),
            "trace_stderr": ("standard error of the trace", "probes' standard deviation (ddof 1) / √probes"),
            "block_trace": ("trace of the module's block", "tr(H_mm) of the module's diagonal block, same probes"),
            "block_trace_stderr": ("standard error of the block trace", "as trace_stderr, for the block"),
            "probe_trace": (
                "one probe's trace estimate",
                "each probe's estimate alone (Hutch++: its residual "
                "probes, each with the sketch's exact part); NaN where a probe has none",
            ),
            "ritz_values": ("Ritz value θ", "nodes of stochastic Lanczos quadrature; NaN past a run's breakdown"),
            "ritz_weights": (
                "quadrature weight",
                f"density of the eigenvalues of H (D = {dimension:,}) ≈ Σ w δ(λ - θ) "
                "over runs and nodes; all weights sum to 1",
            ),
            "products": ("Hessian-vector products", "products this checkpoint used"),
            "block_ritz_values": ("Ritz value θ of the module's block", "as ritz_values, for H_mm"),
            "block_ritz_weights": ("quadrature weight of the module's block", "as ritz_weights, for H_mm"),
        }
        for name, (long_name, description) in attrs.items():
            if name in result:
                result[name].attrs.update(long_name=long_name, description=description)
        result["parameters"].attrs["description"] = "trainable parameters in the module's block"

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``density``: the smoothed log-density per checkpoint; ``trace``: trace and block traces over steps."""
        from ckpt.analyzers.figures.spectrum import spectrum_figures

        return spectrum_figures(result)

    def summarize(self, result: xr.Dataset) -> str:
        """Trace ± stderr, block traces and the extreme Ritz values at the first and last checkpoints."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        modules = [str(m) for m in result["module"].values]
        width = max(12, *(len(m) for m in modules))
        ends = [0, -1] if len(steps) > 1 else [0]
        rows = [f"  {'':<{width}}" + "".join(f"  {'step ' + str(int(steps[j])):>22}" for j in ends)]
        trace, stderr = result["trace"].values, result["trace_stderr"].values
        rows.append(f"  {'trace':<{width}}" + "".join(f"  {f'{trace[j]:.5g} ± {stderr[j]:.2g}':>22}" for j in ends))
        for i, module in enumerate(modules):
            cells = "".join(f"  {result['block_trace'].values[j, i]:>22.5g}" for j in ends)
            rows.append(f"  {module:<{width}}{cells}")
        values = result["ritz_values"].values
        if np.isfinite(values).any():  # none with --slq-runs 0
            for label, pick in (("λ_max (Ritz)", np.nanmax), ("λ_min (Ritz)", np.nanmin)):
                rows.append(f"  {label:<{width}}" + "".join(f"  {pick(values[j]):>22.5g}" for j in ends))
        rows.append(f"  method {result['trace'].attrs.get('method', '?')}")
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Spectrum)


__all__ = ["Spectrum", "ckpt_register_analyzers", "kept_vectors", "plan_spectrum", "spectrum_at", "spectrum_blocks"]

"""``essential-dynamics``: the developmental path of a run, PCA of its outputs over checkpoints.

Hoogland, Wang, Farrugia-Roberts, Carroll, Wei & Murfet (2024), "Loss Landscape Degeneracy
Drives Stagewise Development in Transformers", read the stages of training off the
*essential dynamics*: checkpoint t gives the vector f_t of the model's outputs on a fixed probe
set (every datapoint's logits, flattened and concatenated); the rows F[t, :] = f_t, centred over
checkpoints, are decomposed by PCA, and the path of the checkpoints in the leading components
shows the stages as its turns. That paper is not in our reference text; this module follows
the method as published in devinterp (``devinterp.slt.pca``: PCA of the flattened outputs,
Gaussian smoothing of each component over checkpoints, sharp turns of the smoothed path).

Exact PCA without holding F: with F_c = F - 1 μᵀ (μ the mean over checkpoints of each output),
the T x T Gram matrix G = F_c F_cᵀ = Σ_b F_c[:, b] F_c[:, b]ᵀ is a sum over blocks b of
datapoints (centring is per column, so each block centres itself); G = U Λ Uᵀ gives the
principal-component scores F_c V = U Λ^½ and the explained variance ratios λ_k / tr G, the
SVD of F_c without its right singular vectors (D of them, the outputs' length). One Dask task per
(checkpoint, block) computes the block's outputs; one per block adds its Gram to the sum. A
block's outputs at every checkpoint are held until its Gram is added, and at most two blocks
are in flight (the outputs of block b wait for the sum through block b - 2): blocks are sized
so that two fit the memory budget. Each block reads every checkpoint, so a probe set of B
blocks reads each checkpoint B times. Each block's Gram is committed to the journal
(``analyses/essential-dynamics.partial``, :class:`ckpt.engine.resume.Journal`) as soon as it is
computed, keyed by the block's examples, the outputs, the steps and their checkpoints' digests; a
rerun of the same request after a kill takes those blocks and computes only the others' outputs.

The path (:mod:`ckpt.analyzers._essential_path`): each component's scores smoothed over checkpoints
by a Gaussian of σ = ``--smoothing`` checkpoints (default :data:`SMOOTHING_SPAN` of them, at least
1; scipy's ``gaussian_filter1d``, the filter devinterp uses). At checkpoint t the *turning angle* is
the angle between the smoothed path's displacements p_t - p_(t-w) and p_(t+w) - p_t in the leading
components (w = max(1, round(2σ)) checkpoints); a *turning point* is a local maximum (within ±w) of
the angle of at least ``--turn-angle`` degrees where both displacements are at least
:data:`MIN_SPEED` of the path's largest (a path at rest has no direction). ``stage`` counts the
turning points up to each checkpoint: 0, 1, ..., a turning point opening the next stage.
``extremum`` marks where a smoothed component's derivative changes sign (its prominent local maxima
and minima). :func:`llc_boundaries` finds the plateaus of a stored ``llc`` curve, the paper's other
mark of stage boundaries; the figures draw them when the store holds one.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._essential_path import (
    EXTREMUM_PROMINENCE,
    MIN_SPEED,
    extrema,
    llc_boundaries,
    pca_from_gram,
    smoothed,
    stages,
    turning_angles,
    turning_points,
    window_of,
)
from ckpt.analyzers.basis import sample_examples
from ckpt.engine.memory import default_budget, format_size
from ckpt.engine.resume import Journal
from ckpt.engine.worker import worker_for
from ckpt.plugins import PER_RUN, AnalysisContext, AnalysisError, Analyzer, Option, Worker, datapoint_index
from ckpt.plugins.manager import analyzer_hook
from ckpt.plugins.objectives import logits_of

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

OUTPUTS = ("auto", "logits", "loss")
"""What ``--outputs`` can decompose (auto: :data:`LOGITS_WIDTH`)."""

LOGITS_WIDTH = 1024
"""``--outputs auto`` takes the logits when each datapoint has at most this many (class outputs, small
vocabularies), else the per-datapoint losses: a 50k vocabulary makes T x datapoints x 50k numbers."""

SMOOTHING_SPAN = 1 / 40
"""Default σ as a share of the checkpoints: training noise late in a run of many checkpoints made
a turning point of nearly every wiggle at σ = 1
(docs/essential-dynamics.md, "Choosing outputs, components and smoothing")."""

FORWARD_SHARE = 8
"""A forward pass takes at most 1/FORWARD_SHARE of a task's budget in logits (``--batch-size`` is lowered
to fit): the model's activations come beside them, and a 50k vocabulary makes 25 MB of logits per
128-token sequence."""

ROUNDING_RATIO = 1e-8
"""A component explaining less than this fraction of the variance holds rounding error: no extrema marked."""

GRAM_COLUMNS_BYTES = 64 * 2**20
"""Bytes of float64 centred outputs a block's Gram is accumulated from at a time."""


def decompose(
    worker: Worker, gram: np.ndarray, *, components: int, smoothing: float, turn_angle: float
) -> dict[str, np.ndarray]:
    """The result's values from the summed Gram matrix (a task: the last of the graph)."""
    scores, ratio, variance = pca_from_gram(gram, components)
    path = smoothed(scores, smoothing)
    window = window_of(smoothing)
    angles = turning_angles(path, window)
    turning = turning_points(angles, window, turn_angle)
    return {
        "projection": scores,
        "smoothed": path,
        "explained_variance_ratio": ratio,
        "explained_variance": variance,
        "turning_angle": angles,
        "turning_point": turning,
        "stage": stages(turning),
        # a component of rounding error only (a path of fewer dimensions) has no extrema worth a mark
        "extremum": extrema(path) & (ratio >= ROUNDING_RATIO),
        "total_variance": np.asarray(float(np.trace(gram)) / max(1, len(gram) - 1)),
    }


# -- the outputs (on a worker) -------------------------------------------------------------------------
def _batch(worker: Worker, split: str, rows: np.ndarray) -> tuple[Any, Any, Any]:
    import torch

    data = worker.data(split)
    index = torch.as_tensor(rows, device=data["inputs"].device)
    targets = data["targets"][index] if "targets" in data else data["inputs"][index]
    mask = data["mask"][index] if "mask" in data else None
    return data["inputs"][index], targets, mask


def outputs_of(worker: Worker, params: Any, split: str, rows: np.ndarray, objective: str | None, kind: str) -> Any:
    """The outputs of examples ``rows`` as one flat float tensor: each datapoint's logits, or losses.

    Logits: with an objective that names its datapoints' rows (``token_rows``: token objectives)
    the logits at each datapoint, flattened in datapoint order; otherwise every example's whole
    output, flattened in example order.
    """
    inputs, targets, mask = _batch(worker, split, rows)
    fn = worker.objective(objective)
    outputs = worker.outputs(params, inputs)
    if kind == "loss":
        return fn.losses(outputs, targets, mask).double().flatten()
    logits = logits_of(outputs)
    if fn.token_rows is not None:
        index, _ = fn.token_rows(targets, mask)
        return logits.flatten(0, -2)[index].float().flatten()
    return logits.float().flatten()


def block_outputs(
    worker: Worker,
    step: int,
    *,
    split: str,
    examples: np.ndarray,
    objective: str | None,
    kind: str,
    batch_size: int,
    width: int,
    after: Any = None,
) -> np.ndarray:
    """The outputs of one block of examples at ``step`` (a task; ``after``: only orders it)."""
    import torch

    params = worker.params(step)
    pieces = []
    with worker.computing(), torch.no_grad():
        for begin in range(0, len(examples), batch_size):
            rows = examples[begin : begin + batch_size]
            pieces.append(outputs_of(worker, params, split, rows, objective, kind).cpu().numpy())
    values = np.concatenate(pieces)
    if values.shape != (width,):
        msg = (
            f"essential-dynamics: the {kind} of {len(examples)} examples at step {step} are {values.size} numbers, "
            f"where the first checkpoint gave {width}: the model's outputs change shape between checkpoints"
        )
        raise AnalysisError(msg)
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        msg = (
            f"essential-dynamics: {bad} of the {kind} at step {step} are NaN or inf: the checkpoint diverged "
            "or the model overflows there, and the path needs finite outputs at every checkpoint"
        )
        raise AnalysisError(msg)
    return values


def block_gram(worker: Worker, *outputs: np.ndarray, journal: Journal | None, key: Any) -> np.ndarray:
    """The Gram matrix of one block's outputs, centred over checkpoints, committed to ``journal`` (a task)."""
    import xarray as xr

    count = len(outputs)
    gram = np.zeros((count, count))
    columns = max(1, GRAM_COLUMNS_BYTES // (8 * count))
    # column by column: centring is per column, and no copy of the whole block is made
    for start in range(0, len(outputs[0]), columns):
        rows = np.stack([values[start : start + columns] for values in outputs]).astype(np.float64)
        rows -= rows.mean(axis=0)
        gram += rows @ rows.T
    if journal is not None:
        journal.add(xr.Dataset({"gram": (("block", "row", "column"), gram[None])}), "block", key)
    return gram


def journaled_gram(worker: Worker, *, journal: Journal, key: Any) -> np.ndarray:
    """A block's Gram matrix as an interrupted run of this request committed it (a task)."""
    loaded = journal.pieces([key])
    if loaded is None:
        msg = f"the pieces of {journal.partial} changed while this run read them (another run?); rerun the command"
        raise AnalysisError(msg)
    saved, found = loaded
    return np.asarray(saved["gram"].isel(block=found[0]).values, dtype=np.float64)


def reached(worker: Worker, total: np.ndarray) -> bool:
    """True once ``total`` is computed: what a later block's output tasks wait for (a task)."""
    return True


def summed(worker: Worker, previous: np.ndarray | None, gram: np.ndarray) -> np.ndarray:
    """The Gram matrices of the blocks so far (a task: the sum is built one block at a time)."""
    return gram if previous is None else previous + gram


def probe_width(worker: Worker, step: int, split: str, example: int, objective: str | None) -> tuple[int, bool, int]:
    """Logits of one example at ``step``: numbers per datapoint (or per example), whether per datapoint, all."""
    import torch

    params = worker.params(step)
    with worker.computing(), torch.no_grad():
        inputs, _, _ = _batch(worker, split, np.array([example]))
        logits = logits_of(worker.outputs(params, inputs))
    full = int(logits[0].numel())
    if worker.objective(objective).token_rows is not None:
        return int(logits.shape[-1]), True, full
    return full, False, full


def block_keys(store: Any, steps: list[int], examples: np.ndarray, blocks: list[slice], kind: str) -> list | None:
    """Journal key of each block's Gram: its examples, the outputs, the steps and their checkpoints' digests.

    None when the store records no digests: a piece could not be tied to its checkpoints, so
    nothing is journaled.
    """
    digests = [store.checkpoint_digest(step) for step in steps]
    if any(digest is None for digest in digests):
        return None
    run = hashlib.sha256(json.dumps([kind, steps, digests]).encode()).hexdigest()
    return [
        [index, hashlib.sha256(np.ascontiguousarray(examples[block], dtype=np.int64).tobytes()).hexdigest(), run]
        for index, block in enumerate(blocks)
    ]


def resumable(journal: Journal | None, keys: list, count: int) -> set[int]:
    """The blocks whose Gram an interrupted run of this request committed; a journal of another layout is discarded."""
    if journal is None:
        return set()
    loaded = journal.pieces(keys)
    if loaded is None:
        journal.discard()
        return set()
    saved, found = loaded
    if "gram" not in saved or saved["gram"].shape[1:] != (count, count):
        journal.discard()
        return set()
    return set(found)


class EssentialDynamics(Analyzer):
    """PCA of the model's outputs on a probe set over checkpoints: the path, its turning points, stages."""

    name = "essential-dynamics"
    version = "1"
    description = "PCA of the outputs on a probe set across checkpoints: developmental path, turning points, stages."
    per = PER_RUN
    min_checkpoints = 3

    split = Option(str, "eval", "Data split whose examples are the probe set.")
    outputs = Option(
        str,
        "auto",
        "What each checkpoint's vector holds: logits, or per-datapoint losses (auto: logits up to 1024 per datapoint).",
        choices=OUTPUTS,
    )
    samples = Option(int, 512, "Examples of the split in the probe set (a seeded subsample).", minimum=1)
    components = Option(int, 3, "Principal components kept.", minimum=1)
    smoothing = Option(
        float,
        None,
        "Gaussian smoothing of the path, σ in checkpoints (0: none; default: checkpoints/40, at least 1).",
        minimum=0,
    )
    turn_angle = Option(float, 45.0, "Least turning angle (degrees) of a turning point.", minimum=0, maximum=180)
    seed = Option(int, 0, "Seed of the probe subsample.", minimum=0)
    batch_size = Option(int, 256, "Examples per forward pass (bounds memory).", minimum=1)
    objective = Option(str, None, "Per-datapoint loss, and which logits are a datapoint's (default: the store's).")

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """Only the probe split."""
        return (self.split,)

    def preflight(self, store: Any) -> None:
        """Refuse a missing split, too few checkpoints, or more components than they carry."""
        if self.split not in store.splits:
            have = ", ".join(store.splits) or "none"
            msg = f"{store.path} has no data split {self.split!r} (it has: {have}); choose one with --split"
            raise AnalysisError(msg)
        count = len(store.steps)
        if count < self.min_checkpoints:
            msg = (
                f"essential-dynamics follows the path of the checkpoints and needs at least {self.min_checkpoints} "
                "for it to turn; "
                f"{store.path} has {count}: run it once the store holds three or more"
            )
            raise AnalysisError(msg)
        if self.components > count - 1:
            msg = (
                f"--components {self.components}: {count} checkpoints carry at most {count - 1} principal "
                f"components; choose --components {count - 1} or fewer"
            )
            raise AnalysisError(msg)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """Blocks of probe examples; a task per (checkpoint, block), a Gram sum per block, one decomposition."""
        import dask.array as da
        import xarray as xr

        store = ctx.store
        self.preflight(store)
        steps = [int(s) for s in ctx.steps]
        examples = sample_examples(store.data(self.split).sizes["example"], self.samples, self.seed)
        example_of, _ = datapoint_index(store, self.split, self.objective)
        per_example = np.bincount(example_of, minlength=store.data(self.split).sizes["example"])[examples]
        if per_example.sum() == 0:
            msg = f"the probe examples of split {self.split!r} hold no datapoints; raise --samples or choose --split"
            raise AnalysisError(msg)
        kind, width, full = self._widths(ctx, steps[0], examples, per_example)
        budget = ctx.spec.max_memory if ctx.spec.max_memory is not None else default_budget(ctx.spec.device)
        blocks = self._blocks(budget, examples, width, len(steps), kind)
        # a forward pass's float32 logits within 1/FORWARD_SHARE of a task's budget, beside the model's activations
        rows = min(self.batch_size, max(1, budget // max(1, ctx.spec.tasks) // (FORWARD_SHARE * 4 * full)))
        keys = block_keys(store, steps, examples, blocks, kind)
        journal = ctx.journal if keys is not None else None
        resumed = resumable(journal, keys or [], len(steps))
        total: Any = None
        done: list[Any] = []
        for index, block in enumerate(blocks):
            key = None if keys is None else keys[index]
            if index in resumed:
                gram = ctx.delayed(journaled_gram, journal=journal, key=key)
            else:
                # at most two blocks' outputs held at once; the marker, not the sum, is sent to each task
                after = ctx.delayed(reached, done[index - 2]) if index >= 2 else None
                outputs = [
                    ctx.delayed(
                        block_outputs,
                        step,
                        split=self.split,
                        examples=examples[block],
                        objective=self.objective,
                        kind=kind,
                        batch_size=rows,
                        width=int(width[block].sum()),
                        after=after,
                    )
                    for step in steps
                ]
                gram = ctx.delayed(block_gram, *outputs, journal=journal, key=key)
            total = ctx.delayed(summed, total, gram)
            done.append(total)
        task = ctx.delayed(
            decompose, total, components=self.components, smoothing=self.sigma(len(steps)), turn_angle=self.turn_angle
        )
        count, k = len(steps), self.components
        shapes = {
            "projection": (("step", "component"), (count, k), np.float64),
            "smoothed": (("step", "component"), (count, k), np.float64),
            "explained_variance_ratio": (("component",), (k,), np.float64),
            "explained_variance": (("component",), (k,), np.float64),
            "turning_angle": (("step",), (count,), np.float64),
            "turning_point": (("step",), (count,), bool),
            "stage": (("step",), (count,), np.int64),
            "extremum": (("step", "component"), (count, k), bool),
            "total_variance": ((), (), np.float64),
        }
        variables = {
            name: (dims, da.from_delayed(task[name], shape=shape, dtype=dtype))
            for name, (dims, shape, dtype) in shapes.items()
        }
        result = xr.Dataset(variables, coords={"step": steps, "component": np.arange(1, k + 1)})
        self._describe(result, kind, len(examples), int(width.sum()), int(per_example.sum()))
        return result

    def _widths(
        self, ctx: AnalysisContext, first: int, examples: np.ndarray, per_example: np.ndarray
    ) -> tuple[str, np.ndarray, int]:
        """The outputs decomposed, the numbers each probe example adds to a checkpoint's vector, its logits' size."""
        # the logits' size is known only from the model: one example through it, here
        probe = int(examples[np.flatnonzero(per_example)[0]])
        size, per_datapoint, full = probe_width(worker_for(ctx.spec), first, self.split, probe, self.objective)
        datapoint_width = size if per_datapoint else -(-size // max(1, int(per_example.max())))
        if self.outputs == "loss" or (self.outputs == "auto" and datapoint_width > LOGITS_WIDTH):
            return "loss", per_example.astype(np.int64), full
        width = per_example * size if per_datapoint else np.full(len(examples), size)
        return "logits", width.astype(np.int64), full

    def _blocks(self, budget: int, examples: np.ndarray, width: np.ndarray, count: int, kind: str) -> list:
        """Consecutive probe examples whose outputs at every checkpoint fit, two blocks at once, the budget."""
        itemsize = 4 if kind == "logits" else 8
        # two blocks held at once; half the budget, the other half for the forward passes and the Gram
        limit = budget // 2 // (2 * count * itemsize)
        largest = int(width.max())
        if largest > limit:
            need = 4 * count * itemsize * largest
            msg = (
                f"essential-dynamics: the {kind} of one probe example at all {count} checkpoints "
                f"({format_size(count * itemsize * largest)}) must fit four times in the memory budget of "
                f"{format_size(budget)} (two blocks held, half left for the passes): raise --max-memory to at "
                f"least {format_size(need)}" + (" or use --outputs loss" if kind == "logits" else "")
            )
            raise AnalysisError(msg)
        blocks, start, held = [], 0, 0
        for index, size in enumerate(width.tolist()):
            if held + size > limit and index > start:
                blocks.append(slice(start, index))
                start, held = index, 0
            held += size
        blocks.append(slice(start, len(width)))
        return blocks

    def sigma(self, checkpoints: int) -> float:
        """σ of the smoothing: ``--smoothing``, else :data:`SMOOTHING_SPAN` of the checkpoints, at least 1."""
        if self.smoothing is not None:
            return float(self.smoothing)
        return max(1.0, checkpoints * SMOOTHING_SPAN)

    def _describe(self, result: xr.Dataset, kind: str, examples: int, features: int, datapoints: int) -> None:
        """Variable attributes, and what the path was computed from."""
        sigma = self.sigma(result.sizes["step"])
        probe = f"the {kind} of {examples} examples ({datapoints} datapoints) of split {self.split!r}"
        result["projection"].attrs.update(
            long_name="principal-component score", description=f"checkpoint outputs ({probe}), centred, on each PC"
        )
        result["smoothed"].attrs.update(
            long_name="smoothed score",
            description=f"projection smoothed by a Gaussian of σ={sigma:g} checkpoints",
        )
        result["explained_variance_ratio"].attrs["description"] = "eigenvalue over the total variance"
        result["explained_variance"].attrs["description"] = "eigenvalue / (checkpoints - 1)"
        result["total_variance"].attrs["description"] = "trace of the covariance of the outputs over checkpoints"
        result["turning_angle"].attrs.update(
            units="degrees", description="angle between the smoothed path's displacements before and after the step"
        )
        result["turning_point"].attrs["description"] = (
            f"local maximum of the turning angle of at least {self.turn_angle} degrees"
        )
        result["stage"].attrs["description"] = "turning points at or before the step: 0, 1, ..."
        result["extremum"].attrs["description"] = "the smoothed component's derivative changes sign"
        # the engine keeps variables' attributes (the group's are its provenance)
        result["projection"].attrs.update(
            outputs=kind, features=features, probe_examples=examples, probe_datapoints=datapoints, split=self.split
        )
        result["smoothed"].attrs.update(smoothing_sigma=sigma, turning_window=window_of(sigma))

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``path`` (PC pairs coloured by step), ``components`` (PCs over steps), ``variance`` (ratios)."""
        from ckpt.analyzers.figures.essential_dynamics import figures

        return figures(result, store)

    def summarize(self, result: xr.Dataset) -> str:
        """Explained variance of each component, and the turning points."""
        ratios = result["explained_variance_ratio"].values
        probe, path = result["projection"].attrs, result["smoothed"].attrs
        rows = [
            f"  {probe.get('outputs', '?')} of {probe.get('probe_examples', '?')} examples "
            f"({probe.get('features', '?')} numbers per checkpoint), smoothed by σ = "
            f"{float(path.get('smoothing_sigma', float('nan'))):.3g} checkpoints"
        ]
        rows += [f"  PC{index + 1}  {ratio:7.2%} of the variance" for index, ratio in enumerate(ratios)]
        turning = result["step"].values[result["turning_point"].values.astype(bool)]
        rows.append(f"  turning points at steps: {', '.join(str(int(s)) for s in turning) or 'none'}")
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(EssentialDynamics)


__all__ = [
    "EXTREMUM_PROMINENCE",
    "LOGITS_WIDTH",
    "MIN_SPEED",
    "OUTPUTS",
    "EssentialDynamics",
    "block_gram",
    "block_keys",
    "block_outputs",
    "ckpt_register_analyzers",
    "decompose",
    "extrema",
    "journaled_gram",
    "llc_boundaries",
    "outputs_of",
    "pca_from_gram",
    "reached",
    "resumable",
    "smoothed",
    "stages",
    "summed",
    "turning_angles",
    "turning_points",
    "window_of",
]

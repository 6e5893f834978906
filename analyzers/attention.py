"""``attention``: the attention weights of every layer and head on the probe examples, at every checkpoint.

Clustering Head §4.2 (Fig. 8) compares the attention maps at the start and at the
end of training: the final maps are correlated with the initial ones, so the
circuit found depends on the initial weights. At every checkpoint this analyzer
stores the attention weights of each layer and head for the first ``--examples``
examples of ``--split`` (all by default), and ``start_end_correlation``: per layer
and head, the Pearson correlation, over examples x query x key entries, of the
checkpoint's weights with the first checkpoint's. At the last checkpoint it is
Fig. 8's start-to-end correlation. Entries that are zero at both checkpoints
(future keys under a causal mask) are left out: they would correlate perfectly
whatever the model learned.

Which models (looked for in this order):

1. modules with an ``attention_weights(x)`` method taking the module's own input
   and returning ``[examples, heads, query, key]``: ckpt's sandboxes
   (``sparse-modular-addition``'s single learned query ``attn``, one head and
   one query; ``addition`` and ``tiny-lm``'s ``blocks.i``);
2. ``torch.nn.MultiheadAttention`` modules: each is called again, inside the
   model's forward pass, with ``need_weights=True, average_attn_weights=False``
   (its own per-head weights);
3. Hugging Face models that return attentions (``output_attentions=True``; GPT-2
   and others, switched to the eager attention that computes them).

Any other model is an error naming what was looked for. The weights are the
model's own, not recomputed by ckpt.

Memory: ``weights`` is examples x layers x heads x queries x keys float32 per
checkpoint; a task holds it and the first checkpoint's, so an error naming
``--examples`` and ``--max-memory`` stops a run whose two copies pass half of the
budget, before any work. Forward passes in chunks of ``--batch-size`` examples
under ``torch.no_grad``. One Dask task per checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers._one_split import OneSplit
from ckpt.analyzers.spike_causes import check_model_and_split
from ckpt.engine.memory import format_size
from ckpt.plugins import AnalysisContext, AnalysisError, Analyzer, Option, Worker
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

WEIGHTS_SHARE = 2
"""The weights of a checkpoint and of the first one may use 1/WEIGHTS_SHARE of a task's budget."""
LOOKED_FOR = (
    "modules with an attention_weights(x) method (ckpt's sandboxes), torch.nn.MultiheadAttention modules, "
    "and a Hugging Face model returning attentions (output_attentions=True)"
)


def attention_layers(model: Any) -> tuple[str, list[str]]:
    """(kind, layer names) of ``model``'s attention: ``"method"``, ``"multihead"`` or ``"huggingface"``.

    Raises
    ------
    AnalysisError
        When the model has none of them.
    """
    from torch import nn

    modules = [(name, module) for name, module in model.named_modules() if name]
    found = [name for name, module in modules if callable(getattr(module, "attention_weights", None))]
    if found:
        return "method", found
    found = [name for name, module in modules if isinstance(module, nn.MultiheadAttention)]
    if found:
        return "multihead", found
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "output_attentions"):
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
        if layers:
            return "huggingface", [f"attentions.{i}" for i in range(int(layers))]
    msg = (
        f"the model ({type(model).__name__}) has no attention the attention analyzer can read: looked for {LOOKED_FOR}"
    )
    raise AnalysisError(msg)


def _eager(model: Any) -> None:
    """Switch a Hugging Face model to eager attention, the implementation that returns the weights."""
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter("eager")
    else:  # older transformers
        model.config._attn_implementation = "eager"


def attention_weights(model: Any, params: dict[str, Any], kind: str, layers: list[str], inputs: Any) -> list[Any]:
    """Per layer, ``[examples, heads, query, key]`` weights of the model's forward pass on ``inputs``.

    The hooks call the module's own weight computation while ``functional_call`` has the
    checkpoint's tensors in place, so they see exactly what the forward pass uses.
    """
    import torch
    from torch.func import functional_call

    if kind == "huggingface":
        _eager(model)
        with torch.no_grad():
            outputs = functional_call(model, params, (inputs,), {"output_attentions": True})
        return [a.detach() for a in outputs.attentions]
    found: dict[str, list[Any]] = {name: [] for name in layers}
    inside = {"again": False}  # a MultiheadAttention called again from its own hook must not recurse

    def hook(name: str) -> Callable[..., None]:
        def keep(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if inside["again"]:
                return
            if kind == "method":
                found[name].append(module.attention_weights(*args).detach())
                return
            inside["again"] = True
            try:
                options = {**kwargs, "need_weights": True, "average_attn_weights": False}
                weights = module(*args, **options)[1]
            finally:
                inside["again"] = False
            found[name].append(weights.detach() if weights.ndim == 4 else weights.detach()[None])

        return keep

    named = dict(model.named_modules())
    handles = [named[name].register_forward_hook(hook(name), with_kwargs=True) for name in layers]
    try:
        with torch.no_grad():
            functional_call(model, params, (inputs,))
    finally:
        for handle in handles:
            handle.remove()
    for name, calls in found.items():
        if len(calls) != 1:
            msg = f"attention module {name!r} was called {len(calls)} times in one forward pass, expected once"
            raise AnalysisError(msg)
    return [found[name][0] for name in layers]


def _shape(weights: list[Any], layers: list[str]) -> tuple[int, int, int]:
    shapes = {tuple(w.shape[1:]) for w in weights}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3:
        listing = ", ".join(f"{n}: {tuple(w.shape)}" for n, w in zip(layers, weights, strict=True))
        msg = f"attention weights of the layers differ in heads or length ({listing}); expected one shape"
        raise AnalysisError(msg)
    heads, queries, keys = next(iter(shapes))
    return heads, queries, keys


def correlation(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Pearson correlation per (layer, head) of ``[layer, head, example, query, key]`` arrays.

    Entries zero at both (masked keys) are left out; NaN where fewer than two entries remain
    or one side is constant.
    """
    layers, heads = start.shape[:2]
    result = np.full((layers, heads), np.nan)
    for i in range(layers):
        for h in range(heads):
            a, b = start[i, h].ravel().astype(np.float64), end[i, h].ravel().astype(np.float64)
            kept = (a != 0) | (b != 0)
            a, b = a[kept], b[kept]
            if a.size < 2 or a.std() == 0 or b.std() == 0:
                continue
            result[i, h] = float(np.corrcoef(a, b)[0, 1])
    return result


def weights_at(
    worker: Worker,
    step: int,
    *,
    kind: str,
    layers: list[str],
    split: str,
    examples: int,
    batch_size: int,
) -> np.ndarray:
    """``[layer, head, example, query, key]`` float32 attention weights at ``step`` (on a worker)."""
    import torch

    model = worker.model
    params = worker.params(step)
    inputs = worker.data(split)["inputs"][:examples]
    parts = []
    with worker.computing():
        for begin in range(0, examples, batch_size):
            chunk = attention_weights(model, params, kind, layers, inputs[begin : begin + batch_size])
            _shape(chunk, layers)
            parts.append(torch.stack([w.to(torch.float32) for w in chunk]).cpu().numpy())
    weights = np.concatenate(parts, axis=1)  # [layer, example, head, query, key]
    return np.ascontiguousarray(weights.transpose(0, 2, 1, 3, 4))


def attention_at(worker: Worker, step: int, *, first: int, **options: Any) -> dict[str, np.ndarray]:
    """Weights at ``step`` and their correlation with the first checkpoint's (on a worker)."""
    weights = weights_at(worker, step, **options)
    if 2 * weights.nbytes > worker.memory_budget // WEIGHTS_SHARE:
        msg = (
            f"attention weights of {options['examples']:,} examples take {format_size(weights.nbytes)} per "
            f"checkpoint, over the memory budget ({format_size(worker.memory_budget)}) with the first "
            "checkpoint's: pass a smaller --examples or raise --max-memory"
        )
        raise AnalysisError(msg)
    key = ("attention-first", first, tuple(options["layers"]), options["split"], options["examples"])
    start = worker.cached(key, lambda: weights_at(worker, first, **options)) if step != first else weights
    return {"weights": weights, "start_end_correlation": correlation(start, weights)}


class Attention(OneSplit, Analyzer):
    """Attention weights of every layer and head on the probe examples, and their correlation with the start."""

    name = "attention"
    version = "1"
    description = "Attention weights per layer and head on the probe examples, and their start-to-end correlation."

    split = Option(str, "eval", "Data split whose first --examples examples are the probes.")
    examples = Option(int, None, "Probe examples: the split's first N (default: all).", minimum=1)
    batch_size = Option(int, 256, "Examples per forward pass (bounds memory).", minimum=1)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; layers and shapes are found on one example before any work."""
        import torch

        store = ctx.store
        check_model_and_split(store, self.split, self.name)
        model = store.model.build().eval()
        kind, layers = attention_layers(model)
        available = store.data(self.split).sizes["example"]
        examples = min(self.examples or available, available)
        probe = torch.from_numpy(np.asarray(store.data(self.split)["inputs"][:1].values))
        # the freshly built model's own weights ({}): only the shapes matter here
        heads, queries, keys = _shape(attention_weights(model, {}, kind, layers, probe), layers)
        size = 4 * len(layers) * heads * examples * queries * keys
        budget = ctx.spec.max_memory  # None: the workers' own budgets are checked in the tasks
        if budget is not None and 2 * size > budget // WEIGHTS_SHARE:
            msg = (
                f"attention weights of {examples:,} examples x {len(layers)} layers x {heads} heads x {queries} x "
                f"{keys} take {format_size(size)} per checkpoint, twice that with the first checkpoint's: over half "
                f"of --max-memory ({format_size(budget)}); pass a smaller --examples or raise --max-memory"
            )
            raise AnalysisError(msg)
        result = ctx.map_checkpoints(
            attention_at,
            {
                "weights": (("layer", "head", "example", "query", "key"), np.float32),
                "start_end_correlation": (("layer", "head"), np.float64),
            },
            sizes={
                "layer": len(layers),
                "head": heads,
                "example": examples,
                "query": queries,
                "key": keys,
            },
            coords={
                "layer": np.array(layers, dtype=object),
                "head": np.arange(heads),
                "example": np.arange(examples),
                "query": np.arange(queries),
                "key": np.arange(keys),
            },
            first=ctx.first_step,
            kind=kind,
            layers=layers,
            split=self.split,
            examples=examples,
            batch_size=self.batch_size,
        )
        result["weights"].attrs.update(
            long_name="attention weight",
            description=f"softmax attention weights of each layer and head ({kind}) on split {self.split!r}",
        )
        result["start_end_correlation"].attrs.update(
            long_name="correlation with the first checkpoint",
            description=(
                f"Pearson correlation over examples x query x key of the weights with those at step {ctx.first_step}, "
                "leaving out entries zero at both (masked); at the last step, Clustering Head Fig. 8's start-to-end "
                "correlation; NaN where undefined (a constant side)"
            ),
        )
        return result

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """``maps``: attention at the first and last checkpoint side by side (Fig. 8)."""
        from ckpt.analyzers.figures.attention import attention_figures

        return attention_figures(result)

    def summarize(self, result: xr.Dataset) -> str:
        """Start-to-end correlation per layer and head at the last checkpoint."""
        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        last = result["start_end_correlation"].isel(step=-1)
        rows = [f"  start-to-end correlation (steps {int(steps[0])} → {int(steps[-1])}):"]
        for layer in last["layer"].values:
            values = "  ".join(f"{float(v):6.3f}" for v in last.sel(layer=layer).values)
            rows.append(f"  {layer}: {values}")
        return "\n".join(rows)


ckpt_register_analyzers = analyzer_hook(Attention)


__all__ = [
    "LOOKED_FOR",
    "WEIGHTS_SHARE",
    "Attention",
    "attention_at",
    "attention_layers",
    "attention_weights",
    "ckpt_register_analyzers",
    "correlation",
    "weights_at",
]

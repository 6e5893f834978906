"""``llc``: the local learning coefficient λ̂ at every checkpoint, by SGLD (Lau et al.; Furman & Lau).

At checkpoint w*, ``--chains`` SGLD chains sample the localized tempered posterior
∝ exp(−nβ L_n(w) − (γ/2)||w − w*||²) over the mean loss L_n of ``--split``, and

    λ̂ = nβ (E_w[L_n(w)] − L_n(w*)),

the mean over a chain's recorded minibatch losses standing for E_w (Lau et al. eq. 7,
devinterp's ``LLCEstimator``). The sampler and its update are in
:mod:`ckpt.numerics.sgld`; docs/llc.md says what the number means, how to choose ε, nβ
and γ, and what the diagnostics say when they are wrong.

Every chain's trace is checked (:mod:`ckpt.numerics.chain_diagnostics`): split R-hat
and effective sample size over the chains, chains that diverged (their λ̂ is NaN, and
so are the checkpoint's ``llc`` and ``llc_std``), traces that flattened. A checkpoint
with a problem raises one :class:`ckpt.errors.LLCWarning` naming it, and ``ckpt show``
lists the problems. One Dask task per checkpoint.
"""

from __future__ import annotations

import fnmatch
import json
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.analyzers.spike_causes import check_model_and_split
from ckpt.engine.memory import format_size
from ckpt.errors import AnalysisError, LLCWarning
from ckpt.numerics.activations import parse_globs
from ckpt.numerics.derivatives import DTYPES
from ckpt.numerics.params import cast_floating
from ckpt.numerics.sgld import (
    ChainLoss,
    SGLDConfig,
    chain_bytes,
    default_nbeta,
    llc_per_chain,
    minibatch_rows,
    sample_chains,
)
from ckpt.plugins import AnalysisContext, Analyzer, Option, Worker, datapoint_index, parameter_space, torch_dtype
from ckpt.plugins.manager import analyzer_hook

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from matplotlib.figure import Figure

INIT_LOSSES = ("batches", "full")
"""``--init-loss``: devinterp's mean over ``--chains`` minibatches at w*, or the exact mean over the split."""

OUTPUTS = {
    "llc": ((), np.float64),
    "llc_std": ((), np.float64),
    "llc_chain": (("chain",), np.float64),
    "loss_trace": (("chain", "draw"), np.float64),
    "init_loss": ((), np.float64),
    "rhat": ((), np.float64),
    "ess": ((), np.float64),
    "diverged": (("chain",), np.bool_),
    "flat": ((), np.bool_),
}


def moving_names(names: tuple[str, ...], restrict: str | None) -> list[str]:
    """The trainable tensors ``--restrict``'s globs match (all of them without it), in store order.

    Raises
    ------
    AnalysisError
        When a glob matches no trainable tensor.
    """
    globs = parse_globs(restrict)
    if not globs:
        return list(names)
    for glob in globs:
        if not any(fnmatch.fnmatchcase(name, glob) for name in names):
            shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            msg = f"--restrict pattern {glob!r} matches no trainable parameter; the model's are: {shown}"
            raise AnalysisError(msg)
    return [name for name in names if any(fnmatch.fnmatchcase(name, glob) for glob in globs)]


def chain_seeds(seed: int, step: int, chains: int) -> tuple[list[int], list[np.random.Generator]]:
    """Each chain's noise seed and minibatch generator at ``step``: a function of (seed, step, chain) alone."""
    sequences = [np.random.SeedSequence([seed, step, chain]) for chain in range(chains)]
    noise = [int(s.generate_state(1, np.uint64)[0] >> np.uint64(1)) for s in sequences]
    return noise, [np.random.default_rng(s.spawn(1)[0]) for s in sequences]


def diagnose(trace: np.ndarray, init_loss: float, llc_chain: np.ndarray) -> dict[str, np.ndarray]:
    """R-hat, ESS, diverged chains and flattening of one checkpoint's ``[chain, draw]`` trace."""
    from ckpt.numerics.chain_diagnostics import diverged_chains, effective_sample_size, has_flattened, split_rhat

    diverged = np.asarray(diverged_chains(trace, init_loss), bool) | ~np.isfinite(llc_chain)
    kept = trace[~diverged]
    enough = len(kept) >= 2
    return {
        "rhat": np.float64(split_rhat(kept) if enough else np.nan),
        "ess": np.float64(effective_sample_size(kept) if len(kept) else np.nan),
        "diverged": diverged,
        "flat": np.bool_(has_flattened(kept) if len(kept) else False),
    }


def llc_at(
    worker: Worker,
    step: int,
    *,
    split: str,
    objective: str | None,
    moving: list[str],
    counts: np.ndarray,
    config: SGLDConfig,
    chains: int,
    batch_size: int,
    init_loss: str,
    seed: int,
    dtype: str,
    options: dict[str, Any],
) -> dict[str, np.ndarray]:
    """λ̂ at ``step`` from ``chains`` SGLD chains, with the chains' diagnostics (runs on a worker)."""
    import torch

    precision = torch_dtype(dtype)
    params = worker.params(step)
    sizes = sum(params[name].numel() for name in moving)
    need = chain_bytes(chains, sizes, precision.itemsize)
    if need > worker.memory_budget:
        msg = (
            f"llc at step {step}: {chains} chains of {sizes:,} moving parameters need about {format_size(need)}, "
            f"over the memory budget of {format_size(worker.memory_budget)} per task: raise --max-memory or "
            "lower --chains (or move fewer tensors with --restrict)"
        )
        raise AnalysisError(msg)
    pool = np.flatnonzero(counts > 0)
    noise_seeds, generators = chain_seeds(seed, step, chains)
    rows = np.stack([minibatch_rows(pool, batch_size, config.steps, g) for g in generators], axis=1)
    center = {name: params[name].to(precision) for name in moving}
    loss = ChainLoss(
        model=worker.model_for(None if precision == torch.float32 else precision),
        losses=worker.objective(objective).losses,
        fixed={k: cast_floating(v, precision) for k, v in params.items() if k not in center},
        data=worker.data(split),
        counts=torch.as_tensor(counts, dtype=torch.int64, device=worker.device),
        precision=precision,
    )
    with worker.computing():
        if init_loss == "full":
            start = loss.mean(center, pool, batch_size)
        else:  # devinterp's get_init_loss_multi_batch: the mean of `chains` minibatch losses at w*
            first = minibatch_rows(pool, batch_size, chains, np.random.default_rng([seed, step, chains]))
            stacked = {k: v.unsqueeze(0).expand(chains, *v.shape) for k, v in center.items()}
            with torch.no_grad():
                start = float(loss(stacked, torch.as_tensor(first, device=worker.device)).double().mean())
        trace = sample_chains(loss, center, config, rows, noise_seeds)
    per_chain = llc_per_chain(trace, start, config.nbeta)
    found = diagnose(trace, start, per_chain)
    per_chain = np.where(found["diverged"], np.nan, per_chain)
    ok = not found["diverged"].any()
    result = {
        "llc": np.float64(per_chain.mean() if ok else np.nan),
        "llc_std": np.float64(per_chain.std(ddof=1) if ok and chains > 1 else np.nan),
        "llc_chain": per_chain,
        "loss_trace": trace,
        "init_loss": np.float64(start),
        **found,
    }
    if options["warn"]:
        warn_about(step, result, options)
    return result


def warn_about(step: int, found: dict[str, np.ndarray], options: dict[str, Any]) -> None:
    """One :class:`LLCWarning` for ``step`` when its chains have a problem (the lines of ``chain_warnings``)."""
    import xarray as xr

    from ckpt.numerics.chain_diagnostics import chain_warnings

    dims = dict(OUTPUTS)
    one = xr.Dataset(
        {name: (("step", *dims[name][0]), np.asarray(value)[None]) for name, value in found.items()},
        coords={"step": [step]},
    )
    one["llc"].attrs.update({k: _attr(v) for k, v in options.items()}, options=json.dumps(options, sort_keys=True))
    lines = chain_warnings(one)
    if lines:
        warnings.warn("llc: " + "; ".join(lines), LLCWarning, stacklevel=2)


class LLC(Analyzer):
    """Local learning coefficient per checkpoint from vectorized SGLD chains, with chain diagnostics."""

    name = "llc"
    version = "1"
    description = "Local learning coefficient λ̂ at every checkpoint by SGLD chains (Lau et al.), with R-hat and ESS."

    epsilon = Option(float, 1e-3, "SGLD step size ε (devinterp's lr); must be > 0.", minimum=0)
    nbeta = Option(float, None, "Inverse temperature nβ (default: devinterp's m/log m, m = --batch-size).", minimum=0)
    gamma = Option(float, 100.0, "Localization strength γ pulling the chains to the checkpoint.", minimum=0)
    chains = Option(int, 4, "Independent SGLD chains per checkpoint (2 or more for R-hat).", minimum=1)
    draws = Option(int, 200, "Recorded draws per chain (after --burn-in).", minimum=1)
    burn_in = Option(int, 100, "SGLD steps per chain before the first recorded draw (devinterp: 0).", minimum=0)
    batch_size = Option(int, 256, "Examples per SGLD minibatch, m (at most the split's size).", minimum=1)
    split = Option(str, None, "Split the loss is taken over (default: train when stored, else eval).")
    objective = Option(str, None, "Per-datapoint loss (default: the store's objective).")
    restrict = Option(str, None, "Parameter names or globs, comma-separated, that move; the rest stay at w*.")
    init_loss = Option(
        str, "batches", "L_n(w*): mean of --chains minibatches (devinterp 1.x) or the full split.", choices=INIT_LOSSES
    )
    seed = Option(int, 0, "Seed of the minibatch orders and the noise (per chain and checkpoint).", minimum=0)
    dtype = Option(str, "float32", "Precision of the computation.", choices=DTYPES)
    warn = Option(bool, True, "An LLCWarning for each checkpoint whose chains have a problem (ckpt show lists them).")

    def loss_split(self, store: Any) -> str:
        """``--split``, else ``train`` when the store has it, else ``eval``."""
        if self.split:
            return str(self.split)
        return "train" if "train" in store.splits else "eval"

    def data_splits(self, store: Any) -> tuple[str, ...]:
        """Only the loss's split."""
        return (self.loss_split(store),)

    def preflight(self, store: Any) -> None:
        """Refuse a step size or temperature of zero, and a store without model or split, before any work."""
        if self.epsilon <= 0:
            msg = f"--epsilon must be > 0 (the SGLD step size), got {self.epsilon}"
            raise AnalysisError(msg)
        if self.nbeta is not None and self.nbeta <= 0:
            msg = f"--nbeta must be > 0 (the inverse temperature nβ), got {self.nbeta}"
            raise AnalysisError(msg)
        check_model_and_split(store, self.loss_split(store), self.name)

    def settings(self, examples: int) -> tuple[int, float]:
        """The minibatch size m used (``--batch-size``, at most ``examples``) and nβ."""
        m = min(int(self.batch_size), examples)
        return m, float(self.nbeta) if self.nbeta is not None else default_nbeta(m)

    def compute(self, ctx: AnalysisContext) -> xr.Dataset:
        """One task per checkpoint; the moving tensors and the data's datapoint counts are resolved here."""
        store = ctx.store
        self.preflight(store)
        split = self.loss_split(store)
        space = parameter_space(store, store.model.build())
        moving = moving_names(space.names, self.restrict)
        example, _ = datapoint_index(store, split, self.objective)
        counts = np.bincount(example, minlength=store.data(split).sizes["example"]).astype(np.int64)
        examples = int((counts > 0).sum())
        if examples == 0:
            msg = f"split {split!r} has no datapoints under the objective; choose another --split"
            raise AnalysisError(msg)
        m, nbeta = self.settings(examples)
        config = SGLDConfig(
            epsilon=float(self.epsilon), nbeta=nbeta, gamma=float(self.gamma), draws=self.draws, burn_in=self.burn_in
        )
        options = {**self.options, "split": split, "batch_size": m, "nbeta": nbeta, "moving": moving}
        result = ctx.map_checkpoints(
            llc_at,
            OUTPUTS,
            sizes={"chain": self.chains, "draw": self.draws},
            coords={"chain": np.arange(self.chains), "draw": np.arange(self.draws)},
            split=split,
            objective=self.objective,
            moving=moving,
            counts=counts,
            config=config,
            chains=self.chains,
            batch_size=m,
            init_loss=self.init_loss,
            seed=self.seed,
            dtype=self.dtype,
            options=options,
        )
        describe(result, split)
        # the engine replaces a result's own attrs by its provenance (the options as given): the
        # options in force (nβ and m resolved, the tensors that move) go on the estimate itself
        result["llc"].attrs["options"] = json.dumps(options, sort_keys=True)
        result["llc"].attrs.update({k: _attr(v) for k, v in options.items()})
        return result

    def summarize(self, result: xr.Dataset) -> str:
        """λ̂ ± its spread over chains at a few steps, then every problem the diagnostics found."""
        from ckpt.numerics.chain_diagnostics import chain_warnings

        steps = result["step"].values
        if not len(steps):
            return "  (empty result)"
        picks = sorted({0, *np.linspace(0, len(steps) - 1, 6).astype(int).tolist()})
        rows = [f"  {'step':>10}  {'llc':>10}  {'± std':>9}  {'r-hat':>6}  {'ess':>7}"]
        for i in picks:
            llc, std = result["llc"].values[i], result["llc_std"].values[i]
            rhat, ess = result["rhat"].values[i], result["ess"].values[i]
            rows.append(f"  {steps[i]:>10}  {llc:>10.4g}  {std:>9.3g}  {rhat:>6.3f}  {ess:>7.1f}")
        problems = chain_warnings(result)
        rows += [f"  warning: {line}" for line in problems] or ["  chains: no problem found"]
        return "\n".join(rows)

    def plot(self, result: xr.Dataset, store: Any) -> dict[str, Figure]:
        """The figures of :func:`ckpt.analyzers.figures.llc.llc_figures`."""
        from ckpt.analyzers.figures.llc import llc_figures

        return llc_figures(result, store)


def _attr(value: Any) -> Any:
    """An option as a zarr attribute: None as "", a list of names comma-joined."""
    if value is None:
        return ""
    return ",".join(value) if isinstance(value, list) else value


def describe(result: xr.Dataset, split: str) -> None:
    """``long_name`` and ``description`` of each variable."""
    texts = {
        "llc": ("local learning coefficient λ̂", "mean over chains of nβ (mean draw loss − init loss)"),
        "llc_std": ("λ̂ spread", "standard deviation over chains of the per-chain λ̂ (ddof=1)"),
        "llc_chain": ("per-chain λ̂", "nβ (mean of the chain's draw losses − init loss); NaN when it diverged"),
        "loss_trace": ("minibatch loss", f"minibatch loss on split {split!r} before each recorded SGLD step"),
        "init_loss": ("L_n(w*)", "the loss at the checkpoint the chains start from"),
        "rhat": ("split R-hat", "of the loss traces over the chains that did not diverge; near 1 when they mix"),
        "ess": ("effective sample size", "of the loss traces, all kept chains together"),
        "diverged": ("diverged", "the chain's loss left every sensible range (non-finite or blew up)"),
        "flat": ("flattened", "every chain is stationary after burn-in (Geweke |z| < 3); False: still drifting"),
    }
    for name, (long_name, text) in texts.items():
        result[name].attrs.update(long_name=long_name, description=text)


ckpt_register_analyzers = analyzer_hook(LLC)


__all__ = ["INIT_LOSSES", "LLC", "OUTPUTS", "ckpt_register_analyzers", "llc_at", "moving_names"]

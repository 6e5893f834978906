"""Stochastic-gradient Langevin dynamics around a checkpoint, many chains at once, for the LLC.

The local learning coefficient (Lau et al., "The Local Learning Coefficient: A
Singularity-Aware Complexity Measure", eq. 7; Furman & Lau, "Estimating the LLC at
Scale") is estimated as

    λ̂(w*) = nβ (E_w[L_n(w)] − L_n(w*)),

the expectation over the localized tempered posterior
∝ exp(−nβ L_n(w) − (γ/2)||w − w*||²). SGLD samples it with the update devinterp
implements (``devinterp.optim.SGMCMC.sgld``, noise level 1, no weight decay):

    w ← w − (ε/2) (nβ ∇L_m(w) + γ (w − w*)) + √ε ξ,   ξ ~ N(0, I),

where L_m is the mean loss of a minibatch of m examples. As in devinterp's sampler,
the loss recorded at a draw is the minibatch loss at the weights *before* that
step's update (the loss whose gradient drives it), the first ``burn_in`` steps are
not recorded, and each chain's estimate is nβ (mean of its draws − init loss).

All chains run as one batched functional pass: the moving tensors are stacked
``[chains, *shape]`` and the model is called under ``torch.func.vmap`` over
``functional_call``, inside ``torch.func.grad``. Each chain has its own seeded
noise and its own minibatch order. Nothing here knows about stores: the analyzer
(:mod:`ckpt.analyzers.llc`) gives the model, data and seeds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckpt.errors import AnalysisError

COPIES = 5
"""Chain-sized copies of the moving parameters alive at once: weights, gradient, noise, drift, distance to w*."""


def default_nbeta(batch_size: int) -> float:
    """Devinterp's ``default_nbeta``: m / log m for a minibatch of m examples, 1 when m <= 1."""
    return 1.0 if batch_size <= 1 else batch_size / math.log(batch_size)


def chain_bytes(chains: int, moving: int, itemsize: int) -> int:
    """Bytes the chains' parameter-sized tensors take (:data:`COPIES` of ``chains × moving``)."""
    return COPIES * chains * moving * itemsize


@dataclass(frozen=True)
class SGLDConfig:
    """The sampler's hyperparameters, named as in the literature and devinterp.

    Attributes
    ----------
    epsilon
        Step size ε (devinterp's ``lr``).
    nbeta
        Inverse temperature nβ.
    gamma
        Localization strength γ (devinterp's ``localization``).
    draws
        Recorded draws per chain.
    burn_in
        Steps run before the first recorded draw.
    """

    epsilon: float
    nbeta: float
    gamma: float
    draws: int
    burn_in: int

    @property
    def steps(self) -> int:
        """SGLD steps per chain: burn-in then one per draw (devinterp's ``num_steps_bw_draws=1``)."""
        return self.burn_in + self.draws


def minibatch_rows(pool: np.ndarray, batch_size: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """``[steps, batch_size]`` examples of ``pool``: a fresh shuffle each epoch, the incomplete last batch dropped.

    What a shuffling ``DataLoader(drop_last=True)`` cycled for ``steps`` batches gives,
    which is how devinterp's sampler reads its loader; every batch has the same size, so
    the chains' batches stack.
    """
    if not 1 <= batch_size <= len(pool):
        msg = f"a minibatch of {batch_size} examples needs 1 to {len(pool)} examples"
        raise AnalysisError(msg)
    per_epoch = len(pool) // batch_size
    epochs = -(-steps // per_epoch)
    order = np.concatenate([rng.permutation(pool)[: per_epoch * batch_size] for _ in range(epochs)])
    return order[: steps * batch_size].reshape(steps, batch_size)


@dataclass(frozen=True, eq=False)
class ChainLoss:
    """Per-chain mean minibatch loss of stacked weights: one vmapped forward for every chain.

    Attributes
    ----------
    model
        The module, called functionally (its own weights unused).
    losses
        The objective's ``losses(outputs, targets, mask) -> [datapoints]``, datapoints in
        row-major order of the examples.
    fixed
        Tensors held at their checkpoint values (buffers, and parameters outside ``--restrict``).
    data
        The split's ``inputs``, ``targets`` and (when stored) ``mask``, on the device.
    counts
        Datapoints of each example of the split (a torch int64 tensor on the device).
    precision
        The torch dtype floating-point inputs are computed in.
    """

    model: Any
    losses: Callable[[Any, Any, Any], Any]
    fixed: Mapping[str, Any]
    data: Mapping[str, Any]
    counts: Any
    precision: Any

    @functools.cached_property
    def one_per_example(self) -> bool:
        """Whether every example is one datapoint (then a chain's mean needs no segment sums)."""
        return bool((self.counts == 1).all())

    def batch(self, rows: Any) -> tuple[Any, Any, Any]:
        """Inputs, targets and mask of ``rows`` (an index tensor of any shape)."""
        inputs = self.data["inputs"][rows]
        if inputs.is_floating_point():
            inputs = inputs.to(self.precision)
        targets = self.data["targets"][rows] if "targets" in self.data else inputs
        mask = self.data["mask"][rows] if "mask" in self.data else None
        return inputs, targets, mask

    def __call__(self, moving: Mapping[str, Any], rows: Any) -> Any:
        """``[chains]`` mean loss of chain c's minibatch ``rows[c]`` at chain c's weights ``moving[name][c]``."""
        import torch
        from torch.func import functional_call, vmap
        from torch.utils._pytree import tree_map

        inputs, targets, mask = self.batch(rows)

        def forward(weights: Mapping[str, Any], x: Any) -> Any:
            outputs = functional_call(self.model, {**self.fixed, **weights}, (x,))
            # a Hugging Face ModelOutput also carries its key-value cache, an object vmap cannot
            # return: only the logits leave the vmapped call (the objectives read them alike)
            logits = getattr(outputs, "logits", None)
            return outputs if logits is None else logits

        outputs = vmap(forward)(dict(moving), inputs)
        # The objective's datapoint selection (masks, ignored targets) has a shape that depends on
        # the data, which vmap cannot batch: the chains' outputs are scored as one batch of
        # chains × m examples, whose datapoints come chain after chain (row-major order).
        flat = tree_map(lambda t: t.flatten(0, 1) if isinstance(t, torch.Tensor) else t, outputs)
        per_datapoint = self.losses(flat, targets.flatten(0, 1), None if mask is None else mask.flatten(0, 1))
        if per_datapoint.numel() == rows.numel() and self.one_per_example:
            return per_datapoint.view(rows.shape).mean(1)
        counts = self.counts[rows].sum(1)
        chain = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
        sums = torch.zeros(len(counts), dtype=per_datapoint.dtype, device=per_datapoint.device)
        return sums.index_add(0, chain, per_datapoint) / counts

    def mean(self, weights: Mapping[str, Any], rows: np.ndarray, block: int) -> float:
        """Mean loss over the datapoints of ``rows`` at one set of ``weights``, in blocks of ``block`` examples."""
        import torch
        from torch.func import functional_call

        total, count = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(rows), block):
                index = torch.as_tensor(rows[start : start + block], device=self.counts.device)
                inputs, targets, mask = self.batch(index)
                outputs = functional_call(self.model, {**self.fixed, **weights}, (inputs,))
                total += float(self.losses(outputs, targets, mask).double().sum())
                count += int(self.counts[index].sum())
        return total / count


def sample_chains(
    loss: ChainLoss,
    center: Mapping[str, Any],
    config: SGLDConfig,
    rows: np.ndarray,
    seeds: Sequence[int],
) -> np.ndarray:
    """Run one SGLD chain per seed from ``center`` and return the ``[chains, draws]`` recorded losses.

    Parameters
    ----------
    loss
        The per-chain minibatch loss.
    center
        w*: ``{name: tensor}`` of the moving tensors (the others are in ``loss.fixed``).
    config
        ε, nβ, γ, draws and burn-in.
    rows
        ``[steps, chains, m]`` example indices: chain c's minibatch at each step.
    seeds
        One seed per chain for its Gaussian noise.

    Returns
    -------
    numpy.ndarray
        float64 ``[chains, draws]``: chain c's minibatch loss at draw k, taken at the weights
        before step ``burn_in + k`` updates them. A chain that diverged holds inf or NaN from
        where it did.
    """
    import torch
    from torch.func import grad

    chains = len(seeds)
    names = list(center)
    first = center[names[0]]
    device, dtype = first.device, first.dtype
    sizes = [center[name].numel() for name in names]
    generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
    weights = {name: center[name].detach().unsqueeze(0).repeat(chains, *([1] * center[name].dim())) for name in names}
    anchor = {name: center[name].detach().unsqueeze(0) for name in names}
    index = torch.as_tensor(rows, device=device)

    def total(moving: dict[str, Any], batch: Any) -> tuple[Any, Any]:
        per_chain = loss(moving, batch)
        # chains are independent, so the gradient of the sum is each chain's own gradient
        return per_chain.sum(), per_chain.detach()

    gradient = grad(total, has_aux=True)
    trace = torch.empty(chains, config.draws, dtype=torch.float64, device=device)
    noise = torch.empty(chains, sum(sizes), dtype=dtype, device=device)
    half, scale = 0.5 * config.epsilon, math.sqrt(config.epsilon)
    for t in range(config.steps):
        grads, losses = gradient(weights, index[t])
        if t >= config.burn_in:
            trace[:, t - config.burn_in] = losses.double()
        for c, generator in enumerate(generators):  # per-chain streams: a chain's path is its seed's alone
            noise[c] = torch.randn(noise.shape[1], generator=generator, device=device, dtype=dtype)
        pieces = noise.split(sizes, dim=1)
        with torch.no_grad():
            for name, piece in zip(names, pieces, strict=True):
                w = weights[name]
                drift = config.nbeta * grads[name] + config.gamma * (w - anchor[name])
                weights[name] = w - half * drift + scale * piece.view_as(w)
    return trace.cpu().numpy()


def llc_per_chain(trace: np.ndarray, init_loss: float, nbeta: float) -> np.ndarray:
    """Devinterp's ``LLCEstimator``: nβ (mean over a chain's draws − init loss), per chain."""
    return nbeta * (np.asarray(trace, np.float64).mean(axis=1) - init_loss)


__all__ = [
    "COPIES",
    "ChainLoss",
    "SGLDConfig",
    "chain_bytes",
    "default_nbeta",
    "llc_per_chain",
    "minibatch_rows",
    "sample_chains",
]

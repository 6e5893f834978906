"""``sparse-modular-addition``: the d=2 transformer of "Clustering Head" on sparse modular addition.

Task: a sequence of ``length`` (L=12) tokens drawn uniformly from F_p; the target
is the sum of the first ``k`` (5) tokens mod p. The remaining L-k tokens are
distractors the model must learn to ignore, which it does by attending to the
first k positions.

Model (embedding dimension d=2, so every activation can be drawn in the plane):

1. ``z_t = rms_normalize(E[x_t] + P[t])``: token plus absolute position embedding,
   RMS-normalised without gain (module ``norm``), so on the circle of radius sqrt(d) = sqrt(2);
2. one attention layer with a single learned query ``q`` (no keys, no output
   matrix): ``a_t = softmax_t(z_t · q / sqrt(d))``, ``y = Σ_t a_t V z_t`` (one
   vector per sequence, no residual);
3. an MLP block with pre-norm (``mlp.norm``), GELU and a residual: ``h = y + W2 gelu(W1 rms_normalize(y) + b1) + b2``;
4. tied decoding: ``logits = h · E^T`` (p classes).

Attention is written with explicit matmuls and softmax (no fused SDPA).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ckpt.errors import TaskError
from ckpt.plugins import Dataset, Option, Task, config_bounds

EPS = 1e-12
"""Added to the squared norm before the square root: keeps a (measure-zero) zero vector finite."""


def rms_normalize(x: torch.Tensor) -> torch.Tensor:
    """RMS-norm without gain over the last dimension: ``x / sqrt(mean_i x_i² + EPS)``.

    Every vector comes out with norm sqrt(d) (sqrt(2) at d = 2), not 1. The
    paper's normalisation is an RMS-norm without gain (its released code divides
    by ``sqrt(mean(x²))``); an earlier version of this sandbox divided by
    ``sqrt(sum(x²))`` instead, i.e. put the vectors on the unit circle, which
    shrinks every attention score and every MLP input by sqrt(2) against the
    paper's model (over seeds 0-15 and 1,000 epochs it reached 100% test
    accuracy in 3/16 seeds; with this and the query initialisation below fixed,
    5/16; see docs/sandboxes.md).

    Parameters
    ----------
    x
        ``[..., d]`` tensor.

    Returns
    -------
    torch.Tensor
        Same shape, each vector of norm sqrt(d) (unless it is ~0).
    """
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


class GainlessRMSNorm(nn.Module):
    """:func:`rms_normalize` as a module, with no parameters (the state dict is unchanged).

    A module rather than a function call so that forward hooks see what it
    normalises: the ``normalization`` analyzer measures ‖x‖ at its input
    (Clustering Head §4.3), and its class name ends in ``Norm`` as Hugging Face's
    normalisation layers' do.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``rms_normalize(x)``."""
        return rms_normalize(x)


class QueryAttention(nn.Module):
    """Single-head attention pooling with one learned query vector and a value matrix.

    Parameters
    ----------
    dim
        Embedding dimension d.

    Attributes
    ----------
    query
        ``[d]``: the query vector q (there is no key matrix: scores are ``z_t · q``).
    value
        ``Linear(d, d, bias=False)``: the value matrix V (there is no output matrix).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        # The paper's query is the weight of a bias-free Linear(d, 1), so it starts as torch
        # initialises one: uniform in [-1/sqrt(d), 1/sqrt(d)]. (An earlier version drew it from
        # N(0, 1): about 2.4 times larger, so attention started further from uniform.)
        bound = 1 / math.sqrt(dim)
        self.query = nn.Parameter(torch.empty(dim).uniform_(-bound, bound))
        self.value = nn.Linear(dim, dim, bias=False)

    def weights(self, z: torch.Tensor) -> torch.Tensor:
        """Attention weights ``a = softmax_t(z_t · q / sqrt(d))``, ``[batch, L]``."""
        scores = torch.matmul(z, self.query) / math.sqrt(self.dim)
        return torch.softmax(scores, dim=-1)

    def attention_weights(self, z: torch.Tensor) -> torch.Tensor:
        """:meth:`weights` as ``[batch, heads=1, queries=1, L]``: what the ``attention`` analyzer reads."""
        return self.weights(z)[:, None, None, :]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Pooled output ``Σ_t a_t V z_t``, ``[batch, d]``, from embeddings ``z`` ``[batch, L, d]``."""
        weights = self.weights(z)
        values = torch.matmul(z, self.value.weight.T)  # V z_t for every t
        return torch.matmul(weights.unsqueeze(-2), values).squeeze(-2)


class MLP(nn.Module):
    """Pre-norm GELU MLP with a residual: ``y + fc2(gelu(fc1(rms_normalize(y))))``.

    Parameters
    ----------
    dim
        Embedding dimension d.
    hidden
        Hidden units h.
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = GainlessRMSNorm()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """Residual MLP block on ``[batch, d]``."""
        return y + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))


class ClusteringHeadTransformer(nn.Module):
    """The one-layer, d=2 transformer of "Clustering Head" (see the module docstring).

    Parameters
    ----------
    p
        Vocabulary size (the field F_p); also the number of classes.
    length
        Sequence length L (number of position embeddings).
    hidden
        Hidden units of the MLP.
    dim
        Embedding dimension d (2 in the paper).
    """

    readout: ClassVar[str] = "mlp"
    """The module whose input is the sequence embedding ξ: what ``boundary-distance`` measures by default."""

    def __init__(self, p: int = 2, length: int = 12, hidden: int = 32, dim: int = 2) -> None:
        super().__init__()
        self.p, self.length, self.dim = p, length, dim
        self.embed = nn.Embedding(p, dim)
        self.pos = nn.Embedding(length, dim)
        self.norm = GainlessRMSNorm()
        self.attn = QueryAttention(dim)
        self.mlp = MLP(dim, hidden)

    def embeddings(self, tokens: torch.Tensor) -> torch.Tensor:
        """RMS-normalised token + position embeddings ``z``, ``[batch, L, d]``, of ``[batch, L]`` tokens."""
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.norm(self.embed(tokens) + self.pos(positions))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, p]`` of integer tokens ``[batch, L]``."""
        return self.output_logits(self.attn(self.embeddings(tokens)))

    def output_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, p]`` of sequence embeddings ``[batch, d]`` (the attention output ξ).

        ``ckpt animate`` and the report evaluate it on a grid of the ξ plane to draw the output
        regions, the classes the MLP assigns to each point (Clustering Head's figures).
        """
        hidden = self.mlp(pooled)
        # tied decoding: a class's logit is the alignment of the output with its token embedding
        return torch.matmul(hidden, self.embed.weight.T)


# a store's config is data: no config asks for a model beyond what these sandboxes are meant to train
@config_bounds(p=(2, 1 << 16), length=(1, 1 << 16), hidden=(1, 65536), dim=(1, 4096))
def build_model(p: int = 2, length: int = 12, hidden: int = 32, dim: int = 2) -> ClusteringHeadTransformer:
    """Model factory recorded in the store (``ckpt.sandboxes.sparse_modular_addition:build_model``).

    Parameters
    ----------
    p, length, hidden, dim
        See :class:`ClusteringHeadTransformer`.

    Returns
    -------
    ClusteringHeadTransformer
        A freshly initialised model (seed torch beforehand for reproducibility).
    """
    return ClusteringHeadTransformer(p=p, length=length, hidden=hidden, dim=dim)


def make_sequences(n: int, length: int, p: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` sequences of ``length`` tokens drawn uniformly from {0, ..., p-1}, ``int64``."""
    return rng.integers(0, p, size=(n, length), dtype=np.int64)


def sparse_sum(tokens: np.ndarray, k: int, p: int) -> np.ndarray:
    """Targets: the sum of the first ``k`` tokens of every sequence, mod ``p``."""
    return tokens[:, :k].sum(axis=1) % p


def prefix_code(tokens: np.ndarray, k: int, p: int) -> np.ndarray:
    """The first ``k`` tokens as one integer in base ``p``, the first token most significant."""
    powers = p ** np.arange(k - 1, -1, -1, dtype=np.int64)
    return tokens[:, :k] @ powers


class SparseModularAddition(Task):
    """Sparse modular addition (Clustering Head): y = (x_1 + ... + x_k) mod p over L tokens."""

    name = "sparse-modular-addition"
    description = "Clustering Head: a d=2 one-query transformer learns (x_1+...+x_k) mod p among L tokens."
    objective = "cross-entropy"
    factory = "ckpt.sandboxes.sparse_modular_addition:build_model"

    p = Option(int, None, "Field size p (tokens and classes in F_p).", minimum=2)
    length = Option(int, None, "Sequence length L.", minimum=1)
    k = Option(int, None, "Number of leading tokens summed (the rest are distractors).", minimum=1)
    hidden = Option(int, None, "Hidden units of the MLP.", minimum=1)
    dim = Option(int, None, "Embedding dimension d (2 in the paper; figures of d > 2: 2 principal axes).", minimum=1)
    lr = Option(float, None, "Adam learning rate.", minimum=0)
    train_size = Option(int, None, "Training sequences.", minimum=1)
    test_size = Option(int, None, "Test sequences.", minimum=1)

    _paper: ClassVar[dict[str, Any]] = {
        "p": 2,
        "length": 12,
        "k": 5,
        "hidden": 32,
        "dim": 2,
        "lr": 3e-3,
        "train_size": 2048,
        "test_size": 2048,
        "batch_size": 32,
        "epochs": 1000,
        "every": None,  # None = one epoch (64 steps at the paper's sizes)
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "paper": _paper,
        # the paper's setting, shortened to fit a quick CPU run; still a checkpoint every epoch
        "default": {**_paper, "epochs": 100},
    }

    def _check(self, config: Mapping[str, Any]) -> None:
        p, length, k = config["p"], config["length"], config["k"]
        if p < 2:
            raise TaskError(f"task {self.name!r}: option 'p' must be at least 2, got {p}")
        if not 1 <= k <= length:
            raise TaskError(f"task {self.name!r}: option 'k' must be in [1, length={length}], got {k}")
        if config["train_size"] < 1 or config["test_size"] < 1:
            raise TaskError(f"task {self.name!r}: train_size and test_size must be positive")

    def model_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Factory keyword arguments: ``p``, ``length``, ``hidden`` and ``dim`` (``--dim``, 2 by default)."""
        self._check(config)
        return {
            "p": int(config["p"]),
            "length": int(config["length"]),
            "hidden": int(config["hidden"]),
            "dim": int(config.get("dim", 2)),
        }

    def make_data(self, config: Mapping[str, Any], seed: int) -> Dataset:
        """Uniform train and test sequences (train drawn first, from ``default_rng(seed)``).

        Train and test are drawn independently, as in the paper; with p=2 and
        L=12 there are only 4096 distinct sequences, so the two sets overlap.
        """
        self._check(config)
        p, length, k = int(config["p"]), int(config["length"]), int(config["k"])
        n_train, n_test = int(config["train_size"]), int(config["test_size"])
        rng = np.random.default_rng(seed)
        train = make_sequences(n_train, length, p, rng)
        test = make_sequences(n_test, length, p, rng)
        train_y, test_y = sparse_sum(train, k, p), sparse_sum(test, k, p)
        both = np.concatenate([train, test])
        both_y = np.concatenate([train_y, test_y])
        splits = {
            "eval": {
                "inputs": both,
                "targets": both_y,
                "labels": {
                    "target": both_y,
                    "prefix": prefix_code(both, k, p),
                    "split": np.repeat(np.array([0, 1], dtype=np.int64), [n_train, n_test]),
                },
            },
            "train": {
                "inputs": train,
                "targets": train_y,
                "labels": {"target": train_y, "prefix": prefix_code(train, k, p)},
            },
        }
        return Dataset(
            train_inputs=torch.from_numpy(train),
            train_targets=torch.from_numpy(train_y),
            test_inputs=torch.from_numpy(test),
            test_targets=torch.from_numpy(test_y),
            splits=splits,
        )

    def grow(self, name: str, parent: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor | None:
        """The token embedding grows with p: the parent's rows, then the child's own new rows.

        A child with a larger field (p=2 parent, p=3 child) keeps the parent's embeddings of the
        tokens both know, and its new tokens' rows are exactly the child's fresh initialisation
        (``nn.Embedding``'s N(0, 1), drawn from the child's seed), as if the child had been
        trained from scratch. Nothing else grows: a wider ``dim`` or ``hidden`` changes what
        every weight means.
        """
        rows, width = parent.shape[0], parent.shape[-1]
        grows = (
            name == "embed.weight"
            and parent.ndim == fresh.ndim == 2
            and width == fresh.shape[1]
            and rows < fresh.shape[0]
            and parent.dtype == fresh.dtype
        )
        if not grows:
            return None
        return torch.cat([parent.to(fresh.device), fresh[rows:]])

    def make_optimizer(self, model: torch.nn.Module, config: Mapping[str, Any]) -> tuple[torch.optim.Optimizer, Any]:
        """Adam (betas 0.9, 0.999) at ``lr``, no schedule."""
        return torch.optim.Adam(model.parameters(), lr=float(config["lr"]), betas=(0.9, 0.999)), None


__all__ = [
    "EPS",
    "MLP",
    "ClusteringHeadTransformer",
    "GainlessRMSNorm",
    "QueryAttention",
    "SparseModularAddition",
    "build_model",
    "make_sequences",
    "prefix_code",
    "rms_normalize",
    "sparse_sum",
]

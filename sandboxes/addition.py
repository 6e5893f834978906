"""``addition``: 3-digit addition with a small decoder-only transformer (Hidden Breakthroughs).

The setting of "Hidden Breakthroughs in Language Model Training" (POLCA): a
pre-LN decoder-only transformer (LayerNorm, biases, learned positions, causal
attention) reads ``a+b=`` with both operands zero-padded to 3 digits, followed
by the 4-digit zero-padded sum, e.g. ``"123+456=0579"`` (12 tokens). It reads
the first 11 tokens and predicts the next one at each position; only the 4
answer tokens are datapoints (the mask of the ``token-cross-entropy``
objective).

Token positions of the 11 inputs / targets (target ``i`` is token ``i + 1``)::

    input   a2 a1 a0  +  b2 b1 b0  =  w  x  y
    target  a1 a0  +  b2 b1 b0  =  w  x  y  z
    index    0  1  2  3  4  5  6  7  8  9 10

so the answer targets are positions 7..10: the 1000s, 100s, 10s and 1s digit.

Attention is written out (matmul, causal mask, softmax) rather than through
``scaled_dot_product_attention``, so the model computes the same thing on every
backend. (Analyzers run forward-mode AD through it; for models that use torch's
fused attention they switch to its math kernel, see ``ckpt.numerics.derivatives.forward_mode``.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ckpt.errors import TaskConfigError, TaskError
from ckpt.plugins import Dataset, Option, Task, config_bounds

PLUS, EQUALS = 10, 11
VOCAB = 12
"""Digits 0-9, ``+`` and ``=``."""
SEQ_LEN = 11
"""Tokens the model reads (the 12-token sequence minus its last token)."""
ANSWER_POSITIONS = (7, 8, 9, 10)
"""Target positions of the answer digits: 1000s, 100s, 10s, 1s."""
PROBLEMS = 1000 * 1000
"""All (a, b) with 0 <= a, b < 1000; problem id = 1000 a + b."""
EVAL_PROBLEMS = 1250
"""Problems of the stored ``eval`` split (and of the ``train`` split): 4 answer tokens each = 5,000 datapoints."""
TRAIN_METRIC_EXAMPLES = 5000
"""Training examples evaluated at each checkpoint (see :meth:`Addition.evaluate`)."""


def tokens(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Token sequences ``a+b=`` + 4-digit sum, shape ``[N, 12]`` int64.

    Parameters
    ----------
    a, b
        Operands in ``[0, 1000)``, shape ``[N]``.

    Returns
    -------
    numpy.ndarray
        The 12 tokens of each problem.
    """
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    total = a + b

    def digits(x: np.ndarray, width: int) -> np.ndarray:
        powers = 10 ** np.arange(width - 1, -1, -1)
        return (x[:, None] // powers) % 10

    n = len(a)
    return np.concatenate(
        [
            digits(a, 3),
            np.full((n, 1), PLUS),
            digits(b, 3),
            np.full((n, 1), EQUALS),
            digits(total, 4),
        ],
        axis=1,
    ).astype(np.int64)


def text(sequence: np.ndarray) -> str:
    """The string of one 12-token sequence, e.g. ``"123+456=0579"``."""
    return "".join("0123456789+="[int(t)] for t in sequence)


def carries(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether a carry comes into each answer place, shape ``[N, 4]`` (1000s, 100s, 10s, 1s).

    A carry into a place happens when the lower places of the operands sum to
    10 or more of that place's unit: into the 1000s when ``a + b >= 1000``,
    the 100s when ``a % 100 + b % 100 >= 100``, the 10s when
    ``a % 10 + b % 10 >= 10``; never into the 1s.
    """
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return np.stack(
        [a + b >= 1000, a % 100 + b % 100 >= 100, a % 10 + b % 10 >= 10, np.zeros(len(a), bool)], axis=1
    ).astype(np.int64)


def split_arrays(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Keyword arguments of ``Writer.add_data`` for the problems ``(a, b)``.

    Returns
    -------
    dict
        ``inputs``/``targets`` int64 ``[N, 11]``, ``mask`` bool ``[N, 11]`` (true
        on the 4 answer targets), per-token ``labels`` ``place`` (0 = 1000s ..
        3 = 1s) and ``carry`` (0/1; -1 off the mask) and one ``text`` per example.
    """
    seq = tokens(a, b)
    n = len(seq)
    mask = np.zeros((n, SEQ_LEN), bool)
    mask[:, list(ANSWER_POSITIONS)] = True
    # -1 off the mask: a label there would be meaningless, and -1 makes misuse visible
    place = np.full((n, SEQ_LEN), -1, np.int64)
    place[:, list(ANSWER_POSITIONS)] = np.arange(4)
    carry = np.full((n, SEQ_LEN), -1, np.int64)
    carry[:, list(ANSWER_POSITIONS)] = carries(a, b)
    return {
        "inputs": seq[:, :-1],
        "targets": seq[:, 1:],
        "mask": mask,
        "labels": {"place": place, "carry": carry},
        "text": [text(s) for s in seq],
    }


class Block(nn.Module):
    """A pre-LN transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``.

    Parameters
    ----------
    d_model, heads, d_mlp
        Residual width, attention heads (``d_model`` divisible by it), MLP width.
    """

    def __init__(self, d_model: int, heads: int, d_mlp: int) -> None:
        super().__init__()
        if d_model % heads:
            msg = f"d_model ({d_model}) must be divisible by heads ({heads})"
            raise TaskConfigError(msg)
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc_in = nn.Linear(d_model, d_mlp)
        self.fc_out = nn.Linear(d_mlp, d_model)

    def _weights_and_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal attention weights ``[N, heads, seq, seq]`` and values ``[N, heads, seq, d/heads]`` of ``x``."""
        n, seq, d = x.shape
        q, k, v = self.qkv(x).view(n, seq, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(future, float("-inf")).softmax(-1), v

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Causal multi-head self-attention, written out so forward-mode AD works through it."""
        n, seq, d = x.shape
        weights, v = self._weights_and_values(x)
        return self.out((weights @ v).transpose(1, 2).reshape(n, seq, d))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The block's attention weights ``[N, heads, query, key]`` for its input ``x``: what ``attention`` reads."""
        return self._weights_and_values(self.ln1(x))[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream after this block."""
        x = x + self.attention(self.ln1(x))
        return x + self.fc_out(torch.nn.functional.gelu(self.fc_in(self.ln2(x))))


class AdditionTransformer(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, pre-LN blocks, final LN, unembedding.

    Parameters
    ----------
    layers, d_model, heads, d_mlp
        Depth, residual width, attention heads, MLP width.
    vocab
        Token vocabulary (12: digits, ``+``, ``=``).
    max_len
        Longest input (11 tokens).
    """

    def __init__(
        self, layers: int, d_model: int, heads: int, d_mlp: int, vocab: int = VOCAB, max_len: int = SEQ_LEN
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_mlp) for _ in range(layers))
        self.ln_final = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, vocab)
        # GPT-2 initialisation: N(0, 0.02) weights, zero biases (torch's defaults give
        # N(0, 1) embeddings that swamp the small residual updates early in training)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[N, seq, vocab]`` of integer tokens ``[N, seq]``."""
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.embed(inputs.long()) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.ln_final(x))


# a store's config is data: no config asks for a model beyond what these sandboxes are meant to train
@config_bounds(
    layers=(1, 256), d_model=(1, 16384), heads=(1, 1024), d_mlp=(1, 65536), vocab=(2, 1 << 20), max_len=(1, 1 << 16)
)
def build_model(
    layers: int, d_model: int, heads: int, d_mlp: int, vocab: int = VOCAB, max_len: int = SEQ_LEN
) -> AdditionTransformer:
    """The model factory recorded in stores (``ckpt.sandboxes.addition:build_model``).

    Parameters
    ----------
    layers, d_model, heads, d_mlp, vocab, max_len
        See :class:`AdditionTransformer`.

    Returns
    -------
    AdditionTransformer
        A freshly initialised model (seeded by the caller's torch RNG).
    """
    return AdditionTransformer(layers, d_model, heads, d_mlp, vocab, max_len)


class TransformerTask(Task):
    """A task trained as the paper trains ``addition``: a decoder-only transformer, AdamW with linear warm-up.

    Shared by ``addition`` and ``tiny-lm``: the model-size and optimizer options
    and :meth:`make_optimizer`.
    """

    layers = Option(int, None, "Transformer blocks.", minimum=1)
    d_model = Option(int, None, "Residual stream width.", minimum=1)
    heads = Option(int, None, "Attention heads (must divide d_model).", minimum=1)
    d_mlp = Option(int, None, "MLP hidden width.", minimum=1)
    lr = Option(float, None, "AdamW peak learning rate.", minimum=0)
    weight_decay = Option(float, None, "AdamW weight decay.", minimum=0)
    warmup = Option(int, None, "Linear learning-rate warm-up steps: lr * min(step / warmup, 1).", minimum=0)

    def config(self, preset: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """The preset's settings with the options given; the heads must divide the residual width."""
        config = super().config(preset, options)
        if config["d_model"] % config["heads"]:
            msg = f"task {self.name!r}: --heads ({config['heads']}) must divide --d-model ({config['d_model']})"
            raise TaskError(msg)
        return config

    def make_optimizer(
        self, model: torch.nn.Module, config: Mapping[str, Any]
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        """AdamW (betas 0.9, 0.95) with the linear warm-up ``min(step / warmup, 1)``, stepped every step."""
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=float(config["lr"]), betas=(0.9, 0.95), weight_decay=float(config["weight_decay"])
        )
        warmup = max(1, int(config["warmup"]))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(step / warmup, 1.0))
        return optimizer, scheduler


class Addition(TransformerTask):
    """3-digit addition (Hidden Breakthroughs in Language Model Training).

    Held-out problems (the ``eval`` split, which is also the test data) are
    drawn first and removed from the pool; the training set is then drawn
    uniformly without replacement from the remaining problems: ``steps *
    batch_size`` of them (the preset's steps, or the run's when ``--steps`` asks for
    more), so a run is at most one epoch and every batch holds fresh problems, as
    the paper's uniform sampling gives. Only memory limits that: inputs and targets take
    ``steps * batch_size * 11 * 8 * 2`` bytes, 113 MB for the paper preset
    (640,000 problems); the whole 10^6 would take 176 MB for no gain.
    """

    name = "addition"
    description = "3-digit addition a+b= with a decoder-only transformer; loss on the 4 answer digits."
    objective = "token-cross-entropy"
    factory = "ckpt.sandboxes.addition:build_model"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": {
            "layers": 2,
            "d_model": 64,
            "heads": 4,
            "d_mlp": 256,
            "lr": 3e-3,
            "weight_decay": 0.1,
            "batch_size": 128,
            "warmup": 100,
            "steps": 2000,
            "every": 40,
        },
        "paper": {
            "layers": 3,
            "d_model": 512,
            "heads": 4,
            "d_mlp": 2048,
            "lr": 1e-5,
            "weight_decay": 0.1,
            "batch_size": 64,
            "warmup": 100,
            "steps": 10_000,
            "every": 100,
        },
    }

    batch_size = Option(int, None, "Problems per step.", minimum=1)

    def model_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments of :func:`build_model`."""
        return {key: int(config[key]) for key in ("layers", "d_model", "heads", "d_mlp")}

    def make_data(self, config: Mapping[str, Any], seed: int) -> Dataset:
        """Held-out eval problems, a disjoint training set, and the ``eval``/``train`` splits."""
        rng = np.random.default_rng(seed)
        held_out = rng.choice(PROBLEMS, EVAL_PROBLEMS, replace=False)
        pool = np.setdiff1d(np.arange(PROBLEMS), held_out, assume_unique=True)
        size = min(int(config["steps"]) * int(config["batch_size"]), len(pool))
        train = rng.choice(pool, size, replace=False)
        train_seq = torch.from_numpy(tokens(train // 1000, train % 1000))
        eval_split = split_arrays(held_out // 1000, held_out % 1000)
        train_split = split_arrays(train[:EVAL_PROBLEMS] // 1000, train[:EVAL_PROBLEMS] % 1000)
        train_mask = torch.zeros(size, SEQ_LEN, dtype=torch.bool)
        train_mask[:, list(ANSWER_POSITIONS)] = True
        return Dataset(
            train_inputs=train_seq[:, :-1].contiguous(),
            train_targets=train_seq[:, 1:].contiguous(),
            test_inputs=torch.from_numpy(eval_split["inputs"]),
            test_targets=torch.from_numpy(eval_split["targets"]),
            train_mask=train_mask,
            test_mask=torch.from_numpy(eval_split["mask"]),
            splits={"eval": eval_split, "train": train_split},
        )

    def evaluate(self, model: torch.nn.Module, data: Dataset) -> dict[str, float]:
        """Loss and answer-token accuracy on the test data and on the first 5,000 training problems.

        The base class evaluates the whole training set at every checkpoint; with
        one fresh problem per sample that is hundreds of thousands of problems per
        checkpoint, so the training metrics use a fixed uniform subsample (the
        training set is in random order).
        """
        rows = slice(0, TRAIN_METRIC_EXAMPLES)
        subset = Dataset(
            train_inputs=data.train_inputs[rows],
            train_targets=data.train_targets[rows],
            test_inputs=data.test_inputs,
            test_targets=data.test_targets,
            train_mask=None if data.train_mask is None else data.train_mask[rows],
            test_mask=data.test_mask,
        )
        return super().evaluate(model, subset)


__all__ = [
    "ANSWER_POSITIONS",
    "EQUALS",
    "EVAL_PROBLEMS",
    "PLUS",
    "PROBLEMS",
    "SEQ_LEN",
    "TRAIN_METRIC_EXAMPLES",
    "VOCAB",
    "Addition",
    "AdditionTransformer",
    "Block",
    "TransformerTask",
    "build_model",
    "carries",
    "split_arrays",
    "text",
    "tokens",
]

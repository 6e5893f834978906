"""``tiny-lm``: a small word-level causal language model on a bundled public-domain English text.

The text path of the analyzers (per-token POLCA, clusters of tokens, spaCy
part-of-speech labels) needs a store whose datapoints are words in running
English. This task makes one offline: the first fourteen of *Grimms' Fairy
Tales* (Taylor and Edwardes' translation, Project Gutenberg eBook #2591, public
domain; ``sandboxes/data/README.md``), about 105 KB and 25,000 tokens.

Tokens: the text with every whitespace run made one space, split by
:data:`TOKEN_PATTERN` into words (letters, with inner apostrophes: ``don't``,
``king's``), numbers and single punctuation marks. The vocabulary is ``<unk>``
(id 0) and the ``vocab - 1`` most frequent lower-cased tokens, by decreasing
count, ties alphabetically. The token stream is cut into consecutive,
non-overlapping windows of ``context + 1`` tokens; a window's first ``context``
tokens are the inputs and its last ``context`` the targets (the next token at
every position). Every tenth window (index 9, 19, ...) is held out: the first
``eval_sequences`` of those are the stored ``eval`` split and the test data; the
others train the model.

Every next-token prediction of an eval window is a datapoint (objective
``token-cross-entropy``; the stored mask is all true, so that the split's
``datapoints`` count them): ``eval_sequences * context`` of them,
``(example, position)`` = (window, target position). Besides ``inputs`` and
``targets`` the eval split stores what the text path needs to turn a datapoint
back into words: ``text`` (the window's text, from its first input token to its
last target token, so character 0 starts input token 0) and the per-token labels
``char_start`` / ``char_end``, the character span of each target token in its
window's text. The token string of datapoint (e, p) is
``text[e][char_start[e, p]:char_end[e, p]]`` (the word as written, also for
tokens the vocabulary maps to ``<unk>``).

The model is the ``addition`` sandbox's decoder-only transformer
(:class:`ckpt.sandboxes.addition.AdditionTransformer`: pre-LN blocks, learned
positions, causal attention written out so forward-mode AD works through it)
with this task's vocabulary and context length.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ckpt.errors import TaskConfigError, TaskError
from ckpt.plugins import Dataset, Option, config_bounds
from ckpt.sandboxes.addition import AdditionTransformer, TransformerTask

TEXT_PATH = Path(__file__).with_name("data") / "grimm.txt"
"""The bundled text (see ``sandboxes/data/README.md`` for its source)."""
TOKEN_PATTERN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|[0-9]+|[^\sA-Za-z0-9]")
"""A word (inner apostrophes kept), a number, or one punctuation mark."""
UNKNOWN = "<unk>"
"""Token 0: every token outside the vocabulary."""
HELD_OUT_EVERY = 10
"""Every tenth window is held out (windows 9, 19, ...)."""


@functools.cache
def corpus() -> str:
    """The bundled text with every run of whitespace made a single space (line breaks are only wrapping)."""
    return " ".join(TEXT_PATH.read_text(encoding="ascii").split())


def tokenize(text: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Tokens of ``text`` by :data:`TOKEN_PATTERN`, with their character spans.

    Returns
    -------
    tokens : list of str
        The tokens as written.
    start, end : numpy.ndarray
        int64 ``[tokens]``: ``text[start[i]:end[i]] == tokens[i]``.
    """
    matches = list(TOKEN_PATTERN.finditer(text))
    start = np.array([m.start() for m in matches], dtype=np.int64)
    end = np.array([m.end() for m in matches], dtype=np.int64)
    return [m.group() for m in matches], start, end


def vocabulary(tokens: list[str], size: int) -> list[str]:
    """``<unk>`` and the ``size - 1`` most frequent lower-cased tokens (by count, then alphabetically)."""
    if size < 2:
        msg = f"the vocabulary needs at least 2 entries (<unk> and one token), got {size}"
        raise TaskConfigError(msg)
    counts = Counter(token.lower() for token in tokens)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [UNKNOWN] + [token for token, _ in ranked[: size - 1]]


def encode(tokens: list[str], vocab: list[str]) -> np.ndarray:
    """Token ids (int64), 0 for tokens outside ``vocab``."""
    index = {token: i for i, token in enumerate(vocab)}
    return np.array([index.get(token.lower(), 0) for token in tokens], dtype=np.int64)


def window_starts(count: int, context: int) -> np.ndarray:
    """First token of every whole, non-overlapping window of ``context + 1`` tokens."""
    return np.arange(0, count - context, context + 1, dtype=np.int64)


def split_arrays(
    text: str, ids: np.ndarray, start: np.ndarray, end: np.ndarray, windows: np.ndarray, context: int
) -> dict[str, Any]:
    """Keyword arguments of ``Writer.add_data`` for the windows beginning at the tokens ``windows``.

    Returns
    -------
    dict
        ``inputs``/``targets`` int64 ``[N, context]``, ``mask`` (all true), the per-token labels
        ``char_start``/``char_end`` (span of each target token in its window's
        text) and one ``text`` per window.
    """
    rows = windows[:, None] + np.arange(context + 1)
    sequences = ids[rows]
    first = start[windows]
    texts = [text[a:b] for a, b in zip(first, end[windows + context], strict=True)]
    targets = rows[:, 1:]
    return {
        "inputs": sequences[:, :-1],
        "targets": sequences[:, 1:],
        "mask": np.ones((len(windows), context), dtype=bool),
        "labels": {"char_start": start[targets] - first[:, None], "char_end": end[targets] - first[:, None]},
        "text": texts,
    }


# a store's config is data: no config asks for a model beyond what these sandboxes are meant to train
@config_bounds(
    layers=(1, 256), d_model=(1, 16384), heads=(1, 1024), d_mlp=(1, 65536), vocab=(2, 1 << 20), max_len=(1, 1 << 16)
)
def build_model(layers: int, d_model: int, heads: int, d_mlp: int, vocab: int, max_len: int) -> AdditionTransformer:
    """The model factory recorded in stores (``ckpt.sandboxes.tiny_lm:build_model``).

    Parameters
    ----------
    layers, d_model, heads, d_mlp
        Depth, residual width, attention heads, MLP width.
    vocab, max_len
        Vocabulary size and context length.

    Returns
    -------
    AdditionTransformer
        A freshly initialised decoder-only transformer (seeded by the caller's torch RNG).
    """
    return AdditionTransformer(layers, d_model, heads, d_mlp, vocab, max_len)


class TinyLM(TransformerTask):
    """Next-word prediction on the bundled fairy tales; every token of the eval windows is a datapoint."""

    name = "tiny-lm"
    description = "Word-level causal LM on a bundled public-domain English text (Grimms' Fairy Tales)."
    objective = "token-cross-entropy"
    factory = "ckpt.sandboxes.tiny_lm:build_model"
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "default": {
            "layers": 2,
            "d_model": 64,
            "heads": 4,
            "d_mlp": 128,
            "vocab": 512,
            "context": 32,
            "eval_sequences": 64,
            "lr": 3e-3,
            "weight_decay": 0.1,
            "batch_size": 32,
            "warmup": 20,
            "steps": 300,
            "every": 15,
        },
        "large": {
            "layers": 4,
            "d_model": 256,
            "heads": 8,
            "d_mlp": 1024,
            "vocab": 2048,
            "context": 64,
            "eval_sequences": 38,
            "lr": 1e-3,
            "weight_decay": 0.1,
            "batch_size": 64,
            "warmup": 100,
            "steps": 3000,
            "every": 100,
        },
    }

    vocab = Option(int, None, "Vocabulary size, <unk> included (the most frequent lower-cased tokens).", minimum=2)
    context = Option(int, None, "Tokens per input window.", minimum=1)
    eval_sequences = Option(
        int, None, "Held-out windows stored as the eval split (each gives context datapoints).", minimum=1
    )
    batch_size = Option(int, None, "Windows per step.", minimum=1)

    def model_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Keyword arguments of :func:`build_model`."""
        sizes = {key: int(config[key]) for key in ("layers", "d_model", "heads", "d_mlp", "vocab")}
        return {**sizes, "max_len": int(config["context"])}

    def make_data(self, config: Mapping[str, Any], seed: int) -> Dataset:
        """Windows of the tokenized text: every tenth held out (``eval``), the rest for training.

        The data do not depend on ``seed`` (it seeds the model and the batch order).
        """
        context, vocab_size = int(config["context"]), int(config["vocab"])
        if context < 1 or vocab_size < 2:
            msg = f"--context must be at least 1 and --vocab at least 2 (<unk>, a word), got {context}, {vocab_size}"
            raise TaskError(msg)
        text = corpus()
        tokens, start, end = tokenize(text)
        ids = encode(tokens, vocabulary(tokens, vocab_size))
        windows = window_starts(len(tokens), context)
        held_out = np.arange(len(windows)) % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        wanted = int(config["eval_sequences"])
        if not 1 <= wanted <= held_out.sum():
            msg = f"--eval-sequences must be between 1 and {held_out.sum()} with --context {context}, got {wanted}"
            raise TaskError(msg)
        train_windows, eval_windows = windows[~held_out], windows[held_out][:wanted]
        eval_split = split_arrays(text, ids, start, end, eval_windows, context)
        train_split = split_arrays(text, ids, start, end, train_windows[:wanted], context)
        train_rows = torch.from_numpy(ids[train_windows[:, None] + np.arange(context + 1)])
        return Dataset(
            train_inputs=train_rows[:, :-1].contiguous(),
            train_targets=train_rows[:, 1:].contiguous(),
            test_inputs=torch.from_numpy(eval_split["inputs"]),
            test_targets=torch.from_numpy(eval_split["targets"]),
            test_mask=torch.from_numpy(eval_split["mask"]),
            splits={"eval": eval_split, "train": train_split},
        )


__all__ = [
    "HELD_OUT_EVERY",
    "TEXT_PATH",
    "TOKEN_PATTERN",
    "UNKNOWN",
    "TinyLM",
    "build_model",
    "corpus",
    "encode",
    "split_arrays",
    "tokenize",
    "vocabulary",
    "window_starts",
]

"""Tiny model factories for tests: importable as ``tests.models:NAME`` model specs."""

from __future__ import annotations

import torch
from torch import nn


def mlp(d_in: int = 3, hidden: int = 8, classes: int = 4) -> nn.Module:
    """A classifier of [N, d_in] features into ``classes``."""
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))


def layer_norm_mlp(d_in: int = 3, hidden: int = 8, classes: int = 4) -> nn.Module:
    """:func:`mlp` with a gainless ``nn.LayerNorm`` in place of its Tanh: the same state-dict keys."""
    return nn.Sequential(
        nn.Linear(d_in, hidden), nn.LayerNorm(hidden, elementwise_affine=False), nn.Linear(hidden, classes)
    )


class TinyLM(nn.Module):
    """A causal-ish token model: embedding, one mixing layer over the prefix mean, unembedding."""

    def __init__(self, vocab: int = 7, d: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(2 * d, d)
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        prefix = x.cumsum(1) / torch.arange(1, tokens.shape[1] + 1, device=tokens.device).view(1, -1, 1)
        return self.out(torch.tanh(self.mix(torch.cat([x, prefix], -1))))


def tiny_lm(vocab: int = 7, d: int = 6) -> nn.Module:
    """Factory of :class:`TinyLM`."""
    return TinyLM(vocab, d)


class MultiheadClassifier(nn.Module):
    """Token embedding, one ``nn.MultiheadAttention`` self-attention (2 heads), mean over positions, a linear head."""

    def __init__(self, vocab: int = 5, d: int = 8, heads: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        mixed, _ = self.attn(x, x, x, need_weights=False)
        return self.head(mixed.mean(1))


def multihead_classifier(vocab: int = 5, d: int = 8, heads: int = 2, classes: int = 3) -> nn.Module:
    """Factory of :class:`MultiheadClassifier`."""
    return MultiheadClassifier(vocab, d, heads, classes)

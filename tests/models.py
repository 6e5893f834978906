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


class TiedLM(nn.Module):
    """Token embedding and unembedding tied (one parameter under two names), a scale buffer computed at build."""

    def __init__(self, vocab: int = 7, d: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.embed.weight
        # not in any checkpoint: the model's own code computes it, so a weightless build must keep it
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.embed(tokens) * self.scale)))


def tied_lm(vocab: int = 7, d: int = 4) -> nn.Module:
    """Factory of :class:`TiedLM`."""
    return TiedLM(vocab, d)


COLLECTOR_ENABLED_AT_BUILD: list[bool] = []
"""Whether the garbage collector was on at each call of :func:`mlp_recording_the_collector` (test_collector.py)."""


def mlp_recording_the_collector(d_in: int = 3, hidden: int = 8, classes: int = 4) -> nn.Module:
    """:func:`mlp`, noting in :data:`COLLECTOR_ENABLED_AT_BUILD` whether the collector was on when it was built."""
    import gc

    COLLECTOR_ENABLED_AT_BUILD.append(gc.isenabled())
    return mlp(d_in, hidden, classes)

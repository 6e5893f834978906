"""Rows of a token-embedding table across checkpoints, in bounded memory; the view of a large vocabulary.

Pair sums ``E_a + E_b`` (:class:`~ckpt.analyzers.figures.geometry.EmbeddingView`) are the picture of
modular addition, where the N residues are the whole vocabulary. A language model's table has no
residues: all pair sums of GPT-2's 50,257 tokens are 1.26 billion points (75 GiB of coordinates per
frame) and mean nothing. Above :data:`PAIR_SUM_MAX_TOKENS` rows the figures show instead the
:data:`TOKENS_SHOWN` tokens that occur most often in the store's evaluation data, on the two
principal components of their embeddings at the last checkpoint.

Memory: a checkpoint's table is read once per frame and only the rows shown are kept, so a frame
costs one table plus ``TOKENS_SHOWN x dim`` numbers, never anything in ``vocabulary²``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

PAIR_SUM_MAX_TOKENS = 256
"""Largest N drawn with all ``N (N+1) / 2`` pair sums (32,896 points at 256).

The papers' tasks stay far below (modular addition N = 17 by default, the sparse task's p = 2, toy
vocabularies up to a few hundred). Above a few hundred residues the pair sums overplot into one
blot at a report's 300-pixel panels, and the scatter's cost grows with N²: 256 keeps a frame
under a second and leaves every modular run's pictures as they were.
"""
TOKENS_SHOWN = 1000
"""Tokens in the view of a larger table: token frequencies fall off as Zipf's law, so the commonest
1,000 are a large share of running text (the title states the share in the store's data), and 1,000
points stay distinguishable in a panel and draw in a fraction of a second."""
LABELLED = 10
"""The most frequent tokens labelled with their ids in the view of a larger table."""


def table_rows(store: Any, tensor: str, steps: Sequence[int], rows: slice | np.ndarray) -> np.ndarray:
    """``[step, row, dim]`` float64: the ``rows`` of ``tensor`` at each of ``steps``.

    One checkpoint at a time, keeping only the rows asked for: a GPT-2 table is 154 MB a
    checkpoint, and a slider's 40 of them at once would be 6 GB.
    """
    return np.stack([store.tensors(int(s), [tensor])[tensor][rows].astype(np.float64) for s in steps])


def principal_plane(table: np.ndarray) -> np.ndarray | None:
    """The top-2 principal directions (``[dim, 2]``) of ``table``'s rows; None when it is at most 2 wide.

    numpy's exact SVD of the centred rows: the rows are bounded (at most :data:`TOKENS_SHOWN` or
    :data:`PAIR_SUM_MAX_TOKENS`), so a randomised low-rank method would save nothing and make
    the projection, hence every figure, depend on a seed.
    """
    if table.shape[1] <= 2:
        return None
    _, _, right = np.linalg.svd(table - table.mean(axis=0), full_matrices=False)
    return right[:2].T


def bounds(values: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """Padded x and y limits holding every 2-D point of ``values`` (``[..., 2]``)."""
    low, high = values.reshape(-1, 2).min(axis=0), values.reshape(-1, 2).max(axis=0)
    pad = 0.08 * np.maximum(high - low, 1e-9)
    return (low[0] - pad[0], high[0] + pad[0]), (low[1] - pad[1], high[1] + pad[1])


def _token_counts(store: Any, rows: int) -> tuple[str, np.ndarray] | None:
    """The split whose inputs are token ids of a ``rows``-row table, and each id's count (masked-out excluded).

    ``eval`` first (the split analyzers use by default), then the others in order; None when no
    split holds integer ids in ``0 .. rows-1``.
    """
    splits = sorted(store.splits, key=lambda s: s != "eval")
    for split in splits:
        data = store.data(split)
        ids = np.asarray(data["inputs"].values)
        if ids.dtype.kind not in "iu" or ids.size == 0 or ids.min() < 0 or ids.max() >= rows:
            continue
        if "mask" in data and data["mask"].shape == ids.shape:
            ids = ids[np.asarray(data["mask"].values, dtype=bool)]
        return split, np.bincount(ids.ravel(), minlength=rows)
    return None


def frequent_tokens(
    store: Any, rows: int, count: int = TOKENS_SHOWN, below: int | None = None
) -> tuple[np.ndarray, str]:
    """The ids of the ``count`` tokens most frequent in the store's data, most frequent first, and what they are.

    Parameters
    ----------
    store
        The opened store.
    rows
        The table's rows: a split whose inputs are ids ``0 .. rows-1`` is token data of this table.
    count
        How many ids at most.
    below
        Only ids below this (``--modulus``); default ``rows``.

    Returns
    -------
    ids, description
        The ids (ties in id order), and a phrase for titles: the split and the share of its tokens
        they cover. Without token data (or with fewer than two distinct tokens) the first ``count``
        ids, said so.
    """
    below = rows if below is None else min(below, rows)
    found = _token_counts(store, rows)
    if found is not None:
        split, counts = found
        order = np.argsort(-counts[:below], kind="stable")[: min(count, int(np.count_nonzero(counts[:below])))]
        if len(order) >= 2:
            share = counts[order].sum() / counts.sum()
            which = "tokens" if below == rows else f"of ids 0..{below - 1}"
            return order, f"the {len(order):,} most frequent {which} in split {split!r} ({share:.0%} of its tokens)"
    shown = min(count, below)
    return np.arange(shown), f"token ids 0..{shown - 1} (no token data in the store to rank tokens by)"


class TableView:
    """Chosen rows of an embedding table across checkpoints, as 2-D points.

    One projection for all steps, the top-2 principal directions of the rows at the last
    checkpoint, so that frames are comparable; a table of 2 columns is shown as it is.

    Parameters
    ----------
    store
        The opened store.
    tensor
        The table's name (``[tokens, dim]``).
    rows
        The rows shown: a slice or an array of ids.
    """

    def __init__(self, store: Any, tensor: str, rows: slice | np.ndarray) -> None:
        self.store, self.tensor, self.rows = store, tensor, rows
        last = table_rows(store, tensor, [int(store.steps[-1])], rows)[0]
        self.projection = principal_plane(last)
        self.axis_names = ("PC 1", "PC 2") if self.projection is not None else ("dim 0", "dim 1")

    def points(self, steps: Sequence[int]) -> np.ndarray:
        """``[step, row, 2]``: the shown rows at ``steps``, projected when the table is wider than 2."""
        table = table_rows(self.store, self.tensor, steps, self.rows)
        return table @ self.projection if self.projection is not None else table[..., :2]


class FrequentTokensView(TableView):
    """The most frequent tokens of a large embedding table across checkpoints, as 2-D points.

    Parameters
    ----------
    store, tensor
        As :class:`TableView`.
    rows
        Only ids below this are shown (default: every row).
    count
        How many tokens.
    """

    panels = 1
    """Axes one checkpoint is drawn on."""

    def __init__(self, store: Any, tensor: str, rows: int | None = None, count: int = TOKENS_SHOWN) -> None:
        self.ids, self.description = frequent_tokens(store, int(store.schema[tensor].shape[0]), count, below=rows)
        super().__init__(store, tensor, self.ids)
        self.title = f"{tensor}: {self.description}"

    @staticmethod
    def limits(points: np.ndarray) -> tuple[Any, ...]:
        """Axis limits that hold every frame of ``points``."""
        return (bounds(points),)

    def draw(self, axes: Sequence[Axes], points: np.ndarray, limits: tuple[Any, ...] | None) -> None:
        """Draw one checkpoint on ``axes[0]``: the tokens coloured by frequency rank, the top ones labelled by id."""
        (ax,) = axes
        ranks = np.arange(len(self.ids))
        ax.scatter(points[:, 0], points[:, 1], c=ranks, cmap="viridis", vmin=0, vmax=len(ranks), s=6, linewidths=0)
        for rank in ranks[:LABELLED]:
            ax.annotate(str(int(self.ids[rank])), points[rank], textcoords="offset points", xytext=(3, 3), fontsize=6)
        ax.set_title(f"{len(ranks):,} tokens, dark: commonest", fontsize="medium")  # fits a report's 4-step row
        ax.set_xlabel(self.axis_names[0])
        ax.set_ylabel(self.axis_names[1])
        if limits is None:
            ax.set_aspect("equal", adjustable="datalim")
        else:
            ax.set_xlim(limits[0][0])
            ax.set_ylim(limits[0][1])


__all__ = [
    "LABELLED",
    "PAIR_SUM_MAX_TOKENS",
    "TOKENS_SHOWN",
    "FrequentTokensView",
    "TableView",
    "bounds",
    "frequent_tokens",
    "principal_plane",
    "table_rows",
]

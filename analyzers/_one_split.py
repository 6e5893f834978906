"""The data dependence of the built-in analyzers that read one split, ``--split``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store import Store


class OneSplit:
    """Mixin of an analyzer whose result depends on ``--split``'s data and no other split's.

    The analyzer declares its own ``split`` option (each says what the split is for);
    this gives :meth:`~ckpt.plugins.Analyzer.data_splits`, so that adding or replacing
    another split leaves its stored results as they are.
    """

    split: Any

    def data_splits(self, store: Store) -> tuple[str, ...]:
        """Only ``--split``'s data: another split added or replaced leaves the result as it is."""
        return (str(self.split),)


__all__ = ["OneSplit"]

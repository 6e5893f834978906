"""One read of each new checkpoint for every analyzer a watch follows: :class:`SharedReads`.

``ckpt watch`` runs several analyzers over the same new checkpoints, one after the other.
Each run's workers in this process read through the store the run was given
(:func:`ckpt.engine.worker.lend_store`), so a watch gives every run one
:class:`SharedReads`: a :class:`~ckpt.store.Store` whose checkpoint reads
(:meth:`~ckpt.store.Store.tensors`, and through it ``worker.params`` and ``worker.tensors``)
keep the tensors of the round's new checkpoints once read, for the next analyzer.

- Only the checkpoints :meth:`SharedReads.round` names and those committed during the round are
  kept, as many as ``limit`` bytes hold (the first ones read; the rest are read by each
  analyzer, as without a watch). Those committed during the round stay for the next, whose
  first analyzers compute them, and so does the newest checkpoint the round named: the
  analyzers comparing a checkpoint with the one before (``grad-norms``' update, pairs) read it
  again there.
- A checkpoint is read whole, once, its digests checked as any read; each caller gets its own
  copy of the arrays, so an analyzer that writes into what it read changes no other's input.
- Kept tensors are keyed by step and the checkpoint's digest in the commit record: a store
  repaired or replaced since is read anew, never answered from before.
- Workers in other processes (``--scheduler processes``, ``--workers``, ``--address``) open
  the store themselves and read as they would without a watch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ckpt.store.reader import Store


class SharedReads(Store):
    """A read-only store whose checkpoints named by :meth:`round` are read once for all the round's readers.

    Parameters
    ----------
    path
        Path or URL of the store.
    storage_options
        fsspec options of a remote store.
    limit
        Bytes of checkpoints kept at most (at least one checkpoint is always kept).
    """

    def __init__(self, path: str, *, storage_options: dict[str, Any] | None = None, limit: int = 1 << 30) -> None:
        self._limit = int(limit)
        self._kept: dict[tuple[int, str | None], dict[str, np.ndarray]] = {}
        self._wanted: set[int] = set()
        self._since: int | None = None  # during a round: the newest step when it began (newer ones are kept)
        self._guard = threading.Lock()
        self._reading: dict[tuple[int, str | None], threading.Lock] = {}
        self.reads = 0
        """Checkpoints read from the store for a round (each whole, once)."""
        super().__init__(path, storage_options=storage_options)

    @contextmanager
    def round(self, steps: Iterable[int]) -> Iterator[None]:
        """Within: the checkpoints of ``steps``, and those committed from now on, are read once and kept.

        The analyzers of a round run one after the other, each over what is committed when it
        starts: a checkpoint committed meanwhile is computed by the later ones in this round and
        by the earlier ones in the next. So when the round ends, the checkpoints committed during
        it stay, with the newest of ``steps`` (which the next new checkpoint is compared with).
        """
        since = int(self.steps.max()) if len(self) else None
        with self._guard:
            self._wanted = {int(s) for s in steps}
            self._since = since
        try:
            yield
        finally:
            with self._guard:
                newest = max((key for key in self._kept if key[0] in self._wanted), default=None)
                later = {key for key in self._kept if since is None or key[0] > since}
                self._kept = {
                    key: self._kept[key] for key in sorted(later | ({newest} if newest is not None else set()))
                }
                self._wanted, self._since = set(), None

    @property
    def kept_steps(self) -> list[int]:
        """The steps whose tensors are kept now."""
        with self._guard:
            return sorted(step for step, _ in self._kept)

    def stored_tensors(self, step: int, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """As :meth:`Store.stored_tensors`; a checkpoint of the round is read whole once, then copied from memory."""
        chosen = list(self.schema) if names is None else [names] if isinstance(names, str) else list(names)
        known = step in self and all(name in self.schema for name in chosen)
        kept = self._kept_or_read((int(step), self.checkpoint_digest(step))) if known else None
        if kept is None:  # not a checkpoint of the round (or a step or name the store refuses, as it does)
            return super().stored_tensors(step, chosen)
        return {name: kept[name].copy() for name in chosen}

    def _kept_or_read(self, key: tuple[int, str | None]) -> dict[str, np.ndarray] | None:
        """The kept tensors of ``key``, read now when the round wants them and they fit; None: not kept."""
        with self._guard:
            if key in self._kept:
                return self._kept[key]
            wanted = key[0] in self._wanted or (self._since is not None and key[0] > self._since)
            if not wanted:
                return None
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:  # the other threads asking for this checkpoint wait for the one read
            try:
                with self._guard:
                    if key in self._kept:
                        return self._kept[key]
                    held = sum(value.nbytes for tensors in self._kept.values() for value in tensors.values())
                    size = sum(info.nbytes for info in self.schema.values())
                    if self._kept and held + size > self._limit:
                        return None  # the first checkpoints read stay: dropping one for another saves no read
                tensors = super().stored_tensors(key[0], None)
                with self._guard:
                    self._kept[key] = tensors
                    self.reads += 1
            finally:
                with self._guard:
                    self._reading.pop(key, None)
        return tensors


__all__ = ["SharedReads"]

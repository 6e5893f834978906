"""Pieces of a per-run result committed as they are found, so that a killed run resumes (:class:`Journal`).

The engine commits a per-checkpoint result block by block; a per-run result (a basis grown
checkpoint by checkpoint, an allocation per checkpoint pair) is one value, written when the
whole run is done, so a run killed after hours kept nothing. Its analyzer can commit each
piece, as soon as it is found, to ``analyses/<name>.partial``: an ordinary committed result
(crash-safe, checksummed like any other) whose provenance says it is partial, which request
it belongs to and the keys of the pieces it holds, in the order they were committed.

Two kinds of pieces:

- *a chain* (:meth:`Journal.append`, :meth:`Journal.load`): each piece depends on those before
  it (a basis deflated against earlier vectors); a rerun takes the pieces whose keys are a
  prefix of what it would compute, and computes only the rest.
- *independent pieces* (:meth:`Journal.add`, :meth:`Journal.pieces`): each piece depends only
  on what its key names (one checkpoint pair), so tasks run in parallel and commit in whatever
  order they finish; a rerun takes every committed piece whose key it would compute, in any
  order, and computes the others. Commits wait for the result lock of ``<name>.partial``
  (:func:`ckpt.store.results.result_lock`; local stores: a remote store has no lock, so there
  one process should commit at a time).

The engine removes the journal once the whole result is committed. A journal of another
request (other options, data, model) is never read: it is discarded and everything is
computed anew; what a piece was computed from besides the request (its checkpoints' digests)
belongs in its key.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt.engine.worker import open_store
from ckpt.errors import CkptError
from ckpt.store.format import PARTIAL_SUFFIX

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

    from ckpt.store import Store

_COMMITTING = threading.Lock()
"""Serialises one process's commits of independent pieces (threads; and stores with no directory lock)."""


@dataclass(frozen=True)
class Journal:
    """Where the pieces of one request's result are committed (cheap to ship to workers).

    Attributes
    ----------
    where
        The store.
    name
        The result's name (``analyses/<name>``; ``--as`` included).
    analyzer
        The analyzer computing it.
    identity
        A digest of the request (analyzer, version, options, data, model, requirements):
        pieces of any other request are never read.
    """

    where: str
    name: str
    analyzer: str
    identity: str
    storage_options: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def partial(self) -> str:
        """The journal's result name, ``<name>.partial``."""
        return f"{self.name}{PARTIAL_SUFFIX}"

    def _open(self) -> Store:
        """The store as committed now (the one the engine lent this process, refreshed, or one opened now)."""
        return open_store(self.where, self.storage_options, fresh=True)

    def _opened(self, store: Store) -> tuple[xr.Dataset, dict[str, Any]] | None:
        """The journal (lazy) and its record, or None when there is none or it cannot be read."""
        if self.partial not in store.analyses:
            return None
        try:
            journal = store.analysis(self.partial)
        except CkptError:  # damaged or deleted by hand: never read
            return None
        attrs = journal.attrs.get("ckpt")
        record = attrs.get("partial") if isinstance(attrs, dict) else None
        return (journal, record) if isinstance(record, dict) and record.get("of") == self.name else None

    def _held(self, store: Store) -> tuple[xr.Dataset, list[Any]] | None:
        """The journal of this request (lazy) and the keys of the pieces it holds, or None."""
        opened = self._opened(store)
        if opened is None or opened[1].get("identity") != self.identity:
            return None
        keys = opened[1].get("keys")
        return (opened[0], keys) if isinstance(keys, list) else None

    def load(self, keys: Sequence[Any]) -> tuple[xr.Dataset, list[Any]] | None:
        """The committed pieces of an interrupted run of this request, if they are a prefix of ``keys``.

        Parameters
        ----------
        keys
            JSON values naming the pieces this run would compute, in order.

        Returns
        -------
        (xarray.Dataset, list) or None
            The journal (lazy) and the keys of the pieces it holds; None when there is
            none, or it belongs to another request, or its keys are not a prefix of ``keys``,
            or it cannot be read (then it is simply computed again).
        """
        held = self._held(self._open())
        if held is None or not held[1] or held[1] != _json(list(keys))[: len(held[1])]:
            return None
        return held

    def append(self, piece: xr.Dataset, dim: str, keys: Sequence[Any]) -> None:
        """Commit ``piece`` as the last of the pieces named by ``keys`` (along ``dim``).

        The journal must hold exactly the pieces of ``keys[:-1]`` (the first piece starts a new one).
        """
        keys = _json(list(keys))
        if len(keys) > 1:
            opened = self._held(self._open())
            held = opened[1] if opened is not None else None
            if held != keys[:-1]:
                msg = (
                    f"the journal {self.partial} holds pieces {held}, not {keys[:-1]}: another run of "
                    f"{self.analyzer!r} wrote it meanwhile; rerun the command"
                )
                raise CkptError(msg)
        self._write(piece, dim if len(keys) > 1 else None, keys)

    def _write(self, piece: xr.Dataset, append_dim: str | None, keys: Sequence[Any]) -> None:
        """Commit ``piece`` (appended along ``append_dim``, or starting the journal) as holding ``keys``."""
        from ckpt.store.provenance import Provenance
        from ckpt.store.results import ResultSink

        # the record names the pieces: the sink extends the stored ones unless it names this one alone
        record = Provenance(analyzer=self.analyzer, partial={"of": self.name, "identity": self.identity, "keys": keys})
        sink = ResultSink(self.where, self.partial, record, storage_options=self.storage_options)
        sink.append(piece, dim=append_dim or "step")

    def variables(
        self, keys: Sequence[Any], like: Mapping[str, xr.Variable], coords: Mapping[Hashable, Any]
    ) -> dict[str, xr.Variable]:
        """Variables of the whole result as the journal holds them once it holds every piece of ``keys``.

        Lazy, one Dask chunk per stored chunk, each checked against its digest when read: the engine
        writes them into the result chunk by chunk (:meth:`AnalysisContext.write_from_journal`).

        Parameters
        ----------
        keys
            The keys of every piece of the result, in the order they were committed.
        like
            ``{name: the variable the result would hold}``: the journal's must have its dims, shape
            and dtype (its attributes are kept).
        coords
            The result's coordinates: those the journal holds too must hold the same values.

        Raises
        ------
        CkptError
            The journal does not hold exactly the pieces of ``keys`` (another run wrote it
            meanwhile), lacks a variable, or holds one that differs from ``like`` or ``coords``.
        """
        import numpy as np
        import xarray as xr

        held = self._held(self._open())
        if held is None or held[1] != _json(list(keys)):
            have = "no pieces of this request" if held is None else f"the pieces {held[1]}"
            msg = (
                f"the journal {self.partial} holds {have}, not the {len(keys)} of this result: another run of "
                f"{self.analyzer!r} wrote it meanwhile (or none of the result's other variables depends on every "
                "piece, so not every piece ran); rerun the command"
            )
            raise CkptError(msg)
        saved = held[0]
        for name, values in coords.items():
            if name in saved.coords and not np.array_equal(saved[name].values, np.asarray(values)):
                msg = f"the journal {self.partial}'s coordinate {name!r} differs from its result's; rerun with --force"
                raise CkptError(msg)
        variables = {}
        for name, expected in like.items():
            found = saved.variables.get(name)
            layout = (expected.dims, expected.shape, expected.dtype)
            if found is None or (found.dims, found.shape, found.dtype) != layout:
                what = "lacks it" if found is None else f"holds {found.dims} {found.shape} {found.dtype}"
                msg = (
                    f"the journal {self.partial} does not hold variable {name!r} as its result needs it "
                    f"({expected.dims} {expected.shape} {expected.dtype}): it {what}; rerun with --force"
                )
                raise CkptError(msg)
            # a bare Variable: no coordinates to align (a Dataset aligns DataArrays on their indexes), no
            # encoding of the journal's (the result's chunks are the dask chunks, its codecs the writer's)
            variables[name] = xr.Variable(found.dims, found.data, expected.attrs)
        return variables

    def pieces(self, keys: Sequence[Any]) -> tuple[xr.Dataset, dict[int, int]] | None:
        """The committed independent pieces of an interrupted run of this request that are among ``keys``.

        Parameters
        ----------
        keys
            JSON values naming the pieces this run would compute.

        Returns
        -------
        (xarray.Dataset, dict) or None
            The journal (lazy) and ``{index in keys: index of that piece in the journal}``
            for each piece it holds whose key is in ``keys``, in any order; None when it holds
            none of them, or belongs to another request, or cannot be read.
        """
        held = self._held(self._open())
        if held is None:
            return None
        position = {_canonical(key): index for index, key in enumerate(held[1])}
        found = {i: position[_canonical(key)] for i, key in enumerate(_json(list(keys))) if _canonical(key) in position}
        return (held[0], found) if found else None

    def add(self, piece: xr.Dataset, dim: str, key: Any) -> None:
        """Commit ``piece``, named ``key``, next to the independent pieces the journal holds (along ``dim``).

        Pieces of one request may be added in any order and from parallel tasks: each commit
        holds the journal's lock and appends to what is committed then. A journal of another
        request is replaced; a piece whose key is already held is not committed twice.
        """
        key = _json(key)
        with self._committing():
            opened = self._held(self._open())
            held = opened[1] if opened is not None else []
            if _canonical(key) in {_canonical(k) for k in held}:
                return
            self._write(piece, dim if held else None, [*held, key])

    @contextlib.contextmanager
    def _committing(self) -> Iterator[None]:
        """Hold the journal's lock: this process's, and the result lock of ``<name>.partial`` (waiting for it)."""
        from ckpt.store.results import result_lock

        with _COMMITTING, result_lock(self.where, self.partial, blocking=True):
            yield

    def discard(self) -> None:
        """Remove the journal of result ``name`` (of any request), if there is one."""
        from ckpt.store.results import delete_analysis

        store = self._open()
        if self.partial not in store.analyses or store.analyzer_of(self.partial) != self.analyzer:
            return
        try:
            attrs = store.analysis(self.partial).attrs.get("ckpt")
        except CkptError:  # a damaged journal of this analyzer: nothing in it can be used
            attrs = {"partial": None}
        if isinstance(attrs, dict) and "partial" in attrs:  # not a result a user saved under that name
            delete_analysis(self.where, self.partial, storage_options=self.storage_options)


def _json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparisons with stored keys."""
    import json

    return json.loads(json.dumps(value))


def _canonical(key: Any) -> str:
    """A hashable spelling of a JSON key."""
    import json

    return json.dumps(key, sort_keys=True)


__all__ = ["PARTIAL_SUFFIX", "Journal"]

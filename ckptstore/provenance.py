"""The provenance of a stored analysis result: one typed record, read from and written to ``attrs["ckpt"]``.

Every result the engine stores carries, in the ``ckpt`` attribute of its group, what it was
computed by and from (docs/store-format.md, section 4): its analyzer, that analyzer's version
and options, the hashes of the data and model it saw, the identity of each result it
required, the steps it covers, when and by which ckpt it was written, and, for the journal of
an interrupted per-run result, which request it belongs to. :class:`Provenance` is that
record; its fields are the only place its keys are spelled::

    record = Provenance.from_attrs(result.attrs["ckpt"])    # checked: CorruptRecordError if not
    record.analyzer, record.options["k"], record.steps, record.identity()
    attrs = {"ckpt": record.with_steps([0, 10]).to_attrs()}

A store is data: :meth:`Provenance.from_attrs` checks every field by type and raises
:class:`~ckpt.errors.CorruptRecordError` (one message naming the field, what it holds and
what to do) for a record that is not an object, a field of the wrong type, a value that is not
JSON, or a required field that is missing. Keys it does not know (written by a newer ckpt, or
added by a plugin's :meth:`~ckpt.plugins.Analyzer.provenance`) are kept as :attr:`Provenance.extra`,
checked to be plain JSON, and written back as they were: a record read and written again holds
the same fields (a null field reads as unrecorded, and is left out). Stores written by ckpt 0.1
and 0.2 read as they are: what they did not record (``model_sha256`` in 0.1) reads as None.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckpt.errors import CorruptRecordError

ANALYZER = "analyzer"
VERSION = "version"
OPTIONS = "options"
DATA_SHA256 = "data_sha256"
MODEL_SHA256 = "model_sha256"
REQUIRES = "requires"
STEPS = "steps"
CREATED = "created"
CKPT_VERSION = "ckpt_version"
PARTIAL = "partial"

KNOWN = (ANALYZER, VERSION, OPTIONS, DATA_SHA256, MODEL_SHA256, REQUIRES, STEPS, CREATED, CKPT_VERSION, PARTIAL)
"""Every key of the record ckpt reads, in the order :meth:`Provenance.to_attrs` writes them."""
IDENTITY = (ANALYZER, VERSION, OPTIONS, DATA_SHA256, MODEL_SHA256, REQUIRES)
"""The fields that decide whether a stored result is reused: a request with the same ones computes the same values."""
SAME_MEASURE = (ANALYZER, VERSION, OPTIONS, DATA_SHA256)
"""The fields two results must share to be one trajectory (a run and its parent's, joined by lineage)."""
RESULT_FIELDS = (ANALYZER, VERSION, OPTIONS, STEPS)
"""What every result the engine commits records (the default of :meth:`Provenance.from_attrs`'s ``required``)."""
JOURNAL_FIELDS = (ANALYZER, PARTIAL)
"""What the journal of an interrupted per-run result records (``analyses/<name>.partial``)."""

_TEXTS = (VERSION, CREATED, CKPT_VERSION, DATA_SHA256, MODEL_SHA256)
"""Fields that are strings when recorded (absent or null when not)."""
_JSON_DEPTH = 32
"""Nesting a record's values may have: options and identities are shallow; deeper is not a record ckpt wrote."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain JSON (objects with string keys, lists, strings, finite numbers, null), or None."""
    if depth > _JSON_DEPTH:
        return f"nested deeper than {_JSON_DEPTH} levels"
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, list | tuple):
        return next((p for p in (_json_problem(v, depth + 1) for v in value) if p is not None), None)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"key {_shown(key)} is not a string"
            problem = _json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    return f"{_shown(value)} ({type(value).__name__}) is not a JSON value"


def provenance_problem(record: Any, required: Iterable[str] = ()) -> str | None:
    """What in a result's provenance record (``attrs["ckpt"]``) is wrong, or None when nothing is.

    A field that is absent or null is unrecorded, unless it is ``required``.

    Parameters
    ----------
    record
        The decoded ``attrs["ckpt"]`` of a result.
    required
        Fields that must be recorded (not absent, not null).

    Returns
    -------
    str or None
        ``"<field> is <value>, expected <what>"`` for the first field of the wrong type.
    """
    if not isinstance(record, Mapping):
        return f"the record is {_shown(record)}, expected an object"
    missing = [key for key in required if record.get(key) is None]
    if missing:
        return f"{missing[0]} is not recorded (the record holds {', '.join(map(str, record)) or 'nothing'})"
    analyzer = record.get(ANALYZER)
    if analyzer is not None and not (isinstance(analyzer, str) and analyzer):
        return f"analyzer is {_shown(analyzer)}, expected a name (a non-empty string)"
    for key in _TEXTS:
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is {_shown(record[key])}, expected a string"
    options = record.get(OPTIONS)
    if options is not None and not (
        isinstance(options, Mapping) and all(isinstance(k, str) and k.isidentifier() for k in options)
    ):
        return f"options is {_shown(options)}, expected an object of option names (identifiers) and values"
    steps = record.get(STEPS)
    if steps is not None and not (
        isinstance(steps, list | tuple) and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
    ):
        return f"steps is {_shown(steps)}, expected a list of steps (integers)"
    requires = record.get(REQUIRES)
    if requires is not None and not (
        isinstance(requires, Mapping)
        and all(isinstance(key, str) and isinstance(identity, Mapping) for key, identity in requires.items())
    ):
        return f"requires is {_shown(requires)}, expected an object {{result name: its identity (an object)}}"
    partial = record.get(PARTIAL)
    if partial is not None and not (
        isinstance(partial, Mapping)
        and isinstance(partial.get("of"), str)
        and isinstance(partial.get("identity"), str)
        and isinstance(partial.get("keys"), list | tuple)
    ):
        return f"partial is {_shown(partial)}, expected an object {{of: name, identity: digest, keys: a list}}"
    for key, value in record.items():
        if not isinstance(key, str):
            return f"the key {_shown(key)} is not a string"
        problem = _json_problem(value)
        if problem is not None:
            return f"{key} is not plain JSON: {problem}"
    return None


def invalid_message(problem: str, name: str | None = None, where: str | None = None) -> str:
    """The message of a :class:`CorruptRecordError` for a provenance record with ``problem``."""
    if name is None or where is None:
        return (
            f"the provenance (attrs['ckpt']) of a stored result is invalid: {problem}; the store was damaged or "
            "edited by hand: remove the result (ckpt rm STORE NAME) and recompute it"
        )
    return (
        f"the provenance (attrs['ckpt']) of analysis {name!r} of {where} is invalid: {problem}; the store "
        f"was damaged or edited by hand: remove the result (ckpt rm {where} {name}) and recompute it"
    )


def _frozen(value: Any) -> Any:
    """A read-only copy of a JSON value (objects as mapping proxies, lists as tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


def _thawed(value: Any) -> Any:
    """A JSON value as ``json`` writes it (dicts and lists), copied."""
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(item) for item in value]
    return value


def utc_now() -> str:
    """Now, as the ``created`` of a provenance record: ISO 8601 in UTC to the second (``...Z``)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Provenance:
    """The provenance record of one stored result (``attrs["ckpt"]`` of ``analyses/<name>``).

    Immutable: objects are read-only mappings, lists tuples; :meth:`to_attrs` gives plain JSON.
    A field the record does not hold is None (an empty object or list is recorded as such).
    Build one from what is stored with :meth:`from_attrs`, change it with :meth:`with_steps`
    or :func:`dataclasses.replace`.

    Attributes
    ----------
    analyzer
        Name of the analyzer that computed the result.
    version
        That analyzer's version (compared as text).
    options
        The analyzer options it was computed with (JSON values).
    data_sha256
        The hash of the data splits it read (None when it read none, or before it was recorded).
    model_sha256
        The hash of the store's model spec and objective (None in stores of ckpt 0.1).
    requires
        ``{result name: identity}`` of each required result it was computed from.
    steps
        The steps (first steps of pairs, for pair analyzers) it covers.
    created
        When it (its last block) was written, ISO 8601 UTC.
    ckpt_version
        The version of the ckpt that wrote it.
    partial
        For a journal (``<name>.partial``): ``{"of": name, "identity": digest, "keys": [...]}``.
    extra
        Fields of the record ckpt does not read, kept as they are (plain JSON).
    """

    analyzer: str | None = None
    version: str | None = None
    options: Mapping[str, Any] | None = None
    data_sha256: str | None = None
    model_sha256: str | None = None
    requires: Mapping[str, Mapping[str, Any]] | None = None
    steps: tuple[int, ...] | None = None
    created: str | None = None
    ckpt_version: str | None = None
    partial: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        problem = provenance_problem(self._fields())
        if problem is None:
            problem = next(
                (f"{key} is a field of the record itself, not an extra one" for key in self.extra if key in KNOWN),
                None,
            )
        if problem is not None:
            raise CorruptRecordError(invalid_message(problem))
        for name in (OPTIONS, REQUIRES, PARTIAL, "extra"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _frozen(value))
        if self.steps is not None:
            object.__setattr__(self, STEPS, tuple(int(step) for step in self.steps))

    def _fields(self) -> dict[str, Any]:
        known = {name: getattr(self, name) for name in KNOWN}
        return {**dict(self.extra), **{key: value for key, value in known.items() if value is not None}}

    @classmethod
    def from_attrs(
        cls,
        attrs: Any,
        *,
        required: Iterable[str] = RESULT_FIELDS,
        name: str | None = None,
        where: str | None = None,
    ) -> Provenance:
        """The record read from a store, checked.

        Parameters
        ----------
        attrs
            The decoded ``attrs["ckpt"]`` of a result (anything: a store is data).
        required
            Fields that must be recorded: by default what every result the engine commits
            records (:data:`RESULT_FIELDS`); :data:`JOURNAL_FIELDS` for a journal; ``()`` to
            read whatever is recorded.
        name, where
            The result and its store, named in the error.

        Raises
        ------
        CorruptRecordError
            Naming the first field that is missing, of the wrong type or not plain JSON.
        """
        problem = provenance_problem(attrs, required)
        if problem is not None:
            raise CorruptRecordError(invalid_message(problem, name, where))
        record = dict(attrs)
        known = {key: record.pop(key) for key in KNOWN if key in record}
        known = {key: value for key, value in known.items() if value is not None}
        return cls(**known, extra=record)

    def to_attrs(self) -> dict[str, Any]:
        """The record as stored in ``attrs["ckpt"]``: plain JSON, unrecorded fields left out."""
        return _thawed(self._fields())

    def identity(self) -> dict[str, Any]:
        """What decides whether the result is reused (:data:`IDENTITY`, as plain JSON; unrecorded fields None)."""
        return {key: _thawed(getattr(self, key)) for key in IDENTITY}

    def with_steps(
        self, steps: Iterable[int], *, created: str | None = None, ckpt_version: str | None = None
    ) -> Provenance:
        """The record covering ``steps``, written now (or at ``created``) by this ckpt (or ``ckpt_version``)."""
        if ckpt_version is None:
            import ckpt.store as ckptstore

            ckpt_version = str(ckptstore.__version__)
        return dataclasses.replace(
            self, steps=tuple(int(s) for s in steps), created=created or utc_now(), ckpt_version=ckpt_version
        )

    @property
    def computed_by(self) -> str | None:
        """``"ckpt VERSION"`` of the ckpt that computed the result (None when unrecorded)."""
        return None if self.ckpt_version is None else f"ckpt {self.ckpt_version}"


__all__ = [
    "ANALYZER",
    "CKPT_VERSION",
    "CREATED",
    "DATA_SHA256",
    "IDENTITY",
    "JOURNAL_FIELDS",
    "KNOWN",
    "MODEL_SHA256",
    "OPTIONS",
    "PARTIAL",
    "REQUIRES",
    "RESULT_FIELDS",
    "SAME_MEASURE",
    "STEPS",
    "VERSION",
    "Provenance",
    "invalid_message",
    "provenance_problem",
    "utc_now",
]

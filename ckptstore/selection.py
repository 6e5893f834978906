"""What an import takes of a run: which steps (``--steps``) and which tensors (``--tensors``).

One parser of step items serves every import: a step (``1000``), an inclusive step range
(``1000-5000``, ``100000-``, ``-512``). The Hub import's ``--revisions`` reads the same items
beside branch names and globs (:func:`ckpt.store.hub.select`); ``--steps`` reads only them, for a
local folder and a Hub repository alike.

A tensor selection keeps the tensors whose names, after transformers' key conversion (the names
of the built model), match one of its ``fnmatch`` globs. The store records it in its attrs under
:data:`SELECTION_ATTR`, with the count, elements and bytes of the whole checkpoint it was taken
from: ``ckpt info`` shows it, ``ckpt verify`` compares only the stored subset with the model, and
an analyzer that needs a tensor left out names it (:func:`missing_message`).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt.errors import CorruptRecordError, ImportFormatError

__all__ = [
    "SELECTION_ATTR",
    "TensorSelection",
    "check_same_selection",
    "missing_message",
    "parse_globs",
    "parse_steps",
    "select_steps",
    "step_bounds",
]

SELECTION_ATTR = "tensor_selection"
"""Key of a store's attrs: ``{"globs": [...], "of": M, "elements": E, "bytes": B}`` of a selective import."""
_SHOWN = 5
_RANGE = re.compile(r"(\d+)?-(\d+)?")


def step_bounds(item: str) -> tuple[int, int | None] | None:
    """The inclusive ``(low, high)`` steps of one item (``high`` None: no upper bound); None when not a step item.

    >>> step_bounds("1000"), step_bounds("1000-5000"), step_bounds("100000-"), step_bounds("step1000")
    ((1000, 1000), (1000, 5000), (100000, None), None)
    """
    if item.isdecimal():
        return int(item), int(item)
    bounds = _RANGE.fullmatch(item)
    if bounds is None or not any(bounds.groups()):
        return None
    return int(bounds[1] or 0), None if bounds[2] is None else int(bounds[2])


def parse_steps(spec: str, option: str = "--steps") -> tuple[tuple[str, int, int | None], ...]:
    """The items of a comma-separated step selection: ``(text, low, high)`` each.

    Raises
    ------
    ImportFormatError
        An item is no step or step range, a range runs backwards, or nothing is named.
    """
    items = []
    for text in (part.strip() for part in spec.split(",")):
        if not text:
            continue
        bounds = step_bounds(text)
        if bounds is None:
            msg = f"{option}: {text!r} is not a step or a step range (N, A-B, A-, -B)"
            raise ImportFormatError(f"{msg}; select Hub branches by name with --revisions")
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise ImportFormatError(f"{option}: the range {text!r} runs backwards; write {bounds[1]}-{bounds[0]}")
        items.append((text, *bounds))
    if not items:
        raise ImportFormatError(f"{option}: {spec!r} names no step; pass steps or ranges such as 0,1000-5000,100000-")
    return tuple(items)


def _span(steps: Sequence[int]) -> str:
    return f"{steps[0]} .. {steps[-1]}, {len(steps)} in all" if steps else "none"


def select_steps(spec: str, steps: Iterable[int], what: str, option: str = "--steps") -> list[int]:
    """The steps of ``steps`` that ``spec`` (:func:`parse_steps`) selects, in order.

    Parameters
    ----------
    spec
        Comma-separated steps and inclusive step ranges: ``0,1000-5000,100000-``.
    steps
        The steps there are.
    what
        What a step is, for the error: ``"checkpoint of runs/"``, ``"revision of hf://org/x"``.

    Raises
    ------
    ImportFormatError
        An item is malformed, or matches none of ``steps``: never an empty or silently narrower import.
    """
    available = sorted(set(steps))
    chosen: set[int] = set()
    for text, low, high in parse_steps(spec, option):
        found = [s for s in available if low <= s and (high is None or s <= high)]
        if not found:
            raise ImportFormatError(f"{option}: {text!r} matches no {what}; its steps: {_span(available)}")
        chosen.update(found)
    return sorted(chosen)


def parse_globs(values: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """The globs of ``--tensors`` options (each repeatable and comma-separated), deduplicated; None when none.

    >>> parse_globs(["gpt_neox.embed_in.*", "*embed_out*,gpt_neox.embed_in.*"])
    ('gpt_neox.embed_in.*', '*embed_out*')
    """
    if values is None:
        return None
    parts = [values] if isinstance(values, str) else list(values)
    globs = [g.strip() for part in parts for g in part.split(",") if g.strip()]
    if parts and not globs:
        raise ImportFormatError("--tensors names no glob; pass one such as 'gpt_neox.embed_in.*'")
    return tuple(dict.fromkeys(globs)) or None


def _quoted(globs: Sequence[str]) -> str:
    return " ".join(f"--tensors '{g}'" for g in globs)


@dataclass(frozen=True)
class TensorSelection:
    """The tensors an import keeps: those whose names match one of ``globs``; the whole checkpoint's size."""

    globs: tuple[str, ...]
    of: int | None = None
    """Tensors of the whole checkpoint (after key conversion), as the first one imported had them."""
    elements: int | None = None
    """Their elements: a selective store's model may register this many parameters (:mod:`ckpt.store.model_build`)."""
    nbytes: int | None = None
    """Their bytes."""

    @property
    def option(self) -> str:
        """The options that made it: ``--tensors 'gpt_neox.embed_in.*'``."""
        return _quoted(self.globs)

    def apply(self, tensors: Mapping[str, Any], where: str) -> tuple[dict[str, Any], TensorSelection]:
        """The tensors the globs select, and this selection with the whole checkpoint's size.

        Raises
        ------
        ImportFormatError
            A glob matches no tensor: it names the glob and a few of the names there are.
        """
        names = sorted(tensors)
        for glob in self.globs:
            if not any(fnmatch.fnmatchcase(name, glob) for name in names):
                shown = ", ".join(names[:_SHOWN]) + (
                    f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
                )
                msg = f"--tensors: {glob!r} matches no tensor of {where}; its tensors: {shown or 'none'}"
                raise ImportFormatError(f"{msg} (the names after transformers' key conversion, as the model has them)")
        kept = {n: t for n, t in tensors.items() if any(fnmatch.fnmatchcase(n, g) for g in self.globs)}
        measured = TensorSelection(
            self.globs,
            len(tensors),
            sum(math.prod(tuple(t.shape)) for t in tensors.values()),
            sum(int(t.nbytes) for t in tensors.values()),
        )
        return kept, measured

    def to_json(self) -> dict[str, Any]:
        """The record a store keeps under :data:`SELECTION_ATTR`."""
        return {"globs": list(self.globs), "of": self.of, "elements": self.elements, "bytes": self.nbytes}

    @classmethod
    def of_store(cls, attrs: Mapping[str, Any], where: str) -> TensorSelection | None:
        """The selection a store's attrs record (None: it holds every tensor), validated: it is data.

        Raises
        ------
        CorruptRecordError
            The record is not what an import writes.
        """
        record = attrs.get(SELECTION_ATTR)
        if record is None:
            return None
        globs = record.get("globs") if isinstance(record, dict) else None
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) and g for g in globs):
            msg = f"{where} records a tensor selection ({SELECTION_ATTR}) without a list of globs: {record!r:.200}"
            raise CorruptRecordError(msg)
        counts = [record.get(key) for key in ("of", "elements", "bytes")]
        if not all(c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 0) for c in counts):
            raise CorruptRecordError(f"{where} records a tensor selection whose sizes are not counts: {record!r:.200}")
        return cls(tuple(globs), *counts)


def check_same_selection(held: TensorSelection | None, asked: tuple[str, ...] | None, dest: str) -> None:
    """An import into an existing store must ask for the tensors it holds: a store never mixes selections.

    Raises
    ------
    ImportFormatError
        ``asked`` (None: every tensor) is not the selection ``held`` records.
    """
    same = (held is None and asked is None) or (
        held is not None and asked is not None and sorted(held.globs) == sorted(asked)
    )
    if same:
        return
    holds = (
        f"was imported with {held.option}" if held is not None else "holds every tensor (imported without --tensors)"
    )
    wants = _quoted(asked) if asked is not None else "every tensor"
    again = held.option if held is not None else "no --tensors"
    msg = f"{dest} {holds}, and this import asks for {wants}: a store holds one selection"
    raise ImportFormatError(f"{msg}; rerun with {again}, or pass --overwrite to re-import with the new one")


def missing_message(count: int, shown: str, where: str, selection: TensorSelection | None) -> str:
    """What an analyzer that needs ``count`` parameters a store lacks (``shown``: a few, named) says.

    For a store imported with ``--tensors``, that it was, and what to do; otherwise how the
    checkpoints come to lack a parameter.
    """
    base = f"the model of {where} has {count} parameter(s) its checkpoints do not hold: {shown}"
    if selection is None:
        return (
            f"{base}; write checkpoints with every parameter (the model's state_dict), or record the model "
            "these checkpoints belong to (ckpt set-model)"
        )
    return (
        f"{base}; the store was imported with {selection.option}, and this analysis needs the whole model: "
        "re-import without --tensors, or with globs covering these tensors"
    )

"""Lineage: the run a store's training started from (``attrs["ckpt"]["parent"]``, docs/store-format.md §2.1).

A run initialised from another run's checkpoint (``ckpt train ... --init-from PARENT@STEP``) records
where its first weights came from: the parent store's path or URL, the step, and the digest of that
checkpoint (:meth:`ckpt.store.Store.checkpoint_digest`). The record is data like the rest of the
store: :func:`parent_problem` checks it before anything uses it, and :func:`parent_status` opens the
parent again to say whether it is still there and still holds the same weights — a parent that was
changed after the child was made is reported, never silently taken as the child's origin.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ckpt.errors import CkptError

PATH_MAX_CHARS = 4096
"""Longest parent path or URL accepted in a record (PATH_MAX on Linux)."""

_DIGEST = re.compile(r"[0-9a-f]{64}")
_STEP_MAX = 2**63 - 1


@dataclass(frozen=True)
class Parent:
    """Where a run's initial weights came from.

    Attributes
    ----------
    path
        The parent store: an absolute local path or an fsspec URL.
    step
        The parent's checkpoint the weights were copied from.
    digest
        :meth:`ckpt.store.Store.checkpoint_digest` of that checkpoint when the child was made (None
        when the parent is a format-v1 store, which records no digests).
    grown
        Tensors that were larger in the child than in the parent and were extended by the task's
        grow rule (the rest were copied unchanged).
    """

    path: str
    step: int
    digest: str | None
    grown: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The record written under ``attrs["ckpt"]["parent"]``."""
        return {"path": self.path, "step": self.step, "digest": self.digest, "grown": list(self.grown)}

    def __str__(self) -> str:
        return f"{self.path}@{self.step}"


def parent_problem(value: Any) -> tuple[str, Any, str] | None:
    """``(field, found, expected)`` of the first thing wrong with a parent record, None when it is valid.

    :func:`ckpt.store.record.validate_meta` applies it to every record it reads (a store is data)
    and the writer to what it records.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        return "parent", value, 'an object {"path": ..., "step": ..., "digest": ...} or null'
    path = value.get("path")
    if not isinstance(path, str) or not path or len(path) > PATH_MAX_CHARS or not path.isprintable():
        return "parent.path", path, f"a store path or URL (a printable string of 1..{PATH_MAX_CHARS} characters)"
    step = value.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= _STEP_MAX:
        return "parent.step", step, "a non-negative integer"
    digest = value.get("digest")
    if digest is not None and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
        return "parent.digest", digest, "a checkpoint digest (64 lowercase hex digits) or null"
    grown = value.get("grown", [])
    if not isinstance(grown, list) or not all(isinstance(name, str) and name.isprintable() for name in grown):
        return "parent.grown", grown, "a list of tensor names"
    return None


def read_parent(value: Any) -> Parent | None:
    """The :class:`Parent` of a record that :func:`parent_problem` accepted (None when it records none)."""
    if value is None:
        return None
    return Parent(value["path"], value["step"], value.get("digest"), tuple(value.get("grown", [])))


def parent_location(where: str | os.PathLike[str]) -> str:
    """How a child records its parent: an absolute path for a local store (a URL as given).

    Absolute, so that ``ckpt info`` finds the parent from any working directory.
    """
    from ckpt.store._zarr import local_path

    local = local_path(where)
    return str(where) if local is None else os.path.abspath(local)


@dataclass(frozen=True)
class ParentStatus:
    """What the parent of a store holds now, against what the child recorded.

    Attributes
    ----------
    state
        ``"matches"`` (the checkpoint's digest is the recorded one), ``"changed"`` (it differs),
        ``"step-missing"`` (the parent no longer has that step), ``"unreachable"`` (no store
        can be opened there) or ``"unverifiable"`` (no digest to compare: a format-v1 parent).
    detail
        One sentence for ``ckpt info``.
    """

    state: str
    detail: str

    @property
    def ok(self) -> bool:
        """Whether the parent is known to hold the weights the child started from."""
        return self.state == "matches"


def parent_status(parent: Parent, storage_options: dict[str, Any] | None = None) -> ParentStatus:
    """Open ``parent``'s store and compare its checkpoint with what the child recorded.

    Never raises for a parent that is gone or damaged: that is what the status reports.
    """
    from ckpt.store.reader import Store

    try:
        store = Store(parent.path, storage_options=storage_options)
    except (CkptError, OSError) as exc:  # gone, not a store, damaged, or not readable by this user
        return ParentStatus("unreachable", f"parent not reachable: {exc}")
    if parent.step not in store:
        steps = store.steps.tolist()
        held = f"{len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}" if steps else "no checkpoints"
        return ParentStatus("step-missing", f"the parent no longer has step {parent.step} (it has {held})")
    now = store.checkpoint_digest(parent.step)
    if parent.digest is None or now is None:
        return ParentStatus(
            "unverifiable",
            "reachable, but its checkpoint cannot be compared (no digest: a format-v1 store; `ckpt upgrade` adds them)",
        )
    if now != parent.digest:
        return ParentStatus(
            "changed",
            f"the parent's checkpoint digest no longer matches (recorded {parent.digest[:12]}, now {now[:12]}): "
            "its weights at that step were changed after this run was made from them",
        )
    return ParentStatus("matches", "reachable, checkpoint digest matches")


__all__ = [
    "PATH_MAX_CHARS",
    "Parent",
    "ParentStatus",
    "parent_location",
    "parent_problem",
    "parent_status",
    "read_parent",
]

"""A trajectory checked, not trusted: duplicated checkpoints and checkpoints off their neighbours' path.

Public checkpoint suites have served wrong checkpoints: step branches holding the final
model's weights, or one of its shards, and duplicate payloads across branches. Two checks:

:func:`duplicate_steps`
    From the commit record alone (no tensor is read): the digest of every tensor at every
    step (docs/store-format.md §4.5). Steps whose every digest is equal are *identical*.
    A step some of whose tensors hold another step's values is a *partial duplicate*, by
    this rule: a tensor's value that leaves and comes back is a copy. A training update never
    brings a tensor back to exactly the bits it had before it changed, so in a real run each
    value of a tensor occupies one stretch of consecutive steps; a value held at several
    stretches was copied from its longest one (on a tie, from the latest: suites have served
    later steps' files under earlier steps) to the others. A tensor that does not change (a
    frozen embedding, a buffer) or stops changing for a while (a frozen phase) occupies one
    stretch and is never counted, even with one foreign checkpoint in the middle of it. Tensors
    of one element are left out (a clamped scalar comes back to its bound), and ``M`` in "N of M
    tensors" counts the tensors that change along the run. A shard copied from a *neighbouring*
    step cannot be told from a tensor frozen for one interval, and is not named.
:func:`trajectory_distances`
    Reads every checkpoint once, tensor by tensor, holding at most two checkpoints and one
    tensor (float64 accumulation in blocks): the L2 distance of each checkpoint to the
    previous one, over the floating-point tensors, and the cosine between consecutive
    updates. An interior checkpoint ``x`` with neighbours ``p`` and ``n`` has the *ratio*
    ``min(d(p, x), d(x, n)) / d(p, n)``; it is *possibly mislabeled* when its ratio exceeds
    ``k`` (default :data:`OUTLIER_RATIO` = 2: both its distances exceed ``k·d(p, n)``) while
    neither neighbour's ratio exceeds 1: it jumps off the path its neighbours draw, and the
    path does not zigzag there. The test is local, so it holds while distances shrink as the
    learning rate decays and for irregular spacing (Pythia's log-spaced early steps).
    A checkpoint in its place on a path whose updates have equal lengths and cosine ``c`` has
    ratio ``1 / sqrt(2 (1 + c))``: 0.5 on a straight path, 0.71 for orthogonal updates, above
    2 only when the path comes back on itself (``c < -0.875``). That happens where a run
    zigzags (full-batch SGD at the edge of stability, checkpointed every step, reaches ratios
    of 3.5), but then the neighbours' ratios exceed 1 too; a checkpoint from elsewhere in the
    run leaves its neighbours' ratios small (a far point makes their own neighbours far apart).
    The first and last checkpoints have one neighbour and are not tested; a checkpoint whose
    neighbours are identical is named by the duplicate check instead; several consecutive
    checkpoints from elsewhere show as two large distances at their ends, not as flags.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ckpt.errors import CorruptChunkError
from ckpt.store.format import DIGESTS

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.store.reader import Store

OUTLIER_RATIO = 2.0
"""Default ``k`` of the possibly-mislabeled test (module docstring)."""

NEIGHBOUR_RATIO = 1.0
"""A checkpoint is flagged only when neither neighbour's ratio exceeds this: the path does not zigzag there."""

_BLOCK = 1 << 18
"""Elements converted to float64 at a time: bounds the accumulation's memory (2 MiB an array)."""

_SHOWN = 8
"""Groups, partial duplicates or steps listed in one warning before "and N more"."""


@dataclass(frozen=True)
class PartialDuplicate:
    """A checkpoint some of whose changing tensors hold another step's values (module docstring)."""

    step: int
    """The checkpoint."""
    source: int
    """The step whose values it holds: the one it shares most tensors with (the final one on a tie).

    Which of two steps holding a value once each is the copy the digests do not say: the earlier
    one is named (see :func:`_copies`).
    """
    tensors: tuple[str, ...]
    """The tensors of ``step`` holding ``source``'s values."""
    changing: int
    """Tensors that change along the run (more than one element, more than one digest)."""

    def describe(self, final: int | None = None) -> str:
        """``step 2: 1 of 4 tensors that change along the run identical to step 6's, other values between (...)``.

        With ``final`` the store's last step: ``step 6: 3 of 4 ... identical to the final checkpoint (step 9)``.
        """
        names = ", ".join(repr(n) for n in self.tensors[:3]) + (", ..." if len(self.tensors) > 3 else "")
        counted = f"{len(self.tensors)} of {self.changing} tensors that change along the run"
        if self.source == final:
            return f"step {self.step}: {counted} identical to the final checkpoint (step {final}) ({names})"
        return f"step {self.step}: {counted} identical to step {self.source}'s, other values between ({names})"


@dataclass(frozen=True)
class Duplicates:
    """What :func:`duplicate_steps` found: groups of identical checkpoints and partial duplicates."""

    groups: tuple[tuple[int, ...], ...] = ()
    """Steps with identical digests for every tensor, each group increasing, groups by first step."""
    final: int | None = None
    """The store's last step (None without checkpoints)."""
    partial: tuple[PartialDuplicate, ...] = ()
    """Checkpoints holding another step's values in some tensors, by step."""
    checked: bool = True
    """False for a store without digests (format v1): nothing could be checked."""

    @property
    def steps(self) -> list[int]:
        """Every step named: in a group of identical checkpoints or a partial duplicate."""
        return sorted({s for g in self.groups for s in g} | {p.step for p in self.partial})

    def message(self, where: str) -> str | None:
        """The one-line warning naming every duplicate, or None when there is none."""
        if not self.groups and not self.partial:
            return None
        parts = [self._describe_group(g) for g in self.groups[:_SHOWN]]
        if len(self.groups) > _SHOWN:
            parts.append(f"and {len(self.groups) - _SHOWN} more groups")
        parts += [p.describe(self.final) for p in self.partial[:_SHOWN]]
        if len(self.partial) > _SHOWN:
            parts.append(f"and {len(self.partial) - _SHOWN} more partial duplicates")
        return (
            f"{where}: checkpoints duplicate other steps' weights (by the digests of the commit record): "
            + "; ".join(parts)
            + "; a suite that serves one step's files under another step looks like this: compare those "
            "checkpoints with their source (docs/existing-runs.md, 'Checking a trajectory')"
        )

    def _describe_group(self, group: tuple[int, ...]) -> str:
        if self.final in group:
            others = [s for s in group if s != self.final]
            which = f"step {others[0]} is" if len(others) == 1 else f"{len(others)} steps ({_steps(others)}) are"
            return f"{which} identical to the final checkpoint (step {self.final})"
        if len(group) == 2:
            return f"steps {group[0]} and {group[1]} are identical"
        return f"{len(group)} steps ({_steps(list(group))}) are identical"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form: ``checked``, ``groups``, ``identical_to_final``, ``partial``."""
        final_group = next((g for g in self.groups if self.final in g), ())
        return {
            "checked": self.checked,
            "groups": [list(g) for g in self.groups],
            "identical_to_final": [s for s in final_group if s != self.final],
            "partial": [
                {"step": p.step, "source": p.source, "tensors": list(p.tensors), "changing": p.changing}
                for p in self.partial
            ],
        }


def _steps(steps: Sequence[int]) -> str:
    if len(steps) <= _SHOWN:
        return ", ".join(str(s) for s in steps)
    return ", ".join(str(s) for s in steps[: _SHOWN - 1]) + f", ... {steps[-1]}"


def duplicate_steps(store: Store) -> Duplicates:
    """Checkpoints of ``store`` that duplicate another step's, wholly or in part, from the record alone.

    Parameters
    ----------
    store
        An open :class:`ckpt.store.Store`. No tensor is read: the digests of the commit
        record (``metadata["digests"]``, in the order of :attr:`~ckpt.store.Store.tensor_names`).

    Returns
    -------
    Duplicates
        Groups of identical steps, the partial duplicates (module docstring for the rule), and
        ``checked=False`` for a store without digests.
    """
    recorded = store.metadata.get(DIGESTS)
    steps = [int(s) for s in store.steps]
    if recorded is None:
        return Duplicates(final=steps[-1] if steps else None, checked=False)
    names = store.tensor_names
    rows = [tuple(recorded[str(s)]) for s in steps]
    by_row: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for step, row in zip(steps, rows, strict=True):
        by_row[row].append(step)
    groups = tuple(sorted(tuple(g) for g in by_row.values() if len(g) > 1))
    group_of = {s: i for i, g in enumerate(groups) for s in g}
    if any(len(row) != len(names) for row in rows):  # a record the reader refuses anyway: no columns
        return Duplicates(groups, steps[-1], ())
    sizes = {name: int(np.prod(info.shape, dtype=np.int64)) for name, info in store.schema.items()}
    columns = [(name, [row[t] for row in rows]) for t, name in enumerate(names) if sizes[name] > 1]
    changing = [(name, column) for name, column in columns if len(set(column)) > 1]
    taken: dict[int, Counter[int]] = defaultdict(Counter)
    which: dict[tuple[int, int], list[str]] = defaultdict(list)
    for name, column in changing:
        for i, j in _copies(column):
            x, s = steps[i], steps[j]
            if x in group_of and group_of.get(s) == group_of[x]:
                continue
            taken[x][s] += 1
            which[(x, s)].append(name)
    partial = []
    for x in sorted(taken):
        if x in group_of:  # identical to another step: named with its group
            continue
        source = max(taken[x], key=lambda s: (taken[x][s], s == steps[-1], -abs(s - x), -s))
        named = source
        if source in group_of and steps[-1] in groups[group_of[source]]:
            named = steps[-1]  # a copy of the final checkpoint's values: say so, not which copy of it
        partial.append(PartialDuplicate(x, named, tuple(which[(x, source)]), len(changing)))
    return Duplicates(groups, steps[-1] if steps else None, tuple(partial))


def _copies(column: list[str]) -> list[tuple[int, int]]:
    """(i, j): the value at position i is a copy of the one at j, its nearest position in the value's main run.

    A run is a stretch of consecutive positions holding one value; a value's main run is its
    longest (on a tie, the latest: suites have served later steps' files under earlier ones).
    Two runs of at least two positions each with one position between them are one run: a
    frozen tensor with one foreign checkpoint in the middle is not copied on either side of it.
    """
    runs: dict[str, list[list[int]]] = defaultdict(list)
    for i, value in enumerate(column):
        spans = runs[value]
        if spans and spans[-1][-1] == i - 1:
            spans[-1].append(i)
        elif spans and spans[-1][-1] == i - 2 and len(spans[-1]) >= 2 and column[i + 1 : i + 2] == [value]:
            spans[-1].append(i)  # across one foreign position: see above
        else:
            spans.append([i])
    pairs = []
    for spans in runs.values():
        if len(spans) < 2:
            continue
        main = max(spans, key=lambda r: (len(r), r[0]))
        for span in spans:
            if span is not main:
                pairs += [(i, _nearest(main, i)) for i in span]
    return pairs


# -- distances along the path -------------------------------------------------------------


def _nearest(span: list[int], i: int) -> int:
    """The position of ``span`` nearest ``i`` (the first of two as near)."""
    return min(span, key=lambda j: abs(j - i))


def is_floating(dtype: str) -> bool:
    """Whether a stored tensor's logical dtype is a real floating-point one (the ones distances use)."""
    return dtype.startswith(("float", "bfloat"))


@dataclass
class Trajectory:
    """Per-step distances along a run, and the checkpoints off their neighbours' path."""

    steps: np.ndarray
    """The committed steps (int64)."""
    distance: np.ndarray
    """L2 distance of each checkpoint to the previous one (NaN for the first, or where unreadable)."""
    cosine: np.ndarray
    """Cosine between the update into each checkpoint and the update out of it (NaN at the ends)."""
    span: np.ndarray
    """L2 distance between each checkpoint's two neighbours (NaN at the ends)."""
    tensors: list[str]
    """The floating-point tensors the distances are over."""
    k: float = OUTLIER_RATIO
    """The ratio above which a checkpoint is possibly mislabeled."""

    @property
    def ratio(self) -> np.ndarray:
        """min(d(prev, x), d(x, next)) / d(prev, next) at each interior step (NaN at the ends, or when 0/0)."""
        out = np.full(len(self.steps), np.nan)
        if len(self.steps) < 3:
            return out
        near = np.minimum(self.distance[1:-1], self.distance[2:])
        with np.errstate(divide="ignore", invalid="ignore"):
            out[1:-1] = np.where(self.span[1:-1] > 0, near / self.span[1:-1], np.nan)
        return out

    @property
    def mislabeled(self) -> list[int]:
        """Steps farther than ``k`` x their neighbours' distance from both, where the path does not zigzag."""
        ratio = self.ratio
        bends = np.nan_to_num(ratio, nan=0.0) > NEIGHBOUR_RATIO
        return [
            int(self.steps[i])
            for i in range(1, len(self.steps) - 1)
            if ratio[i] > self.k and not bends[i - 1] and not bends[i + 1]
        ]

    def message(self, where: str) -> str | None:
        """One warning line naming the possibly mislabeled checkpoints, or None."""
        flagged = self.mislabeled
        if not flagged:
            return None
        ratio = dict(zip(self.steps.tolist(), self.ratio, strict=True))
        shown = ", ".join(f"step {s} ({ratio[s]:.1f}x)" for s in flagged[:_SHOWN])
        more = f" and {len(flagged) - _SHOWN} more" if len(flagged) > _SHOWN else ""
        return (
            f"{where}: possibly mislabeled checkpoints: {shown}{more}: each is farther from both of its "
            f"neighbours than {self.k:g} x their distance to each other, so it jumps off the path they draw "
            "(a checkpoint of another step or run?); compare it with its source (docs/existing-runs.md, "
            "'Checking a trajectory')"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form: ``k``, ``tensors``, ``mislabeled`` and one row per step (null for NaN)."""

        def num(x: float) -> float | None:
            return float(x) if math.isfinite(x) else None

        ratio = self.ratio
        return {
            "k": self.k,
            "tensors": len(self.tensors),
            "mislabeled": self.mislabeled,
            "steps": [
                {
                    "step": int(s),
                    "distance": num(self.distance[i]),
                    "cosine": num(self.cosine[i]),
                    "neighbour_distance": num(self.span[i]),
                    "ratio": num(ratio[i]),
                }
                for i, s in enumerate(self.steps)
            ],
        }


@dataclass
class DistanceAccumulator:
    """Builds a :class:`Trajectory` from tensors fed step by step, holding two checkpoints at most.

    Feed every floating tensor of each step, steps in increasing order (``add``), or say a
    tensor could not be read (``lost``); ``ckpt verify --trajectory`` feeds what it reads
    anyway, so the distances cost no second read.
    """

    steps: np.ndarray
    tensors: list[str]
    k: float = OUTLIER_RATIO
    _squares: np.ndarray = field(init=False)
    _dots: np.ndarray = field(init=False)
    _bad: np.ndarray = field(init=False)
    _held: dict[str, list[tuple[int, np.ndarray | None]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.steps)
        self._squares, self._dots, self._bad = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
        self._held = {name: [] for name in self.tensors}

    def add(self, index: int, name: str, value: np.ndarray | None) -> None:
        """Tensor ``name`` of the step at position ``index`` (None: it could not be read)."""
        if name not in self._held:
            return
        held = self._held[name]
        if value is None:
            self._bad[index] = True
        elif held and held[-1][0] == index - 1 and held[-1][1] is not None:
            before = held[-2][1] if len(held) == 2 and held[-2][0] == index - 2 else None
            square, dot = _moves(before, held[-1][1], value)
            self._squares[index] += square
            if dot is not None:
                self._dots[index - 1] += dot
        held.append((index, None if value is None else np.asarray(value).reshape(-1)))
        del held[:-2]  # x_{i-1} and x_i: what the next step's update and turn need

    def lost(self, index: int, name: str) -> None:
        """Tensor ``name`` of the step at ``index`` is unreadable: its distances are unknown (NaN)."""
        self.add(index, name, None)

    def result(self) -> Trajectory:
        """The distances, cosines and neighbour distances (NaN wherever an unreadable step is involved)."""
        n = len(self.steps)
        bad = self._bad
        distance = np.sqrt(self._squares)
        distance[0:1] = np.nan
        distance[1:][bad[1:] | bad[:-1]] = np.nan
        cosine, span = np.full(n, np.nan), np.full(n, np.nan)
        if n >= 3:
            into, out = self._squares[1:-1], self._squares[2:]
            dots = self._dots[1:-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                cosine[1:-1] = np.where((into > 0) & (out > 0), dots / np.sqrt(into * out), np.nan)
            span[1:-1] = np.sqrt(np.maximum(into + out + 2 * dots, 0.0))
            broken = bad[:-2] | bad[1:-1] | bad[2:]
            cosine[1:-1][broken], span[1:-1][broken] = np.nan, np.nan
        return Trajectory(self.steps.copy(), distance, np.clip(cosine, -1.0, 1.0), span, list(self.tensors), self.k)


def _moves(before: np.ndarray | None, here: np.ndarray, after: np.ndarray) -> tuple[float, float | None]:
    """|after - here|² and <here - before, after - here>, accumulated in float64 blocks.

    Each subtraction casts its inputs to float64 block by block (numpy's buffered casting)
    into one of two preallocated buffers: no float64 copy of a whole tensor is made.
    """
    after = np.asarray(after).reshape(-1)
    square, dot = 0.0, 0.0
    size = min(here.size, _BLOCK)
    step, back = np.empty(size), np.empty(size)
    for start in range(0, here.size, _BLOCK):
        end = min(start + _BLOCK, here.size)
        v, u = step[: end - start], back[: end - start]
        np.subtract(after[start:end], here[start:end], out=v, dtype=np.float64)
        square += float(v @ v)
        if before is not None:
            np.subtract(here[start:end], before[start:end], out=u, dtype=np.float64)
            dot += float(u @ v)
    return square, dot if before is not None else None


def trajectory_distances(
    store: Store,
    *,
    k: float = OUTLIER_RATIO,
    progress: Callable[[int], None] | None = None,
    on_unreadable: Callable[[int, str, CorruptChunkError], None] | None = None,
) -> Trajectory:
    """Distances between consecutive checkpoints of ``store`` and the possibly mislabeled ones.

    Parameters
    ----------
    store
        An open :class:`ckpt.store.Store`; every floating-point tensor of every checkpoint is
        read once through :meth:`~ckpt.store.Store.tensors` (digests checked), one tensor at a
        time: at most two checkpoints and one tensor are held.
    k
        A checkpoint is possibly mislabeled when its distance to both neighbours exceeds
        ``k`` times theirs to each other (module docstring).
    progress
        Called with the position of each step read.
    on_unreadable
        Called as ``on_unreadable(step, name, error)`` for a tensor that does not match the
        commit record; its distances are then unknown (NaN) and the pass goes on. Without it,
        the error is raised.

    Returns
    -------
    Trajectory

    Raises
    ------
    CorruptChunkError
        A tensor does not match the commit record (as any read), without ``on_unreadable``.
    """
    names = [name for name, info in store.schema.items() if is_floating(info.dtype)]
    accumulator = DistanceAccumulator(store.steps, names, k)
    for index, step in enumerate(store.steps):
        for name in names:
            try:
                value = store.tensors(int(step), [name])[name]
            except CorruptChunkError as exc:
                if on_unreadable is None:
                    raise
                on_unreadable(int(step), name, exc)
                accumulator.lost(index, name)
                continue
            accumulator.add(index, name, value)
        if progress is not None:
            progress(index)
    return accumulator.result()


__all__ = [
    "NEIGHBOUR_RATIO",
    "OUTLIER_RATIO",
    "DistanceAccumulator",
    "Duplicates",
    "PartialDuplicate",
    "Trajectory",
    "duplicate_steps",
    "is_floating",
    "trajectory_distances",
]

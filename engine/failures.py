"""A run that fails mid-way: one :class:`~ckpt.errors.AnalysisError` saying what was kept and what to do.

Each block of steps is committed when done, so an allocation failure or a lost Dask cluster
keeps what was committed before; the messages say so, and which knob to turn or that rerunning
the same command computes only the rest.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckpt.engine.memory import format_size
from ckpt.errors import AnalysisError

if TYPE_CHECKING:  # pragma: no cover
    from ckpt.engine.settings import EngineSettings


def allocation_failure(exc: BaseException) -> str | None:
    """The first line of an allocator's failure (numpy, torch on CPU or CUDA), else None."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return text
    if isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower()):
        return text
    return None


def whole_sentences(text: str, limit: int) -> str:
    """The sentences ``text`` begins with, as many as fit in ``limit`` characters (at least the first, cut).

    Why: torch's CUDA message says which process holds the device in its fourth and fifth sentences
    ("Process 971 has 77.07 GiB memory in use. Including non-PyTorch memory, this process has ...");
    cut at 200 characters, a real message lost the second mid-word, and with it whether this run
    or another process held the memory.
    """
    sentences = re.split(r"(?<=\.) ", text.strip())
    kept = sentences[0][:limit]
    for sentence in sentences[1:]:
        if len(kept) + 1 + len(sentence) > limit:
            break
        kept += " " + sentence
    return kept.rstrip(".")


def _setting(settings: EngineSettings | Mapping[str, Any], name: str) -> Any:
    """A setting of ``settings`` (a mapping of them is also taken, as the engine passed them before)."""
    return settings.get(name) if isinstance(settings, Mapping) else getattr(settings, name)


@contextlib.contextmanager
def out_of_memory(settings: EngineSettings | Mapping[str, Any], name: str, done: Sequence[int]) -> Iterator[None]:
    """Turn an allocation failure mid-run into one AnalysisError that keeps what was committed."""
    try:
        yield
    except BaseException as exc:
        failure = allocation_failure(exc)
        if failure is None:
            raise
        budget = _setting(settings, "max_memory")
        told = f" (this run's budget: {format_size(budget)})" if budget else ""
        kept = f"the {len(done)} step(s) committed before are kept" if done else "nothing was committed"
        msg = (
            f"{name} ran out of memory: {whole_sentences(failure, 300)}; {kept}. "
            f"Give the run less with --max-memory{told} "
            "or smaller blocks (e.g. --batch-size, --samples), then rerun the same command"
        )
        raise AnalysisError(msg) from None


@contextlib.contextmanager
def cluster_lost(settings: EngineSettings | Mapping[str, Any], name: str, done: Sequence[int]) -> Iterator[None]:
    """Turn a dask cluster that went away mid-run (scheduler killed, workers dying) into one AnalysisError.

    What was committed before stays (each block is committed when done): the message
    says so, and that rerunning the command computes only the rest.
    """
    try:
        yield
    except BaseException as exc:
        kind = type(exc)
        lost = kind.__module__.startswith("distributed") and kind.__name__ in (
            "FutureCancelledError",
            "CancelledError",
            "CommClosedError",
            "KilledWorker",
        )
        if not lost:
            raise
        address = _setting(settings, "address")
        where = f"the dask scheduler at {address}" if address else "the dask cluster"
        cause = (
            "its workers kept dying (out of memory?)"
            if kind.__name__ == "KilledWorker"
            else "it went away mid-run (stopped or unreachable)"
        )
        kept = f"the {len(done)} step(s) committed before are kept" if done else "nothing was committed"
        msg = f"{name}: {where} failed: {cause} ({kind.__name__}); {kept}: rerun the same command to compute the rest"
        raise AnalysisError(msg) from None


__all__ = ["allocation_failure", "cluster_lost", "out_of_memory", "whole_sentences"]

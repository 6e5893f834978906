"""What the basis analyzers and the analyzers that read a basis share: schedule and options.

A *basis* result (``hessian-basis``, ``random-basis``, or any plugin analyzer
with the same layout) holds K orthonormal directions in parameter space; POLCA,
Fisher and their plugins read one by name (``--basis``). Its layout, with its one
writer, validator and readers, is :mod:`ckpt.numerics.basis_format`'s alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckpt.numerics.derivatives import DTYPES
from ckpt.plugins import AnalysisError, Option

HESSIAN_BASIS = "hessian-basis"
PASSED_TO_BASIS = ("every", "at_steps", "k", "seed", "hessian_split", "samples", "tol", "order", "vectors")
"""Options of the analyzers that read a basis which only choose the basis."""
RANDOM_BASIS = "random-basis"


def basis_steps(store: Any, every: int | None, at_steps: str | None) -> list[int]:
    """The checkpoints where a basis grows: ``--at-steps``, else multiples of ``--every``, else all.

    Raises
    ------
    AnalysisError
        When a step is not a checkpoint, ``every`` is not positive, or no checkpoint matches.
    """
    steps = [int(s) for s in store.steps]
    if not steps:
        msg = f"{store.path} has no checkpoints"
        raise AnalysisError(msg)
    if at_steps:
        try:
            chosen = sorted({int(part) for part in str(at_steps).replace(" ", "").split(",") if part})
        except ValueError:
            msg = f"--at-steps must be comma-separated integers, got {at_steps!r}"
            raise AnalysisError(msg) from None
        missing = [s for s in chosen if s not in store]
        if missing or not chosen:
            msg = (
                f"--at-steps {missing[0] if missing else at_steps!r} is not a checkpoint step of {store.path}; "
                f"its steps are {_steps_text(steps)}"
            )
            raise AnalysisError(msg)
        return chosen
    if every is not None:
        if every < 1:
            msg = f"--every must be a positive number of steps, got {every}"
            raise AnalysisError(msg)
        chosen = [s for s in steps if s % every == 0]
        if not chosen:
            msg = (
                f"no checkpoint step of {store.path} is a multiple of --every {every}; "
                f"its steps are {_steps_text(steps)}"
            )
            raise AnalysisError(msg)
        return chosen
    return steps


def check_basis_size(analyzer: str, steps: list[int], k: int, parameters: int) -> None:
    """Raise unless ``k`` vectors at each of ``steps`` fit the model: at most one per parameter.

    Checked before anything is sized by ``k``: a basis of more vectors than the model has
    parameters cannot be orthonormal, and asking for one would only allocate its layout.

    Raises
    ------
    AnalysisError
        When ``len(steps) * k`` exceeds ``parameters``.
    """
    total = len(steps) * k
    if total > parameters:
        msg = (
            f"{analyzer}: -k {k} at {len(steps)} basis checkpoint(s) asks for {total:,} vectors, more than the "
            f"{parameters:,} parameters of the model (a basis has at most one vector per parameter): lower -k, or "
            "take fewer basis checkpoints (--every, --at-steps)"
        )
        raise AnalysisError(msg)


def _steps_text(steps: list[int]) -> str:
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:4]))}, ..., {', '.join(map(str, steps[-2:]))} ({len(steps)} in all)"


def sample_examples(count: int, samples: int, seed: int) -> np.ndarray:
    """A seeded uniform subsample of ``samples`` of ``count`` examples (all when fewer), sorted."""
    if samples < 1:
        msg = f"--samples must be at least 1, got {samples}"
        raise AnalysisError(msg)
    if samples >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, samples, replace=False))


class ScheduleOptions:
    """Options of a basis grown at checkpoints (mixed into analyzer classes)."""

    every = Option(
        int, None, "Grow the basis at checkpoints whose step is a multiple of N (default: every one).", minimum=1
    )
    at_steps = Option(str, None, "Grow the basis at these steps only (comma-separated), e.g. 0,200,400.")
    k = Option(int, 1, "Vectors added at each basis checkpoint (the paper: 1).", minimum=1)
    seed = Option(int, 0, "Seed of the data subsample, the Lanczos start vectors and random bases.", minimum=0)


class HessianOptions(ScheduleOptions):
    """Options of the Hessian basis (shared with the analyzers that compute it on demand)."""

    hessian_split = Option(str, None, "Split the Hessian is taken over (default: train when stored, else --split).")
    samples = Option(int, 1250, "Examples subsampled for the Hessian (the paper: 1,250).", minimum=1)
    tol = Option(float, 1e-6, "Lanczos stops when every residual is below tol times its eigenvalue.", minimum=0)
    order = Option(
        str,
        "chronological",
        "Order the basis checkpoints extend the basis in: chronological (Algorithm 1) or shuffled "
        "(a --seed permutation; the paper's shuffled-checkpoint ablation, App. E).",
        choices=("chronological", "shuffled"),
    )


class ComputeOptions:
    """Precision and memory options of the derivative computations."""

    dtype = Option(str, "float32", "Precision of the computation.", choices=DTYPES)
    batch_size = Option(int, 256, "Examples per forward pass (bounds memory).", minimum=1)


class BasisReader(HessianOptions, ComputeOptions):
    """Options and dependency handling of an analyzer that reads a basis (``--basis NAME``).

    ``--basis hessian-basis`` (default) and ``random-basis`` are computed first
    when missing, with the schedule options passed through; any other name is a
    plugin's basis analyzer, run with the options of its stored result (its
    defaults when there is none).
    """

    basis = Option(
        str, HESSIAN_BASIS, "Basis analyzer: hessian-basis, random-basis (the paper's ablation) or a plugin's."
    )
    vectors = Option(
        int, 0, "random-basis only: number of vectors (0: as many as the Hessian schedule gives).", minimum=0
    )

    options: dict[str, Any]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)  # type: ignore[call-arg]
        basis = self.options["basis"]
        if not basis:
            msg = "--basis must name a basis analyzer (hessian-basis, random-basis or a plugin's)"
            raise AnalysisError(msg)
        self.requires = (basis,)

    def provenance(self) -> dict[str, Any]:
        """Without the options passed to the basis: the basis's own provenance covers them.

        So a rerun without ``--every`` (using the stored basis) reuses a result computed
        with ``--every 400``, and a different basis still recomputes everything.
        """
        record = super().provenance()  # type: ignore[misc]
        record["options"] = {k: v for k, v in record["options"].items() if k not in PASSED_TO_BASIS}
        return record

    def dependency_options(self) -> dict[str, dict[str, Any] | None]:
        """The schedule options for the built-in bases; none given: the stored basis, whatever its options.

        A plugin basis always keeps its stored options (its defaults when there is none).
        """
        o = self.options
        spec = self.option_spec()  # type: ignore[attr-defined]
        if all(o[key] == spec[key].default for key in PASSED_TO_BASIS):
            return {o["basis"]: None}
        schedule = {key: o[key] for key in ("every", "at_steps", "k", "seed")}
        if o["basis"] == HESSIAN_BASIS:
            hessian = {key: o[key] for key in ("hessian_split", "samples", "tol", "order", "dtype", "batch_size")}
            return {HESSIAN_BASIS: {**schedule, **hessian, "split": o["split"], "objective": o["objective"]}}
        if o["basis"] == RANDOM_BASIS:
            return {RANDOM_BASIS: {**schedule, "vectors": o["vectors"]}}
        return {o["basis"]: None}


__all__ = [
    "HESSIAN_BASIS",
    "PASSED_TO_BASIS",
    "RANDOM_BASIS",
    "BasisReader",
    "ComputeOptions",
    "HessianOptions",
    "ScheduleOptions",
    "basis_steps",
    "check_basis_size",
    "sample_examples",
]

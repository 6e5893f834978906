"""The store fuzzer in CI: hostile mutants of a real store, every command on each (issues 28, 68).

See ``tests/fuzz_store.py`` for the mutations, the worker and the oracle. The suite runs a seeded
sample of :data:`EXAMPLES` mutants that applies every mutation operator
(:data:`tests.fuzz_store.OPERATORS`, checked); ``CKPT_FUZZ_EXAMPLES=2000`` runs the full count
(issue 68's) and ``CKPT_FUZZ_SEED`` another sample. The counts are printed (``pytest -n 0 -s``
shows them) and every failure is listed with the mutations that caused it.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_store import COMMANDS, OPERATORS, REPORT_EVERY, Mutant, Worker, judge, mutate, tree_hash
from tests.helpers import write_analyzed_run

pytestmark = pytest.mark.slow  # crash trials: every file write of a store killed

EXAMPLES = int(os.environ.get("CKPT_FUZZ_EXAMPLES", "120"))
"""Mutants a run makes: at seed 0 the 120 apply every operator (checked below), each by the 95th mutant."""
SEED = os.environ.get("CKPT_FUZZ_SEED", "0")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_analyzed_run(tmp_path_factory.mktemp("fuzz-base") / "run.zarr")


def test_hostile_stores_end_in_output_or_one_error_line(base: Path) -> None:
    worker = Worker()
    counts: collections.Counter[str] = collections.Counter()
    operators: collections.Counter[str] = collections.Counter()
    failures: list[str] = []

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(seed=st.integers(0, 2**32 - 1), mutations=st.integers(1, 3))
    def one_mutant(seed: int, mutations: int) -> None:
        rng = random.Random(f"{SEED}-{seed}")
        folder = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-"))
        try:
            canary = folder / "canary"
            canary.mkdir()
            (canary / "secret.bin").write_bytes(os.urandom(64))
            mutant = Mutant(folder / "run.zarr", canary)
            shutil.copytree(base, mutant.path)
            for _ in range(mutations):
                mutate(mutant, rng)
            counts.update(f"kind {kind}" for kind in mutant.kinds)
            operators.update(mutant.operators)
            before, listing = tree_hash(canary), sorted(p.name for p in folder.iterdir())
            commands = list(COMMANDS)
            counts["mutants"] += 1
            if counts["mutants"] % REPORT_EVERY == 0:
                commands.insert(-1, ("report", "@", "--out", str(folder / "canary-report.html")))
            for command in commands:
                args = [str(mutant.path) if a == "@" else a for a in command]
                code, stdout, stderr = worker.run(args)
                counts[f"{command[0]} exit {code}"] += 1
                counts["commands"] += 1
                problem = judge(command, code, stdout, stderr, mutant)
                if problem is not None:
                    failures.append(f"{' '.join(command)} after {mutant.done}: {problem}")
            listing_after = sorted(p.name for p in folder.iterdir() if p.name != "canary-report.html")
            if tree_hash(canary) != before or listing_after != listing:
                failures.append(f"something outside the store changed after {mutant.done}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    try:
        one_mutant()
    finally:
        worker.close()
    print(f"\nfuzz: {dict(sorted(counts.items()))}\noperators: {dict(sorted(operators.items()))}")
    if os.environ.get("CKPT_FUZZ_FAILURES"):  # every failure, one a line, for a long run by hand
        Path(os.environ["CKPT_FUZZ_FAILURES"]).write_text("\n".join(failures) + "\n")
    assert counts["mutants"] >= EXAMPLES
    assert counts["commands"] >= EXAMPLES * len(COMMANDS)
    # the sample is smaller than the full count, not narrower: every operator was applied
    missing = sorted(set(OPERATORS) - set(operators))
    assert not missing, f"mutation operators never applied in {EXAMPLES} mutants: {missing}"
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:40])

"""POLCA within the memory budget (issue 29): passes sized from ``--max-memory``, the same numbers in any size.

A real GPT-2 (1.7M parameters, vocabulary 4,096) with two checkpoints and 16 eval sequences
of 48 tokens: one second-order pass over all of them along 8 vectors, what ``--batch-size 256
--basis-batch 8`` gave before, does not fit in 900 MiB beside the process.

Sixteen sequences, not more: every plan these tests check is at most 5 examples a pass (the CPU's
token bound, 2,048 tokens x vectors, at 48 tokens and 8 vectors), so 16 still take several passes
at every budget, and the memory of a pass does not depend on how many examples there are in all.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers.polca import CPU_TOKEN_VECTORS, PASS_PEAK, PassCost, plan_basis, plan_passes
from ckpt.numerics.footprint import peak_bytes
from ckpt.plugins import AnalysisError
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest, write_gpt2_run
from tests.test_memory_budget import error_lines, limited

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

MiB = 2**20
VECTORS = 8
POLCA = ("--basis", "random-basis", "--second-order", "exact", "--scheduler", "sync")


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two checkpoints, 16 eval sequences of 48 tokens and a stored random basis of 8 vectors."""
    store = write_gpt2_run(tmp_path_factory.mktemp("gpt2-polca"), checkpoints=2, sequences=16, length=48)
    done = invoke_ckpt("analyze", "random-basis", str(store), "--vectors", str(VECTORS), "--no-progress")
    assert done.returncode == 0, done.stderr
    return store


@pytest.fixture
def gpt2_store(gpt2_run: Path, tmp_path: Path) -> Path:
    """A private copy of the run (analyses write into the store)."""
    path = tmp_path / "run.zarr"
    shutil.copytree(gpt2_run, path)
    return path


def planned_passes(stderr: str) -> set[tuple[int, int]]:
    """The (examples, vectors) of every checkpoint's plan that ``--progress`` showed."""
    return {(int(b), int(k)) for b, k in re.findall(r"(\d+) examples x (\d+) vectors a pass", stderr)}


def test_a_small_budget_gives_the_same_numbers_in_smaller_passes(gpt2_store: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.zarr"
    shutil.copytree(gpt2_store, other)
    # first order: the second order's passes run the same code, at three times the cost
    first = (*POLCA, "--second-order", "none", "--progress")
    roomy = invoke_ckpt("analyze", "polca", str(gpt2_store), *first, "--max-memory", "16GiB")
    assert roomy.returncode == 0, roomy.stderr
    # on the CPU a language model's pass holds at most CPU_TOKEN_VECTORS tokens x vectors (48 a sequence)
    assert planned_passes(roomy.stderr) == {(CPU_TOKEN_VECTORS // (48 * VECTORS), VECTORS)}
    # 100 MiB: the split head (ckpt.numerics._head) makes no logits' tangents, and 150 MiB fits a pass of
    # 8 examples x 6 vectors, more than the roomy plan's 5 x 8 once the token bound caps that. At 100 MiB
    # the 8 vectors (54 MB) held would leave small passes: each pass reads its own (plan_basis)
    tight = invoke_ckpt("analyze", "polca", str(other), *first, "--max-memory", "100MiB")
    assert tight.returncode == 0, tight.stderr
    assert "basis read per pass" in tight.stderr
    plans = planned_passes(tight.stderr)
    assert plans and all(b * k < 5 * VECTORS for b, k in plans), plans
    unbounded = ckptstore.open(gpt2_store).analysis("polca").load()
    bounded = ckptstore.open(other).analysis("polca").load()
    for name in ("polca", "first_order", "loss_change", "step_projection"):
        scale = float(np.abs(unbounded[name].values).max())
        np.testing.assert_allclose(bounded[name].values, unbounded[name].values, rtol=1e-4, atol=1e-6 * scale)


def test_a_basis_larger_than_the_budget_is_read_a_pass_of_vectors_at_a_time(gpt2_store: Path, tmp_path: Path) -> None:
    """24 random vectors (163 MB) cannot be held in 150 MiB: each pass reads its own, with the same numbers."""
    other = tmp_path / "other.zarr"
    done = invoke_ckpt("analyze", "random-basis", str(gpt2_store), "--vectors", "24", "--force", "--no-progress")
    assert done.returncode == 0, done.stderr
    shutil.copytree(gpt2_store, other)
    first = (*POLCA, "--second-order", "none", "--progress")
    held = invoke_ckpt("analyze", "polca", str(gpt2_store), *first, "--max-memory", "16GiB")
    assert held.returncode == 0, held.stderr
    assert "basis held" in held.stderr and "basis read per pass" not in held.stderr
    read = invoke_ckpt("analyze", "polca", str(other), *first, "--max-memory", "150MiB")
    assert read.returncode == 0, read.stderr
    assert "basis read per pass" in read.stderr and "basis held" not in read.stderr
    roomy = ckptstore.open(gpt2_store).analysis("polca").load()
    bounded = ckptstore.open(other).analysis("polca").load()
    assert bounded.sizes["basis"] == 24
    # ⟨Δ, b⟩ is the same arithmetic whether the basis is held or read (PROJECTION_ROWS_BYTES)
    np.testing.assert_array_equal(bounded["step_projection"].values, roomy["step_projection"].values)
    for name in ("polca", "first_order", "loss_change"):
        scale = float(np.abs(roomy[name].values).max())
        np.testing.assert_allclose(bounded[name].values, roomy[name].values, rtol=1e-4, atol=1e-6 * scale)


def test_the_planned_passes_fit_where_one_pass_does_not(gpt2_store: Path) -> None:
    """Under an address-space limit the old block sizes (a 100 GiB budget) run out; 200 MiB fits.

    600 MiB: the CPU's token bound (CPU_TOKEN_VECTORS) keeps even a 100 GiB budget's passes small
    enough for the 900 MiB this test used before it.
    """
    args = ("analyze", "polca", str(gpt2_store), *POLCA, "--no-progress")
    before = tree_digest(gpt2_store)
    ignored, _ = limited(600 * MiB, *args, "--max-memory", "100GiB")
    assert ignored.returncode != 0
    lines = error_lines(ignored.stderr)
    assert len(lines) == 1 and "ran out of memory" in lines[0] and "--max-memory" in lines[0], ignored.stderr
    assert tree_digest(gpt2_store) == before

    honoured, _ = limited(600 * MiB, *args, "--max-memory", "200MiB")
    assert honoured.returncode == 0, honoured.stderr
    assert ckptstore.open(gpt2_store).analysis("polca").sizes["basis"] == VECTORS


def test_an_impossible_budget_is_one_error_line_naming_the_knob(gpt2_store: Path) -> None:
    before = tree_digest(gpt2_store)
    done = run_ckpt("analyze", "polca", str(gpt2_store), *POLCA, "--max-memory", "20MiB", "--no-progress")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert "polca needs at least" in lines[0] and "the memory budget is 20 MiB: raise --max-memory" in lines[0]
    assert tree_digest(gpt2_store) == before


def test_lca_plans_its_passes_with_its_dense_directions(gpt2_store: Path, tmp_path: Path) -> None:
    """LCA's one-hot directions are D numbers each: a tight budget takes fewer a pass, with the same numbers."""
    other = tmp_path / "other.zarr"
    shutil.copytree(gpt2_store, other)
    lca = ("--parameters", "6", "--scheduler", "sync", "--no-progress")
    assert invoke_ckpt("analyze", "lca", str(gpt2_store), *lca, "--max-memory", "16GiB").returncode == 0
    tight = invoke_ckpt("analyze", "lca", str(other), *lca, "--max-memory", "150MiB")
    assert tight.returncode == 0, tight.stderr
    roomy, bounded = (ckptstore.open(p).analysis("lca").load() for p in (gpt2_store, other))
    for name in ("first_order", "lca"):
        scale = float(np.abs(roomy[name].values).max())
        np.testing.assert_allclose(bounded[name].values, roomy[name].values, rtol=1e-4, atol=1e-6 * scale)
    before = tree_digest(other)
    done = run_ckpt("analyze", "lca", str(other), *lca, "--max-memory", "20MiB", "--force")
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert (
        lines[0].startswith("Error: lca needs at least") and "--max-memory" in lines[0] and "--parameters" in lines[0]
    )
    assert tree_digest(other) == before


def test_the_pass_cost_is_exact_at_the_points_it_was_fitted_to() -> None:
    """A bilinear cost is recovered exactly; a flat line where only one size was measured."""
    truth = PassCost(5e6, 3e6, 2e6, 1e6)
    measured = {(b, k): int(truth(b, k)) for b in (2, 3) for k in (1, 2)}
    assert PassCost.fit(measured) == truth
    single = PassCost.fit({(1, 1): 100, (1, 2): 150})
    assert (single.per_example, single.per_example_vector, single(1, 4)) == (0.0, 0.0, 250.0)


def test_peak_bytes_counts_what_is_held_at_once_not_what_was_allocated() -> None:
    import torch

    x = torch.ones(1000)

    def run() -> None:
        for _ in range(5):
            y = x * 2  # 4,000 bytes, freed before the next
            del y
        held = [x + 1, x + 2]  # 8,000 bytes at once
        del held

    assert peak_bytes(run) == 8000
    assert peak_bytes(lambda: x.view(10, 100).add_(0)) == 0  # views and in-place ops allocate nothing


COST = PassCost(10 * MiB, 8 * MiB, 4 * MiB, 5 * MiB)


@pytest.mark.parametrize("budget_mib", [60, 120, 400, 10_000])
def test_every_plan_fits_its_budget(budget_mib: int) -> None:
    """All vectors a pass while 8 examples fit beside them; then fewer vectors; never above the budget."""
    budget, fixed = budget_mib * MiB, 20 * MiB
    plan = plan_passes(budget, fixed, COST, examples=48, vectors=8, batch_size=256, basis_batch=8)
    assert plan.estimate <= budget
    assert plan.estimate == int(fixed + PASS_PEAK * COST(plan.block_examples, plan.vectors))
    if budget_mib == 10_000:
        assert (plan.block_examples, plan.vectors) == (48, 8)
    if budget_mib == 400:  # 304 MiB of room: 5 examples fit beside 8 vectors, 8 examples beside 5
        assert (plan.block_examples, plan.vectors) == (8, 5)
    if budget_mib == 60:  # 32 MiB of room: one example along one vector (27 MiB) is all that fits
        assert (plan.block_examples, plan.vectors) == (1, 1)
    small = plan_passes(budget, fixed, COST, examples=48, vectors=8, batch_size=4, basis_batch=2)
    assert small.block_examples <= 4 and small.vectors <= 2  # the user's sizes stay upper bounds


def test_a_language_models_cpu_passes_hold_at_most_the_token_vectors_that_run_fastest() -> None:
    """CPU_TOKEN_VECTORS bounds tokens x vectors below the budget; it never raises a plan above it."""
    budget, fixed = 10_000 * MiB, 20 * MiB
    roomy = plan_passes(budget, fixed, COST, examples=48, vectors=8, batch_size=256, basis_batch=8, tokens=128)
    assert roomy.vectors == 8 and roomy.block_examples == CPU_TOKEN_VECTORS // (8 * 128) == 2
    long = plan_passes(budget, fixed, COST, examples=48, vectors=8, batch_size=256, basis_batch=8, tokens=4096)
    assert (long.block_examples, long.vectors) == (1, 8), "one example even when it alone holds more tokens"
    tight = plan_passes(60 * MiB, fixed, COST, examples=48, vectors=8, batch_size=256, basis_batch=8, tokens=1)
    assert (tight.block_examples, tight.vectors) == (1, 1), "the budget still decides where it is smaller"


def test_a_plan_that_cannot_fit_names_the_knobs() -> None:
    with pytest.raises(AnalysisError, match=r"polca needs at least .* the memory budget is 40 MiB: raise --max-memory"):
        plan_passes(40 * MiB, 20 * MiB, COST, examples=48, vectors=8, batch_size=256, basis_batch=8)


def test_the_basis_is_held_unless_reading_it_per_pass_allows_larger_passes() -> None:
    """Held (read once per worker) while that costs the passes nothing; else each pass reads its vectors."""
    direction = 16 * MiB
    sizes = {"examples": 48, "batch_size": 256, "basis_batch": 8}
    roomy = plan_basis(10_000 * MiB, 20 * MiB, COST, direction_bytes=direction, vectors=8, **sizes)
    assert roomy.basis_held and (roomy.block_examples, roomy.vectors) == (48, 8)
    # 400 MiB: the 8 vectors held (128 MiB) leave passes of 10 examples x 2 vectors; read, 8 x 4
    tight = plan_basis(400 * MiB, 20 * MiB, COST, direction_bytes=direction, vectors=8, **sizes)
    held = plan_passes(400 * MiB, 20 * MiB + 8 * direction, COST, vectors=8, **sizes)
    assert (held.block_examples, held.vectors) == (10, 2)
    assert not tight.basis_held and (tight.block_examples, tight.vectors) == (8, 4)
    # a read plan counts the vectors of its pass beside it
    expected = 20 * MiB + PASS_PEAK * COST(8, 4) + 4 * direction
    assert abs(tight.estimate - expected) <= 1 and tight.estimate <= 400 * MiB
    # 20 vectors (320 MiB) cannot be held in 300 MiB at all; read, passes of 10 examples x 2 vectors fit
    wide = plan_basis(300 * MiB, 20 * MiB, COST, direction_bytes=direction, vectors=20, **sizes)
    assert not wide.basis_held and (wide.block_examples, wide.vectors) == (10, 2)
    with pytest.raises(AnalysisError, match=r"polca needs at least .* the memory budget is 40 MiB: raise --max-memory"):
        plan_basis(40 * MiB, 20 * MiB, COST, direction_bytes=direction, vectors=8, **sizes)

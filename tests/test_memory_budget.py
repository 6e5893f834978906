"""The memory budget (issue 29): ``--max-memory`` sizes hessian-basis, and what cannot fit is one Error line.

A real GPT-2 (1.7M parameters, 4,096-token vocabulary) imported from ``save_pretrained``
folders; the analyses run in a child whose address space is limited (tests/memory_child.py).
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers.hessian_basis import (
    BASIS_BLOCK_BYTES,
    FIXED_VECTORS,
    GRAPH_AT_REST,
    GRAPH_PEAK,
    REBUILT_PEAK,
    SearchPlan,
    check_the_run_fits,
    plan_search,
)
from ckpt.engine.memory import parse_size
from ckpt.engine.worker import TaskSpec
from ckpt.numerics.derivatives import parameter_space
from ckpt.numerics.lanczos import lanczos_bytes
from ckpt.plugins import AnalysisContext, AnalysisError, load_registry
from ckpt.plugins.testing import write_example_run
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest, write_gpt2_run

CHILD = Path(__file__).with_name("memory_child.py")
MiB = 2**20


@pytest.fixture(scope="module")
def gpt2_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One checkpoint of a 1.7M-parameter GPT-2 after two AdamW steps, and 16 eval sequences of 24 tokens."""
    return write_gpt2_run(tmp_path_factory.mktemp("gpt2"))


def limited(extra: int, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``ckpt ARGS`` in a child limited to its address space after imports plus ``extra`` bytes."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": root, "MALLOC_ARENA_MAX": "2"}
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"  # thread pools reserve address space per core
    done = subprocess.run(
        [sys.executable, str(CHILD), str(extra), *args], capture_output=True, text=True, env=env, timeout=600
    )
    peak = int(done.stderr.strip().splitlines()[-1].split()[-1])
    return done, peak


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


@pytest.mark.slow
def test_the_budget_is_honoured_under_an_address_space_limit(gpt2_store: Path) -> None:
    """256 MiB of budget fits a 650 MiB limit; the same run told it may use 100 GiB does not."""
    args = ("analyze", "hessian-basis", str(gpt2_store), "--samples", "16", "--scheduler", "sync", "--no-progress")
    before = tree_digest(gpt2_store)
    ignored, _ = limited(650 * MiB, *args, "--max-memory", "100GiB")
    assert ignored.returncode != 0
    lines = error_lines(ignored.stderr)
    assert len(lines) == 1, ignored.stderr
    assert "ran out of memory" in lines[0] and "nothing was committed" in lines[0] and "--max-memory" in lines[0]
    assert "Traceback" not in ignored.stderr
    assert tree_digest(gpt2_store) == before

    honoured, _ = limited(650 * MiB, *args, "--max-memory", "256MiB")
    assert honoured.returncode == 0, honoured.stderr
    bounded = ckptstore.open(gpt2_store).analysis("hessian-basis").load()
    # the same search with room to spare (no limit, kept graphs, no restarts) finds the same eigenpair
    free = invoke_ckpt(*args, "--force", "--max-memory", "8GiB")
    assert free.returncode == 0, free.stderr
    unbounded = ckptstore.open(gpt2_store).analysis("hessian-basis").load()
    np.testing.assert_allclose(bounded["eigenvalue"].values, unbounded["eigenvalue"].values, rtol=1e-5)
    assert int(bounded["matvecs"][0]) > int(unbounded["matvecs"][0])  # restarts: more products, less memory
    names = [n for n in unbounded.data_vars if n.startswith("transformer.")]
    overlap = sum(float((bounded[n].values * unbounded[n].values).sum()) for n in names)
    assert abs(overlap) > 1 - 1e-3


@pytest.mark.slow
def test_an_impossible_budget_is_one_error_line_naming_the_knob(gpt2_store: Path) -> None:
    before = tree_digest(gpt2_store)
    for budget, expected in (
        ("1MiB", "hessian-basis needs at least"),
        ("lots", "--max-memory must be a size such as 8GiB"),
    ):
        done = run_ckpt("analyze", "hessian-basis", str(gpt2_store), "--max-memory", budget, "--no-progress")
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and expected in lines[0], done.stderr
        assert "--max-memory" in lines[0]
    assert tree_digest(gpt2_store) == before


def test_sizes_are_parsed_as_people_write_them() -> None:
    assert parse_size("12GiB") == 12 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5g") == int(1.5e9)
    assert parse_size(4096) == 4096
    for bad in ("", "-1GiB", "0", "12 parsecs"):
        with pytest.raises(AnalysisError, match="--max-memory"):
            parse_size(bad)


PLAN = {"dimension": 1_700_000, "k": 1, "earlier": 2, "examples": 64, "batch_size": 32, "itemsize": 4}
GRAPH = (4 * MiB, 1.5 * MiB)  # constant and per-example bytes of one block's graph


@pytest.mark.parametrize("budget_mib", [160, 400, 2000, 100_000])
def test_every_plan_fits_its_budget(budget_mib: int) -> None:
    """Kept graphs while they fit, then rebuilt blocks; never an estimate above the budget."""
    budget = budget_mib * MiB
    plan = plan_search(budget, graph=GRAPH, limit=100, **PLAN)
    assert isinstance(plan, SearchPlan) and plan.estimate <= budget
    assert plan.vectors >= 5  # k + 4: thick restarts converge
    kept_graphs = GRAPH_PEAK * 2 * (4 * MiB + 32 * 1.5 * MiB)
    if budget_mib >= 2000:
        assert plan.keep_graphs and plan.vectors == 100  # room for every product: no restart
    if budget_mib == 160:  # the kept graphs (239 MiB) do not fit: rebuilt blocks, fewer examples each
        assert not plan.keep_graphs and plan.block_examples < 32
    search = lanczos_bytes(1_700_000, plan.vectors, spilled=plan.spill)
    assert plan.estimate >= search + (kept_graphs if plan.keep_graphs else 0)


def test_kept_graphs_with_spilled_vectors_come_before_rebuilt_graphs() -> None:
    """GPT-2 small's case: the graphs fit, k + 4 vectors beside them do not; on a GPU nothing is spilled."""
    fixed = (FIXED_VECTORS + 2) * 1_700_000 * 4
    kept_graphs = int(GRAPH_PEAK * (4 * MiB + 32 * 1.5 * MiB)) * 2
    budget = fixed + kept_graphs + lanczos_bytes(1_700_000, 9, spilled=True) + MiB
    assert budget < fixed + kept_graphs + lanczos_bytes(1_700_000, 5)  # k + 4 in memory would not fit
    plan = plan_search(budget, graph=GRAPH, limit=100, **PLAN)
    assert plan.keep_graphs and plan.spill and plan.vectors == 9 and plan.estimate <= budget
    on_gpu = plan_search(budget, graph=GRAPH, limit=100, can_spill=False, **PLAN)
    assert not on_gpu.keep_graphs and not on_gpu.spill and on_gpu.estimate <= budget


def test_graphs_that_almost_fit_are_kept_in_part_and_the_rest_rebuilt() -> None:
    """A later basis checkpoint's case: its earlier vectors leave the kept graphs a little short of room."""
    search = lanczos_bytes(1_700_000, 9, spilled=True)
    fixed = (FIXED_VECTORS + 2) * 1_700_000 * 4
    constant, per_example = GRAPH
    all_kept = int(GRAPH_PEAK * (constant + 32 * per_example)) * 2  # two blocks of 32
    budget = fixed + search + all_kept - 10 * MiB
    plan = plan_search(budget, graph=GRAPH, limit=100, **PLAN)
    assert not plan.keep_graphs and plan.spill and plan.vectors == 9
    assert 32 < plan.kept_examples < 64 and 1 <= plan.block_examples <= 64 - plan.kept_examples
    assert plan.estimate <= budget and "graphs of" in plan.describe()
    # the kept graphs at their product's peak, and at rest beside a rebuilt block, both within the budget
    kept = constant * 2 + per_example * plan.kept_examples
    rebuilt = constant + per_example * plan.block_examples
    assert fixed + search + GRAPH_PEAK * kept <= budget
    assert fixed + search + GRAPH_AT_REST * kept + REBUILT_PEAK * rebuilt <= budget
    # one example more kept would not fit
    assert fixed + search + GRAPH_PEAK * (kept + per_example) > budget or (
        fixed + search + GRAPH_AT_REST * (kept + per_example) + REBUILT_PEAK * (constant + per_example) > budget
    )
    # on a GPU nothing is spilled, and the graphs are all rebuilt as before
    assert plan_search(budget, graph=GRAPH, limit=100, can_spill=False, **PLAN).kept_examples == 0


def test_a_later_basis_checkpoint_spills_its_earlier_basis_before_it_rebuilds_graphs() -> None:
    """With a journal on the CPU, earlier vectors that would leave graphs to rebuild are read from a file instead."""
    vector = 1_700_000 * 4
    search = lanczos_bytes(1_700_000, 9, spilled=True)
    constant, per_example = GRAPH
    all_kept = int(GRAPH_PEAK * (constant + 32 * per_example)) * 2
    many = {**PLAN, "earlier": 20}
    budget = FIXED_VECTORS * vector + BASIS_BLOCK_BYTES + search + all_kept + MiB
    held = plan_search(budget, graph=GRAPH, limit=100, **many)  # 20 vectors (136 MB) in memory: graphs rebuilt
    assert not held.keep_graphs and not held.spill_basis
    plan = plan_search(budget, graph=GRAPH, limit=100, can_spill_basis=True, **many)
    assert plan.keep_graphs and plan.spill and plan.spill_basis and plan.estimate <= budget
    # where the basis in memory leaves every graph kept, it stays there: no reads
    roomy = budget + 20 * vector
    assert not plan_search(roomy, graph=GRAPH, limit=100, can_spill_basis=True, **many).spill_basis
    # no earlier vectors, or a GPU (nothing spilled there): the plans as before
    first = {**PLAN, "earlier": 0}
    assert plan_search(budget, graph=GRAPH, limit=100, can_spill_basis=True, **first) == plan_search(
        budget, graph=GRAPH, limit=100, **first
    )
    # the least a search needs no longer grows with the basis: 200 earlier vectors (1.4 GB) in 160 MiB
    with pytest.raises(AnalysisError, match=r"the model and 200 earlier basis vectors\); the memory budget"):
        plan_search(160 * MiB, graph=GRAPH, limit=100, **{**PLAN, "earlier": 200})
    far = plan_search(160 * MiB, graph=GRAPH, limit=100, can_spill_basis=True, **{**PLAN, "earlier": 200})
    assert far.spill_basis and far.estimate <= 160 * MiB
    with pytest.raises(AnalysisError, match=r"200 earlier basis vectors spilled to disk\); the memory budget"):
        plan_search(16 * MiB, graph=GRAPH, limit=100, can_spill_basis=True, **{**PLAN, "earlier": 200})


def test_a_partly_kept_plan_covers_every_example_once() -> None:
    """hessian_operator: kept blocks of the batch size, then rebuilt blocks; the same H v as all graphs kept."""
    import torch

    from ckpt.analyzers.hessian_basis import hessian_operator
    from ckpt.numerics.derivatives import MeanLossHessian

    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(11, 5, generator=generator), torch.randn(11, generator=generator)
    primal = {"w": torch.randn(5, generator=generator, dtype=torch.float64), "b": torch.zeros((), dtype=torch.float64)}

    def block_loss(rows: np.ndarray):
        def f(params):
            return torch.tanh(inputs[rows].double() @ params["w"] + params["b"]) - targets[rows].double()

        return lambda params: f(params) ** 2

    examples = np.array([3, 0, 7, 1, 9, 4, 10, 2])
    plan = SearchPlan(False, 2, 9, 0, spill=True, kept_examples=5)
    operator = hessian_operator(plan, block_loss, examples, 1.0 / 8, primal, batch_size=3)
    assert len(operator._kept_fs) == 2 and len(operator._rebuilt_fs) == 2  # kept 3 + 2, rebuilt 2 + 1
    whole = MeanLossHessian([(block_loss(examples), 1.0 / 8)], primal)
    vector = {"w": torch.randn(5, generator=generator, dtype=torch.float64), "b": torch.ones((), dtype=torch.float64)}
    for name, value in whole(vector).items():
        torch.testing.assert_close(operator(vector)[name], value, rtol=1e-12, atol=1e-14)


def test_a_plan_that_cannot_fit_names_the_knobs() -> None:
    with pytest.raises(AnalysisError, match=r"needs at least .* the memory budget is 64 MiB: raise --max-memory"):
        plan_search(64 * MiB, graph=GRAPH, limit=100, **PLAN)


def test_measuring_a_graph_keeps_nothing_of_it_alive() -> None:
    """graph_bytes's graphs are freed: a saved-tensor hook had kept every measured graph (1.5 GiB a checkpoint at L)."""
    import weakref

    import torch

    from ckpt.numerics.derivatives import graph_bytes

    inputs = torch.randn(64, 200, generator=torch.Generator().manual_seed(0))
    made: list[weakref.ref] = []

    def losses(params: dict) -> torch.Tensor:
        hidden = torch.tanh(inputs @ params["w"])
        made.append(weakref.ref(hidden))
        return (hidden @ params["v"]).pow(2).sum(-1)

    primal = {"w": torch.randn(200, 300) / 15, "v": torch.randn(300, 10) / 17}
    measured = graph_bytes(losses, primal)
    # at least tanh's output (saved for its backward), the gradients and the double-backward's saves
    assert measured >= 64 * 300 * 4 + (200 * 300 + 300 * 10) * 4
    gc.collect()
    assert made and all(ref() is None for ref in made)


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's heap: malloc_trim exists on Linux only")
def test_memory_freed_into_the_heap_is_given_back() -> None:
    """Freed mid-sized tensors stay in glibc's heap (RSS) until ``release_freed_memory`` trims it.

    At GPT-2 small the graphs that hessian-basis measures and then frees left 3 GiB in the
    process, beside which its Lanczos vectors were mapped: 12 GiB at the second basis checkpoint.
    """
    import psutil
    import torch

    from ckpt.runtime import release_freed_memory

    def rss() -> int:
        return psutil.Process().memory_info().rss

    release_freed_memory()
    large = torch.ones(4 * 2**20)  # 16 MiB: freeing a mapped block raises glibc's mmap threshold to it
    del large
    blocks = [torch.ones(2**19) for _ in range(200)]  # 200 x 2 MiB, now in the heap
    before = rss()
    keep = blocks[-1]  # the heap's top stays in use: the rest cannot shrink back by itself
    del blocks
    gc.collect()
    retained = rss()
    release_freed_memory()
    released = rss()
    assert retained > before - 100 * 2**20, "freeing alone gives back little: the heap keeps it"
    assert released < retained - 300 * 2**20, f"{(retained - released) / 2**20:.0f} MiB given back"
    assert float(keep.sum()) == 2**19


FREED_AND_TRIMMED = """
import atexit, ctypes, json, sys, threading

import psutil
import torch

from ckpt.runtime import freed_memory_kept_for_reuse, release_freed_memory


def rss():
    return psutil.Process().memory_info().rss


def allocate_and_free():
    block = torch.ones(16 * 2**20)  # 64 MiB: above glibc's largest mmap threshold (32 MiB)
    del block


def in_a_thread(work):  # ckpt computes on worker threads
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()


def measure():  # after the command, as the console script's last exit handler
    figures = {}
    release_freed_memory()
    start = rss()
    in_a_thread(allocate_and_free)
    figures["kept_outside"] = rss() - start
    with freed_memory_kept_for_reuse():
        start = rss()
        in_a_thread(allocate_and_free)
        figures["kept_inside"] = rss() - start
        with freed_memory_kept_for_reuse():  # a nested use (a search inside a run that keeps its memory)
            in_a_thread(allocate_and_free)
            release_freed_memory()  # as a task's turn ends: not while a use holds the memory for reuse
        figures["kept_after_nested"] = rss() - start
    figures["after_leaving"] = rss() - start
    print(json.dumps(figures), flush=True)
    ctypes.CDLL(None).malloc_stats()  # glibc's heaps ("Arena N:"), on stderr


atexit.register(measure)
sys.argv = ["ckpt", "--version"]
from ckpt.cli.main import main

main()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator settings: Linux only")
@pytest.mark.parametrize("own_setting", [False, True], ids=["ckpt's", "user's own"])
def test_freed_blocks_wait_for_reuse_in_one_heap_while_asked_then_go_back(own_setting: bool) -> None:
    """The ``ckpt`` command gives its threads one heap; a freed large block stays there only where asked.

    At GPT-2 small glibc's defaults unmapped ~2 GB of freed blocks per Hessian-vector product and
    mapped them afresh for the next: 16.3M page faults in 30 products, against 3.0M with one heap
    and ``freed_memory_kept_for_reuse`` around the search. Elsewhere a freed block goes back as
    before, and leaving the block gives back what it kept. A user's own glibc setting (here glibc's
    default ``MALLOC_ARENA_MAX=0``) is left alone: each thread has its own heap, nothing is kept.
    """
    import json

    env = {key: value for key, value in os.environ.items() if not key.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    if own_setting:
        env["MALLOC_ARENA_MAX"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", FREED_AND_TRIMMED], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    heaps = len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))
    mib = 2**20
    assert figures["kept_outside"] < 16 * mib, f"outside, a freed 64 MiB block goes back: {figures}"
    if own_setting:
        assert heaps > 1, done.stderr
        assert figures["kept_inside"] < 16 * mib, f"the user's setting: nothing kept: {figures}"
    else:
        assert heaps == 1, done.stderr
        assert figures["kept_inside"] > 48 * mib, f"inside, the freed block waits for reuse: {figures}"
        assert figures["kept_after_nested"] > 48 * mib, f"a nested use leaving, or a release, kept it: {figures}"
    assert figures["after_leaving"] < 16 * mib, f"leaving gives it back: {figures}"


KEPT_FOR_THE_RUN = """
import json, sys

import dask.array as da
import numpy as np
import psutil
import torch
import xarray as xr

import ckpt.plugins
from ckpt.plugins import PER_RUN, Analyzer, load_registry
from ckpt.runtime import use_one_heap
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run

use_one_heap()  # as the ckpt console script does first


def rss():
    return psutil.Process().memory_info().rss


def step(worker, before):
    # a task's computation: a 64 MiB block (above glibc's largest mmap threshold) allocated and freed;
    # its turn ends with release_freed_memory, as every computation on the CPU does
    with worker.computing():
        block = torch.ones(16 * 2**20)
        del block
    return np.array([rss() - before], dtype=np.float64)


class Probe(Analyzer):
    name = "probe"
    description = "RSS a task keeps after freeing a large block (test analyzer)."
    per = PER_RUN
    keeps_freed_memory = sys.argv[2] == "keep"

    def compute(self, ctx):
        kept = da.from_delayed(ctx.delayed(step, rss()), shape=(1,), dtype=np.float64)
        return xr.Dataset({"kept": ("probe", kept)}, coords={"probe": [0]})


class Plugin:
    @ckpt.plugins.hookimpl
    def ckpt_register_analyzers(self, register):
        register(Probe)


path = write_example_run(sys.argv[1], steps=2, examples=8)
registry = load_registry(extra=[Plugin()])
run("probe", path, registry=registry)  # warm: the engine's own first allocations, kept or not
start = rss()
result = run("probe", path, registry=registry, force=True).dataset.load()
print(json.dumps({"kept_in_task": float(result["kept"].values[0]), "after_run": rss() - start}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator settings: Linux only")
@pytest.mark.parametrize("keep", [True, False], ids=["keeps_freed_memory", "default"])
def test_an_analyzer_can_keep_what_its_tasks_free_for_the_whole_run(tmp_path: Path, keep: bool) -> None:
    """``Analyzer.keeps_freed_memory``: what a task frees stays in the heap past its turn, until the run ends.

    hessian-basis sets it: trimmed after each basis checkpoint, every page of the next one's graphs and
    Lanczos vectors was faulted in afresh (6.0M page faults against 1.9M at 27.4M parameters).
    """
    import json

    env = {key: value for key, value in os.environ.items() if not key.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    mode = "keep" if keep else "default"
    done = subprocess.run(
        [sys.executable, "-c", KEPT_FOR_THE_RUN, str(tmp_path / "run.zarr"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 2**20
    if keep:
        assert figures["kept_in_task"] > 48 * mib, f"the freed block waits for the run's next task: {figures}"
    else:
        assert figures["kept_in_task"] < 16 * mib, f"by default a turn's end gives it back: {figures}"
    assert figures["after_run"] < 16 * mib, f"the run's end gives it back: {figures}"
    assert load_registry().analyzers["hessian-basis"].keeps_freed_memory


def test_each_basis_checkpoint_is_held_once_not_again_in_its_tensors(tmp_path: Path) -> None:
    """The result's tensors of a basis checkpoint are views of the vectors its search returned.

    The later searches deflate against those vectors, so they are held until the run ends. Dask
    copied each tensor's slice of them (a slice under half its chunk is copied), so every basis
    checkpoint was held twice: at GPT-2 small, 0.46 GiB more per checkpoint, growing over the run.
    """
    from dask.core import flatten
    from dask.local import get_sync

    path = write_example_run(tmp_path / "run.zarr", steps=3, examples=40)
    store = ckptstore.open(path)
    analyzer = load_registry().analyzers["hessian-basis"](every=1, k=2, dtype="float64", tol=1e-8)
    lazy = analyzer.compute(AnalysisContext(store, store.steps, TaskSpec(str(path)), {}))
    names = [name for name in lazy.data_vars if name not in ("eigenvalue", "residual", "matvecs")]
    assert len(names) > 1
    whole = lazy.compute(scheduler="sync")

    def root(array: np.ndarray) -> object:
        """The buffer a view was made from (the array itself when it owns its data)."""
        while isinstance(array, np.ndarray) and array.base is not None:
            array = array.base
        return array

    for piece in range(3):
        blocks = [lazy[name].data.blocks[piece] for name in names]
        graph = {key: task for block in blocks for key, task in dict(block.__dask_graph__()).items()}
        # the chunks as the tasks return them: dask.compute would copy them once more to hand them out
        tensors = get_sync(graph, [next(iter(flatten(block.__dask_keys__()))) for block in blocks])
        roots = {id(root(tensor)) for tensor in tensors}
        assert len(roots) == 1, f"piece {piece}: its {len(names)} tensors live in {len(roots)} buffers"
        assert not any(tensor.flags.owndata for tensor in tensors)
        for name, tensor in zip(names, tensors, strict=True):
            np.testing.assert_array_equal(tensor, whole[name].values[2 * piece : 2 * piece + 2], err_msg=name)


def test_a_search_holds_its_own_checkpoint_not_the_one_before(tmp_path: Path) -> None:
    """The worker caches two checkpoints for tasks of pairs; hessian-basis's searches read one.

    The plan counts one checkpoint (:data:`FIXED_VECTORS`); the one before, cached from the
    previous basis checkpoint, was held beside every product of the next search uncounted.
    """
    from ckpt.engine.worker import forget_worker, worker_for

    path = write_example_run(tmp_path / "run.zarr", steps=3, examples=40)
    store = ckptstore.open(path)
    spec = TaskSpec(str(path))
    analyzer = load_registry().analyzers["hessian-basis"](every=1, k=1, dtype="float64", tol=1e-8)
    try:
        analyzer.compute(AnalysisContext(store, store.steps, spec, {})).compute(scheduler="sync")
        worker = worker_for(spec)
        assert list(worker._params) == [store.steps[-1]]
        # a task of pairs still finds both checkpoints cached
        worker.params(store.steps[0])
        worker.params(store.steps[1])
        assert list(worker._params) == list(store.steps[:2])
    finally:
        forget_worker(spec)


def test_a_run_whose_last_basis_checkpoint_cannot_fit_is_told_before_any_search() -> None:
    """Each basis checkpoint holds the vectors found before it: the last search is the largest."""
    first = plan_search(160 * MiB, graph=GRAPH, limit=100, **{**PLAN, "earlier": 0})
    assert first.estimate <= 160 * MiB
    args = {key: PLAN[key] for key in ("dimension", "k", "examples", "batch_size", "itemsize")}
    check_the_run_fits(160 * MiB, total=4, largest_tensor=100_000, graph=GRAPH, **args)  # fits to its end
    # where the earlier basis is held in memory (a GPU, or no journal), the last search needs most
    for where in ({"cpu": False}, {"journal": False}):
        with pytest.raises(
            AnalysisError, match=r"last basis checkpoint needs at least .* 29 earlier basis vectors"
        ) as info:
            check_the_run_fits(160 * MiB, total=30, largest_tensor=100_000, graph=GRAPH, **where, **args)
        assert "raise --max-memory" in str(info.value) and "--every, --at-steps" in str(info.value)
    # on the CPU with a journal the last search spills its earlier vectors, and the end holds none of them (the
    # engine copies the result from the journal a stored chunk at a time): the basis no longer bounds the run
    for total in (30, 1_000):
        check_the_run_fits(160 * MiB, total=total, largest_tensor=100_000, graph=GRAPH, **args)


def test_a_run_whose_end_cannot_fit_is_told_before_any_search() -> None:
    """The end of the run reads the basis back into the result's tensors (host memory)."""
    args = {key: PLAN[key] for key in ("dimension", "k", "examples", "batch_size", "itemsize")}
    vector = PLAN["dimension"] * PLAN["itemsize"]
    # without a journal the pieces are copied into the result's tensors beside themselves, each read back whole
    end = 2 * 16 * vector + 16 * 100_000 * PLAN["itemsize"] + vector
    # the last search (15 earlier vectors) fits in less than that end needs
    plan_search(end - 1, graph=GRAPH, limit=100, **{**PLAN, "earlier": 15})
    with pytest.raises(AnalysisError, match=r"at the end of the run, to put its 16 basis vectors .* --at-steps"):
        check_the_run_fits(end - 1, total=16, largest_tensor=100_000, graph=GRAPH, journal=False, **args)
    check_the_run_fits(end, total=16, largest_tensor=100_000, graph=GRAPH, journal=False, **args)
    # on a GPU the budget is the device's; the vectors come back to the host
    check_the_run_fits(end - 1, total=16, largest_tensor=100_000, graph=GRAPH, cpu=False, journal=False, **args)
    # with a journal (every run whose name allows one) the same run fits: the pieces are not held, and the end
    # holds a few stored chunks of the result copied from the journal, however large the largest tensor
    for largest in (100_000, 20_000_000):  # the second a token embedding of 20M parameters
        check_the_run_fits(end - 1, total=16, largest_tensor=largest, graph=GRAPH, **args)


@pytest.mark.slow
def test_a_basis_spilled_to_disk_gives_the_basis_held_in_memory_to_the_bit(tmp_path: Path) -> None:
    """A real GPT-2 run whose second basis checkpoint reads its 4 earlier vectors from a file, not memory.

    At 200 MiB the second checkpoint's search, with its earlier basis (27 MB) in memory, would need
    205 MiB to keep its graphs; spilled (read a block of 16 MiB at a time), it keeps them all in
    just over 195 MiB. At 240 MiB every basis stays in memory. Every search of both runs keeps 12 Lanczos
    vectors, spilled, so the numbers are the same whatever is read from a file. Two checkpoints, not
    more: the spilled basis is read the same way at any later checkpoint, and each one more is a
    search more in both runs.
    """
    store = write_gpt2_run(tmp_path, checkpoints=2)
    base = ("analyze", "hessian-basis", str(store), "--samples", "16", "-k", "4", "--every", "1", "--tol", "1e-2")
    plans = {}
    for budget in ("200MiB", "240MiB"):
        progress = ("--progress", "--scheduler", "sync", "--as", f"hb-{budget}")
        done = run_ckpt(*base, "--max-memory", budget, *progress, timeout=600)
        assert done.returncode == 0, done.stderr
        starts = [line for line in done.stderr.replace("\r", "\n").splitlines() if ": 0product" in line]
        plans[budget] = ["the earlier basis spilled to disk" in line for line in starts]
    assert plans == {"200MiB": [False, True], "240MiB": [False, False]}
    opened = ckptstore.open(store)
    spilled, held = (opened.analysis(f"hb-{budget}").load() for budget in ("200MiB", "240MiB"))
    assert spilled.sizes["basis"] == 8 and float(spilled["residual"].max()) < 1e-2 * float(spilled["eigenvalue"].max())
    for name in held.data_vars:
        np.testing.assert_array_equal(spilled[name].values, held[name].values, err_msg=name)


@pytest.mark.slow
def test_a_run_that_cannot_fit_stops_at_its_first_basis_checkpoint_with_nothing_kept(tmp_path: Path) -> None:
    """A real GPT-2 run of 12 checkpoints: before, it computed and kept the basis checkpoints that fitted."""
    store = write_gpt2_run(tmp_path, checkpoints=12)
    before = tree_digest(store)
    base = ("analyze", "hessian-basis", str(store), "--samples", "2", "--no-progress", "--scheduler", "sync")
    space = parameter_space(ckptstore.open(store))
    vector, largest = 4 * space.size, 4 * max(space.sizes)
    end = 2 * 12 * vector + 12 * largest + vector  # k 1: 12 basis vectors of 6.8 MB, the last search 11 earlier
    no_journal = "b" * 250  # a name with no room for ".partial": the pieces are held in memory to the end
    for extra, expected in (
        # k 4: the last search holds 44 earlier vectors (0.3 GB) where they stay in memory (no journal); the
        # first fits in 150 MiB. With a journal it spills them and the run fits (tests/test_result_from_journal.py)
        (("-k", "4", "--max-memory", "150MiB", "--as", no_journal), "last basis checkpoint needs at least"),
        (("-k", "1", "--max-memory", str(end - MiB), "--as", no_journal), "at the end of the run"),
    ):
        done = run_ckpt(*base, *extra)
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error:") and expected in lines[0], done.stderr
        assert "--max-memory" in lines[0] and "--at-steps" in lines[0]
    assert tree_digest(store) == before


def test_on_the_cpu_fewer_than_k_plus_8_vectors_in_memory_give_way_to_k_plus_8_spilled() -> None:
    """Room for k + 4 to k + 7 vectors beside the kept graphs: spilled on the CPU, in memory on a GPU.

    At GPT-2 small's first basis checkpoint k + 4 in memory took 38 products, k + 8 spilled 30.
    """
    fixed = (FIXED_VECTORS + PLAN["earlier"]) * 1_700_000 * 4
    kept_graphs = int(GRAPH_PEAK * (4 * MiB + 32 * 1.5 * MiB)) * 2
    for room in (5, 6, 7, 8):
        budget = fixed + kept_graphs + lanczos_bytes(1_700_000, room)
        on_cpu = plan_search(budget, graph=GRAPH, limit=100, **PLAN)
        assert on_cpu.keep_graphs and on_cpu.spill and on_cpu.vectors == 9 and on_cpu.estimate <= budget
        on_gpu = plan_search(budget, graph=GRAPH, limit=100, can_spill=False, **PLAN)
        assert on_gpu.keep_graphs and not on_gpu.spill and on_gpu.vectors == room and on_gpu.estimate <= budget
    budget = fixed + kept_graphs + lanczos_bytes(1_700_000, 9)
    assert not plan_search(budget, graph=GRAPH, limit=100, **PLAN).spill  # k + 8 in memory: not spilled

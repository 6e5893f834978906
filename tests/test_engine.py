"""The engine end to end: real stores, real schedulers, the real ``loss`` analyzer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import torch

import ckpt.plugins
import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.engine.worker import TaskSpec
from ckpt.plugins import AnalysisContext, AnalysisError, Analyzer, load_registry
from ckpt.plugins.testing import raise_if_dask_computes, write_example_run
from tests.helpers import invoke_ckpt, registry_with, run_ckpt
from tests.models import mlp, tiny_lm

ROOT = Path(__file__).resolve().parents[1]


def direct_losses(path: Path) -> dict[int, np.ndarray]:
    """Per-example losses computed by hand: load_state_dict + forward + cross_entropy."""
    store = ckptstore.open(path)
    data = store.data("eval")
    inputs = torch.from_numpy(data["inputs"].values)
    targets = torch.from_numpy(data["targets"].values)
    out = {}
    for step in store.steps:
        model = mlp()
        model.load_state_dict(store.tensors(int(step), framework="torch"))
        with torch.no_grad():
            out[int(step)] = torch.nn.functional.cross_entropy(model(inputs), targets, reduction="none").numpy()
    return out


def assert_matches_direct(result, expected: dict[int, np.ndarray]) -> None:
    assert result["step"].values.tolist() == sorted(expected)
    for step, losses in expected.items():
        np.testing.assert_allclose(result["loss"].sel(step=step).values, losses, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(result["mean_loss"].sel(step=step)), losses.mean(), rtol=1e-5)


@pytest.mark.parametrize(
    "engine",
    [{"scheduler": "threads"}, {"scheduler": "sync"}, {"scheduler": "processes", "workers": 2}],
    ids=["threads", "sync", "processes"],
)
def test_loss_equals_direct_computation(mlp_store: Path, engine: dict) -> None:
    result = ckpt.analyze("loss", mlp_store, **engine)
    assert_matches_direct(result, direct_losses(mlp_store))
    assert result["example"].values.tolist() == list(range(50))
    assert (result["position"].values == -1).all()


def test_loss_on_a_local_cluster_and_a_scheduler_address(mlp_store: Path) -> None:
    from distributed import LocalCluster

    expected = direct_losses(mlp_store)
    assert_matches_direct(ckpt.analyze("loss", mlp_store, workers=2, force=True), expected)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert_matches_direct(ckpt.analyze("loss", mlp_store, address=cluster.scheduler_address, force=True), expected)


def test_token_losses_follow_the_mask_in_row_major_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_lm()
    tokens = torch.randint(0, 7, (5, 6))
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[:, 3:] = True
    mask[0, 1] = True
    path = tmp_path / "lm.zarr"
    with ckptstore.create(path, model="tests.models:tiny_lm", objective="token-cross-entropy") as w:
        w.add_data("eval", inputs=tokens, targets=tokens.roll(-1, 1), mask=mask)
        w.write(0, model)
    result = ckpt.analyze("loss", path)
    with torch.no_grad():
        per_token = torch.nn.functional.cross_entropy(
            model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten(), reduction="none"
        ).view(5, 6)
    example, position = np.nonzero(mask.numpy())
    assert result["example"].values.tolist() == example.tolist()
    assert result["position"].values.tolist() == position.tolist()
    np.testing.assert_allclose(result["loss"].sel(step=0).values, per_token.numpy()[example, position], rtol=1e-5)


def test_graphs_are_built_lazily(mlp_store: Path) -> None:
    analyzer = load_registry().analyzers["loss"]()
    store = ckptstore.open(mlp_store)
    with raise_if_dask_computes():  # building the graph computes nothing
        dataset = analyzer.compute(AnalysisContext(store, store.steps, TaskSpec(str(mlp_store)), {}))
    assert all(v.chunks is not None for v in dataset.data_vars.values())
    with raise_if_dask_computes(allowed=1) as counter:
        dataset.compute(scheduler="sync")
    assert counter.count == 1


class EagerNorm(Analyzer):
    name = "eager-norm"
    description = "Computes while building its graph (wrong)."

    def compute(self, ctx: AnalysisContext):
        import xarray as xr

        return xr.Dataset({"norm": ("step", np.ones(len(ctx.steps)))}, coords={"step": ctx.steps})


def test_an_analyzer_that_computes_eagerly_is_refused(mlp_store: Path) -> None:
    registry = registry_with(EagerNorm)
    with pytest.raises(AnalysisError, match="computed 'norm' while building its graph"):
        run("eager-norm", mlp_store, registry=registry)


def test_incremental_after_appending_checkpoints(mlp_store: Path) -> None:
    first = run("loss", mlp_store)
    assert first.computed_steps == [0, 1, 2, 3, 4, 5]
    with ckptstore.open(mlp_store, mode="a") as w:
        for step in (6, 7, 8):
            torch.manual_seed(step)
            w.write(step, mlp())
    second = run("loss", mlp_store)
    assert second.computed_steps == [6, 7, 8], "only the new checkpoints are computed"
    assert second.reused_steps == [0, 1, 2, 3, 4, 5]
    assert_matches_direct(second.dataset, direct_losses(mlp_store))
    assert run("loss", mlp_store).computed_steps == []


def test_changed_options_or_data_recompute(mlp_store: Path) -> None:
    """Other options recompute; so does a change of the split read, and only of that split."""
    run("loss", mlp_store)
    assert run("loss", mlp_store, batch_size=7).computed_steps == [0, 1, 2, 3, 4, 5]
    with ckptstore.open(mlp_store, mode="a") as w:
        w.add_data("extra", inputs=np.zeros((2, 3), np.float32), targets=np.zeros(2, np.int64))
    assert run("loss", mlp_store, batch_size=7).computed_steps == [], "a split it does not read: kept"
    eval_split = ckptstore.open(mlp_store).data("eval")
    with ckptstore.open(mlp_store, mode="a") as w:
        inputs = eval_split["inputs"].values
        w.add_data(
            "eval", inputs=inputs[::-1].copy(), targets=eval_split["targets"].values[::-1].copy(), overwrite=True
        )
    assert run("loss", mlp_store, batch_size=7).computed_steps == [0, 1, 2, 3, 4, 5], "its split replaced: new hash"
    assert run("loss", mlp_store, batch_size=7, force=True).computed_steps == [0, 1, 2, 3, 4, 5]


def test_resume_after_kill_recomputes_nothing_finished(tmp_path: Path) -> None:
    path = write_example_run(tmp_path / "run.zarr", steps=60, examples=2000)
    command = [
        sys.executable,
        "-m",
        "ckpt.cli",
        "analyze",
        "loss",
        str(path),
        "--scheduler",
        "sync",
        "--block-steps",
        "1",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    committed: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        store = ckptstore.open(path)
        if "loss" in store.analyses:
            committed = store.analysis("loss").attrs["ckpt"]["steps"]
            if len(committed) >= 5:
                break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = ckptstore.open(path).analysis("loss").attrs["ckpt"]["steps"]
    assert 5 <= len(partial) < 60, f"the kill should land mid-run (committed {len(partial)} of 60)"
    resumed = run("loss", path)
    assert resumed.reused_steps == partial
    assert resumed.computed_steps == [s for s in range(60) if s not in partial]
    resumed_values = resumed.dataset["loss"].values  # read before --force replaces the stored result
    fresh = run("loss", path, force=True).dataset
    assert fresh["step"].values.tolist() == list(range(60))
    np.testing.assert_array_equal(resumed_values, fresh["loss"].values)


def _bars(stderr: str, name: str) -> dict[int, list[tuple[int, int]]]:
    """(passes done, total) of each ``NAME step S`` progress bar line, by step, in the order printed."""
    bars: dict[int, list[tuple[int, int]]] = {}
    for line in stderr.replace("\r", "\n").splitlines():
        found = re.match(rf"{name} step (\d+):.*?\| *(\d+)/(\d+) \[", line)
        if found:
            bars.setdefault(int(found[1]), []).append((int(found[2]), int(found[3])))
    return bars


def test_an_interrupt_stops_the_tasks_in_flight_and_queued(tmp_path: Path) -> None:
    """Ctrl-C: the running task stops at its next pass and no queued task starts.

    Before, the thread pool ran every task it held before the process could exit
    (the threads beside the computing one, one per core: 16 POLCA checkpoints of 8 s
    each on a 16-core GPU machine).
    """
    path = write_example_run(tmp_path / "run.zarr", steps=8, examples=4000)
    run("random-basis", path, vectors=4)
    command = [sys.executable, "-m", "ckpt.cli", "analyze", "polca", str(path), "--basis", "random-basis"]
    # 200 blocks x 4 vectors: 800 passes a step, each one check for an interrupt
    command += ["--batch-size", "20", "--basis-batch", "1", "--progress", "--block-steps", "8"]
    # SIGINT as a terminal's Ctrl-C finds it: a test run from a background job (`pytest &`, nohup) ignores
    # SIGINT, its children inherit that, and Python installs no KeyboardInterrupt over an ignored signal
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = ""
    # read what is there (the bars end lines with \r), and look only at the new part: a test that fell behind
    # the run's output saw it finish before the interrupt (CI under load)
    while process.poll() is None and not re.search(r"polca step \d+:.*?\| *[1-9]\d*/\d+ \[", seen[-4096:]):
        seen += os.read(process.stderr.fileno(), 65536).decode(errors="replace")
    assert process.poll() is None, "the run ended before a pass was seen"
    started = set(_bars(seen, "polca"))
    process.send_signal(signal.SIGINT)
    rest = process.stderr.read().decode(errors="replace")
    assert process.wait(timeout=120) == 130, rest[-500:]
    assert "Error: interrupted; the store keeps what was committed" in rest and "Traceback" not in rest, rest[-500:]
    bars = _bars(seen + rest, "polca")
    assert set(bars) == started, f"steps {sorted(set(bars) - started)} began after the interrupt"
    finished = [step for step, lines in bars.items() if lines[-1][0] == lines[-1][1]]
    assert finished == [], f"steps {finished} ran all their passes after the interrupt"
    assert invoke_ckpt("verify", str(path)).returncode == 0
    assert "polca" not in ckptstore.open(path).analyses, "a block of 8 steps: nothing was committed"
    assert run("polca", path, basis="random-basis").reused_steps == []


def test_a_worker_makes_a_cached_value_once_however_many_threads_ask(tmp_path: Path) -> None:
    """Threads asking at once for the same value (a run's start: the basis, the first checkpoint) share one make."""
    import threading

    from ckpt.engine.worker import worker_for

    worker = worker_for(TaskSpec(str(write_example_run(tmp_path / "run.zarr"))))
    calls: list[int] = []
    start = threading.Barrier(8)

    def slow_read() -> object:
        calls.append(1)
        time.sleep(0.3)  # longer than the threads take to reach the cache
        if len(calls) == 1:
            raise OSError("the first read fails")  # the threads waiting for it make it again, once
        return object()

    def ask(results: list, make: Callable[[], object]) -> None:
        start.wait()
        try:
            results.append(make())
        except OSError as exc:
            results.append(exc)

    for make in (lambda: worker.cached("basis", slow_read), lambda: worker.recent("terms", slow_read, keep=2)):
        calls.clear()
        results: list = []
        threads = [threading.Thread(target=ask, args=(results, make)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        values = [r for r in results if not isinstance(r, OSError)]
        assert len(calls) == 2, f"{len(calls)} makes for 8 threads"
        assert len(values) == 7 and len({id(v) for v in values}) == 1
        assert make() is values[0], "kept"


def test_a_run_leaves_no_worker_behind_in_its_process(mlp_store: Path) -> None:
    """A run's worker, with the checkpoints, data and models it cached (device memory on a GPU), ends with it.

    Each run measures its default budget when it starts, so nearly every run has a spec, and a
    worker, of its own: four in-process runs used to leave four workers behind, each holding its
    last two checkpoints.
    """
    import gc

    from ckpt.engine.worker import Worker

    def workers_of_the_store() -> list[Worker]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, Worker) and o.spec.store == str(mlp_store)]

    for options in ({}, {"scheduler": "sync"}, {"max_memory": "1GiB"}):
        ckpt.analyze("grad-norms", mlp_store, force=True, **options)
        assert workers_of_the_store() == [], options
    with pytest.raises(AnalysisError, match="needs at least"):  # a run that fails lets its worker go too
        ckpt.analyze("hessian-basis", mlp_store, max_memory="1KiB")
    assert workers_of_the_store() == []


def test_a_worker_keeps_one_model_per_thread(mlp_store: Path) -> None:
    """A functional call swaps a module's parameters, so threads never share a model; one thread reuses its own."""
    import threading

    from ckpt.engine.worker import Worker

    worker = Worker(TaskSpec(str(mlp_store)))
    mine = worker.model
    theirs: list[Any] = []
    thread = threading.Thread(target=lambda: theirs.append(worker.model))
    thread.start()
    thread.join()
    assert worker.model is mine and theirs[0] is not mine
    assert worker.model_for(torch.float64) is not mine


def test_a_gpu_out_of_memory_error_says_which_process_holds_the_device() -> None:
    """The Error line keeps torch's whole sentences: the H200's said "this proces" and stopped.

    The message up to "Including non-PyTorch memory" is the one bench/scale.py's hessian-basis
    printed on an H200 (the third lent session); the rest follows torch's format, its figures made up.
    """
    from ckpt.engine.pipeline import _out_of_memory

    torch_message = (
        "CUDA out of memory. Tried to allocate 46.10 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
        "11.08 GiB is free. Process 971 has 77.07 GiB memory in use. Including non-PyTorch memory, this process "
        "has 51.62 GiB memory in use. Of the allocated memory 50.12 GiB is allocated by PyTorch, and 1.01 GiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    with pytest.raises(AnalysisError) as caught, _out_of_memory({"max_memory": 111 * 2**30}, "hessian-basis", []):
        raise torch.OutOfMemoryError(torch_message)
    message = str(caught.value)
    assert message.startswith("hessian-basis ran out of memory: CUDA out of memory. Tried to allocate 46.10 GiB.")
    holders = "Process 971 has 77.07 GiB memory in use. Including non-PyTorch memory, this process has 51.62 GiB"
    assert holders in message
    assert "in use; nothing was committed. Give the run less with --max-memory (this run's budget: 111 GiB)" in message


def test_a_run_on_threads_never_imports_distributed(mlp_store: Path) -> None:
    """Given the scheduler's name, or none, dask imports distributed to look for a client (0.28 s a run)."""
    code = (
        "import sys, ckpt; ckpt.analyze('loss', sys.argv[1], force=True, progress=False); "
        "print('distributed' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(mlp_store)], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"], done.stderr


def test_threads_on_a_gpu_read_one_checkpoint_ahead_not_one_per_core() -> None:
    """On a GPU one computation runs at a time; more threads would only hold more checkpoints on it."""
    import os

    from ckpt.engine.pipeline import compute_settings, parallel_tasks

    with compute_settings("threads", device="cuda") as (settings, count):
        assert settings["num_workers"] == count == 2
    assert parallel_tasks("threads", None, None, "cuda") == 1, "the memory budget is the one computation's"
    with compute_settings("threads", device="cpu") as (settings, count):
        assert settings["num_workers"] == count == os.cpu_count()


def test_the_provenance_accessor_reads_what_the_engine_stored(mlp_store: Path) -> None:
    result = ckpt.analyze("loss", mlp_store, split="eval", batch_size=7)
    record = result.attrs["ckpt"]
    assert result.ckpt.provenance == record
    assert result.ckpt.analyzer == "loss" == record["analyzer"]
    assert result.ckpt.version == record["version"]
    assert result.ckpt.options == record["options"]
    assert result.ckpt.option("batch_size") == 7
    assert result.ckpt.option("no-such-option", "absent") == "absent"
    assert result.ckpt.steps == result["step"].values.tolist() == ckptstore.open(mlp_store).steps.tolist()
    assert result.ckpt.created == record["created"]
    assert result.ckpt.computed_by == f"ckpt {ckpt.__version__}"
    assert result.ckpt.requires == {}
    bare = result.drop_attrs()
    assert bare.ckpt.provenance == {} and bare.ckpt.options == {} and bare.ckpt.steps == []
    assert bare.ckpt.computed_by is None


def test_stored_results_are_read_without_importing_analyzers(mlp_store: Path) -> None:
    ckpt.analyze("loss", mlp_store)
    code = (
        "import sys, ckpt; r = ckpt.open(sys.argv[1]).analysis('loss'); "
        "layers = ('ckpt.plugins', 'ckpt.engine', 'ckpt.numerics', 'ckpt.analyzers'); "
        "print(r['loss'].shape, r.ckpt.analyzer, any(m.startswith(layers) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(mlp_store)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["(6,", "50)", "loss", "False"]
    plain = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import sys, xarray as xr; print(xr.open_zarr(sys.argv[1], group='analyses/loss')['loss'].shape)",
            str(mlp_store),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert plain.stdout.strip() == "(6, 50)"


def test_dependency_cycles_and_unknown_names_are_errors(mlp_store: Path) -> None:
    with pytest.raises(AnalysisError, match=r"unknown analyzer 'nope'; registered analyzers: .*, loss, loss-spikes"):
        run("nope", mlp_store)
    with pytest.raises(AnalysisError, match="analyzer 'loss' has no option 'splt'; its options are: split"):
        run("loss", mlp_store, splt="eval")
    with pytest.raises(AnalysisError, match="option 'batch_size' of analyzer 'loss' must be int"):
        run("loss", mlp_store, batch_size="many")


def test_cli_analyze_and_show(mlp_store: Path) -> None:
    result = invoke_ckpt("analyze", "loss", str(mlp_store), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "loss: computed 6 step(s), reused 0 stored" in result.stdout
    again = invoke_ckpt("analyze", "loss", str(mlp_store), "--no-progress")
    assert "loss: computed 0 step(s), reused 6 stored" in again.stdout
    shown = invoke_ckpt("show", str(mlp_store), "loss")
    assert shown.returncode == 0, shown.stderr
    assert "analyzer     loss v1" in shown.stdout
    assert "50 datapoints, 6 checkpoints" in shown.stdout
    listed = invoke_ckpt("analyze", "--help")
    assert re.search(r"\n  loss +Exact loss of every datapoint", listed.stdout), listed.stdout


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["analyze", "nope", "{store}"], "unknown analyzer 'nope'; registered analyzers:", 2),
        (["analyze", "loss", "{store}", "--bogus", "1"], "No such option '--bogus'", 2),
        (["analyze", "loss", "{store}", "--batch-size", "x"], "'x' is not a valid integer", 2),
        (["analyze", "loss", "{store}", "--split", "train"], "no data split 'train'", 1),
        (["analyze", "loss", "{store}", "--scheduler", "gpu"], "Invalid value for '--scheduler'", 2),
        (["analyze", "loss", "{store}", "--workers", "0"], "Invalid value for '--workers'", 2),
        (["analyze", "loss", "{store}", "--objective", "hinge"], "unknown objective 'hinge'", 1),
        (["show", "{store}", "loss"], "no analysis 'loss'", 1),
        (["analyze", "loss", "/no/such/store.zarr"], "the path does not exist", 1),
    ],
)
def test_cli_analyze_errors(mlp_store: Path, args: list[str], message: str, code: int) -> None:
    from tests.helpers import tree_digest

    before = tree_digest(mlp_store)
    result = run_ckpt(*[a.format(store=mlp_store) for a in args])
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert tree_digest(mlp_store) == before


def test_dask_and_zarr_are_not_left_configured(mlp_store: Path) -> None:
    import zarr

    default_pipeline = zarr.config.get("codec_pipeline.path")
    ckpt.analyze("loss", mlp_store, scheduler="processes", workers=1)
    ckpt.analyze("loss", mlp_store, scheduler="threads", force=True)
    assert dask.config.get("scheduler", None) is None
    assert zarr.config.get("codec_pipeline.path") == default_pipeline, "zarrs must be set per array, not globally"


class LossChange(Analyzer):
    """Per-datapoint loss change between consecutive checkpoints, from the stored `loss` result."""

    name = "loss-change-test"
    description = "Loss change per transition (test analyzer built on `loss`)."
    requires = ("loss",)
    per = "pair"

    def compute(self, ctx: AnalysisContext):
        import xarray as xr

        loss = ctx.result("loss")["loss"]
        after = loss.sel(step=[ctx.next_step(s) for s in ctx.steps]).data
        before = loss.sel(step=ctx.steps).data
        return xr.Dataset({"change": (("step", "datapoint"), after - before)}, coords={"step": ctx.steps})


def test_requirements_run_first_and_pairs_grow_incrementally(mlp_store: Path) -> None:
    registry = registry_with(LossChange)
    report = run("loss-change-test", mlp_store, registry=registry)
    assert [d.name for d in report.dependencies] == ["loss"]
    assert report.dependencies[0].computed_steps == [0, 1, 2, 3, 4, 5]
    assert report.computed_steps == [0, 1, 2, 3, 4], "one row per transition, at its first step"
    expected = direct_losses(mlp_store)
    np.testing.assert_allclose(report.dataset["change"].sel(step=2).values, expected[3] - expected[2], rtol=1e-5)
    with ckptstore.open(mlp_store, mode="a") as w:
        torch.manual_seed(6)
        w.write(6, mlp())
    again = run("loss-change-test", mlp_store, registry=registry)
    assert again.dependencies[0].computed_steps == [6]
    assert again.computed_steps == [5], "only the new transition 5 -> 6"
    expected = direct_losses(mlp_store)
    np.testing.assert_allclose(again.dataset["change"].sel(step=5).values, expected[6] - expected[5], rtol=1e-5)


def per_row_norm(worker: Any, step: int, *, steps: int) -> dict[str, np.ndarray]:
    """A task whose keyword ``steps`` collides with ``map_checkpoints(steps=...)``."""
    return {"norm": np.zeros(steps)}


def three_zeros(worker: Any, step: int) -> dict[str, np.ndarray]:
    return {"norm": np.zeros(3)}


def needs_width(worker: Any, step: int, *, width: int) -> dict[str, np.ndarray]:
    return {"norm": np.zeros(width)}


class Misdeclared(ckpt.plugins.Analyzer):
    """What a plugin author gets wrong first: a dim without its size, a keyword taken by the engine."""

    name = "misdeclared"
    description = "d"
    mistake = ckpt.plugins.Option(str, "sizes", "which mistake")

    def compute(self, ctx: ckpt.plugins.AnalysisContext) -> Any:
        if self.mistake == "sizes":
            return ctx.map_checkpoints(three_zeros, {"norm": (("i",), np.float64)})
        if self.mistake == "keyword":
            return ctx.map_checkpoints(per_row_norm, {"norm": (("i",), np.float64)}, sizes={"i": 3}, steps=ctx.steps)
        if self.mistake == "missing":
            return ctx.map_checkpoints(needs_width, {"norm": (("i",), np.float64)}, sizes={"i": 3})
        return ctx.map_pairs(per_row_norm, {"norm": (("i",), np.float64)}, sizes={"i": 3})


class MisdeclaredPlugin:
    @ckpt.plugins.hookimpl
    def ckpt_register_analyzers(self, register) -> None:
        register(Misdeclared)


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        ("sizes", "analyzer 'misdeclared': output 'norm' has dim 'i' of unknown length; pass sizes={'i': LENGTH}"),
        ("keyword", "takes keyword 'steps', which map_checkpoints keeps as its own argument"),
        ("missing", "of analyzer 'misdeclared' needs keyword 'width': pass width=... to map_checkpoints"),
        ("pairs", "takes keyword 'steps', which map_pairs keeps as its own argument"),
    ],
)
def test_an_analyzers_own_declaration_mistakes_name_it_and_the_fix(mlp_store: Path, mistake: str, message: str) -> None:
    registry = load_registry(extra=[MisdeclaredPlugin()])
    with pytest.raises(AnalysisError) as caught:
        run("misdeclared", mlp_store, registry=registry, mistake=mistake)
    assert message in str(caught.value)
    assert "misdeclared" not in ckptstore.open(mlp_store).analyses


def named_like_the_helpers(worker, *steps: int, fn: str, outputs: int) -> dict[str, np.ndarray]:
    """A task whose keywords are named like map_checkpoints' positional arguments."""
    return {"value": np.array(float(len(fn) + outputs))}


class HelperNames(ckpt.plugins.Analyzer):
    name = "helper-names"
    description = "d"
    per = "pair"

    def compute(self, ctx: ckpt.plugins.AnalysisContext) -> Any:
        pairs = ctx.map_pairs(named_like_the_helpers, {"value": ((), np.float64)}, fn="ab", outputs=1)
        checkpoints = ctx.map_checkpoints(named_like_the_helpers, {"value": ((), np.float64)}, fn="abc", outputs=1)
        return pairs + checkpoints


def test_task_keywords_named_fn_or_outputs_reach_the_task(mlp_store: Path) -> None:
    """``fn`` and ``outputs`` are positional-only: they were a raw TypeError naming no analyzer."""
    hook = ckpt.plugins.hookimpl(lambda register: register(HelperNames))
    registry = load_registry(extra=[types.SimpleNamespace(ckpt_register_analyzers=hook)])
    run("helper-names", mlp_store, registry=registry)
    result = ckptstore.open(mlp_store).analysis("helper-names")
    assert result["value"].values.tolist() == [7.0] * result.sizes["step"]


def test_the_context_names_the_previous_and_first_checkpoints(mlp_store: Path) -> None:
    from ckpt.engine.worker import TaskSpec

    context = ckpt.plugins.AnalysisContext(ckptstore.open(mlp_store), [2, 3], TaskSpec(str(mlp_store)), {})
    assert [context.previous_step(s) for s in (0, 1, 5)] == [None, 0, 4]
    assert context.first_step == 0 and context.next_step(3) == 4


def test_a_weights_only_result_survives_new_data(mlp_store: Path) -> None:
    """A result is kept when a split it does not read is added (random-basis reads none); it was recomputed."""
    kept = {"random-basis": {"vectors": 3}, "grad-norms": {"split": "eval"}, "hessian-basis": {"hessian_split": "eval"}}
    for name, options in kept.items():
        assert run(name, mlp_store, **options).computed_steps
    with ckptstore.open(mlp_store, mode="a") as w:
        w.add_data("train", inputs=np.zeros((4, 3), np.float32), targets=np.zeros(4, np.int64))
    for name, options in kept.items():
        assert run(name, mlp_store, **options).computed_steps == [], name
    # hessian-basis without --hessian-split now takes the new train split: its data changed, so it recomputes
    assert run("hessian-basis", mlp_store).computed_steps

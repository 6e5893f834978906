"""``ckpt analyze NAME STORE --follow``: a follower beside a real writer in another process.

The writer (:data:`WRITER`, run with this interpreter) creates a seeded store through the public
``ckpt.create`` API, commits one checkpoint, waits until the follower has computed it (its
result is in the store; tests/test_watch.py uses it too), then commits the rest with pauses,
and closes the store. The follower is the ``ckpt`` command in its own process. What each test
checks: every checkpoint computed, each exactly once (the result's steps and the lines on
stderr), and how the follower stops.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt
import ckpt.errors
import ckpt.plugins
from ckpt.engine.waiting import RecordWatch, parse_duration
from ckpt.errors import AnalysisError
from tests.helpers import CKPT, run_ckpt, s3_server

WRITER = """
import os, sys, time
import torch
import ckpt
import ckpt.errors
import ckpt.plugins
from ckpt.plugins.examples import mlp

path, count, pause, close = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "close"
# the result that says the follower has started ("-": none), in the store after step 0 ("NAME@STEP": after STEP)
first, _, after = (sys.argv[5] if len(sys.argv) > 5 else "loss").partition("@")
torch.manual_seed(0)
model = mlp()
inputs, targets = torch.randn(20, 3), torch.randint(0, 4, (20,))
writer = ckpt.create(path, model="ckpt.plugins.examples:mlp", objective="cross-entropy")
writer.add_data("eval", inputs=inputs, targets=targets)
for step in range(count):
    if step:
        time.sleep(pause)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01)
    writer.write(step, model)
    deadline = time.monotonic() + 60
    while step == int(after or 0) and first != "-" and first not in ckpt.open(path).analyses:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the follower computed what is there: the rest arrive while it follows
if close:
    writer.close()
else:
    os._exit(0)  # a writer that never closes the store (killed, or still training)
"""


def _command() -> list[str]:
    return [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]


def _start(
    tmp_path: Path,
    *args: str,
    until_idle: str | None = "4s",
    url: str | None = None,
    env: dict[str, str] | None = None,
    analyze: tuple[str, ...] = ("loss",),
) -> tuple[subprocess.Popen[str], subprocess.Popen[str], Path]:
    """A writer (``count pause close|open``) and a follower of its store, both started; the store's path."""
    writer, store = _writer(tmp_path, *args, url=url, env=env)
    follower = subprocess.Popen(
        [*_command(), "analyze", analyze[0], url or str(store), "--follow", "--no-progress", *analyze[1:]]
        + (["--until-idle", until_idle] if until_idle else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    return writer, follower, store


def _writer(
    tmp_path: Path, *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """The writer (``count pause close|open [first]``), started; returns once its store exists."""
    store = tmp_path / "live.zarr"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    writer = subprocess.Popen([sys.executable, str(script), url or str(store), *args], text=True, env=env)
    deadline = time.monotonic() + 60
    while not _exists(url or str(store)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return writer, store


def _followed(
    tmp_path: Path, *args: str, until_idle: str | None = None, analyze: tuple[str, ...] = ("loss",)
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A writer started (as :func:`_start`) and a follower of its store run to its end; its outcome, the store.

    The follower runs through tests/helpers.py's ``run_ckpt``: a process of its own, forked after
    the third-party imports. The writer is checked to have exited 0.
    """
    writer, store = _writer(tmp_path, *args)
    try:
        done = run_ckpt(
            "analyze",
            analyze[0],
            str(store),
            "--follow",
            "--no-progress",
            *analyze[1:],
            *(["--until-idle", until_idle] if until_idle else []),
        )
    except BaseException:
        writer.kill()
        raise
    if done.returncode != 0:
        writer.kill()  # the follower failed: the writer would wait for its first result
    assert done.returncode == 0, done.stderr
    assert writer.wait(timeout=60) == 0
    return done, store


def _exists(where: str) -> bool:
    try:
        ckpt.open(where)
    except ckpt.errors.CkptError:
        return False
    return True


def _computed(stderr: str) -> list[int]:
    return [int(s) for s in re.findall(r"^loss: step (\d+) computed$", stderr, flags=re.M)]


@pytest.mark.slow  # several seconds on its own: CI runs it, the quick suite does not
def test_a_follower_computes_each_checkpoint_once_as_it_is_committed(tmp_path: Path) -> None:
    done, store = _followed(tmp_path, "4", "0.3", "open", until_idle="2s")
    assert "Error" not in done.stderr
    assert _computed(done.stderr) == [0, 1, 2, 3]  # one line per checkpoint, each once, in order
    result = ckpt.open(store).analysis("loss")
    assert result["step"].values.tolist() == [0, 1, 2, 3]
    assert "until idle for 2s; computed 4 step(s)" in done.stdout


def test_a_follower_stops_when_the_writer_closes_the_store(tmp_path: Path) -> None:
    done, store = _followed(tmp_path, "4", "0.3", "close")
    assert _computed(done.stderr) == [0, 1, 2, 3]  # the last checkpoints computed before it stops
    assert "until the run is finished; computed 4 step(s)" in done.stdout
    assert ckpt.open(store).analysis("loss")["step"].values.tolist() == [0, 1, 2, 3]


@contextlib.contextmanager
def on_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A local S3 server (skipped without s3fs and moto) whose environment this process and its children use."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    with s3_server() as env:
        for key, value in env.items():  # this process's ckpt.open of the URL, too
            monkeypatch.setenv(key, value)
        # fsspec keeps one S3FileSystem per set of arguments: one made for an earlier server
        # in this process would still point at that server's (closed) port
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            yield env
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow  # starts a local S3 server
def test_a_follower_of_an_s3_store_polls_and_stops_when_it_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with on_s3(monkeypatch) as env:
        url = "s3://runs/live.zarr"
        writer, follower, _ = _start(tmp_path, "4", "0.5", "close", until_idle=None, url=url, env=env)
        stdout, stderr = follower.communicate(timeout=120)
        assert writer.wait(timeout=60) == 0
        assert follower.returncode == 0, stderr
        assert _computed(stderr) == [0, 1, 2, 3]
        assert "until the run is finished" in stdout
        assert ckpt.open(url).analysis("loss")["step"].values.tolist() == [0, 1, 2, 3]


def test_a_per_run_analyzer_is_recomputed_while_following_and_once_at_the_end(tmp_path: Path) -> None:
    done, store = _followed(tmp_path, "4", "0.6", "close", "grad-norms", analyze=("loss-spikes", "--rerun-every", "1s"))
    stderr = done.stderr
    steps = [int(s) for s in re.findall(r"^grad-norms: step (\d+) computed$", stderr, flags=re.M)]
    assert steps == [0, 1, 2, 3]  # its requirement follows along, each checkpoint once
    runs = re.findall(r"^loss-spikes: recomputed over (\d+) checkpoint\(s\)", stderr, flags=re.M)
    assert len(runs) >= 2  # at the start, then again (at most once a second), and at the end
    assert runs[-1] == "4"
    assert int(runs[0]) < 4
    result = ckpt.open(store).analysis("loss-spikes")
    assert result.ckpt.steps == [0, 1, 2, 3]


def _recomputed_over(name: str, stderr: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^{name}: recomputed over (\d+) checkpoint\(s\)", stderr, flags=re.M)]


@pytest.mark.slow  # several seconds on its own: CI runs it, the quick suite does not
def test_hessian_basis_is_recomputed_at_its_basis_checkpoints_and_at_the_end(tmp_path: Path) -> None:
    from ckpt.numerics.basis_format import FOUND_AT

    basis = ("hessian-basis", "--every", "3", "--rerun-every", "50ms")  # basis checkpoints 0 and 3
    done, store = _followed(tmp_path, "5", "0.6", "close", "hessian-basis", analyze=basis)
    stderr = done.stderr
    runs = _recomputed_over("hessian-basis", stderr)  # each run covers the steps 0 .. N-1 committed then
    assert runs[-1] == 5, stderr  # once more at the end: step 4 is not a basis checkpoint
    for before, after in itertools.pairwise(runs[:-1]):  # the cadence (50ms) never decides
        assert any(step % 3 == 0 for step in range(before, after)), runs  # a basis checkpoint came
    assert 2 <= len(runs) <= 3, runs
    followed = ckpt.open(store).analysis("hessian-basis").load()
    assert followed.ckpt.steps == [0, 1, 2, 3, 4]
    again = ckpt.analyze("hessian-basis", store, every=3, force=True, scheduler="sync")
    assert followed[FOUND_AT].values.tolist() == again[FOUND_AT].values.tolist() == [0, 3]
    np.testing.assert_array_equal(followed["eigenvalue"].values, again["eigenvalue"].values)


@pytest.mark.slow  # a basis and its pairs recomputed over six checkpoints as they come
def test_polca_follows_its_basis_schedule_and_ends_as_a_plain_run(tmp_path: Path) -> None:
    import xarray as xr

    polca = ("polca", "--every", "3", "--rerun-every", "50ms")  # its basis grows at steps 0 and 3
    done, store = _followed(tmp_path, "6", "0.6", "close", "polca@1", analyze=polca)
    assert "Error" not in done.stderr
    runs = _recomputed_over("hessian-basis", done.stderr)  # with polca, whole, each time
    assert runs[0] == 2 and runs[-1] == 6, runs  # from the first pair on, and once more at the end
    for before, after in itertools.pairwise(runs[:-1]):  # never at each checkpoint, nor at the cadence
        assert any(step % 3 == 0 for step in range(before, after)), runs  # a basis checkpoint came
    followed = ckpt.open(store).analysis("polca").load()
    assert followed["step"].values.tolist() == [0, 1, 2, 3, 4]
    again = plain_run(store, "polca", tmp_path / "plain.zarr")
    xr.testing.assert_identical(followed.drop_attrs(), again.drop_attrs())


def test_a_pair_analyzer_followed_until_the_end_of_a_one_checkpoint_run_says_so(tmp_path: Path) -> None:
    from ckpt.engine.follow import follow
    from ckpt.plugins.examples import write_example_run

    store = write_example_run(tmp_path / "run.zarr", 1)
    with pytest.raises(AnalysisError, match=r"polca compares pairs of consecutive checkpoints and .* has 1"):
        follow("polca", store, until_idle=0.5, progress=False)
    assert "polca" not in ckpt.open(store).analyses
    plain = run_ckpt("analyze", "polca", str(store), "--no-progress")  # refused before its basis is computed
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines() == [
        f"Error: polca compares pairs of consecutive checkpoints and {store} has 1: run it once the store "
        "holds two or more"
    ]
    assert ckpt.open(store).analyses == []


def test_what_a_follower_recomputes_whole_and_which_checkpoints_change_it() -> None:
    from ckpt.engine.follow import schedule
    from ckpt.plugins import load_registry

    registry = load_registry()
    for name, options, basis_steps in (
        ("hessian-basis", {"every": 3}, [0, 3]),
        ("hessian-basis", {"at_steps": "1, 4"}, [1, 4]),
        ("hessian-basis", {}, [0, 1, 2, 3, 4, 5]),
        ("polca", {"every": 2}, [0, 2, 4]),  # whole with its basis, when the basis grows
    ):
        whole, changes = schedule(name, options, registry)
        assert whole and changes is not None, name
        assert [step for step in range(6) if changes(step)] == basis_steps, (name, options)
    assert schedule("loss-spikes", {}, registry) == (True, None)  # the cadence decides
    assert schedule("polca", {"basis": "random-basis"}, registry) == (True, None)
    assert schedule("loss", {}, registry) == (False, None)  # each checkpoint as it comes
    assert schedule("no-such-analyzer", {}, registry) == (False, None)  # its run says what is wrong


@contextlib.contextmanager
def dask_cluster() -> Iterator[Any]:
    """A real ``distributed`` cluster, its scheduler and one worker in this process, on TCP (a follower connects)."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, protocol="tcp", dashboard_address=None
    ) as cluster:
        yield cluster


def plain_run(store: Path, name: str, copy: Path) -> Any:
    """``name`` computed by a plain ``ckpt.analyze`` on a copy of ``store`` (its result there, loaded)."""
    import shutil

    shutil.copytree(store, copy)
    return ckpt.analyze(name, copy, force=True, scheduler="sync").load()


def test_a_follower_on_a_dask_cluster_computes_what_a_plain_run_does(tmp_path: Path) -> None:
    import xarray as xr

    with dask_cluster() as cluster:
        done, store = _followed(tmp_path, "3", "0.3", "close", analyze=("loss", "--address", cluster.scheduler_address))
        assert cluster.scheduler.transition_counter > 0  # the follower's tasks ran on the cluster
    assert _computed(done.stderr) == [0, 1, 2]
    followed = ckpt.open(store).analysis("loss").load()
    xr.testing.assert_identical(followed.drop_attrs(), plain_run(store, "loss", tmp_path / "plain.zarr").drop_attrs())


def test_the_commit_record_says_whether_a_run_is_finished(tmp_path: Path) -> None:
    from ckpt.plugins.examples import mlp

    path = tmp_path / "run.zarr"
    writer = ckpt.create(path)
    writer.write(0, mlp())
    assert ckpt.open(path).finished is False
    assert "run          open" in run_ckpt("info", str(path), "--no-finite-check").stdout
    writer.close()
    assert ckpt.open(path).finished is True
    shown = run_ckpt("info", str(path), "--no-finite-check")
    assert "run          finished" in shown.stdout, shown.stderr
    with ckpt.open(path, mode="a") as appending:  # reopened: open again until it is closed
        assert ckpt.open(path).finished is False
        appending.write(1, mlp())
    assert ckpt.open(path).finished is True
    record = json.loads((path / "zarr.json").read_text())
    record["attributes"]["ckpt"].pop("finished")  # a store written before the mark
    (path / "zarr.json").write_text(json.dumps(record))
    assert ckpt.open(path).finished is None
    assert "run          unknown" in run_ckpt("info", str(path), "--no-finite-check").stdout


def test_attaching_data_keeps_the_state_of_the_run_it_found(tmp_path: Path) -> None:
    """``ckpt data add`` on a killed run leaves it open (a follower keeps waiting); a finished run stays finished."""
    from ckpt.plugins.examples import mlp, write_example_run

    killed = tmp_path / "killed.zarr"
    training = (
        "import os, signal, ckpt\n"
        "from ckpt.plugins.examples import mlp\n"
        f"writer = ckpt.create({str(killed)!r})\n"
        "writer.write(0, mlp())\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    died = subprocess.run([sys.executable, "-c", training], check=False, capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr
    inputs = tmp_path / "inputs.npy"
    np.save(inputs, np.zeros((4, 3), dtype=np.float32))
    finished = write_example_run(tmp_path / "finished.zarr", 1)
    for path, state in ((killed, False), (finished, True)):
        assert ckpt.open(path).finished is state
        added = run_ckpt("data", "add", str(path), "probe", "--inputs", str(inputs))
        assert added.returncode == 0, added.stderr
        assert "probe" in ckpt.open(path).splits
        assert ckpt.open(path).finished is state, path.name
    with ckpt.open(killed, mode="a") as resumed:  # training resumed: its close ends the run
        resumed.write(1, mlp())
    assert ckpt.open(killed).finished is True


def test_a_finished_mark_that_is_not_a_bool_is_refused(tmp_path: Path) -> None:
    from ckpt.errors import StoreError
    from ckpt.plugins.examples import mlp

    path = tmp_path / "run.zarr"
    with ckpt.create(path) as writer:
        writer.write(0, mlp())
    record = json.loads((path / "zarr.json").read_text())
    record["attributes"]["ckpt"]["finished"] = "yes"
    (path / "zarr.json").write_text(json.dumps(record))
    with pytest.raises(StoreError, match="finished"):
        ckpt.open(path)


def interrupted(follower: subprocess.Popen[str], writer: subprocess.Popen[str], enough: Callable[[str], bool]) -> str:
    """Ctrl-C (SIGINT) to ``follower`` once its stderr so far is ``enough``, then the writer killed; that stderr.

    The follower must exit 130 with ``Error: interrupted`` as its last line.
    """
    lines: list[str] = []
    assert follower.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(follower.stderr or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not enough("".join(lines)) and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=60) == 130
    reader.join(timeout=10)
    writer.kill()
    writer.wait(timeout=60)
    stderr = "".join(lines)
    assert stderr.strip().splitlines()[-1].startswith("Error: interrupted"), stderr
    return stderr


def test_ctrl_c_keeps_the_committed_steps_and_exits_130(tmp_path: Path) -> None:
    writer, follower, store = _start(tmp_path, "200", "0.3", "open")
    stderr = interrupted(follower, writer, lambda stderr: len(_computed(stderr)) >= 3)
    printed = _computed(stderr)
    kept = ckpt.open(store).analysis("loss")["step"].values.tolist()
    assert len(printed) >= 3
    assert kept == printed  # what it said it computed is committed, nothing more, nothing twice


def test_until_idle_and_rerun_every_need_follow_and_a_duration(tmp_path: Path) -> None:
    from ckpt.plugins.examples import write_example_run

    store = str(write_example_run(tmp_path / "run.zarr", 2))
    other = str(write_example_run(tmp_path / "other.zarr", 1))
    for args, expected in (
        ([store, "--until-idle", "3s"], "--until-idle is an option of --follow"),
        ([store, "--follow", "--until-idle", "soon"], "--until-idle must be a duration such as 30s"),
        ([store, "--follow", "--rerun-every", "0s"], "--rerun-every must be a positive duration"),
        ([store, other, "--follow"], "--follow follows one store, got 2"),
    ):
        done = run_ckpt("analyze", "loss", *args)
        assert done.returncode != 0
        assert done.stderr.count("Error:") == 1 and expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert "loss" not in ckpt.open(store).analyses  # refused before anything ran
    assert "loss" not in ckpt.open(other).analyses


def test_force_recomputes_what_was_stored_once_not_each_new_checkpoint(tmp_path: Path) -> None:
    from ckpt.engine.follow import follow
    from ckpt.plugins.examples import write_example_run

    store = write_example_run(tmp_path / "run.zarr", 3)
    ckpt.analyze("loss", store)
    writer = ckpt.open(store, mode="a")  # the run grows again: one checkpoint after the first run
    reports: list[Any] = []

    def grow(report: Any) -> None:
        reports.append(report)
        if len(reports) == 1:
            writer.write(3, ckpt.open(store).tensors(2))
        else:
            writer.close()

    done = follow("loss", store, until_idle=30, force=True, on_report=grow)
    assert done.stopped == "finished"
    assert [r.computed_steps for r in reports] == [[0, 1, 2], [3]]


def test_a_result_another_process_computes_is_waited_for(tmp_path: Path) -> None:
    from ckpt.engine.follow import follow
    from ckpt.plugins.examples import write_example_run
    from ckpt.store.result_locks import result_lock

    store = write_example_run(tmp_path / "run.zarr", 2)
    with result_lock(store, "loss"):  # what a `ckpt analyze loss` in another process holds
        releases = time.monotonic() + 1.0
        done = None

        def in_thread() -> None:
            nonlocal done
            done = follow("loss", store, until_idle=30)

        follower = threading.Thread(target=in_thread)
        follower.start()
        time.sleep(max(0.0, releases - time.monotonic()))
    follower.join(timeout=60)
    assert done is not None
    assert done.stopped == "finished"
    assert done.computed_steps == [0, 1]


def test_durations() -> None:
    assert parse_duration("500ms", "x") == 0.5
    assert parse_duration("2m", "x") == 120.0
    assert parse_duration(3, "x") == 3.0
    for bad in ("", "-1s", "1 day", "inf", True):
        with pytest.raises(AnalysisError, match="x must be a"):
            parse_duration(bad, "x")


@pytest.mark.parametrize("where", ["local-notify", "local-poll", "memory"])
def test_a_watch_wakes_on_a_commit_and_not_before(tmp_path: Path, where: str) -> None:
    from ckpt.plugins.examples import mlp

    path = f"memory://watch-{os.getpid()}.zarr" if where == "memory" else str(tmp_path / "run.zarr")
    writer = ckpt.create(path)
    writer.write(0, mlp())
    watch = RecordWatch(path, notify=where == "local-notify", fastest=0.05, slowest=0.2)
    assert watch.notified == (where == "local-notify")
    try:
        assert not watch.wait(0.5)  # nothing committed: it times out
        timer = threading.Timer(0.3, lambda: writer.write(1, mlp()))
        timer.start()
        started = time.monotonic()
        assert watch.wait(10)
        assert 0.2 < time.monotonic() - started < 5
        timer.join()
        assert not watch.wait(0.3)  # the change is seen once
    finally:
        watch.close()
        writer.close()


class _Appending(ckpt.plugins.Analyzer):
    """One value per checkpoint; computing step 0 commits a new checkpoint (a writer racing the run)."""

    name = "appending-test"
    description = "A per-checkpoint value whose computation lets a writer commit a checkpoint."
    writer: Any = None

    def compute(self, ctx: Any) -> Any:
        import dask
        import dask.array as da
        import xarray as xr

        def value(step: int) -> Any:
            writer, _Appending.writer = _Appending.writer, None
            if writer is not None:  # once: the next checkpoint lands after this run's plan
                from ckpt.plugins.examples import mlp

                writer.write(int(writer.last_step) + 1, mlp())
            return np.float64(step)

        parts = [da.from_delayed(dask.delayed(value)(int(s)), shape=(), dtype=float) for s in ctx.steps]
        return xr.Dataset({"v": ("step", da.stack(parts))}, coords={"step": list(ctx.steps)})


class _Counts(ckpt.plugins.Analyzer):
    """A per-run result over the values of every checkpoint."""

    name = "counts-test"
    description = "How many checkpoints the required values cover."
    per = "run"
    requires = ("appending-test",)

    def compute(self, ctx: Any) -> Any:
        import xarray as xr

        values = ctx.result("appending-test")["v"]
        return xr.Dataset({"n": values.count()})


class _RacePlugin:
    @ckpt.plugins.hookimpl
    def ckpt_register_analyzers(self, register: Any) -> None:
        register(_Appending)
        register(_Counts)


def test_a_checkpoint_committed_after_the_dependencies_ran_is_computed_by_them(tmp_path: Path) -> None:
    from ckpt.engine.runner import run
    from ckpt.plugins import load_registry
    from ckpt.plugins.examples import mlp

    path = tmp_path / "run.zarr"
    writer = ckpt.create(path)
    for step in range(3):
        writer.write(step, mlp())
    _Appending.writer = writer
    try:
        report = run("counts-test", path, registry=load_registry(extra=[_RacePlugin()]), scheduler="sync")
    finally:
        writer.close()
    assert _Appending.writer is None  # the race happened: step 3 came while the values were computed
    values = ckpt.open(path).analysis("appending-test")
    assert values["step"].values.tolist() == [0, 1, 2, 3]  # the dependency caught up with it
    assert report.dependencies[0].computed_steps == [0, 1, 2, 3]
    counts = ckpt.open(path).analysis("counts-test")
    assert counts.ckpt.steps == [0, 1, 2, 3]
    assert int(counts["n"].values) == 4  # the per-run result covers what it claims


def test_a_follower_waits_for_the_checkpoints_an_analyzer_needs(tmp_path: Path) -> None:
    from ckpt.engine.follow import follow
    from ckpt.plugins.examples import write_example_run

    store = write_example_run(tmp_path / "run.zarr", 2)  # essential-dynamics needs 3 (min_checkpoints)
    with pytest.raises(AnalysisError, match=r"essential-dynamics needs 3 checkpoints and .* has 2 when"):
        follow("essential-dynamics", store, until_idle=0.5, progress=False)
    assert "essential-dynamics" not in ckpt.open(store).analyses

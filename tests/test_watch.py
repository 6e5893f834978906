"""``ckpt watch STORE [NAME ...]``: several analyzers followed beside a real writer in another process.

The writer (tests/test_follow.py's ``WRITER``, run with this interpreter) creates a seeded store
through the public ``ckpt.create`` API and commits checkpoints with pauses; with a result name it
first waits until that result is in the store (the watch has started), and it closes the store
unless told to stay open. What the tests check: every checkpoint computed by every analyzer, each once; each
result the one ``ckpt.analyze`` computes alone; each checkpoint's chunk files opened once by a
watch of several analyzers (counted by an audit hook on this process's ``open`` calls, a real
count of what the store's reader opens) where separate runs open them once per analyzer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import ckpt
import ckpt.errors
from ckpt.engine.follow import follow
from ckpt.engine.watch import default_analyzers, watch
from ckpt.engine.watch_reads import SharedReads
from ckpt.plugins.manager import registry
from tests.helpers import CKPT, run_ckpt
from tests.test_follow import WRITER, dask_cluster, interrupted, on_s3, plain_run

NAMES = ["loss", "grad-norms", "sparsity"]


def _command() -> list[str]:
    return [str(CKPT)] if CKPT.exists() else [sys.executable, "-m", "ckpt.cli"]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", **(extra or {})}


def _writer(
    tmp_path: Path, where: str, count: int, pause: float, close: str = "close", first: str = "-", **env: str
) -> subprocess.Popen[str]:
    """The writer process, started; returns once the store exists."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen(
        [sys.executable, str(script), where, str(count), str(pause), close, first], text=True, env=_env(env)
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ckpt.open(where)
            break
        except ckpt.errors.CkptError:
            time.sleep(0.05)
    return writer


def _watcher(where: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*_command(), "watch", where, *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(env),
    )


def _watched(
    tmp_path: Path, store: Path, count: int, pause: float, first: str, *args: str, close: str = "close"
) -> tuple[str, str]:
    """A writer started and ``ckpt watch STORE ARGS`` run to its end beside it; the watch's stdout and stderr.

    The watch runs through tests/helpers.py's ``run_ckpt`` (a process of its own, forked after the
    third-party imports); both must exit 0.
    """
    writer = _writer(tmp_path, str(store), count, pause, close=close, first=first)
    try:
        done = run_ckpt("watch", str(store), *args, "--no-progress")
    finally:
        if writer.poll() is None and not ckpt.open(store).analyses:
            writer.kill()  # the watch failed before its first result: the writer would wait for it
    assert done.returncode == 0, done.stderr
    assert writer.wait(timeout=60) == 0
    return done.stdout, done.stderr


def _computed(stderr: str, name: str) -> list[int]:
    return [int(s) for s in re.findall(rf"^{name}: step (\d+) computed$", stderr, flags=re.M)]


@contextmanager
def _chunk_opens(store: Path) -> Iterator[Counter[str]]:
    """Count this process's opens of the checkpoint chunk files of ``store`` (the step array's aside)."""
    root = str(store.resolve() / "checkpoints") + os.sep
    counts: Counter[str] = Counter()
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not active[0] or not isinstance(args[0], str | os.PathLike):
            return
        path = os.path.abspath(os.fspath(args[0]))
        if path.startswith(root) and os.path.basename(path).startswith("c") and "/step/" not in path:
            counts[path] += 1

    sys.addaudithook(hook)  # hooks cannot be removed: this one stops counting when the block ends
    try:
        yield counts
    finally:
        active[0] = False


def _small_run(path: Path, count: int) -> Path:
    """A finished store of ``count`` checkpoints of the example MLP with an eval split, written here (no training)."""
    import torch

    from ckpt.plugins.examples import mlp

    torch.manual_seed(0)
    model = mlp()
    with ckpt.create(path, model="ckpt.plugins.examples:mlp", objective="cross-entropy") as writer:
        writer.add_data("eval", inputs=torch.randn(20, 3), targets=torch.randint(0, 4, (20,)))
        for step in range(count):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.01)
            writer.write(step, model)
    return path


def _same_result(watched: xr.Dataset, alone: xr.Dataset) -> None:
    assert watched["step"].values.tolist() == alone["step"].values.tolist()
    xr.testing.assert_identical(watched.drop_attrs(), alone.drop_attrs())


def test_a_watch_reads_each_checkpoint_once_for_all_and_computes_what_each_alone_does(tmp_path: Path) -> None:
    watched, alone = tmp_path / "watched.zarr", tmp_path / "alone.zarr"
    writer = _writer(tmp_path, str(watched), 4, 0.3, first="loss")
    with _chunk_opens(watched) as opens:
        done = watch(watched, NAMES, until_idle=30, progress=False)
    assert writer.wait(timeout=60) == 0
    assert done.stopped == "finished"
    assert {name: report.computed_steps for name, report in done.reports.items()} == {n: [0, 1, 2, 3] for n in NAMES}
    tensors = len(ckpt.open(watched).tensor_names)
    assert len(opens) == 4 * tensors  # every chunk of every checkpoint opened ...
    assert set(opens.values()) == {1}  # ... once, for the three analyzers
    assert done.reads == 4
    # the same checkpoints, copied, analyzed by each analyzer alone
    shutil.copytree(watched, alone)
    with _chunk_opens(alone) as separate:
        for name in NAMES:
            again = ckpt.analyze(name, alone, progress=False, force=True).load()
            _same_result(ckpt.open(watched).analysis(name).load(), again)
    assert len(separate) == 4 * tensors
    assert sum(separate.values()) >= len(NAMES) * 4 * tensors  # once per analyzer at least
    assert min(separate.values()) >= len(NAMES)


def test_separate_followers_read_each_checkpoint_once_each(tmp_path: Path) -> None:
    from ckpt.store.results import delete_analysis

    store = _small_run(tmp_path / "run.zarr", 3)
    with _chunk_opens(Path(store)) as opens:
        for name in NAMES:
            follow(name, store, until_idle=30, progress=False)
    once = ckpt.open(store)
    assert min(opens.values()) >= len(NAMES)
    for name in NAMES:
        delete_analysis(store, name)
    with _chunk_opens(Path(store)) as shared:
        done = watch(store, NAMES, until_idle=30, progress=False)
    assert done.stopped == "finished"
    assert sum(shared.values()) == len(once) * len(once.tensor_names)
    assert sum(opens.values()) >= len(NAMES) * sum(shared.values())


def test_ckpt_watch_follows_the_default_analyzers_until_the_writer_closes_the_store(tmp_path: Path) -> None:
    store = tmp_path / "live.zarr"
    stdout, stderr = _watched(tmp_path, store, 3, 0.3, "loss")
    assert "Error" not in stderr and "Traceback" not in stderr
    chosen = default_analyzers(registry())
    assert {"loss", "grad-norms", "sparsity"} <= set(chosen)
    assert "polca" not in chosen and "hessian-basis" not in chosen and "loss-spikes" not in chosen
    # the example MLP has no attention, embedding or normalisation: those are left out, saying why
    assert re.search(r"^attention: not watched: .*no attention", stderr, flags=re.M), stderr
    watched = [name for name in chosen if f"{name}: computed 3 step(s)" in stdout]
    assert {"loss", "grad-norms", "sparsity"} <= set(watched)
    for name in watched:
        assert _computed(stderr, name) == [0, 1, 2]  # each checkpoint once, in order
        assert ckpt.open(store).analysis(name)["step"].values.tolist() == [0, 1, 2]
    assert f"watched {store} until the run is finished; read 3 checkpoint(s) once for {len(watched)}" in stdout


def test_ckpt_watch_on_a_dask_cluster_computes_what_plain_runs_do(tmp_path: Path) -> None:
    store = tmp_path / "live.zarr"
    with dask_cluster() as cluster:
        watching = ("loss", "grad-norms", "--address", cluster.scheduler_address)
        _stdout, stderr = _watched(tmp_path, store, 3, 0.3, "loss", *watching)
        assert cluster.scheduler.transition_counter > 0  # the watch's tasks ran on the cluster
    for name in ("loss", "grad-norms"):
        assert _computed(stderr, name) == [0, 1, 2]
        _same_result(ckpt.open(store).analysis(name).load(), plain_run(store, name, tmp_path / f"{name}.zarr"))


def test_ckpt_watch_stops_when_idle_and_reruns_a_per_run_analyzer(tmp_path: Path) -> None:
    store = tmp_path / "live.zarr"
    watching = ("grad-norms", "loss-spikes", "--until-idle", "2s", "--rerun-every", "0.5s")
    stdout, stderr = _watched(tmp_path, store, 4, 0.5, "grad-norms", *watching, close="open")
    assert _computed(stderr, "grad-norms") == [0, 1, 2, 3]
    runs = re.findall(r"^loss-spikes: recomputed over (\d+) checkpoint\(s\)", stderr, flags=re.M)
    assert len(runs) >= 2 and runs[-1] == "4"  # at the start, at most once a second, and at the end
    assert "until idle for 2s" in stdout
    assert ckpt.open(store).analysis("loss-spikes").ckpt.steps == [0, 1, 2, 3]


def test_ctrl_c_keeps_what_each_analyzer_committed_and_exits_130(tmp_path: Path) -> None:
    store = tmp_path / "live.zarr"
    writer = _writer(tmp_path, str(store), 200, 0.3, close="open", first="loss")
    watcher = _watcher(str(store), "loss", "sparsity")
    stderr = interrupted(watcher, writer, lambda stderr: len(_computed(stderr, "sparsity")) >= 3)
    for name in ("loss", "sparsity"):
        printed = _computed(stderr, name)
        assert len(printed) >= 3
        assert ckpt.open(store).analysis(name)["step"].values.tolist() == printed  # committed, nothing twice


def test_bad_input_is_one_error_line_and_the_store_unchanged(tmp_path: Path) -> None:
    store = str(_small_run(tmp_path / "run.zarr", 2))
    (tmp_path / "folder").mkdir()
    before = sorted(p.name for p in Path(store).rglob("*"))
    for args, expected in (
        ([store, "no-such"], "unknown analyzer 'no-such'; registered analyzers:"),
        ([store, "polca"], "polca requires hessian-basis, a result over the whole run (a basis)"),
        ([str(tmp_path / "folder")], "is not a ckpt store"),
        ([store, "--as", "x"], "No such option '--as'"),
        ([store, "--until-idle", "soon"], "--until-idle must be a duration such as 30s"),
    ):
        done = run_ckpt("watch", *args)
        assert done.returncode != 0
        assert done.stderr.count("Error:") == 1 and expected in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    for where, names, settings, expected in (
        (store, ["loss", "clusters"], {}, "clusters requires hessian-basis (through polca)"),
        (str(tmp_path / "none.zarr"), ["loss"], {}, "no store at"),
        (store, ["loss"], {"rerun_every": "0s"}, "--rerun-every must be a positive duration"),
        (store, ["loss"], {"device": "tpu"}, "--device must be auto, cpu"),
        (store, ["loss"], {"split": "eval"}, "ckpt watch runs each analyzer with its stored (or default) options"),
    ):
        with pytest.raises(ckpt.errors.CkptError, match=re.escape(expected)):
            watch(where, names, until_idle=1, **settings)
    assert sorted(p.name for p in Path(store).rglob("*")) == before  # refused before anything ran
    assert ckpt.open(store).analyses == []


def test_a_watch_extends_a_result_stored_with_other_options_instead_of_replacing_it(tmp_path: Path) -> None:
    store = _small_run(tmp_path / "run.zarr", 3)
    ckpt.analyze("loss", store, batch_size=7, progress=False)
    before = ckpt.open(store).analysis("loss")["loss"].values.copy()
    writer = ckpt.open(store, mode="a")
    writer.write(3, ckpt.open(store).tensors(2))
    writer.close()
    done = watch(store, ["loss"], until_idle=30, progress=False)
    assert done.reports["loss"].computed_steps == [3]  # the stored steps kept: run with their options
    stored = ckpt.open(store).analysis("loss")
    assert stored.ckpt.provenance["options"]["batch_size"] == 7
    assert stored["step"].values.tolist() == [0, 1, 2, 3]
    # the stored rows kept as they were ("created" is the last write's time, so it is no witness)
    np.testing.assert_array_equal(stored["loss"].values[:3], before)


def test_kept_checkpoints_are_copies_read_once_and_only_for_the_round(tmp_path: Path) -> None:
    path = _small_run(tmp_path / "run.zarr", 3)
    store = SharedReads(str(path))
    alone = ckpt.open(path)
    expected = {step: alone.tensors(step) for step in (1, 2)}
    with _chunk_opens(Path(path)) as opens, store.round([1, 2]):
        first = store.tensors(1)
        name = next(iter(first))
        first[name][...] = 7.0  # an analyzer writing into what it read changes nothing for the next
        again = store.tensors(1, [name])
        store.tensors(0)  # not new in this round: read as without a watch, each time
        store.tensors(0)
        torch_read = store.tensors(2, device="cpu")
    np.testing.assert_array_equal(again[name], expected[1][name])
    np.testing.assert_array_equal(torch_read[name].numpy(), expected[2][name])
    assert store.reads == 2
    tensors = len(alone.tensor_names)
    assert sum(opens.values()) == 2 * tensors + 2 * tensors  # steps 1, 2 once; step 0 twice
    assert store.kept_steps == [2]  # the newest stays for the next round's comparisons with it
    with pytest.raises(ckpt.errors.StepNotFoundError):
        store.tensors(5)
    with pytest.raises(ckpt.errors.TensorNotFoundError), store.round([1]):
        store.tensors(1, ["no-such"])


def test_the_kept_checkpoints_fit_their_limit(tmp_path: Path) -> None:
    path = _small_run(tmp_path / "run.zarr", 3)
    one = sum(info.nbytes for info in ckpt.open(path).schema.values())
    store = SharedReads(str(path), limit=one)  # room for one checkpoint
    with store.round([0, 1, 2]):
        for _ in range(2):
            for step in (0, 1, 2):
                store.tensors(step)
        assert store.kept_steps == [0]  # the first read stays; the others are read each time
    assert store.reads == 1


@pytest.mark.slow  # starts a local S3 server
def test_a_watch_of_an_s3_store_polls_and_stops_when_it_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "s3://runs/watched.zarr"
    with on_s3(monkeypatch) as env:
        writer = _writer(tmp_path, url, 3, 0.5, first="loss", **env)
        watcher = _watcher(url, "loss", "grad-norms", env=env)
        stdout, stderr = watcher.communicate(timeout=120)
        assert writer.wait(timeout=60) == 0
        assert watcher.returncode == 0, stderr
        for name in ("loss", "grad-norms"):
            assert _computed(stderr, name) == [0, 1, 2]
        assert "until the run is finished; read 3 checkpoint(s) once for 2 analyzer(s)" in stdout

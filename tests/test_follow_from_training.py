"""``follow=[...]`` from the training loop: the writer starts followers, and training never waits for them.

The trainer (:data:`TRAINER`) is a real few-step torch loop in its own process, writing through
the public ``ckpt.create``; its followers are ``ckpt analyze NAME STORE --follow`` processes it
starts. What each test checks: the results the followers leave equal ``ckpt analyze`` computed
afterwards, the trainer closes and exits while its followers still run, their output is in the
log beside the store (not the trainer's console), a trainer that crashes leaves no follower
behind, and a wrong name fails before anything is created.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import ckpt
from ckpt.errors import InvalidArgumentError
from ckpt.store.followers import LOG_SUFFIX
from tests.helpers import run_ckpt

TRAINER = """
import json, sys, torch, ckpt
from ckpt.plugins.examples import mlp

path, steps, end, follow = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
torch.manual_seed(0)
model = mlp()
inputs, targets = torch.randn(24, 3), torch.randint(0, 4, (24,))
writer = ckpt.create(path, model="ckpt.plugins.examples:mlp", objective="cross-entropy", follow=follow)
print(json.dumps({"pids": [p.pid for p in writer.followers], "log": str(writer.follow_log)}), flush=True)
writer.add_data("eval", inputs=inputs, targets=targets)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(steps):
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    writer.write(step, model, metrics={"loss": loss.item()})
if end == "crash":
    raise RuntimeError("training diverged")
writer.close()
running = [p.poll() is None for p in writer.followers]
print(json.dumps({"closed": True, "followers_running_after_close": running}), flush=True)
"""


def _train(tmp_path: Path, *follow: str, steps: int = 4, end: str = "close") -> tuple[Path, dict, dict | None, str]:
    """Run the trainer to its end; the store, its first and last lines (None when it crashed), its stderr."""
    store = tmp_path / "run.zarr"
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), str(store), str(steps), end, *follow],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines, done.stderr
    assert time.monotonic() - began < 60
    return store, lines[0], lines[1] if len(lines) > 1 else None, done.stderr


def _wait_gone(pids: list[int], timeout: float = 120) -> None:
    """Until every process of ``pids`` has exited (an orphan's zombie, not yet reaped, counts as exited)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        else:
            psutil.Process(pid).kill()
            pytest.fail(f"follower {pid} still running after {timeout} s")


def _result(store: Path, name: str) -> dict[str, np.ndarray]:
    dataset = ckpt.open(store).analysis(name).load()
    return {key: dataset[key].values for key in dataset.data_vars}


@pytest.mark.slow
def test_followers_started_by_the_writer_compute_what_analyze_computes_afterwards(tmp_path: Path) -> None:
    store, started, ended, stderr = _train(tmp_path, "loss", "grad-norms")
    assert ended is not None, stderr
    # close() marked the run finished and returned while the followers were still at work
    assert ended["followers_running_after_close"] == [True, True]
    _wait_gone(started["pids"])
    log = Path(started["log"])
    assert log == store.with_name(store.name + LOG_SUFFIX)
    text = log.read_text()
    for name in ("loss", "grad-norms"):
        assert f"{name}: followed {store} until the run is finished; computed 4 step(s)" in text
        assert f"{name}: step 3 computed" in text
    assert "computed" not in stderr  # the followers write to their log, not to the training console
    for name in ("loss", "grad-norms"):
        again = run_ckpt("analyze", name, str(store), "--as", f"{name}-after", "--no-progress")
        assert again.returncode == 0, again.stderr
        followed, afterwards = _result(store, name), _result(store, f"{name}-after")
        assert followed.keys() == afterwards.keys()
        for key, values in followed.items():
            np.testing.assert_array_equal(values, afterwards[key], err_msg=f"{name}: {key}")
    assert list(ckpt.open(store).analysis("loss").step.values) == [0, 1, 2, 3]


def test_a_crashed_trainer_interrupts_its_followers(tmp_path: Path) -> None:
    store, started, ended, stderr = _train(tmp_path, "loss", end="crash")
    assert ended is None
    assert "RuntimeError: training diverged" in stderr
    _wait_gone(started["pids"], timeout=60)  # without the interrupt they would wait for checkpoints forever
    assert ckpt.open(store).finished is False  # a crash is not a finished run
    assert ckpt.open(store).steps.tolist() == [0, 1, 2, 3]  # every commit before the crash stays


def test_an_unknown_name_fails_before_the_store_is_created(tmp_path: Path) -> None:
    store = tmp_path / "run.zarr"
    with pytest.raises(InvalidArgumentError, match=r"follow=\['loss', 'nope'\]: unknown analyzer 'nope'"):
        ckpt.create(store, follow=["loss", "nope"])
    assert not store.exists()
    assert not store.with_name(store.name + LOG_SUFFIX).exists()


def test_an_unknown_name_leaves_a_store_opened_to_append_unchanged(tmp_path: Path) -> None:
    store = tmp_path / "run.zarr"
    ckpt.create(store).close()
    record = (store / "zarr.json").read_bytes()
    with pytest.raises(InvalidArgumentError, match="unknown analyzer 'lossy'"):
        ckpt.open(store, mode="a", follow=["lossy"])
    assert (store / "zarr.json").read_bytes() == record
    ckpt.open(store, mode="a").close()  # not locked either


@pytest.mark.parametrize(
    ("follow", "expected"),
    [
        ("loss", "follow must be a list of analyzer names"),
        (["loss", "loss"], "follow names 'loss' more than once"),
    ],
)
def test_follow_must_name_each_analyzer_once(tmp_path: Path, follow: object, expected: str) -> None:
    with pytest.raises(InvalidArgumentError, match=expected):
        ckpt.create(tmp_path / "run.zarr", follow=follow)  # type: ignore[arg-type]
    assert not (tmp_path / "run.zarr").exists()


def test_a_memory_store_cannot_be_followed() -> None:
    with pytest.raises(InvalidArgumentError, match="other processes, which cannot see memory://"):
        ckpt.create("memory://followed.zarr", follow=["loss"])


@pytest.mark.parametrize("module", ["ckpt.store.lightning", "ckpt.store.huggingface"])
def test_the_training_callbacks_check_their_names_before_training(tmp_path: Path, module: str) -> None:
    pytest.importorskip(module.rsplit(".", 1)[-1].replace("huggingface", "transformers"))
    callback_class = __import__(module, fromlist=["CkptCallback"]).CkptCallback
    with pytest.raises(InvalidArgumentError, match="unknown analyzer 'gradnorms'"):
        callback_class(str(tmp_path / "run.zarr"), every=1, follow=["gradnorms"])
    assert callback_class(str(tmp_path / "run.zarr"), every=1, follow=["grad-norms"]).follow == ("grad-norms",)


def test_a_follower_that_exits_while_training_lives_is_reaped(tmp_path: Path) -> None:
    store = tmp_path / "run.zarr"
    writer = ckpt.create(store, follow=["loss"], follow_log=tmp_path / "followers.log")
    (process,) = writer.followers
    began = time.monotonic()
    writer.close()  # no checkpoint: the follower finds the run finished with nothing to compute, and exits
    assert time.monotonic() - began < 1.0  # close() does not wait for it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            psutil.Process(process.pid)
        except psutil.NoSuchProcess:
            break  # waited for by the writer's reaper: no zombie left in a long-lived process
        time.sleep(0.1)
    else:
        pytest.fail(f"follower {process.pid} still a process (running or a zombie) after 60 s")
    assert process.returncode == 1
    assert "Error: loss needs a checkpoint" in (tmp_path / "followers.log").read_text()


def test_a_log_in_no_folder_fails_before_the_store_is_created(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"followers' log would be in .*missing, which is not a folder"):
        ckpt.create(tmp_path / "run.zarr", follow=["loss"], follow_log=tmp_path / "missing" / "follow.log")
    assert not (tmp_path / "run.zarr").exists()

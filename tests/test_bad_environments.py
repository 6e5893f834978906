"""Bad environments get one ``Error:`` line and leave the store as it was: a read-only store, a full disk.

Real file systems, not patched calls: a tmpfs mounted read-only, and a tmpfs filled to
the last block. Mounting needs root (as on the CI machines); elsewhere these are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt, run_ckpt, tree_digest

pytestmark = pytest.mark.slow  # installs packages or starts many ckpt processes


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 4 MB tmpfs, unmounted afterwards."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _contents(path: Path) -> dict[str, str]:
    return tree_digest(path)


def test_a_read_only_store_is_one_error_line_for_commands_that_write(mlp_store: Path, tmpfs: Path) -> None:
    assert invoke_ckpt("analyze", "grad-norms", str(mlp_store)).returncode == 0
    store = tmpfs / "run.zarr"
    shutil.copytree(mlp_store, store)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    before = _contents(store)
    for command in (["analyze", "loss", str(store)], ["repair", str(store)], ["rm", str(store), "grad-norms"]):
        result = run_ckpt(*command)
        assert result.returncode == 1, (command, result.stderr)
        assert result.stderr.startswith("Error: cannot write ") and "Read-only file system" in result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    for command in (["info", str(store)], ["verify", str(store)]):  # reading needs no write access
        assert run_ckpt(*command).returncode == 0, command
    assert _contents(store) == before


def test_a_full_disk_is_one_error_line_and_the_store_keeps_its_committed_state(mlp_store: Path, tmpfs: Path) -> None:
    store = tmpfs / "run.zarr"
    shutil.copytree(mlp_store, store)
    analyzed = invoke_ckpt("analyze", "grad-norms", str(store))
    assert analyzed.returncode == 0, analyzed.stderr
    filler = tmpfs / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the file system to its last block (unbuffered: nothing left to flush at close)
        while True:
            os.write(descriptor, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(descriptor)
    before = _contents(store)
    result = run_ckpt("analyze", "loss", str(store))
    assert result.returncode == 1
    assert (
        result.stderr.startswith("Error: no space left writing ") and "keeps its last committed state" in result.stderr
    )
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert _contents(store) == before, "nothing half-written is left behind"
    assert ckptstore.open(store).analyses == ["grad-norms"]
    filler.unlink()  # space again: the same command now works
    again = invoke_ckpt("analyze", "loss", str(store))
    assert again.returncode == 0, again.stderr
    assert invoke_ckpt("verify", str(store)).returncode == 0


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_scheduler_that_dies_mid_run_is_one_error_line_and_keeps_what_was_committed(tmp_path: Path) -> None:
    import signal
    import sys
    import time

    from ckpt.plugins.testing import write_example_run

    path = write_example_run(tmp_path / "run.zarr", steps=40, examples=2000)
    address = f"tcp://127.0.0.1:{_free_port()}"
    bin_dir = Path(sys.executable).parent
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}  # the repository root on the path, as run_ckpt sets it
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    scheduler = subprocess.Popen(
        [bin_dir / "dask", "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1], "--no-dashboard"],
        **quiet,
    )
    worker = subprocess.Popen(
        [bin_dir / "dask", "worker", address, "--nthreads", "1", "--no-dashboard"], cwd=root, **quiet
    )
    try:
        command = [bin_dir / "ckpt", "analyze", "loss", str(path), "--address", address, "--block-steps", "1"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the scheduler and its worker are up
            probe = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    f"from distributed import Client; c = Client('{address}', timeout=2); "
                    "c.wait_for_workers(1, timeout=5)",
                ],
                capture_output=True,
                check=False,
            )
            if probe.returncode == 0:
                break
        analysis = subprocess.Popen(
            [*command, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root, env=env
        )
        committed: list[int] = []
        while time.monotonic() < deadline and analysis.poll() is None and len(committed) < 3:
            store = ckptstore.open(path)
            committed = store.analysis("loss").ckpt.steps if "loss" in store.analyses else []
            time.sleep(0.05)
        scheduler.send_signal(signal.SIGKILL)
        _, stderr = analysis.communicate(timeout=120)
    finally:
        scheduler.kill()
        worker.kill()
        worker.wait()
    assert analysis.returncode == 1
    assert stderr.startswith(f"Error: loss: the dask scheduler at {address} failed: it went away mid-run"), stderr
    assert len(stderr.strip().splitlines()) == 1 and "rerun the same command" in stderr
    kept = ckptstore.open(path).analysis("loss").ckpt.steps
    assert 3 <= len(kept) < 40 and kept == list(range(len(kept)))
    assert f"the {len(kept)} step(s) committed before are kept" in stderr
    assert invoke_ckpt("verify", str(path)).returncode == 0
    resumed = invoke_ckpt("analyze", "loss", str(path), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert f"computed {40 - len(kept)} step(s), reused {len(kept)} stored" in resumed.stdout

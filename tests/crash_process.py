"""Children for tests/test_crash_points.py: run one store operation, dying at its N-th file event.

Usage: ``python crash_process.py OPERATION TEMPLATE WORKROOT MODE [N ...]``. A *file event*
is a call that changes the file system: opening a file for writing, ``os.open`` with write
flags, rename/replace, mkdir, link, unlink/remove, rmdir. Modes:

- ``count``: run the operation on a copy of TEMPLATE at WORKROOT/count; print its event count.
- ``kill N...``: for each N, copy TEMPLATE to WORKROOT/kill-N and run the operation there in a
  forked child that ``os._exit``s just before its N-th event, as a SIGKILL or a power cut would
  stop it; print ``N <exit status>`` per line (137: killed there).
- ``finish N...``: run the operation to its end again in WORKROOT/kill-N (the resume of the
  "append if it exists, else create" loop, the rerun of an import); print ``N <exit status>``.

The children are forked from this process, which imported everything once and has touched
no store (no zarr event-loop thread to inherit): one process start per mode instead of one
per kill point, which made the test 4x faster; torch, which the importers import lazily, is
imported before the first fork of an import operation, which made those 4x faster again. Two
children run at a time (CI has 2 cores).
(Checkpoint chunks of a local store are written by ckpt itself and counted, on its writer threads;
chunk files the Rust zarrs pipeline writes do not pass through Python and are not counted;
every commit-protocol step does.)

Operations, each on ``run.zarr`` in its folder (TEMPLATE holds the sources and old stores):
- ``create``: ``ckpt.create(run.zarr)``, closed at once.
- ``import``: ``import_checkpoints(src, run.zarr)`` of three safetensors files.
- ``reimport``: the same with ``overwrite=True`` over an existing store of another run.
- ``append``: the "append if it exists, else create" loop writing checkpoints 0..2.
- ``url_import``: the import to an fsspec URL (``local://``: an object store's code path, no rename).
- ``url_reimport``: the same with ``overwrite=True`` over an existing store of another run.
- ``add_data``: on an existing store, add split ``train`` and replace split ``eval``.
- ``data_overwrite``: ``ckpt data add run.zarr eval --inputs ... --targets ... --overwrite`` (the
  ``.npy`` files beside the store).
- ``analysis``: commit a result in two blocks (steps 0-1, then step 2 appended), as the engine does.
- ``reanalysis``: replace a stored result with another (``ckpt analyze --force``).
- ``repair``: ``ckpt repair`` of a store whose checkpoint 2 is damaged and whose result covers it
  (the copy swapped in, the result dropped with the checkpoint).
- ``repair_in_place``: ``ckpt repair`` of a store with a damaged split, a damaged result and an
  uncommitted leftover, and sound checkpoints (one commit, no copy).
- ``rm``: ``ckpt rm`` of a stored result.
- ``set_model``: ``ckpt set-model`` of a model and an objective.
- ``upgrade``: ``ckpt upgrade`` of a store whose record lacks its digests (format v1).
- ``import_append``: ``ckpt import`` into an earlier import of the same folder (``WORKROOT/src``), one
  checkpoint newer.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import sys
import threading
from pathlib import Path

import numpy as np

_lock = threading.Lock()
_count = 0
_kill_at = 0


def _event() -> None:
    global _count
    with _lock:
        _count += 1
        if _kill_at and _count >= _kill_at:
            os._exit(137)


def _writes(mode: str) -> bool:
    return any(c in mode for c in "wax+")


def _patch() -> None:
    real_open, real_os_open = builtins.open, os.open

    def patched_open(file, mode="r", *args, **kwargs):
        if _writes(mode):
            _event()
        return real_open(file, mode, *args, **kwargs)

    def patched_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            _event()
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open = io.open = patched_open
    os.open = patched_os_open
    for name in ("rename", "replace", "mkdir", "link", "unlink", "remove", "rmdir"):
        real = getattr(os, name)

        def patched(*args, _real=real, **kwargs):
            _event()
            return _real(*args, **kwargs)

        setattr(os, name, patched)


def tensors(step: int, run: int = 0) -> dict[str, np.ndarray]:
    """The checkpoint written at ``step`` (``run`` tells two runs apart)."""
    rng = np.random.default_rng(1000 * run + step)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}


def write_sources(folder: Path) -> None:
    """Three safetensors checkpoints ``step-<N>.safetensors`` of run 1 (made before any event is counted)."""
    from safetensors.numpy import save_file

    folder.mkdir(exist_ok=True)
    for step in range(3):
        save_file(tensors(step, run=1), str(folder / f"step-{step}.safetensors"))


def split(run: int) -> dict[str, object]:
    """The arrays of a small data split (``run`` tells two versions apart)."""
    rng = np.random.default_rng(run)
    return {
        "inputs": rng.integers(0, 9, (5, 2)),
        "targets": rng.integers(0, 9, 5),
        "text": [f"run {run} example {i}" for i in range(5)],
    }


def result(steps: list[int], run: int):
    """A per-checkpoint result over ``steps`` (values recomputable from step and run)."""
    import xarray as xr

    values = np.stack([np.random.default_rng(100 * run + s).standard_normal(7) for s in steps])
    return xr.Dataset({"v": (("step", "datapoint"), values)}, coords={"step": steps})


def provenance(steps: list[int], run: int) -> dict[str, object]:
    return {"ckpt": {"analyzer": "toy", "version": "1", "run": run, "steps": steps}}


MODEL = "tests.crash_process:model"
"""The factory ``set_model`` records (never called: a factory is data to the store)."""


def run_operation(operation: str, work: Path) -> None:
    """Run ``operation`` on ``work/run.zarr`` (sources, if any, in ``work/src``)."""
    import ckpt.store as ckptstore
    from ckpt.store.importers import import_checkpoints

    path = work / "run.zarr"
    if operation == "create":
        ckptstore.create(path).close()
    elif operation in ("import", "reimport"):
        import_checkpoints(work / "src", path, format="safetensors", overwrite=operation == "reimport")
    elif operation == "append":
        writer = ckptstore.open(path, mode="a") if path.exists() else ckptstore.create(path)
        with writer:
            start = 0 if writer.last_step is None else writer.last_step + 1
            for step in range(start, 3):
                writer.write(step, tensors(step), metrics={"loss": float(step)})
    elif operation in ("url_import", "url_reimport"):
        options = {"auto_mkdir": True}  # object stores need no folders; the local file system does
        overwrite = operation == "url_reimport"
        url = f"local://{path}"
        import_checkpoints(work / "src", url, format="safetensors", overwrite=overwrite, storage_options=options)
    elif operation == "add_data":
        with ckptstore.open(path, mode="a") as writer:
            writer.add_data("train", **split(1))
            writer.add_data("eval", **split(1), overwrite=True)
    elif operation == "data_overwrite":
        from click.testing import CliRunner

        from ckpt.cli.main import cli

        arrays = [f"--{name}={work / f'{name}.npy'}" for name in ("inputs", "targets")]
        done = CliRunner().invoke(cli, ["data", "add", str(path), "eval", *arrays, "--overwrite"])
        if done.exit_code != 0:
            raise RuntimeError(f"ckpt data add exited {done.exit_code}: {done.output} {done.exception!r}")
    elif operation in ("analysis", "reanalysis"):
        from ckpt.store.results import write_analysis

        if operation == "analysis":
            write_analysis(path, "toy", result([0, 1], 1), attrs=provenance([0, 1], 1))
            write_analysis(path, "toy", result([2], 1), append_dim="step", attrs=provenance([0, 1, 2], 1))
        else:
            write_analysis(path, "toy", result([0, 1, 2], 1), attrs=provenance([0, 1, 2], 1))
    elif operation in ("repair", "repair_in_place"):
        from ckpt.store.repair import repair

        repair(path)
    elif operation == "rm":
        from ckpt.store.results import delete_analysis

        delete_analysis(path, "toy")
    elif operation == "set_model":
        with ckptstore.open(path, mode="a") as writer:
            writer.set_model(model=MODEL, config={"width": 3}, objective="cross-entropy")
    elif operation == "upgrade":
        ckptstore.upgrade(path)
    elif operation == "import_append":
        import_checkpoints(work.parent / "src", path, format="safetensors")  # the folder the store was imported from
    else:
        raise SystemExit(f"unknown operation {operation}")


def _in_child(operation: str, work: Path, kill_at: int) -> None:
    """The body of a forked child: count (kill_at 0) or die at event ``kill_at``; never returns."""
    global _kill_at
    status = 0
    try:
        _kill_at = kill_at
        _patch()
        run_operation(operation, work)
        shutil.rmtree(work / "never-there", ignore_errors=True)  # no event: keeps the last count honest
        print(_count, flush=True)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        os._exit(status)


def _forked(jobs: list[tuple[int, Path, int]], operation: str, parallel: int = 2) -> dict[int, int]:
    """Run ``(label, work, kill_at)`` jobs in forked children, ``parallel`` at a time; label -> exit status."""
    running: dict[int, int] = {}
    statuses: dict[int, int] = {}
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < parallel:
            label, work, kill_at = pending.pop(0)
            sys.stdout.flush()  # or the child would print the parent's buffered lines again
            pid = os.fork()
            if pid == 0:
                _in_child(operation, work, kill_at)
            running[pid] = label
        pid, status = os.wait()
        statuses[running.pop(pid)] = os.waitstatus_to_exitcode(status)
    return statuses


def main() -> None:
    operation, template, root, mode = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    numbers = [int(n) for n in sys.argv[5:]]
    if "import" in operation:
        # the importers load safetensors through torch: a child importing it spent 1.1 s of its 1.15 s
        # doing so. Only these operations: a parent holding torch makes every fork 3x slower
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
    import xarray  # noqa: F401

    if operation not in ("create", "append", "add_data", "set_model") and "import" not in operation:
        result([0], 0)  # xarray imports dask & co. at its first Dataset: here once, not per child (5x)

    if operation == "data_overwrite":
        import ckpt.cli.main  # once here, not in every child
    import ckpt.store
    import ckpt.store.importers
    import ckpt.store.repair
    import ckpt.store.results  # noqa: F401

    if mode == "count":
        work = root / "count"
        shutil.copytree(template, work)
        statuses = _forked([(0, work, 0)], operation)
        raise SystemExit(statuses[0])
    if mode == "kill":
        jobs = []
        for n in numbers:
            work = root / f"kill-{n}"
            shutil.copytree(template, work)
            jobs.append((n, work, n))
    elif mode == "finish":
        jobs = [(n, root / f"kill-{n}", 0) for n in numbers]
    else:
        raise SystemExit(f"unknown mode {mode}")
    for n, status in sorted(_forked(jobs, operation).items()):
        print(f"{n} {status}", flush=True)


if __name__ == "__main__":
    main()

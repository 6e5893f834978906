"""Python's garbage collector is paused while ckpt imports and builds models, and skipped at the console script's exit.

Why it matters: the collector's passes over the ~750,000 objects torch, transformers, dask and
xarray create took about 2 s of a 10 s ``ckpt analyze loss`` (ckpt.runtime). What must
hold: the collector comes back exactly as it was (a notebook's, a test process's), whatever the
threads and nesting; the model is built with it paused; and only the console script's own process
freezes its objects, at exit.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ckpt
import ckpt.store as ckptstore
from ckpt.engine.worker import TaskSpec, clear_cache
from ckpt.plugins import Worker
from ckpt.runtime import collection_paused
from tests import models


def test_the_collector_comes_back_when_the_last_pause_ends_nested_or_in_threads() -> None:
    assert gc.isenabled()
    inside = threading.Event()
    release = threading.Event()
    seen: list[bool] = []

    def pause_in_a_thread() -> None:
        with collection_paused():
            inside.set()
            release.wait(10)
            seen.append(gc.isenabled())

    with collection_paused():
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner pause ending must not turn the collector on under the outer one"
        thread = threading.Thread(target=pause_in_a_thread)
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled(), "the thread's pause still holds"
    release.set()
    thread.join(10)
    assert seen == [False]
    assert gc.isenabled(), "on again once the last pause ended"


def test_a_collector_the_user_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ended_by_an_exception_turns_the_collector_back_on() -> None:
    with pytest.raises(ValueError, match="boom"), collection_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_the_worker_builds_its_model_with_the_collector_paused_and_an_analysis_leaves_it_on(tmp_path: Path) -> None:
    path = tmp_path / "run.zarr"
    features = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    writer = ckptstore.create(path, model="tests.models:mlp_recording_the_collector", objective="cross-entropy")
    writer.add_data("eval", inputs=features, targets=np.arange(6) % 4)
    for step in range(2):
        model = models.mlp()
        writer.write(step, {k: v.detach().numpy() for k, v in model.state_dict().items()})
    writer.close()
    models.COLLECTOR_ENABLED_AT_BUILD.clear()
    clear_cache()
    try:
        assert Worker(TaskSpec(str(path))).model is not None
        built = len(models.COLLECTOR_ENABLED_AT_BUILD)  # the factory runs on meta first, then for real
        assert built >= 1 and not any(models.COLLECTOR_ENABLED_AT_BUILD)
        result = ckpt.analyze("loss", path, progress=False)
        assert result["loss"].sizes["step"] == 2
        assert models.COLLECTOR_ENABLED_AT_BUILD[built:] and not any(models.COLLECTOR_ENABLED_AT_BUILD)
        assert gc.isenabled(), "the analysis left this process's collector off"
    finally:
        clear_cache()


def test_only_the_console_script_freezes_its_objects_at_exit() -> None:
    # a handler registered before main() runs after main()'s own (atexit is last in, first out)
    probe = "import atexit, gc, sys\natexit.register(lambda: print('frozen at exit:', gc.get_freeze_count()))\n{call}"
    as_script = "sys.argv = ['ckpt', '--version']\nfrom ckpt.cli.main import main\nmain()\n"
    as_library = "import ckpt.cli.main\nprint('imported')\n"
    for call, frozen in ((as_script, True), (as_library, False)):
        done = subprocess.run(
            [sys.executable, "-c", probe.format(call=call)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        count = int(done.stdout.split("frozen at exit:")[1])
        assert (count > 0) is frozen, done.stdout

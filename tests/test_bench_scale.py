"""bench/scale.py's own parts, on a tiny GPT-2: the run it builds imports, and a step's failures are reported."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import ckpt.store as ckptstore
from tests.helpers import invoke_ckpt

pytestmark = pytest.mark.slow  # repro, bench and demo scripts end to end at small sizes

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scale.py"


@pytest.fixture(scope="module")
def scale():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_time_after_each_search_s_first_product_leaves_that_product_out(scale, tmp_path: Path) -> None:
    """Three bars as tqdm writes them: every state; the first states skipped; one state with products."""
    log = tmp_path / "hessian-basis.err"
    log.write_text(
        "hessian-basis step 2: 0product [00:00, ?product/s, kept graphs, 9 vectors, ~9.77 GiB]\r"
        "hessian-basis step 2: 1product [00:20, 20.00s/product, kept graphs, 9 vectors, ~9.77 GiB]\r"
        "hessian-basis step 2: 2product [00:35, 17.50s/product, residual 3.0e+00 (tol 0.01), "
        "a product alone 14 s (median)]\r"
        "hessian-basis step 2: 4product [01:05, 16.25s/product, residual 9.0e-03 (tol 0.01), "
        "a product alone 14.5 s (median)]\n"
        "hessian-basis step 4: 0product [00:00, ?product/s, kept graphs, 9 vectors, ~10.2 GiB]\r"
        "hessian-basis step 4: 3product [00:50, 16.67s/product, residual 1.0e+00 (tol 0.01)]\r"
        "hessian-basis step 4: 5product [01:20, 16.00s/product, residual 5.0e-03 (tol 0.01)]\n"
        "hessian-basis step 6: 0product [00:00, ?product/s, kept graphs, 9 vectors, ~10.7 GiB]\r"
        "hessian-basis step 6: 2product [00:30, 15.00s/product, residual 1.0e-03 (tol 0.01)]\n"
    )
    figures = scale.search_time(log)
    assert (figures["search_products"], figures["search_s"]) == (4 + 5 + 2, 65 + 80 + 30)
    # step 2 from its 1st product (20 s) to its 4th (65 s); step 4 from its 3rd (50 s) to its 5th (80 s);
    # step 6 has one state with products done: no span
    assert (figures["steady_products"], figures["steady_s"]) == ((4 - 1) + (5 - 3), (65 - 20) + (80 - 50))
    assert figures["product_alone_s"] == {"2": 14.5}


def test_the_built_run_is_a_trainer_folder_ckpt_imports(scale, tmp_path: Path) -> None:
    info = scale.build_run(tmp_path, {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 256})
    assert info["parameters"] > 0
    folders = scale.checkpoint_folders(tmp_path)
    assert [f.name for f in folders] == [f"checkpoint-{2 * i}" for i in range(1, scale.CHECKPOINTS + 1)]
    assert json.loads((folders[-1] / "trainer_state.json").read_text())["global_step"] == 2 * scale.CHECKPOINTS
    imported = invoke_ckpt("import", str(tmp_path / "trainer-out"), str(tmp_path / "run.zarr"))
    assert imported.returncode == 0, imported.stderr
    store = ckptstore.open(tmp_path / "run.zarr")
    assert [int(s) for s in store.steps] == [2, 4, 6, 8]
    assert store.objective == "causal-lm"
    assert list(store.metrics["loss"].values) == [
        e["loss"] for e in json.loads((folders[-1] / "trainer_state.json").read_text())["log_history"][1::2]
    ]
    added = invoke_ckpt("data", "add", str(tmp_path / "run.zarr"), "eval", "--inputs", str(tmp_path / "eval_ids.npy"))
    assert added.returncode == 0, added.stderr


def test_a_failing_or_slow_step_is_reported_and_killed(scale, tmp_path: Path) -> None:
    failing = [sys.executable, "-c", "import sys; print('Error: no such thing', file=sys.stderr); sys.exit(3)"]
    done = scale.measure(failing, tmp_path / "logs" / "failing", timeout=60, memory_limit=None)
    assert done.status == "failed" and done.detail == "exit 3: Error: no such thing"
    done = scale.measure([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "slow", 0.5, None)
    assert done.status == "timeout" and done.detail == "not done after 0.5 s" and done.seconds < 30
    hungry = [sys.executable, "-c", "import time; x = bytearray(300 * 2**20); time.sleep(60)"]
    done = scale.measure(hungry, tmp_path / "hungry", timeout=60, memory_limit=200 * 2**20)
    assert done.status == "memory" and done.detail.startswith("killed at the memory limit")
    done = scale.measure([sys.executable, "-c", "x = bytearray(100 * 2**20)"], tmp_path / "fine", 60, None)
    assert done.ok and done.peak_rss >= 100 * 2**20


def test_an_interrupt_while_a_step_runs_kills_the_step_and_reaches_the_caller(scale, tmp_path: Path) -> None:
    """A lent GPU's time limit sends SIGINT: the step's session is killed, the caller sees the interrupt."""
    child = tmp_path / "child.pid"
    code = f"import os, time; open({str(child)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    sleeper = [sys.executable, "-c", code]
    # Python's own SIGINT handler, as in the script: pytest-xdist's workers ignore SIGINT
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    began = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            scale.measure(sleeper, tmp_path / "logs" / "sleeper", timeout=120, memory_limit=None)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - began < 30
    pid = int(child.read_text())
    for _ in range(50):  # killed with SIGKILL and reaped by no one but init: gone, or a zombie
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's process {pid} still runs after the interrupt")


def bench_options(tmp_path: Path, only: list[str], rounds: int = 1) -> argparse.Namespace:
    """bench/scale.py's options for a tiny run built in ``tmp_path / "S"`` (``--keep``: it is reused)."""
    return argparse.Namespace(
        out=tmp_path,
        device="cpu",
        only=only,
        second_order=["none"],
        rounds=rounds,
        keep=True,
        timeout=600.0,
        build_timeout=600.0,
        memory_limit=None,
    )


def measured_order(out: str) -> list[str]:
    """The steps and baselines bench/scale.py measured, in order, from what it printed."""
    return [name + again for name, again in re.findall(r"S: (ckpt \S+|baseline \S+)( \(round \d\))?", out)]


def test_the_in_search_time_of_hessian_basis_is_read_from_its_progress_bars_between_two_baselines(
    scale, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One run of hessian-basis, its forward + backward baseline right before and right after it."""
    run = tmp_path / "S"
    scale.build_run(run, {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64})
    measured: dict = {}
    scale.bench_size("S", bench_options(tmp_path, ["hessian-basis"], rounds=3), measured, save=lambda: None)
    before_and_after = ["baseline fwd+bwd", "ckpt hessian-basis", "baseline fwd+bwd (round 2)"]
    assert measured_order(capsys.readouterr().out) == ["ckpt import", "ckpt data", "ckpt verify", *before_and_after]
    basis = measured["steps"]["hessian-basis"]
    assert basis["status"] == "ok" and len(basis["repeats"]) == 1, basis["detail"]  # once, whatever --rounds
    wall = basis["seconds"]
    passes = [r["result"]["fwd_bwd_s"] for r in measured["baselines"]["fwd+bwd"]["repeats"]]
    assert len(passes) == 2 and all(p > 0 for p in passes)
    row = scale.table("S", measured, "cpu").splitlines()[-1]
    assert row.split()[0] == "hessian-basis"
    assert (
        f"one fwd+bwd on the {scale.HESSIAN_SAMPLES} samples {passes[0]:.3f}, {passes[1]:.3f} s (before, after)" in row
    )

    log = run / "logs" / "hessian-basis.err"
    figures = scale.search_time(log)
    assert basis["result"]["search_products"] == figures["search_products"]  # what the table is made from
    stored = scale.stored_figures(run / "run.zarr", "hessian-basis")
    # every product of every basis checkpoint is counted, from tqdm's own lines
    assert figures["search_products"] == stored["matvecs"] > 0
    assert 0 <= figures["search_s"] <= wall  # tqdm shows whole seconds: a tiny search may read 00:00
    # after each search's first product: fewer products (the first of each is left out), no more time.
    # A span needs two states of a bar with products done; tqdm skips states of fast products.
    counts: dict[str, set[int]] = {}
    for step, products in re.findall(r"hessian-basis step (\d+): (\d+)product", log.read_text()):
        counts.setdefault(step, set()).add(int(products))
    spans = [step for step, seen in counts.items() if len(seen - {0}) >= 2]
    if spans:
        assert 0 < figures["steady_products"] <= figures["search_products"] - len(spans)
        assert 0 <= figures["steady_s"] <= figures["search_s"]
    else:
        assert "steady_products" not in figures
    # and each basis checkpoint's median product alone, from the bar's last postfix
    alone = figures["product_alone_s"]
    assert {int(step) for step in alone} <= {int(step) for step in ckptstore.open(run / "run.zarr").steps}
    assert len(alone) == len(set(re.findall(r"hessian-basis step (\d+):", log.read_text())))
    assert all(0 < seconds < wall for seconds in alone.values())


def test_rounds_alternate_each_analyzer_with_its_baseline_and_print_the_pairs_ratios(
    scale, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rounds 2``: loss, its baseline, the baseline again, loss again (forced). The table's ratios are the
    medians of the pairs, with their range; its wall time the median run."""
    scale.build_run(tmp_path / "S", {"n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64})
    figures: dict = {}
    scale.bench_size("S", bench_options(tmp_path, ["loss"], rounds=2), figures, save=lambda: None)
    alternated = ["ckpt loss", "baseline loss", "baseline loss (round 2)", "ckpt loss (round 2)"]
    assert measured_order(capsys.readouterr().out) == ["ckpt import", "ckpt data", "ckpt verify", *alternated]
    loss, base = figures["steps"]["loss"], figures["baselines"]["loss"]
    assert [r["status"] for r in loss["repeats"]] == ["ok", "ok"] and len(base["repeats"]) == 2
    assert "command" not in loss["repeats"][1]  # the entry's own command is the first run's
    assert "--force" not in loss["command"]  # the first run is the plain command; re-runs recompute
    logs = tmp_path / "S" / "logs"
    assert (logs / "loss.out").exists() and (logs / "baseline-loss.out").exists()  # each run's logs kept
    assert "computed 4 step(s), reused 0 stored" in (logs / "loss-2.out").read_text()  # --force: computed again

    rows = {line.split()[0]: line for line in scale.table("S", figures, "cpu").splitlines()[2:]}
    times = [ours["seconds"] / theirs["seconds"] for ours, theirs in zip(loss["repeats"], base["repeats"], strict=True)]
    assert f"{sum(times) / 2:6.2f}x" in rows["loss"]  # the median of two pairs is their mean
    assert f"2 rounds, alternated: time {min(times):.2f}-{max(times):.2f}x" in rows["loss"]
    assert f"{sum(r['seconds'] for r in loss['repeats']) / 2:8.1f}" in rows["loss"]  # wall s: the median run

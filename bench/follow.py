"""``ckpt analyze loss STORE --follow`` beside a writer: idle CPU, and commit -> result latency.

Usage::

    python bench/follow.py [--hidden 2048] [--checkpoints 5] [--idle 10]

One run measures, on the same store and model (the example MLP, ``--hidden`` wide):

- **baseline**: the wall time of a plain ``ckpt analyze loss STORE`` computing one new
  checkpoint (its own process: what a user polling by hand pays per checkpoint);
- **idle CPU**: the follower's CPU time (user + system, its children included, psutil) over
  ``--idle`` seconds while the writer commits nothing, as a share of one core;
- **latency**: for each of ``--checkpoints`` checkpoints, the time from the writer's commit
  (``Writer.write`` returned) to the follower's ``loss: step N computed`` line (printed once the
  result is committed, hence readable);
- **polling**: the CPU share of a polling watch (what an ``s3://`` follower does between
  checkpoints, here on the local record) over the same time; the bench's own threads count too;
- **stop**: the time from ``Writer.close()`` to the follower's exit.

The writer is a separate process using the public ``ckpt.create`` API; it commits when told on
its stdin. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WRITER = """
import sys, time, torch, ckpt
path, hidden = sys.argv[1], int(sys.argv[2])
from ckpt.plugins.examples import mlp
config = {"d_in": 64, "hidden": hidden, "classes": 256}
torch.manual_seed(0)
model = mlp(**config)
writer = ckpt.create(path, model="ckpt.plugins.examples:mlp", config=config, objective="cross-entropy")
writer.add_data("eval", inputs=torch.randn(512, 64), targets=torch.randint(0, 256, (512,)))
step = 0
writer.write(step, model)
print("committed", step, time.time(), flush=True)
for line in sys.stdin:
    if line.strip() == "close":
        writer.close()
        print("closed", step, time.time(), flush=True)
        break
    step += 1
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.001)
    writer.write(step, model)
    print("committed", step, time.time(), flush=True)
"""


def _ckpt() -> list[str]:
    found = Path(sys.executable).with_name("ckpt")
    return [str(found)] if found.exists() else [sys.executable, "-m", "ckpt.cli"]


def _polling_idle_share(store: str, seconds: float) -> float:
    """The CPU share of this process while a polling watch (the object-store path) waits on a quiet record."""
    import resource

    from ckpt.engine.waiting import RecordWatch

    watch = RecordWatch(store, notify=False)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    before, started = usage.ru_utime + usage.ru_stime, time.perf_counter()
    watch.wait(seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime - before) / (time.perf_counter() - started)


def main() -> None:
    """Run the bench and print its figures."""
    import psutil

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=2048, help="hidden units of the MLP")
    parser.add_argument("--checkpoints", type=int, default=5, help="checkpoints committed while following")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds the idle CPU is measured over")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "run.zarr")
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, store, str(args.hidden)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert writer.stdin is not None
        assert writer.stdout is not None

        def commit(what: str = "") -> float:
            writer.stdin.write(f"{what}\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
            return float(writer.stdout.readline().split()[2])  # type: ignore[union-attr]

        writer.stdout.readline()  # step 0 committed
        subprocess.run([*_ckpt(), "analyze", "loss", store, "--no-progress"], check=True, env=env, capture_output=True)
        commit()  # step 1
        began = time.perf_counter()
        subprocess.run([*_ckpt(), "analyze", "loss", store, "--no-progress"], check=True, env=env, capture_output=True)
        baseline = time.perf_counter() - began

        follower = subprocess.Popen(
            [*_ckpt(), "analyze", "loss", store, "--follow", "--no-progress", "--until-idle", "120s"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        lines: list[tuple[float, str]] = []

        def read() -> None:
            for line in follower.stderr:  # type: ignore[union-attr]
                lines.append((time.time(), line.strip()))

        threading.Thread(target=read, daemon=True).start()
        time.sleep(8.0)  # its start: imports, the first (empty) run, the watch set up
        process = psutil.Process(follower.pid)

        def cpu() -> float:
            own = process.cpu_times()
            return own.user + own.system + own.children_user + own.children_system

        before, started = cpu(), time.perf_counter()
        time.sleep(args.idle)
        idle_share = (cpu() - before) / (time.perf_counter() - started)

        latencies = []
        for _ in range(args.checkpoints):
            committed = commit()
            step = len(latencies) + 2
            wanted = f"loss: step {step} computed"
            deadline = time.time() + 120
            while not any(text == wanted for _, text in lines) and time.time() < deadline:
                time.sleep(0.01)
            seen = next(at for at, text in lines if text == wanted)
            latencies.append(seen - committed)
            time.sleep(1.0)
        polled = _polling_idle_share(store, args.idle)
        closed = commit("close")
        follower.wait(timeout=120)
        stopped = time.time() - closed
        writer.wait(timeout=60)
    print(
        json.dumps(
            {
                "model": f"mlp(d_in=64, hidden={args.hidden}, classes=256)",
                "baseline_plain_analyze_one_step_s": round(baseline, 3),
                "idle_cpu_share_of_one_core": round(idle_share, 5),
                "idle_seconds": args.idle,
                "polling_watch_idle_cpu_share": round(polled, 5),
                "commit_to_readable_s": [round(x, 3) for x in latencies],
                "commit_to_readable_median_s": round(statistics.median(latencies), 3),
                "close_to_follower_exit_s": round(stopped, 3),
                "follower_exit": follower.returncode,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

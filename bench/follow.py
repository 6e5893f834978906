"""``ckpt analyze loss STORE --follow`` beside a writer: idle CPU, latency, and what it costs training.

Usage::

    python bench/follow.py [--hidden 2048] [--checkpoints 5] [--idle 10]      # both parts
    python bench/follow.py --parts training [--steps 32] [--every 2] [--paced 5]

Part ``idle`` measures, on the same store and model (the example MLP, ``--hidden`` wide):

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
its stdin.

Part ``training`` (issue 71's targets for ``follow=[...]``) runs a real training loop: the S
model of bench/scale.py (GPT-2, 4 layers, d 256, vocab 8,192, its ``TRAIN_BATCH`` sequences of
``CONTEXT`` tokens per AdamW step, its 32 eval sequences), in a child process pinned to one core
(``os.sched_setaffinity``, one torch thread), writing a checkpoint every ``--every`` steps through
``ckpt.create``. Three arms, one after the other in that process, each its own store:

- **without**, **with**, **without**: the same ``--steps`` steps; in ``with`` the writer was
  created with ``follow=["loss"]`` and its follower pinned to another core. The figure is the
  median step time (forward, backward, optimizer; the commits are timed apart) of ``with`` over
  that of both ``without`` arms: target at most 1.05. On a shared machine the arms drift apart
  by more than that, so the ``with`` arm also alternates, checkpoint by checkpoint, blocks of
  steps with its follower running and blocks with it stopped (SIGSTOP; it catches up when
  continued, so it computes in the running blocks): the ratio of those two medians compares
  steps seconds apart. The ``with`` figure is that of its running blocks. Each step's own CPU
  time (``time.thread_time``) is compared the same ways: the machine's other load takes wall time
  from the trainer (a busy follower core sends every other process to the trainer's), not CPU time,
  while contention for caches and memory shows in both;
- **latency** (end of the ``with`` arm): once the follower has caught up, ``--paced`` checkpoints
  committed one at a time, each the time from its commit to the follower's ``loss: step N
  computed`` line in its log (printed once the result is committed, hence readable), against
  **the compute itself**: plain PyTorch's per-token loss of the eval sequences on that core
  (median of 3, warm). Target: latency at most 2 s more than the compute.

Prints one JSON object per part.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def idle_part(args: argparse.Namespace) -> None:
    """Part ``idle``: the follower's idle CPU, commit -> readable on the MLP, polling, stop."""
    import psutil

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


# -- part "training": follow=[...] beside a training loop ------------------------------------------------------


def _pin(pid: int, core: int) -> None:
    """Every thread of process ``pid`` on ``core`` (threads it starts later inherit it)."""
    import psutil

    for thread in psutil.Process(pid).threads():
        os.sched_setaffinity(thread.id, {core})


def _seen(log: Path, line: str, timeout: float = 300.0) -> float:
    """The time ``line`` appeared in the follower's ``log`` (polled every 10 ms)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if line in log.read_text().splitlines():
            return time.time()
        time.sleep(0.01)
    msg = f"{line!r} not in {log} after {timeout} s"
    raise RuntimeError(msg)


def train_child(folder: Path, steps: int, every: int, paced: int) -> dict[str, object]:
    """The three arms in this process (see the module's docstring); their figures."""
    import numpy as np
    import psutil
    import torch
    from scale import CONTEXT, EVAL_SEQUENCES, SIZES, TRAIN_BATCH
    from transformers import GPT2Config, GPT2LMHeadModel

    import ckpt
    from ckpt.store.huggingface import untied_state
    from ckpt.store.importers import HF_FACTORY, hf_model_config

    trainer_core, follower_core = sorted(os.sched_getaffinity(0))[:2]
    torch.set_num_threads(1)
    config = SIZES["S"]
    vocab = config["vocab_size"]
    special = {"bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
    eval_ids = torch.as_tensor(np.random.default_rng(1).integers(0, vocab, (EVAL_SEQUENCES, CONTEXT)))
    train = torch.as_tensor(np.random.default_rng(0).integers(0, vocab, (steps, TRAIN_BATCH, CONTEXT)))

    def fresh() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(n_positions=CONTEXT, **special, **config))

    def arm(name: str, follow: list[str]) -> dict[str, object]:
        model = fresh()
        spec = hf_model_config(model.config.to_dict() | {"architectures": ["GPT2LMHeadModel"]})
        store = folder / f"{name}.zarr"
        writer = ckpt.create(store, model=HF_FACTORY, config=spec, objective="causal-lm", follow=follow)
        for process in writer.followers:
            _pin(process.pid, follower_core)
        os.sched_setaffinity(0, {trainer_core})
        writer.add_data("eval", inputs=eval_ids)
        writer.write(0, untied_state(model))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step_s: list[float] = []
        stopped_s: list[float] = []  # with a follower: the blocks it was stopped (SIGSTOP) in
        cpu_s: list[float] = []  # the step's own CPU time, running blocks (or all, without a follower)
        stopped_cpu_s: list[float] = []
        commit_s = []
        model.train()
        for step in range(1, steps + 1):
            running = not follow or (step - 1) // every % 2 == 1
            if follow and (step - 1) % every == 0:
                for process in writer.followers:
                    os.kill(process.pid, signal.SIGCONT if running else signal.SIGSTOP)
            began, began_cpu = time.perf_counter(), time.thread_time()
            loss = model(train[step - 1], labels=train[step - 1]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            (step_s if running else stopped_s).append(time.perf_counter() - began)
            (cpu_s if running else stopped_cpu_s).append(time.thread_time() - began_cpu)
            if step % every == 0:
                began = time.perf_counter()
                writer.write(step, untied_state(model), metrics={"loss": loss.item()})
                commit_s.append(time.perf_counter() - began)
        figures: dict[str, object] = {
            "step_s": step_s,
            "stopped_s": stopped_s,
            "cpu_s": cpu_s,
            "stopped_cpu_s": stopped_cpu_s,
            "commit_s": commit_s,
        }
        if follow:
            for process in writer.followers:
                os.kill(process.pid, signal.SIGCONT)
            log = writer.follow_log
            assert log is not None
            last = steps - steps % every
            caught_up = time.time()
            figures["follower_behind_at_end_s"] = _seen(log, f"loss: step {last} computed") - caught_up
            latencies = []
            for extra in range(1, paced + 1):
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.add_(1e-4)
                writer.write(last + extra, untied_state(model))
                committed = time.time()
                latencies.append(_seen(log, f"loss: step {last + extra} computed") - committed)
            figures["latency_s"] = latencies
        pids = [process.pid for process in writer.followers]
        writer.close()
        psutil.wait_procs([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)], timeout=300)
        return figures

    without = arm("without-1", [])
    followed = arm("with", ["loss"])
    again = arm("without-2", [])
    os.sched_setaffinity(0, {follower_core})  # the compute itself, on the follower's core
    model = fresh().eval()
    computes = []
    with torch.no_grad():
        for _ in range(4):
            began = time.perf_counter()
            logits = model(eval_ids).logits[:, :-1]
            torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), eval_ids[:, 1:].reshape(-1), reduction="none")
            computes.append(time.perf_counter() - began)
    return {"without": [without, again], "with": followed, "compute_s": statistics.median(computes[1:])}


def training_part(args: argparse.Namespace) -> None:
    """Part ``training``: the training loop's step time with a follower beside it, and commit -> readable at S."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print(json.dumps({"training": f"needs two cores, this process may use {len(cores)}"}))
        return
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, __file__, "--train-child", folder, str(args.steps), str(args.every), str(args.paced)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-4000:])
        figures = json.loads(done.stdout.splitlines()[-1])
        log = (Path(folder) / "with.zarr.follow.log").read_text()
    warm = 2  # the first steps: allocator and caches
    without = statistics.median([s for a in figures["without"] for s in a["step_s"][warm:]])
    followed = figures["with"]
    with_s = statistics.median(followed["step_s"])
    stopped = statistics.median(followed["stopped_s"][warm:])
    latency = statistics.median(followed["latency_s"])
    print(
        json.dumps(
            {
                "model": "bench/scale.py S (GPT-2, 4 layers, d 256, vocab 8192), AdamW, one torch thread",
                "cores": f"trainer on core {cores[0]}, follower on core {cores[1]} (of {len(cores)})",
                "steps_per_arm": args.steps,
                "checkpoint_every": args.every,
                "step_s_without_median": round(without, 4),
                "step_s_with_follower_median": round(with_s, 4),
                "step_time_ratio_with_over_without": round(with_s / without, 3),
                "step_s_without_arms": [round(statistics.median(a["step_s"][warm:]), 4) for a in figures["without"]],
                "step_s_follower_stopped_median": round(stopped, 4),
                "step_time_ratio_interleaved_running_over_stopped": round(with_s / stopped, 3),
                "step_cpu_ratio_interleaved_running_over_stopped": round(
                    statistics.median(followed["cpu_s"]) / statistics.median(followed["stopped_cpu_s"][warm:]), 3
                ),
                "step_cpu_ratio_with_over_without": round(
                    statistics.median(followed["cpu_s"])
                    / statistics.median([s for a in figures["without"] for s in a["cpu_s"][warm:]]),
                    3,
                ),
                "commit_s_median": round(statistics.median(followed["commit_s"]), 4),
                "follower_behind_at_end_s": round(followed["follower_behind_at_end_s"], 3),
                "commit_to_loss_readable_s": [round(x, 3) for x in followed["latency_s"]],
                "commit_to_loss_readable_median_s": round(latency, 3),
                "compute_itself_s": round(figures["compute_s"], 3),
                "latency_over_compute_s": round(latency - figures["compute_s"], 3),
                "follower_log_lines": len(log.splitlines()),
            },
            indent=2,
        )
    )


def main() -> None:
    """Run the parts asked for and print their figures."""
    if len(sys.argv) > 1 and sys.argv[1] == "--train-child":
        sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/scale.py's S model
        folder, steps, every, paced = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(train_child(Path(folder), steps, every, paced)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="idle,training", help="comma-separated: idle, training")
    parser.add_argument("--hidden", type=int, default=2048, help="idle: hidden units of the MLP")
    parser.add_argument("--checkpoints", type=int, default=5, help="idle: checkpoints committed while following")
    parser.add_argument("--idle", type=float, default=10.0, help="idle: seconds the idle CPU is measured over")
    parser.add_argument("--steps", type=int, default=32, help="training: optimizer steps per arm")
    parser.add_argument("--every", type=int, default=2, help="training: a checkpoint every this many steps")
    parser.add_argument("--paced", type=int, default=5, help="training: checkpoints of the latency phase")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "idle" in parts:
        idle_part(args)
    if "training" in parts:
        training_part(args)


if __name__ == "__main__":
    main()

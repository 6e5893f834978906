"""Benchmark of ckpt on real model sizes: GPT-2 runs of three sizes, every step through the real CLI.

Run by hand (not a test), from the repository root::

    python bench/scale.py --sizes S,M --memory-limit 6 --timeout 300   # this 2-core, 24 GiB machine
    python bench/scale.py --sizes L --device cuda                      # a GPU machine
    python bench/scale.py --sizes S --only loss,grad-norms --keep      # reuse the runs built before
    python bench/scale.py --sizes S,M --only loss,grad-norms --rounds 3 --keep   # medians of alternated pairs
    python bench/scale.py --print bench/out/scale/scale-S-M-cpu.json   # the tables of an earlier run

What it builds (issue 29): for each size a Hugging Face Trainer-style output folder
(``checkpoint-N/`` holding ``config.json``, ``model.safetensors`` and
``trainer_state.json``) of a randomly initialised, seeded ``GPT2LMHeadModel``
trained by AdamW, two steps between checkpoints, 4 checkpoints; and 32 eval
sequences of 128 random token ids (seeded). Sizes (context 128 everywhere):

    S  4 layers, d 256, vocab  8,192   (~5.3M parameters)
    M  6 layers, d 512, vocab 16,384   (~27.4M)
    L  GPT-2 small: 12 layers, d 768, vocab 50,257  (~123.8M)

What it measures, each step in a fresh subprocess: ``ckpt import``, ``ckpt data
add``, ``ckpt verify``, ``ckpt analyze loss``, ``grad-norms``, ``hessian-basis
--samples 8``, ``random-basis`` + ``polca --basis random-basis --second-order
none`` (first order only; ``--second-order exact,paper`` measures those too, as ``polca exact`` ...) and
``ckpt report``; for each its wall time (the whole
process: start-up, imports, reading the store, computing, saving) and peak
resident memory. Peak RSS is the child's ``ru_maxrss`` from ``os.wait4`` on that
one child: exact (no polling gap), per child (``RUSAGE_CHILDREN`` would give the
largest child of the whole run so far), and the largest of the child and any
processes it waited for. With ``--device cuda`` the analyzers get ``--device cuda``
and each ckpt process writes ``torch.cuda.max_memory_allocated()`` at exit (a
small wrapper around ckpt's own CLI entry point registers the hook; a process
killed by a signal reports none).

Baselines, measured in the same run, each in its own subprocess, plain PyTorch on
the same Trainer folders through ``transformers``:

- ``loss``: per-token loss of every eval sequence at every checkpoint (no_grad);
- ``backward``: one backward pass of the mean loss at every checkpoint, gradient norms;
- ``fwd+bwd``: one forward + backward over the Hessian sample (8 sequences), median
  of 5 after a warm-up: what one Hessian-vector product is compared with
  (ckpt's seconds per product four ways: hessian-basis's wall time / its ``matvecs``,
  an upper bound where start-up and building the graphs count too; its progress bars'
  elapsed time / products, the time a product in the searches with their vector work;
  the same after each search's first product, which also builds the kept graphs;
  and the median product alone, which the bars show beside their rate);
- ``floor``: K forward passes over the eval data at every checkpoint, K the
  random basis's vector count: POLCA's floor.

Each baseline runs right after its ckpt step, so that both see the machine in the
same state: on this 2-core machine the same command's wall time moves by 10-30%
within minutes (grad-norms at M against its plain backward loop, alternated
three times: 1.14-1.26x; one pair a few minutes apart: 1.36x). ``--rounds N``
measures loss, grad-norms and polca N times each, alternated with their baselines
(ckpt, baseline, baseline, ckpt, ...; a re-run with ``--force``), and prints the
median of the pairs' ratios with their range. hessian-basis runs once, its
forward + backward measured right before and right after it.

Ratios are ckpt / baseline, wall time and peak memory (RSS; GPU with ``--device
cuda``). A step that passes ``--timeout`` is killed and reported "not done after
N s"; one over ``--memory-limit`` (the RSS of its process tree, polled every
0.1 s) is killed and reported so; one that fails is reported with its exit status
or signal and the last line of its stderr; the script goes on. Every step's
stdout and stderr are kept under ``--out``; the figures go to
``--out/scale-<sizes>-<device>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CONTEXT = 128
EVAL_SEQUENCES = 32
CHECKPOINTS = 4
STEPS_BETWEEN = 2  # AdamW steps between checkpoints
TRAIN_BATCH = 8
HESSIAN_SAMPLES = 8
SIZES = {
    "S": {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 8192},
    "M": {"n_layer": 6, "n_embd": 512, "n_head": 8, "vocab_size": 16384},
    "L": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257},
}
ANALYZERS = ("loss", "grad-norms", "hessian-basis", "polca", "report")
"""What ``--only`` selects; import, data add and verify always run (the analyzers need the store)."""
BASELINE_OF = {"loss": "loss", "grad-norms": "backward", "hessian-basis": "fwd+bwd", "polca": "floor"}

# Runs ckpt's own CLI entry point (what the `ckpt` console script calls) after registering an exit
# hook that records the process's peak CUDA memory, if it used CUDA: no change to ckpt needed.
CLI_WRAPPER = """\
import atexit, os, sys
def _peak():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        with open(os.environ["CKPT_BENCH_GPU_PEAK"], "w") as f:
            f.write(str(torch.cuda.max_memory_allocated()))
atexit.register(_peak)
sys.argv[0] = "ckpt"
from ckpt.cli.main import main
main()
"""


# -- building the runs ----------------------------------------------------------------------------------------


def build_run(folder: Path, config: dict[str, int], seed: int = 0) -> dict[str, Any]:
    """A Trainer-style output folder: ``checkpoint-N/`` every ``STEPS_BETWEEN`` AdamW steps, and the eval ids.

    Writes ``folder/trainer-out/checkpoint-N/{config.json, model.safetensors, trainer_state.json}``
    (what ``ckpt import`` reads of a Trainer folder) and ``folder/eval_ids.npy`` ([32, 128] int64).
    Returns the parameter count and the seconds it took.
    """
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    began = time.perf_counter()
    torch.manual_seed(seed)
    vocab = config["vocab_size"]
    # GPT-2's end-of-text token is its last one (50256 at L); the smaller vocabularies keep that place
    special = {"bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
    model = GPT2LMHeadModel(GPT2Config(n_positions=CONTEXT, **special, **config))
    rng = np.random.default_rng(seed)
    train = torch.as_tensor(rng.integers(0, vocab, (CHECKPOINTS * STEPS_BETWEEN, TRAIN_BATCH, CONTEXT)))
    out = folder / "trainer-out"
    shutil.rmtree(out, ignore_errors=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history: list[dict[str, float]] = []
    model.train()
    for step in range(1, CHECKPOINTS * STEPS_BETWEEN + 1):
        ids = train[step - 1]
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        optimizer.step()
        history.append({"loss": loss.item(), "grad_norm": norm.item(), "learning_rate": 1e-3, "step": step})
        if step % STEPS_BETWEEN == 0:
            checkpoint = out / f"checkpoint-{step}"
            model.save_pretrained(checkpoint)  # config.json + model.safetensors, as the Trainer saves them
            state = {"global_step": step, "max_steps": CHECKPOINTS * STEPS_BETWEEN, "log_history": history}
            (checkpoint / "trainer_state.json").write_text(json.dumps(state, indent=2))
    eval_ids = np.random.default_rng(seed + 1).integers(0, vocab, (EVAL_SEQUENCES, CONTEXT), dtype=np.int64)
    np.save(folder / "eval_ids.npy", eval_ids)
    info = {"parameters": sum(p.numel() for p in model.parameters()), "build_s": time.perf_counter() - began}
    (folder / "run.json").write_text(json.dumps({**info, "config": config, "seed": seed}))
    return info


def checkpoint_folders(folder: Path) -> list[Path]:
    return sorted((folder / "trainer-out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


# -- the baselines (run in a child: python bench/scale.py --baseline NAME --run DIR) ----------------------------


def baseline(name: str, folder: Path, device: str, k: int) -> dict[str, Any]:
    """One plain-PyTorch baseline over the run in ``folder``; figures for the parent, as a dict."""
    import numpy as np
    import torch
    from transformers import GPT2LMHeadModel

    ids = torch.as_tensor(np.load(folder / "eval_ids.npy")).to(device)

    def token_losses(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        # causal LM: the logits at t predict the token at t+1 (every token but the first is a datapoint)
        logits = model(batch).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="none")

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    began = time.perf_counter()
    for checkpoint in checkpoint_folders(folder):
        model = GPT2LMHeadModel.from_pretrained(checkpoint).to(device).eval()  # eval mode, as ckpt's models run
        step = checkpoint.name.split("-")[1]
        if name == "loss":
            with torch.no_grad():
                out.setdefault("mean_loss", {})[step] = float(token_losses(model, ids).double().mean())
        elif name == "backward":
            token_losses(model, ids).mean().backward()
            squares = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
            out.setdefault("total_grad_norm", {})[step] = squares**0.5
        elif name == "floor":
            with torch.no_grad():
                for _ in range(k):
                    token_losses(model, ids)
        elif name == "fwd+bwd":
            sample = ids[:HESSIAN_SAMPLES]
            token_losses(model, sample).mean().backward()  # warm-up: allocator, kernels
            times = []
            for _ in range(5):
                model.zero_grad()
                sync()
                t0 = time.perf_counter()
                token_losses(model, sample).mean().backward()
                sync()
                times.append(time.perf_counter() - t0)
            out["fwd_bwd_s"] = statistics.median(times)
            break  # one checkpoint is enough for the time of one pass
        else:
            raise SystemExit(f"unknown baseline {name!r}")
    sync()
    out["compute_s"] = time.perf_counter() - began
    if device.startswith("cuda"):
        out["gpu_peak"] = torch.cuda.max_memory_allocated()
    return out


# -- measuring one subprocess ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one measured subprocess did."""

    command: list[str]
    status: str  # ok | timeout | memory | failed
    seconds: float
    peak_rss: int  # bytes
    gpu_peak: int | None = None
    detail: str = ""
    result: dict[str, Any] = field(default_factory=dict)  # a baseline's JSON, or figures read from the store

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Dask may start worker processes)."""
    import psutil  # a dependency of dask.distributed, hence of ckpt

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:  # exited between the listing and the reading
        return 0


def measure(command: list[str], logs: Path, timeout: float, memory_limit: float | None) -> Outcome:
    """Run ``command`` to its end, ``timeout`` or ``memory_limit`` (bytes), and say what it cost.

    The child gets its own session, so that a kill reaches every process it started.
    """
    logs.parent.mkdir(parents=True, exist_ok=True)
    gpu_file = logs.with_suffix(".gpu")
    gpu_file.unlink(missing_ok=True)
    env = {**os.environ, "CKPT_BENCH_GPU_PEAK": str(gpu_file), "PYTHONWARNINGS": "ignore"}
    with open(logs.with_suffix(".out"), "w") as stdout, open(logs.with_suffix(".err"), "w") as stderr:
        began = time.perf_counter()
        child = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, start_new_session=True)
        killed = ""
        try:
            while True:
                pid, status, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                elapsed = time.perf_counter() - began
                if not killed and elapsed > timeout:
                    killed = f"not done after {timeout:g} s"
                elif not killed and memory_limit and (rss := tree_rss(child.pid)) > memory_limit:
                    killed = f"killed at the memory limit ({rss / 2**30:.1f} GiB RSS) after {elapsed:.0f} s"
                if killed:
                    os.killpg(child.pid, signal.SIGKILL)
                    pid, status, usage = os.wait4(child.pid, 0)
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:  # our own Ctrl-C (a time limit's SIGINT): the child's session goes with us
            with contextlib.suppress(ProcessLookupError):  # already reaped
                os.killpg(child.pid, signal.SIGKILL)
            raise
        seconds = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    outcome = Outcome(command, "ok", seconds, usage.ru_maxrss * 1024)  # ru_maxrss is in KiB on Linux
    if gpu_file.exists():
        outcome.gpu_peak = int(gpu_file.read_text())
    if killed:
        outcome.status = "timeout" if killed.startswith("not done") else "memory"
        outcome.detail = killed
    elif child.returncode != 0:
        outcome.status = "failed"
        lines = [line for line in logs.with_suffix(".err").read_text().splitlines() if line.strip()]
        how = f"signal {signal.Signals(-child.returncode).name}" if child.returncode < 0 else "exit"
        outcome.detail = f"{how} {child.returncode}: {lines[-1] if lines else '(no stderr)'}"
        if child.returncode == -signal.SIGKILL:
            outcome.detail += " (SIGKILL we did not send: likely the kernel's OOM killer)"
    return outcome


def ckpt_command(*args: str) -> list[str]:
    return [sys.executable, "-c", CLI_WRAPPER, *args]


# -- one size -------------------------------------------------------------------------------------------------


def ckpt_steps(store: Path, folder: Path, args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The measured ckpt commands of one size, in order, as (name, command)."""
    device = ("--device", args.device)
    analyze = ("--no-progress", *device)
    steps = [
        ("import", ckpt_command("import", str(folder / "trainer-out"), str(store), "--overwrite")),
        ("data add", ckpt_command("data", "add", str(store), "eval", "--inputs", str(folder / "eval_ids.npy"))),
        ("verify", ckpt_command("verify", str(store))),
        ("loss", ckpt_command("analyze", "loss", str(store), *analyze)),
        ("grad-norms", ckpt_command("analyze", "grad-norms", str(store), *analyze)),
        (
            "hessian-basis",
            # with its progress bars, whose elapsed time per basis checkpoint gives the in-search time a product
            ckpt_command(
                "analyze",
                "hessian-basis",
                str(store),
                "--samples",
                str(HESSIAN_SAMPLES),
                "--progress",
                *device,
            ),
        ),
        # the random basis is computed on its own first, so that polca's time is POLCA's alone
        ("random-basis", ckpt_command("analyze", "random-basis", str(store), *analyze)),
        *(
            (
                "polca" if order == "none" else f"polca {order}",
                ckpt_command(
                    "analyze", "polca", str(store), "--basis", "random-basis", "--second-order", order, *analyze
                ),
            )
            for order in args.second_order
        ),
        ("report", ckpt_command("report", str(store), "--out", str(folder / "report.html"))),
    ]
    wanted = set(args.only)
    if "polca" in wanted:
        wanted.add("random-basis")
    always = ("import", "data add", "verify")
    return [(name, command) for name, command in steps if name in always or name.split()[0] in wanted]


def stored_figures(store: Path, name: str) -> dict[str, Any]:
    """What the baselines and ratios need from a stored result: means to compare, matvecs, K."""
    import ckpt

    result = ckpt.open(store).analysis(name)
    if name == "loss":
        values = result["mean_loss"].values
        return {"mean_loss": {str(int(s)): float(v) for s, v in zip(result.step.values, values, strict=True)}}
    if name == "grad-norms":
        values = result["total_grad_norm"].values
        return {"total_grad_norm": {str(int(s)): float(v) for s, v in zip(result.step.values, values, strict=True)}}
    if name == "hessian-basis":
        return {"matvecs": int(result["matvecs"].values.sum()), "vectors": int(result.sizes["basis"])}
    if name == "random-basis":
        return {"vectors": int(result.sizes["basis"])}
    return {}


def search_time(stderr: Path) -> dict[str, Any]:
    """Seconds and products of hessian-basis's searches, from the last state of each checkpoint's progress bar.

    A bar is made once the checkpoint's parameters are read and its memory planned, and counts the
    products (the kept graphs are built in the first): its elapsed time over its count is the time a
    product in the search, where the process's wall time over all products also counts start-up,
    reading and planning.

    The first product also builds the kept graphs, so the bars are read a second way too: from
    each bar's first state with a product done to its last (``steady_s`` over ``steady_products``),
    the products after the first with their vector work. tqdm may skip states of fast products;
    then that span starts later, never earlier.
    """
    last: dict[str, tuple[int, float, float | None]] = {}
    first: dict[str, tuple[int, float]] = {}
    pattern = r"hessian-basis step (\d+): (\d+)product \[(\d+(?::\d+)+)([^\]\r\n]*)"
    for step, products, elapsed, rest in re.findall(pattern, stderr.read_text()):
        seconds = sum(float(part) * 60**i for i, part in enumerate(reversed(elapsed.split(":"))))
        alone = re.search(r"a product alone ([\d.e+-]+) s \(median\)", rest)
        count = int(products)
        last[step] = (count, seconds, float(alone.group(1)) if alone else None)
        if count >= 1:
            first.setdefault(step, (count, seconds))
    if not last:
        return {}
    figures: dict[str, Any] = {
        "search_products": sum(p for p, _, _ in last.values()),
        "search_s": sum(t for _, t, _ in last.values()),
    }
    steady = [(last[s][0] - n, last[s][1] - t) for s, (n, t) in first.items() if last[s][0] > n]
    if steady:
        figures["steady_products"] = sum(n for n, _ in steady)
        figures["steady_s"] = sum(t for _, t in steady)
    # each checkpoint's median product, the operator alone (the bar's own figure)
    alone = {step: m for step, (_, _, m) in last.items() if m is not None}
    if alone:
        figures["product_alone_s"] = alone
    return figures


def bench_size(size: str, args: argparse.Namespace, figures: dict[str, Any], save: Callable[[], None]) -> None:
    """Build (or reuse) size ``size``'s run, then measure ckpt's steps and the baselines into ``figures``.

    ``save`` is called after every measurement, so that a run stopped at a time limit keeps what it measured.
    """
    folder = args.out / size
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "run.zarr"
    limit = args.memory_limit * 2**30 if args.memory_limit else None
    figures.update(config=SIZES[size], steps={}, baselines={})
    built = folder / "run.json"
    if args.keep and built.exists() and len(checkpoint_folders(folder)) == CHECKPOINTS:
        figures["run"] = json.loads(built.read_text())
        print(f"{size}: reusing the run in {folder}", flush=True)
    else:
        print(f"{size}: building the run in {folder} ...", flush=True)
        command = [sys.executable, __file__, "--build", size, "--run", str(folder)]
        done = measure(command, folder / "logs" / "build", args.build_timeout, limit)
        figures["run"] = {**json.loads(built.read_text()), "outcome": asdict(done)} if done.ok else asdict(done)
        save()
        if not done.ok:
            print(f"{size}: building the run failed: {done.detail}", flush=True)
            return
    at = Measuring(size, args, figures, limit, save)
    vectors = None  # the random basis's, for the floor of polca
    for name, command in ckpt_steps(store, folder, args):
        baseline_name = BASELINE_OF.get(name)
        if name == "hessian-basis":
            # its baseline is one forward + backward, timed inside the baseline's process; taken right before
            # and right after the search (tens of minutes at L), it shows how far the machine's speed moved
            measure_baseline(at, baseline_name, vectors)
        done = measure_step(at, name, command)
        if name in ("import", "data add") and not done.ok:
            break  # nothing after can run
        if name == "random-basis" and done.ok:
            vectors = done.result.get("vectors")
        if baseline_name is None or not done.ok or (baseline_name == "floor" and not vectors):
            continue
        measure_baseline(at, baseline_name, vectors)
        for again in range(1, 1 if name == "hessian-basis" else args.rounds):
            # alternated (ckpt, baseline, baseline, ckpt, ...): a drift of the machine's speed weighs on both
            again_command = [*command, "--force"]
            if again % 2:
                measure_baseline(at, baseline_name, vectors)
                measure_step(at, name, again_command)
            else:
                measure_step(at, name, again_command)
                measure_baseline(at, baseline_name, vectors)


def _record(entry: dict[str, Any] | None, done: Outcome) -> dict[str, Any]:
    """``entry`` (the first measurement, as before ``--rounds``) with ``done`` added to its ``repeats``."""
    repeat = {key: value for key, value in asdict(done).items() if key != "command"}
    if entry is None:
        return {**asdict(done), "repeats": [repeat]}
    entry["repeats"].append(repeat)
    return entry


@dataclass(frozen=True)
class Measuring:
    """What every measurement of one size records into and is bounded by."""

    size: str
    args: argparse.Namespace
    figures: dict[str, Any]
    limit: float | None
    """Peak RSS (bytes) at which a measured command is killed: ``--memory-limit``, or None."""
    save: Callable[[], None]
    """Called after every measurement, so that a run stopped at a time limit keeps what it measured."""


def measure_step(at: Measuring, name: str, command: list[str]) -> Outcome:
    """One run of ckpt step ``name``, recorded in ``figures["steps"]`` (a repeat after the first)."""
    store = at.args.out / at.size / "run.zarr"

    def read_result(done: Outcome, logs: Path) -> None:
        if name in ("loss", "grad-norms", "hessian-basis", "random-basis"):
            done.result = stored_figures(store, name)
        if name == "hessian-basis":
            done.result |= search_time(logs.with_suffix(".err"))

    return measure_round(at, "steps", name, f"ckpt {name}", name.replace(" ", "-"), command, read_result)


def measure_baseline(at: Measuring, name: str, vectors: int | None) -> Outcome:
    """One run of plain-PyTorch baseline ``name``, recorded in ``figures["baselines"]`` (a repeat after the first)."""
    run = at.args.out / at.size
    command = [sys.executable, __file__, "--baseline", name, "--run", str(run), "--device", at.args.device]
    command += ["--k", str(vectors or 0)]

    def read_result(done: Outcome, logs: Path) -> None:
        done.result = json.loads(logs.with_suffix(".out").read_text().splitlines()[-1])
        done.gpu_peak = done.result.get("gpu_peak")

    return measure_round(at, "baselines", name, f"baseline {name}", f"baseline-{name}", command, read_result)


def measure_round(
    at: Measuring,
    kind: str,
    name: str,
    label: str,
    logs: str,
    command: list[str],
    read_result: Callable[[Outcome, Path], None],
) -> Outcome:
    """Run ``command`` once, as ``figures[kind][name]`` or (after the first) a repeat of it, and save the figures.

    ``logs``: the stem of its log files (``-2``, ``-3``, ... for the repeats); ``read_result`` fills in a run
    that ended well (``done.result``) from them or from the store.
    """
    figures = at.figures[kind]
    count = len(figures.get(name, {}).get("repeats", []))
    print(f"{at.size}: {label}{f' (round {count + 1})' if count else ''} ...", end=" ", flush=True)
    path = at.args.out / at.size / "logs" / (logs + (f"-{count + 1}" if count else ""))
    done = measure(command, path, at.args.timeout, at.limit)
    if done.ok:
        read_result(done, path)
    print(f"{done.seconds:.1f} s, {done.peak_rss / 2**30:.2f} GiB" + (f" ({done.detail})" if done.detail else ""))
    figures[name] = _record(figures.get(name), done)
    at.save()
    return done


# -- printing -------------------------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None, at_least: bool = False) -> str:
    """``a / b``; ``at_least``: ``a`` is what a killed step had reached, so the ratio is a lower bound."""
    return f"{'>=' if at_least else ''}{a / b:.2f}x" if a and b else "-"


def agreement(step: dict[str, Any], base: dict[str, Any]) -> str:
    """Largest relative difference of ckpt's per-checkpoint means / norms from the baseline's."""
    for key in ("mean_loss", "total_grad_norm"):
        ours, theirs = step.get("result", {}).get(key), base.get("result", {}).get(key)
        if ours and theirs:
            worst = max(abs(ours[s] - theirs[s]) / abs(theirs[s]) for s in theirs if s in ours)
            return f"{key} equal to plain PyTorch's within {worst:.1e} (relative)"
    return ""


def repeats(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measurement of a step or baseline, in order (a figures file from before ``--rounds`` holds one)."""
    return entry.get("repeats") or [entry]


def typical(entry: dict[str, Any], key: str) -> float:
    """The median of ``key`` over the measurements that ran to their end (the first one's where none did)."""
    done = [r[key] for r in repeats(entry) if r["status"] == "ok" and r.get(key) is not None]
    return statistics.median(done) if done else entry.get(key) or 0


def spread(values: list[float]) -> str:
    """``low-high`` of ratios, for the notes."""
    return f"{min(values):.2f}-{max(values):.2f}x"


def against_each(seconds: float, passes: list[float]) -> str:
    """The ratio of ``seconds`` to each of several forward + backward times, for the notes (none for one)."""
    if len(passes) < 2:
        return ""
    return f" (against the fwd+bwd before and after: {spread([seconds / p for p in passes])})"


def table(size: str, figures: dict[str, Any], device: str) -> str:
    run = figures.get("run", {})
    lines = [
        f"{size}: {figures['config']} -> {run.get('parameters', 0):,} parameters, {CHECKPOINTS} checkpoints, "
        f"{EVAL_SEQUENCES} x {CONTEXT} eval tokens, {device}"
    ]
    gpu = device.startswith("cuda")
    header = f"  {'step':<14} {'wall s':>8} {'peak RSS':>9}"
    header += f" {'GPU peak':>9}" if gpu else ""
    header += f"  {'baseline':<9} {'wall s':>7} {'peak RSS':>9}  {'time':>7} {'memory':>7}  notes"
    lines.append(header)

    def memories(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[int, int]:
        # on CUDA the GPU memory is the one that runs out; on a CPU (or without both GPU figures) the RSS
        if gpu and ours.get("gpu_peak") and theirs.get("gpu_peak"):
            return ours["gpu_peak"], theirs["gpu_peak"]
        return ours["peak_rss"], theirs["peak_rss"]

    for name, step in figures["steps"].items():
        base = figures["baselines"].get(BASELINE_OF.get(name, ""), {})
        killed = step["status"] in ("timeout", "memory")
        # with --rounds, the columns are medians over the runs that ended well, the ratios medians of pairs
        row = f"  {name:<14} {typical(step, 'seconds'):8.1f} {typical(step, 'peak_rss') / 2**30:8.2f}G"
        if gpu:
            row += f" {step['gpu_peak'] / 2**30:8.2f}G" if step.get("gpu_peak") else f" {'-':>9}"
        notes = [step["detail"]] if step["detail"] else []
        notes += [f"round {i + 1}: {r['detail']}" for i, r in enumerate(repeats(step)[1:], 1) if r["detail"]]
        if base:
            row += f"  {BASELINE_OF[name]:<9} {typical(base, 'seconds'):7.1f} {typical(base, 'peak_rss') / 2**30:8.2f}G"
        if base and name == "hessian-basis":
            # per Hessian-vector product (its share of the wall time) against one forward + backward, measured
            # right before and right after the search: their median, and the ratio against each
            passes = [r["result"]["fwd_bwd_s"] for r in repeats(base) if r.get("result", {}).get("fwd_bwd_s")]
            per_pass = statistics.median(passes) if passes else None
            matvecs = step.get("result", {}).get("matvecs")
            per_product = step["seconds"] / matvecs if matvecs else None
            memory_ratio = ratio(*memories(step, base), killed)
            row += f"  {ratio(per_product, per_pass):>7} {memory_ratio:>7}"
            if per_product:
                notes.append(f"{matvecs} products, <= {per_product:.3f} s each (wall / products)")
            searched, products = step.get("result", {}).get("search_s"), step.get("result", {}).get("search_products")
            if searched and products and per_pass:
                in_search = searched / products
                each = against_each(in_search, passes)
                notes.append(
                    f"in the searches {in_search:.3f} s a product, {ratio(in_search, per_pass)} a fwd+bwd{each}"
                )
            steady_s, steady_products = (step.get("result", {}).get(k) for k in ("steady_s", "steady_products"))
            if steady_s and steady_products and per_pass:
                after = steady_s / steady_products
                notes.append(f"after each search's first product {after:.3f} s a product, {ratio(after, per_pass)}")
            alone = step.get("result", {}).get("product_alone_s") or {}
            if alone and per_pass:
                middle = statistics.median(alone.values())
                each = against_each(middle, passes)
                notes.append(
                    f"a product alone (no vector work) {middle:.3f} s, {ratio(middle, per_pass)} a fwd+bwd{each} "
                    f"(median of the checkpoints' medians, {', '.join(f'{v:.2f}' for v in alone.values())})"
                )
            if per_pass:
                timed = ", ".join(f"{p:.3f}" for p in passes)
                when = " (before, after)" if len(passes) == 2 else ""
                notes.append(f"one fwd+bwd on the {HESSIAN_SAMPLES} samples {timed} s{when}")
        elif base:
            pairs = [
                (ours, theirs)
                for ours, theirs in zip(repeats(step), repeats(base), strict=True)
                if ours["status"] == "ok" and theirs["status"] == "ok"
            ]
            if len(pairs) > 1:
                times = [ours["seconds"] / theirs["seconds"] for ours, theirs in pairs]
                sizes = [a / b for a, b in (memories(ours, theirs) for ours, theirs in pairs)]
                row += f"  {statistics.median(times):6.2f}x {statistics.median(sizes):6.2f}x"
                notes.append(f"{len(pairs)} rounds, alternated: time {spread(times)}, memory {spread(sizes)}")
            else:
                memory_ratio = ratio(*memories(step, base), killed)
                row += f"  {ratio(step['seconds'], base['seconds'], killed):>7} {memory_ratio:>7}"
            notes += [agreement(step, base)] if step["status"] == "ok" else []
            if name == "polca":
                k = figures["steps"].get("random-basis", {}).get("result", {}).get("vectors")
                notes.append(f"floor: {k} forward passes x {CHECKPOINTS} checkpoints")
        failed = [r for r in repeats(base) if r["status"] != "ok"] if base else []
        notes += [f"baseline {r['status']}: {r['detail']}" for r in failed]
        lines.append(row + ("  " + "; ".join(n for n in notes if n) if notes else ""))
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="S,M,L", help="comma-separated, of S, M, L")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "scale")
    parser.add_argument("--only", default=",".join(ANALYZERS), help=f"comma-separated, of {', '.join(ANALYZERS)}")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per step before it is killed")
    parser.add_argument("--build-timeout", type=float, default=3600.0, help="seconds to build one run")
    parser.add_argument("--memory-limit", type=float, default=None, help="GiB of RSS per step before it is killed")
    parser.add_argument(
        "--second-order",
        default="none",
        help="comma-separated polca --second-order values to measure, of none, paper, exact (default: none)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each analyzer and of its baseline, alternated; ratios are the medians of the pairs "
        "(default 1; hessian-basis runs once, its baseline before and after it)",
    )
    parser.add_argument("--keep", action="store_true", help="reuse the runs a previous invocation built")
    parser.add_argument("--print", type=Path, metavar="JSON", help="print the tables of a figures file, run nothing")
    # the children's modes
    parser.add_argument("--build", choices=list(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--baseline", help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.only = [a.strip() for a in args.only.split(",") if a.strip()]
    args.second_order = [o.strip() for o in args.second_order.split(",") if o.strip()]
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is not a number of runs; give 1 or more")
    orders = ("none", "paper", "exact")
    for value, allowed, option in (
        (args.sizes, SIZES, "--sizes"),
        (args.only, ANALYZERS, "--only"),
        (args.second_order, orders, "--second-order"),
    ):
        if unknown := set(value) - set(allowed):
            parser.error(f"{option}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(allowed)}")
    return args


def main() -> None:
    args = parse_args()
    if args.build:
        print(json.dumps(build_run(args.run, SIZES[args.build])))
        return
    if args.baseline:
        print(json.dumps(baseline(args.baseline, args.run, args.device, args.k)))
        return
    if args.print:
        print_tables(json.loads(args.print.read_text()))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    everything: dict[str, Any] = {
        "device": args.device,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        "torch": importlib.metadata.version("torch"),
        "timeout_s": args.timeout,
        "memory_limit_gib": args.memory_limit,
        "sizes": {},
    }
    if args.device == "cuda":  # the parent only orchestrates: torch is imported for the GPU's name alone
        import torch

        everything["gpu"] = torch.cuda.get_device_name(0)
    orders = "" if args.second_order == ["none"] else "-polca-" + "-".join(args.second_order)
    path = args.out / f"scale-{'-'.join(args.sizes)}-{args.device}{orders}.json"

    def save() -> None:
        path.write_text(json.dumps(everything, indent=2))

    try:
        for size in args.sizes:
            bench_size(size, args, everything["sizes"].setdefault(size, {}), save)
    except KeyboardInterrupt:  # a time limit's SIGINT: print and keep what was measured before it
        everything["interrupted"] = True
        save()
        print_tables(everything)
        print(f"\ninterrupted; what was measured before is in {path}")
        sys.exit(130)
    print_tables(everything)
    print(f"\nfigures: {path}")


def print_tables(everything: dict[str, Any]) -> None:
    print(f"\n{everything['machine']}, torch {everything['torch']}; wall = whole process, ratio = ckpt / baseline")
    limits = f"time limit {everything['timeout_s']:g} s per step"
    if everything.get("memory_limit_gib"):
        limits += f", memory limit {everything['memory_limit_gib']:g} GiB RSS"
    print(limits)
    if everything.get("interrupted"):
        print("interrupted (Ctrl-C or a time limit): the steps below are those measured before it")
    for size, figures in everything["sizes"].items():
        if "steps" not in figures:
            continue  # interrupted before its run was built
        print()
        print(table(size, figures, everything["device"]))


if __name__ == "__main__":
    main()

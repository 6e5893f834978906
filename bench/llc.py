"""Benchmark of ``ckpt analyze llc`` against devinterp's LLC estimate, looping over checkpoints as its users do.

Run by hand from the repository root, after ``pip install -e '.[bench]'`` (devinterp; its
dependencies leave torch as it is: check with ``pip install --dry-run devinterp``)::

    python bench/llc.py                           # tiny-lm run, 4 chains x 100 draws, this 2-core machine
    python bench/llc.py --rounds 3 --keep         # medians of alternated pairs, reusing the run built before
    python bench/llc.py --large                   # also: does llc at GPT-2 small (bench/scale.py's L) fit?
    python bench/llc.py --print bench/out/llc/llc-cpu.json   # the tables of an earlier run

The run: ``ckpt train tiny-lm`` (the default preset, 135k parameters) for ``--train-steps``
steps, a checkpoint every ``--every``; the loss is its stored ``train`` split (64 windows of 32
tokens, every token a datapoint). Each checkpoint's weights are also saved as a plain
``state_dict`` (``torch.save``), what a devinterp user has before the timing starts.

Then, each in a fresh subprocess and alternated for ``--rounds`` (ckpt, devinterp, devinterp,
ckpt, ...), with the same ε, nβ, γ, chains, draws, burn-in (0) and minibatch size:

- ``ckpt``: ``ckpt analyze llc STORE --force --init-loss full ...`` through the real CLI, the
  whole process timed (start-up, the engine, reading every checkpoint, the chains, the save);
- ``devinterp``: a script doing what devinterp's users do: for every checkpoint build the model,
  ``load_state_dict(torch.load(...))`` and call ``devinterp.slt.llc.llc`` on a ``datasets.Dataset``
  of the same windows (``input_ids`` = the window's 33 tokens; a ``loss_fn`` giving the same
  per-token cross-entropy), ``num_init_loss_batches`` = one epoch of the split, so that both
  ``init_loss`` are the exact mean over the split. The whole process is timed, and its loop alone.

It prints seconds per checkpoint of both, the ratio ckpt / devinterp (target <= 0.5x at equal
chains x draws), and per checkpoint the two λ̂ with their standard errors (std over chains with
ddof=1 / √chains) and ``z`` = |difference| / combined SE (agreement: z <= 2). Figures go to
``--out/llc-<device>.json``.

Known differences between the two estimators (none matter at burn-in 0 and equal options):
devinterp 2.0.1 averages the losses of every step, burn-in included (ckpt, like devinterp 1.x,
averages the recorded draws only); its chains share one minibatch order (ckpt's each have
their own); its ``llc_std`` has ddof=0 (ckpt's ``llc_std`` ddof=1; this bench computes both SEs
with ddof=1 from the per-chain values).

``--large`` builds bench/scale.py's GPT-2 small run (123.8M parameters, 4 checkpoints, 32 eval
sequences of 128 tokens), imports it and times ``ckpt analyze llc`` at ``--large-chains`` chains
x ``--large-draws`` draws, minibatch ``--large-batch``, under the default memory budget.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402  (bench/scale.py: the GPT-2 runs, their sizes and the CLI wrapper)

SPLIT = "train"


# -- the run --------------------------------------------------------------------------------------------------


def prepare(folder: Path, args: argparse.Namespace) -> Path:
    """The tiny-lm store and its plain state dicts and token windows (for devinterp) in ``folder``."""
    import numpy as np
    import torch

    import ckpt

    store = folder / "run.zarr"
    if args.keep and (folder / "export.json").exists():
        return store
    folder.mkdir(parents=True, exist_ok=True)
    command = ["train", "tiny-lm", str(store), "--steps", str(args.train_steps), "--every", str(args.every)]
    began = time.perf_counter()
    subprocess.run([*scale.ckpt_command(*command, "--no-progress")], check=True, capture_output=True)
    print(f"tiny-lm: trained {args.train_steps} steps in {time.perf_counter() - began:.0f} s", flush=True)
    opened = ckpt.open(str(store))
    data = opened.data(SPLIT)
    inputs, targets = np.asarray(data["inputs"].values), np.asarray(data["targets"].values)
    if not (np.asarray(data["mask"].values).all() and (inputs[:, 1:] == targets[:, :-1]).all()):
        raise SystemExit("the tiny-lm split is not a set of contiguous, unmasked windows")
    np.save(folder / "windows.npy", np.concatenate([inputs, targets[:, -1:]], axis=1))
    steps = [int(s) for s in opened.steps]
    for step in steps:
        state = {k: v.clone() for k, v in opened.tensors(step, framework="torch").items()}
        torch.save(state, folder / f"step-{step}.pt")
    spec = opened.model
    (folder / "export.json").write_text(json.dumps({"steps": steps, "factory": spec.factory, "config": spec.config}))
    return store


def options(args: argparse.Namespace, examples: int) -> dict[str, Any]:
    """The sampler's options, shared by both tools (nβ resolved to devinterp's default m / log m)."""
    m = args.batch_size
    return {
        "epsilon": args.epsilon,
        "nbeta": args.nbeta if args.nbeta else m / math.log(m),
        "gamma": args.gamma,
        "chains": args.chains,
        "draws": args.draws,
        "batch_size": m,
        "examples": examples,
        "seed": args.seed,
    }


# -- the two measurements (children) --------------------------------------------------------------------------


def timed(command: list[str], log: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``command`` in a fresh process, and what it did (its stderr kept in ``log``)."""
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    log.write_text(done.stderr)
    return seconds, done


def last_line(done: subprocess.CompletedProcess) -> str:
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def run_ckpt(store: Path, opts: dict[str, Any], logs: Path) -> dict[str, Any]:
    """``ckpt analyze llc`` through the CLI, the whole process timed; the result read back afterwards."""
    import ckpt

    flags = ["--epsilon", opts["epsilon"], "--nbeta", opts["nbeta"], "--gamma", opts["gamma"]]
    flags += ["--chains", opts["chains"], "--draws", opts["draws"], "--batch-size", opts["batch_size"], "--burn-in", 0]
    flags += ["--split", SPLIT, "--init-loss", "full", "--seed", opts["seed"], "--force", "--no-progress"]
    seconds, done = timed(scale.ckpt_command("analyze", "llc", str(store), *map(str, flags)), logs / "ckpt.stderr")
    if done.returncode != 0:
        return {"error": last_line(done)}
    result = ckpt.open(str(store)).analysis("llc")
    steps = [int(s) for s in result["step"].values]
    return {
        "seconds": seconds,
        "llc_chain": {str(s): result["llc_chain"].sel(step=s).values.tolist() for s in steps},
        "init_loss": {str(s): float(result["init_loss"].sel(step=s)) for s in steps},
    }


def run_devinterp(folder: Path, opts: dict[str, Any], logs: Path) -> dict[str, Any]:
    """The devinterp script in a fresh process (``--child devinterp``), the whole process timed."""
    command = [sys.executable, __file__, "--child", "devinterp", "--run", str(folder), "--opts", json.dumps(opts)]
    seconds, done = timed(command, logs / "devinterp.stderr")
    if done.returncode != 0:
        return {"error": last_line(done)}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {**out, "seconds": seconds}


def devinterp_child(folder: Path, opts: dict[str, Any]) -> dict[str, Any]:
    """What a devinterp user's loop over checkpoints does; per checkpoint λ̂ per chain and the loop's seconds."""
    import importlib
    import shutil
    import tempfile
    import warnings

    import datasets
    import numpy as np
    import torch
    from devinterp.slt.llc import llc

    export = json.loads((folder / "export.json").read_text())
    module, _, name = export["factory"].partition(":")
    build = getattr(importlib.import_module(module), name)
    windows = np.load(folder / "windows.npy")
    dataset = datasets.Dataset.from_dict({"input_ids": windows.tolist()}).with_format("torch")

    def loss_fn(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        # devinterp's per-token loss (batch, seq - 1): the model reads the first 32 tokens and predicts the next
        logits = model(input_ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")

    scratch = Path(tempfile.mkdtemp(prefix="bench-llc-"))
    out: dict[str, Any] = {"llc_chain": {}, "init_loss": {}, "loop_seconds": 0.0}
    try:
        for step in export["steps"]:
            began = time.perf_counter()
            model = build(**export["config"])
            model.load_state_dict(torch.load(folder / f"step-{step}.pt"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                found = llc(
                    model,
                    dataset,
                    {},
                    lr=opts["epsilon"],
                    n_beta=opts["nbeta"],
                    localization=opts["gamma"],
                    num_chains=opts["chains"],
                    num_draws=opts["draws"],
                    num_burnin_steps=0,
                    batch_size=opts["batch_size"],
                    num_init_loss_batches=opts["examples"] // opts["batch_size"],
                    init_seed=100 + opts["seed"],
                    device="cpu",
                    output_path=scratch / f"step-{step}.zarr",
                    loss_fn=loss_fn,
                )
                per_chain = found["llc_per_chain"].values.tolist()
                init_loss = float(found["init_loss"])
            out["loop_seconds"] += time.perf_counter() - began
            out["llc_chain"][str(step)] = per_chain
            out["init_loss"][str(step)] = init_loss
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


# -- GPT-2 small -----------------------------------------------------------------------------------------------


def large(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``ckpt analyze llc`` on bench/scale.py's L run under the default memory budget: wall time, peak RSS."""
    folder = out / "L"
    store = folder / "run.zarr"
    if not (args.keep and store.exists()):
        folder.mkdir(parents=True, exist_ok=True)
        info = scale.build_run(folder, scale.SIZES["L"])
        print(f"L: {info['parameters']:,} parameters, built in {info['build_s']:.0f} s", flush=True)
        for command in (
            scale.ckpt_command("import", str(folder / "trainer-out"), str(store), "--overwrite"),
            scale.ckpt_command("data", "add", str(store), "eval", "--inputs", str(folder / "eval_ids.npy")),
        ):
            subprocess.run(command, check=True, capture_output=True)
    flags = ["--chains", args.large_chains, "--draws", args.large_draws, "--batch-size", args.large_batch]
    flags += ["--burn-in", 0, "--split", "eval", "--force", "--no-progress"]
    command = scale.ckpt_command("analyze", "llc", str(store), *map(str, flags))
    done = scale.measure(command, folder, args.timeout, None)
    entry: dict[str, Any] = {
        "status": done.status,
        "seconds": done.seconds,
        "peak_rss": done.peak_rss,
        "detail": done.detail,
        "chains": args.large_chains,
        "draws": args.large_draws,
        "batch_size": args.large_batch,
    }
    if done.ok:
        import ckpt

        result = ckpt.open(str(store)).analysis("llc")
        entry["checkpoints"] = int(result.sizes["step"])
        entry["llc"] = [float(v) for v in result["llc"].values]
    return entry


# -- the tables ------------------------------------------------------------------------------------------------


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean over chains and its standard error (std with ddof=1 / √chains)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.fmean(values), se


def table(figures: dict[str, Any]) -> str:
    """Seconds per checkpoint, the ratios, and the estimates side by side."""
    opts, rounds = figures["options"], figures["rounds"]
    good = [r for r in rounds if "error" not in r["ckpt"] and "error" not in r["devinterp"]]
    lines = [
        f"llc, tiny-lm, {opts['chains']} chains x {opts['draws']} draws, m={opts['batch_size']}, "
        f"eps={opts['epsilon']:g}, nbeta={opts['nbeta']:.4g}, gamma={opts['gamma']:g}, {figures['device']}"
    ]
    for r in rounds:
        for tool in ("ckpt", "devinterp"):
            if "error" in r[tool]:
                lines.append(f"  {tool} failed: {r[tool]['error']}")
    if not good:
        return "\n".join(lines)
    n = len(figures["steps"])
    ckpt_s = [r["ckpt"]["seconds"] / n for r in good]
    dev_s = [r["devinterp"]["seconds"] / n for r in good]
    loop_s = [r["devinterp"]["loop_seconds"] / n for r in good]
    ratios = [c / d for c, d in zip(ckpt_s, dev_s, strict=True)]
    loop_ratios = [c / d for c, d in zip(ckpt_s, loop_s, strict=True)]
    span = f" (range {min(ratios):.2f}-{max(ratios):.2f}, {len(good)} pairs)" if len(good) > 1 else ""
    lines += [
        f"  s/checkpoint   ckpt {statistics.median(ckpt_s):.2f}   devinterp {statistics.median(dev_s):.2f} "
        f"(its loop alone {statistics.median(loop_s):.2f})   over {n} checkpoints",
        f"  ckpt / devinterp  {statistics.median(ratios):.2f}x{span};  against its loop alone "
        f"{statistics.median(loop_ratios):.2f}x   (target <= 0.5x)",
        f"  {'step':>6} {'ckpt λ̂':>9} {'± se':>7} {'devinterp λ̂':>12} {'± se':>7} {'z':>5}  agree   init loss c/d",
    ]
    last = good[-1]
    for step in figures["steps"]:
        c_mean, c_se = mean_se(last["ckpt"]["llc_chain"][str(step)])
        d_mean, d_se = mean_se(last["devinterp"]["llc_chain"][str(step)])
        z = abs(c_mean - d_mean) / math.hypot(c_se, d_se)
        init = f"{last['ckpt']['init_loss'][str(step)]:.4f}/{last['devinterp']['init_loss'][str(step)]:.4f}"
        agree = "yes" if z <= 2 else "NO"
        estimates = f"{c_mean:>9.3f} {c_se:>7.3f} {d_mean:>12.3f} {d_se:>7.3f}"
        lines.append(f"  {step:>6} {estimates} {z:>5.2f}  {agree:<5}   {init}")
    if "large" in figures:
        big = figures["large"]
        what = f"{big['chains']} chains x {big['draws']} draws, m={big['batch_size']}"
        if big["status"] == "ok":
            per = big["seconds"] / big["checkpoints"]
            lines.append(
                f"  L (GPT-2 small, 123.8M): ok at the default memory budget, {what}: {big['seconds']:.0f} s for "
                f"{big['checkpoints']} checkpoints ({per:.0f} s each), peak RSS {big['peak_rss'] / 2**30:.1f} GiB"
            )
        else:
            lines.append(f"  L (GPT-2 small): {big['status']} with {what}: {big['detail']}")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=60, help="tiny-lm training steps")
    parser.add_argument("--every", type=int, default=20, help="a checkpoint every N training steps")
    parser.add_argument("--epsilon", type=float, default=1e-3)
    parser.add_argument("--nbeta", type=float, default=None, help="default: m / log m (devinterp's default_nbeta)")
    parser.add_argument("--gamma", type=float, default=100.0)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16, help="windows per SGLD minibatch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="alternated ckpt/devinterp pairs (medians)")
    parser.add_argument("--large", action="store_true", help="also llc on GPT-2 small (bench/scale.py's L)")
    parser.add_argument("--large-chains", type=int, default=2)
    parser.add_argument("--large-draws", type=int, default=4)
    parser.add_argument("--large-batch", type=int, default=4, help="sequences per minibatch at L")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the L run is killed")
    parser.add_argument("--keep", action="store_true", help="reuse the runs built before")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "llc")
    parser.add_argument("--print", type=Path, default=None, help="print the tables of an earlier run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--opts", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.child == "devinterp":
        print(json.dumps(devinterp_child(args.run, json.loads(args.opts))))
        return
    if args.print:
        print(table(json.loads(args.print.read_text())))
        return
    folder = args.out / "tiny-lm"
    store = prepare(folder, args)
    export = json.loads((folder / "export.json").read_text())
    import numpy as np

    opts = options(args, len(np.load(folder / "windows.npy")))
    figures: dict[str, Any] = {"options": opts, "steps": export["steps"], "device": "cpu", "rounds": []}
    figures["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path = args.out / "llc-cpu.json"
    for i in range(args.rounds):
        order = ("ckpt", "devinterp") if i % 2 == 0 else ("devinterp", "ckpt")
        entry: dict[str, Any] = {}
        for tool in order:
            entry[tool] = run_ckpt(store, opts, folder) if tool == "ckpt" else run_devinterp(folder, opts, folder)
            print(f"round {i + 1}: {tool} {entry[tool].get('seconds', float('nan')):.1f} s", flush=True)
        figures["rounds"].append(entry)
        path.write_text(json.dumps(figures, indent=1))
    if args.large:
        figures["large"] = large(args.out, args)
        path.write_text(json.dumps(figures, indent=1))
    print(table(figures))
    print(f"figures: {path}")


if __name__ == "__main__":
    main()

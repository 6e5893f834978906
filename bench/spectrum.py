"""Benchmark of ``spectrum``'s Hessian trace against PyHessian's, on bench/scale.py's GPT-2 runs.

Run by hand from the repository root, after ``pip install -e '.[bench]'`` (PyHessian 0.1; it
declares no torch pin that matters, but ``pip install --no-deps pyhessian==0.1`` keeps torch as it is)::

    python bench/spectrum.py --sizes S,M --probes 10            # this 2-core machine
    python bench/spectrum.py --sizes S --probes 10 --keep       # reuse the runs built before
    python bench/spectrum.py --sizes L --analyze                # also time `ckpt analyze spectrum` (defaults)
    python bench/spectrum.py --sizes S,M --device cuda          # a GPU machine

For each size it builds bench/scale.py's run (:func:`scale.build_run`: a seeded GPT-2 trained by AdamW,
4 checkpoints, 32 eval sequences of 128 tokens), imports it with ``ckpt import`` and adds the eval split.
Then, each in a fresh subprocess and alternated (ckpt, PyHessian, PyHessian, ckpt, ... for ``--rounds``):

- ``ckpt``: ``ckpt.analyze("spectrum", ..., method="hutchinson", probes=N, slq_runs=0, samples=8)``
  in process, the whole analysis of the 4 checkpoints timed (the engine, reading each checkpoint,
  building the kept gradient graphs, N products each);
- ``pyhessian``: for each checkpoint, the same weights in the same ``GPT2LMHeadModel`` (loaded before
  the timing), ``pyhessian.hessian(model, cross_entropy, data=(ids, targets))`` and
  ``.trace(maxIter=N, tol=0)`` (tol 0: exactly N probes, as ckpt makes) timed, on the same 8 sequences
  ckpt's ``--samples 8`` draws, the same mean token loss (causal LM: the logits at t against the token
  at t + 1), float32.

It prints, per size, the seconds of each and their ratio ckpt / PyHessian (target <= 1.0x), and per
checkpoint both trace estimates with their standard errors (the probes' standard deviation / √N;
PyHessian states none: its ``tol`` is a stopping rule on the running mean's relative change, and the
table says after how many probes its default, 1e-3, would have stopped). The figures go to
``--out/spectrum-<sizes>-<device>.json``. ``--analyze`` times ``ckpt analyze spectrum`` with its defaults
(Hutch++, 30 probes, 4 × 32 Lanczos steps, ``--samples 8``) through the CLI as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402  (bench/scale.py: the runs, their sizes and the CLI wrapper)

PYHESSIAN_TOL = 1e-3
"""PyHessian's default ``tol`` of ``trace``: reported as where it would have stopped."""


def prepare(size: str, out: Path, keep: bool) -> tuple[Path, Path]:
    """The run folder and its store for ``size``, built and imported unless ``keep`` finds them."""
    folder = out / size
    store = folder / "run.zarr"
    if keep and store.exists():
        return folder, store
    folder.mkdir(parents=True, exist_ok=True)
    info = scale.build_run(folder, scale.SIZES[size])
    print(f"{size}: {info['parameters']:,} parameters, built in {info['build_s']:.0f} s", flush=True)
    for command in (
        scale.ckpt_command("import", str(folder / "trainer-out"), str(store), "--overwrite"),
        scale.ckpt_command("data", "add", str(store), "eval", "--inputs", str(folder / "eval_ids.npy")),
    ):
        subprocess.run(command, check=True, capture_output=True)
    return folder, store


def child(kind: str, folder: Path, store: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process (``--child KIND``); its JSON."""
    command = [sys.executable, __file__, "--child", kind, "--run", str(folder), "--store", str(store)]
    command += ["--probes", str(args.probes), "--device", args.device]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_ckpt(store: Path, probes: int, device: str) -> dict[str, Any]:
    """ckpt's trace of every checkpoint (Hutchinson, ``probes`` products each), in process, timed."""
    import ckpt

    began = time.perf_counter()
    options = {"method": "hutchinson", "probes": probes, "slq_runs": 0, "samples": scale.HESSIAN_SAMPLES}
    result = ckpt.analyze("spectrum", str(store), device=device, force=True, **options).load()
    seconds = time.perf_counter() - began
    steps = [int(s) for s in result["step"].values]
    return {
        "seconds": seconds,
        "trace": dict(zip(map(str, steps), map(float, result["trace"].values), strict=True)),
        "stderr": dict(zip(map(str, steps), map(float, result["trace_stderr"].values), strict=True)),
    }


def measure_pyhessian(folder: Path, store: Path, probes: int, device: str) -> dict[str, Any]:
    """PyHessian's trace of every checkpoint on the same model, data and probes, timed without the loading."""
    import numpy as np
    import pyhessian
    import torch
    from transformers import GPT2LMHeadModel

    import ckpt.store as ckptstore
    from ckpt.analyzers.basis import sample_examples

    ids_all = np.load(folder / "eval_ids.npy")
    rows = sample_examples(len(ids_all), scale.HESSIAN_SAMPLES, 0)  # the sequences ckpt's --samples 8 draws
    ids = torch.as_tensor(ids_all[rows]).to(device)
    targets = ids[:, 1:].flatten()

    class Logits(torch.nn.Module):
        """The causal LM's next-token logits, flattened: PyHessian's ``criterion(model(inputs), targets)``."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return self.model(inputs).logits[:, :-1].flatten(0, 1)

    opened = ckptstore.open(str(store))
    out: dict[str, Any] = {"seconds": 0.0, "trace": {}, "stderr": {}, "stops_at": {}}
    for checkpoint in scale.checkpoint_folders(folder):
        step = int(checkpoint.name.split("-")[1])
        # eager attention: PyTorch's CPU flash attention (transformers' default, sdpa) has no double backward
        model = GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager")
        stored = {k: torch.from_numpy(np.asarray(v)) for k, v in opened.tensors(step).items()}
        model.load_state_dict(stored, strict=False)  # the store's weights, exactly what ckpt reads
        wrapped = Logits(model).to(device).eval()
        torch.manual_seed(step)  # PyHessian draws its probes from torch's global generator
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        began = time.perf_counter()
        engine = pyhessian.hessian(
            wrapped, torch.nn.functional.cross_entropy, data=(ids, targets), cuda=device.startswith("cuda")
        )
        samples = [float(x) for x in engine.trace(maxIter=probes, tol=0.0)]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out["seconds"] += time.perf_counter() - began
        out["trace"][str(step)] = statistics.fmean(samples)
        out["stderr"][str(step)] = statistics.stdev(samples) / len(samples) ** 0.5
        means = [statistics.fmean(samples[: i + 1]) for i in range(len(samples))]
        stops = [
            i + 1
            for i in range(1, len(means))
            if abs(means[i] - means[i - 1]) / (abs(means[i - 1]) + 1e-6) < PYHESSIAN_TOL
        ]
        out["stops_at"][str(step)] = stops[0] if stops else None
        del engine, wrapped, model
    return out


def analyze_defaults(store: Path, folder: Path, device: str) -> dict[str, Any]:
    """``ckpt analyze spectrum`` with its defaults (``--samples 8``) through the CLI: wall time and peak RSS."""
    outcome = scale.measure(
        scale.ckpt_command(
            "analyze",
            "spectrum",
            str(store),
            "--samples",
            str(scale.HESSIAN_SAMPLES),
            "--no-progress",
            "--force",
            "--device",
            device,
        ),
        folder / "logs" / "analyze-spectrum",
        timeout=3 * 3600,
        memory_limit=None,
    )
    keys = ("seconds", "peak_rss", "status", "detail")
    return {key: getattr(outcome, key) for key in keys}


def table(size: str, entry: dict[str, Any]) -> str:
    rounds = entry["rounds"]
    ok = [r for r in rounds if "error" not in r["ckpt"] and "error" not in r["pyhessian"]]
    lines = [f"== {size}: {entry['parameters']:,} parameters, {entry['probes']} probes, 4 checkpoints"]
    for r in rounds:
        for kind in ("ckpt", "pyhessian"):
            if "error" in r[kind]:
                lines.append(f"  {kind} failed: {r[kind]['error']}")
    if ok:
        ratios = [r["ckpt"]["seconds"] / r["pyhessian"]["seconds"] for r in ok]
        ours = statistics.median(r["ckpt"]["seconds"] for r in ok)
        theirs = statistics.median(r["pyhessian"]["seconds"] for r in ok)
        spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f}x)" if len(ratios) > 1 else ""
        lines.append(
            f"  trace time: ckpt {ours:.1f} s, PyHessian {theirs:.1f} s: "
            f"ckpt / PyHessian {statistics.median(ratios):.2f}x{spread} (target <= 1.0x)"
        )
        last = ok[-1]
        header = f"  {'step':>6}  {'ckpt trace ± s.e.':>24}  {'PyHessian trace ± s.e.':>24}"
        lines.append(header + "  PyHessian tol 1e-3 stops")
        for step, value in last["ckpt"]["trace"].items():
            theirs_value = last["pyhessian"]["trace"][step]
            ours_cell = f"{value:.6g} ± {last['ckpt']['stderr'][step]:.2g}"
            their_cell = f"{theirs_value:.6g} ± {last['pyhessian']['stderr'][step]:.2g}"
            stop = last["pyhessian"]["stops_at"][step]
            lines.append(f"  {step:>6}  {ours_cell:>24}  {their_cell:>24}  after {stop} probes")
    if "analyze" in entry:
        a = entry["analyze"]
        lines.append(
            f"  ckpt analyze spectrum (defaults, --samples 8): {a['status']} in {a['seconds']:.0f} s, "
            f"peak RSS {a['peak_rss'] / 2**30:.1f} GiB {a['detail']}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="S,M", help="comma-separated sizes of bench/scale.py: S, M, L")
    parser.add_argument("--probes", type=int, default=10, help="Hutchinson probes (products) per checkpoint")
    parser.add_argument("--rounds", type=int, default=1, help="alternated ckpt / PyHessian pairs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "spectrum")
    parser.add_argument("--keep", action="store_true", help="reuse the runs and stores built before")
    parser.add_argument("--analyze", action="store_true", help="also time `ckpt analyze spectrum` with its defaults")
    parser.add_argument("--skip-peer", action="store_true", help="no PyHessian comparison (with --analyze)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "ckpt":
            figures = measure_ckpt(args.store, args.probes, args.device)
        else:
            figures = measure_pyhessian(args.run, args.store, args.probes, args.device)
        print(json.dumps(figures))
        return
    sizes = args.sizes.split(",")
    everything: dict[str, Any] = {}
    path = args.out / f"spectrum-{'-'.join(sizes)}-{args.device}.json"
    for size in sizes:
        folder, store = prepare(size, args.out, args.keep)
        info = json.loads((folder / "run.json").read_text())
        entry: dict[str, Any] = {"parameters": info["parameters"], "probes": args.probes, "rounds": []}
        for index in range(args.rounds if not args.skip_peer else 0):
            order = ("ckpt", "pyhessian") if index % 2 == 0 else ("pyhessian", "ckpt")
            entry["rounds"].append({kind: child(kind, folder, store, args) for kind in order})
        if args.analyze:
            entry["analyze"] = analyze_defaults(store, folder, args.device)
        everything[size] = entry
        print(table(size, entry), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(everything, indent=2))
    print(f"figures: {path}")


if __name__ == "__main__":
    main()

"""Peak memory and time of ``loss`` and ``grad-norms`` against a plain PyTorch loop (issue 29, item 4).

Builds a GPT-2-style run (Hugging Face ``GPT2LMHeadModel``, random init, a few
AdamW steps, 4 checkpoints saved as a ``Trainer`` output folder), imports it,
attaches 32 random sequences of 128 tokens as the ``eval`` split, then runs,
each in a fresh process (peak RSS from ``getrusage(RUSAGE_CHILDREN)`` of a
wrapper that runs only that one process):

- ``loss``: ``ckpt analyze loss STORE --force``; baseline: load each
  checkpoint's ``model.safetensors`` into the model and compute the per-token
  causal-LM losses of all 32 sequences in one forward pass (the analyzer's
  default ``--batch-size`` 1024 covers them all too);
- ``grad-norms``: ``ckpt analyze grad-norms STORE --force``; baseline: one
  full-batch forward and backward of the mean loss per checkpoint, then the
  norm of every parameter's gradient.

Usage::

    python bench/loss_memory.py --size S            # or M; L is GPT-2 small (needs ~20 GB)
    python bench/loss_memory.py --size M --repeat 3 # best time of 3, largest peak

It prints one row per measurement: seconds, peak RSS in MiB, and the ratio of
each analyzer's to its baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {
    "S": {"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 8192},
    "M": {"n_layer": 6, "n_embd": 512, "n_head": 8, "vocab_size": 16384},
    "L": {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257},
}
EXAMPLES, LENGTH, STEPS = 32, 128, (0, 1, 2, 3)


def build(size: str, root: Path) -> Path:
    """The run of ``size`` under ``root`` (built once): ``out/checkpoint-N/``, ``run.zarr``, ``ids.npy``."""
    store = root / "run.zarr"
    if store.exists():
        return root
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**SIZES[size], n_positions=LENGTH)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    for step in STEPS:
        if step:
            batch = torch.as_tensor(rng.integers(0, config.vocab_size, (4, LENGTH)))
            model(batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        folder = root / "out" / f"checkpoint-{step}"
        model.save_pretrained(folder)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    np.save(root / "ids.npy", rng.integers(0, config.vocab_size, (EXAMPLES, LENGTH)))
    ckpt = [sys.executable, "-m", "ckpt.cli"]
    subprocess.run([*ckpt, "import", str(root / "out"), str(store)], check=True, capture_output=True)
    subprocess.run(
        [*ckpt, "data", "add", str(store), "eval", "--inputs", str(root / "ids.npy")], check=True, capture_output=True
    )
    return root


def baseline(root: Path, kind: str) -> None:
    """The plain loop (runs in the measured child process)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel

    folders = sorted((root / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    model = GPT2LMHeadModel(GPT2Config.from_pretrained(folders[0])).eval()
    ids = torch.as_tensor(np.load(root / "ids.npy"))
    out = []
    for folder in folders:
        model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
        if kind == "loss":
            with torch.no_grad():
                logits = model(ids).logits[:, :-1]
                losses = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
            out.append(losses.double().numpy())
        else:
            model.zero_grad(set_to_none=True)
            logits = model(ids).logits[:, :-1]
            F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
            out.append(np.array([float(p.grad.double().norm()) for p in model.parameters() if p.grad is not None]))
    print(json.dumps({"checksum": float(np.concatenate(out).sum())}))


def measure(command: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of ``command``, run alone under a fresh wrapper process."""
    wrapper = (
        "import resource, subprocess, sys, time, json\n"
        "began = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "seconds = time.perf_counter() - began\n"
        "print(json.dumps([seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]))\n"
    )
    done = subprocess.run([sys.executable, "-c", wrapper, *command], check=True, capture_output=True, text=True)
    seconds, peak = json.loads(done.stdout.splitlines()[-1])
    return seconds, peak


def main() -> None:
    """Print time, peak RSS and ratio to the plain loop for loss and grad-norms."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ckpt-loss-memory")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement (best time, largest peak)")
    parser.add_argument("--only", default="loss,grad-norms", help="comma-separated analyzers")
    parser.add_argument("--engine-args", default="", help="more options of ckpt analyze, e.g. '--scheduler sync'")
    parser.add_argument("--baseline", choices=["loss", "grad"], help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    root = args.work / args.size
    if args.baseline:
        baseline(root, args.baseline)
        return
    root.mkdir(parents=True, exist_ok=True)
    build(args.size, root)
    store = str(root / "run.zarr")
    env_note = f"torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}"
    print(f"size {args.size}: {EXAMPLES} sequences of {LENGTH} tokens, {len(STEPS)} checkpoints ({env_note})")
    print(f"{'measure':<22} {'seconds':>8} {'peak MiB':>9} {'time x':>7} {'memory x':>9}")
    for analyzer in args.only.split(","):
        kind = "loss" if analyzer == "loss" else "grad"
        rows = {}
        plain = [sys.executable, __file__, "--size", args.size, "--work", str(args.work), "--baseline", kind]
        engine = [sys.executable, "-m", "ckpt.cli", "analyze", analyzer, store, "--force", "--no-progress"]
        for label, command in ((f"plain {kind} loop", plain), (analyzer, engine + args.engine_args.split())):
            runs = [measure(command) for _ in range(args.repeat)]
            rows[label] = (min(r[0] for r in runs), max(r[1] for r in runs))
        base_s, base_m = rows[f"plain {kind} loop"]
        for label, (seconds, peak) in rows.items():
            print(f"{label:<22} {seconds:>8.2f} {peak:>9.0f} {seconds / base_s:>7.2f} {peak / base_m:>9.2f}")


if __name__ == "__main__":
    main()

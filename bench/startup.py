"""Start-up time of the ``ckpt`` command, as ratios against ``python -c "import click"``.

A command that only prints help must not pay for zarr, xarray, dask or torch.
The baseline is the cheapest Python program that could print our help (an
interpreter that imports click); each row is the median of ``--repeat`` fresh
processes, measured in this same run.

    python bench/startup.py [--repeat 7] [--store RUN.zarr]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEGACY_STORE = ROOT / "tests" / "data" / "v0.1.0-modular-addition.zarr"


def median_seconds(command: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--store", default=str(LEGACY_STORE), help="store for `ckpt info` / `ckpt show`")
    args = parser.parse_args()
    if Path(args.store).resolve() == LEGACY_STORE:  # `analyze` writes: work on a copy of the shipped store
        copy = Path(tempfile.mkdtemp()) / LEGACY_STORE.name
        shutil.copytree(LEGACY_STORE, copy)
        args.store = str(copy)
    subprocess.run([sys.executable, "-m", "ckpt", "analyze", "loss", args.store, "--no-progress"], check=True)
    ckpt = [sys.executable, "-m", "ckpt"]
    rows = [
        ("ckpt --help", [*ckpt, "--help"]),
        ("ckpt --version", [*ckpt, "--version"]),
        ("ckpt analyze --help", [*ckpt, "analyze", "--help"]),
        ("ckpt analyze polca --help", [*ckpt, "analyze", "polca", "--help"]),
        ("ckpt train --help", [*ckpt, "train", "--help"]),
        ("ckpt plugins", [*ckpt, "plugins"]),
        ("ckpt info STORE", [*ckpt, "info", args.store]),
        ("ckpt show STORE loss", [*ckpt, "show", args.store, "loss"]),
        ("ckpt analyze loss (reused)", [*ckpt, "analyze", "loss", args.store, "--no-progress"]),
        ("python -c 'import ckpt'", [sys.executable, "-c", "import ckpt"]),
        ("import torch (for scale)", [sys.executable, "-c", "import torch"]),
    ]
    baseline = median_seconds([sys.executable, "-c", "import click"], args.repeat)
    print(f"baseline python -c 'import click': {baseline * 1000:.0f} ms (median of {args.repeat})")
    print(f"{'command':<28} {'ms':>7} {'ratio':>7}")
    for label, command in rows:
        seconds = median_seconds(command, args.repeat)
        print(f"{label:<28} {seconds * 1000:7.0f} {seconds / baseline:6.1f}x")


if __name__ == "__main__":
    main()

"""A training-loop stand-in run as a separate process by the crash and concurrency tests.

Usage: python tests/writer_process.py STORE COUNT SLEEP
Appends COUNT checkpoints (forever when COUNT is 0) after the last committed
step, each recomputable from its step (tests.helpers.make_tensors plus a
larger tensor, so that a kill often lands inside a write), printing "ready"
once the store is open.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

import ckpt.store as ckptstore
from tests.helpers import make_tensors


def checkpoint(step: int) -> dict[str, np.ndarray]:
    """The tensors written at ``step``: small ones plus a 1 MB one."""
    tensors = make_tensors(step)
    tensors["big"] = np.full((512, 512), step, dtype=np.float32)
    return tensors


def main() -> None:
    path, count, sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    writer = ckptstore.open(path, mode="a") if Path(path).exists() else ckptstore.create(path)
    print("ready", flush=True)
    step = 0 if writer.last_step is None else writer.last_step + 1
    written = 0
    while count == 0 or written < count:
        writer.write(step, checkpoint(step), metrics={"loss": float(step)})
        step += 1
        written += 1
        time.sleep(sleep)
    writer.close()


if __name__ == "__main__":
    main()

"""A Pythia-shaped checkpoint suite imported from the Hub cache, offline, with planted faults: time, disk, findings.

No network here, so the suite is built locally: a random GPTNeoX model of Pythia-70m's shape
(``--shape 70m``: hidden 512, 6 layers, 8 heads, intermediate 2048, vocab 50304, 2048 positions,
untied head, float16 as Pythia's step checkpoints are) or a tiny one (``--shape tiny``, for the
test), laid out as huggingface_hub's cache does (``models--ORG--NAME/refs/<branch>``,
``snapshots/<commit>/<file>`` links into ``blobs/<sha256>``), one branch per step with Pythia's
names (``step0``, ``step1``, ``step2``, ``step4`` .. ``step512``, ``step1000`` .. ``step143000``:
154), ``main`` at the final step's commit. Each revision is a ``config.json`` and two float16
safetensors shards with their ``model.safetensors.index.json`` (the larger Pythia models are
sharded; two shards let the issue-206 fault be planted), keys as Pythia's files have them
(``embed_out.weight``).

The weights drift along a plausible path: an Adam-like random walk whose update over an interval
of ``n`` steps at mean learning rate ``lr`` is ``lr * (DRIFT * n * D + NOISE * sqrt(n) * xi)`` per
element (``D`` one fixed direction, ``xi`` fresh noise, both standard normal), with Pythia's
schedule (warm-up over 1% of the steps to 1e-3, cosine decay to 10%): distances grow through the
log-spaced early steps and shrink as the rate decays.

Planted faults, like the ones public suites have shipped (docs/existing-runs.md):

- **final** (Pythia issue 205): a run of consecutive branches serving the final checkpoint's files;
- **shard** (issue 206): a branch whose first shard is the final checkpoint's;
- **copy**: a branch serving an earlier, non-neighbouring step's files;
- **outlier** (issue 108): a checkpoint off the path (its own weights plus noise ``OUTLIER`` times
  its update's size), so no digest matches.

Then the real commands, each its own process, timed: ``ckpt import hf://ORG/NAME DEST`` with
``HF_HUB_OFFLINE=1`` (every branch), ``ckpt verify DEST --trajectory --json`` and ``ckpt info DEST
--json --no-finite-check``; the duplicate check is also timed in this process
(:func:`ckpt.store.trajectory.duplicate_steps`, which reads no tensor). Prints what was planted
against what was named, and a table of figures; writes ``pythia-suite.json`` under ``--out``. The
cache and the store are deleted at the end unless ``--keep``. Run by hand (not in CI)::

    python repro/pythia_suite.py --out repro-out/pythia-suite                   # 154 x Pythia-70m shape
    python repro/pythia_suite.py --out /tmp/ps --shape tiny --checkpoints 16    # seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SHAPES = {
    # Pythia-70m's config.json: GPTNeoX, untied embed_out, rotary on a quarter of each head
    "70m": {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
            "vocab_size": 50304, "max_position_embeddings": 2048},
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
             "vocab_size": 128, "max_position_embeddings": 64},
}  # fmt: skip
TOTAL_STEPS = 143000
PEAK_LR, WARMUP, FLOOR = 1e-3, 0.01, 0.1
"""Pythia-70m's schedule: peak rate, warm-up fraction of the steps, final rate as a fraction of the peak."""
INIT_STD = 0.02
DRIFT, NOISE = 1e-3, 0.1
"""The walk's update per element: ``lr * (DRIFT * n * D + NOISE * sqrt(n) * xi)`` over ``n`` steps (docstring)."""
OUTLIER = 5.0
"""The outlier's noise, in units of its own update's size (ratio about 3.5 against the check's 2)."""
REPO = "EleutherAI/pythia-70m"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"


def pythia_steps() -> list[int]:
    """Pythia's 154 checkpoint steps: 0, the powers of two to 512, then every 1000 to 143000."""
    return [0, *(2**i for i in range(10)), *range(1000, TOTAL_STEPS + 1, 1000)]


def chosen_steps(count: int) -> list[int]:
    """``count`` of Pythia's steps, evenly spaced in their list (the first and the last included)."""
    steps = pythia_steps()
    if not 8 <= count <= len(steps):
        raise SystemExit(f"--checkpoints must be between 8 and {len(steps)}, not {count}")
    return [steps[i] for i in sorted({round(x) for x in np.linspace(0, len(steps) - 1, count)})]


def learning_rate(step: float) -> float:
    """Pythia's rate at ``step``: linear warm-up, then cosine decay to ``FLOOR`` of the peak."""
    warm = WARMUP * TOTAL_STEPS
    if step < warm:
        return PEAK_LR * step / warm
    progress = (step - warm) / (TOTAL_STEPS - warm)
    return PEAK_LR * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class Faults:
    """The planted faults, as indices into the chosen steps."""

    final: tuple[int, ...]
    shard: int
    copy: int
    copy_source: int
    outlier: int

    @classmethod
    def place(cls, count: int) -> Faults:
        """Spread over the run, each at least two clean checkpoints from the next (the check is local)."""

        def at(fraction: float) -> int:
            return round(fraction * (count - 1))

        run = max(2, round(0.03 * count))
        return cls(tuple(range(at(0.55), at(0.55) + run)), at(0.8), at(0.2), at(0.07), at(0.35))


@dataclass
class Suite:
    """The cache that was built: the steps, the commit of each branch, the faults, the sizes."""

    cache: Path
    repo: str
    steps: list[int]
    faults: Faults
    commits: dict[str, str] = field(default_factory=dict)
    build_s: float = 0.0
    params: int = 0
    revision_bytes: int = 0
    """The bytes one clean revision's files take (config, index, shards)."""


def model_layout(shape: str) -> tuple[bytes, list[tuple[str, tuple[int, ...]]]]:
    """``config.json`` as transformers writes it, and the tensor names and shapes of Pythia's files."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(**SHAPES[shape], tie_word_embeddings=False, use_parallel_residual=True)
    config.architectures = ["GPTNeoXForCausalLM"]
    config.dtype = "float16"
    with torch.device("meta"):  # names and shapes only: nothing allocated
        model = GPTNeoXForCausalLM(config)
    # Pythia's files name the head embed_out (transformers 5 calls it lm_head and converts on load)
    layout = [
        ("embed_out.weight" if k == "lm_head.weight" else k, tuple(v.shape)) for k, v in model.state_dict().items()
    ]
    return config.to_json_string().encode(), layout


def initial(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Pythia-like initial weights: layer norms at one, biases at zero, matrices normal."""
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * INIT_STD


class Cache:
    """Writes commits of one repository into a Hub cache as huggingface_hub lays it out."""

    def __init__(self, root: Path, repo: str) -> None:
        self.folder = root / f"models--{repo.replace('/', '--')}"
        for sub in ("blobs", "refs", "snapshots"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)

    def blob(self, data: bytes) -> str:
        """Store ``data`` once under its sha256 (the Hub's name for an LFS blob); returns the name."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.folder / "blobs" / digest
        if not path.exists():
            path.write_bytes(data)
        return digest

    def commit(self, branch: str, files: dict[str, str]) -> str:
        """A snapshot linking ``files`` (name -> blob) and ``refs/<branch>`` naming it; returns the commit."""
        commit = hashlib.sha1(json.dumps([branch, sorted(files.items())]).encode()).hexdigest()
        snapshot = self.folder / "snapshots" / commit
        snapshot.mkdir(exist_ok=True)
        for name, digest in files.items():
            link = snapshot / name
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(self.folder / "blobs" / digest, snapshot))
        self.ref(branch, commit)
        return commit

    def ref(self, branch: str, commit: str) -> None:
        (self.folder / "refs" / branch).write_text(commit)  # huggingface_hub writes the hash with no newline


def shard_blobs(cache: Cache, state: dict[str, np.ndarray], split: int) -> list[str]:
    """The two float16 safetensors shards of ``state`` (the first ``split`` tensors, the rest) as blobs."""
    from safetensors.numpy import save

    names = list(state)
    parts = (names[:split], names[split:])
    return [cache.blob(save({n: state[n].astype(np.float16) for n in part})) for part in parts]


def build_suite(root: Path, shape: str, count: int, repo: str, seed: int = 0) -> Suite:
    """Lay out the suite's cache under ``root`` (module docstring); one state in memory at a time."""
    start = time.perf_counter()
    steps = chosen_steps(count)
    faults = Faults.place(len(steps))
    suite = Suite(root, repo, steps, faults)
    config, layout = model_layout(shape)
    cache = Cache(root, repo)
    rng = np.random.default_rng(seed)
    state = {name: initial(name, shape_, rng) for name, shape_ in layout}
    direction = {name: rng.standard_normal(v.shape, dtype=np.float32) for name, v in state.items()}
    suite.params = sum(v.size for v in state.values())
    # the first shard: the embedding and the first half of the layers, as save_pretrained splits by size
    split = next(i for i, (n, _) in enumerate(layout) if f".layers.{SHAPES[shape]['num_hidden_layers'] // 2}." in n)
    index = {
        "metadata": {"total_size": 2 * suite.params},
        "weight_map": {n: SHARDS[0] if i < split else SHARDS[1] for i, (n, _) in enumerate(layout)},
    }
    fixed = {"config.json": cache.blob(config), INDEX: cache.blob(json.dumps(index, indent=2).encode())}
    faulty = {*faults.final, faults.copy, faults.shard}
    own: dict[int, list[str]] = {}  # index -> its shard blobs, for the steps a fault reuses
    previous = 0
    for i, step in enumerate(steps):
        span = step - previous
        if span:
            lr = np.mean([learning_rate(previous + (k + 0.5) * span / 64) for k in range(64)])
            for name, value in state.items():
                noise = rng.standard_normal(value.shape, dtype=np.float32)
                value += (lr * DRIFT * span) * direction[name] + (lr * NOISE * math.sqrt(span)) * noise
        previous = step
        if i in faulty and i != faults.shard:
            continue  # served another step's files: its own are never published
        if i == faults.outlier:
            size = lr * math.sqrt((DRIFT * span) ** 2 + (NOISE**2) * span)  # its update's size per element
            bent = {n: v + OUTLIER * size * rng.standard_normal(v.shape, dtype=np.float32) for n, v in state.items()}
            blobs = shard_blobs(cache, bent, split)
        else:
            blobs = shard_blobs(cache, state, split)
        if i in (faults.copy_source, faults.shard, len(steps) - 1):
            own[i] = blobs
        if i != faults.shard:
            suite.commits[f"step{step}"] = cache.commit(f"step{step}", fixed | dict(zip(SHARDS, blobs, strict=True)))
    last = len(steps) - 1
    snapshot = cache.folder / "snapshots" / suite.commits[f"step{steps[last]}"]
    suite.revision_bytes = sum(p.stat().st_size for p in snapshot.iterdir())
    served = {faults.copy: own[faults.copy_source], faults.shard: [own[last][0], own[faults.shard][1]]}
    served |= {i: own[last] for i in faults.final}
    for i, blobs in served.items():
        suite.commits[f"step{steps[i]}"] = cache.commit(
            f"step{steps[i]}", fixed | dict(zip(SHARDS, blobs, strict=True))
        )
    cache.ref("main", suite.commits[f"step{steps[last]}"])  # as in Pythia: main is the final step
    suite.build_s = time.perf_counter() - start
    return suite


def du(path: Path) -> int:
    """Bytes on disk under ``path`` (allocated blocks, links not followed), as ``du`` counts them."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            stat = os.lstat(os.path.join(folder, name))
            total += stat.st_blocks * 512
    return total


def run(command: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one ``ckpt`` command in its own process: wall and CPU seconds, peak memory, output."""
    start = time.perf_counter()
    peak = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        while True:  # os.wait4: this child's own CPU time; WNOHANG: read its memory meanwhile
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, high_water(child.pid))
            time.sleep(0.1)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "command": " ".join(command[1:]),
        "returncode": child.returncode,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": peak / 1e6,
        "stdout": stdout,
        "warnings": [line for line in stderr.splitlines() if line.startswith("Warning:")],
        "stderr": stderr,
    }


def high_water(pid: int) -> int:
    """The peak resident bytes of process ``pid`` so far (``VmHWM``; 0 once it is gone).

    Not ``ru_maxrss``: Linux carries the parent's peak into a forked child across ``exec``, so
    every command would report at least this script's own peak.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) * 1024


def ckpt_command(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("ckpt")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "ckpt.cli", *args]


def timed_loss(
    store: Path, work: Path, shape: str, examples: int, length: int, env: dict[str, str]
) -> dict[str, Any] | None:
    """``ckpt data add`` of random token ids, then ``ckpt analyze loss`` over every checkpoint, timed."""
    if examples == 0:
        return None
    ids = np.random.default_rng(1).integers(0, SHAPES[shape]["vocab_size"], (examples, length))
    np.save(work / "ids.npy", ids)
    added = run(ckpt_command("data", "add", str(store), "eval", "--inputs", str(work / "ids.npy")), env)
    if added["returncode"] != 0:
        raise SystemExit(f"ckpt data add failed: {added['stderr']}")
    analyzed = run(ckpt_command("analyze", "loss", str(store), "--no-progress"), env)
    if analyzed["returncode"] != 0:
        raise SystemExit(f"ckpt analyze loss failed: {analyzed['stderr']}")
    return analyzed


def compare(suite: Suite, duplicates: dict[str, Any], trajectory: dict[str, Any]) -> dict[str, Any]:
    """What was planted against what the checks named: per fault, and the steps named that were not planted."""
    steps, faults = suite.steps, suite.faults
    final = steps[-1]
    groups = [sorted(g) for g in duplicates["groups"]]
    partial = {p["step"]: p["source"] for p in duplicates["partial"]}
    mislabeled = set(trajectory["mislabeled"])
    planted = {
        "final": sorted(steps[i] for i in faults.final),
        "shard": steps[faults.shard],
        "copy": [steps[faults.copy_source], steps[faults.copy]],
        "outlier": steps[faults.outlier],
    }
    found = {
        "final": sorted(duplicates["identical_to_final"]) == planted["final"],
        # the source named is the longest stretch holding the final's values: the final, or a run of its copies
        "shard": partial.get(planted["shard"]) in {final, *planted["final"]},
        "copy": planted["copy"] in groups,
        "outlier": planted["outlier"] in mislabeled,
    }
    expected_groups = [planted["copy"], [*planted["final"], final]]
    named = {s for g in groups for s in g} | set(partial) | mislabeled
    touched = {*planted["final"], planted["shard"], *planted["copy"], planted["outlier"], final}
    return {
        "planted": planted,
        "found": found,
        "groups_exact": sorted(groups) == sorted(expected_groups),
        "partial_exact": set(partial) == {planted["shard"]},
        "mislabeled": sorted(mislabeled),
        "false_positives": sorted(named - touched),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="working folder: the cache, the store, the JSON")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="70m")
    parser.add_argument("--checkpoints", type=int, default=len(pythia_steps()), help="branches (default: all 154)")
    parser.add_argument("--repo", default=REPO, help="the repository id the cache holds (default: %(default)s)")
    parser.add_argument(
        "--loss-examples", type=int, default=8, help="random sequences for a timed `ckpt analyze loss` (0: none)"
    )
    parser.add_argument("--loss-length", type=int, default=128, help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the cache and the store")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pythia-suite-", dir=args.out))
    hub, store = work / "hf" / "hub", work / "suite.zarr"
    try:
        suite = build_suite(hub, args.shape, args.checkpoints, args.repo)
        cache_bytes = du(hub)
        built = f"built {len(suite.steps)} branches of hf://{args.repo} in {suite.build_s:.1f} s"
        print(f"{built} ({cache_bytes / 1e9:.2f} GB)", flush=True)
        env = os.environ | {
            "HF_HOME": str(work / "hf"),
            "HF_HUB_CACHE": str(hub),
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        env.pop("HF_TOKEN", None)
        imported = run(ckpt_command("import", f"hf://{args.repo}", str(store)), env)
        if imported["returncode"] != 0:
            raise SystemExit(f"ckpt import failed: {imported['stderr']}")
        store_bytes = du(store)
        verified = run(ckpt_command("verify", str(store), "--trajectory", "--json"), env)
        info = run(ckpt_command("info", str(store), "--json", "--no-finite-check"), env)
        if info["returncode"] != 0:
            raise SystemExit(f"ckpt info failed: {info['stderr']}")
        found = json.loads(verified["stdout"])
        import ckpt.store as ckptstore
        from ckpt.store.trajectory import duplicate_steps

        opened = ckptstore.open(store)
        start = time.perf_counter()
        duplicate_steps(opened)
        duplicates_s = time.perf_counter() - start
        result = compare(suite, found["duplicates"], found["trajectory"])
        loss = timed_loss(store, work, args.shape, args.loss_examples, args.loss_length, env)
        count = len(suite.steps)
        figures = {
            "shape": args.shape,
            "checkpoints": count,
            "parameters": suite.params,
            "revision_bytes": suite.revision_bytes,
            "build_s": suite.build_s,
            "cache_bytes": cache_bytes,
            "store_bytes": store_bytes,
            "store_per_checkpoint": store_bytes / count,
            "store_over_revision": store_bytes / count / suite.revision_bytes,
            "import_s": imported["wall_s"],
            "import_cpu_s": imported["cpu_s"],
            "import_per_checkpoint_s": imported["wall_s"] / count,
            "import_peak_rss_mb": imported["peak_rss_mb"],
            "verify_trajectory_s": verified["wall_s"],
            "verify_returncode": verified["returncode"],
            "info_s": info["wall_s"],
            "duplicates_in_process_s": duplicates_s,
            "loss_examples": args.loss_examples,
            "loss_length": args.loss_length,
            "loss_s": loss["wall_s"] if loss else None,
            "loss_peak_rss_mb": loss["peak_rss_mb"] if loss else None,
        }
        results = {
            "figures": figures,
            "comparison": result,
            "warnings": {"import": imported["warnings"], "verify": verified["warnings"], "info": info["warnings"]},
            "trajectory": found["trajectory"],
            "commits": suite.commits,
        }
        (args.out / "pythia-suite.json").write_text(json.dumps(results, indent=2))
        report(results)
        return results
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, Any]) -> None:
    """Print what was planted against what was named, then the figures."""
    figures, comparison = results["figures"], results["comparison"]
    for fault, steps in comparison["planted"].items():
        print(f"planted {fault:<8} {steps!s:<40} named: {'yes' if comparison['found'][fault] else 'NO'}")
    print(f"possibly mislabeled: {comparison['mislabeled']}; named but not planted: {comparison['false_positives']}")
    for where, lines in results["warnings"].items():
        for line in lines:
            print(f"[{where}] {line}")
    gb, mb = 1e9, 1e6
    rows = [
        ("checkpoints", f"{figures['checkpoints']} x {figures['parameters'] / mb:.1f} M parameters"),
        ("one revision's files", f"{figures['revision_bytes'] / mb:.1f} MB"),
        ("Hub cache (built)", f"{figures['cache_bytes'] / gb:.2f} GB in {figures['build_s']:.0f} s"),
        ("ckpt import", f"{figures['import_s']:.0f} s wall, {figures['import_cpu_s']:.0f} s CPU, "
                        f"{figures['import_per_checkpoint_s']:.2f} s / checkpoint, "
                        f"peak {figures['import_peak_rss_mb']:.0f} MB"),
        ("store", f"{figures['store_bytes'] / gb:.2f} GB, {figures['store_per_checkpoint'] / mb:.1f} MB / checkpoint "
                  f"({figures['store_over_revision']:.2f} x its files)"),
        ("ckpt verify --trajectory", f"{figures['verify_trajectory_s']:.0f} s (exit {figures['verify_returncode']})"),
        ("ckpt info", f"{figures['info_s']:.1f} s"),
        ("ckpt analyze loss", f"{figures['loss_s'] or 0:.0f} s, peak {figures['loss_peak_rss_mb'] or 0:.0f} MB "
                              f"({figures['loss_examples']} x {figures['loss_length']} tokens)"),
        ("duplicate check", f"{figures['duplicates_in_process_s'] * 1000:.0f} ms in process, no tensor read"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()

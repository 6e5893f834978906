"""Benchmark of the checkpoint store against plain ``torch.save`` / ``torch.load`` files.

Run by hand (not a test), from the repository root::

    python bench/store.py                 # 20 checkpoints, 3 repetitions (~1-3 minutes)
    python bench/store.py --quick         # 2-checkpoint smoke run
    python bench/store.py --checkpoints 50 --repeat 5 --dir /fast/disk
    python bench/store.py --hub-only      # only 7 and 8 (~30 s at the Pythia-70m shape)

What it measures, all in one run, each ratio against a baseline measured in the same run:

1. Write throughput of a sequence of T state_dicts of a ~11M-parameter GPT-like
   model (fp32, then the same weights in bf16): ``torch.save`` of one ``.pt``
   file per checkpoint vs ``Writer.write`` into one fresh store. Only the
   writing is timed; ``create()`` + ``close()`` are reported apart as a one-time
   cost. Both run alternately, in fresh directories; the median over the
   repetitions is reported. Neither side fsyncs, so page-cache effects are
   included for both alike; an untimed ``os.sync()`` before each run keeps one
   side's dirty pages from slowing the other down.
2. Bytes read to load ONE tensor across all T steps (``Store.read_tensor``),
   counted twice: by a ``zarr.storage.WrapperStore`` that counts every byte the
   zarr store hands out (zarr's Python codec pipeline, since the wrapper is no
   LocalStore) and by the process's ``rchar`` in ``/proc/self/io`` around a read
   through the normal store (the zarrs Rust pipeline, which bypasses Python stores).
3. Read throughput: ``Store.tensors(step, framework="torch")`` for every step vs ``torch.load`` of
   every file; and one checkpoint read by a fresh ``ckptstore.open()`` (as a worker's first read)
   vs ``torch.load`` of one file. ckpt's side includes its integrity checks: the crc32c of every
   chunk and the digest of every tensor against the commit record.
4. The NaN/inf check of ``ckpt verify`` and ``ckpt info`` (``nonfinite_counts``): every checkpoint read
   with ``Store.tensors`` alone vs read and checked; the ratio is what ``--no-finite-check`` saves.
5. Analysis results: a POLCA-sized result (40 steps x 5000 datapoints x K=8, float32) written
   in blocks of 4 steps and read back whole, by ``write_analysis`` / ``Store.analysis`` (commits,
   crc32c, the digest of every chunk written and checked) vs plain xarray ``to_zarr`` (append) /
   ``open_zarr`` of the same dataset into a bare zarr v3 store, with the same chunks.
6. Duplicate detection over 154 checkpoints of a Pythia-70m-shaped run (GPTNeoX, 6 layers, hidden
   512, vocabulary 50304: 76 tensors, 70.4M parameters, 282 MB fp32 a checkpoint) at Pythia's
   steps (0, 1, 2, 4 .. 512, 1000 .. 143000), with two planted duplicates (one step holding
   another's weights, one the final checkpoint's) and a planted shard of the final checkpoint.
   The record is the real one: every checkpoint is written whole, in fp32, through the public
   writer, so that its 76 digests are computed from 282 MB as in a real import; the disk stays
   small because the tensors are zeros but for one value per tensor and step (unique, so no two
   digests agree by accident) and the store is zstd-compressed. Timed: ``ckptstore.open`` +
   ``duplicate_steps``, what ``ckpt import``/``info``/``verify`` add; the bytes the process reads
   meanwhile (``/proc/self/io`` rchar) show that no tensor is read. Baseline: the hash sweep users
   write by hand (read a checkpoint, hash each tensor), measured on 3 checkpoints and scaled to 154.
7. Import from the Hub (issue 69): a local Hub cache laid out as huggingface_hub does
   (``refs/``, ``snapshots/``, ``blobs/``; bench/hub_refs.py) holding ``--hub-revisions`` step branches
   of a random GPTNeoX of Pythia-70m's shape (``--hub-size tiny`` for a small one), one fp16
   ``model.safetensors`` each as pythia-70m has. Timed: one revision imported, offline, by
   ``plan_import`` + ``run_import`` (what ``ckpt import hf://ORG/NAME DEST --revisions stepN`` runs),
   against reading its safetensors file (``safetensors.torch.load_file``) and writing it with the
   public writer, alternated, after a first call of each (reported apart). Disk: the bytes one more
   imported checkpoint adds to the store (allocated blocks, as ``du``; and apparent bytes) over its
   safetensors file's, with the store's files by kind and what its layout adds per chunk file.
8. Byte-range references instead of copies (issue 69, item 6): bench/hub_refs.py's prototype keeps
   per step and tensor only (blob in the cache, offset, length, dtype, shape, sha256, xxh3). Measured
   against the import's copy: disk, the time to read one checkpoint with its digests checked, what a
   verify must check, plain ``xr.open_zarr`` on the copy, and what becomes of a reference when a byte
   of its blob changes, when the store is copied without the cache, and when huggingface_hub deletes
   the revision from its cache (``hf cache delete``'s own call).

Everything is written under one temporary directory, removed at the end (the Hub cache included:
HF_HUB_CACHE points into it and HF_HUB_OFFLINE=1, so nothing is downloaded and the user's cache is
never touched).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from zarr.storage import WrapperStore

import ckpt.store as ckptstore
from ckpt.errors import StoreError


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.ModuleDict({"qkv": nn.Linear(d, 3 * d), "out": nn.Linear(d, d)})
        self.mlp = nn.ModuleDict({"fc": nn.Linear(d, 4 * d), "proj": nn.Linear(4 * d, d)})


class GPT(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 384, layers: int = 6, context: int = 128) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)


def state_dicts(n: int, dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    """n checkpoints of one model, its weights nudged a little between them."""
    torch.manual_seed(0)
    model, out = GPT(), []
    for _ in range(n):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p), alpha=1e-3)
        out.append({k: v.detach().to(dtype).clone() for k, v in model.state_dict().items()})
    return out


def write_torch(root: Path, seq: list[dict]) -> list[float]:
    root.mkdir()
    times = []
    for i, sd in enumerate(seq):
        t0 = time.perf_counter()
        torch.save(sd, root / f"step_{i}.pt")
        times.append(time.perf_counter() - t0)
    return times


def write_ckpt(root: Path, seq: list[dict]) -> tuple[list[float], float, float]:
    """Seconds of each ``write``, and of ``create`` and ``close``."""
    t0 = time.perf_counter()
    w = ckptstore.create(root, overwrite=True, framework="torch")
    created = time.perf_counter() - t0
    times = []
    for i, sd in enumerate(seq):
        t0 = time.perf_counter()
        w.write(i, sd)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    w.close()
    return times, created, time.perf_counter() - t0


def bench_write(base: Path, seq: list[dict], repeat: int, label: str) -> dict:
    """torch.save and ckpt alternately (order flipped every repetition), each in a fresh directory.

    ``os.sync()`` before each timed run (untimed) so that neither pays for the
    other's dirty pages; within a run nothing is synced, for both alike.
    """
    runs: dict[str, list] = {"torch": [], "ckpt": [], "create": [], "close": []}
    for r in range(repeat):
        for which in ("torch", "ckpt") if r % 2 == 0 else ("ckpt", "torch"):
            os.sync()
            if which == "torch":
                runs["torch"].append(write_torch(base / f"{label}_torch_{r}", seq))
            else:
                times, created, closed = write_ckpt(base / f"{label}_ckpt_{r}.zarr", seq)
                runs["ckpt"].append(times)
                runs["create"].append(created)
                runs["close"].append(closed)
    per_ckpt = {k: statistics.median(sum(t) / len(t) for t in runs[k]) for k in ("torch", "ckpt")}
    return {
        "label": label,
        "bytes": sum(t.nbytes for t in seq[0].values()),
        "torch_s": per_ckpt["torch"],
        "ckpt_s": per_ckpt["ckpt"],
        "ckpt_first_s": statistics.median(t[0] for t in runs["ckpt"]),
        "ckpt_steady_s": statistics.median(x for t in runs["ckpt"] for x in t[1:]) if len(seq) > 1 else float("nan"),
        "create_s": statistics.median(runs["create"]),
        "close_s": statistics.median(runs["close"]),
        "dirs": (base / f"{label}_torch_0", base / f"{label}_ckpt_0.zarr"),
    }


class CountingStore(WrapperStore):
    """Counts the bytes of every value the wrapped zarr store returns."""

    nbytes = 0

    async def get(self, key, prototype, byte_range=None):
        buf = await self._store.get(key, prototype, byte_range)
        CountingStore.nbytes += 0 if buf is None else len(buf)
        return buf

    async def get_partial_values(self, prototype, key_ranges):
        bufs = await self._store.get_partial_values(prototype, key_ranges)
        CountingStore.nbytes += sum(len(b) for b in bufs if b is not None)
        return bufs


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def bench_bytes(path: Path, name: str) -> dict:
    plain = ckptstore.open(path)
    plain.read_tensor(name)  # warm-up: imports, thread pools
    probe = -(rchar() - rchar())  # what reading /proc/self/io itself adds to rchar
    before = rchar()
    plain.read_tensor(name)
    os_bytes = rchar() - before - probe
    counted = ckptstore.open(path)
    counted._zstore = CountingStore(counted._zstore)
    counted.refresh()
    CountingStore.nbytes = 0
    counted.read_tensor(name)
    tensor = plain.schema[name].nbytes * len(plain.steps)
    return {"name": name, "tensor": tensor, "store": CountingStore.nbytes, "os": os_bytes}


def bench_read(torch_dir: Path, store: Path, steps: int, repeat: int) -> tuple[float, float]:
    """Seconds per checkpoint: torch.load of every file vs ckptstore.open + Store.tensors of every step."""
    times: dict[str, list[float]] = {"torch": [], "ckpt": []}
    for r in range(repeat):
        for which in ("torch", "ckpt") if r % 2 == 0 else ("ckpt", "torch"):
            t0 = time.perf_counter()
            if which == "torch":
                for i in range(steps):
                    torch.load(torch_dir / f"step_{i}.pt")
            else:
                s = ckptstore.open(store)
                for step in s.steps:
                    s.tensors(int(step), framework="torch")
            times[which].append((time.perf_counter() - t0) / steps)
    return statistics.median(times["torch"]), statistics.median(times["ckpt"])


def bench_read_one(torch_dir: Path, store: Path, steps: int, repeat: int) -> tuple[float, float]:
    """Median seconds to read one checkpoint: torch.load of its file vs ckptstore.open + Store.tensors."""
    times: dict[str, list[float]] = {"torch": [], "ckpt": []}
    for r in range(repeat):
        for i in range(steps):
            for which in ("torch", "ckpt") if (r + i) % 2 == 0 else ("ckpt", "torch"):
                t0 = time.perf_counter()
                if which == "torch":
                    torch.load(torch_dir / f"step_{i}.pt")
                else:
                    ckptstore.open(store).tensors(i, framework="torch")
                times[which].append(time.perf_counter() - t0)
    return statistics.median(times["torch"]), statistics.median(times["ckpt"])


def bench_results(base: Path, repeat: int) -> dict[str, float]:
    """Seconds to write (in blocks) and read back a POLCA-sized result: plain xarray vs ckpt."""
    import numpy as np
    import xarray as xr

    import ckpt.store as ckptstore
    from ckpt.store.results import write_analysis

    steps, datapoints, k, block = 40, 5000, 8, 4
    rng = np.random.default_rng(0)
    full = xr.Dataset(
        {"polca": (("step", "datapoint", "basis"), rng.standard_normal((steps, datapoints, k)).astype(np.float32))},
        coords={"step": np.arange(steps)},
    )
    blocks = [full.isel(step=slice(i, i + block)) for i in range(0, steps, block)]
    times: dict[str, list[float]] = {"xr_write": [], "xr_read": [], "ckpt_write": [], "ckpt_read": []}
    for run in range(repeat):
        plain, store = base / f"plain-{run}.zarr", base / f"results-{run}.zarr"
        ckptstore.create(store).close()
        began = time.perf_counter()
        for i, part in enumerate(blocks):
            append = {"mode": "a", "append_dim": "step"} if i else {"mode": "w"}
            part.to_zarr(plain, zarr_format=3, consolidated=False, **append)
        times["xr_write"].append(time.perf_counter() - began)
        began = time.perf_counter()
        for i, part in enumerate(blocks):
            done = list(range(0, (i + 1) * block))
            write_analysis(store, "polca", part, append_dim="step" if i else None, attrs={"ckpt": {"steps": done}})
        times["ckpt_write"].append(time.perf_counter() - began)
        began = time.perf_counter()
        xr.open_zarr(plain, consolidated=False).load()
        times["xr_read"].append(time.perf_counter() - began)
        began = time.perf_counter()
        loaded = ckptstore.open(store).analysis("polca").load()
        times["ckpt_read"].append(time.perf_counter() - began)
        assert np.array_equal(loaded["polca"].values, full["polca"].values)
    return {key: statistics.median(values) for key, values in times.items()} | {"bytes": full["polca"].nbytes}


def bench_finite_check(store: Path, steps: int, repeat: int) -> tuple[float, float]:
    """Seconds per checkpoint: reading it (Store.tensors) vs reading it and counting NaN/inf (ckpt verify/info)."""
    from ckpt.store.reader import nonfinite_counts

    times: dict[str, list[float]] = {"read": [], "checked": []}
    s = ckptstore.open(store)
    for r in range(repeat):
        for which in ("read", "checked") if r % 2 == 0 else ("checked", "read"):
            t0 = time.perf_counter()
            for step in s.steps:
                values = s.tensors(int(step))
                if which == "checked":
                    nonfinite_counts(values)
            times[which].append((time.perf_counter() - t0) / steps)
    return statistics.median(times["read"]), statistics.median(times["checked"])


PYTHIA_STEPS = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]
"""Pythia's 154 checkpoint steps: 0, 1, 2, 4 .. 512, 1000 .. 143000."""


def pythia_70m_shapes(layers: int = 6, d: int = 512, vocab: int = 50304) -> dict[str, tuple[int, ...]]:
    """The state_dict shapes of pythia-70m (GPTNeoXForCausalLM, as its Hub checkpoints name them)."""
    shapes: dict[str, tuple[int, ...]] = {"gpt_neox.embed_in.weight": (vocab, d)}
    for i in range(layers):
        layer = f"gpt_neox.layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes |= {f"{layer}.{norm}.weight": (d,), f"{layer}.{norm}.bias": (d,)}
        for name, (rows, cols) in {
            "attention.query_key_value": (3 * d, d),
            "attention.dense": (d, d),
            "mlp.dense_h_to_4h": (4 * d, d),
            "mlp.dense_4h_to_h": (d, 4 * d),
        }.items():
            shapes |= {f"{layer}.{name}.weight": (rows, cols), f"{layer}.{name}.bias": (rows,)}
    return (
        shapes
        | {"gpt_neox.final_layer_norm.weight": (d,), "gpt_neox.final_layer_norm.bias": (d,)}
        | {"embed_out.weight": (vocab, d)}
    )


def write_pythia_shaped(path: Path, steps: list[int]) -> dict[str, object]:
    """A store of ``steps`` fp32 checkpoints of pythia-70m's shapes, with planted duplicates (see the docstring)."""
    import numpy as np

    shapes = pythia_70m_shapes()
    tensors = {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}
    third, apart, shard = len(steps) // 3, max(1, len(steps) // 30), steps[min(40, len(steps) - 3)]
    final, copied, copy_of_final = steps[-1], steps[third], steps[len(steps) // 2]
    planted = {steps[third + apart]: copied, copy_of_final: final, shard: final}
    shard_names = [name for name in shapes if ".layers.0." in name or ".layers.1." in name]

    def values(step: int) -> dict[str, np.ndarray]:
        for t, array in enumerate(tensors.values()):
            array.reshape(-1)[t % array.size] = np.float32(step + 1)  # unique per step: distinct digests
        return tensors

    began = time.perf_counter()
    with ckptstore.create(path, compressor="zstd", framework="torch") as writer:
        for step in steps:
            source = planted.get(step, step)
            state = values(source)
            if step == shard:  # the final checkpoint's first layers, the rest the step's own
                state = {n: (v.copy() if n in shard_names else v) for n, v in state.items()}
                state |= {n: v for n, v in values(step).items() if n not in shard_names}
            writer.write(step, state)
    return {
        "write_s": time.perf_counter() - began,
        "planted": planted,
        "shard": shard,
        "parameters": sum(int(np.prod(s)) for s in shapes.values()),
        "tensors": len(shapes),
    }


def bench_duplicates(base: Path, steps: list[int], repeat: int) -> dict[str, object]:
    """Seconds and bytes read by ckptstore.open + duplicate_steps; the hand-written hash sweep as baseline."""
    import xxhash

    from ckpt.store.trajectory import duplicate_steps

    path, record = base / "pythia-70m-shaped.zarr", base / "record-only.zarr"
    written = write_pythia_shaped(path, steps)
    # the same store without a single tensor chunk (the record, the arrays' metadata, the step array)
    shutil.copytree(
        path, record, ignore=lambda d, names: [] if d.endswith("step") else [n for n in names if n[:2] == "c."]
    )
    times: dict[Path, list[float]] = {path: [], record: []}
    read = []
    for _ in range(repeat):
        for where in (path, record):
            probe = -(rchar() - rchar())
            before = rchar()
            t0 = time.perf_counter()
            found = duplicate_steps(ckptstore.open(where))
            times[where].append(time.perf_counter() - t0)
            read.append(rchar() - before - probe)
    assert found == duplicate_steps(ckptstore.open(path))  # no tensor read: the answer needs none
    s = ckptstore.open(path)
    sweep = []
    for step in s.steps[:3]:
        t0 = time.perf_counter()
        for value in s.stored_tensors(int(step)).values():
            xxhash.xxh3_64_hexdigest(memoryview(value).cast("B"))
        sweep.append(time.perf_counter() - t0)
    tensor_bytes = sum(t.nbytes for t in s.schema.values()) * len(s.steps)
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return written | {
        "check_s": statistics.median(times[path]),
        "record_s": statistics.median(times[record]),
        "read_bytes": max(read),
        "record_bytes": (path / "zarr.json").stat().st_size,
        "tensor_bytes": tensor_bytes,
        "disk_bytes": on_disk,
        "sweep_s": statistics.median(sweep) * len(s.steps),
        "found": found,
        "checkpoints": len(s.steps),
    }


HUB_REPO = "EleutherAI/pythia-70m"
"""The repository id the bench's local Hub cache holds (nothing is downloaded)."""


def hub_steps(count: int) -> list[int]:
    """``count`` of Pythia's steps, spread over the run (first and last included)."""
    last = len(PYTHIA_STEPS) - 1
    return sorted({PYTHIA_STEPS[round(i * last / max(1, count - 1))] for i in range(count)})


def du(path: Path) -> int:
    """Bytes allocated under ``path`` (blocks, as ``du`` counts them; links not followed)."""
    return sum(os.lstat(p).st_blocks * 512 for p in ([path] if path.is_file() else path.rglob("*")) if not p.is_dir())


def store_breakdown(path: Path) -> dict[str, dict[str, int]]:
    """Files, apparent bytes and allocated bytes of a store, by kind: chunk files, zarr.json, the rest."""
    kinds: dict[str, dict[str, int]] = {}
    for p in path.rglob("*"):
        if p.is_dir() or p.is_symlink():
            continue
        rel = p.relative_to(path).as_posix()
        if rel.startswith("checkpoints/") and p.name.startswith("c."):
            kind = "tensor chunks"
        elif rel == "zarr.json":
            kind = "root zarr.json (record, consolidated metadata)"
        elif rel.startswith("checkpoints/") and p.name == "zarr.json":
            kind = "checkpoints/*/zarr.json"
        else:
            kind = "other (step array, ...)"
        stat = os.lstat(p)
        entry = kinds.setdefault(kind, {"files": 0, "apparent": 0, "allocated": 0})
        entry["files"] += 1
        entry["apparent"] += stat.st_size
        entry["allocated"] += stat.st_blocks * 512
    return kinds


def bench_hub_import(base: Path, shape: str, count: int, repeat: int) -> dict[str, object]:
    """Import of one revision from the Hub cache vs reading its safetensors + writing them; disk per checkpoint.

    HF_HUB_CACHE and HF_HUB_OFFLINE=1 are set by main() before huggingface_hub is imported.
    """
    import hub_refs
    from huggingface_hub import constants
    from safetensors.torch import load_file

    from ckpt.store.hub import plan_import, run_import

    root = base / "hf" / "hub"
    if Path(constants.HF_HUB_CACHE) != root or not constants.HF_HUB_OFFLINE:  # never the user's own cache
        raise SystemExit(f"huggingface_hub was imported before main() pointed it at {root}, offline")
    steps = hub_steps(count)
    began = time.perf_counter()
    built = hub_refs.build_cache(root, HUB_REPO, shape, steps)
    build_s = time.perf_counter() - began
    folder, commits = built["folder"], built["commits"]
    source = f"hf://{HUB_REPO}"

    def imported(dest: Path, step: int) -> float:
        t0 = time.perf_counter()
        run_import(plan_import(source, dest, revisions=f"step{step}"))
        return time.perf_counter() - t0

    def written(dest: Path, step: int) -> float:
        t0 = time.perf_counter()
        tensors = load_file(folder / "snapshots" / commits[step] / "model.safetensors")
        with ckptstore.create(dest, framework="torch") as writer:
            writer.write(step, tensors)
        return time.perf_counter() - t0

    # first calls apart: the import builds the model on meta once per config for its key conversion
    cold = {
        "ckpt": imported(base / "cold-import.zarr", steps[0]),
        "baseline": written(base / "cold-write.zarr", steps[0]),
    }
    times: dict[str, list[float]] = {"ckpt": [], "baseline": []}
    for r in range(repeat):
        for i, step in enumerate(steps):
            for which in ("ckpt", "baseline") if (r + i) % 2 == 0 else ("baseline", "ckpt"):
                dest = base / f"one-{which}.zarr"
                times[which].append((imported if which == "ckpt" else written)(dest, step))
                shutil.rmtree(dest)
    # the store every revision is imported into, one at a time (as a rerun adds new branches)
    store = base / "hub-import.zarr"
    imported(store, steps[0])
    first, first_apparent = du(store), sum(k["apparent"] for k in store_breakdown(store).values())
    for step in steps[1:]:
        imported(store, step)
    whole = du(store)
    kinds = store_breakdown(store)
    whole_apparent = sum(k["apparent"] for k in kinds.values())
    opened = ckptstore.open(store)
    tensor_bytes = sum(t.nbytes for t in opened.schema.values())
    # what the store's layout adds to each chunk file: the 4-byte crc32c, then rounding up to the block
    block = os.statvfs(store).f_bsize
    chunk_sizes = [t.nbytes for t in opened.schema.values()]
    rounded = sum(-(-n // block) * block for n in chunk_sizes)
    with_crc = sum(-(-(n + 4) // block) * block for n in chunk_sizes)
    small = [n for n in chunk_sizes if n < 64 << 10]
    packed = rounded - sum(-(-n // block) * block for n in small) + -(-sum(small) // block) * block
    sizes = [built["sizes"][s] for s in steps]
    return {
        "shape": shape,
        "steps": steps,
        "tensors": built["tensors"],
        "build_s": build_s,
        "cold": cold,
        "ckpt_s": statistics.median(times["ckpt"]),
        "baseline_s": statistics.median(times["baseline"]),
        "trials": len(times["ckpt"]),
        "safetensors_bytes": statistics.mean(sizes),
        "blob_allocated": statistics.mean(
            du(Path(os.path.realpath(folder / "snapshots" / commits[s] / "model.safetensors"))) for s in steps
        ),
        "tensor_bytes": tensor_bytes,
        "store_first": first,
        "store_whole": whole,
        "marginal": (whole - first) / max(1, len(steps) - 1),
        "marginal_apparent": (whole_apparent - first_apparent) / max(1, len(steps) - 1),
        "kinds": kinds,
        "block": block,
        "layout": {
            "crc32c + blocks": with_crc,
            "blocks, no crc32c": rounded,
            "small tensors packed, no crc32c": packed,
        },
        "store": store,
        "folder": folder,
        "commits": commits,
    }


def bench_byte_ranges(base: Path, hub: dict[str, object], repeat: int) -> dict[str, object]:
    """Issue 69 item 6: references into the Hub cache (bench/hub_refs.py) against the copy the import makes."""
    import hub_refs
    import numpy as np
    import xarray as xr
    from huggingface_hub import scan_cache_dir
    from safetensors.numpy import load_file

    folder, commits, store = Path(hub["folder"]), dict(hub["commits"]), Path(hub["store"])
    table_path = base / "references.json"
    t0 = time.perf_counter()
    hub_refs.write_references(folder, commits, table_path)
    table_s = time.perf_counter() - t0
    table = json.loads(table_path.read_text())
    s = ckptstore.open(store)
    steps = [int(x) for x in s.steps]
    reads: dict[str, list[float]] = {"store": [], "refs xxh3": [], "refs sha256": [], "safetensors": []}
    order = list(reads)
    for r in range(repeat):
        for i, step in enumerate(steps):
            k = (r + i) % len(order)
            for which in order[k:] + order[:k]:
                t0 = time.perf_counter()
                if which == "store":
                    s.tensors(step)
                elif which == "safetensors":
                    load_file(folder / "snapshots" / commits[step] / "model.safetensors")
                else:
                    hub_refs.read_references(folder, table, step, digest=which.split()[1])
                reads[which].append(time.perf_counter() - t0)
    # the same values: the store holds the import's names (lm_head.weight for embed_out.weight)
    refs = hub_refs.read_references(folder, table, steps[-1])
    held = s.tensors(steps[-1])
    same = all(np.array_equal(held[n], refs[n]) for n in refs if n in held)
    t0 = time.perf_counter()
    problems = hub_refs.verify_references(folder, table)
    verify_s = time.perf_counter() - t0
    # plain xarray: the copy is a zarr v3 store, read without ckpt
    try:
        plain = xr.open_zarr(store, group="checkpoints", consolidated=False)
        name = next(iter(plain.data_vars))
        xarray_ok = bool(np.array_equal(plain[name].isel(step=-1).values, held[name]))
    except Exception as exc:  # what a user would see: reported, not raised
        xarray_ok = f"{type(exc).__name__}: {exc}"
    # integrity, each case on the cache as a user's tools leave it
    cases = {}
    blob = folder / table["steps"][str(steps[-1])]["blob"]
    with open(blob, "r+b") as f:  # one byte changed in place (a disk error, a tool writing into the cache)
        f.seek(table["steps"][str(steps[-1])]["tensors"]["embed_out.weight"]["offset"] + 10)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    cases["a changed byte"] = _outcome(hub_refs, folder, table, steps[-1])
    cases["  ... verify"] = "; ".join(hub_refs.verify_references(folder, table)) or "nothing found"
    elsewhere = base / "cluster-cache" / folder.name
    elsewhere.mkdir(parents=True)
    cases["the store copied to a cluster (no cache there)"] = _outcome(hub_refs, elsewhere, table, steps[0])
    info = scan_cache_dir(folder.parent)
    info.delete_revisions(commits[steps[0]]).execute()  # what `hf cache delete` runs
    cases["the revision deleted from the cache"] = _outcome(hub_refs, folder, table, steps[0])
    return {
        "table_bytes": table_path.stat().st_size,
        "table_allocated": du(table_path),
        "table_s": table_s,
        "reads": {k: statistics.median(v) for k, v in reads.items()},
        "same": same,
        "verify_problems": problems,
        "verify_s": verify_s,
        "xarray": xarray_ok,
        "cases": cases,
        "checkpoints": len(steps),
    }


def _outcome(hub_refs: object, folder: Path, table: dict, step: int) -> str:
    try:
        hub_refs.read_references(folder, table, step)  # type: ignore[attr-defined]
    except StoreError as exc:  # the library's own: MissingDataError, CorruptChunkError
        return f"read refused: {exc}"
    return "read returned values"


def hub_rows(h: dict, b: dict | None) -> tuple[list[tuple[str, ...]], str]:
    """The table rows and notes of bench_hub_import (and bench_byte_ranges, when run)."""
    mb, n = h["safetensors_bytes"] / 1e6, len(h["steps"])
    rows = []
    cells = (
        f"read+write {h['baseline_s']:.3f}",
        f"{h['ckpt_s']:.3f}",
        f"{h['ckpt_s'] / h['baseline_s']:.2f}x",
        "<= 1.2x",
    )
    rows.append((f"hub import one revision s ({mb:.1f} MB fp16)", *cells))
    cold = h["cold"]
    cells = (f"{cold['baseline']:.3f}", f"{cold['ckpt']:.3f}", f"{cold['ckpt'] / cold['baseline']:.2f}x")
    rows.append(("  the first in the process s", *cells))
    marginal, st = h["marginal"], h["safetensors_bytes"]
    cells = (f"safetensors {st / 1e6:.3f} MB", f"{marginal / 1e6:.3f} MB", f"{marginal / st:.4f}x", "<= 1.0")
    rows.append(("disk per imported checkpoint (du, marginal)", *cells))
    whole = h["store_whole"] / n
    rows.append((f"  store du / {n} checkpoints", "", f"{whole / 1e6:.3f} MB", f"{whole / st:.4f}x"))
    apparent = h["marginal_apparent"]
    rows.append(("  apparent bytes (marginal)", "", f"{apparent / 1e6:.3f} MB", f"{apparent / st:.5f}x"))
    notes = [
        f"hub: {n} revisions ({', '.join(map(str, h['steps']))}) of a {h['shape']}-shaped GPTNeoX, "
        f"{h['tensors']} tensors, one fp16 model.safetensors each ({st:.0f} bytes, {h['blob_allocated']:.0f} "
        f"allocated; built in {h['build_s']:.0f} s); store codec: crc32c only, no compression (the default)."
    ]
    notes.append(
        "  import: plan_import + run_import (what `ckpt import hf://... --revisions stepN` runs), "
        "HF_HUB_OFFLINE=1, into a fresh store; baseline: safetensors.torch.load_file + create/write/close;"
    )
    notes.append(f"  median of {h['trials']} alternated trials after a first call of each (above).")
    notes.append(
        f"  store by kind, {n} checkpoints (files, apparent bytes, allocated bytes; tensors "
        f"{h['tensor_bytes']} bytes a checkpoint):"
    )
    for kind, k in sorted(h["kinds"].items()):
        notes.append(f"    {kind}: {k['files']} files, {k['apparent']} B, {k['allocated']} B allocated")
    notes.append(
        f"  tensor chunk files of one checkpoint in {h['block']}-byte blocks, against {h['tensor_bytes']} "
        "tensor bytes: " + "; ".join(f"{k} {v} ({v / h['tensor_bytes']:.4f}x)" for k, v in h["layout"].items())
    )
    if b is not None:
        reads = b["reads"]
        base_cell = f"store {reads['store']:.3f}"
        for which in ("refs xxh3", "refs sha256", "safetensors"):
            what = "safetensors load_file (no digest)" if which == "safetensors" else which
            cells = (base_cell, f"{reads[which]:.3f}", f"{reads[which] / reads['store']:.2f}x")
            rows.append((f"read one checkpoint s, {what}", *cells))
        per = b["table_bytes"] / b["checkpoints"]
        cells = (f"copy {marginal / 1e6:.3f} MB", f"{per / 1e3:.1f} kB + the blob kept", f"{per / marginal:.5f}x")
        rows.append(("references: disk per checkpoint", *cells))
        rows.append(
            (
                "  with the cache kept (refs + blob)",
                f"copy + blob {(marginal + h['blob_allocated']) / 1e6:.1f} MB",
                f"{(per + h['blob_allocated']) / 1e6:.1f} MB",
                f"{(per + h['blob_allocated']) / (marginal + h['blob_allocated']):.2f}x",
            )
        )
        rows.append(
            (
                "  default import (cache freed)",
                f"copy {marginal / 1e6:.1f} MB",
                f"{(per + h['blob_allocated']) / 1e6:.1f} MB (cache must stay)",
                f"{(per + h['blob_allocated']) / marginal:.2f}x",
            )
        )
        notes.append(
            f"references: table written in {b['table_s']:.2f} s (every byte digested once); same values as "
            f"the store: {b['same']}; verify (blob sha256 = name, range digests) {b['verify_s']:.2f} s, "
            f"found: {b['verify_problems'] or 'nothing'}; xr.open_zarr on the copy: {b['xarray']}"
        )
        for case, outcome in b["cases"].items():
            notes.append(f"  {case}: {outcome}")
    return rows, "\n".join(notes)


def print_rows(rows: list[tuple[str, ...]], notes: str = "") -> None:
    """The table (measure, baseline, ckpt, ratio, target), then ``notes``."""
    rows = [(*row, "", "", "", "")[:5] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    print()
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if notes:
        print(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", type=int, default=20, help="checkpoints per run (T)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each measurement")
    parser.add_argument("--dir", default=None, help="where to write (default: a fresh temp dir)")
    parser.add_argument("--quick", action="store_true", help="2-checkpoint, 1-repetition smoke run")
    parser.add_argument("--hub-size", choices=("70m", "tiny"), default="70m", help="shape of the Hub cache's model")
    parser.add_argument("--hub-revisions", type=int, default=3, help="revisions in the Hub cache (7-8)")
    parser.add_argument("--hub-only", action="store_true", help="only the Hub import and byte-range parts (7-8)")
    args = parser.parse_args()
    if args.quick:
        args.checkpoints, args.repeat = 2, 1
    n = args.checkpoints
    base = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    # huggingface_hub reads these when imported: a local cache, offline (nothing downloads)
    os.environ |= {"HF_HOME": str(base / "hf"), "HF_HUB_CACHE": str(base / "hf" / "hub"), "HF_HUB_OFFLINE": "1"}
    os.environ |= {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    os.environ.pop("HF_TOKEN", None)
    if args.hub_only:
        try:
            hub = bench_hub_import(base, args.hub_size, args.hub_revisions, args.repeat)
            ranges = bench_byte_ranges(base, hub, args.repeat)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        rows, notes = hub_rows(hub, ranges)
        print_rows([("measure", "baseline", "ckpt", "ratio", "target"), *rows], notes)
        return
    try:
        fp32 = state_dicts(n, torch.float32)
        n_params = sum(t.numel() for t in fp32[0].values())
        what = f"{n_params / 1e6:.2f}M parameters, {len(fp32[0])} tensors"
        print(f"model: {what}; T={n} checkpoints, repeat={args.repeat}; torch {torch.__version__}; dir {base}")
        writes = [bench_write(base, fp32, args.repeat, "fp32")]
        bf16 = [{k: v.to(torch.bfloat16) for k, v in sd.items()} for sd in fp32]
        writes.append(bench_write(base, bf16, args.repeat, "bf16"))
        del bf16
        torch_dir, store = writes[0]["dirs"]
        reads = [bench_bytes(store, name) for name in ("blocks.0.mlp.fc.weight", "blocks.0.ln1.bias")]
        r_torch, r_ckpt = bench_read(torch_dir, store, n, args.repeat)
        one_torch, one_ckpt = bench_read_one(torch_dir, store, n, args.repeat)
        plain_read, checked_read = bench_finite_check(store, n, args.repeat)
        results = bench_results(base, args.repeat)
        duplicates = bench_duplicates(base, PYTHIA_STEPS[: 12 if args.quick else None], args.repeat)
        hub = bench_hub_import(base, "tiny" if args.quick else args.hub_size, args.hub_revisions, args.repeat)
        ranges = bench_byte_ranges(base, hub, args.repeat)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows = [("measure", "baseline", "ckpt", "ratio", "target")]
    for w in writes:
        label, mb = w["label"], w["bytes"] / 1e6
        speed_t, speed_c = mb / w["torch_s"], mb / w["ckpt_s"]
        base_cell = f"torch.save {w['torch_s']:.4f} ({speed_t:.0f} MB/s)"
        ckpt_cell = f"{w['ckpt_s']:.4f} ({speed_c:.0f} MB/s)"
        ratio = f"{speed_c / speed_t:.2f}x"
        rows.append((f"write {label} s/ckpt ({mb:.1f} MB)", base_cell, ckpt_cell, ratio, ">= 1.0x"))
        rows.append((f"  {label}: 1st write / later writes", "", f"{w['ckpt_first_s']:.4f} / {w['ckpt_steady_s']:.4f}"))
        rows.append((f"  {label}: create() / close(), once", "", f"{w['create_s']:.4f} / {w['close_s']:.4f}"))
    for r in reads:
        for how, what in (("store", "zarr store"), ("os", "/proc rchar")):
            got, want = r[how], r["tensor"]
            cells = (f"tensor {want}", f"{got} (+{got - want})", f"{got / want:.4f}x", "1.0x")
            rows.append((f"read_tensor {r['name']} bytes, {what}", *cells))
    mb = writes[0]["bytes"] / 1e6
    base_cell = f"torch.load {r_torch:.4f} ({mb / r_torch:.0f} MB/s)"
    ckpt_cell = f"{r_ckpt:.4f} ({mb / r_ckpt:.0f} MB/s)"
    rows.append(("read every step, fp32 s/ckpt", base_cell, ckpt_cell, f"{r_torch / r_ckpt:.2f}x", ">= 1.0x"))
    cells = (f"torch.load {one_torch:.4f}", f"{one_ckpt:.4f}", f"{one_torch / one_ckpt:.2f}x")
    rows.append(("read one step, fresh open, fp32 s", *cells))
    cells = (f"read {plain_read:.4f}", f"{checked_read:.4f}", f"{checked_read / plain_read:.2f}x", "cost")
    rows.append(("NaN/inf check (verify, info) s/ckpt", *cells))
    result_mb = results["bytes"] / 1e6
    for what in ("write", "read"):
        plain, ours = results[f"xr_{what}"], results[f"ckpt_{what}"]
        cells = (f"xarray+zarr {plain:.3f}", f"{ours:.3f}", f"{plain / ours:.2f}x")
        rows.append((f"result {what} s ({result_mb:.1f} MB, 10 blocks)", *cells))
    d = duplicates
    cells = (f"hash sweep {d['sweep_s']:.1f}", f"{d['check_s']:.3f}", f"{d['sweep_s'] / d['check_s']:.0f}x", "< 1 s")
    rows.append((f"duplicates, {d['checkpoints']} Pythia-70m-shaped ckpts s", *cells))
    rows.append(("  the same, no tensor chunk in the store s", "", f"{d['record_s']:.3f}", "", "same answer"))
    cells = (f"tensors {d['tensor_bytes'] / 1e9:.1f} GB", f"{d['read_bytes'] / 1e6:.2f} MB", "", "no tensor")
    rows.append(("  bytes read by open + duplicate check", *cells))
    extra, hub_notes = hub_rows(hub, ranges)
    print_rows(rows + extra, hub_notes)
    print(f"""
write: median over {args.repeat} runs of (seconds of the {n} writes) / {n}; ratio = ckpt MB/s / torch.save MB/s.
  Neither side fsyncs: page-cache effects are included for both alike (os.sync() runs between runs, untimed).
  ckpt's first write creates the {len(fp32[0])} arrays (schema); create()/close() are one-time costs, not in s/ckpt.
read_tensor: bytes for all {n} steps of one tensor. "zarr store": what a counting WrapperStore returned
  (zarr's Python pipeline); "/proc rchar": what the process read() during the call (the zarrs pipeline, the default).
  The overhead is the 4-byte crc32c of each chunk; metadata comes from the consolidated root, read at open.
read every step: ratio = ckpt throughput / torch.load throughput; ckpt's time includes one ckptstore.open()
  and the integrity checks (crc32c of every chunk, digest of every tensor against the commit record).
read one step: median over every step of ckptstore.open() + Store.tensors(step) vs torch.load of that step's file.
result: ratio = plain xarray seconds / ckpt seconds (commit, crc32c and chunk digests included on ckpt's side).
duplicates: ckptstore.open + duplicate_steps of {d["checkpoints"]} checkpoints x {d["tensors"]} tensors \
({d["parameters"] / 1e6:.1f}M parameters, fp32), median of {args.repeat};
  the record (zarr.json) is {d["record_bytes"] / 1e6:.2f} MB; the store {d["disk_bytes"] / 1e6:.1f} MB on disk \
(zstd; written in {d["write_s"]:.0f} s).
  baseline: reading and hashing every tensor of a checkpoint (3 measured) x {d["checkpoints"]}.
  found: {d["found"].message("the store")}""")


if __name__ == "__main__":
    main()

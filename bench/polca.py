"""Benchmark of POLCA and the Hessian basis on the ``addition`` default model.

Run from the repository root: ``python bench/polca.py`` (``--quick`` for a smoke
run; ``--device cuda`` on a GPU machine). Every measurement runs in a fresh
subprocess, which reports its time and its peak resident memory (CPU) or peak
allocated CUDA memory; all ratios are against baselines measured in the same run.

1. POLCA for one checkpoint pair, K=8 basis vectors, first + second order
   (the paper's and the exact second order cost the same: both come from one
   nested JVP per checkpoint), on the ``eval`` split (1,250 problems = 5,000
   answer-token datapoints):
   - ``polca pair``: what ``polca`` computes for one pair: the first
     checkpoint's first- and second-order terms, the second checkpoint's
     first-order terms (no term uses its curvature) and the step projections;
   - ``polca steady``: one checkpoint's terms, what each further pair costs
     (every checkpoint's terms serve the two pairs that contain it);
   - ``naive``: per-datapoint backward passes at both checkpoints (one
     ``torch.autograd.grad`` per answer token, graph kept per example), then
     projection, plus bᵀH(X)b from K Hessian-vector products for the
     paper's second order. Target: POLCA >= 10x faster;
   - ``floor``: K forward passes over the same datapoints. Target: <= 2.5x.
2. Hessian basis: the top 4 eigenpairs (deflated one by one, as Algorithm 1
   grows the basis) at the second checkpoint over 256 problems, by Lanczos
   (scipy ``eigsh``) and by power iteration with deflation (PyHessian's
   method) run until its eigenvalues are as accurate as Lanczos's (relative
   error against a tight-tolerance reference).
3. Scaling of one checkpoint's POLCA terms in K, datapoints and parameters
   (three points each).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ckpt.store as ckptstore  # noqa: E402
from ckpt.sandboxes.addition import EVAL_PROBLEMS, build_model, split_arrays  # noqa: E402

DEFAULT = {"layers": 2, "d_model": 64, "heads": 4, "d_mlp": 256}


def make_store(path: Path, model_config: dict, problems: int) -> None:
    """Two checkpoints of the addition model 10 AdamW steps apart, and an eval split."""
    torch.manual_seed(0)
    model = build_model(**model_config)
    rng = np.random.default_rng(0)
    split = split_arrays(rng.integers(0, 1000, problems), rng.integers(0, 1000, problems))
    inputs, targets = torch.from_numpy(split["inputs"]), torch.from_numpy(split["targets"])
    mask = torch.from_numpy(split["mask"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ckptstore.create(
        path, model="ckpt.sandboxes.addition:build_model", config=model_config, objective="token-cross-entropy"
    ) as writer:
        writer.add_data("eval", **split)
        writer.write(0, model)
        for _ in range(10):
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        writer.write(1, model)


def random_basis(space, k: int, device: str) -> dict:
    generator = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(space.size, k, generator=generator, dtype=torch.float64))
    return {n: t.float().to(device) for n, t in space.unflatten(q.T.contiguous()).items()}


class Setup:
    """The worker-side objects of one store (what an analysis task has)."""

    def __init__(self, path: Path, device: str) -> None:
        from ckpt.plugins import TaskSpec, parameter_space
        from ckpt.plugins._runtime import worker_for

        self.worker = worker_for(TaskSpec(str(path), device))
        self.space = parameter_space(self.worker.store, self.worker.model)
        self.device = device

    def f(self, step: int, rows: slice):
        from ckpt.plugins import loss_function

        params = self.worker.params(step)
        return loss_function(self.worker, params, self.space, split="eval", examples=rows), params

    def primal(self, step: int) -> dict:
        from ckpt.plugins import trainable

        return trainable(self.worker.params(step), self.space)


def terms(setup: Setup, step: int, basis: dict, batch: int, order: int = 2) -> None:
    from ckpt.plugins import chunks, directional_derivatives

    examples = len(setup.worker.data("eval")["inputs"])
    for rows in chunks(examples, batch):
        f, _ = setup.f(step, rows)
        directional_derivatives(f, setup.primal(step), basis, order=order)


def measure(name: str, args: argparse.Namespace) -> dict:
    """One measurement (in this fresh process): seconds and what it computed."""
    torch.set_num_threads(args.threads)
    config = {**DEFAULT, **json.loads(args.config)}
    path = Path(args.store)
    setup = Setup(path, args.device)
    k = args.k
    basis = random_basis(setup.space, k, args.device)
    out: dict = {"parameters": setup.space.size}

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    setup.worker.params(0), setup.worker.params(1), setup.worker.data("eval")  # loading is not measured
    terms(setup, 0, {n: t[:1] for n, t in basis.items()}, args.batch, order=1)  # warm-up
    began = time.perf_counter()
    if name == "polca-pair":
        terms(setup, 0, basis, args.batch)
        terms(setup, 1, basis, args.batch, order=1)
        delta = setup.space.flatten(
            {n: setup.worker.params(1)[n].double() - setup.worker.params(0)[n].double() for n in setup.space.names}
        )
        setup.space.flatten(basis, batch_dims=1).double() @ delta
    elif name == "polca-steady":
        terms(setup, 0, basis, args.batch)
    elif name == "polca-first":
        terms(setup, 0, basis, args.batch, order=1)
    elif name == "floor":
        with torch.no_grad():
            for _ in range(k):
                for rows in _chunks(setup, args.batch):
                    f, _ = setup.f(0, rows)
                    f(setup.primal(0))
    elif name == "naive":
        out.update(naive(setup, basis, config, args))
    elif name.startswith("eigen-"):
        out.update(eigen(setup, name.removeprefix("eigen-"), args))
    sync()
    out["seconds"] = time.perf_counter() - began
    if args.device.startswith("cuda"):
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
    else:
        out["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def _chunks(setup: Setup, batch: int):
    from ckpt.plugins import chunks

    return chunks(len(setup.worker.data("eval")["inputs"]), batch)


def naive(setup: Setup, basis: dict, config: dict, args: argparse.Namespace) -> dict:
    """Per-datapoint backward passes at both checkpoints, projection, and K HVPs for λ."""
    from ckpt.plugins import hessian_vector_product

    flat_basis = setup.space.flatten(basis, batch_dims=1)
    data = setup.worker.data("eval")
    model = setup.worker.model
    limit = args.naive_examples or len(data["inputs"])
    for step in (0, 1):
        params = {n: p.clone().requires_grad_(n in setup.space.names) for n, p in setup.worker.params(step).items()}
        trainable = [params[n] for n in setup.space.names]
        projections = []
        for i in range(limit):
            logits = torch.func.functional_call(model, params, (data["inputs"][i : i + 1],))[0]
            losses = torch.nn.functional.cross_entropy(logits, data["targets"][i], reduction="none")[data["mask"][i]]
            for j in range(len(losses)):
                grads = torch.autograd.grad(losses[j], trainable, retain_graph=j + 1 < len(losses))
                projections.append(flat_basis @ torch.cat([g.reshape(-1) for g in grads]))
    f, _ = setup.f(0, slice(0, len(data["inputs"])))
    primal = setup.primal(0)
    datapoints = int(data["mask"].sum())
    for b in range(flat_basis.shape[0]):
        hessian_vector_product([(f, 1.0 / datapoints)], primal, setup.space.unflatten(flat_basis[b]))
    return {"naive_examples": limit, "examples": len(data["inputs"])}


def eigen(setup: Setup, method: str, args: argparse.Namespace) -> dict:
    """Top 4 deflated eigenpairs by Lanczos or by power iteration, over the first 256 problems."""
    from ckpt.plugins import hessian_vector_product, top_eigenpairs

    f, _ = setup.f(1, slice(0, 256))
    primal = setup.primal(1)
    datapoints = len(f(primal))
    matvecs = 0

    def hvp(v: torch.Tensor) -> torch.Tensor:
        nonlocal matvecs
        matvecs += 1
        return setup.space.flatten(hessian_vector_product([(f, 1.0 / datapoints)], primal, setup.space.unflatten(v)))

    found = torch.zeros(0, setup.space.size, device=args.device)
    values = []
    reference = json.loads(args.reference) if args.reference else None
    for index in range(4):
        if method in ("lanczos", "reference"):
            tol = 1e-8 if method == "reference" else args.tol
            pairs = top_eigenpairs(hvp, setup.space.size, 1, basis=found, tol=tol, seed=index, device=args.device)
            vector, value = torch.as_tensor(pairs.vectors[0], device=args.device), float(pairs.values[0])
        else:  # power iteration with deflation until as accurate as Lanczos was
            target = reference[index] if reference else None
            generator = torch.Generator().manual_seed(index)
            vector = torch.randn(setup.space.size, generator=generator).to(args.device)
            value = 0.0
            for _ in range(args.max_power):
                vector -= found.T @ (found @ vector)
                vector /= vector.norm()
                product = hvp(vector)
                product -= found.T @ (found @ product)
                value = float(vector @ product)
                vector = product
                if target is not None and abs(value - target) <= args.accuracy[index] * abs(target):
                    break
            vector = vector / vector.norm()
        values.append(value)
        found = torch.cat([found, vector[None]])
    return {"eigenvalues": values, "matvecs": matvecs}


def child(name: str, args: argparse.Namespace, **extra: str) -> dict:
    command = [sys.executable, __file__, "--measure", name, "--store", extra.pop("store", args.store)]
    for key in ("device", "k", "batch", "threads", "naive_examples", "tol", "max_power"):
        command += [f"--{key.replace('_', '-')}", str(extra.pop(key, getattr(args, key)))]
    for key, value in extra.items():
        command += [f"--{key.replace('_', '-')}", value]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--naive-examples", type=int, default=0, help="examples of the naive loop (0: all)")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-power", type=int, default=1000)
    parser.add_argument("--only", choices=["all", "polca", "eigen", "scaling"], default="all")
    parser.add_argument("--measure")
    parser.add_argument("--store")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--reference", default="")
    parser.add_argument("--accuracy", default="")
    args = parser.parse_args()
    if args.measure:
        args.accuracy = json.loads(args.accuracy) if args.accuracy else None
        print(json.dumps(measure(args.measure, args)))
        return
    problems = 256 if args.quick else EVAL_PROBLEMS
    with tempfile.TemporaryDirectory() as tmp:
        args.store = str(Path(tmp) / "addition.zarr")
        make_store(Path(args.store), DEFAULT, problems)
        print(
            f"addition default model, {problems} problems ({4 * problems} datapoints), K={args.k}, {args.device}, "
            f"{args.threads} torch threads"
        )
        if args.only in ("all", "polca"):
            polca_section(args)
        if args.only in ("all", "eigen"):
            eigen_section(args)
        if args.only in ("all", "scaling"):
            scaling_section(args, tmp, problems)


def polca_section(args: argparse.Namespace) -> None:
    """POLCA against the naive computation and against the floor."""
    results = {name: child(name, args) for name in ("floor", "polca-first", "polca-steady", "polca-pair", "naive")}
    print(f"parameters: {results['floor']['parameters']:,}")
    for name, r in results.items():
        print(f"  {name:<14} {r['seconds']:8.2f} s   peak {r['peak_bytes'] / 2**20:8.0f} MiB")
    floor, pair, steady, slow = (results[n]["seconds"] for n in ("floor", "polca-pair", "polca-steady", "naive"))
    print(f"  naive / polca pair:        {slow / pair:6.2f}x  (target >= 10x)")
    print(f"  polca steady / floor:      {steady / floor:6.2f}x  (target <= 2.5x)")
    print(f"  first order only / floor:  {results['polca-first']['seconds'] / floor:6.2f}x")
    print(f"  polca pair / (2 x floor):  {pair / (2 * floor):6.2f}x  (both checkpoints' forward passes)")
    print(f"  naive / (2 x polca steady): {slow / (2 * steady):5.2f}x  (a pair whose both checkpoints start pairs)")


def eigen_section(args: argparse.Namespace) -> None:
    """Lanczos against power iteration with deflation, at a loose and at Lanczos's own accuracy."""
    reference = child("eigen-reference", args)
    lanczos = child("eigen-lanczos", args)
    lanczos_error = [abs(a - b) / abs(b) for a, b in zip(lanczos["eigenvalues"], reference["eigenvalues"], strict=True)]
    print("Hessian basis, top 4 deflated eigenpairs over 256 problems:")
    print(f"  reference eigenvalues  {', '.join(f'{v:.6g}' for v in reference['eigenvalues'])}")
    rows = [("lanczos", lanczos, lanczos_error)]
    # power iteration stopped at 1e-4 relative (looser than Lanczos), then at Lanczos's own accuracy
    for label, floor in (("power 1e-4", 1e-4), ("power =", 1e-13)):
        accuracy = [max(error, floor) for error in lanczos_error]
        power = child(
            "eigen-power", args, reference=json.dumps(reference["eigenvalues"]), accuracy=json.dumps(accuracy)
        )
        error = [abs(a - b) / abs(b) for a, b in zip(power["eigenvalues"], reference["eigenvalues"], strict=True)]
        rows.append((label, power, error))
    for label, r, err in rows:
        print(
            f"  {label:<10} {r['seconds']:7.2f} s  {r['matvecs']:5d} HVPs  peak {r['peak_bytes'] / 2**20:6.0f} MiB  "
            f"max rel. error {max(err):.2e}  ({r['seconds'] / lanczos['seconds']:.2f}x Lanczos's time)"
        )


def scaling_section(args: argparse.Namespace, tmp: str, problems: int) -> None:
    """Time and peak memory of one checkpoint's terms against K, datapoints and parameters."""
    print("Scaling of one checkpoint's POLCA terms (first + second order):")
    for k in (4, 8, 16):
        r = child("polca-steady", args, k=k)
        print(f"  K={k:<3}             {r['seconds']:7.2f} s  peak {r['peak_bytes'] / 2**20:6.0f} MiB")
    for count in (problems // 4, problems // 2, problems):
        path = str(Path(tmp) / f"n{count}.zarr")
        make_store(Path(path), DEFAULT, count)
        r = child("polca-steady", args, store=path)
        print(f"  {4 * count:>5} datapoints  {r['seconds']:7.2f} s  peak {r['peak_bytes'] / 2**20:6.0f} MiB")
    for width in (32, 64, 128):
        config = {**DEFAULT, "d_model": width, "d_mlp": 4 * width}
        path = str(Path(tmp) / f"d{width}.zarr")
        make_store(Path(path), config, problems)
        r = child("polca-steady", args, store=path, config=json.dumps(config))
        print(f"  {r['parameters']:>9,} params  {r['seconds']:7.2f} s  peak {r['peak_bytes'] / 2**20:6.0f} MiB")


if __name__ == "__main__":
    main()

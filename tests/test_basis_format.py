"""The basis format has one home, ckpt.numerics.basis_format: one writer, one validator, the readers.

A round trip through a real zarr store (the writer's dataset, written and opened again,
passes the validator and reads back the same vectors), hostile bases each rejected by the
validator with what is wrong named, and a scan of the library for a second place that
spells the layout's coordinate.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt.errors import AnalysisError
from ckpt.numerics.basis_format import (
    BASIS_DIM,
    FOUND_AT,
    basis_dataset,
    basis_dims,
    basis_problem,
    basis_rows,
    check_basis,
)
from ckpt.numerics.params import ParamSpace
from ckpt.plugins import PER_RUN, AnalysisContext, Analyzer, hookimpl, load_registry, parameter_space

ROOT = Path(__file__).resolve().parents[1]
SPACE = ParamSpace(("0.weight", "0.bias"), ((3, 2), (3,)))


def vectors(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    flat = np.linalg.qr(np.random.default_rng(seed).standard_normal((SPACE.size, count)))[0].T.astype(np.float32)
    return SPACE.unflatten(flat)


def test_a_basis_round_trips_through_a_zarr_store(tmp_path: Path) -> None:
    import xarray as xr

    tensors = vectors(4)
    written = basis_dataset(SPACE, tensors, [0, 0, 5, 5], columns={"eigenvalue": np.arange(4.0)})
    assert written["0.weight"].dims == basis_dims("0.weight", 2) == (BASIS_DIM, "0.weight.0", "0.weight.1")
    written.to_zarr(tmp_path / "basis.zarr", zarr_format=3, consolidated=False)
    read = xr.open_zarr(tmp_path / "basis.zarr", consolidated=False)

    assert check_basis(read, SPACE, "mine") == 4
    assert basis_problem(read, SPACE, count=4, found_at=[0, 0, 5, 5]) is None
    for name in SPACE.names:
        np.testing.assert_array_equal(read[name].values, tensors[name])
    np.testing.assert_array_equal(basis_rows(read["0.bias"], slice(1, 3)).values, tensors["0.bias"][1:3])
    assert read[FOUND_AT].values.tolist() == [0, 0, 5, 5]


def test_a_piece_of_a_basis_keeps_its_index() -> None:
    piece = basis_dataset(SPACE, vectors(2), [7, 7], first=4)
    assert piece[BASIS_DIM].values.tolist() == [4, 5]


def hostile(kind: str):
    import xarray as xr

    good = basis_dataset(SPACE, vectors(2), [0, 5])
    if kind == "no basis dim":
        return good.rename({BASIS_DIM: "direction"})
    if kind == "a tensor missing":
        return good.drop_vars("0.bias")
    if kind == "misshapen":
        return good.assign({"0.bias": ((BASIS_DIM, "x"), np.zeros((2, 4), np.float32))})
    if kind == "transposed":
        return good.assign({"0.bias": (("0.bias.0", BASIS_DIM), np.zeros((3, 2), np.float32))})
    if kind == "integer vectors":
        return good.assign({"0.bias": (basis_dims("0.bias", 1), np.zeros((2, 3), np.int64))})
    if kind == "no found_at":
        return good.drop_vars(FOUND_AT)
    if kind == "found_at not steps":
        return good.assign_coords({FOUND_AT: (BASIS_DIM, [0.5, 1.5])})
    if kind == "empty":
        return good.isel({BASIS_DIM: slice(0, 0)})
    assert kind == "plain", kind
    return xr.Dataset({"loss": (("step",), np.zeros(3))})


HOSTILE = {
    "no basis dim": "no 'basis' dim",
    "a tensor missing": r"missing \['0.bias'\]",
    "misshapen": "0.bias has dims",
    "transposed": r"0.bias has dims \('0.bias.0', 'basis'\)",
    "integer vectors": "0.bias holds int64",
    "no found_at": "no 'found_at_step' coordinate",
    "found_at not steps": "must be integer steps",
    "empty": "holds no vector",
    "plain": "no 'basis' dim",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_the_validator_names_what_a_hostile_basis_gets_wrong(kind: str) -> None:
    with pytest.raises(AnalysisError, match=r"^analysis 'evil' is not a basis of this store's parameters: .*"):
        check_basis(hostile(kind), SPACE, "evil")
    assert basis_problem(hostile(kind), SPACE) is not None
    with pytest.raises(AnalysisError, match=HOSTILE[kind]):
        check_basis(hostile(kind), SPACE, "evil")


def test_the_validator_checks_the_count_and_steps_it_is_told() -> None:
    good = basis_dataset(SPACE, vectors(2), [0, 5])
    assert basis_problem(good, SPACE, count=3) == "it holds 2 vectors where 3 were expected"
    assert "other steps" in str(basis_problem(good, SPACE, found_at=[0, 6]))


def test_the_writer_refuses_what_the_validator_would() -> None:
    tensors = vectors(2)
    with pytest.raises(AnalysisError, match=r"missing \['0.bias'\]"):
        basis_dataset(SPACE, {"0.weight": tensors["0.weight"]}, [0, 5])
    with pytest.raises(AnalysisError, match="2 vectors in every array"):
        basis_dataset(SPACE, tensors, [0, 5], columns={"eigenvalue": np.zeros(3)})
    with pytest.raises(AnalysisError, match="the parameter has"):
        basis_dataset(SPACE, {**tensors, "0.bias": np.zeros((2, 4), np.float32)}, [0, 5])


def _constants(path: Path) -> set[str]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_no_library_module_but_the_format_spells_the_basis_layout() -> None:
    """A second writer or reader of the layout would have to name its coordinate or build its dims."""
    spelled = []
    for folder in ("numerics", "analyzers", "engine", "plugins", "cli", "ckptstore", "ckpt", "sandboxes"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "numerics" / "basis_format.py":
                continue
            constants = _constants(path)
            if FOUND_AT in constants or any(c.startswith("found_at") for c in constants):
                spelled.append(str(path.relative_to(ROOT)))
    assert spelled == [], f"modules spelling the basis layout outside ckpt.numerics.basis_format: {spelled}"


def test_the_old_homes_hand_out_the_same_functions() -> None:
    import ckpt.numerics.basis_format as home
    import ckpt.numerics.derivatives as derivatives

    for name in ("basis_dims", "check_basis", "held_basis", "load_basis", "load_basis_rows", "stored_basis"):
        assert getattr(derivatives, name) is getattr(home, name)


class SteplessBasis(Analyzer):
    """A hostile plugin basis: the right vectors but no ``found_at_step`` (polca failed on it with a KeyError)."""

    name = "stepless-basis"
    per = PER_RUN

    def compute(self, ctx: AnalysisContext) -> Any:
        import dask.array as da
        import xarray as xr

        space = parameter_space(ctx.store)
        rows = space.unflatten(np.eye(1, space.size, dtype=np.float32))
        dims = {name: basis_dims(name, len(shape)) for name, shape in zip(space.names, space.shapes, strict=True)}
        return xr.Dataset({name: (dims[name], da.from_array(rows[name])) for name in space.names})


@hookimpl
def ckpt_register_analyzers(register: Callable[[type], None]) -> None:
    """Register the hostile basis."""
    register(SteplessBasis)


def test_polca_over_a_hostile_plugin_basis_is_one_named_error(tmp_path: Path) -> None:
    import torch

    import ckpt
    import ckpt.store as ckptstore
    from tests.models import mlp

    path = tmp_path / "run.zarr"
    with ckptstore.create(path, model="tests.models:mlp", config={}, objective="cross-entropy") as writer:
        torch.manual_seed(0)
        writer.add_data("eval", inputs=torch.randn(8, 3), targets=torch.randint(0, 4, (8,)))
        for step in (0, 1):
            writer.write(step, mlp())
    registry = load_registry(extra=[__import__(__name__, fromlist=["SteplessBasis"])])
    with pytest.raises(AnalysisError, match=r"'stepless-basis' is not a basis .*no 'found_at_step' coordinate"):
        ckpt.analyze("polca", path, basis="stepless-basis", registry=registry)
    assert "polca" not in ckptstore.open(path).analyses

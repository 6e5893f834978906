"""A killed lca run resumes: only the pairs it had not committed are computed (issue 29, Real models).

lca is one per-run result, written when the run ends; each checkpoint pair's allocation is
also committed to ``analyses/lca.partial`` as soon as it is computed, keyed by the pair's
steps, both checkpoints' digests and the selected parameters, and a rerun of the same
request takes those pairs instead of computing them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers import lca
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run
from tests import resume

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

STEPS = 30
PAIRS = list(range(STEPS - 1))
OPTIONS = {"dtype": "float64", "parameters": 8}
CLI_OPTIONS = ("--dtype", "float64", "--parameters", "8")
JOURNAL = "lca.partial"


def killed_mid_run(path: Path) -> list[int]:
    """Steps of the pieces a ``ckpt analyze lca`` killed mid-run committed."""
    return resume.killed_mid_run(path, "lca", CLI_OPTIONS, len(PAIRS))


def last_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of the store's last checkpoint."""
    store = ckptstore.open(path)
    return store.tensors(int(store.steps[-1]), list(store.tensor_names))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_example_run(tmp_path / "run.zarr", steps=STEPS, examples=200)


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """First steps of the pairs whose allocation is computed in this process (sync scheduler)."""
    pairs: list[int] = []
    allocate = lca.allocate

    def counting(worker: Any, step: int, next_step: int, **options: Any) -> dict[str, np.ndarray]:
        pairs.append(step)
        return allocate(worker, step, next_step, **options)

    monkeypatch.setattr(lca, "allocate", counting)
    return pairs


def test_a_killed_run_computes_only_the_missing_pairs(store: Path, computed: list[int]) -> None:
    saved = killed_mid_run(store)
    resumed = run("lca", store, scheduler="sync", **OPTIONS)
    assert resumed.resumed == sorted(saved), "every committed pair is taken"
    assert sorted(computed) == [s for s in PAIRS if s not in saved], "and none of them computed again"
    assert JOURNAL not in ckptstore.open(store).analyses, "the journal goes once the whole result is committed"
    got = resumed.dataset.load()
    fresh = run("lca", store, scheduler="sync", force=True, **OPTIONS).dataset.load()
    assert got["step"].values.tolist() == PAIRS
    for name in fresh.variables:  # the same computation: the same numbers, to the bit
        np.testing.assert_array_equal(got[name].values, fresh[name].values, err_msg=name)


def test_the_cli_says_what_it_resumed(store: Path) -> None:
    resume.assert_cli_reports_resumed(store, "lca", CLI_OPTIONS, killed_mid_run(store))


def test_pairs_of_other_options_are_never_taken(store: Path, computed: list[int]) -> None:
    killed_mid_run(store)
    other = run("lca", store, scheduler="sync", **{**OPTIONS, "parameters": 9})
    assert other.resumed == [], "another --parameters is another request"
    assert sorted(computed) == PAIRS
    assert JOURNAL not in ckptstore.open(store).analyses


def test_an_added_checkpoint_that_changes_the_selection_recomputes_every_pair(store: Path, computed: list[int]) -> None:
    killed_mid_run(store)
    last = last_weights(store)
    eighth = np.sort(np.concatenate([np.abs(v).ravel() for v in last.values()]))[-OPTIONS["parameters"]]
    with ckptstore.open(store, mode="a") as writer:  # the selected (largest) weights zeroed: others are selected
        writer.write(STEPS, {name: np.where(np.abs(v) >= eighth, 0, v) for name, v in last.items()})
    result = run("lca", store, scheduler="sync", **OPTIONS)
    assert result.resumed == []
    assert sorted(computed) == [*PAIRS, STEPS - 1], "every pair, the new one included"
    assert JOURNAL not in ckptstore.open(store).analyses


def test_an_added_checkpoint_that_keeps_the_selection_keeps_the_pairs(store: Path, computed: list[int]) -> None:
    saved = killed_mid_run(store)
    with ckptstore.open(store, mode="a") as writer:  # the same weights again: the same parameters are the largest
        writer.write(STEPS, last_weights(store))
    result = run("lca", store, scheduler="sync", **OPTIONS)
    assert result.resumed == sorted(saved), "a pair's allocation does not depend on later checkpoints"
    assert sorted(computed) == [s for s in [*PAIRS, STEPS - 1] if s not in saved]

"""A killed hessian-basis resumes at the next basis checkpoint (issue: Real models, item 2).

The basis is one per-run result, written when the run ends; each basis checkpoint's vectors
are also committed to ``analyses/hessian-basis.partial`` as they are found, and a rerun of the
same request takes them instead of computing them again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.engine.pipeline import run
from ckpt.plugins.testing import write_example_run
from tests import resume
from tests.helpers import invoke_ckpt

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

STEPS = 12  # 12 basis checkpoints: a kill after 3 lands mid-run (a search takes ~1 s); each is a full search
OPTIONS = ("--every", "1", "-k", "1", "--dtype", "float64", "--tol", "1e-10")
JOURNAL = "hessian-basis.partial"


def killed_mid_run(path: Path) -> list[int]:
    """Steps of the pieces a ``ckpt analyze hessian-basis`` killed mid-run committed."""
    return resume.killed_mid_run(path, "hessian-basis", OPTIONS, STEPS)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_example_run(tmp_path / "run.zarr", steps=STEPS, examples=200)


def test_a_killed_run_resumes_at_the_next_basis_checkpoint(store: Path) -> None:
    saved = killed_mid_run(store)
    options = {"every": 1, "k": 1, "dtype": "float64", "tol": 1e-10}
    resumed = run("hessian-basis", store, scheduler="sync", **options)
    assert resumed.resumed == saved, "every committed piece is taken, none computed again"
    assert JOURNAL not in ckptstore.open(store).analyses, "the journal goes once the whole basis is committed"
    got = resumed.dataset.load()
    fresh = run("hessian-basis", store, scheduler="sync", force=True, **options).dataset.load()
    assert got["found_at_step"].values.tolist() == list(range(STEPS))
    for name in fresh.data_vars:  # the same computation: the same numbers, to the bit
        np.testing.assert_array_equal(got[name].values, fresh[name].values, err_msg=name)


def test_the_cli_says_what_it_resumed(store: Path) -> None:
    resume.assert_cli_reports_resumed(store, "hessian-basis", OPTIONS, killed_mid_run(store))


def test_pieces_of_another_request_are_never_taken(store: Path) -> None:
    saved = killed_mid_run(store)
    other = run("hessian-basis", store, scheduler="sync", every=1, k=1, dtype="float64", tol=1e-10, seed=1)
    assert other.resumed == [], "another seed is another request"
    assert JOURNAL not in ckptstore.open(store).analyses
    assert saved


def test_new_data_or_force_compute_everything_again(store: Path) -> None:
    killed_mid_run(store)
    eval_split = ckptstore.open(store).data("eval")
    with ckptstore.open(store, mode="a") as writer:  # the Hessian's split replaced (its rows reversed)
        targets = eval_split["targets"].values[::-1].copy()
        writer.add_data("eval", inputs=eval_split["inputs"].values[::-1].copy(), targets=targets, overwrite=True)
    assert run("hessian-basis", store, scheduler="sync", every=1, k=1, dtype="float64", tol=1e-10).resumed == []
    assert invoke_ckpt("rm", str(store), "hessian-basis").returncode == 0
    killed_mid_run(store)
    forced = run("hessian-basis", store, scheduler="sync", force=True, every=1, k=1, dtype="float64", tol=1e-10)
    assert forced.resumed == []
    assert JOURNAL not in ckptstore.open(store).analyses


def test_the_basis_read_back_from_the_journal_is_the_basis_held_in_memory(store: Path) -> None:
    """With a journal the later searches and the result read the earlier vectors from it, not from memory.

    A name with no room for ``.partial`` (255 characters at most) has no journal: its pieces stay in
    memory, as every run's did before. Both ways give the same numbers, to the bit.
    """
    from ckpt.store.format import PARTIAL_SUFFIX, check_name

    options = {"every": 3, "k": 2, "dtype": "float64", "tol": 1e-10}
    long_name = "b" * 250
    assert check_name(long_name, "analysis") is None and check_name(long_name + PARTIAL_SUFFIX, "analysis")
    journaled = run("hessian-basis", store, scheduler="threads", **options).dataset.load()
    held = run("hessian-basis", store, scheduler="threads", save_as=long_name, **options).dataset.load()
    assert journaled.sizes["basis"] == 2 * len(range(0, STEPS, 3)) and journaled["residual"].max() < 1e-6
    for name in journaled.data_vars:
        np.testing.assert_array_equal(journaled[name].values, held[name].values, err_msg=name)
    # the vectors found later are orthogonal to those found before (read back from the journal)
    flat = np.concatenate(
        [
            journaled[n].values.reshape(journaled.sizes["basis"], -1)
            for n in journaled.data_vars
            if n not in ("eigenvalue", "residual", "matvecs")
        ],
        axis=1,
    )
    np.testing.assert_allclose(flat @ flat.T, np.eye(len(flat)), atol=1e-8)

"""``repro/curriculum.py`` (Clustering Head §4.2): the switch p=2 -> p=3 is ``--init-from``'s, and the report holds.

Real training throughout: a few epochs of the paper preset, a few seconds.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.sandboxes.base import train
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

REPRO = Path(__file__).resolve().parents[1] / "repro"


@pytest.fixture
def curriculum(monkeypatch: pytest.MonkeyPatch) -> object:
    """The script as a module (it imports its sibling ``vectorized`` as the repro scripts do)."""
    monkeypatch.syspath_prepend(str(REPRO))
    return importlib.import_module("curriculum")


def test_switch_is_init_from_bit_for_bit(curriculum: object, tmp_path: Path) -> None:
    """The vectorised child of a p=2 parent has the weights ``train(--p 3, init_from=parent)`` starts from."""
    task = SparseModularAddition()
    seed = 3
    parent_store = train(task, tmp_path / "p2.zarr", preset="paper", steps=5, every=5, seed=seed, p=2)
    child_store = train(
        task, tmp_path / "p3.zarr", preset="paper", steps=1, every=1, seed=seed, p=3, init_from=tmp_path / "p2.zarr"
    )
    parent_weights = parent_store.tensors(5, framework="torch")
    expected = child_store.tensors(0, framework="torch")

    from vectorized import stack_seeds

    child = stack_seeds(task, curriculum.paper_config(task, 3), [seed])
    parent = SimpleNamespace(params={name: value[None] for name, value in parent_weights.items()})
    assert curriculum.grow_into(task, parent, child) == ["embed.weight"]
    assert set(child.params) == set(expected)
    for name, value in child.params.items():
        assert torch.equal(value[0], expected[name]), name
    # the old rows are the parent's, the new row (x = 2) is the fresh p=3 initialisation, not the parent's
    assert torch.equal(child.params["embed.weight"][0, :2], parent_weights["embed.weight"])
    assert child.params["embed.weight"].shape == (1, 3, 2)
    assert ckptstore.open(tmp_path / "p3.zarr").parent is not None


def test_quick_run_reports(curriculum: object, tmp_path: Path) -> None:
    """``--quick`` with 3 seeds, 2 epochs: tables, JSON and PNG with consistent figures."""
    figures = curriculum.main(["--quick", "--seeds", "3", "--epochs", "2", "--out", str(tmp_path)])
    stored = json.loads((tmp_path / "curriculum.json").read_text())
    assert (tmp_path / "curriculum.png").stat().st_size > 10_000
    assert stored["seeds"] == [0, 1, 2] and stored["epochs"] == 2
    assert stored["switch_check"] == {"old_rows_equal_parent": True}
    assert stored["protocol"]["grown"] == ["embed.weight"]
    assert set(stored["arms"]) == set(stored["accuracy"]) and len(stored["arms"]) == 3
    for label, summary in stored["arms"].items():
        values = stored["accuracy"][label]
        assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)
        low, high = summary["mean_ci95"]
        assert low <= summary["mean"] <= high and summary["max"] == max(values)
        assert summary["perfect"] == sum(v == 1.0 for v in values)
    clusters = stored["clusters"]
    assert sum(map(sum, clusters["table"])) == 3
    assert 0.0 <= clusters["fisher_p"] <= 1.0 and clusters["ideal"] == 6
    assert sum(clusters["histogram"].values()) == 3 and len(stored["clusters_per_seed"]) == 3
    ideal_rows = sum(clusters["table"][0])
    assert ideal_rows == sum(c == 6 for c in stored["clusters_per_seed"])
    assert json.loads(json.dumps(figures["arms"])) == stored["arms"]


def test_the_compute_matched_scratch_arm_is_one_longer_run(curriculum: object) -> None:
    """--scratch-epochs 4 after 2: the scratch runs' accuracy is that of a 4-epoch scratch run, bit for bit."""
    longer = curriculum.run([0, 1], 2, scratch_epochs=4, log=lambda line: None)
    straight = curriculum.run([0, 1], 4, log=lambda line: None)
    assert longer["accuracy"]["p=3 from scratch, 4 epochs"] == straight["accuracy"]["p=3 from scratch"]
    assert list(longer["arms"]) == [
        "p=2 (phase 1 only)",
        "p=3 from scratch",
        "p=3 from scratch, 4 epochs",
        "p=2->3 curriculum",
    ]
    assert longer["scratch_epochs"] == 4 and "paired_difference_matched" not in straight
    matched = longer["paired_difference_matched"]
    difference = np.array(longer["accuracy"]["p=2->3 curriculum"]) - np.array(straight["accuracy"]["p=3 from scratch"])
    assert matched["mean"] == pytest.approx(difference.mean())


def test_a_sweep_shares_the_parent_and_matches_single_runs(curriculum: object, tmp_path: Path) -> None:
    """--child-p 3 4: each size's accuracies equal its own single run's; per-size and sweep reports are written."""
    sweep = curriculum.main(["--seeds", "2", "--epochs", "2", "--child-p", "3", "4", "--out", str(tmp_path)])
    for child_p in (3, 4):
        alone = curriculum.run([0, 1], 2, child_p, log=lambda line: None)
        stored = json.loads((tmp_path / f"curriculum-p{child_p}.json").read_text())
        assert stored["accuracy"] == alone["accuracy"]
        assert stored["protocol"]["child_p"] == child_p and stored["protocol"]["grown"] == ["embed.weight"]
        assert sweep["sizes"][str(child_p)]["curriculum"] == alone["arms"][f"p=2->{child_p} curriculum"]
        assert sweep["sizes"][str(child_p)]["scratch"] == alone["arms"][f"p={child_p} from scratch"]
    assert json.loads((tmp_path / "curriculum-sweep.json").read_text())["sizes"] == json.loads(
        json.dumps(sweep["sizes"])
    )
    assert (tmp_path / "curriculum-sweep.png").stat().st_size > 10_000
    assert not (tmp_path / "curriculum.json").exists()


def test_a_child_field_not_above_the_parents_is_refused(curriculum: object, tmp_path: Path) -> None:
    """--child-p 2 (the parent's own p) is a usage error before any training."""
    with pytest.raises(SystemExit) as exit_info:
        curriculum.main(["--seeds", "2", "--epochs", "2", "--child-p", "2", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and not any(tmp_path.iterdir())

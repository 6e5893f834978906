"""``repro/spike_steps.py`` (Clustering Head §4.3 at step resolution) on a tiny real run.

Two seeds of the paper preset for 25 epochs (vectorised, seconds) and a loss-spike
threshold of 0.5, so that the short run has an onset. Checked against independent
computations: the stores ``sparse_dynamics`` writes for the same seeds, ``spike_causes``'
pairs on them, the loss rule step by step, and the measures from the replayed weights.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt.store as ckptstore
from ckpt.analyzers.grad_norms import detect_spikes
from tests.helpers import run_repro

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

REPRO = Path(__file__).resolve().parents[1] / "repro"
ARGS = ["--num-seeds", "2", "--epochs", "25", "--threshold", "0.5", "--radius", "10", "--boundary-examples", "16"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, dict]:
    """The script as a module, its output folder and its results (with the in-memory run)."""
    out = tmp_path_factory.mktemp("spike-steps")
    module, results = run_repro("spike_steps", ARGS, out)
    return module, out, results


def test_the_run_is_sparse_dynamics_and_the_pairs_are_spike_causes(
    tiny: tuple[object, Path, dict], tmp_path: Path
) -> None:
    """The in-memory losses equal the stores sparse_dynamics writes; the pairs are spike_causes' on those stores."""
    _, _, results = tiny
    sys.path.insert(0, str(REPRO))
    try:
        sparse_dynamics = importlib.import_module("sparse_dynamics")
        spike_causes = importlib.import_module("spike_causes")
    finally:
        sys.path.remove(str(REPRO))
    paths = sparse_dynamics.train_runs(str(tmp_path), [0, 1], 25, True, 1)
    run = results["run"]
    pairs = list(
        zip(
            results["pairs"]["seed"],
            results["pairs"]["pre_checkpoint"],
            results["pairs"]["control_checkpoint"],
            strict=True,
        )
    )
    assert pairs, "the tiny run must have an onset to test"
    for i, path in enumerate(paths):
        stored = ckptstore.open(path).metrics["train_loss"].values
        np.testing.assert_array_equal(run.loss[i], stored)
        flags, onsets = spike_causes.loss_onsets(stored, 0.5)
        expected = spike_causes.pair_checkpoints(flags, onsets, np.random.default_rng(1000 + i), 10, 3)
        assert [(pre, control) for s, pre, control in pairs if s == i] == expected


def test_the_onset_step_is_the_first_step_the_rule_flags(tiny: tuple[object, Path, dict]) -> None:
    """t* is flagged against the 20 checkpoints before the onset, no earlier step is; the last step is the onset."""
    _, _, results = tiny
    run, rows = results["run"], results["pairs"]
    for seed, pre, t, losses in zip(
        rows["seed"], rows["pre_checkpoint"], rows["onset_step"], rows["step_losses"], strict=True
    ):
        assert len(losses) == results["steps_per_epoch"] + 1 == 65
        assert losses[0] == run.loss[seed, pre] and losses[-1] == run.loss[seed, pre + 1]
        before = run.loss[seed, max(0, pre + 1 - 20) : pre + 1]
        flagged = [bool(detect_spikes(np.append(before, v), window=20, threshold=0.5)[-1]) for v in losses[1:]]
        assert flagged[-1] and flagged.index(True) + 1 == t


def test_a_replay_that_does_not_end_on_the_kept_state_is_refused(tiny: tuple[object, Path, dict]) -> None:
    """A kept state off by one ulp in one weight: the replay names the tensor instead of measuring another run."""
    module, _, results = tiny
    run = results["run"]
    kept = run.states[6]["params"]["embed.weight"]
    original = kept.clone()
    kept.view(-1)[0] = torch.nextafter(kept.view(-1)[0], torch.tensor(np.inf))
    try:
        with pytest.raises(RuntimeError, match=r"embed\.weight"):
            module.replay(run, 5)
    finally:
        kept.copy_(original)
    replayed = module.replay(run, 5)
    assert replayed.loss.shape == (2, 65) and torch.equal(replayed.params(64)["embed.weight"], original)
    assert torch.equal(replayed.params(0)["embed.weight"], run.states[5]["params"]["embed.weight"])


def test_measures_are_those_of_the_replayed_weights(tiny: tuple[object, Path, dict]) -> None:
    """min ‖x‖/η at ``norm`` by hand from the replayed weights, at both resolutions; statistics of the values."""
    module, out, results = tiny
    run, rows = results["run"], results["pairs"]
    seed, pre, control, t = (rows[k][0] for k in ("seed", "pre_checkpoint", "control_checkpoint", "onset_step"))
    tokens = run.stacked.datas[seed].train_inputs.numpy()
    for resolution, offset in (("step", t - 1), ("epoch", 0)):
        for kind, checkpoint in (("pre", pre), ("control", control)):
            weights = module.replay(run, checkpoint).params(offset)
            w = {k: v[seed].double().numpy() for k, v in weights.items()}
            smallest = np.linalg.norm(w["embed.weight"][tokens] + w["pos.weight"][None], axis=-1).min()
            value = results["values"][resolution]["log10 min|x|/lr (norm)"][kind][0]
            assert value == pytest.approx(np.log10(smallest / 3e-3), rel=1e-5)
    store = ckptstore.open(out / "steps" / f"seed{seed:03d}.zarr")
    assert {pre * 64 + t - 1, control * 64 + t - 1, pre * 64, control * 64} <= {int(s) for s in store.steps}
    for resolution in ("step", "epoch"):
        for name, stat in results["statistics"][resolution].items():
            diffs = np.subtract(
                results["values"][resolution][name]["pre"], results["values"][resolution][name]["control"]
            )
            assert stat["mean_diff"] == pytest.approx(diffs.mean()) and stat["pairs"] == len(diffs)
    assert (out / "spike-steps.png").stat().st_size > 10_000 and (
        out / "spike-steps-onsets.png"
    ).stat().st_size > 10_000


def test_report_only_recomputes_the_statistics_and_the_barely_risen_subset(tiny: tuple[object, Path, dict]) -> None:
    """--report-only gives the run's statistics again; the subset: pairs whose loss at t*-1 is <= 1.1x baseline."""
    module, out, results = tiny
    again = module.main(["--report-only", "--out", str(out)])
    assert again["statistics"]["step"] == json.loads(json.dumps(results["statistics"]["step"]))
    rows = results["pairs"]
    risen = np.array(
        [
            losses[t - 1] / median
            for losses, t, median in zip(rows["step_losses"], rows["onset_step"], rows["window_median"], strict=True)
        ]
    )
    np.testing.assert_allclose(module.barely_risen(results), risen)
    keep = risen <= 1.1
    assert bool(again["statistics"]["step, barely risen"]) == bool(keep.any())
    for name, stat in again["statistics"]["step, barely risen"].items():
        diffs = np.subtract(results["values"]["step"][name]["pre"], results["values"]["step"][name]["control"])[keep]
        assert stat["pairs"] == int(keep.sum()) and stat["mean_diff"] == pytest.approx(diffs.mean())

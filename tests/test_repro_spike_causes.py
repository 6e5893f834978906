"""``repro/spike_causes.py`` (Clustering Head §4.3, Fig. 8) on a tiny real run: every figure is computed.

Two seeds of the paper preset for 25 epochs (vectorised, a few seconds), a loss-spike
threshold of 0.5 so that the short run has an onset; the onsets, pairs, measures and
correlations are recomputed here from the stores, by hand where it is cheap.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ckpt.store as ckptstore
from ckpt.analyzers.grad_norms import detect_spikes
from tests.helpers import run_repro

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

ARGS = ["--num-seeds", "2", "--epochs", "25", "--threshold", "0.5", "--radius", "10"]
ARGS += ["--boundary-examples", "16", "--probes", "16"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, dict]:
    """The script as a module, its output folder and its results."""
    out = tmp_path_factory.mktemp("spike-causes")
    module, results = run_repro("spike_causes", ARGS, out)
    return module, out, results


def test_onsets_and_pairs_follow_the_stored_loss(tiny: tuple[object, Path, dict]) -> None:
    _, out, results = tiny
    causes = results["causes"]
    pairs = list(zip(*(causes["pairs"][k] for k in ("seed", "pre_step", "control_step")), strict=True))
    assert pairs, "the tiny run must have an onset to test"
    for seed in (0, 1):
        store = ckptstore.open(out / f"seed{seed:03d}.zarr")
        steps = store.steps
        flags = detect_spikes(store.metrics["train_loss"].values, window=20, threshold=0.5)
        onsets = flags & ~np.concatenate([[False], flags[:-1]])
        assert causes["onsets"][seed] == int(onsets.sum())
        for s, pre, control in pairs:
            if s != seed:
                continue
            at = {int(v): i for i, v in enumerate(steps)}
            assert onsets[at[pre] + 1] and not flags[at[pre]]  # the checkpoint just before an onset
            assert not flags[max(0, at[control] - 3) : at[control] + 5].any()  # gap 3 around control and successor
            assert abs(at[control] - at[pre]) <= 10


def test_measures_match_the_weights_and_the_analyses(tiny: tuple[object, Path, dict]) -> None:
    _, out, results = tiny
    causes = results["causes"]
    seed, pre = causes["pairs"]["seed"][0], causes["pairs"]["pre_step"][0]
    thin = ckptstore.open(out / "causes" / f"seed{seed:03d}.zarr")
    source = ckptstore.open(out / f"seed{seed:03d}.zarr")
    lr = float(thin.metrics["lr"].sel(step=pre))
    assert lr == float(source.metrics["lr"].sel(step=pre)) == 3e-3  # read from the store, not --lr
    w = {k: np.asarray(v, np.float64) for k, v in source.tensors(pre).items()}
    tokens = source.data("train")["inputs"].values
    smallest = np.linalg.norm(w["embed.weight"][tokens] + w["pos.weight"][None], axis=-1).min()
    value = causes["values"]["log10 min|x|/lr (norm)"]["pre"][0]
    assert value == pytest.approx(np.log10(smallest / lr), rel=1e-5)
    curvature = thin.analysis("curvature")
    eigen = float(curvature["model_eigenvalue"].sel(step=pre))
    assert causes["values"]["log10 lambda_max lr/2"]["pre"][0] == pytest.approx(np.log10(eigen * lr / 2))
    distance = thin.analysis("boundary-distance")["distance"].sel(step=pre).values
    assert distance.size == 16
    q05 = np.quantile(np.where(np.isnan(distance), 10.0, distance), 0.05)
    assert causes["values"]["log10 q05 boundary distance"]["pre"][0] == pytest.approx(np.log10(q05))
    for name, stat in causes["statistics"].items():
        diffs = np.subtract(causes["values"][name]["pre"], causes["values"][name]["control"])
        assert stat["mean_diff"] == pytest.approx(diffs.mean())
        assert stat["ci95"][0] <= stat["mean_diff"] <= stat["ci95"][1]


def test_attention_correlations_are_the_analyzers_and_the_baseline_by_hand(tiny: tuple[object, Path, dict]) -> None:
    module, out, results = tiny
    attention = results["attention_maps"]
    np.testing.assert_allclose(attention["own"], attention["analyzer_start_end_correlation"], rtol=1e-6)
    weights = [ckptstore.open(out / "ends" / f"seed{s:03d}.zarr").analysis("attention")["weights"] for s in (0, 1)]
    start0, end1 = weights[0].isel(step=0).values.ravel(), weights[1].isel(step=-1).values.ravel()
    assert attention["cross"][0] == pytest.approx(np.corrcoef(start0, end1)[0, 1], rel=1e-6)
    probes = [ckptstore.open(out / "ends" / f"seed{s:03d}.zarr").data("probe")["inputs"].values for s in (0, 1)]
    np.testing.assert_array_equal(probes[0], probes[1])  # shared probes: the baseline compares like with like
    diffs, groups = np.arange(1.0, 11.0), np.arange(10) % 3
    assert module.paired_statistics(diffs, groups, +1)["verdict"] == "reproduces"
    assert module.paired_statistics(diffs, groups, -1)["verdict"] == "opposite"
    assert module.paired_statistics(diffs - diffs.mean(), groups, +1)["verdict"] == "not resolved"
    stored = json.loads((out / "spike-causes.json").read_text())
    assert stored["attention"]["own_mean"] == pytest.approx(np.mean(attention["own"]))
    assert (out / "spike-causes.png").stat().st_size > 10_000
    assert (out / "attention-start-end.png").stat().st_size > 10_000

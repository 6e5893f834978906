"""The ``clusters`` analyzer: its pure functions on planted data, and the real engine on real stores.

No mocks: HDBSCAN is the ``hdbscan`` library, stores are written with ``ckpt.create``
and the analyzer runs through ``ckpt.engine.pipeline.run``. The end-to-end store holds a
planted ``analyses/loss`` result (three groups of 200 datapoints whose loss drops
at different steps) with the provenance the engine writes, so the engine reuses it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr
from sklearn.metrics import adjusted_rand_score

import ckpt
import ckpt.store as ckptstore
from ckpt.analyzers import clusters
from ckpt.analyzers import trajectories as tr
from ckpt.analyzers.loss import Loss
from ckpt.engine.pipeline import data_hash, run
from ckpt.engine.worker import clear_cache
from ckpt.plugins import load_registry
from ckpt.plugins.testing import write_example_run
from ckpt.store.results import write_analysis

pytestmark = pytest.mark.slow  # trains sandbox runs and analyzes them

STEPS = np.arange(30) * 10
DROPS = (6, 14, 22)  # checkpoint index of each group's drop
DEPTHS = (3.0, 1.5, 1.5)  # group 0 dominates the mean loss: its breakthrough is the visible one
GROUP = 200


def planted(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``[datapoint, step]`` losses of three shuffled groups, and each datapoint's group."""
    rng = np.random.default_rng(seed)
    rows, groups = [], []
    for g, (drop, depth) in enumerate(zip(DROPS, DEPTHS, strict=True)):
        curve = np.where(np.arange(len(STEPS)) < drop, 0.2 + depth, 0.2)
        rows.append(curve + 0.05 * rng.standard_normal((GROUP, len(STEPS))))
        groups += [g] * GROUP
    order = rng.permutation(3 * GROUP)
    return np.vstack(rows)[order], np.asarray(groups)[order]


@pytest.fixture
def registry() -> Any:
    return load_registry(extra=[clusters])


# --------------------------------------------------------------------------- clustering


def test_cluster_matrix_recovers_planted_groups() -> None:
    rows, groups = planted()
    labels = tr.cluster_matrix(rows, min_cluster_size=150)  # min_samples: 600 / 15 = 40
    assert sorted(np.unique(labels).tolist()) == [0, 1, 2]
    assert adjusted_rand_score(groups, labels) == 1.0
    np.testing.assert_array_equal(tr.cluster_matrix(rows, min_cluster_size=150), labels)  # deterministic


def test_cluster_matrix_edge_cases() -> None:
    assert tr.default_min_samples(600) == 40
    assert tr.default_min_samples(22) == 1  # 1.47 rounds to 1
    assert tr.default_min_samples(23) == 2  # 1.53 rounds to 2
    assert tr.default_min_samples(3) == 1
    rows = np.random.default_rng(0).standard_normal((20, 4))
    np.testing.assert_array_equal(tr.cluster_matrix(rows, min_cluster_size=50), -np.ones(20))
    with pytest.raises(ValueError, match="at least 2"):
        tr.cluster_matrix(rows, min_cluster_size=1)
    rows[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        tr.cluster_matrix(rows, min_cluster_size=5)
    assert tr.max_clusters(600, 150) == 4
    assert tr.max_clusters(50, 150) == 1


def test_relabel_by_size() -> None:
    labels = np.array([3, 3, -1, 0, 0, 0, 7, 7])
    np.testing.assert_array_equal(tr.relabel_by_size(labels), [1, 1, -1, 0, 0, 0, 2, 2])


def test_cluster_statistics_medoid_quartiles_and_padding() -> None:
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((9, 5))
    labels = np.array([0, 1, 0, 0, -1, 1, 0, 1, 1])
    stats = tr.cluster_statistics(rows, labels, slots=3)
    np.testing.assert_array_equal(stats["size"], [4, 4, -1])
    for c in (0, 1):
        members = np.flatnonzero(labels == c)
        totals = [np.linalg.norm(rows[members] - rows[i], axis=1).sum() for i in members]
        assert stats["medoid"][c] == members[int(np.argmin(totals))]
        np.testing.assert_allclose(stats["median"][c], np.median(rows[members], axis=0))
        np.testing.assert_allclose(stats["lower_quartile"][c], np.quantile(rows[members], 0.25, axis=0))
        np.testing.assert_allclose(stats["upper_quartile"][c], np.quantile(rows[members], 0.75, axis=0))
    assert stats["medoid"][2] == -1
    assert np.isnan(stats["median"][2]).all()
    with pytest.raises(ValueError, match="slots"):
        tr.cluster_statistics(rows, labels, slots=1)


# --------------------------------------------------------------------------- breakthroughs


def test_breakthroughs_of_planted_groups_within_one_checkpoint() -> None:
    rows, groups = planted()
    labels = tr.cluster_matrix(rows, min_cluster_size=150)
    stats = tr.cluster_statistics(rows, labels, slots=4)
    for c in range(3):
        group = int(np.bincount(groups[labels == c]).argmax())
        step, score = tr.breakthrough(stats["median"][c], STEPS, delta=10)
        assert abs(step - STEPS[DROPS[group]]) <= 10
        assert score > 1.0


def test_breakthrough_of_a_step_is_the_first_low_checkpoint() -> None:
    curve = np.where(STEPS < 120, 1.0, 0.0)
    assert tr.breakthrough(curve, STEPS, delta=10) == (120.0, 1.0)
    # Δ = 30 steps = 3 checkpoints: a step drop scores 1 at the 3 checkpoints after it; the first wins
    assert tr.breakthrough(curve, STEPS, delta=30) == (120.0, 1.0)
    candidates, _ = tr.breakthrough_scores(curve, STEPS, delta=30)
    np.testing.assert_array_equal(candidates, STEPS[3:-3])


def test_delta_is_a_whole_number_of_checkpoints() -> None:
    steps = np.array([0, 10, 20, 30, 50, 60, 70, 80, 90, 100])  # median spacing 10
    assert tr.delta_checkpoints(steps, 10) == (1, 10.0)
    assert tr.delta_checkpoints(steps, 24) == (2, 20.0)
    assert tr.delta_checkpoints(steps, 25) == (3, 30.0)  # half up
    assert tr.delta_checkpoints(steps, 2) == (1, 10.0)  # at least one checkpoint
    with pytest.raises(ValueError, match="positive"):
        tr.delta_checkpoints(steps, 0)


def test_breakthrough_interpolates_uneven_steps() -> None:
    steps = np.array([0, 10, 20, 30, 50, 60, 70, 80, 90, 100])  # no checkpoint at 40
    curve = np.where(steps < 50, 1.0, 0.0)
    candidates, scores = tr.breakthrough_scores(curve, steps, delta=10)
    np.testing.assert_array_equal(candidates, steps[1:-1])
    # f(40) = 0.5 by interpolation: score(30) = f(40) - 2 f(30) + f(20) = -0.5, score(50) = f(60) - 2 f(50) + f(40)
    np.testing.assert_allclose(scores, [0, 0, -0.5, 0.5, 0, 0, 0, 0])
    assert tr.breakthrough(curve, steps, delta=10) == (50.0, 0.5)


def test_breakthrough_without_candidates_is_nan() -> None:
    assert np.isnan(tr.breakthrough(np.array([1.0, 0.0]), np.array([0, 10]), delta=10)).all()
    assert np.isnan(tr.breakthrough(np.array([1.0, 0.5, 0.0]), np.array([0, 10, 20]), delta=50)).all()
    assert np.isnan(tr.breakthrough(np.array([1.0]), np.array([0]), delta=10)).all()


def test_hidden_flags() -> None:
    found = np.array([100.0, 1500.0, 2200.0, np.nan])
    np.testing.assert_array_equal(tr.hidden_flags(found, 1000.0, tau=1000), [False, False, True, False])
    np.testing.assert_array_equal(tr.hidden_flags(found, np.nan, tau=1000), [True, True, True, False])


# --------------------------------------------------------------------------- filters


def test_polca_filter_drops_exactly_what_the_rules_say() -> None:
    # [step, basis, datapoint] eq. 10 trajectories: L(θ_0) = 0, and only the final value decides
    origin = np.zeros((3, 4))
    middle = np.full_like(origin, 9.0)
    last = np.array(
        [
            [-2.0, -0.5, 1.5, 0.0],  # mean -0.25 < 0: kept; datapoint 2 ends above 0 (dropped), 3 at 0 (kept)
            [-1.0, -1.0, 5.0, 0.0],  # mean 0.75 > 0: dropped entirely
            [1.0, -1.0, 2.0, -2.0],  # mean 0 == 0: not a decrease, dropped
        ]
    )
    basis_kept, kept = tr.polca_filter(np.stack([origin, middle, last]))
    np.testing.assert_array_equal(basis_kept, [True, False, False])
    np.testing.assert_array_equal(kept, [[True, True, False, True], [False] * 4, [False] * 4])
    nan = np.stack([origin, middle, last])
    nan[1, 0, 1] = np.nan  # a non-finite datapoint is dropped, and left out of the mean
    np.testing.assert_array_equal(tr.polca_filter(nan)[1][0], [True, False, False, True])


def test_polca_filter_compares_with_zero_not_with_the_first_transition() -> None:
    """The issue's case: mean L_b = -0.2642 after the first transition, -0.2632 at the end.

    The paper (eq. 10, L_b(x, θ_0) = 0) keeps the vector, since -0.2632 < 0; comparing the
    end with the value after the first transition (-0.2632 > -0.2642) would drop it. Per
    datapoint: one that fell to -0.5 and came back to -0.1 is kept (it ends below 0);
    one that rose to 0.3 and fell back to 0.1 is dropped (it ends above 0).
    """
    allocations = np.array(  # POLCA(x, b; θ_i) of 3 transitions, 4 datapoints, one basis vector
        [
            [-0.5, 0.3, -0.5, -0.3568],
            [0.2, -0.1, -0.1, 0.0],
            [0.2, -0.1, -0.0964, 0.0004],
        ]
    )
    running = np.cumsum(allocations, axis=0)  # what polca stores as projected_loss, at each transition's step
    assert running[0].mean() == pytest.approx(-0.2642) and running[-1].mean() == pytest.approx(-0.2632)
    trajectories = tr.from_origin(running, cumulative=False)
    np.testing.assert_allclose(trajectories, tr.from_origin(allocations, cumulative=True))
    np.testing.assert_array_equal(trajectories[0], 0.0)
    np.testing.assert_allclose(trajectories[1:], running)
    basis_kept, kept = tr.polca_filter(trajectories[:, None, :])
    assert basis_kept.tolist() == [True]
    assert kept[0].tolist() == [True, False, True, True]
    # the other reading (end vs. after the first transition) drops the vector and disagrees on 3 of 4 datapoints
    assert not running[-1].mean() < running[0].mean()
    assert (~(running[-1] > running[0])).tolist() == [False, True, True, False]
    with pytest.raises(ValueError, match=r"start at L_b\(x, θ_0\) = 0"):
        tr.polca_filter(running[:, None, :])


def test_breakthroughs_of_projected_loss_are_found_on_the_checkpoint_axis() -> None:
    """Row t of an eq. 10 trajectory is checkpoint t: a drop during transition 2 -> 3 ends at step 30."""
    steps = np.array([0, 10, 20, 30, 40, 50])
    allocations = np.array([0.0, 0.0, -1.0, 0.0, 0.0])[:, None]  # the transition starting at step 20
    trajectory = tr.from_origin(allocations, cumulative=True)[:, 0]
    np.testing.assert_array_equal(trajectory, [0, 0, 0, -1, -1, -1])
    assert tr.breakthrough(trajectory, steps, delta=10) == (30.0, 1.0)
    # the running sum on the transitions' own steps (0..40) puts the same drop at step 20
    assert tr.breakthrough(np.cumsum(allocations[:, 0]), steps[:-1], delta=10) == (20.0, 1.0)


# --------------------------------------------------------------------------- labels


def test_label_scores_match_hand_computed_values() -> None:
    labels = np.array([0, 0, 0, 0, 1, 1, 1, -1, -1, 2])
    carry = np.array([1, 1, 1, 0, 1, 0, 0, 1, 0, 0])  # 4 of the 10 datapoints carry
    scores = tr.label_scores(labels, carry, slots=4, binary=True)
    np.testing.assert_array_equal(scores["value"], [1, 1, 1, -1])
    np.testing.assert_allclose(scores["homogeneity"], [3 / 4, 1 / 3, 0, np.nan])
    np.testing.assert_allclose(scores["recall"], [3 / 5, 1 / 5, 0, np.nan])
    np.testing.assert_allclose(scores["f1"], [2 / 3, 1 / 4, 0, np.nan])


def test_label_scores_of_a_multi_valued_label_use_the_majority() -> None:
    labels = np.array([0, 0, 0, 1, 1, 1, 1, -1])
    place = np.array([2, 2, 1, 0, 3, 3, 0, 2])  # cluster 1: a 0/3 tie goes to 0
    assert not tr.is_binary(place)
    scores = tr.label_scores(labels, place, slots=2, binary=False)
    np.testing.assert_array_equal(scores["value"], [2, 0])
    np.testing.assert_allclose(scores["homogeneity"], [2 / 3, 1 / 2])
    np.testing.assert_allclose(scores["recall"], [2 / 3, 2 / 2])
    np.testing.assert_allclose(scores["f1"], [2 / 3, 2 / 3])


def test_place_restriction_and_top_homogeneities() -> None:
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    carry = np.array([1, 1, 1, 0, 1, 1, 0, 0])
    place = np.array([2, 1, 0, 3, 2, 2, 3, 3])
    fractions = tr.place_fractions(labels, carry, np.array([1, 1, -1]), place, (1, 2))
    np.testing.assert_allclose(fractions, [2 / 3, 1.0, np.nan])
    homogeneity = np.array([[0.9, 0.5, np.nan], [0.9, 0.95, 0.2]])
    values, basis, cluster = tr.top_homogeneities(homogeneity)
    np.testing.assert_allclose(values, [0.95, 0.9, 0.9])
    np.testing.assert_array_equal(basis, [1, 0, 1])
    np.testing.assert_array_equal(cluster, [1, 0, 0])
    allowed = np.array([[False, True, True], [False, False, True]])
    values, basis, cluster = tr.top_homogeneities(homogeneity, allowed)
    np.testing.assert_allclose(values, [0.5, 0.2, np.nan])
    np.testing.assert_array_equal(basis, [0, 1, -1])
    np.testing.assert_array_equal(cluster, [1, 2, -1])


def test_datapoint_labels_of_tokens_and_examples() -> None:
    per_token = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(tr.datapoint_labels(per_token, [0, 2, 2], [1, 0, 3]), [1, 8, 11])
    np.testing.assert_array_equal(tr.datapoint_labels(np.array([5, 6, 7]), [2, 0], [-1, -1]), [7, 5])
    np.testing.assert_array_equal(tr.datapoint_labels(np.array([5, 6, 7]), [2, 2], [0, 1]), [7, 7])
    with pytest.raises(ValueError, match="whole-example"):
        tr.datapoint_labels(per_token, [0], [-1])


# --------------------------------------------------------------------------- end to end


def write_planted_store(path: Path) -> tuple[Path, np.ndarray]:
    """A store whose ``analyses/loss`` holds the planted losses, with the provenance the engine writes."""
    rows, groups = planted()
    count = len(groups)
    with ckptstore.create(path, config={}, objective="cross-entropy") as writer:
        writer.add_data(
            "eval",
            inputs=np.zeros((count, 2), np.float32),
            targets=np.zeros(count, np.int64),
            labels={"carry": (groups == 1).astype(np.int64), "group": groups},
        )
        for step in STEPS:
            writer.write(int(step), {"w": np.full(3, step, np.float32)})
    loss = xr.Dataset(
        {"loss": (("step", "datapoint"), rows.T), "mean_loss": (("step",), rows.mean(axis=0))},
        coords={"step": STEPS, "example": ("datapoint", np.arange(count)), "position": ("datapoint", -np.ones(count))},
    )
    provenance = {
        **Loss().provenance(),
        "data_sha256": data_hash(ckpt.open(path)),
        "requires": {},
        "steps": [int(s) for s in STEPS],
        "ckpt_version": ckptstore.__version__,
        "created": "2025-01-01T00:00:00Z",
    }
    write_analysis(path, "loss", loss, attrs={"ckpt": provenance})
    return path, groups


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    return write_planted_store(tmp_path_factory.mktemp("clusters") / "planted.zarr")


def test_engine_clusters_the_planted_loss(planted_run: tuple[Path, np.ndarray], tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "planted.zarr"
    shutil.copytree(planted_run[0], path)
    groups = planted_run[1]
    report = run("clusters", path, registry=registry, on="loss", delta=10, tau=50, label="carry")
    assert report.dependencies[0].computed_steps == []  # the planted loss is reused
    result = report.dataset.load()
    assert result["cluster_label"].dims == ("basis", "datapoint")
    assert result.sizes == {"basis": 1, "datapoint": 600, "cluster": 4, "step": 30, "rank": 3}
    labels = result["cluster_label"].values[0]
    assert adjusted_rand_score(groups, labels) == 1.0
    assert not result["filtered"].values.any()
    np.testing.assert_array_equal(result["size"].values[0], [200, 200, 200, -1])
    group_of = [int(np.bincount(groups[labels == c]).argmax()) for c in range(3)]
    planted_steps = [STEPS[DROPS[g]] for g in group_of]
    assert np.all(np.abs(result["breakthrough_step"].values[0, :3] - planted_steps) <= 10)
    # the mean loss shows group 0's (deepest) drop; the others' are hidden from it (tau = 50 < 80)
    assert abs(float(result["mean_breakthrough_step"]) - STEPS[DROPS[0]]) <= 10
    np.testing.assert_array_equal(result["hidden"].values[0, :3], [g != 0 for g in group_of])
    carry = group_of.index(1)
    assert result["homogeneity"].values[0, carry] == 1.0
    assert result["recall"].values[0, carry] == 1.0
    assert result["f1"].values[0, carry] == 1.0
    assert np.all(result["homogeneity"].values[0, [c for c in range(3) if c != carry]] == 0.0)
    np.testing.assert_allclose(result["top_homogeneity"].values, [1.0, 0.0, 0.0])
    assert result["top_cluster"].values[0] == carry
    medoids = result["medoid"].values[0, :3]
    assert all(labels[m] == c for c, m in enumerate(medoids))
    provenance = result.attrs["ckpt"]
    assert provenance["options"]["on"] == "loss"
    assert "loss" in provenance["requires"]
    text = clusters.Clusters().summarize(report.dataset)
    assert "basis 0: 3 cluster(s)" in text
    assert "top homogeneities of 'carry'" in text
    again = run("clusters", path, registry=registry, on="loss", delta=10, tau=50, label="carry")
    assert again.computed_steps == []


def test_engine_clusters_loss_changes_and_a_multi_valued_label(
    planted_run: tuple[Path, np.ndarray], tmp_path: Path, registry: Any
) -> None:
    path = tmp_path / "planted.zarr"
    shutil.copytree(planted_run[0], path)
    groups = planted_run[1]
    result = run("clusters", path, registry=registry, on="loss-change", delta=10, label="group").dataset.load()
    np.testing.assert_array_equal(result["step"].values, STEPS[:-1])
    labels = result["cluster_label"].values[0]
    assert adjusted_rand_score(groups, labels) == 1.0
    # the change ℓ(t+1) - ℓ(t) is at step t: one checkpoint before the drop
    group_of = [int(np.bincount(groups[labels == c]).argmax()) for c in range(3)]
    expected = [STEPS[DROPS[g] - 1] for g in group_of]
    np.testing.assert_array_equal(result["breakthrough_step"].values[0, :3], expected)
    np.testing.assert_array_equal(result["label_value"].values[0, :3], group_of)
    np.testing.assert_allclose(result["homogeneity"].values[0, :3], 1.0)


def test_place_restriction_end_to_end(planted_run: tuple[Path, np.ndarray], tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "planted.zarr"
    shutil.copytree(planted_run[0], path)
    groups = planted_run[1]
    options = {"on": "loss", "label": "carry", "place_restrict": True, "place_label": "group"}
    result = run("clusters", path, registry=registry, places="1", **options).dataset.load()
    labels = result["cluster_label"].values[0]
    carry = int(np.bincount(labels[groups == 1]).argmax())
    np.testing.assert_allclose(result["place_fraction"].values[0, carry], 1.0)
    # every cluster's make-up by the place label, recomputed from the labels
    kinds = result["place"].values
    assert kinds.tolist() == sorted(set(groups.tolist()))
    for c in range(int(result["clusters"].values[0])):
        shares = [np.mean(groups[labels == c] == k) for k in kinds]
        np.testing.assert_allclose(result["place_share"].values[0, c], shares)
    np.testing.assert_allclose(result["top_homogeneity"].values, [1.0, np.nan, np.nan])
    # no carry datapoint is in group 2: nothing qualifies
    result = run("clusters", path, registry=registry, places="2", **options).dataset.load()
    assert np.isnan(result["top_homogeneity"].values).all()
    with pytest.raises(Exception, match="no label 'nope'"):
        run("clusters", path, registry=registry, on="loss", label="nope")


def test_options_are_checked() -> None:
    with pytest.raises(Exception, match="option 'min_cluster_size' of analyzer 'clusters' must be at least 2"):
        clusters.Clusters(min_cluster_size=1)
    with pytest.raises(Exception, match="needs --label"):
        clusters.Clusters(place_restrict=True)
    with pytest.raises(Exception, match="--places"):
        clusters.Clusters(places="1,x")
    assert clusters.Clusters(on="fisher").requires == ("fisher", "loss")
    assert clusters.Clusters(on="loss-change").requires == ("loss",)
    assert clusters.Clusters().dependency_options() == {"polca": None}
    assert clusters.Clusters(on="lca", split="train").dependency_options() == {
        "lca": {"split": "train"},
        "loss": {"split": "train"},
    }


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_example_run(tmp_path_factory.mktemp("clusters-mlp") / "mlp.zarr", steps=4, examples=12)


def test_polca_result_is_filtered_as_the_rules_say(mlp_run: Path, tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "mlp.zarr"
    shutil.copytree(mlp_run, path)
    try:
        polca = run("polca", path, registry=registry, k=2, dtype="float64").dataset.load()
        result = run("clusters", path, registry=registry, min_cluster_size=2, delta=1).dataset.load()
        loss = run("loss", path, registry=registry).dataset.load()["mean_loss"].values
    finally:
        clear_cache()
    used = result.attrs["ckpt"]["requires"]["polca"]  # the stored polca is reused, with its basis
    assert used["options"]["dtype"] == "float64"
    assert used["requires"]["hessian-basis"]["options"]["k"] == 2
    projected = polca["projected_loss"].values  # [transition, basis, datapoint]: L_b(x, θ_(i+1))
    final = projected[-1]
    basis_kept = final.mean(axis=1) < 0  # eq. 10: L_b(x, θ_T) against L_b(x, θ_0) = 0
    kept = basis_kept[:, None] & ~(final > 0)
    np.testing.assert_array_equal(result["basis_kept"].values, basis_kept)
    np.testing.assert_array_equal(result["filtered"].values, ~kept)
    assert np.all(result["cluster_label"].values[~kept] == -1)
    checkpoints = ckptstore.open(path).steps
    np.testing.assert_array_equal(result["step"].values, checkpoints)  # θ_0 .. θ_T
    np.testing.assert_array_equal(polca["step"].values, checkpoints[:-1])
    mean = np.concatenate([[0.0], polca["loss_change"].values.mean(axis=1).cumsum()])
    np.testing.assert_allclose(result["mean_trajectory"].values, mean)
    np.testing.assert_allclose(result["mean_trajectory"].values, loss - loss[0], rtol=1e-6)  # loss: float32
    for b in np.flatnonzero(basis_kept):
        labels = result["cluster_label"].values[b]
        for c in range(int(result["clusters"].values[b])):
            members = np.concatenate([np.zeros((1, int((labels == c).sum()))), projected[:, b, labels == c]])
            np.testing.assert_allclose(result["median"].values[b, c], np.median(members, axis=1))
    np.testing.assert_array_equal(result["found_at_step"].values, polca["found_at_step"].values)


def test_fisher_and_lca_read_the_mean_loss(mlp_run: Path, tmp_path: Path, registry: Any) -> None:
    path = tmp_path / "mlp.zarr"
    shutil.copytree(mlp_run, path)
    options = {"min_cluster_size": 2, "delta": 1, "filter": False}
    try:
        fisher = run("fisher", path, registry=registry, k=2).dataset.load()
        on_fisher = run("clusters", path, registry=registry, on="fisher", **options).dataset.load()
        lca = run("lca", path, registry=registry, parameters=3).dataset.load()
        on_lca = run("clusters", path, registry=registry, on="lca", **options).dataset.load()
    finally:
        clear_cache()
    loss = ckptstore.open(path).analysis("loss").load()
    assert on_fisher.sizes["basis"] == fisher.sizes["basis"]
    np.testing.assert_allclose(on_fisher["mean_trajectory"].values, loss["mean_loss"].values)
    np.testing.assert_array_equal(on_fisher["found_at_step"].values, fisher["found_at_step"].values)
    # lca: the cumulative allocation over the checkpoints from 0 (as eq. 10); the mean loss at each checkpoint
    np.testing.assert_array_equal(on_lca["step"].values, loss["step"].values)
    np.testing.assert_array_equal(lca["step"].values, loss["step"].values[:-1])
    np.testing.assert_allclose(on_lca["mean_trajectory"].values, loss["mean_loss"].values)
    np.testing.assert_array_equal(on_lca["tensor"].values, lca["tensor"].values)
    cumulative = lca["lca"].cumsum("step").transpose("parameter", "datapoint", "step").values
    for p in range(3):
        labels = on_lca["cluster_label"].values[p]
        for c in range(int(on_lca["clusters"].values[p])):
            members = cumulative[p][labels == c]
            expected = np.median(np.concatenate([np.zeros((len(members), 1)), members], axis=1), axis=0)
            np.testing.assert_allclose(on_lca["median"].values[p, c], expected)
    assert not on_lca["filtered"].values.any()

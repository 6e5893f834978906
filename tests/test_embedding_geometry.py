"""``embedding-geometry``: the metrics on synthetic geometries, and real runs through the real engine."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckpt
import ckpt.store as ckptstore
from ckpt.analyzers import embedding_geometry as eg
from ckpt.engine.pipeline import run
from ckpt.engine.worker import clear_cache
from ckpt.plugins import AnalysisError, load_registry
from ckpt.sandboxes.base import train
from ckpt.sandboxes.modular_addition import ModularAddition
from ckpt.sandboxes.sparse_modular_addition import SparseModularAddition, build_model, prefix_code

N = 17
NAME = "embedding-geometry"


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def rotation(angle: float) -> np.ndarray:
    return np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])


def reading_order_grid(n: int, generator: int, rows: int, offset: int, u=(1.0, 0.0), v=(0.0, 1.0)) -> np.ndarray:
    """Ideal grid built from the definition: residue a at (i mod rows) u + (i div rows) v, i = (a - offset)/g."""
    inverse = pow(generator, -1, n)
    index = np.array([((a - offset) * inverse) % n for a in range(n)])
    return np.outer(index % rows, u) + np.outer(index // rows, v)


def circle(n: int, frequency: int, radius: float = 1.0) -> np.ndarray:
    angles = 2 * np.pi * frequency * np.arange(n) / n
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


# -- circularity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("frequency", [1, 3, 8])
def test_a_circle_is_perfectly_circular_at_its_frequency(frequency: int) -> None:
    embedding = circle(N, frequency, radius=2.5) @ rotation(0.7).T + np.array([4.0, -1.0])
    share, found = eg.circularity(embedding)
    assert share == pytest.approx(1.0, abs=1e-12)
    assert found == frequency
    assert eg.radial_cv(embedding) == pytest.approx(0.0, abs=1e-12)


def test_spectrum_matches_a_hand_written_dft_and_sums_to_one() -> None:
    embedding = np.random.default_rng(0).standard_normal((N, 3))
    centred = embedding - embedding.mean(0)
    power = []
    for k in range(N):
        coefficient = sum(centred[a] * np.exp(-2j * np.pi * k * a / N) for a in range(N))
        power.append(float((np.abs(coefficient) ** 2).sum()))
    expected = np.array([power[k] + power[N - k] for k in range(1, N // 2 + 1)]) / sum(power[1:])
    spectrum = eg.fourier_spectrum(embedding)
    np.testing.assert_allclose(spectrum, expected, rtol=1e-12)
    assert spectrum.sum() == pytest.approx(1.0)
    # an even N counts the Nyquist frequency once: alternating rows are all power at N/2
    alternating = np.array([[(-1.0) ** a, 0.0] for a in range(8)])
    assert eg.circularity(alternating) == (pytest.approx(1.0), 4)


def test_noncircular_shapes_score_lower() -> None:
    ellipse = circle(N, 1) * np.array([3.0, 1.0])
    line = np.outer(np.arange(N), [1.0, 0.5])
    assert eg.circularity(ellipse)[0] == pytest.approx(1.0)  # one frequency, still
    assert eg.radial_cv(ellipse) > 0.3  # but not round
    assert 0.5 < eg.circularity(line)[0] < 0.8  # a sawtooth spreads its power over frequencies
    assert math.isnan(eg.circularity(np.ones((N, 2)))[0])


# -- pair sums ------------------------------------------------------------------------------------


def test_pair_sums_cover_every_unordered_pair() -> None:
    embedding = np.random.default_rng(1).standard_normal((5, 2))
    sums, classes = eg.pair_sums(embedding)
    pairs = [(a, b) for a in range(5) for b in range(a, 5)]
    np.testing.assert_allclose(sums, [embedding[a] + embedding[b] for a, b in pairs])
    assert classes.tolist() == [(a + b) % 5 for a, b in pairs]


def test_within_share_and_silhouette_on_hand_built_clusters() -> None:
    points = np.array([[0.0, 0.0], [0.0, 2.0], [10.0, 0.0], [10.0, 2.0]])
    labels = np.array([0, 0, 1, 1])
    # within: 4 points at distance 1 from their class mean; total: 4 * (5^2 + 1^2)
    assert eg.within_share(points, labels) == pytest.approx(4 / 104)
    # silhouette of each point: a = 2 (its partner), b = mean(10, sqrt(104)), s = 1 - a / b
    b = (10 + math.sqrt(104)) / 2
    assert eg.silhouette(points, labels) == pytest.approx(1 - 2 / b)
    assert eg.within_share(points, np.array([0, 1, 0, 1])) == pytest.approx(100 / 104)
    assert math.isnan(eg.silhouette(points, np.zeros(4, dtype=int)))


def test_within_share_of_pair_sums_is_the_same_for_every_embedding_at_odd_n() -> None:
    # class means of linear pair sums differ only by E_{c/2}: the share is 1 - 2/((N+1)(N+2)), whatever E is
    rng = np.random.default_rng(2)
    embeddings = [reading_order_grid(N, 1, N, 0), circle(N, 1), *(rng.standard_normal((N, 3)) for _ in range(3))]
    for embedding in embeddings:
        assert eg.within_share(*eg.pair_sums(embedding)) == pytest.approx(1 - 2 / ((N + 1) * (N + 2)))


def test_nearest_neighbour_agreement_sees_grids_and_circles() -> None:
    points = np.array([[0.0], [0.1], [5.0], [5.1], [5.2]])
    assert eg.neighbor_agreement(points, np.array([0, 0, 1, 1, 2])) == pytest.approx(4 / 5)
    duplicates = np.zeros((3, 2))  # the nearest other point of a duplicate is its twin, never itself
    assert eg.neighbor_agreement(duplicates, np.array([0, 0, 0])) == 1.0
    scores = {
        name: eg.neighbor_agreement(*eg.pair_sums(embedding))
        for name, embedding in {
            "line": reading_order_grid(N, 1, N, 0),
            "grid": reading_order_grid(N, 3, 5, 7),
            "circle": circle(N, 1),
        }.items()
    }
    rng = np.random.default_rng(3)
    random = max(eg.neighbor_agreement(*eg.pair_sums(rng.standard_normal((N, 2)))) for _ in range(5))
    assert scores["line"] > 0.9 and scores["grid"] > 0.9
    assert random < 0.2 < scores["circle"] < 0.9


# -- grid imperfection ----------------------------------------------------------------------------

IDEAL_GRIDS = [  # (generator, row length, offset): lines (row length N) and 2-D reading-order lattices
    (1, N, 0),
    (5, N, 3),
    (1, 4, 0),
    (3, 5, 7),
    (2, 3, 1),
    (16, 6, 11),
]


@pytest.mark.parametrize(("generator", "rows", "offset"), IDEAL_GRIDS)
def test_ideal_grids_have_zero_imperfection(generator: int, rows: int, offset: int) -> None:
    sheared = reading_order_grid(N, generator, rows, offset, u=(1.3, 0.2), v=(0.4, 0.9))
    value, (found_offset, found_generator, found_rows) = eg.grid_imperfection(sheared)
    assert value == pytest.approx(0.0, abs=1e-10)
    # the reported lattice explains the rows exactly (an equivalent reading may be reported)
    index = np.array([((a - found_offset) * pow(found_generator, -1, N)) % N for a in range(N)])
    z = np.stack([index, 0 * index] if found_rows == N else [index % found_rows, index // found_rows], 1)
    design = np.column_stack([np.ones(N), z])
    fitted = design @ np.linalg.lstsq(design, sheared, rcond=None)[0]
    np.testing.assert_allclose(fitted, sheared, atol=1e-9)
    if rows == N:
        assert found_rows == N  # lines are reported as lines


def test_an_ideal_grid_embedded_in_more_dimensions_is_still_ideal() -> None:
    plane = np.linalg.qr(np.random.default_rng(3).standard_normal((6, 2)))[0]  # [6, 2] orthonormal
    embedding = reading_order_grid(N, 3, 5, 7) @ plane.T + 2.0
    assert eg.grid_imperfection(embedding)[0] == pytest.approx(0.0, abs=1e-10)


def test_grid_imperfection_is_invariant_to_translation_rotation_and_scale() -> None:
    embedding = reading_order_grid(N, 3, 5, 7) + 0.2 * np.random.default_rng(4).standard_normal((N, 2))
    value = eg.grid_imperfection(embedding)[0]
    moved = 7.5 * embedding @ rotation(1.1).T + np.array([-3.0, 8.0])
    assert value > 0
    assert eg.grid_imperfection(moved)[0] == pytest.approx(value, rel=1e-9)


def test_circles_and_random_embeddings_are_far_from_grids() -> None:
    assert eg.grid_imperfection(circle(N, 1))[0] > 0.2
    assert eg.grid_imperfection(circle(N, 3))[0] > 0.2
    rng = np.random.default_rng(5)
    assert min(eg.grid_imperfection(rng.standard_normal((N, 2)))[0] for _ in range(5)) > 0.2


@pytest.mark.parametrize(("generator", "rows", "offset"), [(1, N, 0), (3, 5, 7), (1, 4, 2)])
def test_grid_imperfection_grows_with_the_perturbation(generator: int, rows: int, offset: int) -> None:
    grid = reading_order_grid(N, generator, rows, offset)
    sizes = [0.01, 0.03, 0.1, 0.3, 1.0]  # noise std, in units of the lattice spacing
    means = []
    for size in sizes:
        values = []
        for seed in range(5):
            noise = np.random.default_rng(seed).standard_normal(grid.shape)
            values.append(eg.grid_imperfection(grid + size * noise)[0])
        means.append(np.mean(values))
    assert means[0] > 0
    assert all(a < b for a, b in itertools.pairwise(means)), means
    assert means[0] < 1e-3  # a hundredth of the spacing hardly shows (the share grows like size**2)


def test_tiny_tables() -> None:
    assert eg.grid_imperfection(np.array([[0.0, 1.0], [2.0, 5.0]]))[0] == 0.0  # two points are always a line
    assert math.isnan(eg.grid_imperfection(np.zeros((5, 2)))[0])


# -- sequence embeddings --------------------------------------------------------------------------


def test_cluster_count_on_hand_built_sequence_embeddings() -> None:
    rng = np.random.default_rng(6)
    centres = circle(6, 1, radius=3.0)  # six clusters, neighbours 3 apart
    points = np.repeat(centres, 20, axis=0) + 0.01 * rng.standard_normal((120, 2))
    assert eg.cluster_count(points, 0.05) == 6
    # merging two clusters leaves five; a huge tolerance joins everything; a tiny one splits every point
    merged = points.copy()
    merged[20:40] = points[:20] + 0.001
    assert eg.cluster_count(merged, 0.05) == 5
    assert eg.cluster_count(points, 2.0) == 1
    assert eg.cluster_count(points, 1e-6) == 120
    assert eg.ideal_cluster_count(2, 5) == 6
    assert eg.ideal_cluster_count(3, 4) == 15


def test_probe_sequences() -> None:
    probes = eg.probe_sequences(p=3, k=2, length=6, suffixes=4, seed=0)
    tokens = probes["tokens"]
    assert tokens.shape == (36, 6)
    np.testing.assert_array_equal(probes["prefix"], prefix_code(tokens, 2, 3))  # the sandbox's label
    assert len({tuple(r[:2]) for r in tokens.tolist()}) == 9
    for prefix in range(9):  # every prefix gets the same four suffixes
        np.testing.assert_array_equal(tokens[probes["prefix"] == prefix, 2:], tokens[:4, 2:])
    np.testing.assert_array_equal(probes["target"], tokens[:, :2].sum(1) % 3)
    # one multiset id per count vector: {0,1} and {1,0} share it
    counts = [tuple(np.bincount(r[:2], minlength=3)) for r in tokens.tolist()]
    assert len(set(probes["multiset"].tolist())) == 6 == len(set(counts))
    for i, j in [(0, 5), (4, 13)]:
        assert (probes["multiset"][i] == probes["multiset"][j]) == (counts[i] == counts[j])
    again = eg.probe_sequences(p=3, k=2, length=6, suffixes=4, seed=0)["tokens"]
    np.testing.assert_array_equal(again, tokens)


# -- real runs through the engine -----------------------------------------------------------------


@pytest.fixture(scope="module")
def registry() -> Any:
    return load_registry(extra=[eg])


def modular_store(path: Path) -> Path:
    train(ModularAddition(), path, steps=20, every=10, seed=0)
    return path


def sparse_store(path: Path) -> Path:
    train(SparseModularAddition(), path, steps=16, every=8, seed=0)
    return path


def test_modular_addition_run_matches_the_metrics_of_the_stored_embeddings(tmp_path: Path, registry: Any) -> None:
    path = modular_store(tmp_path / "ma.zarr")
    result = run(NAME, path, registry=registry).dataset.load()
    store = ckptstore.open(path)
    assert [int(s) for s in result["step"]] == [0, 10, 20]
    assert "sequence_clusters" not in result  # not a sequence task
    for step in (0, 10, 20):
        table = store.tensors(step)["embed.weight"].astype(np.float64)
        row = result.sel(step=step)
        share, frequency = eg.circularity(table)
        sums, classes = eg.pair_sums(table)
        grid, (offset, generator, rows) = eg.grid_imperfection(table)
        assert float(row["circularity"]) == pytest.approx(share)
        assert int(row["circle_frequency"]) == frequency
        np.testing.assert_allclose(row["frequency_share"].values, eg.fourier_spectrum(table))
        assert float(row["radial_cv"]) == pytest.approx(eg.radial_cv(table))
        assert float(row["pair_sum_within_share"]) == pytest.approx(eg.within_share(sums, classes))
        assert float(row["pair_sum_silhouette"]) == pytest.approx(eg.silhouette(sums, classes))
        assert float(row["pair_sum_neighbor_agreement"]) == pytest.approx(eg.neighbor_agreement(sums, classes))
        assert float(row["grid_imperfection"]) == pytest.approx(grid)
        assert (int(row["grid_offset"]), int(row["grid_generator"]), int(row["grid_row_length"])) == (
            offset,
            generator,
            rows,
        )
    summary = registry.analyzers[NAME]().summarize(result)
    assert "embed.weight" in summary and "N=17" in summary and "grid" in summary
    # a smaller modulus reads the first rows only
    small = run(NAME, path, registry=registry, modulus=5).dataset.load()
    table = store.tensors(20)["embed.weight"].astype(np.float64)[:5]
    assert float(small["grid_imperfection"].sel(step=20)) == pytest.approx(eg.grid_imperfection(table)[0])
    assert small.sizes["frequency"] == 2
    skipped = run(NAME, path, registry=registry, grid_max_tokens=16).dataset.load()  # 17 residues: no search
    assert np.isnan(skipped["grid_imperfection"].values).all() and (skipped["grid_row_length"] == -1).all()
    np.testing.assert_array_equal(skipped["circularity"].values, result["circularity"].values)
    clear_cache()


def test_sparse_modular_addition_run_captures_the_attention_output(tmp_path: Path, registry: Any) -> None:
    path = sparse_store(tmp_path / "sma.zarr")
    result = run(NAME, path, registry=registry, suffixes=3, seed=1).dataset.load()  # --sequence auto
    store = ckptstore.open(path)
    config = store.attrs["config"]
    probes = eg.probe_sequences(config["p"], config["k"], config["length"], suffixes=3, seed=1)
    assert result.sizes["probe"] == 2**5 * 3 and result.sizes["component"] == 2
    np.testing.assert_array_equal(result["prefix"].values, probes["prefix"])
    for step in [int(s) for s in store.steps]:
        model = build_model(**store.model.config).eval()
        model.load_state_dict(store.tensors(step, framework="torch"))
        with torch.no_grad():
            xi = model.attn(model.embeddings(torch.as_tensor(probes["tokens"]))).double().numpy()
        row = result.sel(step=step)
        np.testing.assert_allclose(row["sequence_embedding"].values, xi, rtol=1e-5, atol=1e-6)
        assert int(row["ideal_clusters"]) == 6  # C(5 + 2 - 1, 5)
        assert int(row["sequence_clusters"]) == eg.cluster_count(xi, 0.05)
        assert float(row["suffix_share"]) == pytest.approx(eg.within_share(xi, probes["prefix"]), rel=1e-5)
        assert float(row["multiset_share"]) == pytest.approx(eg.within_share(xi, probes["multiset"]), rel=1e-5)
        assert float(row["multiset_share"]) >= float(row["suffix_share"])  # coarser groups, more spread inside
    summary = registry.analyzers[NAME]().summarize(result)
    assert "clusters" in summary and "/6" in summary
    off = run(NAME, path, registry=registry, sequence="off").dataset
    assert "sequence_embedding" not in off and "grid_imperfection" in off
    clear_cache()


def test_bad_input_is_refused_with_one_line(tmp_path: Path, registry: Any) -> None:
    path = sparse_store(tmp_path / "sma.zarr")
    cases = [
        ({"tensor": "nope.weight"}, "--tensor"),
        ({"tensor": "attn.query"}, "--tensor"),  # 1-D
        ({"modulus": 3}, "--modulus"),  # more residues than the table's 2 rows
        ({"module": "nope"}, "--module"),
    ]
    for options, hint in cases:
        with pytest.raises(AnalysisError) as caught:
            run(NAME, path, registry=registry, **options)
        message = str(caught.value)
        assert hint in message and "\n" not in message, message
    with pytest.raises(AnalysisError, match="must be one of"):
        run(NAME, path, registry=registry, sequence="maybe")
    clear_cache()


def test_default_embedding_rule(tmp_path: Path) -> None:
    path = tmp_path / "named.zarr"
    with ckptstore.create(path) as writer:
        writer.write(0, {"pos_embed.weight": np.ones((4, 2), np.float32), "tok.weight": np.ones((3, 2), np.float32)})
    assert eg.default_embedding(ckpt.open(path)) == "pos_embed.weight"  # no model: the name rule only
    path = tmp_path / "model.zarr"
    model = build_model()
    with ckptstore.create(path, model="ckpt.sandboxes.sparse_modular_addition:build_model", config={}) as writer:
        writer.write(0, {"w.embed.weight": np.ones((4, 2), np.float32), **model.state_dict()})
    assert eg.default_embedding(ckpt.open(path)) == "embed.weight"  # the exact name before *embed.weight
    path = tmp_path / "lookup.zarr"
    with ckptstore.create(path, model="tests.test_embedding_geometry:lookup_model", config={}) as writer:
        writer.write(0, lookup_model().state_dict())
    assert eg.default_embedding(ckpt.open(path)) == "table.weight"  # no such name: the nn.Embedding


class Lookup(torch.nn.Module):
    """A model whose token embedding is not called ``embed``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)
        self.table = torch.nn.Embedding(5, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.table(tokens))


def lookup_model() -> torch.nn.Module:
    return Lookup()


def test_a_language_model_vocabulary_is_measured_without_its_pair_sums(tmp_path: Path, registry: Any) -> None:
    """50k tokens would make 1.26 billion pair sums: above --pair-sum-max-tokens they are NaN, named in the summary."""
    path = tmp_path / "vocab.zarr"
    rng = np.random.default_rng(0)
    tables = {step: rng.standard_normal((4000, 16)).astype(np.float32) for step in (0, 1)}
    with ckptstore.create(path) as writer:
        for step, table in tables.items():
            writer.write(step, {"wte.embed.weight": table})
    result = run(NAME, path, registry=registry).dataset.load()  # before: 8 million pair sums, a silhouette of them
    for variable in (
        "pair_sum_within_share",
        "pair_sum_silhouette",
        "pair_sum_neighbor_agreement",
        "grid_imperfection",
    ):
        assert np.isnan(result[variable].values).all(), variable
    for step, table in tables.items():  # the per-token metrics are still those of the whole table
        assert float(result["circularity"].sel(step=step)) == pytest.approx(eg.circularity(table.astype(np.float64))[0])
        assert float(result["radial_cv"].sel(step=step)) == pytest.approx(eg.radial_cv(table))
    summary = registry.analyzers[NAME]().summarize(result)
    assert "pair sums and grid not measured (NaN): 4,000 residues is over 256" in summary
    small = run(NAME, path, registry=registry, modulus=12).dataset.load()  # the first 12 tokens as residues
    sums, classes = eg.pair_sums(tables[1].astype(np.float64)[:12], 12)
    assert float(small["pair_sum_silhouette"].sel(step=1)) == pytest.approx(eg.silhouette(sums, classes))

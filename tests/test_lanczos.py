"""``top_eigenpairs`` against ``torch.linalg.eigh`` of explicit symmetric matrices.

The Hessian-basis tests (test_polca.py) check it through real model Hessians;
these reach the cases a model rarely does: eigenvalues of both signs, a basis to
deflate, an invariant Krylov subspace smaller than k, non-convergence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ckpt.numerics.lanczos import RITZ_VECTORS_BEYOND_K, top_eigenpairs
from ckpt.plugins import AnalysisError


def symmetric(values: np.ndarray, seed: int = 0) -> torch.Tensor:
    """Q diag(values) Qᵀ for a random orthogonal Q (float64)."""
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(len(values), len(values), generator=generator, dtype=torch.float64))
    return q @ torch.diag(torch.as_tensor(values, dtype=torch.float64)) @ q.T


def counted(matrix: torch.Tensor) -> tuple[list[int], object]:
    calls = [0]

    def hvp(v: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return (matrix @ v.double()).to(v.dtype)

    return calls, hvp


def test_top_eigenpairs_equal_eigh_with_residuals_of_the_returned_vectors() -> None:
    values = np.concatenate([[9.0, 7.5, 7.0, -12.0], np.linspace(-3, 3, 116)])
    matrix = symmetric(values)
    calls, hvp = counted(matrix)
    found = top_eigenpairs(hvp, 120, 3, tol=1e-10, dtype=torch.float64)
    np.testing.assert_allclose(found.values, [9.0, 7.5, 7.0], rtol=1e-10)  # largest algebraic, not |λ|
    _, exact_vectors = torch.linalg.eigh(matrix)
    vectors = torch.from_numpy(found.vectors)
    overlaps = (vectors * exact_vectors.flip(1)[:, :3].T).sum(1).abs()
    np.testing.assert_allclose(overlaps.numpy(), 1.0, atol=1e-9)
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(3), atol=1e-12)
    fresh = torch.linalg.vector_norm(vectors @ matrix - torch.from_numpy(found.values)[:, None] * vectors, dim=1)
    np.testing.assert_allclose(found.residuals, fresh.numpy(), atol=1e-12)  # from kept products, not new ones
    assert found.matvecs == calls[0] < 120
    assert (found.residuals <= 1e-10 * np.abs(found.values)).all()


@pytest.mark.parametrize("spill", [False, True])
def test_products_returned_in_one_reused_buffer_give_the_same_numbers(tmp_path, spill) -> None:
    """The analyzers flatten every product into one kept buffer (no fresh [D] tensor a product)."""
    matrix = symmetric(np.concatenate([[9.0, 8.8, 8.5], np.linspace(-3, 3, 197)]))
    _, fresh_hvp = counted(matrix)
    buffer = torch.empty(200)

    def reused_hvp(v: torch.Tensor) -> torch.Tensor:
        return buffer.copy_(fresh_hvp(v))

    options = {"tol": 1e-9, "max_vectors": 8, "spill": spill, "spill_dir": str(tmp_path)}
    fresh = top_eigenpairs(fresh_hvp, 200, 2, **options)
    reused = top_eigenpairs(reused_hvp, 200, 2, **options)
    assert reused.restarts > 0 and reused.matvecs == fresh.matvecs
    np.testing.assert_array_equal(reused.values, fresh.values)
    np.testing.assert_array_equal(reused.vectors, fresh.vectors)
    np.testing.assert_allclose(reused.values, [9.0, 8.8], rtol=1e-6)


def test_a_basis_is_deflated_and_the_result_orthogonal_to_it() -> None:
    values = np.concatenate([[5.0, 4.0, 3.0, 2.5], np.linspace(-1, 1, 56)])
    matrix = symmetric(values, seed=1)
    _, exact_vectors = torch.linalg.eigh(matrix)
    basis = exact_vectors.flip(1)[:, :2].T.contiguous()
    _, hvp = counted(matrix)
    found = top_eigenpairs(hvp, 60, 2, basis=basis, tol=1e-10, dtype=torch.float64)
    np.testing.assert_allclose(found.values, [3.0, 2.5], rtol=1e-10)
    assert np.abs(found.vectors @ basis.numpy().T).max() < 1e-12


def test_earlier_pieces_are_views_on_the_cpu_and_one_tensor_where_copied() -> None:
    """hessian-basis deflates against its earlier pieces: as they are, or in one tensor, with the same result."""
    from ckpt.analyzers.hessian_basis import earlier_basis

    values = np.concatenate([[5.0, 4.0, 3.0, 2.5, 2.0], np.linspace(-1, 1, 55)])
    matrix = symmetric(values, seed=2)
    _, exact_vectors = torch.linalg.eigh(matrix)
    top = exact_vectors.flip(1)[:, :3].T.contiguous()
    pieces = [{"vectors": top[i : i + 1].numpy()} for i in range(3)]  # one vector found at each of 3 checkpoints

    views = earlier_basis(pieces, "cpu", torch.float64)
    assert [v.data_ptr() for v in views] == [p["vectors"].ctypes.data for p in pieces], "not copied"
    stacked = earlier_basis(pieces, "cpu", torch.float32)  # another dtype: copied anyway, so into one tensor
    assert len(stacked) == 1 and stacked[0].dtype == torch.float32
    np.testing.assert_array_equal(stacked[0].numpy(), top.float().numpy())
    assert earlier_basis([], "cpu", torch.float32) == []

    _, hvp = counted(matrix)
    apart = top_eigenpairs(hvp, 60, 2, basis=views, tol=1e-10, dtype=torch.float64, seed=3)
    together = top_eigenpairs(hvp, 60, 2, basis=[top], tol=1e-10, dtype=torch.float64, seed=3)
    np.testing.assert_allclose(apart.values, [2.5, 2.0], rtol=1e-10)
    np.testing.assert_allclose(together.values, apart.values, rtol=1e-12)
    np.testing.assert_allclose(np.abs(together.vectors), np.abs(apart.vectors), atol=1e-12)


def test_an_earlier_basis_spilled_to_a_file_deflates_as_the_same_basis_in_memory() -> None:
    """hessian-basis may read its earlier basis from a file at every projection: the same numbers, to the bit."""
    from ckpt.numerics.lanczos import SpilledRows

    values = np.concatenate([[5.0, 4.0, 3.0, 2.5, 2.0], np.linspace(-1, 1, 55)])
    matrix = symmetric(values, seed=2)
    _, exact_vectors = torch.linalg.eigh(matrix)
    top = exact_vectors.flip(1)[:, :3].T.contiguous().float()  # found at earlier checkpoints, in float32
    spilled = SpilledRows(3, 60, torch.float32)
    try:
        spilled.write_block(2, slice(0, 60), top[:2])
        spilled.write_block(1, slice(0, 25), top[2:, :25], first=2)  # written piece by piece, tensor by tensor
        spilled.write_block(1, slice(25, 60), top[2:, 25:], first=2)
        np.testing.assert_array_equal(spilled.block(3, slice(0, 60)).numpy(), top.numpy())
        _, hvp = counted(matrix)
        on_disk = top_eigenpairs(hvp, 60, 2, basis=[spilled], tol=1e-6, seed=3)
        in_memory = top_eigenpairs(hvp, 60, 2, basis=[top], tol=1e-6, seed=3)
    finally:
        spilled.close()
    np.testing.assert_allclose(in_memory.values, [2.5, 2.0], rtol=1e-5)
    np.testing.assert_array_equal(on_disk.values, in_memory.values)
    np.testing.assert_array_equal(on_disk.vectors, in_memory.vectors)
    assert on_disk.matvecs == in_memory.matvecs


def test_an_invariant_subspace_smaller_than_k_goes_on_from_a_new_direction() -> None:
    """Rank 2: a random start spans {a, b, 0} in 3 products; k = 4 needs a second null direction."""
    generator = torch.Generator().manual_seed(2)
    u = torch.randn(40, 2, generator=generator, dtype=torch.float64)
    matrix = u @ torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64)) @ u.T
    exact = torch.linalg.eigvalsh(matrix).flip(0)[:4].numpy()
    _, hvp = counted(matrix)
    found = top_eigenpairs(hvp, 40, 4, tol=1e-10, dtype=torch.float64)
    np.testing.assert_allclose(found.values, exact, atol=1e-9)
    np.testing.assert_allclose(found.vectors @ found.vectors.T, np.eye(4), atol=1e-12)
    assert (found.residuals < 1e-9).all()
    assert found.matvecs <= 6


def test_float32_products_give_float64_accurate_eigenvalues() -> None:
    """The recurrence runs in float64: float32 products cost only their own rounding, also at D = 100,000.

    H = R diag(λ) R with R = I - 2uuᵀ a Householder reflection: exact eigenvalues at a model's size.
    """
    dimension = 100_000
    rng = np.random.default_rng(0)
    values = torch.from_numpy(np.concatenate([[40.0, 25.0], np.abs(rng.normal(0, 2, dimension - 2))])).float()
    u = torch.from_numpy(rng.standard_normal(dimension)).float()
    u /= torch.linalg.vector_norm(u)

    def hvp(v: torch.Tensor) -> torch.Tensor:  # float32 in, float32 out, like a float32 model's
        reflected = v - 2 * u * (u @ v)
        scaled = values * reflected
        return scaled - 2 * u * (u @ scaled)

    found = top_eigenpairs(hvp, dimension, 2, tol=1e-6, dtype=torch.float32)
    assert found.vectors.dtype == np.float32
    np.testing.assert_allclose(found.values, [40.0, 25.0], rtol=1e-7)


def test_a_product_that_is_not_finite_is_named_not_returned() -> None:
    matrix = symmetric(np.linspace(1.0, 2.0, 50), seed=5)
    calls = [0]

    def hvp(v: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        product = matrix @ v
        return product if calls[0] < 3 else product * float("nan")

    with pytest.raises(AnalysisError, match="Hessian-vector product 3 is not finite"):
        top_eigenpairs(hvp, 50, 1, tol=1e-12, dtype=torch.float64)


def test_the_vector_work_runs_on_one_thread_and_the_products_on_the_callers() -> None:
    """Small parallel regions made some processes' passes 2-5x slower with two threads (see top_eigenpairs)."""
    matrix = symmetric(np.concatenate([[5.0, 4.0], np.linspace(1.0, 2.0, 58)]), seed=6)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        in_products: list[int] = []
        in_progress: list[int] = []

        def hvp(v: torch.Tensor) -> torch.Tensor:
            in_products.append(torch.get_num_threads())
            return (matrix @ v.double()).to(v.dtype)

        found = top_eigenpairs(
            hvp, 60, 1, tol=1e-5, max_vectors=5, progress=lambda *_: in_progress.append(torch.get_num_threads())
        )
        assert found.restarts > 0  # restarts and the Ritz vectors' combination ran in between as well
        assert in_products == [3] * found.matvecs
        assert in_progress == [1] * found.matvecs
        assert torch.get_num_threads() == 3

        def failing(v: torch.Tensor) -> torch.Tensor:
            return hvp(v) * float("nan")

        with pytest.raises(AnalysisError, match="not finite"):
            top_eigenpairs(failing, 60, 1)
        assert torch.get_num_threads() == 3  # restored however the search ends
    finally:
        torch.set_num_threads(before)


def test_no_convergence_and_no_room_are_errors() -> None:
    matrix = symmetric(np.linspace(0.0, 1.0, 2000), seed=4)  # top gap 5e-4: slow
    _, hvp = counted(matrix)
    with pytest.raises(AnalysisError, match=r"did not converge to tol 1e-14 in 100 Hessian-vector.*raise --tol"):
        top_eigenpairs(hvp, 2000, 1, tol=1e-14, dtype=torch.float64)
    basis = torch.eye(2000, dtype=torch.float64)[:1999]
    with pytest.raises(AnalysisError, match="cannot find 1 more eigenvectors in a 1-dimensional complement"):
        top_eigenpairs(hvp, 2000, 1, basis=basis)


def test_a_bounded_search_restarts_and_finds_what_the_unbounded_one_finds() -> None:
    """Issue 29: at most ``max_vectors`` Lanczos vectors; thick restarts keep the best Ritz pairs."""
    values = np.concatenate([[9.0, 8.8, 8.5, -12.0], np.linspace(-3, 3, 296)])
    matrix = symmetric(values, seed=6)
    calls, hvp = counted(matrix)
    unbounded = top_eigenpairs(hvp, 300, 3, tol=1e-10, dtype=torch.float64)
    assert unbounded.restarts == 0
    unbounded_products = calls[0]
    calls[0] = 0
    bounded = top_eigenpairs(hvp, 300, 3, tol=1e-10, dtype=torch.float64, max_vectors=8)
    assert bounded.restarts > 0 and bounded.matvecs == calls[0]
    assert bounded.matvecs > unbounded_products  # restarts cost products, never accuracy
    np.testing.assert_allclose(bounded.values, [9.0, 8.8, 8.5], rtol=1e-10)
    vectors = torch.from_numpy(bounded.vectors)
    _, exact_vectors = torch.linalg.eigh(matrix)
    overlaps = (vectors * exact_vectors.flip(1)[:, :3].T).sum(1).abs()
    np.testing.assert_allclose(overlaps.numpy(), 1.0, atol=1e-9)
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(3), atol=1e-12)
    fresh = torch.linalg.vector_norm(vectors @ matrix - torch.from_numpy(bounded.values)[:, None] * vectors, dim=1)
    np.testing.assert_allclose(bounded.residuals, fresh.numpy(), atol=1e-11)  # the Lanczos relation holds


def test_a_thick_restart_keeps_k_plus_two_ritz_vectors_within_the_products_bound() -> None:
    """A restart keeps k + 2 Ritz vectors, not half the room: restarts every room - k - 2 products, fewer and smaller.

    Counted from the calls: with ``room`` vectors the first restart follows product ``room``, each later
    one ``room - keep`` products after it, and the product that converges makes none. Here 90 products
    and 9 restarts; keeping half the room took 89 and 13; unbounded, 80.
    """
    values = np.concatenate([[10.0, 9.7], np.linspace(-9, 9.5, 1998)])  # a slow top pair: many restarts
    matrix = symmetric(values, seed=3)
    calls, hvp = counted(matrix)
    room, k = 12, 1
    found = top_eigenpairs(hvp, 2000, k, tol=1e-10, dtype=torch.float64, max_vectors=room)
    keep = k + RITZ_VECTORS_BEYOND_K
    assert keep < (room + k) // 2  # this room would have kept half of it before
    assert found.matvecs == calls[0] > room + 2 * (room - keep)
    assert found.restarts == (found.matvecs - 1 - room) // (room - keep) + 1
    np.testing.assert_allclose(found.values, [10.0], rtol=1e-10)
    vector = torch.from_numpy(found.vectors[0])
    np.testing.assert_allclose(float(torch.linalg.vector_norm(matrix @ vector - 10.0 * vector)), 0.0, atol=1e-8)
    unbounded = top_eigenpairs(hvp, 2000, k, tol=1e-10, dtype=torch.float64)
    assert unbounded.restarts == 0 and found.matvecs <= 1.3 * unbounded.matvecs  # issue 29's bound


def test_a_bounded_float32_search_at_model_size_keeps_float64_accuracy() -> None:
    """Float32 vectors, float64 dot products: D = 100,000 with 6 vectors kept, as accurate as unbounded."""
    dimension = 100_000
    rng = np.random.default_rng(1)
    values = torch.from_numpy(np.concatenate([[40.0], np.abs(rng.normal(0, 4, dimension - 1))])).float()
    u = torch.from_numpy(rng.standard_normal(dimension)).float()
    u /= torch.linalg.vector_norm(u)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        reflected = v - 2 * u * (u @ v)
        scaled = values * reflected
        return scaled - 2 * u * (u @ scaled)

    found = top_eigenpairs(hvp, dimension, 1, tol=1e-6, dtype=torch.float32, max_vectors=6)
    assert found.restarts > 0
    np.testing.assert_allclose(found.values, [40.0], rtol=1e-7)
    # R e_0 = e_0 - 2 u u_0, the eigenvector of 40, and the overlap, in float64: a float32 dot product
    # over 100,000 terms is itself off by about 1e-6 (it read 0.9999989 where float64 reads 1 - 2e-9)
    exact = -2 * u.double() * u.double()[0]
    exact[0] += 1.0
    exact /= torch.linalg.vector_norm(exact)
    assert abs(float(torch.from_numpy(found.vectors[0]).double() @ exact)) > 1 - 1e-6


def test_too_little_room_is_an_error_naming_the_budget() -> None:
    matrix = symmetric(np.linspace(0.0, 1.0, 50), seed=7)
    _, hvp = counted(matrix)
    with pytest.raises(
        AnalysisError, match=r"room for at least 6 vectors .* budget leaves room for 4: raise --max-memory"
    ):
        top_eigenpairs(hvp, 50, 2, dtype=torch.float64, max_vectors=4)


@pytest.mark.parametrize("small_blocks", [False, True], ids=["blocks", "small-blocks"])
@pytest.mark.parametrize("restrict", [False, True])
def test_spilled_vectors_give_the_same_numbers_and_leave_no_file(tmp_path, monkeypatch, restrict, small_blocks) -> None:
    """Issue 29: vectors kept in a temporary file (GPT-2 small's budget) are bit-equal to vectors kept in memory.

    With ``small_blocks`` the passes work on blocks of 25 to 50 columns, as GPT-2 small's 124M columns
    are by 1 MiB: every pass, restart and spilled read then spans many blocks.
    """
    import ckpt.numerics.lanczos as lanczos

    if small_blocks:
        monkeypatch.setattr(lanczos, "CPU_DOT_BLOCK_BYTES", 2048)
    values = np.concatenate([[9.0, 8.8, 8.5, 6.0, -12.0], np.linspace(-3, 3, 395)])
    matrix = symmetric(values, seed=8)
    _, exact_vectors = torch.linalg.eigh(matrix)
    basis = [exact_vectors.flip(1)[:, :1].T.contiguous(), exact_vectors.flip(1)[:, 1:2].T.contiguous()]
    listed = []

    def hvp(v: torch.Tensor) -> torch.Tensor:
        listed.append(sorted(p.name for p in tmp_path.iterdir()))
        return (matrix @ v.double()).to(v.dtype)

    options = {"basis": basis if restrict else None, "tol": 1e-9, "dtype": torch.float32, "max_vectors": 7}
    in_memory = top_eigenpairs(hvp, 400, 2, **options)
    spilled = top_eigenpairs(hvp, 400, 2, spill=True, spill_dir=str(tmp_path), **options)
    assert spilled.restarts > 0 and spilled.matvecs == in_memory.matvecs
    np.testing.assert_array_equal(spilled.values, in_memory.values)
    np.testing.assert_array_equal(spilled.vectors, in_memory.vectors)
    np.testing.assert_array_equal(spilled.residuals, in_memory.residuals)
    np.testing.assert_allclose(spilled.values, [8.5, 6.0] if restrict else [9.0, 8.8], rtol=1e-6)
    assert all(names == [] for names in listed)  # unlinked as soon as made: a killed run leaves nothing
    assert list(tmp_path.iterdir()) == []


def test_spilled_rows_read_and_write_like_rows_in_memory(tmp_path) -> None:
    """Rows in a file give what the same calls give in memory, whatever the order of reads and writes.

    Random calls of every kind a search makes: blocks of some rows in order, as a pass reads them;
    block writes of the first rows, as a thick restart makes them; whole rows written in the
    background; reads of rows just written.
    """
    import ckpt.numerics.lanczos as lanczos

    rng = np.random.default_rng(0)
    capacity, dimension = 7, 1_003
    spilled = lanczos.SpilledRows(capacity, dimension, torch.float32, str(tmp_path))
    memory = lanczos.MemoryRows(capacity, dimension, torch.float32, "cpu")
    for index in range(capacity):
        row = torch.from_numpy(rng.standard_normal(dimension).astype(np.float32))
        spilled.write(index, row.clone())
        memory.write(index, row)
    try:
        for _ in range(60):
            width = int(rng.integers(1, 300))
            first = int(rng.integers(0, capacity))
            count = int(rng.integers(1, capacity - first + 1))
            kind = rng.integers(0, 3)
            for start in range(0, dimension, width):
                columns = slice(start, min(start + width, dimension))
                torch.testing.assert_close(
                    spilled.block(count, columns, first), memory.block(count, columns, first), rtol=0, atol=0
                )
                if kind == 1:  # a restart: the block's first rows rewritten as it goes
                    values = torch.from_numpy(rng.standard_normal((count, columns.stop - start)).astype(np.float32))
                    spilled.write_block(count, columns, values, first)
                    memory.write_block(count, columns, values, first)
            if kind == 2:
                row = torch.from_numpy(rng.standard_normal(dimension).astype(np.float32))
                index = int(rng.integers(0, capacity))
                spilled.write(index, row.clone())
                memory.write(index, row)
        torch.testing.assert_close(spilled.block(capacity, slice(0, dimension)), memory.data, rtol=0, atol=0)
    finally:
        spilled.close()


def test_rows_written_in_the_background_are_never_overwritten_before_they_are_in_the_file(
    tmp_path, monkeypatch
) -> None:
    """A slow disk (each write waits 20 ms before it starts) changes no number of a spilled search.

    The newest vector is written by a background thread while the next product runs, and its memory
    becomes the next product's residual two products later: were that not waited for, the file would
    hold the residual's values and the search would differ from the one in memory.
    """
    import os
    import time

    matrix = symmetric(np.concatenate([[9.0, 8.8, 8.5, 6.0], np.linspace(-3, 3, 396)]), seed=8)
    _, hvp = counted(matrix)
    options = {"tol": 1e-9, "dtype": torch.float32, "max_vectors": 7}
    in_memory = top_eigenpairs(hvp, 400, 2, **options)
    pwrite = os.pwrite

    def slow_pwrite(fd, data, offset):
        time.sleep(0.02)
        return pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", slow_pwrite)
    spilled = top_eigenpairs(hvp, 400, 2, spill=True, spill_dir=str(tmp_path), **options)
    assert spilled.restarts > 0 and spilled.matvecs == in_memory.matvecs
    np.testing.assert_array_equal(spilled.vectors, in_memory.vectors)
    np.testing.assert_array_equal(spilled.values, in_memory.values)


def test_a_failed_background_write_is_an_error_not_a_wrong_vector(tmp_path, monkeypatch) -> None:
    """A full disk (a short write) in the writer thread is raised from the search, naming the knob."""
    import os

    _, hvp = counted(symmetric(np.linspace(-3, 3, 100), seed=8))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    with pytest.raises(AnalysisError, match=r"could not be spilled .*raise --max-memory"):
        top_eigenpairs(hvp, 100, 1, tol=1e-9, spill=True, spill_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_reorthogonalization_keeps_the_vectors_orthonormal_over_a_long_search() -> None:
    """One Gram-Schmidt pass when it suffices, two when the first left overlaps above the rounding."""
    values = np.concatenate([[10.0, 9.0, 8.0, 7.0], np.linspace(-9, 6.5, 496)])
    matrix = symmetric(values, seed=9)
    _, hvp = counted(matrix)
    found = top_eigenpairs(hvp, 500, 4, tol=1e-10, dtype=torch.float64)
    assert found.matvecs > 60 and found.restarts == 0
    vectors = torch.from_numpy(found.vectors)
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(4), atol=1e-12)
    np.testing.assert_allclose(found.values, np.sort(values)[::-1][:4], rtol=1e-10)


def test_a_spilled_search_reads_all_its_kept_vectors_only_when_orthogonality_is_lost(tmp_path, monkeypatch) -> None:
    """Issue 29: the reads of spilled vectors, not the products, made GPT-2 small's products 3.4x a fwd+bwd.

    Each product's residual is orthogonalized against B and the vectors T couples it to (the three-term
    recurrence); a pass over all kept vectors follows only where Simon's estimate of their overlaps
    passes √ε, and once more after it. Before, that pass came every product: two reads of every kept
    vector a product (three before the recurrence came first).
    """
    import os

    values = np.concatenate([[9.0, 8.8, 8.5, 6.0], np.linspace(-3, 3, 396)])
    matrix = symmetric(values, seed=10)
    # a basis that is not an eigenbasis (an earlier checkpoint's): H v has large components along it
    basis = torch.linalg.qr(torch.randn(400, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64))[0]
    _, hvp = counted(matrix)
    read = [0]
    preadv = os.preadv

    def counting_preadv(fd, buffers, offset):
        done = preadv(fd, buffers, offset)
        read[0] += done
        return done

    monkeypatch.setattr(os, "preadv", counting_preadv)
    found = top_eigenpairs(hvp, 400, 1, basis=basis.T.float(), tol=1e-9, spill=True, spill_dir=str(tmp_path))
    assert found.restarts == 0 and found.matvecs > 10
    assert 0 < found.full_passes <= found.matvecs // 3
    row = 400 * 4
    # per product p: the previous and current vectors (2 rows, up to three times with a second pass); all p kept
    # ones, up to three times, for a full pass; one read of all of them at the end to form the eigenvector
    bound = sum(3 * min(p, 2) for p in range(1, found.matvecs + 1))
    bound += found.full_passes * 3 * found.matvecs + found.matvecs
    every_product = sum(2 * min(p, 2) + 2 * p for p in range(1, found.matvecs + 1))  # the full pass each time
    assert read[0] <= bound * row < every_product * row, f"{read[0] / row:.0f} rows read, at most {bound} expected"
    projector = torch.eye(400, dtype=torch.float64) - basis @ basis.T
    top = torch.linalg.eigvalsh(projector @ matrix @ projector)[-1:]
    np.testing.assert_allclose(found.values, top.numpy(), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_partial_reorthogonalization_keeps_the_lanczos_vectors_semi_orthogonal(dtype) -> None:
    """Every vector the search multiplies by, against every other, stays within a few √ε (Simon's bound).

    With no pass over all kept vectors at all, float64 Lanczos on this spectrum loses orthogonality
    once the top Ritz values converge: overlaps reach 0.41 (checked by setting the threshold to inf).
    """
    values = np.concatenate([[10.0, 9.0, 8.0, 7.0], np.linspace(-9, 6.5, 496)])
    matrix = symmetric(values, seed=9)
    inputs = []

    def hvp(v: torch.Tensor) -> torch.Tensor:
        inputs.append(v.double().clone())
        return (matrix @ v.double()).to(v.dtype)

    found = top_eigenpairs(hvp, 500, 4, tol=1e-10 if dtype == torch.float64 else 1e-6, dtype=dtype)
    assert found.restarts == 0 and found.full_passes < found.matvecs // 2
    lanczos = torch.stack(inputs)
    overlaps = (lanczos @ lanczos.T - torch.eye(len(inputs), dtype=torch.float64)).abs().max()
    assert overlaps < 10 * torch.finfo(dtype).eps ** 0.5, f"{float(overlaps):.1e}"
    vectors = torch.from_numpy(found.vectors).double()
    np.testing.assert_allclose((vectors @ vectors.T).numpy(), np.eye(4), atol=10 * torch.finfo(dtype).eps)
    # Working precision is a small multiple of ε‖A‖, for these Ritz values as for LAPACK's: against the
    # matrix as built (Q diag(values) Qᵀ in float64 moves its top eigenvalue by 2.5e-14), float64 Lanczos
    # and eigvalsh differed by up to 14 ε‖A‖ on an AMD EPYC, float32 by 0.5 ε‖A‖
    exact = torch.linalg.eigvalsh(matrix).flip(0)[:4].numpy()
    np.testing.assert_allclose(found.values, exact, rtol=0, atol=100 * torch.finfo(dtype).eps * np.abs(values).max())


def counting_second_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``[n]``: the second Gram-Schmidt passes made from now on (each ``_subtract`` that ends with the norm alone)."""
    import ckpt.numerics.lanczos as lanczos

    second_passes = [0]
    subtract = lanczos._subtract

    def counting_subtract(x, sources, coefficients, *, then_dots=False, then_norm=False, source=None):
        second_passes[0] += then_norm
        return subtract(x, sources, coefficients, then_dots=then_dots, then_norm=then_norm, source=source)

    monkeypatch.setattr(lanczos, "_subtract", counting_subtract)
    return second_passes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_second_gram_schmidt_pass_is_made_exactly_where_the_first_left_overlaps_above_the_rounding(
    dtype, monkeypatch
) -> None:
    """The overlaps the first pass leaves are measured (float64, of x as stored), not guessed from its norm.

    A residual that is mostly along the rows (a Lanczos product near an eigenvector: 1e4 times the part
    orthogonal to them) loses most of its norm in the first pass, and with it the digits that made it
    orthogonal: a second pass follows and leaves it orthogonal to its dtype's rounding. A residual that
    is mostly orthogonal already gets one pass, as Daniel-Gragg-Kaufman-Stewart's test on the norm
    would give. Between them, 10 times along the rows, the first pass removes 97% of the norm, and
    that test would ask for a second pass; float32 vectors get none, the first pass being computed in
    float64, and are orthogonal to their rounding after it; float64 vectors, computed in their own
    precision, get one.
    """
    import ckpt.numerics.lanczos as lanczos

    generator = torch.Generator().manual_seed(3)
    dimension = 200_000
    rows = torch.linalg.qr(torch.randn(dimension, 3, generator=generator, dtype=torch.float64))[0].T
    orthogonal = torch.randn(dimension, generator=generator, dtype=torch.float64)
    orthogonal -= rows.T @ (rows @ orthogonal)
    orthogonal /= orthogonal.norm()
    second_passes = counting_second_passes(monkeypatch)
    eps = torch.finfo(dtype).eps
    stored = rows.to(dtype)
    for along, passes in [(1e4, 1), (1e-2, 0), (10.0, int(dtype == torch.float64))]:
        x = (along * (rows.T @ torch.tensor([3.0, -2.0, 1.0], dtype=torch.float64)) + orthogonal).to(dtype)
        second_passes[0] = 0
        _, norm = lanczos._orthogonalize(x, [(lanczos.MemoryRows.of(stored), 3)])
        assert second_passes[0] == passes, f"{along}: {second_passes[0]} second passes"
        overlaps = stored.double() @ x.double()
        assert float(overlaps.abs().max()) <= eps * float(x.double().norm()), f"{along}: {overlaps}"
        assert norm == pytest.approx(float(x.double().norm()), rel=1e-12)


def test_a_spilled_search_whose_products_need_a_second_pass_gives_the_in_memory_numbers(tmp_path, monkeypatch) -> None:
    """Spilled, the previous Lanczos vector is read from the buffer the new residual is written into.

    A large shift (A = 50 I + a spread of ±1) makes each product almost all along the current vector,
    so that the first Gram-Schmidt pass leaves overlaps above the residual's rounding and a second pass
    follows on most products: that pass must read the previous vector from the file, its buffer being
    the residual by then. Bit-equal to the same search in memory, with the second pass taken.
    """

    matrix = symmetric(np.concatenate([[52.0, 51.9, 51.7], 50.0 + np.linspace(-1, 1, 297)]), seed=9)
    _, hvp = counted(matrix)
    options = {"tol": 1e-9, "dtype": torch.float32, "max_vectors": 8}
    second_passes = counting_second_passes(monkeypatch)
    in_memory = top_eigenpairs(hvp, 300, 2, **options)
    in_memory_passes, second_passes[0] = second_passes[0], 0
    spilled = top_eigenpairs(hvp, 300, 2, spill=True, spill_dir=str(tmp_path), **options)
    assert second_passes[0] == in_memory_passes > spilled.matvecs // 2
    assert spilled.restarts > 0 and spilled.matvecs == in_memory.matvecs
    np.testing.assert_array_equal(spilled.values, in_memory.values)
    np.testing.assert_array_equal(spilled.vectors, in_memory.vectors)
    np.testing.assert_allclose(spilled.values, [52.0, 51.9], rtol=1e-6)


def test_the_caller_hears_when_the_products_are_done_before_the_eigenvectors_are_formed() -> None:
    """hessian-basis frees its kept graphs there: the k eigenvectors must not be formed beside them."""
    from ckpt.numerics.derivatives import MeanLossHessian

    values = np.concatenate([[5.0, 4.0], np.linspace(-1, 1, 38)])
    matrix = symmetric(values, seed=4)
    calls, hvp = counted(matrix)
    heard: list[int] = []
    found = top_eigenpairs(hvp, 40, 2, tol=1e-8, dtype=torch.float64, products_done=lambda: heard.append(calls[0]))
    assert heard == [found.matvecs], "once, after the last product"
    np.testing.assert_allclose(found.values, [5.0, 4.0], rtol=1e-8)

    # a released Hessian has no products any more: never zeros
    primal = {"w": torch.randn(3, dtype=torch.float64)}
    hessian = MeanLossHessian([(lambda p: (p["w"] ** 3).sum().reshape(1), 1.0)], primal)
    vector = {"w": torch.ones(3, dtype=torch.float64)}
    torch.testing.assert_close(hessian(vector)["w"], 6 * primal["w"])
    hessian.release()
    with pytest.raises(RuntimeError, match="released"):
        hessian(vector)

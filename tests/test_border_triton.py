"""Fused Triton border kernel (Triton's interpreter on CPU, compiled on a GPU) against the
reference solve and the dense per-atom oracle."""

from __future__ import annotations

import importlib.util

import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.border import BorderSolution, solve_batched_border
from tests.helpers import assert_close
from tests.oracles.border_dense import assert_matches_dense
from tests.oracles.border_fixtures import atoms_with_two_bad_rows, random_batch, random_pd_atom
from tests.oracles.border_golden import (
    GOLDEN_RIDGE,
    failing_d2_atoms,
    golden_d2_atoms,
)
from tests.pallas.test_border import (
    BorderKernelScenarios,
    assert_same_solution,
    batch_of,
    scaled_rows_atom,
    schur_failure_mixed_atoms,
)
from tests.test_border import overflow_atoms

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed")
BACKENDS = [pytest.param("interpret", id="interpret", marks=needs_triton),
            pytest.param("triton", id="triton", marks=pytest.mark.gpu)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_parts_of_the_row_pivots_match_frexp(dtype):
    """The row pass's ``x = m 2^e`` (``m`` in [1, 2)) against numpy's frexp (``m`` in
    [0.5, 1)) over normal and subnormal magnitudes, the largest finite value and +inf
    (``m = inf``), compiled: Triton's interpreter runs a kernel's own module only, and the
    helper lives in the library's."""
    import jax

    from gpustat.triton._common import launch
    from tests.triton_helper_kernels import binary_parts_kernel

    info = np.finfo(dtype)
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.uniform(1, 2, 64) * 2.0 ** rng.integers(info.minexp, info.maxexp, 64),
        [info.smallest_subnormal, info.smallest_normal / 3, info.smallest_normal, 1.0,
         info.max], np.ones(59)]).astype(dtype)
    shapes = (jax.ShapeDtypeStruct(x.shape, dtype), jax.ShapeDtypeStruct(x.shape, jnp.int32))
    m, e = launch(binary_parts_kernel, (jnp.asarray(x),), shapes, (1,), num_warps=1,
                  N=x.size)
    m_np, e_np = np.frexp(x)
    np.testing.assert_array_equal(np.asarray(m), 2 * m_np)
    np.testing.assert_array_equal(np.asarray(e), e_np - 1)
    m, _ = launch(binary_parts_kernel, (jnp.full(1, np.inf, dtype),),
                  (jax.ShapeDtypeStruct((1,), dtype), jax.ShapeDtypeStruct((1,), jnp.int32)),
                  (1,), num_warps=1, N=1)
    assert np.isposinf(np.asarray(m)[0])


@needs_triton
def test_launch_config_is_a_power_of_two_warps():
    """Triton needs a power-of-two warp count (d = 3 at K = 16 asked for 6 and the GPU
    launch failed); one warp while a row holds at most 32 tile entries."""
    from gpustat.triton.border import launch_config

    for d in range(1, 9):
        for K in (16, 32):
            rows, warps = launch_config(d, K)
            assert rows == 32 and warps in (1, 2, 4, 8)
            assert (warps == 1) == (d * K <= 32)


@needs_triton
def test_direct_calls_check_ridges_and_widen_mixed_dtypes():
    """solve_border_triton takes one ridge per atom (a scalar was read past its end) and
    computes in the widest dtype of its arrays (a float32 H_tt rounded the rest)."""
    from gpustat.triton.border import solve_border_triton

    b = batch_of(golden_d2_atoms())
    arrays = (b.H_tt, b.H_tb, b.g_t, b.H_bb, b.g_b)
    ridges = jnp.full(b.num_atoms, GOLDEN_RIDGE)
    with pytest.raises(ValueError, match=r"ridge_t: expected shape \(3,\)"):
        solve_border_triton(b.layout, *arrays, GOLDEN_RIDGE, ridges, interpret=True)
    with pytest.raises(ValueError, match="ridge_beta"):
        solve_border_triton(b.layout, *arrays, ridges, ridges[:2], interpret=True)
    out = solve_border_triton(b.layout, b.H_tt.astype(jnp.float32), *arrays[1:], ridges,
                              ridges, interpret=True)
    want = solve_batched_border(b, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
    assert out[0].dtype == jnp.float64
    assert_close(out[1], want.delta_beta, rtol=1e-6)


class TestBorderTriton(BorderKernelScenarios):
    @pytest.fixture(autouse=True, params=BACKENDS)
    def _backend(self, request):
        self.interpret = request.param == "interpret"

    def solve(self, batch, ridge_t, ridge_beta):
        """The Triton solve: its interpreter (no public backend name) or backend="triton"."""
        if not self.interpret:
            return solve_batched_border(batch, ridge_t, ridge_beta, backend="triton")
        from gpustat.triton.border import solve_border_triton

        dtype = batch.H_tt.dtype
        ridges = [jnp.broadcast_to(jnp.asarray(r, dtype), (batch.num_atoms,))
                  for r in (ridge_t, ridge_beta)]
        out = solve_border_triton(batch.layout, batch.H_tt, batch.H_tb, batch.g_t, batch.H_bb,
                                  batch.g_b, *ridges, interpret=True)
        return BorderSolution(*out, layout=batch.layout)

    def against_reference(self, atoms, ridge, dtype=np.float64):
        batch = batch_of(atoms, dtype)
        got = self.solve(batch, ridge, ridge)
        return got, solve_batched_border(batch, ridge, ridge, backend="reference")

    def test_border_widths_with_and_without_the_spare_column(self):
        """k = 15 (K = 16, r rides in the spare column), k = 16 and 31 (K = 32, spare),
        k = 32 beside them (K = 32 group without a spare column: the r accumulator)."""
        rng = np.random.default_rng(3)
        atoms = [random_pd_atom(rng, n, 2, k) for n, k in [(40, 15), (3, 16), (70, 31),
                                                            (33, 32)]]
        got, want = self.against_reference(atoms, GOLDEN_RIDGE)
        assert_same_solution(got, want, rtol=1e-11)
        assert_matches_dense(atoms, got, GOLDEN_RIDGE, GOLDEN_RIDGE)

    def test_first_failing_row_across_chunks_and_the_retry_ridge(self):
        """Rows 70 and 45 of an 80-row atom indefinite (45 is in the second 32-row chunk):
        status 1 at row 45 with the reference's bump; with a row ridge past both rows'
        bumps (and one more, so no row is barely PD) the atom solves; the PD atom beside
        it is solved both times."""
        atoms = atoms_with_two_bad_rows(80, late=70, early=45)
        got, want = self.against_reference(atoms, 0.0)
        np.testing.assert_array_equal(got.status, [1, 0])
        np.testing.assert_array_equal(got.row, [45, -1])
        assert_same_solution(got, want, rtol=1e-12)
        # the bump covers row 45 only; row 70 (-I) needs 1 + its own
        ridge_t = np.array([max(float(got.bump[0]), 1.0) + 1.0, 0.0])
        fixed = self.solve(batch_of(atoms), ridge_t, 0.0)
        np.testing.assert_array_equal(fixed.status, [0, 0])
        assert_matches_dense(atoms, fixed, ridge_t, 0.0)

    def test_nonfinite_entries_of_every_input_are_reported_per_atom(self):
        """One non-finite entry per atom in each input array (later chunks too), one beside
        a failing row (non-finite wins), a finite H_tb that overflows the Schur complement
        (status 3 too) and a clean atom: statuses and rows equal the reference's."""
        rng = np.random.default_rng(9)
        atoms = [list(random_pd_atom(rng, 70, 2, 5)) for _ in range(9)]
        pokes = [(0, 0, (65, 1, 1), np.inf), (1, 0, (33, 1, 0), np.nan),
                 (2, 2, (37, 0), -np.inf), (3, 1, (30, 1, 2), np.nan),
                 (4, 1, (5, 0, 4), np.inf), (5, 0, 3, -np.eye(2)), (5, 1, (35, 0, 0), np.nan),
                 (6, 1, (20, 0, 1), 1e300), (7, 3, (1, 0), np.nan)]
        for atom, array, index, value in pokes:
            atoms[atom][array] = np.array(atoms[atom][array], dtype=float)
            atoms[atom][array][index] = value
        got, want = self.against_reference(atoms, 0.0)
        np.testing.assert_array_equal(want.status, [3, 3, 3, 3, 3, 3, 3, 3, 0])
        np.testing.assert_array_equal(got.status, want.status)
        np.testing.assert_array_equal(got.row, want.row)
        assert np.all(np.isnan(np.asarray(got.delta_t)[:70 * 8]))
        assert_matches_dense(atoms, got, 0.0, 0.0, only=[8])

    def test_scalar_schur_groups_and_gauss_jordan_side_by_side(self):
        """Launch groups of one k from 1 to 12 (compile-time k: k = 1, 4, 5, 6, 8, 9, 12)
        beside wider borders (k = 13, 15: runtime k, Gauss-Jordan), one atom (k = 6) whose
        border's only negative pivot is its last (status 2 and the reference's bump, the
        others unaffected); the bump makes the retry succeed."""
        rng = np.random.default_rng(11)
        sizes = [(30, 1), (5, 4), (64, 5), (1, 8), (40, 6), (33, 9), (70, 12), (9, 13), (2, 15)]
        atoms = [random_pd_atom(rng, n, 2, k) for n, k in sizes]
        atoms[4] = (*atoms[4][:3], np.diag([2.0] * 5 + [-2.0]), atoms[4][4])
        got, want = self.against_reference(atoms, GOLDEN_RIDGE)
        np.testing.assert_array_equal(got.status, [0, 0, 0, 0, 2, 0, 0, 0, 0])
        assert_same_solution(got, want, rtol=1e-10)
        assert_matches_dense(atoms, got, GOLDEN_RIDGE, GOLDEN_RIDGE)
        ridge_beta = GOLDEN_RIDGE + np.asarray(got.bump)
        fixed = self.solve(batch_of(atoms), GOLDEN_RIDGE, ridge_beta)
        np.testing.assert_array_equal(fixed.status, 0)
        assert_matches_dense(atoms, fixed, GOLDEN_RIDGE, ridge_beta)

    def test_finite_schur_complement_whose_bump_overflows_is_nonfinite(self):
        """A positive definite border near the float64 limit (pivots 1.5e308 and 8.3e307,
        a Gershgorin row sum past it): the reference's bump overflows, so status 3, though
        the Schur solve itself succeeds; a clean atom beside it."""
        rng = np.random.default_rng(12)
        atoms = [random_pd_atom(rng, n, 2, 2) for n in (5, 40)]
        atoms[0] = (*atoms[0][:3], np.array([[1.5e308, 1e308], [1e308, 1.5e308]]),
                    atoms[0][4])
        got, want = self.against_reference(atoms, GOLDEN_RIDGE)
        np.testing.assert_array_equal(want.status, [3, 0])
        np.testing.assert_array_equal(got.status, want.status)
        assert_matches_dense(atoms, got, GOLDEN_RIDGE, GOLDEN_RIDGE, only=[1])

    def test_schur_failure_in_a_k32_group_leaves_other_atoms(self):
        """Atom 0's Schur complement is -2 I (status 2, the reference's bump); re-solved
        with the bump on its border ridge it matches the dense oracle."""
        atoms = schur_failure_mixed_atoms()
        got, want = self.against_reference(atoms, GOLDEN_RIDGE)
        np.testing.assert_array_equal(got.status, [2, 0, 0])
        assert_same_solution(got, want, rtol=1e-10)
        assert_matches_dense(atoms, got, GOLDEN_RIDGE, GOLDEN_RIDGE)
        ridge_beta = GOLDEN_RIDGE + np.asarray(got.bump)
        fixed = self.solve(batch_of(atoms), GOLDEN_RIDGE, ridge_beta)
        np.testing.assert_array_equal(fixed.status, [0, 0, 0])
        assert_matches_dense(atoms, fixed, GOLDEN_RIDGE, ridge_beta)

    @pytest.mark.parametrize("dtype, scales", [
        (np.float64, [1e250, 1e-250, 1.0]), (np.float32, [1e30, 1e-30, 1.0])])
    def test_log_det_of_rows_at_the_ends_of_the_exponent_range(self, dtype, scales):
        """Row pivots cycling through huge, tiny and O(1): log_det equals the reference's."""
        rng = np.random.default_rng(11)
        atoms = [scaled_rows_atom(rng, np.resize(scales, 40), 5, dtype),
                 random_pd_atom(rng, 17, 2, 3)]
        got, want = self.against_reference(atoms, 0.0, dtype)
        np.testing.assert_array_equal(got.status, [0, 0])
        rtol = 1e-10 if dtype == np.float64 else 1e-4
        assert_same_solution(got, want, rtol=rtol)

    @pytest.mark.parametrize("sizes", [[(4, 0)], [(0, 3)], [(3, 0), (5, 0)], [(0, 0)],
                                       [(0, 3), (2, 0)], [(0, 2), (0, 3)]])
    def test_empty_packed_arrays_match_dense(self, sizes):
        """Every n_a k_a = 0 (no H_tb), every k_a = 0 (rows alone), every n_a = 0 (borders
        alone)."""
        atoms = random_batch(8, sizes, 2)
        sol = self.solve(batch_of(atoms), 0.1, 0.2)
        np.testing.assert_array_equal(sol.status, 0)
        assert_matches_dense(atoms, sol, 0.1, 0.2)

    def test_overflow_from_finite_input_is_nonfinite(self):
        """S0 = -inf, r = inf (status 3, bump 0), a row -1e308 I (status 1, infinite bump),
        a row -I (status 1), a clean atom: as the reference reports them."""
        atoms = overflow_atoms()
        got, want = self.against_reference(atoms, 0.0)
        np.testing.assert_array_equal(got.status, [3, 3, 1, 1, 0])
        np.testing.assert_array_equal(got.row, want.row)
        np.testing.assert_array_equal(np.asarray(got.bump)[:3], np.asarray(want.bump)[:3])
        assert_close(got.bump[3], want.bump[3], rtol=1e-15)
        assert np.all(np.isnan(np.asarray(got.log_det)[:4]))
        assert_matches_dense(atoms, got, 0.0, 0.0, only=[4])

    def test_float32_failing_rows_report_their_index(self):
        """float32 stats carry the failing row as its int32 bits (a float32 holds
        integers exactly only up to 2**24): status and row equal the reference's."""
        got, want = self.against_reference(failing_d2_atoms(), 0.0, np.float32)
        assert int(got.status[0]) == 1
        np.testing.assert_array_equal(got.status, want.status)
        np.testing.assert_array_equal(got.row, want.row)

    def test_vmap_over_ridges(self):
        self.check_vmap_over_ridges()

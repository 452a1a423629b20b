"""Border kernel (interpret on CPU, compiled on a GPU) vs the reference and the dense oracle."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gpustat.border import BorderBatch, retry_failed, solve_batched_border
from gpustat.pallas.border import (
    KernelConfig,
    _back_meta,
    _binary_parts,
    _unrolled_cholesky_solve,
    plan_buckets,
    solve_border_pallas,
)
from gpustat.reference.border import BorderLayout
from tests.helpers import KernelTests, assert_close
from tests.oracles.border_dense import assert_matches_dense
from tests.oracles.border_fixtures import atoms_with_two_bad_rows, random_pd_atom
from tests.oracles.border_golden import (
    GOLDEN_D2,
    GOLDEN_RIDGE,
    check_golden,
    failing_d2_atoms,
    golden_d2_atoms,
    random_pd_atoms,
    schur_and_nonfinite_d2_atoms,
)

# Smallest row tile (16 rows): the d = 2 atoms of 17 and 300 rows stream over 2 and 19
# chunks (ragged last chunks), the 3-row atom fits one chunk.
STREAMING = KernelConfig(tile_elems=512)


def batch_of(atoms, dtype=np.float64):
    return BorderBatch.from_atoms(*([np.asarray(x, dtype) for x in xs]
                                    for xs in zip(*atoms, strict=True)))


def assert_same_solution(kernel, reference, rtol):
    """Status, row exact; values and bumps to ``rtol`` (NaN in the same places)."""
    np.testing.assert_array_equal(kernel.status, reference.status)
    np.testing.assert_array_equal(kernel.row, reference.row)
    for name in ("delta_t", "delta_beta", "log_det", "bump"):
        assert_close(getattr(kernel, name), getattr(reference, name), rtol=rtol, atol=rtol,
                     err_msg=name)


@pytest.mark.parametrize("config", [KernelConfig(), STREAMING])
def test_plan_covers_one_chunk_and_streamed_atoms(config):
    """Every atom in exactly one bucket; one-chunk buckets hold atoms that fit, streamed
    buckets atoms longer than their tile (default config: the 300-row atom streams)."""
    layout = batch_of(random_pd_atoms(2)).layout
    buckets = plan_buckets(layout, config)
    assert {b.streamed for b in buckets} == {False, True}
    for b in buckets:
        n, k = layout.n_rows[b.atoms], layout.k_dims[b.atoms]
        assert np.all(k <= b.K) and b.K in (16, 32)
        assert np.all(n > b.block_rows) if b.streamed else np.all(n <= b.block_rows)
    atoms = np.concatenate([b.atoms for b in buckets])
    np.testing.assert_array_equal(np.sort(atoms), np.arange(layout.num_atoms))


@pytest.mark.parametrize("rows", [16, 32])
def test_back_substitution_chunks_cover_every_row_once(rows):
    """Stage 3's row chunks (ragged atoms, single rows, a non-multiple of the chunk, one
    atom left out of the group) cover exactly the group's rows, each chunk inside one atom
    with that atom's H_tb offset and group position."""
    layout = BorderLayout(2, np.array([1, 33, 16, 7, 100]), np.array([3, 20, 1, 12, 32]))
    atoms = np.array([0, 1, 2, 4])
    meta = _back_meta(layout, atoms, rows).reshape(-1, 5)
    covered = np.concatenate([np.arange(r0, r0 + n) for r0, n, *_ in meta])
    np.testing.assert_array_equal(covered, layout.row_index(atoms))
    for r0, n, k, cross0, pos in meta:
        a = atoms[pos]
        assert 1 <= n <= rows and k == layout.k_dims[a]
        first = r0 - layout.row_offsets[a]
        assert 0 <= first and first + n <= layout.n_rows[a]
        assert cross0 == layout.cross_offsets[a] + first * 2 * k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_binary_parts_match_frexp(dtype):
    """``x = m 2^e`` with ``m`` in [1, 2) against numpy's frexp (``m`` in [0.5, 1)), over
    normal and subnormal magnitudes, the largest finite value and +inf (m = inf)."""
    info = np.finfo(dtype)
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.uniform(1, 2, 64) * 2.0 ** rng.integers(info.minexp, info.maxexp, 64),
        [info.smallest_subnormal, info.smallest_normal / 3, info.smallest_normal, 1.0,
         info.max]]).astype(dtype)
    m, e = jax.jit(_binary_parts)(x)
    m_np, e_np = np.frexp(x)
    np.testing.assert_array_equal(np.asarray(m), 2 * m_np)
    np.testing.assert_array_equal(np.asarray(e), e_np - 1)
    m_inf, _ = _binary_parts(np.array([np.inf], dtype))
    assert np.isposinf(m_inf[0])


def scaled_rows_atom(rng, scales, k, dtype):
    """A PD atom whose row ``i`` is scaled by ``scales[i]`` (``H_tt``) and its square root
    (``H_tb``, ``g_t``): the whitened rows stay O(1) while the row pivots, and the log
    determinant, span the dtype's exponent range."""
    n = len(scales)
    H_tt, H_tb, g_t, H_bb, g_b = random_pd_atom(rng, n, 2, k)
    s = np.asarray(scales, np.float64)
    return [np.asarray(x, dtype) for x in (H_tt * s[:, None, None],
                                           H_tb * np.sqrt(s)[:, None, None],
                                           g_t * np.sqrt(s)[:, None], H_bb, g_b)]


def schur_failure_mixed_atoms():
    """K = 32 and K = 16 groups: a single-row K = 32 atom with border -2 I (status 2), a
    single-row K = 16 atom, and a 40-row K = 32 atom (64-row tile) beside them."""
    rng = np.random.default_rng(7)
    atoms = [random_pd_atom(rng, n, 2, k) for n, k in [(1, 20), (1, 3), (40, 32)]]
    atoms[0] = (*atoms[0][:3], -2.0 * np.eye(20), atoms[0][4])
    return atoms


def test_unrolled_schur_solve_matches_numpy_and_flags_indefinite(K=16):
    """The GPU's stage-2 solve for K = 16 (interpret mode runs the batched one):
    x and L's diagonal against numpy; an indefinite and a singular matrix give a NaN and a
    zero pivot in their own atom only."""
    rng = np.random.default_rng(K)
    A = rng.normal(size=(4, K, K))
    S = A @ A.transpose(0, 2, 1) + K * np.eye(K)
    S[1] = -np.eye(K)
    S[2, 0, :] = S[2, :, 0] = 0.0  # first pivot exactly zero
    rhs = rng.normal(size=(4, K))
    x, diag = jax.jit(_unrolled_cholesky_solve)(S, rhs)
    x, diag = np.asarray(x), np.asarray(diag)
    for a in (0, 3):
        assert_close(x[a], np.linalg.solve(S[a], rhs[a]), rtol=1e-12, atol=1e-14)
        assert_close(diag[a], np.diagonal(np.linalg.cholesky(S[a])), rtol=1e-13)
    assert np.isnan(diag[1, 0]) and diag[2, 0] == 0.0


class BorderKernelScenarios:
    """Scenarios every border kernel runs (the Pallas kernel below, the fused Triton one in
    ``tests/test_border_triton.py``) through ``self.solve(batch, ridge_t, ridge_beta)``."""

    @pytest.mark.parametrize("values", [golden_d2_atoms, failing_d2_atoms,
                                        schur_and_nonfinite_d2_atoms])
    def test_matches_reference_and_dense(self, values):
        """A fixture's three d = 2 atoms: status, row, values and bumps equal the
        reference's, solved atoms the dense oracle's, the golden atoms the spec's values."""
        atoms = values()
        ridge = 0.0 if values is failing_d2_atoms else GOLDEN_RIDGE
        batch = batch_of(atoms)
        got = self.solve(batch, ridge, ridge)
        want = solve_batched_border(batch, ridge, ridge, backend="reference")
        assert_same_solution(got, want, rtol=1e-12)
        checked = [a for a in range(3) if int(want.status[a]) != 3]
        assert_matches_dense(atoms, got, ridge, ridge, only=checked)
        if values is golden_d2_atoms:
            check_golden(got, GOLDEN_D2)

    @pytest.mark.parametrize("d", [1, 2, 3, 4])
    def test_random_pd_batches_match_dense(self, d):
        """Ragged rows (streamed over several chunks) and borders in both K groups."""
        atoms = random_pd_atoms(d)
        sol = self.solve(batch_of(atoms), GOLDEN_RIDGE, GOLDEN_RIDGE)
        assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE)
        if d == 1:  # atom 2 is the spec's pd_k1_system(3, 1, 2, 1.0)
            check_golden(sol, [None, None, (3, 1, 2, 1.0)])

    def test_float32_matches_float64_oracle(self):
        atoms = golden_d2_atoms()
        sol = self.solve(batch_of(atoms, np.float32), GOLDEN_RIDGE, GOLDEN_RIDGE)
        assert sol.delta_t.dtype == np.float32
        assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE, rtol=1e-5)

    def test_row_pivot_overflowing_to_inf_fails_the_row(self):
        """A row pivot that overflows to +inf (finite H_tt and ridge_t) fails its row as
        the reference's non-finite factor does: status 1, row 0, an infinite bump, NaN
        outputs; the atom beside it is solved."""
        rng = np.random.default_rng(12)
        atoms = [random_pd_atom(rng, 3, 2, 2), random_pd_atom(rng, 4, 2, 3)]
        H_tt = np.array(atoms[0][0])
        H_tt[0] = np.diag([1e308, 1.0])
        atoms[0] = (H_tt, *atoms[0][1:])
        batch = batch_of(atoms)
        ridge_t = np.array([1e308, 0.0])
        got = self.solve(batch, ridge_t, 0.0)
        want = solve_batched_border(batch, ridge_t, 0.0, backend="reference")
        np.testing.assert_array_equal(want.status, [1, 0])
        np.testing.assert_array_equal(got.status, want.status)
        np.testing.assert_array_equal(got.row, want.row)
        assert np.isposinf(float(got.bump[0])) and np.isnan(float(got.log_det[0]))
        assert np.all(np.isnan(np.asarray(got.delta_beta)[:2]))
        assert_matches_dense(atoms, got, ridge_t, 0.0, only=[1])

    def check_vmap_over_ridges(self):
        """(run by each class's own test: the Pallas one is marked slow)"""
        batch = batch_of(golden_d2_atoms())
        ridges = np.array([1e-6, 0.5])
        stacked = jax.vmap(lambda r: self.solve(batch, r, r))(ridges)
        for i, r in enumerate(ridges):
            one = solve_batched_border(batch, r, r, backend="reference")
            assert_close(stacked.delta_t[i], one.delta_t, rtol=1e-12, atol=1e-12)
            assert_close(stacked.log_det[i], one.log_det, rtol=1e-12)


class TestBorderKernel(BorderKernelScenarios, KernelTests):
    def solve(self, batch, ridge_t, ridge_beta):
        return solve_batched_border(batch, ridge_t, ridge_beta, backend=self.backend)

    def streamed_and_reference(self, b, ridge=0.0):
        """(kernel solution in 16-row chunks (STREAMING), reference solution) of batch b
        with ``ridge`` on both blocks."""
        ridges = np.full(b.num_atoms, ridge, b.H_tt.dtype)
        out = solve_border_pallas(b.layout, b.H_tt, b.H_tb, b.g_t, b.H_bb, b.g_b, ridges,
                                  ridges, interpret=self.backend == "interpret",
                                  config=STREAMING)
        want = solve_batched_border(b, ridge, ridge, backend="reference")
        return type(want)(*out, layout=b.layout), want

    @pytest.mark.slow
    def test_streamed_and_packed_tiles_match_dense(self):
        atoms = random_pd_atoms(2)
        sol, _ = self.streamed_and_reference(batch_of(atoms), GOLDEN_RIDGE)
        assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE)

    def test_row_failure_bump_and_retry(self):
        """One atom (row 2 = -I): status 1 at row 2; the retry rounds (ridge_t bump, then the
        ridge_beta bump the barely-PD row forces) reuse the same compiled layout."""
        atoms = failing_d2_atoms()[:1]
        batch = batch_of(atoms)
        sol = solve_batched_border(batch, 0.0, 0.0, backend=self.backend)
        assert int(sol.status[0]) == 1 and int(sol.row[0]) == 2 and float(sol.bump[0]) > 0
        fixed, ridge_t, ridge_beta = retry_failed(batch, sol, 0.0, 0.0, backend=self.backend)
        assert int(fixed.status[0]) == 0
        assert_matches_dense(atoms, fixed, ridge_t, ridge_beta)

    def test_first_failing_row_of_a_streamed_atom(self):
        """Rows 37 and 21 of a 40-row atom indefinite, 16-row chunks: the kernel reports
        row 21 (third chunk) and its bump, as the reference does; the PD atom beside it
        is solved."""
        atoms = atoms_with_two_bad_rows(40, late=37, early=21)
        b = batch_of(atoms)
        got, want = self.streamed_and_reference(b)
        np.testing.assert_array_equal(got.status, [1, 0])
        np.testing.assert_array_equal(got.row, [21, -1])
        assert_same_solution(got, want, rtol=1e-12)

    def test_nonfinite_entries_of_every_input_are_reported_per_atom(self):
        """One non-finite entry per atom, in each input array and in later chunks of
        streamed atoms (16-row chunks): H_tt's diagonal (+inf: its row still whitens to
        finite numbers), H_tt off the diagonal, g_t, H_tb (NaN, +inf), H_tb NaN in an atom
        that also has a failing row (non-finite wins); an atom whose finite H_tb overflows
        the Schur complement (a non-finite intermediate: also status 3); a clean atom.
        Status and row equal the reference's."""
        rng = np.random.default_rng(9)
        atoms = [random_pd_atom(rng, 40, 2, 5) for _ in range(8)]

        def poke(a, array, index, value):
            parts = [np.array(x, dtype=float) for x in atoms[a]]
            parts[array][index] = value
            atoms[a] = tuple(parts)

        poke(0, 0, (25, 1, 1), np.inf)
        poke(1, 0, (33, 1, 0), np.nan)
        poke(1, 0, (33, 0, 1), np.nan)
        poke(2, 2, (37, 0), -np.inf)
        poke(3, 1, (30, 1, 2), np.nan)
        poke(4, 1, (5, 0, 4), np.inf)
        poke(5, 0, 3, -np.eye(2))
        poke(5, 1, (35, 0, 0), np.nan)
        poke(6, 1, (20, 0, 1), 1e300)
        b = batch_of(atoms)
        got, want = self.streamed_and_reference(b)
        np.testing.assert_array_equal(want.status, [3, 3, 3, 3, 3, 3, 3, 0])
        np.testing.assert_array_equal(got.status, want.status)
        np.testing.assert_array_equal(got.row, want.row)
        assert_matches_dense(atoms, got, 0.0, 0.0, only=[7])

    @pytest.mark.parametrize("dtype, scales", [
        (np.float64, [1e250, 1e-250, 1.0]), (np.float32, [1e30, 1e-30, 1.0])])
    def test_log_det_of_rows_at_the_ends_of_the_exponent_range(self, dtype, scales):
        """A 40-row streamed atom whose row pivots cycle through huge, tiny and O(1): a
        row's two pivots multiply past the largest (or below the smallest) float, so the
        kernel's mantissa/exponent product must renormalise; log_det and the solution
        equal the reference's sum of logarithms. (Subnormal pivots: interpret mode flushes
        them in the row Cholesky itself, so only `test_binary_parts_match_frexp` has them.)"""
        rng = np.random.default_rng(11)
        atoms = [scaled_rows_atom(rng, np.resize(scales, 40), 5, dtype),
                 random_pd_atom(rng, 17, 2, 3)]
        b = batch_of(atoms, dtype)
        got, want = self.streamed_and_reference(b)
        np.testing.assert_array_equal(got.status, [0, 0])
        assert abs(float(want.log_det[0])) > (1e3 if dtype == np.float64 else 1e2)
        rtol = 1e-10 if dtype == np.float64 else 1e-4
        assert_close(got.log_det, want.log_det, rtol=rtol, atol=0, err_msg="log_det")
        assert_same_solution(got, want, rtol=rtol)

    def test_schur_failure_in_a_k32_group_leaves_other_atoms(self):
        """Stage 2's batched Cholesky fails for atom 0 only (status 2 with the reference's
        bump); the retry with that bump then solves it, matching the dense oracle."""
        atoms = schur_failure_mixed_atoms()
        batch = batch_of(atoms)
        got = solve_batched_border(batch, GOLDEN_RIDGE, GOLDEN_RIDGE, backend=self.backend)
        want = solve_batched_border(batch, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
        np.testing.assert_array_equal(got.status, [2, 0, 0])
        assert_same_solution(got, want, rtol=1e-10)
        assert_matches_dense(atoms, got, GOLDEN_RIDGE, GOLDEN_RIDGE)
        fixed, ridge_t, ridge_beta = retry_failed(batch, got, GOLDEN_RIDGE, GOLDEN_RIDGE,
                                                  backend=self.backend)
        np.testing.assert_array_equal(fixed.status, [0, 0, 0])
        assert_matches_dense(atoms, fixed, ridge_t, ridge_beta)

    def test_mixed_dtype_arrays_compute_in_the_widest(self):
        """A float32 H_tt beside float64 arrays (direct call: BorderBatch has one dtype)
        solves in float64, not rounded to float32."""
        atoms = golden_d2_atoms()
        b = batch_of(atoms)
        ridges = np.full(b.num_atoms, GOLDEN_RIDGE)
        out = solve_border_pallas(b.layout, b.H_tt.astype(np.float32), b.H_tb, b.g_t, b.H_bb,
                                  b.g_b, ridges, ridges, interpret=self.backend == "interpret")
        assert out[0].dtype == np.float64

    @pytest.mark.slow
    def test_vmap_over_ridges(self):
        self.check_vmap_over_ridges()

"""Border kernel for row dimensions 8 < d <= 32 (looped row factorisation) and mixed-d
batches: interpret mode on CPU, compiled on a GPU; against the dense oracle and the
reference."""

from __future__ import annotations

import numpy as np

from gpustat.border import solve_batched_border
from tests.helpers import KernelTests
from tests.oracles.border_dense import assert_matches_dense, dense_solve
from tests.oracles.border_fixtures import random_pd_atom
from tests.pallas.test_border import assert_same_solution
from tests.test_border_mixed_d import MIXED, batch_of, mixed_atoms

RIDGE = 1e-6


class TestWideBorderKernel(KernelTests):
    def solve(self, batch, ridge_t=RIDGE, ridge_beta=RIDGE):
        return solve_batched_border(batch, ridge_t, ridge_beta, backend=self.backend)

    def test_mixed_d_batch_matches_dense_and_reference(self):
        """d = 1, 3 (unrolled rows), 9, 16, 17, 32 (looped rows, tiles of 16 and 32; the
        20-row d = 17 atom spans two chunks), an atom without rows, borders 1 to 17 (K 16
        and 32): float64 to 1e-10 of the dense oracle."""
        atoms = mixed_atoms()
        batch = batch_of(atoms)
        got = self.solve(batch)
        assert got.delta_t.shape == batch.g_t.shape
        assert_matches_dense(atoms, got, RIDGE, RIDGE)

    def test_float32_wide_rows_match_float64_oracle(self):
        """d = 16 and 32 (both tile sizes) in float32: scaled error <= 1e-4 of the float64
        dense solve (well-conditioned rows: A^T A + I)."""
        atoms = [a for a, (_, d, _) in zip(mixed_atoms(), MIXED) if d in (16, 32)]
        sol = self.solve(batch_of(atoms, np.float32))
        assert sol.delta_t.dtype == np.float32
        assert_matches_dense(atoms, sol, RIDGE, RIDGE, rtol=1e-4)

    def test_one_long_atom_streams_through_chunks(self):
        """The charter shape scaled down: one atom of 300 rows, d = 16, k = 6 (19 chunks of
        16 rows, partial Schur sums reduced per atom)."""
        atoms = [random_pd_atom(np.random.default_rng(7), 300, 16, 6)]
        sol = self.solve(batch_of(atoms), 1e-9, 1e-9)
        assert_matches_dense(atoms, sol, 1e-9, 1e-9)

    def test_failures_are_reported_per_atom(self):
        """d = 16: rows 18 (-I) and 19 of a 20-row atom indefinite (the first failing row,
        18, is in the second chunk), an indefinite Schur complement, a NaN cross entry in
        a later row: status, row and bump as the reference's, the dense oracle's status
        and first failing row, the PD atom beside them solved."""
        rng = np.random.default_rng(3)
        atoms = [random_pd_atom(rng, n, 16, k) for n, k in ((20, 5), (3, 4), (18, 3), (4, 6))]
        H_tt = atoms[0][0].copy()
        H_tt[18] = -np.eye(16)  # second chunk
        H_tt[19, 3, 3] = -50.0  # indefinite, later row
        atoms[0] = (H_tt, *atoms[0][1:])
        atoms[1] = (*atoms[1][:3], -2.0 * np.eye(4), atoms[1][4])
        H_tb = atoms[2][1].copy()
        H_tb[17, 2, 1] = np.nan
        atoms[2] = (atoms[2][0], H_tb, *atoms[2][2:])
        batch = batch_of(atoms)
        got = self.solve(batch, 0.0, 0.0)
        want = solve_batched_border(batch, 0.0, 0.0, backend="reference")
        np.testing.assert_array_equal(got.status, [1, 2, 3, 0])
        np.testing.assert_array_equal(got.row, [18, -1, -1, -1])
        assert dense_solve(*atoms[0], 0.0, 0.0)[:2] == (1, 18)
        assert dense_solve(*atoms[1], 0.0, 0.0)[0] == 2
        assert_same_solution(got, want, rtol=1e-12)
        assert float(got.bump[0]) > 1.0 and float(got.bump[1]) > 2.0
        assert_matches_dense(atoms, got, 0.0, 0.0, only=[0, 1, 3])


def test_d8_through_the_looped_rows_matches_dense():
    """d = 8 on the looped row factorisation (``KernelConfig(unrolled_d=4)``: row tiles
    padded to 16), interpret mode: a two-chunk atom and a one-row atom, borders in both K
    groups, against the dense oracle."""
    from gpustat.border import BorderSolution
    from gpustat.pallas.border import KernelConfig, solve_border_pallas

    rng = np.random.default_rng(9)
    atoms = [random_pd_atom(rng, n, 8, k) for n, k in ((20, 5), (1, 12), (6, 17))]
    batch = batch_of(atoms)
    ridges = np.full(len(atoms), RIDGE)
    out = solve_border_pallas(batch.layout, batch.H_tt, batch.H_tb, batch.g_t, batch.H_bb,
                              batch.g_b, ridges, ridges, interpret=True,
                              config=KernelConfig(unrolled_d=4))
    assert_matches_dense(atoms, BorderSolution(*out, layout=batch.layout), RIDGE, RIDGE)

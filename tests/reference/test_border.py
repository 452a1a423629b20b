"""Reference border solves vs the dense LAPACK oracle and the spec's golden values."""

from __future__ import annotations

import numpy as np
import pytest

from gpustat.border import BorderBatch, retry_failed, solve_batched_border
from tests.oracles.border_dense import assert_matches_dense
from tests.oracles.border_fixtures import pcg_system
from tests.oracles.border_golden import (
    GOLDEN_D2,
    GOLDEN_RIDGE,
    check_golden,
    failing_d2_atoms,
    golden_d2_atoms,
    random_pd_atoms,
    schur_and_nonfinite_d2_atoms,
)

BACKEND = "reference"


def solve(atoms, ridge_t, ridge_beta, backend=BACKEND):
    batch = BorderBatch.from_atoms(*zip(*atoms, strict=True))
    return batch, solve_batched_border(batch, ridge_t, ridge_beta, backend=backend)


def test_golden_values_and_dense_parity():
    atoms = golden_d2_atoms()
    _, sol = solve(atoms, GOLDEN_RIDGE, GOLDEN_RIDGE)
    check_golden(sol, GOLDEN_D2)
    assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE)


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_random_pd_batches_match_dense(d):
    atoms = random_pd_atoms(d)
    _, sol = solve(atoms, GOLDEN_RIDGE, GOLDEN_RIDGE)
    assert np.all(np.asarray(sol.status) == 0)
    assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE)
    if d == 1:  # atom 2 is the spec's pd_k1_system(3, 1, 2, 1.0)
        check_golden(sol, [None, None, (3, 1, 2, 1.0)])


def test_row_failures_per_atom_with_bump():
    atoms = failing_d2_atoms()
    _, sol = solve(atoms, 0.0, 0.0)
    np.testing.assert_array_equal(sol.status, [1, 1, 0])
    np.testing.assert_array_equal(sol.row, [2, 0, -1])
    bump = np.asarray(sol.bump)
    # Gershgorin deficit of -I is 1 and of -2 I is 2; the bump adds only a rounding margin.
    assert 1.0 < bump[0] < 1.0 + 1e-12 and 2.0 < bump[1] < 2.0 + 1e-12 and bump[2] == 0
    assert_matches_dense(atoms, sol, 0.0, 0.0)
    # The untouched atom is bit-for-bit the result of solving it alone.
    _, alone = solve(golden_d2_atoms(), 0.0, 0.0)
    np.testing.assert_array_equal(sol.atom(2)[1], alone.atom(2)[1])


def test_schur_failure_and_nonfinite_input_per_atom():
    atoms = schur_and_nonfinite_d2_atoms()
    _, sol = solve(atoms, GOLDEN_RIDGE, GOLDEN_RIDGE)
    np.testing.assert_array_equal(sol.status, [2, 3, 0])
    np.testing.assert_array_equal(sol.row, [-1, -1, -1])
    assert sol.bump[0] > 2.0 and sol.bump[1] == 0
    assert np.isnan(sol.log_det[1]) and np.all(np.isnan(sol.atom(1)[0]))
    assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE, only=[2])


def test_retry_fixes_spec_row_failure():
    """Spec B.8: n=4, d=8, k=3 with row 2 = -I at ridge 0 -> row 2, bump > 0; retry succeeds."""
    atom = pcg_system(4, 8, 3, seed=7)
    H_tt = atom[0].copy()
    H_tt[2] = -np.eye(8)
    atoms = [(H_tt, *atom[1:])]
    batch, sol = solve(atoms, 0.0, 0.0)
    assert int(sol.status[0]) == 1 and int(sol.row[0]) == 2 and float(sol.bump[0]) > 0
    fixed, ridge_t, ridge_beta = retry_failed(batch, sol, 0.0, 0.0, backend=BACKEND)
    assert int(fixed.status[0]) == 0
    assert float(ridge_t[0]) >= float(sol.bump[0])
    # Round 1 makes row 2 barely PD (block ~1e-15 I), which leaves the Schur complement
    # indefinite (status 2); round 2 bumps ridge_beta. Both rounds are the spec's rule.
    assert float(ridge_beta[0]) > 0
    assert_matches_dense(atoms, fixed, ridge_t, ridge_beta)


def test_empty_batch_is_an_empty_result():
    batch = BorderBatch.from_atoms([], [], [], [], [], d=2)
    sol = solve_batched_border(batch, 0.0, 0.0, backend=BACKEND)
    assert sol.delta_t.shape == (0, 2) and sol.delta_beta.shape == (0,)
    assert sol.log_det.shape == sol.status.shape == sol.row.shape == sol.bump.shape == (0,)


@pytest.mark.slow
@pytest.mark.parametrize("n, d, k, ridge", [
    (8, 6, 4, 0.0), (12, 10, 5, 0.0), (8, 16, 5, 0.0), (4, 30, 5, 0.0),
    (6, 12, 4, 1e-12), (6, 12, 4, 1e-9), (6, 12, 4, 1e-6), (6, 12, 4, 1e-3), (6, 12, 4, 1e-2),
    (5, 8, 3, 1e-8), (10, 12, 4, 1e-8), (3, 20, 6, 1e-8), (6, 8, 3, 0.0),
])
def test_spec_arrow_schur_validation_grid(n, d, k, ridge):
    """Spec B.8 single-system parity grid (PCG fixture), d beyond the kernel's range."""
    atoms = [pcg_system(n, d, k, seed=n * 100 + d)]
    _, sol = solve(atoms, ridge, ridge)
    assert_matches_dense(atoms, sol, ridge, ridge)

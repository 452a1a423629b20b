"""Border regressions: retries with several failing rows, ridges that overflow the compute
dtype, subset indices, float64 input without 64-bit JAX. Expected values come from a dense
numpy assembly of each atom (solve and slogdet), not from gpustat's solvers."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.linalg import block_diag

from gpustat.border import BorderBatch, retry_failed, solve_batched_border
from tests.oracles.border_fixtures import random_pd_atom


def lists(atoms):
    return [list(x) for x in zip(*atoms, strict=True)]


def dense_step(atom, ridge_t, ridge_beta):
    """``(delta_t (n, d), delta_beta (k,), log_det)`` from the assembled ridged matrix."""
    H_tt, H_tb, g_t, H_bb, g_b = atom
    n, d, _ = H_tt.shape
    cross = H_tb.reshape(n * d, -1)
    H = np.block([[block_diag(*H_tt) + ridge_t * np.eye(n * d), cross],
                  [cross.T, H_bb + ridge_beta * np.eye(H_bb.shape[0])]])
    delta = np.linalg.solve(H, -np.concatenate([g_t.reshape(-1), g_b]))
    sign, log_det = np.linalg.slogdet(H)
    assert sign > 0
    return delta[:n * d].reshape(n, d), delta[n * d:], log_det


def several_failing_rows_atom():
    """Rows 1..5 are -r I (d = 2), each more indefinite than the one before, so a ridge
    increase that fixes only the first failing row leaves the next one failing. One atom,
    so every retry round reuses the first round's compiled solve."""
    atom = list(random_pd_atom(np.random.default_rng(11), 7, 2, 3))
    for r in range(1, 6):
        atom[0][r] = -r * np.eye(2)
    return tuple(atom)


def test_retry_bumps_the_row_ridge_past_every_failing_row():
    atom = several_failing_rows_atom()
    batch = BorderBatch.from_atoms(*([x] for x in atom))
    sol = solve_batched_border(batch, 0.0, 0.0, backend="reference")
    assert (int(sol.status[0]), int(sol.row[0])) == (1, 1)
    # The first failing row's bump (-I: ~1) is below the worst row's need (-5 I: 5).
    assert 1 <= float(sol.bump[0]) < 1 + 1e-12
    fixed, ridge_t, ridge_beta = retry_failed(batch, sol, 0.0, 0.0, backend="reference")
    assert int(fixed.status[0]) == 0
    assert 5 < float(ridge_t[0]) < 5 + 1e-12
    dt, db, ld = dense_step(atom, float(ridge_t[0]), float(ridge_beta[0]))
    got_dt, got_db = (np.asarray(x) for x in fixed.atom(0))
    # a minimal bump leaves row 5 nearly singular: compare on the steps' own scale
    scale = max(np.abs(dt).max(), np.abs(db).max())
    assert np.abs(got_dt - dt).max() <= 1e-6 * scale
    assert np.abs(got_db - db).max() <= 1e-6 * scale
    assert abs(float(fixed.log_det[0]) - ld) <= 1e-8 * (1 + abs(ld))


def test_a_ridge_that_overflows_float32_is_rejected():
    rng = np.random.default_rng(12)
    atoms = [random_pd_atom(rng, 3, 2, 2)]
    f32 = BorderBatch.from_atoms(*([np.asarray(x, np.float32) for x in xs]
                                   for xs in lists(atoms)))
    for ridge_t, ridge_beta, name in ((1e39, 0.0, "ridge_t"), (0.0, [1e39], "ridge_beta")):
        with pytest.raises(ValueError, match=f"{name} must be finite and >= 0 in float32"):
            solve_batched_border(f32, ridge_t, ridge_beta, backend="reference")
    # The same ridge is finite in float64 and solves.
    sol = solve_batched_border(BorderBatch.from_atoms(*lists(atoms)), 1e39, 0.0,
                               backend="reference")
    assert int(sol.status[0]) == 0
    want = dense_step(atoms[0], 1e39, 0.0)[2]
    assert abs(float(sol.log_det[0]) - want) <= 1e-12 * abs(want)


def test_subset_checks_and_wraps_atom_indices():
    rng = np.random.default_rng(13)
    atoms = [random_pd_atom(rng, n, 2, k) for n, k in ((3, 2), (1, 4), (2, 1))]
    batch = BorderBatch.from_atoms(*lists(atoms))
    sub = batch.subset([-1, 0])
    for got, want in zip(sub.atom(0) + sub.atom(1), atoms[2] + atoms[0], strict=True):
        np.testing.assert_array_equal(got, want)
    for bad in ([3], [0, -4]):
        with pytest.raises(IndexError, match=f"atom index {bad[-1]} out of range for 3 atoms"):
            batch.subset(bad)
    with pytest.raises(TypeError, match="atoms must be a 1-D integer sequence"):
        batch.subset([0.5])


def test_float64_input_without_x64_is_rejected():
    atom = [np.eye(2)[None], np.zeros((1, 2, 1)), np.ones((1, 2)), np.eye(1), np.ones(1)]
    with jax.enable_x64(False):
        with pytest.raises(TypeError, match=r"H_tt\[0\] is float64 but jax_enable_x64 is off"):
            BorderBatch.from_atoms(*([x] for x in atom))
        f32 = BorderBatch.from_atoms(*([x.astype(np.float32)] for x in atom))
    assert f32.H_tt.dtype == np.float32

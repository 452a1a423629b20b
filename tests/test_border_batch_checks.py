"""Border regressions: batch arrays checked against the layout at solve time (a batch built
with the constructor or ``dataclasses.replace`` skips ``from_packed``), no silent down-cast
of a batch with mixed dtypes, integer layout counts, wrong argument types named. Expected
values come from a dense numpy assembly of each atom (cho_factor and slogdet), not from
gpustat's solvers."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import block_diag, cho_factor, cho_solve

from gpustat.border import (
    BorderBatch,
    BorderLayout,
    BorderSolution,
    retry_failed,
    solve_batched_border,
)


def pd_atom(rng, n, d, k):
    A = rng.standard_normal((n, d, d))
    B = rng.standard_normal((k, k))
    return (A @ A.transpose(0, 2, 1) + (d + 1) * np.eye(d), 0.3 * rng.standard_normal((n, d, k)),
            rng.standard_normal((n, d)), B @ B.T + (n + k + 1) * np.eye(k),
            rng.standard_normal(k))


def dense_step(atom, ridge_t, ridge_beta):
    """``(delta_t (n, d), delta_beta (k,), log_det)`` of the assembled ridged matrix."""
    H_tt, H_tb, g_t, H_bb, g_b = (np.asarray(x, np.float64) for x in atom)
    n, d, _ = H_tt.shape
    cross = H_tb.reshape(n * d, -1)
    H = np.block([[block_diag(*H_tt) + ridge_t * np.eye(n * d), cross],
                  [cross.T, H_bb + ridge_beta * np.eye(H_bb.shape[0])]])
    delta = cho_solve(cho_factor(H, lower=True), -np.concatenate([g_t.reshape(-1), g_b]))
    sign, log_det = np.linalg.slogdet(H)
    assert sign > 0
    return delta[:n * d].reshape(n, d), delta[n * d:], log_det


@pytest.fixture
def atoms():
    rng = np.random.default_rng(11)
    return [pd_atom(rng, 3, 2, 2), pd_atom(rng, 1, 2, 3), pd_atom(rng, 4, 2, 1)]


@pytest.fixture
def batch(atoms):
    return BorderBatch.from_atoms(*(list(x) for x in zip(*atoms, strict=True)))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_solve_rejects_batch_arrays_that_disagree_with_the_layout(batch, backend):
    # The solves gather out-of-range packed entries as zeros: a short g_t used to solve
    # (status 0) with the last row's gradient silently taken as 0, a long g_b silently cut.
    short = dataclasses.replace(batch, g_t=batch.g_t[:-1])
    with pytest.raises(ValueError, match=r"batch\.g_t: expected shape \(8, 2\)"):
        solve_batched_border(short, 0.0, 0.0, backend=backend)
    long = dataclasses.replace(batch, g_b=jnp.concatenate([batch.g_b, batch.g_b]))
    with pytest.raises(ValueError, match=r"batch\.g_b"):
        solve_batched_border(long, 0.0, 0.0, backend=backend)
    with pytest.raises(ValueError, match=r"batch\.H_tb"):
        retry_failed(dataclasses.replace(batch, H_tb=batch.H_tb[1:]),
                     solve_batched_border(batch, 0.0, 0.0, backend=backend), 0.0, 0.0,
                     backend=backend)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_a_float32_row_block_does_not_round_the_float64_rest(atoms, batch, backend):
    # H_tt replaced by a float32 copy used to make the whole solve float32 (the other,
    # float64 arrays silently down-cast; errors ~1e-8 against the oracle).
    narrow = dataclasses.replace(batch, H_tt=batch.H_tt.astype(jnp.float32))
    sol = solve_batched_border(narrow, 1e-6, 1e-6, backend=backend)
    assert sol.delta_t.dtype == sol.log_det.dtype == jnp.float64
    for a, (H_tt, *rest) in enumerate(atoms):
        dt, db, log_det = dense_step((H_tt.astype(np.float32), *rest), 1e-6, 1e-6)
        got_t, got_b = sol.atom(a)
        np.testing.assert_allclose(got_t, dt, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_b, db, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sol.log_det[a], log_det, rtol=1e-12)


@pytest.mark.parametrize("counts", [[2.7, 1.0], [True, True], ["2", "1"]])
def test_layout_counts_must_be_integers(counts):
    # [2.7, 1.0] used to become 2 rows and 1 row without a word.
    with pytest.raises(TypeError, match="n_rows must be integers"):
        BorderLayout(2, counts, [1, 1])
    with pytest.raises(TypeError, match="k_dims must be integers"):
        BorderLayout(2, [1, 1], counts)


def test_wrong_argument_types_are_type_errors_naming_them(batch):
    sol = solve_batched_border(batch, 0.0, 0.0, backend="reference")
    assert isinstance(sol, BorderSolution)
    with pytest.raises(TypeError, match="batch must be a BorderBatch"):
        solve_batched_border(batch.layout, 0.0, 0.0, backend="reference")
    with pytest.raises(TypeError, match="layout must be a BorderLayout"):
        BorderBatch.from_packed((2, [3], [2]), batch.H_tt, batch.H_tb, batch.g_t,
                                batch.H_bb, batch.g_b)
    with pytest.raises(TypeError, match="solution must be a BorderSolution"):
        retry_failed(batch, (sol.delta_t, sol.delta_beta), 0.0, 0.0, backend="reference")
    with pytest.raises(TypeError, match="batch must be a BorderBatch"):
        retry_failed(batch.layout, sol, 0.0, 0.0, backend="reference")
    for bad in (None, "1e-6"):
        with pytest.raises(TypeError, match="ridge_beta must be a real scalar"):
            solve_batched_border(batch, 0.0, bad, backend="reference")

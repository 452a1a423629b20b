"""Public border API: packing, bad input, jit and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpustat
from gpustat.border import BorderBatch, BorderSolution, solve_batched_border
from gpustat.border_layout import BorderLayout
from tests.helpers import assert_close
from tests.oracles.border_dense import assert_matches_dense
from tests.oracles.border_golden import GOLDEN_RIDGE, golden_d2_atoms


def lists(atoms):
    return [list(x) for x in zip(*atoms, strict=True)]


@pytest.fixture(scope="module")
def atoms():
    return golden_d2_atoms()


@pytest.fixture(scope="module")
def batch(atoms):
    return BorderBatch.from_atoms(*lists(atoms))


def test_packing_round_trip_and_subset(atoms, batch):
    assert batch.layout == BorderLayout(2, [5, 4, 6], [3, 2, 3])
    assert batch.H_tt.shape == (15, 2, 2) and batch.H_tb.shape == (5 * 6 + 4 * 4 + 6 * 6,)
    for a, atom in enumerate(atoms):
        for got, want in zip(batch.atom(a), atom, strict=True):
            np.testing.assert_array_equal(got, want)
    sub = batch.subset([2, 0])
    for got, want in zip(sub.atom(0), atoms[2], strict=True):
        np.testing.assert_array_equal(got, want)
    assert hash(sub.layout) == hash(BorderLayout(2, [6, 5], [3, 3]))


def test_jit_matches_eager_and_dense(atoms, batch):
    solve = jax.jit(solve_batched_border, static_argnames="backend")
    sol = solve(batch, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
    assert isinstance(sol, BorderSolution)
    eager = solve_batched_border(batch, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
    assert_close(sol.delta_t, eager.delta_t, rtol=1e-15)
    assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE)
    # The ridges were traced jit arguments: value checks are skipped, the solve is the same.


def test_vmap_over_batch_values_and_ridges(atoms, batch):
    scales = jnp.array([1.0, 2.0])
    stacked = jax.vmap(lambda s: solve_batched_border(
        BorderBatch(batch.H_tt * s, batch.H_tb, batch.g_t, batch.H_bb * s, batch.g_b,
                    batch.layout), GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference"))(scales)
    for i, s in enumerate([1.0, 2.0]):
        scaled = [(H_tt * s, H_tb, g_t, H_bb * s, g_b) for H_tt, H_tb, g_t, H_bb, g_b in atoms]
        one = BorderSolution(*(x[i] for x in (stacked.delta_t, stacked.delta_beta,
                                              stacked.log_det, stacked.status, stacked.row,
                                              stacked.bump)), layout=batch.layout)
        assert_matches_dense(scaled, one, GOLDEN_RIDGE, GOLDEN_RIDGE)
    per_atom = jax.vmap(lambda r: solve_batched_border(batch, r, 0.0, backend="reference"))(
        jnp.array([[1e-6, 1e-3, 0.1], [0.0, 1.0, 2.0]]))
    assert per_atom.log_det.shape == (2, 3)
    assert_matches_dense(atoms, BorderSolution(
        per_atom.delta_t[1], per_atom.delta_beta[1], per_atom.log_det[1], per_atom.status[1],
        per_atom.row[1], per_atom.bump[1], batch.layout), [0.0, 1.0, 2.0], 0.0)


def test_float32_and_integer_inputs(atoms):
    f32 = BorderBatch.from_atoms(*[[np.asarray(x, np.float32) for x in xs] for xs in lists(atoms)])
    sol = solve_batched_border(f32, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
    assert sol.delta_t.dtype == jnp.float32 and sol.bump.dtype == jnp.float32
    assert_matches_dense(atoms, sol, GOLDEN_RIDGE, GOLDEN_RIDGE, rtol=1e-5)
    eye = BorderBatch.from_atoms([np.eye(2, dtype=int)[None]], [np.zeros((1, 2, 1), int)],
                                 [np.ones((1, 2), int)], [np.eye(1, dtype=int)], [np.ones(1, int)])
    assert jnp.issubdtype(eye.H_tt.dtype, jnp.floating)


def _bad(atoms, index, part, value):
    columns = lists(atoms)
    columns[part][index] = value
    return columns


@pytest.mark.parametrize("case, match", [
    (lambda a: _bad(a, 1, 1, np.zeros((4, 2, 3))), r"H_tb\[1\]"),
    (lambda a: _bad(a, 0, 2, np.zeros((5, 3))), r"g_t\[0\]"),
    (lambda a: _bad(a, 2, 3, np.zeros((3, 2))), r"H_bb\[2\].*square"),
    (lambda a: _bad(a, 2, 4, np.zeros(4)), r"g_b\[2\]"),
    (lambda a: _bad(a, 1, 0, np.zeros((4, 3, 3))), r"H_tt\[1\].*uniform d"),
    (lambda a: [c[:2] if i == 4 else c for i, c in enumerate(lists(a))], "one length per atom"),
])
def test_from_atoms_rejects_mismatched_shapes(atoms, case, match):
    with pytest.raises(ValueError, match=match):
        BorderBatch.from_atoms(*case(atoms))


def test_border_wider_than_32_is_rejected():
    n, d, k = 2, 2, 33
    with pytest.raises(ValueError, match="k_a must be <= 32"):
        BorderBatch.from_atoms([np.eye(d)[None].repeat(n, 0)], [np.zeros((n, d, k))],
                               [np.zeros((n, d))], [np.eye(k)], [np.zeros(k)])


def test_complex_input_is_a_type_error(atoms):
    columns = lists(atoms)
    columns[4][0] = columns[4][0].astype(complex)
    with pytest.raises(TypeError, match=r"g_b\[0\]"):
        BorderBatch.from_atoms(*columns)


def test_from_packed_checks_shapes(batch):
    with pytest.raises(ValueError, match="H_tb: expected shape"):
        BorderBatch.from_packed(batch.layout, batch.H_tt, batch.H_tb[:-1], batch.g_t,
                                batch.H_bb, batch.g_b)


@pytest.mark.parametrize("ridge_t, ridge_beta, error, match", [
    (-1e-3, 0.0, ValueError, "ridge_t must be finite and >= 0"),
    (0.0, -1.0, ValueError, "ridge_beta must be finite and >= 0"),
    (np.nan, 0.0, ValueError, "ridge_t must be finite"),
    (np.zeros(2), 0.0, ValueError, r"ridge_t must be a scalar or shape \(3,\)"),
    (0.0, 1j, TypeError, "ridge_beta must be real"),
])
def test_bad_ridges(batch, ridge_t, ridge_beta, error, match):
    with pytest.raises(error, match=match):
        solve_batched_border(batch, ridge_t, ridge_beta, backend="reference")


def test_backend_errors(batch):
    with pytest.raises(ValueError, match="backend must be one of"):
        solve_batched_border(batch, 0.0, 0.0, backend="cuda")
    if not gpustat.available_backends()[0] == "pallas":
        with pytest.raises(gpustat.BackendUnavailableError):
            solve_batched_border(batch, 0.0, 0.0, backend="pallas")
    wide = BorderBatch.from_atoms([np.eye(9)[None]], [np.zeros((1, 9, 1))], [np.zeros((1, 9))],
                                  [np.eye(1)], [np.zeros(1)])
    with pytest.raises(ValueError, match="d <= 8"):
        solve_batched_border(wide, 0.0, 0.0, backend="interpret")


def test_empty_atoms_list_gives_empty_result():
    sol = solve_batched_border(BorderBatch.from_atoms([], [], [], [], []), 0.0, 0.0)
    assert sol.delta_t.shape == (0, 1) and sol.status.shape == (0,)

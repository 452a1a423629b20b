"""Public border API: packing, bad input, jit and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gpustat
from gpustat.border import BorderBatch, BorderSolution, retry_failed, solve_batched_border
from gpustat.reference.border import BorderLayout
from tests.helpers import KERNEL_BACKENDS, assert_close
from tests.oracles.border_dense import assert_matches_dense
from tests.oracles.border_fixtures import random_batch, random_pd_atom
from tests.oracles.border_golden import GOLDEN_RIDGE, failing_d2_atoms, golden_d2_atoms

#: Every backend: the reference, the kernel in interpret mode and compiled (gpu marker).
BACKENDS = [pytest.param("reference", id="reference"), *KERNEL_BACKENDS]


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
    # atom 1's d = 3 is its own (a mixed-d batch), so its d = 2 cross blocks mismatch
    (lambda a: _bad(a, 1, 0, np.zeros((4, 3, 3))), r"H_tb\[1\]: expected \(4, 3, "),
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
    wide = BorderBatch.from_atoms([np.eye(33)[None]], [np.zeros((1, 33, 1))],
                                  [np.zeros((1, 33))], [np.eye(1)], [np.zeros(1)])
    with pytest.raises(ValueError, match="d <= 32"):
        solve_batched_border(wide, 0.0, 0.0, backend="interpret")


def test_empty_atoms_list_gives_empty_result():
    sol = solve_batched_border(BorderBatch.from_atoms([], [], [], [], []), 0.0, 0.0)
    assert sol.delta_t.shape == (0, 1) and sol.status.shape == (0,)


@pytest.mark.parametrize("d, match", [
    (2.5, "d=2.5"), (0, "d=0"), (-1, "d=-1"), (True, "d=True"), ("2", "d='2'")])
def test_from_atoms_rejects_a_bad_d(atoms, d, match):
    for columns in (lists(atoms), [[], [], [], [], []]):
        with pytest.raises(ValueError, match=f"d must be an integer >= 1, got {match}"):
            BorderBatch.from_atoms(*columns, d=d)
    assert BorderBatch.from_atoms([], [], [], [], [], d=np.int64(3)).layout.d == 3


@pytest.mark.parametrize("value, match", [
    (np.zeros((3, 0, 0)), r"H_tt\[0\]: the row dimension d must be >= 1"),
    (np.zeros((5, 2)), r"H_tt\[0\]: expected \(n_a, d, d\), got 2-D"),
    (np.zeros((5, 2, 3)), r"H_tt\[0\]: expected \(n_a, d, d\), got 3-D"),
])
def test_from_atoms_rejects_a_bad_first_row_block(atoms, value, match):
    with pytest.raises(ValueError, match=match):
        BorderBatch.from_atoms(*_bad(atoms, 0, 0, value))


def test_atom_indices_count_from_the_end_and_are_range_checked(atoms, batch):
    sol = solve_batched_border(batch, GOLDEN_RIDGE, GOLDEN_RIDGE, backend="reference")
    for got, want in zip(batch.atom(-1), atoms[2], strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(sol.atom(-3), sol.atom(0), strict=True):
        np.testing.assert_array_equal(got, want)
    for a in (3, -4):
        with pytest.raises(IndexError, match=f"atom index {a} out of range for 3 atoms"):
            batch.atom(a)
        with pytest.raises(IndexError, match=f"atom index {a} out of range for 3 atoms"):
            sol.atom(a)
    with pytest.raises(TypeError):
        sol.atom(1.0)


def test_retry_failed_rejects_a_solution_of_another_batch(batch):
    failing = BorderBatch.from_atoms(*lists(failing_d2_atoms()))
    other = BorderBatch.from_atoms(*lists(golden_d2_atoms()[::-1]))
    sol = solve_batched_border(failing, 0.0, 0.0, backend="reference")
    for wrong in (batch.subset([0, 1]), other):
        with pytest.raises(ValueError, match="solution is not a solution of batch"):
            retry_failed(wrong, sol, 0.0, 0.0, backend="reference")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", [[(4, 0)], [(0, 3)], [(3, 0), (5, 0)], [(0, 0)],
                                   [(0, 3), (2, 0)], [(0, 2), (0, 3)]])
def test_empty_packed_arrays_match_dense(backend, sizes):
    """Batches with an empty packed array: H_tb (every n_a k_a = 0), H_bb and g_b (every
    k_a = 0: the rows alone), H_tt and g_t (every n_a = 0: the borders alone)."""
    atoms = random_batch(8, sizes, 2)
    batch = BorderBatch.from_atoms(*lists(atoms))
    assert batch.H_tb.size == 0
    sol = solve_batched_border(batch, 0.1, 0.2, backend=backend)
    np.testing.assert_array_equal(sol.status, 0)
    assert_matches_dense(atoms, sol, 0.1, 0.2)


def overflow_atoms():
    """Finite float64 atoms (d = 2): Y^T Y overflows (H_tb = 1e200: S0 = -inf, its Gershgorin
    bump NaN), Y^T u overflows (g_t = 1e300: r = inf, S0 finite), a row -1e308 I (status 1
    with an infinite bump: its Gershgorin bound overflows), a row -I (status 1, finite
    bump), a clean atom."""
    rng = np.random.default_rng(4)
    atoms = [list(random_pd_atom(rng, 3, 2, 2)) for _ in range(5)]
    atoms[0][1] = np.full((3, 2, 2), 1e200)
    atoms[1][1] = np.full((3, 2, 2), 1e10)
    atoms[1][2] = np.full((3, 2), 1e300)
    atoms[2][0][1] = -1e308 * np.eye(2)
    atoms[3][0][1] = -np.eye(2)
    return [tuple(atom) for atom in atoms]


@pytest.mark.parametrize("backend", BACKENDS)
def test_overflow_is_nonfinite_and_retry_skips_nonfinite_bumps(backend):
    """Status 3 when S0 or r overflows from finite inputs (the dense oracle factors the
    assembled matrix and has no such status); the retry leaves those atoms and the one
    with an infinite bump failed at their ridges, and fixes the -I row."""
    atoms = overflow_atoms()
    batch = BorderBatch.from_atoms(*lists(atoms))
    sol = solve_batched_border(batch, 0.0, 0.0, backend=backend)
    np.testing.assert_array_equal(sol.status, [3, 3, 1, 1, 0])
    np.testing.assert_array_equal(sol.row, [-1, -1, 1, 1, -1])
    bump = np.asarray(sol.bump)
    assert bump[0] == bump[1] == 0 and np.isposinf(bump[2]) and 1 < bump[3] < 1 + 1e-12
    assert np.all(np.isnan(np.asarray(sol.log_det)[:4]))
    assert_matches_dense(atoms, sol, 0.0, 0.0, only=[2, 3, 4])
    fixed, ridge_t, ridge_beta = retry_failed(batch, sol, 0.0, 0.0, backend=backend)
    np.testing.assert_array_equal(fixed.status, [3, 3, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(ridge_t)[[0, 1, 2, 4]], 0.0)
    np.testing.assert_array_equal(np.asarray(ridge_beta)[[0, 1, 2, 4]], 0.0)
    assert_matches_dense(atoms, fixed, ridge_t, ridge_beta, only=[2, 3, 4])


def test_layouts_and_retry_rounds_are_checked():
    with pytest.raises(ValueError, match="d must be an integer >= 1"):
        BorderLayout(0, [3], [2])
    with pytest.raises(ValueError, match="one length"):
        BorderLayout(2, [3, 4], [2])
    with pytest.raises(ValueError, match=">= 0"):
        BorderLayout(2, [3, -1], [2, 2])
    assert BorderLayout(np.int64(2), [3], [2]) == BorderLayout(2, [3], [2])
    batch = BorderBatch.from_atoms(*lists([(np.eye(2)[None], np.ones((1, 2, 1)), np.ones((1, 2)),
                                            np.eye(1), np.ones(1))]))
    sol = solve_batched_border(batch, 1e-6, 1e-6, backend="reference")
    with pytest.raises(ValueError, match="max_rounds must be an integer >= 0"):
        retry_failed(batch, sol, 1e-6, 1e-6, max_rounds=-1)

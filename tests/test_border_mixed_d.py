"""Border batches whose atoms have different row dimensions d (reference path and packing)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gpustat import _backend
from gpustat.border import BorderBatch, retry_failed, solve_batched_border
from gpustat.reference.border import BorderLayout
from tests.oracles.border_dense import assert_matches_dense, dense_solve
from tests.oracles.border_fixtures import random_pd_atom

# (n_a, d_a, k_a): d from 1 to 32, ragged rows (one empty atom), borders up to 17.
MIXED = [(3, 9, 2), (2, 1, 1), (20, 17, 3), (0, 16, 4), (2, 32, 17), (4, 3, 2), (1, 16, 5)]


def mixed_atoms(sizes=MIXED, seed=0):
    rng = np.random.default_rng(seed)
    return [random_pd_atom(rng, n, d, k) for n, d, k in sizes]


def batch_of(atoms, dtype=np.float64):
    return BorderBatch.from_atoms(*([np.asarray(x, dtype) for x in xs]
                                    for xs in zip(*atoms, strict=True)))


@pytest.fixture(scope="module")
def atoms():
    return mixed_atoms()


@pytest.fixture(scope="module")
def batch(atoms):
    return batch_of(atoms)


def test_mixed_layout_offsets_and_packing(atoms, batch):
    """Per-atom d packs H_tt and g_t flat; offsets are prefix sums of n_a d_a^2, n_a d_a and
    n_a d_a k_a (numpy arithmetic here); atom() and subset() give back the inputs."""
    lay = batch.layout
    n, d, k = (np.array(c) for c in zip(*MIXED))
    assert not lay.uniform and lay.max_d == 32
    np.testing.assert_array_equal(lay.row_dims, d)
    assert batch.H_tt.shape == (int(np.sum(n * d * d)),)
    assert batch.g_t.shape == (int(np.sum(n * d)),)
    assert batch.H_tb.shape == (int(np.sum(n * d * k)),)
    np.testing.assert_array_equal(lay.tt_offsets[1:], np.cumsum(n * d * d))
    np.testing.assert_array_equal(lay.gt_offsets[1:], np.cumsum(n * d))
    for a in (0, 2, 4, -1):
        for got, want in zip(batch.atom(a), atoms[a], strict=True):
            np.testing.assert_array_equal(got, want)
    sub = batch.subset([4, 0])
    assert not sub.layout.uniform and list(sub.layout.row_dims) == [32, 9]
    for got, want in zip(sub.atom(0), atoms[4], strict=True):
        np.testing.assert_array_equal(got, want)
    assert [d for d, _ in lay.dim_groups()] == [1, 3, 9, 16, 17, 32]


def test_equal_d_packs_uniform_and_layouts_compare_by_content(atoms):
    """All-equal d keeps the (N, d, d) packing; a per-atom d array is its own layout."""
    uniform = batch_of([atoms[0], atoms[0]])
    assert uniform.layout.uniform and uniform.H_tt.shape == (6, 9, 9)
    n, k = np.array([3, 3]), np.array([2, 2])
    assert BorderLayout(9, n, k) == uniform.layout
    assert BorderLayout(np.array([9, 9]), n, k) != uniform.layout
    assert BorderLayout(np.array([9, 4]), n, k) == BorderLayout(np.array([9, 4]), n, k)
    assert hash(BorderLayout(np.array([9, 4]), n, k)) == hash(BorderLayout(np.array([9, 4]), n, k))


@pytest.mark.parametrize("d, error, match", [
    (np.array([2, 0]), ValueError, "per-atom d must be >= 1"),
    (np.array([2]), ValueError, r"per-atom d must have shape \(2,\)"),
    (np.array([2.0, 3.0]), TypeError, "per-atom d must be integers"),
])
def test_bad_per_atom_d(d, error, match):
    with pytest.raises(error, match=match):
        BorderLayout(d, np.array([1, 2]), np.array([1, 1]))


def test_reference_matches_dense(atoms, batch):
    sol = solve_batched_border(batch, 1e-6, 1e-6, backend="reference")
    assert sol.delta_t.shape == batch.g_t.shape
    assert_matches_dense(atoms, sol, 1e-6, 1e-6)


def test_jit_of_a_mixed_batch_matches_eager(batch):
    batch = batch.subset([0, 1])  # d = 9 and 1
    eager = solve_batched_border(batch, 1e-6, 2e-6, backend="reference")
    jitted = jax.jit(lambda b: solve_batched_border(b, 1e-6, 2e-6, backend="reference"))(batch)
    for name in ("delta_t", "delta_beta", "log_det", "status"):
        np.testing.assert_allclose(getattr(jitted, name), getattr(eager, name), rtol=1e-13)


def test_retry_of_a_mixed_batch_fixes_a_bad_d9_row(atoms):
    """A d = 9 atom with an indefinite row 1 fails alone; the retry (with a bump above the
    minimal one) matches the dense oracle at its final ridge, the other atoms untouched."""
    bad = list(atoms)
    H_tt = bad[0][0].copy()
    H_tt[1] = -np.eye(9)
    bad[0] = (H_tt, *bad[0][1:])
    batch = batch_of(bad)
    first = solve_batched_border(batch, 1e-6, 1e-6, backend="reference")
    assert list(np.asarray(first.status)) == [1, 0, 0, 0, 0, 0, 0] and first.row[0] == 1
    assert dense_solve(*bad[0], 1e-6, 1e-6)[:2] == (1, 1)
    ridge_t = np.full(len(bad), 1e-6)
    ridge_t[0] += 2 * float(first.bump[0])
    sol, rt, _ = retry_failed(batch, first, ridge_t, 1e-6, backend="reference")
    assert np.all(np.asarray(sol.status) == 0)
    assert_matches_dense(bad, sol, np.asarray(rt), 1e-6, rtol=1e-8)
    np.testing.assert_array_equal(sol.delta_t[batch.layout.gt_offsets[1]:],
                                  first.delta_t[batch.layout.gt_offsets[1]:])


def test_kernel_paths_per_d_group(monkeypatch, batch):
    """On a GPU, "auto" sends d <= 8 to the fused Triton kernel (float64, k_a <= 15),
    9 <= d <= 16 to Pallas and float64 17 <= d <= 32 to the XLA reference (the backend
    table's rows); an explicit "triton" refuses d > 8, "pallas" takes d <= 32."""
    from gpustat import border

    monkeypatch.setattr(_backend, "cuda_gpu_available", lambda: True)
    monkeypatch.setattr(_backend, "triton_installed", lambda: True)
    monkeypatch.setattr(_backend, "_triton_missing", lambda: [])
    lay = batch.layout
    paths = {d: border._resolve(lay.subset(atoms), np.float64, "auto")
             for d, atoms in lay.dim_groups()}
    assert paths == {1: "triton", 3: "triton", 9: "pallas", 16: "pallas", 17: "reference",
                     32: "reference"}
    with pytest.raises(ValueError, match="triton kernel takes d <= 8, got d=9"):
        solve_batched_border(batch, 1e-6, 1e-6, backend="triton")
    for _, atoms in lay.dim_groups():
        assert border._resolve(lay.subset(atoms), np.float64, "pallas") == "pallas"


def test_sharding_a_mixed_batch_is_refused(batch):
    from gpustat import distributed

    with pytest.raises(ValueError, match="one row dimension d per batch"):
        distributed.shard_border_batch(batch, None)

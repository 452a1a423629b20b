"""BMS FLEX kernels vs the jnp reference (interpret mode here, compiled on a GPU with -m gpu)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import bms
from gpustat.pallas import bms as kernels
from gpustat.reference import bms as reference
from tests.helpers import KernelTests, assert_close, tol
from tests.oracles import bms_tables as tables


def _cells_with_every_branch(huge=1e200):
    """The spec's cells plus one per status code; ``huge`` makes q(L) overflow."""
    lo = [c[0] for c in tables.MOMENT_CELLS] + [-math.inf, 1.0, -1.0, -huge, -1.0]
    hi = [c[1] for c in tables.MOMENT_CELLS] + [0.0, -1.0, 1.0, huge, 1.0]
    coeffs = [c[2] for c in tables.MOMENT_CELLS] + [
        (0.1, 0.3, 0.5, 0.0),             # curved semi-infinite: status 2
        (0.1, 0.3, 0.0, 0.0),             # reversed: status 1
        (math.nan, 0.3, 0.0, 0.0),        # status 3
        (0.0, 1.0, 0.0, 0.0),             # q(L) overflows: status 4
        (0.1, 0.3, 1e-14, 1e-14),         # affine by tolerance
    ]
    return np.array(lo), np.array(hi), np.array(coeffs)


def _synthetic_rows(rng, counts, p_h, p_w, dtype=np.float64):
    """Stage-2 inputs with ragged cell counts (0 cells gives a degenerate row)."""
    n = len(counts)
    r = 2 + p_h + p_w
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    n_cells = int(offsets[-1])
    c = rng.normal(size=(n_cells, 4)) * [0.3, 0.5, 0.1, 0.05]
    moments = 0.4 + 0.1 * rng.random((n_cells, 10))
    status = np.zeros(n_cells, np.int32)
    status[-1] = 2
    jet = rng.normal(size=(n_cells, r, 4)) * 0.2
    jet[:, 0, 0] += 1.0                                 # F_a > 0
    r_uv = rng.normal(size=(n, r, r)) * 0.04
    arrays = [offsets, c, moments, status, jet, rng.normal(size=(n_cells, r, 4)) * 0.1,
              rng.normal(size=(n_cells, r - 1, 4)) * 0.1, 0.7 + 0.02 * np.arange(n),
              0.15 + 0.01 * np.arange(n), rng.normal(size=n), 0.9 + 0.01 * np.arange(n),
              0.2 + 0.01 * np.arange(n), rng.normal(size=(n, r)) * 0.03,
              rng.normal(size=(n, r)) * 0.02, r_uv + np.swapaxes(r_uv, 1, 2),
              rng.integers(0, 2, n).astype(float), 0.5 + rng.random(n)]
    return [a.astype(dtype) if a.dtype == np.float64 else a for a in arrays]


class TestBmsKernels(KernelTests):

    @pytest.mark.parametrize(("dtype", "order"), [(np.float64, 15), (np.float32, 9)])
    def test_cell_moments_match_reference(self, dtype, order):
        huge = 1e200 if dtype == np.float64 else 1e30
        lo, hi, coeffs = (a.astype(dtype) for a in _cells_with_every_branch(huge))
        moments, status = bms.cell_moments(lo, hi, coeffs, order=order, backend=self.backend)
        expected, expected_status = reference.cell_moments(
            jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(coeffs), order=order)
        assert moments.dtype == dtype and moments.shape == (lo.shape[0], order + 1)
        assert np.array_equal(status, expected_status)
        assert list(np.asarray(status)[-5:]) == [2, 1, 3, 4, 0]
        # relative to each cell's largest moment (zero moments come out at rounding level)
        rtol = tol(dtype, "kernel") * (1 if dtype == np.float64 else 10)
        scale = np.max(np.abs(np.asarray(expected, np.float64)), axis=1, keepdims=True)
        err = np.abs(np.asarray(moments, np.float64) - np.asarray(expected, np.float64))
        assert np.all(err <= rtol * scale), float(np.max(err / np.maximum(scale, 1e-300)))
        if dtype == np.float64:  # the spec's mpmath values (A.9.1), directly
            spec = np.array([cell[3] for cell in tables.MOMENT_CELLS])
            assert_close(np.asarray(moments)[:spec.shape[0], :10], spec, rtol=1e-12, atol=1e-15)
            # spec cell 5 is symmetric and curved (quadrature): odd moments exactly zero
            assert not np.any(np.asarray(moments)[5, 1::2])

    def test_cell_moments_blocks_with_and_without_quadrature(self):
        # blocks of 16 cells: the first all affine (the Gauss-Legendre loop is skipped),
        # the second mixed, the third partial (35 cells)
        rng = np.random.default_rng(5)
        lo = np.concatenate([np.full(16, -np.inf), rng.uniform(-2.0, 0.0, 19)])
        hi = np.concatenate([rng.uniform(-1.0, 1.0, 16), lo[16:] + rng.uniform(0.1, 1.5, 19)])
        c = rng.normal(size=(35, 4)) * [0.3, 0.5, 0.2, 0.1]
        c[:16, 2:] = 0.0
        c[16::3, 2:] = 0.0
        moments, status = kernels.cell_moments(lo, hi, c, interpret=self.backend == "interpret",
                                                   block_cells=16)
        expected, expected_status = reference.cell_moments(jnp.asarray(lo), jnp.asarray(hi),
                                                           jnp.asarray(c))
        assert np.array_equal(status, expected_status) and not np.any(np.asarray(status))
        # relative to each cell's largest moment (odd moments can cancel to ~0)
        scale = np.max(np.abs(np.asarray(expected)), axis=1, keepdims=True)
        err = np.abs(np.asarray(moments) - np.asarray(expected))
        assert np.all(err <= tol(np.float64, "kernel") * scale), float(np.max(err / scale))

    def test_cell_moments_of_narrow_affine_cells_match_mpmath(self):
        lo, hi, coeffs, expected = tables.cells_array(tables.NARROW_AFFINE_CELLS)
        moments, status = bms.cell_moments(lo, hi, coeffs, order=15, backend=self.backend)
        assert not np.any(np.asarray(status))
        assert_close(moments, expected, rtol=tol(np.float64, "oracle"))

    @pytest.mark.parametrize("block_cells", [4, 8])
    def test_row_derivatives_match_reference(self, block_cells):
        # one row per program, cells in chunks of block_cells: rows of 9 cells (3 or 2
        # chunks, the last partial), 4 and 8 (whole chunks), 1, 0 (degenerate), and a
        # last row whose last cell failed
        args = _synthetic_rows(np.random.default_rng(0), [2, 9, 1, 0, 4, 8, 3], 2, 1)
        out = kernels.row_derivatives(*args, interpret=self.backend == "interpret",
                                          block_cells=block_cells)
        expected = reference.row_derivatives(*(jnp.asarray(a) for a in args))
        for got, want in zip(out[:3], expected[:3]):
            assert_close(got, want, rtol=tol(np.float64, "kernel"), atol=1e-15)
        assert list(np.asarray(out[3])) == list(np.asarray(expected[3]))
        assert list(np.asarray(expected[3])) == [0, 0, 0, 1, 0, 0, 3]
        hess = np.asarray(out[2])
        assert np.array_equal(hess, np.swapaxes(hess, 1, 2), equal_nan=True)

    @pytest.mark.slow
    def test_row_derivatives_ragged_rows_at_production_r(self):
        # r = 20 as in production (tiles padded to 32): 13, 9, 4, 1 cells (the last cell
        # failed) and an empty row
        args = _synthetic_rows(np.random.default_rng(6), [13, 9, 4, 1, 0], 10, 8)
        out = kernels.row_derivatives(*args, interpret=self.backend == "interpret")
        expected = reference.row_derivatives(*(jnp.asarray(a) for a in args))
        for got, want in zip(out[:3], expected[:3]):
            assert_close(got, want, rtol=tol(np.float64, "kernel"), atol=1e-15)
        assert list(np.asarray(out[3])) == list(np.asarray(expected[3])) == [0, 0, 0, 3, 1]
        hess = np.asarray(out[2])
        assert np.array_equal(hess, np.swapaxes(hess, 1, 2), equal_nan=True)

    @pytest.mark.slow
    def test_row_derivatives_wide_rows(self):
        # r = 42 > 32: 64-row tiles (and the 4-warp default for them)
        args = _synthetic_rows(np.random.default_rng(7), [5, 1, 0, 6], 20, 20)
        out = kernels.row_derivatives(*args, interpret=self.backend == "interpret")
        expected = reference.row_derivatives(*(jnp.asarray(a) for a in args))
        for got, want in zip(out[:3], expected[:3]):
            assert_close(got, want, rtol=tol(np.float64, "kernel"), atol=1e-15)
        assert list(np.asarray(out[3])) == list(np.asarray(expected[3])) == [0, 0, 1, 3]

    @pytest.mark.slow
    def test_row_derivatives_float32(self):
        args = _synthetic_rows(np.random.default_rng(1), [1, 2, 5], 1, 2, dtype=np.float32)
        out = kernels.row_derivatives(*args, interpret=self.backend == "interpret")
        expected = reference.row_derivatives(*(jnp.asarray(a) for a in args))
        assert out[2].dtype == jnp.float32
        for got, want in zip(out[:3], expected[:3]):
            scale = float(np.nanmax(np.abs(want)))
            assert_close(got, want, rtol=1e-4, atol=1e-5 * scale)

    def test_joint_operators_match_dense_loops(self):
        rng = np.random.default_rng(2)
        hess, x, g = tables.random_row_hessians(rng, 37, 7, 4, 3)
        dense = tables.dense_joint_loops(hess, x, g)
        scale = np.abs(dense).max()
        v = rng.standard_normal((10, dense.shape[0]))            # 10 > 8: two launches
        rtol = tol(np.float64, "oracle")
        assert_close(bms.joint_hvp(hess, x, g, v, backend=self.backend), v @ dense, rtol=rtol,
                     atol=rtol * scale)
        assert_close(bms.joint_hvp(hess, x, g, v[0], backend=self.backend), dense @ v[0],
                     rtol=rtol, atol=rtol * scale)
        assert_close(bms.joint_diagonal(hess, x, g, backend=self.backend), np.diag(dense),
                     rtol=rtol)
        assert_close(bms.joint_dense(hess, x, g, backend=self.backend), dense, rtol=rtol,
                     atol=rtol * scale)

    def test_joint_operators_single_row_float32(self):
        rng = np.random.default_rng(3)
        hess, x, g = (a.astype(np.float32) for a in tables.random_row_hessians(rng, 1, 4, 1, 2))
        dense = tables.dense_joint_loops(hess.astype(float), x.astype(float), g.astype(float))
        v = rng.standard_normal(dense.shape[0]).astype(np.float32)
        out = bms.joint_hvp(hess, x, g, v, backend=self.backend)
        assert out.dtype == jnp.float32
        assert_close(out, dense @ v, rtol=1e-5, atol=1e-5 * np.abs(dense).max())
        assert_close(bms.joint_dense(hess, x, g, backend=self.backend), dense, rtol=1e-5,
                     atol=1e-6)

    def test_joint_operators_stream_several_blocks_per_program(self):
        # 45 rows in blocks of 16 over 2 programs: each program walks 2 blocks, the last
        # one partial. Non-symmetric Hessians: rows and columns 0, 1 of H_i both count.
        rng = np.random.default_rng(4)
        hess, x, g = tables.random_row_hessians(rng, 45, 5, 3, 2)
        hess = hess + 0.3 * rng.standard_normal(hess.shape)
        dense = tables.dense_joint_loops(hess, x, g)
        v = rng.standard_normal((3, dense.shape[0]))
        interpret = self.backend == "interpret"
        rtol = tol(np.float64, "oracle")
        scale = np.abs(dense).max() * np.abs(v).max()
        assert_close(kernels.joint_hvp(hess, x, g, v, interpret=interpret, target_programs=2),
                     v @ dense.T, rtol=rtol, atol=rtol * scale)
        assert_close(kernels.joint_dense(hess, x, g, interpret=interpret, target_programs=2),
                     dense, rtol=rtol, atol=rtol * np.abs(dense).max())

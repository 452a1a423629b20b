"""BMS FLEX reference vs independent values: mpmath moments, the rigid closed form,
mpmath quadrature, numpy loops for the joint operators."""

from __future__ import annotations

import math

import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

from gpustat.reference import bms
from tests.helpers import assert_close, tol
from tests.oracles import bms_tables as tables

RTOL = tol(np.float64, "oracle")


def _moment_cells():
    lo = np.array([c[0] for c in tables.MOMENT_CELLS])
    hi = np.array([c[1] for c in tables.MOMENT_CELLS])
    coeffs = np.array([c[2] for c in tables.MOMENT_CELLS])
    expected = np.array([c[3] for c in tables.MOMENT_CELLS])
    return lo, hi, coeffs, expected


def test_moments_match_spec_mpmath_table():
    lo, hi, coeffs, expected = _moment_cells()
    moments, status = bms.cell_moments(jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(coeffs))
    assert np.all(np.asarray(status) == 0)
    # zero moments of symmetric cells come out at rounding level: absolute floor 1e-15
    assert_close(moments, expected, rtol=RTOL, atol=1e-15)
    assert float(moments[0, 0]) == pytest.approx(
        math.sqrt(2 * math.pi) * math.erf(1 / math.sqrt(2)), rel=1e-15)


def test_moments_match_mpmath_quadrature_higher_order():
    """K = 15 on a sextic cell and an affine tail, against mpmath quadrature at 30 digits."""
    cells = [(-0.9, 1.3, (0.3, -0.4, 0.6, -0.2)), (0.4, math.inf, (0.5, -1.2, 0.0, 0.0))]
    lo = jnp.asarray([c[0] for c in cells])
    hi = jnp.asarray([c[1] for c in cells])
    coeffs = jnp.asarray([c[2] for c in cells])
    moments, status = bms.cell_moments(lo, hi, coeffs, order=15)
    assert np.all(np.asarray(status) == 0)
    mpmath.mp.dps = 30
    for row, (a, b, c) in enumerate(cells):
        def weight(z, c=c):
            eta = c[0] + c[1] * z + c[2] * z**2 + c[3] * z**3
            return mpmath.exp(-(z * z + eta * eta) / 2)
        for k in (0, 5, 11, 15):
            exact = mpmath.quad(lambda z, k=k, weight=weight: z**k * weight(z), [a, b])
            assert float(moments[row, k]) == pytest.approx(float(exact), rel=1e-12)


def test_moments_of_narrow_affine_cells_match_mpmath():
    # the closed form's upward recurrence gave m_9 of a [-0.1, 0.1] cell 0.7% off, m_15 of
    # [0.3, 0.5] 3e-6 off: such cells take Gauss-Legendre
    lo, hi, coeffs, expected = tables.cells_array(tables.NARROW_AFFINE_CELLS)
    moments, status = bms.cell_moments(jnp.asarray(lo), jnp.asarray(hi), jnp.asarray(coeffs),
                                       order=15)
    assert not np.any(np.asarray(status))
    assert_close(moments, expected, rtol=RTOL)


@pytest.mark.parametrize(
    ("lo", "hi", "coeffs", "status"),
    [
        (-math.inf, math.inf, (0.1, 0.3, 0.0, 0.0), 0),     # whole-line affine
        (-math.inf, 0.0, (0.1, 0.3, 0.5, 0.0), 2),          # curved semi-infinite
        (-1.0, 1.0, (0.1, 0.3, 1e-14, 1e-14), 0),           # affine by tolerance
        (-1.0, 1.0, (0.1, 0.3, 0.4, 0.0), 0),               # non-affine finite
        (1.0, -1.0, (0.1, 0.3, 0.0, 0.0), 1),               # reversed bounds
        (-1.0, 1.0, (math.nan, 0.3, 0.0, 0.0), 3),          # non-finite coefficient
        (-1e200, 1e200, (0.0, 1.0, 0.0, 0.0), 4),           # q(L) overflows
    ],
)
def test_moment_status_codes(lo, hi, coeffs, status):
    moments, got = bms.cell_moments(jnp.asarray([lo]), jnp.asarray([hi]), jnp.asarray([coeffs]))
    assert int(got[0]) == status
    if status:
        assert np.all(np.asarray(moments) == 0)


def _rigid_outputs(rows):
    inp = tables.rigid_stage2_inputs(rows)
    return bms.row_derivatives(*(jnp.asarray(inp[k]) for k in tables.STAGE2_KEYS))


def test_rigid_model_matches_closed_form_table():
    rows = [params for params, _ in tables.RIGID_ROWS]
    neglog, grad, hess, status = _rigid_outputs(rows)
    assert np.all(np.asarray(status) == 0)
    for i, (_, (_, nl, g, h)) in enumerate(tables.RIGID_ROWS):
        assert_close(neglog[i], nl, rtol=RTOL)
        assert_close(grad[i], g, rtol=RTOL)
        assert_close(hess[i], [[h[0], h[1]], [h[1], h[2]]], rtol=RTOL)
    assert np.array_equal(np.asarray(hess), np.swapaxes(np.asarray(hess), 1, 2))


def test_rigid_model_moments_from_stage1_match_closed_form():
    rows = [params for params, _ in tables.RIGID_ROWS]
    inp = tables.rigid_stage2_inputs(rows)
    moments, _ = bms.cell_moments(jnp.asarray(inp["lo"]), jnp.asarray(inp["hi"]),
                                  jnp.asarray(inp["c"]))
    assert_close(moments, inp["moments"], rtol=RTOL, atol=1e-300)


def test_degenerate_and_failed_rows_are_reported_per_row():
    rows = [params for params, _ in tables.RIGID_ROWS]
    inp = tables.rigid_stage2_inputs(rows)
    inp["jet"][1, 0] = -inp["jet"][1, 0]         # F_a < 0 in row 1
    inp["status"][2] = 4                         # row 2's cell failed in Stage 1
    neglog, grad, hess, status = bms.row_derivatives(*(jnp.asarray(inp[k]) for k in tables.STAGE2_KEYS))
    assert list(np.asarray(status)) == [0, 1, 3, 0]
    assert np.isfinite(neglog[0]) and np.all(np.isfinite(hess[0]))
    for i in (1, 2):
        assert np.isnan(neglog[i]) and np.all(np.isnan(grad[i])) and np.all(np.isnan(hess[i]))


def test_joint_operators_match_dense_loops():
    rng = np.random.default_rng(0)
    hess, x, g = tables.random_row_hessians(rng, 37, 7, 4, 3)
    dense = tables.dense_joint_loops(hess, x, g)
    v = rng.standard_normal((3, dense.shape[0]))
    assert_close(bms.joint_dense(hess, x, g), dense, rtol=RTOL, atol=RTOL * np.abs(dense).max())
    assert_close(bms.joint_hvp(hess, x, g, v), v @ dense, rtol=RTOL, atol=1e-12 * np.abs(dense).max())
    assert_close(bms.joint_diagonal(hess, x, g), np.diag(dense), rtol=RTOL)


def test_joint_hvp_spec_hand_fixture():
    """Spec A.8: n = 4, r = 4, p_total = 6, H_i[u,v] = (i+1)(1+u+2v) symmetrised."""
    n, r = 4, 4
    i, u, v = np.meshgrid(np.arange(n), np.arange(r), np.arange(r), indexing="ij")
    h = (i + 1) * (1 + u + 2 * v)
    h = 0.5 * (h + np.swapaxes(h, 1, 2)).astype(float)
    x = 0.5 + 0.1 * np.arange(n)[:, None] - 0.2 * np.arange(2)[None, :]
    g = -0.3 + 0.05 * np.arange(n)[:, None] + 0.15 * np.arange(2)[None, :]
    vec = 0.1 + 0.25 * np.arange(6)
    # out[0] by hand: Σ_i x_i0 (H_i[0,:] · (x_i·v_m, g_i·v_g, v_h, v_w))
    hand = sum(x[k, 0] * h[k, 0] @ np.array([x[k] @ vec[:2], g[k] @ vec[2:4], vec[4], vec[5]])
               for k in range(n))
    out = bms.joint_hvp(h, x, g, vec[None, :])
    assert out[0, 0] == pytest.approx(hand, rel=1e-12)
    assert_close(out[0], tables.dense_joint_loops(h, x, g) @ vec, rtol=1e-12)


def test_joint_gradient_matches_loop():
    rng = np.random.default_rng(1)
    n, r, p_m, p_g = 9, 5, 3, 2
    neglog = rng.random(n)
    grad = rng.standard_normal((n, r))
    x = rng.standard_normal((n, p_m))
    g = rng.standard_normal((n, p_g))
    score = np.zeros(p_m + p_g + r - 2)
    for k in range(n):
        score[:p_m] -= grad[k, 0] * x[k]
        score[p_m:p_m + p_g] -= grad[k, 1] * g[k]
        score[p_m + p_g:] -= grad[k, 2:]
    out = bms.joint_gradient(neglog, grad, x, g)
    assert_close(out, np.concatenate([[-neglog.sum()], score]), rtol=1e-12)

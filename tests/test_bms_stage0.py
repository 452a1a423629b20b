"""Stage 0 in jnp (gpustat.bms._stage0, behind gpustat.bms.build_rows) vs the host numpy
builder (gpustat.bms._rows), and jax.grad through it vs Stage 2's analytic gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import bms
from gpustat.bms import _stage0 as bms_stage0
from gpustat.bms._rows import build_row_arrays

SCORE = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 6))     # p_h = 4
LINK = bms.flat_cubic_basis(np.linspace(-3.0, 3.0, 5))      # p_w = 3
S_F = 0.9


def _params():
    """Six rows: moderate ones, Φ(q) near 1 and 0, a negative slope, a slope near 0 (link
    cuts beyond |z| = 40)."""
    rng = np.random.default_rng(11)
    q = np.array([0.4, -0.9, 6.0, -3.0, 0.2, 1.1])
    b = np.array([0.8, 1.4, 0.6, -0.7, 1e-6, 2.5])
    beta_h = rng.normal(size=4) * 0.3
    beta_w = rng.normal(size=3) * 0.2
    z_obs = rng.normal(size=6)
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    w = 0.5 + rng.random(6)
    return q, b, beta_h, beta_w, z_obs, y, w


def _host_rows(q, b, beta_h, beta_w, z_obs, y, w):
    fields = build_row_arrays(q, b, beta_h, beta_w, SCORE, LINK, z_obs, y, w, S_F)
    p_h, p_w = fields.pop("p_h"), fields.pop("p_w")
    fields = {k: jnp.asarray(v) for k, v in fields.items()}
    moments, status = bms.cell_moments(fields["cell_lo"], fields["cell_hi"], fields["cell_c"],
                                       backend="reference")
    return bms.BmsRows(**fields, cell_moments=moments, cell_status=status, p_h=p_h, p_w=p_w)


@pytest.fixture(scope="module")
def host_and_device():
    params = _params()
    return params, _host_rows(*params)


def _assert_close_scaled(got, want, tol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    with np.errstate(invalid="ignore"):                     # inf - inf at the tails
        err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    both_inf = np.isinf(got) & (got == want)
    assert np.all(both_inf | (err <= tol)), (what, np.nanmax(np.where(both_inf, 0, err)))


def test_device_rows_equal_host_builder(host_and_device):
    params, host = host_and_device
    q, b, beta_h, beta_w, z_obs, y, w = params
    fields, valid, status = jax.jit(bms_stage0.build_row_fields)(
        bms_stage0.basis_table(SCORE), bms_stage0.basis_table(LINK), beta_h, beta_w, q, b,
        z_obs, y, w, S_F)
    assert np.all(np.asarray(status) == bms_stage0.CalibrationStatus.OK)
    valid = np.asarray(valid)
    # the same cells per row, in the same order
    np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(valid.sum(1))]),
                                  host.cell_offsets)
    for name in ("a", "mu_1", "mu_2", "e_obs", "chi", "xi", "rho", "tau", "r_uv"):
        _assert_close_scaled(fields[name], getattr(host, name), 1e-12, name)
    for name in ("cell_lo", "cell_hi", "cell_c", "cell_jet", "cell_jet_a", "cell_jet_b"):
        _assert_close_scaled(np.asarray(fields[name])[valid.reshape(-1)], getattr(host, name),
                             1e-12, name)
    # Stage 2 on both: padding cells add exactly nothing
    device = bms.build_rows(q, b, beta_h, beta_w, SCORE, LINK, z_obs, y, w, S_F,
                            backend="reference")
    got = bms.row_derivatives(device, backend="reference")
    want = bms.row_derivatives(host, backend="reference")
    assert np.all(np.asarray(got.status) == 0)
    _assert_close_scaled(got.neglog, want.neglog, 1e-12, "neglog")
    for name in ("grad", "hess"):
        g, h = np.asarray(getattr(got, name)), np.asarray(getattr(want, name))
        scale = np.abs(h).reshape(len(q), -1).max(axis=1).reshape((-1,) + (1,) * (h.ndim - 1))
        assert np.all(np.abs(g - h) <= 1e-12 * scale), name


def test_grad_of_batch_neglog_through_builder_equals_analytic_gradient(host_and_device):
    params, host = host_and_device
    q, b, beta_h, beta_w, z_obs, y, w = params

    def total_neglog(q, b, beta_h, beta_w):
        rows = bms.build_rows(q, b, beta_h, beta_w, SCORE, LINK, z_obs, y, w, S_F,
                              backend="reference")
        return jnp.sum(bms.row_derivatives(rows, backend="reference").neglog)

    grads = jax.jit(jax.grad(total_neglog, argnums=(0, 1, 2, 3)))(q, b, beta_h, beta_w)
    g = np.asarray(bms.row_derivatives(host, backend="reference").grad)     # host rows
    want = (g[:, 0], g[:, 1], g[:, 2:6].sum(0), g[:, 6:].sum(0))
    scale = np.abs(g).max()
    for got, expected in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10 * scale)


def test_failed_calibration_reports_status_per_row():
    # Φ(-40) underflows: no finite root for that row alone
    a, status, _ = bms_stage0.calibrate_intercepts(
        bms_stage0.basis_table(SCORE), None, np.zeros(4), np.zeros(0), np.array([0.2, -40.0]),
        np.array([0.8, 0.8]), 1.0)
    assert int(status[0]) == bms_stage0.CalibrationStatus.OK and np.isfinite(a[0])
    assert int(status[1]) != bms_stage0.CalibrationStatus.OK and np.isnan(a[1])


def test_device_intercepts_equal_host_on_steep_and_far_rows():
    # steep slopes put the step of Φ(η) inside narrow cells; |q| >= 4.5 puts the
    # calibration integrand's mass far from z = 0, where the clipped quadrature panels sit
    rng = np.random.default_rng(5)
    q = np.array([-1.5, -4.5, 4.5, -7.0, 7.0, 0.0])
    b = np.array([6.0, 3.0, -5.0, 2.0, 0.3, -8.0])
    beta_h, beta_w = rng.normal(size=4) * 0.5, rng.normal(size=3) * 0.5
    want = build_row_arrays(q, b, beta_h, beta_w, SCORE, LINK, np.zeros(6), np.ones(6),
                            np.ones(6), 0.6)["a"]
    a, status, _ = jax.jit(bms_stage0.calibrate_intercepts)(
        bms_stage0.basis_table(SCORE), bms_stage0.basis_table(LINK), beta_h, beta_w, q, b, 0.6)
    assert np.all(np.asarray(status) == bms_stage0.CalibrationStatus.OK)
    _assert_close_scaled(a, want, 1e-12, "a")


def test_calibration_from_a_given_start(host_and_device):
    # a fitting loop starts each row at its last intercept: the host's root is reached in
    # one coarse and one fine step from a start 1e-9 away, and a NaN start means the rigid one
    params, host = host_and_device
    q, b, beta_h, beta_w = params[:4]
    tables = bms_stage0.basis_table(SCORE), bms_stage0.basis_table(LINK)
    want = np.asarray(host.a)
    start = want + 1e-9
    start[0] = np.nan
    a, status, steps = jax.jit(bms_stage0.calibrate_intercepts)(
        *tables, beta_h, beta_w, q, b, S_F, a_start=start)
    assert np.all(np.asarray(status) == bms_stage0.CalibrationStatus.OK)
    _assert_close_scaled(a, want, 1e-12, "a")
    steps = np.asarray(steps)
    assert np.all(steps[1:] == 2) and steps[0] > 2, steps


def test_partition_points_sort_like_numpy_with_nan_last():
    rng = np.random.default_rng(11)
    v = rng.normal(size=(200, 24)).round(1)           # ties
    v[rng.random(v.shape) < 0.2] = np.nan
    v[:5, 3] = np.inf
    v[5:10, 4] = -np.inf
    got = np.asarray(jax.vmap(bms_stage0._sort_nan_last)(v))
    np.testing.assert_array_equal(got, np.sort(v, axis=1))

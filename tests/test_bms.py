"""Public BMS FLEX API: flexible rows vs the autodiff oracle, rigid rows vs the closed form,
bad input, per-row failure reporting, jit and vmap."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import bms
from gpustat.piecewise import PiecewisePolynomial
from tests.helpers import assert_close, tol
from tests.oracles import bms_tables as tables
from tests.oracles.bms_objective import make_row_objective

AUTODIFF = tol(np.float64, "autodiff")


def _flexible_rows_and_oracle(q, b, beta_h, beta_w, z_obs, y, w, s_f=0.9):
    """build_rows of flexible rows (score knots -2.5..2.5, link knots -3..3) and the
    autodiff oracle's (neglog, grad, hess)."""
    score = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 6))
    link = bms.flat_cubic_basis(np.linspace(-3.0, 3.0, 5))
    rows = bms.build_rows(q, b, beta_h, beta_w, score, link, z_obs, y, w, s_f,
                          backend="reference")
    _, _, value_grad_hessian = make_row_objective(
        (np.asarray(score.breakpoints), np.asarray(score.coeffs)),
        (np.asarray(link.breakpoints), np.asarray(link.coeffs)), len(beta_h), len(beta_w), s_f)
    n = len(q)
    theta = np.concatenate([q[:, None], b[:, None], np.tile(beta_h, (n, 1)),
                            np.tile(beta_w, (n, 1))], axis=1)
    return rows, jax.jit(jax.vmap(value_grad_hessian))(theta, z_obs, y, w)


def _assert_match_oracle(out, oracle):
    neglog, grad, hess = oracle
    assert np.all(np.asarray(out.status) == 0)
    assert_close(out.neglog, neglog, rtol=AUTODIFF)
    # relative to each row's largest entry: small entries cancel
    for got, want in ((out.grad, grad), (out.hess, hess)):
        scale = np.max(np.abs(np.asarray(want)).reshape(want.shape[0], -1), axis=1)
        err = np.abs(np.asarray(got) - np.asarray(want)).reshape(want.shape[0], -1)
        assert np.all(err.max(axis=1) <= AUTODIFF * scale), err.max(axis=1) / scale
    assert np.array_equal(np.asarray(out.hess), np.swapaxes(np.asarray(out.hess), 1, 2))


@pytest.fixture(scope="module")
def flexible():
    """Three random flexible rows (p_h = 4, p_w = 3, r = 9) and the oracle's derivatives."""
    rng = np.random.default_rng(0)
    n, p_h, p_w = 3, 4, 3
    q = rng.normal(size=n) * 0.8
    b = 0.5 + rng.random(n)
    beta_h = rng.normal(size=p_h) * 0.3
    beta_w = rng.normal(size=p_w) * 0.2
    z_obs = rng.normal(size=n)
    y = np.array([1.0, 0.0, 1.0])
    w = 0.5 + rng.random(n)
    return _flexible_rows_and_oracle(q, b, beta_h, beta_w, z_obs, y, w)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_flexible_rows_match_autodiff_oracle(flexible, backend):
    rows, oracle = flexible
    out = bms.row_derivatives(rows, backend=backend)
    # 12 cells and 2 padding slots per row (k = 6 score + 5 link knots + 3)
    assert rows.r == 9 and np.all(np.diff(np.asarray(rows.cell_offsets)) == 14)
    _assert_match_oracle(out, oracle)


def test_flexible_rows_with_slopes_near_zero_match_autodiff_oracle():
    # small |b| puts the link knots' cuts (τ - a)/b far out: Gauss-Legendre on the finite
    # cells [2.5, 9e5] and [-6e5, -2.5] (b = 1e-6) missed their whole mass, status 0 with
    # the gradient 1e-2 off; the cells are now cut at |z| = 40
    rng = np.random.default_rng(3)
    rows, oracle = _flexible_rows_and_oracle(
        np.array([0.4, -0.6, 1.1]), np.array([1e-6, -2e-5, 1e-4]), rng.normal(size=4) * 0.3,
        rng.normal(size=3) * 0.2, np.array([0.7, -0.2, 1.5]), np.array([1.0, 0.0, 1.0]),
        np.ones(3))
    lo = np.asarray(rows.cell_lo)
    assert np.abs(lo[np.isfinite(lo)]).max() > 1e4
    _assert_match_oracle(bms.row_derivatives(rows, backend="reference"), oracle)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_rigid_build_rows_match_closed_form(backend):
    # the three S_f = 1 rows, the first twice: 4 rows of 1 cell as in the reference tests
    # (same shapes, so the compiled reference is shared)
    keep = [0, 1, 3, 0]
    params = [tables.RIGID_ROWS[i][0] for i in keep]
    q, b, z_obs, y, _ = (np.array(v) for v in zip(*params))
    rows = bms.build_rows(q, b, None, None, None, None, z_obs, y, np.ones(len(q)), 1.0,
                          backend=backend)
    out = bms.row_derivatives(rows, backend=backend)
    expected = [tables.RIGID_ROWS[i][1] for i in keep]
    rtol = tol(np.float64, "oracle")
    assert_close(rows.a, [e[0] for e in expected], rtol=rtol)
    assert_close(out.neglog, [e[1] for e in expected], rtol=rtol)
    assert_close(out.grad, [e[2] for e in expected], rtol=rtol)
    assert_close(out.hess, [[[e[3][0], e[3][1]], [e[3][1], e[3][2]]] for e in expected],
                 rtol=rtol)


def _check_rigid_rows_against_closed_form(q, b, z_obs, y, s_f=0.9):
    """build_rows + row_derivatives of rigid rows vs a = q √(1 + S_f² b²)/S_f and
    jax.hessian of -log Φ(s S_f (a(q, b) + b z)). 4 rows of 1 cell: the shapes of
    test_rigid_build_rows_match_closed_form (its compiled reference is shared)."""
    rows = bms.build_rows(q, b, None, None, None, None, z_obs, y, np.ones(4), s_f,
                          backend="reference")
    assert_close(rows.a, q * np.sqrt(1 + (s_f * b) ** 2) / s_f, rtol=1e-14)

    def closed_form(theta, z, yy):
        a = theta[0] * jnp.sqrt(1 + (s_f * theta[1]) ** 2) / s_f
        m = (2 * yy - 1) * s_f * (a + theta[1] * z)
        # log1p(-Φ(-m)) for m > 0: jax's log_ndtr takes log Φ(m) there (1e-5 off at m = 7);
        # each branch gets a safe argument so the other's derivatives stay finite
        upper = m > 0
        return -jnp.where(upper, jnp.log1p(-jax.scipy.special.ndtr(-jnp.where(upper, m, 1.0))),
                          jax.scipy.special.log_ndtr(jnp.where(upper, -1.0, m)))

    neglog, grad, hess = jax.jit(jax.vmap(lambda *a: (
        closed_form(*a), jax.grad(closed_form)(*a), jax.hessian(closed_form)(*a))))(
        np.stack([q, b], axis=1), z_obs, y)
    out = bms.row_derivatives(rows, backend="reference")
    assert np.all(np.asarray(out.status) == 0)
    assert_close(out.neglog, neglog, rtol=1e-12)
    assert_close(out.grad, grad, rtol=1e-12)
    # relative to each row's largest entry: H_bb cancels at steep slopes
    scale = np.abs(np.asarray(hess)).max(axis=(1, 2))[:, None, None]
    assert np.all(np.abs(np.asarray(out.hess) - np.asarray(hess)) <= 1e-10 * scale)


def test_rigid_rows_in_the_upper_tail_of_q_match_closed_form():
    # Φ(q) near 1: the calibration used to cancel ∫ Φ(η) φ dz against Φ(q) (a was 5% off
    # at q = 8, 4e-7 at q = 6, and found no root at q = 5 for b = 0.8)
    _check_rigid_rows_against_closed_form(
        q=np.array([5.0, 6.0, 8.0, -8.0]), b=np.array([0.8, -0.5, 1.5, 0.8]),
        z_obs=np.array([0.3, -1.0, 2.0, 0.3]), y=np.array([0.0, 1.0, 0.0, 1.0]))


def test_rigid_rows_with_steep_slopes_match_closed_form():
    # Φ(η) steps over a width 1/|S_f b| where η crosses 0: one Gauss-Legendre panel on the
    # whole line put a 4e-5 off at b = 5 and 2e-2 off at b = 8
    _check_rigid_rows_against_closed_form(
        q=np.array([-1.0, 0.5, 2.0, -3.0]), b=np.array([5.0, -8.0, 20.0, 50.0]),
        z_obs=np.array([-0.3, 0.1, -2.0, 2.95]), y=np.array([1.0, 0.0, 1.0, 1.0]))


def test_failed_calibration_is_reported_per_row():
    # q = -40: Φ(q) underflows, the intercept has no finite root -> that row alone fails
    score = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 6))
    bad = bms.build_rows([0.2, -40.0], [0.8, 0.8], np.zeros(4), None, score, None, [0.1, 0.1],
                         [1, 0], [1.0, 1.0], 1.0, backend="reference")
    out = bms.row_derivatives(bad, backend="reference")
    assert int(out.status[0]) == 0 and np.isfinite(out.neglog[0])
    assert int(out.status[1]) != 0 and np.all(np.isnan(out.hess[1]))


def test_jit_and_vmap(flexible):
    rows, _ = flexible
    eager = bms.row_derivatives(rows, backend="reference")
    jitted = jax.jit(lambda rw: bms.row_derivatives(rw, backend="reference"))(rows)
    assert_close(jitted.hess, eager.hess, rtol=1e-14)
    # a batch of two row sets with the same cell layout
    doubled = dataclasses.replace(rows, w=2.0 * rows.w)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), rows, doubled)
    batched = jax.vmap(lambda rw: bms.row_derivatives(rw, backend="reference"))(stacked)
    assert_close(batched.hess[1], 2.0 * np.asarray(eager.hess), rtol=1e-13)

    rng = np.random.default_rng(1)
    x = rng.normal(size=(rows.n, 2))
    g = rng.normal(size=(rows.n, 3))
    op = bms.JointOperator.from_rows(eager, x, g)
    v = rng.normal(size=(4, op.p_total))
    dense = tables.dense_joint_loops(np.asarray(eager.hess), x, g)
    rtol = tol(np.float64, "oracle")
    scale = np.abs(dense).max() * np.abs(v).max() * op.p_total
    assert_close(jax.jit(lambda o, vv: o.hvp(vv))(op, v), v @ dense, rtol=rtol, atol=rtol * scale)
    assert_close(jax.vmap(op.hvp)(v), v @ dense, rtol=rtol, atol=rtol * scale)
    assert_close(op.diagonal(), np.diag(dense), rtol=rtol)
    assert_close(op.dense(), dense, rtol=rtol, atol=rtol * np.abs(dense).max())
    grad = bms.joint_gradient(eager, x, g)
    assert grad.shape == (1 + op.p_total,)
    assert float(grad[0]) == pytest.approx(-float(np.sum(eager.neglog)), rel=1e-14)
    moments, _ = jax.jit(lambda lo, hi, c: bms.cell_moments(lo, hi, c, backend="reference"))(
        rows.cell_lo, rows.cell_hi, rows.cell_c)
    assert_close(moments, rows.cell_moments, rtol=1e-12, atol=1e-15)


def _basis(degree=3, extrapolate="clamp", p=2):
    coeffs = np.zeros((degree + 1, 3, p))
    coeffs[-1] = 1.0
    return PiecewisePolynomial(np.array([-1.0, 0.0, 1.0, 2.0]), coeffs, extrapolate=extrapolate)


def _build(**changes):
    args = dict(q=[0.1, 0.2], b=[0.5, 0.6], beta_h=[0.1, 0.2], beta_w=None, score_basis=_basis(),
                link_basis=None, z_obs=[0.0, 1.0], y=[0, 1], w=[1.0, 1.0], s_f=1.0)
    args.update(changes)
    return bms.build_rows(**args, backend="reference")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"s_f": 0.0}, "s_f"),
        ({"s_f": -1.0}, "s_f"),
        ({"score_basis": _basis(degree=4)}, "degree"),
        ({"score_basis": _basis(extrapolate="extend")}, "clamp"),
        ({"beta_h": [0.1, 0.2, 0.3]}, "beta_h"),
        ({"b": [0.5]}, "b must have shape"),
        ({"y": [0, 2]}, "y"),
        ({"w": [1.0, 0.0]}, "w"),
        ({"beta_w": [0.3]}, "beta_w"),
        ({"order": 9.5}, "order"),
    ],
)
def test_build_rows_bad_input(changes, match):
    with pytest.raises(ValueError, match=match):
        _build(**changes)


@pytest.mark.parametrize(
    ("breakpoints", "match"),
    [
        ([0.0, 1.0, 2.0, 3.0], "P >= 4"),
        ([[0.0, 1.0, 2.0, 3.0, 4.0]], "shape"),
        ([0.0, 1.0, 1.0, 2.0, 3.0], "strictly increasing"),    # was a numpy broadcast error
        ([0.0, 1.0, 2.0, 3.0, np.inf], "finite"),
    ],
)
def test_flat_cubic_basis_bad_input(breakpoints, match):
    with pytest.raises(ValueError, match=f"breakpoints.*{match}|{match}.*breakpoints"):
        bms.flat_cubic_basis(breakpoints)


def test_row_derivatives_bad_input(flexible):
    rows, _ = flexible
    with pytest.raises(ValueError, match="2 \\+ p_h \\+ p_w"):
        bms.row_derivatives(dataclasses.replace(rows, p_h=rows.p_h + 1))
    offsets = np.asarray(rows.cell_offsets).copy()
    offsets[1], offsets[2] = offsets[2], offsets[1]
    with pytest.raises(ValueError, match="non-decreasing"):
        bms.row_derivatives(dataclasses.replace(rows, cell_offsets=jnp.asarray(offsets)))
    with pytest.raises(ValueError, match="s_f"):
        bms.row_derivatives(dataclasses.replace(rows, s_f=jnp.asarray(0.0)))
    with pytest.raises(ValueError, match="cell_moments"):
        bms.row_derivatives(dataclasses.replace(rows, cell_moments=rows.cell_moments[:, :5]))
    with pytest.raises(ValueError, match="r_uv"):
        bms.row_derivatives(dataclasses.replace(rows, r_uv=rows.r_uv[:, :-1]))
    with pytest.raises(TypeError, match="BmsRows"):
        bms.row_derivatives({"rows": 1})
    # float offsets failed inside the reference's indexing (and passed the kernels)
    with pytest.raises(TypeError, match=r"rows\.cell_offsets must be an integer array"):
        bms.row_derivatives(dataclasses.replace(rows, cell_offsets=rows.cell_offsets * 1.0))
    with pytest.raises(ValueError, match="backend"):
        bms.row_derivatives(rows, backend="cuda")


def test_cell_moments_and_joint_bad_input():
    with pytest.raises(ValueError, match="c must have shape"):
        bms.cell_moments(np.zeros(2), np.ones(2), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="lo and hi"):
        bms.cell_moments(np.zeros(3), np.ones(2), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="order"):
        bms.cell_moments(np.zeros(2), np.ones(2), np.zeros((2, 4)), order=25)
    with pytest.raises(ValueError, match="order"):
        bms.cell_moments(np.zeros(2), np.ones(2), np.zeros((2, 4)), order=True)
    # numpy integers are integers
    assert bms.cell_moments(np.zeros(2), np.ones(2), np.zeros((2, 4)),
                            order=np.int64(3))[0].shape == (2, 4)
    with pytest.raises(TypeError, match="floating"):
        bms.cell_moments(np.zeros(2), np.ones(2), np.zeros((2, 4), np.int32))
    hess = np.zeros((3, 4, 4))
    x, g = np.ones((3, 2)), np.ones((3, 1))
    with pytest.raises(ValueError, match="p_total=5"):
        bms.joint_hvp(hess, x, g, np.ones(6))
    with pytest.raises(ValueError, match="hess must have shape"):
        bms.joint_diagonal(np.zeros((3, 4, 5)), x, g)
    with pytest.raises(ValueError, match="n=3 rows"):
        bms.joint_dense(hess, x[:2], g)
    with pytest.raises(ValueError, match="at least one column"):
        bms.joint_dense(hess, np.ones((3, 0)), g)


def test_build_rows_under_jit_and_ops_vmap():
    score = bms.flat_cubic_basis(np.linspace(-2.0, 2.0, 6))
    args = (np.array([0.3, -0.7]), np.array([0.8, 1.2]), np.array([0.1, -0.2, 0.3, 0.05]))

    def build(q, b, beta_h):
        return bms.build_rows(q, b, beta_h, None, score, None, [0.2, -0.4], [1.0, 0.0],
                              [1.0, 2.0], 0.9, backend="reference")

    jitted, eager = jax.jit(build)(*args), build(*args)
    assert_close(jitted.a, eager.a, rtol=1e-14)
    assert_close(jitted.cell_jet, eager.cell_jet, rtol=1e-14, atol=1e-15)
    lo, hi, c = tables.MOMENT_CELLS[1][0], tables.MOMENT_CELLS[1][1], tables.MOMENT_CELLS[1][2]
    cells = (jnp.full((2, 1), lo), jnp.full((2, 1), hi), jnp.asarray([[c], [c]]))
    moments, _ = jax.vmap(lambda a, b, cc: bms.cell_moments(a, b, cc, backend="reference"))(*cells)
    assert_close(moments[:, 0], [tables.MOMENT_CELLS[1][3]] * 2, rtol=1e-12)
    rng = np.random.default_rng(4)
    hess, x, g = tables.random_row_hessians(rng, 5, 4, 2, 1)
    stacked = jnp.stack([hess, 2 * hess])
    diag = jax.vmap(lambda h: bms.joint_diagonal(h, x, g, backend="reference"))(stacked)
    assert_close(diag[1], 2 * np.diag(tables.dense_joint_loops(hess, x, g)), rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_empty_batches(backend):
    """No cells or rows: empty moments, and zero joint sums (as the reference's)."""
    moments, status = bms.cell_moments(jnp.zeros(0), jnp.zeros(0), jnp.zeros((0, 4)),
                                       backend=backend)
    assert moments.shape[0] == 0 and status.shape == (0,)
    hess, x, g = jnp.zeros((0, 3, 3)), jnp.zeros((0, 2)), jnp.zeros((0, 1))
    np.testing.assert_array_equal(bms.joint_hvp(hess, x, g, jnp.ones(4), backend=backend), 0)
    np.testing.assert_array_equal(bms.joint_dense(hess, x, g, backend=backend), np.zeros((4, 4)))
    np.testing.assert_array_equal(bms.joint_diagonal(hess, x, g, backend=backend), np.zeros(4))
    x1, g1 = jnp.ones((2, 2)), jnp.ones((2, 1))
    directions = bms.joint_hvp(jnp.ones((2, 3, 3)), x1, g1, jnp.zeros((0, 4)), backend=backend)
    assert directions.shape == (0, 4)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_mixed_precision_inputs_are_promoted(backend):
    """float32 Hessians or cell coefficients with float64 designs, directions or bounds
    compute in float64 on every backend (the kernels used to down-cast to float32)."""
    # shapes of the kernel tests (tests/pallas/test_bms.py), whose compiled kernels are shared
    rng = np.random.default_rng(8)
    hess, x, g = tables.random_row_hessians(rng, 37, 7, 4, 3)
    hess32 = hess.astype(np.float32)
    dense = tables.dense_joint_loops(hess32.astype(np.float64), x, g)
    v = rng.standard_normal(dense.shape[0])
    rtol = tol(np.float64, "oracle")
    out = bms.joint_hvp(hess32, x, g, v, backend=backend)
    assert out.dtype == jnp.float64
    assert_close(out, dense @ v, rtol=rtol, atol=rtol * np.abs(dense).max() * np.abs(v).max())
    diag = bms.joint_diagonal(hess32, x, g, backend=backend)
    assert diag.dtype == jnp.float64
    assert_close(diag, np.diag(dense), rtol=rtol)
    # cells whose coefficients float32 holds exactly
    lo, hi, c, expected = tables.cells_array([tables.MOMENT_CELLS[i] for i in (0, 5, 9)])
    moments, _ = bms.cell_moments(lo, hi, c.astype(np.float32), order=15, backend=backend)
    assert moments.dtype == jnp.float64
    assert_close(moments[:, :10], expected, rtol=rtol, atol=1e-15)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_16bit_inputs_compute_in_float32(backend):
    """bfloat16 Hessians, designs and cells compute in float32 on every backend (the
    reference computed in bfloat16: diagonal 3e-3, moments 5e-3 off)."""
    rng = np.random.default_rng(8)
    hess, x, g = (jnp.asarray(a, jnp.bfloat16)
                  for a in tables.random_row_hessians(rng, 37, 7, 4, 3))
    dense = tables.dense_joint_loops(*(np.asarray(a, np.float64) for a in (hess, x, g)))
    rtol = tol(np.float32, "oracle")
    diag = bms.joint_diagonal(hess, x, g, backend=backend)
    assert diag.dtype == jnp.float32
    assert_close(diag, np.diag(dense), rtol=10 * rtol)
    # cells whose bounds and coefficients bfloat16 holds exactly
    lo, hi, c, expected = tables.cells_array([tables.MOMENT_CELLS[i] for i in (0, 5, 9)])
    moments, _ = bms.cell_moments(*(jnp.asarray(a, jnp.bfloat16) for a in (lo, hi, c)),
                                  backend=backend)
    assert moments.dtype == jnp.float32
    assert_close(moments, expected, rtol=10 * rtol, atol=1e-6)


def test_joint_gradient_promotes_mixed_dtypes():
    """A float32 marginal design with a float64 slope design: the score is float64 (g was
    rounded to float32, 4e-8 off)."""
    rng = np.random.default_rng(2)
    n, r = 3, 4
    neglog, grad = rng.random(n), rng.normal(size=(n, r))
    x, g = rng.normal(size=(n, 2)).astype(np.float32), rng.normal(size=(n, 2))
    derivs = bms.RowDerivatives(jnp.asarray(neglog), jnp.asarray(grad), jnp.zeros((n, r, r)),
                                jnp.zeros(n, jnp.int32))
    score = np.zeros(2 + 2 + r - 2)
    for i in range(n):
        score[:2] -= grad[i, 0] * x[i].astype(np.float64)
        score[2:4] -= grad[i, 1] * g[i]
        score[4:] -= grad[i, 2:]
    out = bms.joint_gradient(derivs, x, g)
    assert out.dtype == jnp.float64
    assert_close(out, np.concatenate([[-neglog.sum()], score]), rtol=1e-14)


def test_float64_input_without_x64_is_rejected():
    """With jax_enable_x64 off, float64 input raises instead of being rounded to float32."""
    hess, x, g = np.zeros((2, 3, 3)), np.ones((2, 1), np.float32), np.ones((2, 1), np.float32)
    with jax.enable_x64(False):
        with pytest.raises(TypeError, match="hess is float64 but jax_enable_x64 is off"):
            bms.joint_diagonal(hess, x, g, backend="reference")
        with pytest.raises(TypeError, match="lo is float64 but jax_enable_x64 is off"):
            bms.cell_moments(np.zeros(1), np.ones(1, np.float32), np.zeros((1, 4), np.float32),
                             backend="reference")
        with pytest.raises(TypeError, match="build_rows returns float64 rows"):
            bms.build_rows([0.3], [0.8], None, None, None, None, [0.5], [1], [1.0])
        diag = bms.joint_diagonal(hess.astype(np.float32), x, g, backend="reference")
    assert diag.dtype == np.float32

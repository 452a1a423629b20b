"""gpustat.bms._ops.fit (damped Newton-CG in one jitted loop) vs scipy's trust-ncg on the
independent autodiff objective of tests/oracles/bms_objective.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from gpustat import bms
from tests.oracles.bms_objective import make_row_objective

N = 30
SCORE = bms.flat_cubic_basis(np.linspace(-2.5, 2.5, 6))     # p_h = 4
LINK = bms.flat_cubic_basis(np.linspace(-3.0, 3.0, 5))      # p_w = 3
P_M, P_G, P_H, P_W = 2, 2, 4, 3
P_TOTAL = P_M + P_G + P_H + P_W
# a ridge on the spline coefficients (the designs carry the intercepts unpenalised); it keeps
# the optimum inside the region where every row calibrates (1 + w'(u) > 0)
PENALTY = np.diag([0.0] * (P_M + P_G) + [4.0] * (P_H + P_W))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    x = np.c_[np.ones(N), rng.normal(size=N)]
    g = np.c_[np.ones(N), rng.normal(size=N)]
    z_obs = rng.normal(size=N)
    eta = x @ [0.3, 0.8] + (g @ [0.9, 0.3]) * z_obs
    y = (rng.random(N) < 0.5 * (1 + np.tanh(0.8 * eta))).astype(float)
    w = 0.5 + rng.random(N)
    return x, g, z_obs, y, w


def _oracle_total(x, g, z_obs, y, w, s_f):
    objective, _, _ = make_row_objective(
        (np.asarray(SCORE.breakpoints), np.asarray(SCORE.coeffs)),
        (np.asarray(LINK.breakpoints), np.asarray(LINK.coeffs)), P_H, P_W, s_f)

    def total(beta):
        theta = jnp.concatenate([(x @ beta[:P_M])[:, None], (g @ beta[P_M:P_M + P_G])[:, None],
                                 jnp.broadcast_to(beta[P_M + P_G:], (N, P_H + P_W))], axis=1)
        rows = jax.vmap(objective)(theta, z_obs, y, w)
        return jnp.sum(rows) + 0.5 * beta @ PENALTY @ beta

    return total


def test_fit_reaches_scipy_trust_ncg_optimum(data):
    x, g, z_obs, y, w = data
    s_f = 0.9
    result = bms.fit(x, g, SCORE, LINK, z_obs, y, w, s_f, penalty=PENALTY, backend="reference")
    assert int(result.status) == bms.FitStatus.CONVERGED, result
    assert 0 < int(result.iterations) < 50 and int(result.cg_iterations) >= int(result.iterations)

    total = _oracle_total(x, g, z_obs, y, w, s_f)
    value_and_grad = jax.jit(jax.value_and_grad(total))
    hessp = jax.jit(lambda b, v: jax.jvp(jax.grad(total), (b,), (v,))[1])
    beta0 = np.zeros(P_TOTAL)
    beta0[P_M] = 1.0
    ref = scipy.optimize.minimize(lambda b: tuple(np.asarray(t) for t in value_and_grad(b)),
                                  beta0, jac=True, hessp=lambda b, v: np.asarray(hessp(b, v)),
                                  method="trust-ncg", options={"gtol": 1e-10})
    assert ref.success, ref.message
    f_scipy = float(total(ref.x))
    assert abs(float(total(result.beta)) - f_scipy) <= 1e-10 * abs(f_scipy)
    assert abs(float(result.objective) - f_scipy) <= 1e-10 * abs(f_scipy)
    np.testing.assert_allclose(result.beta, ref.x, atol=1e-6)
    assert float(result.gradient_norm) <= 1e-9 * max(1.0, abs(f_scipy))


def test_intercept_gradient_equals_the_calibrations_jacobian():
    """The line search's start a + t da: ∂a/∂θ from the Stage-1 moments equals the
    Jacobian of the calibrated intercepts (implicit function theorem on the Stage-0 rule)."""
    from gpustat.bms import _ops
    from gpustat.bms._fit import _intercept_gradient
    from gpustat.bms._stage0 import basis_table, build_row_fields, calibrate_intercepts

    rng = np.random.default_rng(2)
    q, b = rng.normal(size=8) * 1.5, 0.5 + rng.random(8) * 2
    beta_h, beta_w = rng.normal(size=P_H) * 0.3, rng.normal(size=P_W) * 0.2
    tables = basis_table(SCORE), basis_table(LINK)
    s_f = 0.8
    fields, _, status = build_row_fields(*tables, beta_h, beta_w, q, b, np.zeros(8),
                                         np.ones(8), np.ones(8), s_f)
    assert np.all(np.asarray(status) == 0)
    moments, _ = _ops.cell_moments(fields["cell_lo"], fields["cell_hi"], fields["cell_c"],
                                   order=9, backend="reference")
    got = np.asarray(_intercept_gradient(fields, moments))

    def intercepts(q, b, beta_h, beta_w):
        return calibrate_intercepts(*tables, beta_h, beta_w, q, b, s_f)[0]

    j_q, j_b, j_h, j_w = jax.jacfwd(intercepts, argnums=(0, 1, 2, 3))(q, b, beta_h, beta_w)
    want = np.c_[np.diag(j_q), np.diag(j_b), j_h, j_w]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_fit_reports_max_iterations(data):
    x, g, z_obs, y, w = data
    result = bms.fit(x, g, SCORE, LINK, z_obs, y, w, 0.9, penalty=PENALTY, max_iterations=1,
                     backend="reference")
    assert int(result.status) == bms.FitStatus.MAX_ITERATIONS
    assert int(result.iterations) == 1 and np.isfinite(float(result.objective))


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"x": np.ones((N - 1, 2))}, ValueError, "x and g"),
        ({"beta0": np.zeros(3)}, ValueError, "beta0"),
        ({"penalty": np.eye(3)}, ValueError, "penalty"),
        ({"y": np.full(N, 2.0)}, ValueError, "y"),
        ({"gtol": 0.0}, ValueError, "gtol"),
        ({"max_iterations": 0}, ValueError, "max_iterations"),
        ({"score_basis": "spline"}, TypeError, "score_basis"),
        ({"backend": "cuda"}, ValueError, "backend"),
    ],
)
def test_fit_bad_input(data, changes, error, match):
    x, g, z_obs, y, w = data
    args = dict(x=x, g=g, score_basis=SCORE, link_basis=LINK, z_obs=z_obs, y=y, w=w)
    options = {k: changes.pop(k) for k in list(changes) if k not in args}
    args.update(changes)
    with pytest.raises(error, match=match):
        bms.fit(**args, **options)

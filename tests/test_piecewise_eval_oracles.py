"""Piecewise evaluation against scipy, closed forms and float64 oracles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

from gpustat.piecewise import PiecewisePolynomial
from tests.helpers import assert_close

jax.config.update("jax_enable_x64", True)

BP = np.array([-1.0, 0.0, 0.5, 2.0])


def _unit(shape, index):
    unit = np.zeros(shape)
    unit[index] = 1.0
    return unit


@pytest.mark.parametrize("coeffs", [
    np.zeros((4, 3)),                                                    # a zero initialisation
    np.array([[0.0, 0, 0], [0, 0, 0], [1.0, 2, 3], [0.5, 0, 1]]),        # a linear cubic
])
def test_calculus_gradients_with_zero_leading_coefficients(coeffs):
    # Both are linear in the coefficients: d/dc[k, i] is scipy's value for the unit
    # coefficient. A zero Horner accumulator used to drop these gradients (0 instead of 1/3).
    x = np.array([-0.7, 0.3, 1.1, 3.0])
    units = [_unit(coeffs.shape, idx) for idx in np.ndindex(coeffs.shape)]
    expected = np.array([PPoly(u, BP).integrate(-0.5, 1.5) for u in units])
    got = jax.grad(lambda c: PiecewisePolynomial(BP, c).integrate(-0.5, 1.5))(jnp.asarray(coeffs))
    assert_close(np.ravel(got), expected, rtol=1e-12, atol=1e-14)
    expected = np.array([PPoly(u, BP).antiderivative()(x).sum() for u in units])
    got = jax.grad(lambda c: PiecewisePolynomial(BP, c).antiderivative()(x).sum())(
        jnp.asarray(coeffs))
    assert_close(np.ravel(got), expected, rtol=1e-12, atol=1e-14)


def test_integral_gradient_in_the_bound_through_a_zero_accumulator():
    # F(u) = u^2 / 2 - u: at u = 2 Horner's first step 0.5 * 2 - 1 is exactly 0
    pp = PiecewisePolynomial(np.array([0.0, 3.0]), np.array([[1.0], [-1.0]]))  # u - 1
    assert float(jax.grad(lambda b: pp.integrate(0.0, b))(2.0)) == 1.0  # p(2)
    assert float(jax.grad(lambda a: pp.integrate(a, 0.5))(2.0)) == -1.0


def test_periodic_antiderivative_of_order_zero_is_the_function():
    coeffs = np.random.default_rng(0).normal(size=(4, 3))
    pp = PiecewisePolynomial(BP, coeffs, extrapolate="periodic")
    x = np.array([-4.3, -1.5, 0.2, 2.5, 7.9])
    same = pp.antiderivative(0)
    assert same.extrapolate == "periodic"
    expected = PPoly(coeffs, BP, extrapolate="periodic").antiderivative(0)(x)
    assert_close(same(x), expected, rtol=1e-12, atol=1e-12)
    assert pp.antiderivative(1).extrapolate == "nan"  # scipy's rule for nu >= 1


def test_clamp_integral_over_infinite_bounds_with_zero_end_values():
    # column 0: 1 - x^2 on [-1, 1] (local u = x + 1: -u^2 + 2u), clamped: zero outside;
    # column 1: the constant 1
    coeffs = np.array([[-1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])[:, None, :]
    pp = PiecewisePolynomial(np.array([-1.0, 1.0]), coeffs, extrapolate="clamp")
    assert_close(pp.integrate(-np.inf, np.inf)[0], 4.0 / 3.0, rtol=1e-15)
    assert_close(pp.integrate(-np.inf, 0.0)[0], 2.0 / 3.0, rtol=1e-15)
    assert_close(pp.integrate(np.inf, -np.inf)[0], -4.0 / 3.0, rtol=1e-15)
    assert float(pp.integrate(-np.inf, 0.0)[1]) == np.inf  # a non-zero end value diverges


@pytest.mark.parametrize("coeff_dtype, x_dtype, rtol", [
    (jnp.bfloat16, jnp.float32, 1e-6),
    (jnp.float16, jnp.float32, 1e-6),
    (jnp.float32, jnp.float64, 1e-13),
])
def test_derivative_evaluation_is_in_the_compute_dtype(coeff_dtype, x_dtype, rtol):
    # The derivative coefficients of a 16-bit (or float32) polynomial evaluated at float32
    # (float64) x were formed in the coefficients' dtype: 2e-3 relative error for bfloat16.
    rng = np.random.default_rng(1)
    pp = PiecewisePolynomial(np.linspace(-2.0, 2.0, 9).astype(coeff_dtype),
                             rng.normal(size=(4, 8)).astype(coeff_dtype))
    exact = PPoly(np.asarray(pp.coeffs, np.float64), np.asarray(pp.breakpoints, np.float64))
    x = jnp.asarray(rng.uniform(-2.0, 2.0, 200), x_dtype)
    for nu in (1, 2, 3):
        expected = exact(np.asarray(x, np.float64), nu=nu)
        got = np.asarray(pp(x, nu=nu, backend="reference"), np.float64)
        assert_close(got, expected, rtol=0, atol=rtol * np.max(np.abs(expected)))
    got = np.asarray(pp(x[:7], nu=2, backend="interpret"), np.float64)
    expected = exact(np.asarray(x[:7], np.float64), nu=2)
    assert_close(got, expected, rtol=0, atol=rtol * np.max(np.abs(expected)))


def test_from_torchpace_keeps_a_bfloat16_dtype():
    coeffs = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4)), jnp.bfloat16)
    pp = PiecewisePolynomial.from_torchpace(coeffs, np.array([0.0, 1.0, 2.0, 3.0]))
    assert pp.dtype == jnp.bfloat16


def test_bad_bounds_and_breakpoints_name_the_cause():
    pp = PiecewisePolynomial(BP, np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"b must be real, got b.dtype=complex"):
        pp.integrate(0.0, 1.0 + 2.0j)
    with pytest.raises(TypeError, match="a must be real"):
        pp.integrate(np.array([1j]), 1.0)
    # finite in float64, infinite in the coefficients' float16
    with pytest.raises(ValueError, match=r"breakpoints must be finite \(in float16\)"):
        PiecewisePolynomial(np.array([0.0, 1e5]), np.ones((2, 1), np.float16))

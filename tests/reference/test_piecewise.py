"""Piecewise reference vs independent oracles: scipy PPoly, closed forms, the spec's table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

from gpustat.piecewise import ACTIVATIONS, fit_piecewise
from gpustat.reference import piecewise as ref
from tests.helpers import assert_close, assert_within_float32_ulps, tol

SCIPY_MODE = {"extend": True, "nan": False, "periodic": "periodic"}

# jit once per shape and mode: op-by-op dispatch would compile every primitive.
evaluate = jax.jit(ref.ppoly_eval_reference, static_argnames=("extrapolate", "uniform"))
integrate = jax.jit(ref.integrate_reference, static_argnames=("extrapolate",))
index_uniform = jax.jit(ref.piece_index_uniform)
index_search = jax.jit(ref.piece_index)
derivative = jax.jit(ref.derivative_coeffs, static_argnums=1)
antiderivative = jax.jit(ref.antiderivative_coeffs, static_argnums=2)


def random_ppoly(seed, num_pieces=7, degree=3, trailing=(), uniform=False):
    rng = np.random.default_rng(seed)
    if uniform:
        bp = np.linspace(-2.0, 3.0, num_pieces + 1)
    else:
        bp = np.sort(rng.uniform(-2.0, 3.0, num_pieces + 1))
    return bp, rng.normal(size=(degree + 1, num_pieces, *trailing))


def probe_points(bp, seed=0):
    """Random points inside and outside, every breakpoint and its float neighbours."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(bp[0] - 3, bp[-1] + 3, 200), bp,
                           np.nextafter(bp, np.inf), np.nextafter(bp, -np.inf)])


def scaled_close(actual, expected, coeffs, u_max, dtype=np.float64):
    """rtol on the value plus the same rtol on the size of the terms (cancellation)."""
    terms = np.sum(np.abs(coeffs)) * max(1.0, u_max) ** (coeffs.shape[0] - 1)
    assert_close(actual, expected, rtol=tol(dtype, "oracle"), atol=tol(dtype, "oracle") * terms)


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("mode", ["extend", "nan", "periodic"])
def test_eval_matches_scipy(mode, uniform):
    bp, c = random_ppoly(1, trailing=(2,), uniform=uniform)
    x = probe_points(bp)
    expected = PPoly(c, bp, extrapolate=SCIPY_MODE[mode])(x)
    got = evaluate(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x),
                                   extrapolate=mode, uniform=uniform)
    scaled_close(got, expected, c, bp[-1] - bp[0] + 3)


def test_clamp_is_scipy_at_clipped_points():
    bp, c = random_ppoly(2)
    x = probe_points(bp)
    expected = PPoly(c, bp)(np.clip(x, bp[0], bp[-1]))
    got = evaluate(jnp.asarray(bp), jnp.asarray(c), jnp.asarray(x),
                                   extrapolate="clamp")
    scaled_close(got, expected, c, bp[-1] - bp[0])


def test_nan_and_inf_semantics():
    bp, c = random_ppoly(3)
    c[:, 0] = [1.0, -2.0, 0.5, 1.0]  # first piece: limit at -inf is -inf (odd degree, c0 > 0)
    c[:, -1] = [0.0, 0.0, 2.0, -1.0]  # last piece is linear stored as a cubic
    x = jnp.asarray([np.nan, np.inf, -np.inf])
    get = {m: np.asarray(evaluate(jnp.asarray(bp), jnp.asarray(c), x,
                                                  extrapolate=m)) for m in ref.EXTRAPOLATE_MODES}
    # closed forms: the polynomial's limits, the end values, NaN
    np.testing.assert_array_equal(get["extend"], [np.nan, np.inf, -np.inf])
    np.testing.assert_array_equal(get["nan"], [np.nan] * 3)
    np.testing.assert_array_equal(get["periodic"], [np.nan] * 3)
    ends = PPoly(c, bp)(np.array([bp[-1], bp[0]]))
    np.testing.assert_array_equal(get["clamp"][1:], ends)
    assert np.isnan(get["clamp"][0])
    # where scipy's power sum is defined at +-inf, it agrees
    scipy_vals = PPoly(c, bp)(np.asarray(x))
    defined = ~np.isnan(scipy_vals)
    np.testing.assert_array_equal(get["extend"][defined], scipy_vals[defined])


def test_uniform_index_equals_searchsorted():
    for bp in (np.linspace(-1.0, 2.0, 9), np.linspace(0.1, 0.7, 301),
               np.linspace(-3, 3, 65) + np.random.default_rng(0).uniform(-0.02, 0.02, 65)):
        rng = np.random.default_rng(1)
        x = np.concatenate([probe_points(bp), rng.uniform(bp[0], bp[-1], 2000),
                            [np.inf, -np.inf, 1e300, -1e300]])
        expected = np.clip(np.searchsorted(bp, x, side="right") - 1, 0, bp.size - 2)
        np.testing.assert_array_equal(index_uniform(jnp.asarray(bp), jnp.asarray(x)),
                                      expected)
        np.testing.assert_array_equal(index_search(jnp.asarray(bp), jnp.asarray(x)), expected)


@pytest.mark.parametrize("nu", [1, 2, 3, 5])
def test_derivative_matches_scipy(nu):
    bp, c = random_ppoly(4, trailing=(3,))
    x = probe_points(bp)
    expected = PPoly(c, bp).derivative(nu)(x)
    got = evaluate(jnp.asarray(bp), derivative(jnp.asarray(c), nu),
                                   jnp.asarray(x))
    scaled_close(got, expected, c * 24, bp[-1] - bp[0] + 3)


@pytest.mark.parametrize("nu", [1, 2])
def test_antiderivative_matches_scipy(nu):
    bp, c = random_ppoly(5, trailing=(2,))
    x = probe_points(bp)
    expected = PPoly(c, bp).antiderivative(nu)(x)
    coeffs = antiderivative(jnp.asarray(bp), jnp.asarray(c), nu)
    got = evaluate(jnp.asarray(bp), coeffs, jnp.asarray(x))
    scaled_close(got, expected, np.asarray(coeffs), bp[-1] - bp[0] + 3)


@pytest.mark.parametrize("mode", ["extend", "nan", "periodic"])
@pytest.mark.parametrize("a, b", [(-1.0, 1.0), (-5.0, 7.5), (0.3, -9.0), (2.9, 3.1), (-2.5, 2.5)])
def test_integrate_matches_scipy(mode, a, b):
    bp, c = random_ppoly(6, trailing=(2,))
    bp = np.linspace(-2.0, 3.0, 8) if mode == "periodic" else bp
    expected = PPoly(c, bp, extrapolate=SCIPY_MODE[mode]).integrate(a, b)
    got = integrate(jnp.asarray(bp), jnp.asarray(c), a, b, extrapolate=mode)
    scaled_close(got, expected, c * 50, 20.0)


def test_integrate_clamp_closed_form():
    """The clamped function is constant outside [x_0, x_P]: scipy inside + rectangles."""
    bp, c = random_ppoly(7, trailing=())
    sp = PPoly(c, bp)
    for a, b in [(-4.0, 5.5), (-6.0, -3.0), (4.0, 9.0), (0.0, 1.0)]:
        lo_a, hi_b = np.clip([a, b], bp[0], bp[-1])
        expected = (sp.integrate(lo_a, hi_b) + sp(bp[0]) * max(min(bp[0], b) - a, 0.0)
                    + sp(bp[-1]) * max(b - max(bp[-1], a), 0.0))
        got = integrate(jnp.asarray(bp), jnp.asarray(c), a, b, extrapolate="clamp")
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_float32_within_a_few_ulp_of_float64():
    """A continuous fitted polynomial: f32 evaluation vs the f64 one, in f32 ulps."""
    fit = fit_piecewise(ACTIVATIONS["gelu"].fn, -8.0, 8.0, 64, 3)
    bp32 = np.asarray(fit.pp.breakpoints, np.float32)
    c32 = np.asarray(fit.pp.coeffs, np.float32)
    x32 = np.random.default_rng(0).uniform(-9, 9, 5000).astype(np.float32)
    x32 = np.concatenate([x32, bp32])
    exact = PPoly(c32.astype(np.float64), bp32.astype(np.float64))(x32.astype(np.float64))
    got = np.asarray(evaluate(jnp.asarray(bp32), jnp.asarray(c32),
                                              jnp.asarray(x32), uniform=True))
    assert_within_float32_ulps(got, exact, 4.0, floor=1.0)


# The spec's accuracy table (max |error|, float64, uniform, Chebyshev fit).
SPEC_TABLE = [
    ("gelu", -8.0, 8.0, 1, [4.3e-2, 3.1e-3, 7.8e-4, 1.9e-4]),
    ("gelu", -8.0, 8.0, 3, [3.3e-4, 2.0e-6, 1.3e-7, 7.9e-9]),
    ("silu", -16.0, 16.0, 3, [7.8e-4, 9.5e-6, 6.2e-7, 4.0e-8]),
    ("tanh", -8.0, 8.0, 3, [1.2e-3, 5.1e-6, 3.2e-7, 2.0e-8]),
    ("sigmoid", -16.0, 16.0, 3, [6.0e-4, 2.6e-6, 1.6e-7, 1.0e-8]),
    ("exp", -16.0, 0.0, 3, [2.2e-4, 1.2e-6, 7.6e-8, 4.8e-9]),
]


@pytest.mark.parametrize("name, lo, hi, degree, expected", SPEC_TABLE)
def test_fit_accuracy_matches_spec_table(name, lo, hi, degree, expected):
    fn = ACTIVATIONS[name].fn
    for pieces, want in zip([16, 64, 128, 256], expected, strict=True):
        fit = fit_piecewise(fn, lo, hi, pieces, degree)
        # the table has two significant digits; a dense independent check of the error
        assert abs(fit.max_error - want) <= 0.051 * want, (pieces, fit.max_error, want)
        dense = np.linspace(lo, hi, 200001)
        measured = np.max(np.abs(fit.pp.to_scipy()(dense) - fn(dense)))
        assert measured <= fit.max_error * 1.01


def test_fit_methods_properties():
    fn = ACTIVATIONS["tanh"].fn
    cheb = fit_piecewise(fn, -8.0, 8.0, 32, 3).max_error
    lsq = fit_piecewise(fn, -8.0, 8.0, 32, 3, method="lstsq").max_error
    assert cheb < lsq < 2.0 * cheb
    # Hermite: value and slope match at every breakpoint (C1), closed-form derivative
    herm = fit_piecewise(fn, -8.0, 8.0, 32, 3, method="hermite").pp.to_scipy()
    knots = np.linspace(-8.0, 8.0, 33)
    np.testing.assert_allclose(herm(knots), np.tanh(knots), atol=1e-13)
    np.testing.assert_allclose(herm.derivative()(knots), 1 - np.tanh(knots) ** 2, atol=1e-10)
    # chord: interpolates f at both ends of every piece (continuous)
    chord = fit_piecewise(fn, -8.0, 8.0, 32, 1, method="chord").pp
    left = chord.to_scipy()(knots[:-1])
    np.testing.assert_allclose(left, np.tanh(knots[:-1]), atol=1e-14)
    np.testing.assert_allclose(np.asarray(chord.coeffs[1]), np.tanh(knots[:-1]), atol=1e-14)
    # adaptive breakpoints beat uniform ones on a function with a sharp feature
    def bump(x):
        return np.exp(-(x * 8.0) ** 2)

    uniform = fit_piecewise(bump, -4.0, 4.0, 32, 3).max_error
    adaptive = fit_piecewise(bump, -4.0, 4.0, 32, 3, breakpoints="adaptive")
    assert adaptive.max_error < 0.2 * uniform
    assert not adaptive.pp.uniform


def test_tails_hold_the_asymptotes():
    fit = fit_piecewise(ACTIVATIONS["gelu"].fn, -8.0, 8.0, 16, 3, tails=((0.0,), (1.0, 0.0)))
    sp = fit.pp.to_scipy()
    far = np.array([-1e6, -50.0, -9.0, 9.0, 50.0, 1e6])
    np.testing.assert_allclose(sp(far), [0.0, 0.0, 0.0, 9.0, 50.0, 1e6], atol=1e-12)
    assert fit.pp.num_pieces == 18

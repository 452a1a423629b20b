"""PiecewisePolynomial beside scipy, equinox and flax: conversions, roots, static breakpoints."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import interpolate

from gpustat.piecewise import PiecewisePolynomial

X = np.linspace(0.0, 3.0, 9)
Y = np.sin(2.0 * X)
GRID = np.linspace(-1.0, 4.0, 501)


@pytest.mark.parametrize("make", [
    lambda: interpolate.CubicSpline(X, Y),
    lambda: interpolate.PchipInterpolator(X, Y),
    lambda: interpolate.Akima1DInterpolator(X, Y),
    lambda: interpolate.CubicHermiteSpline(X, Y, np.cos(X)),
    lambda: interpolate.PPoly(np.arange(18.0).reshape(3, 3, 2), np.array([0.0, 0.5, 2.0, 2.5]),
                              extrapolate=False),
], ids=["CubicSpline", "Pchip", "Akima", "CubicHermite", "PPoly-trailing"])
def test_ppoly_round_trip_is_exact(make):
    original = make()
    back = PiecewisePolynomial.from_scipy(original).to_scipy()
    np.testing.assert_array_equal(back.x, original.x)
    np.testing.assert_array_equal(back.c, original.c)
    assert back.extrapolate == original.extrapolate


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_bspline_converts_to_the_same_function(k):
    spline = interpolate.make_interp_spline(X, Y, k=k)
    pp = PiecewisePolynomial.from_scipy(spline)
    assert pp.num_pieces == np.unique(spline.t).size - 1  # no empty pieces at repeated knots
    got = np.asarray(pp(jnp.asarray(GRID), backend="reference"))
    np.testing.assert_allclose(got, spline(GRID), rtol=1e-14, atol=1e-14 * np.abs(Y).max())


def test_bspline_without_extrapolation_is_nan_outside():
    spline = interpolate.make_interp_spline(X, Y, k=3)
    spline.extrapolate = False
    pp = PiecewisePolynomial.from_scipy(spline)
    assert pp.extrapolate == "nan"
    assert np.isnan(float(pp(jnp.asarray(-0.5), backend="reference")))


def test_scipy_extrapolate_values_are_accepted():
    c = np.ones((2, 2))
    assert PiecewisePolynomial(np.array([0.0, 1.0, 2.0]), c, extrapolate=True).extrapolate == "extend"
    assert PiecewisePolynomial(np.array([0.0, 1.0, 2.0]), c, extrapolate=False).extrapolate == "nan"
    assert PiecewisePolynomial(np.array([0.0, 1.0, 2.0]), c, extrapolate=None).extrapolate == "extend"
    with pytest.raises(ValueError, match="extrapolate must be one of"):
        PiecewisePolynomial(np.array([0.0, 1.0, 2.0]), c, extrapolate="wrap")


def _quadratic_with_roots(r1, r2, breakpoints):
    """(x - r1)(x - r2) written piece by piece in local coordinates (closed form)."""
    left = breakpoints[:-1]
    a = np.ones_like(left)
    b = 2 * left - (r1 + r2)
    c = (left - r1) * (left - r2)
    return PiecewisePolynomial(breakpoints, np.stack([a, b, c]))


def test_roots_and_solve_match_the_closed_form():
    pp = _quadratic_with_roots(0.3, 1.7, np.array([0.0, 0.5, 1.0, 2.0]))
    np.testing.assert_allclose(pp.roots(), [0.3, 1.7], rtol=1e-13)
    # (x - 0.3)(x - 1.7) = y  <=>  x = 1 +- sqrt(0.49 + y)
    y = 0.51
    np.testing.assert_allclose(pp.solve(y), [0.0, 2.0], atol=1e-13)
    # "extend" finds the root beyond x_P = 2 of a level reached only there
    np.testing.assert_allclose(pp.solve(1.56), [1 - np.sqrt(2.05), 1 + np.sqrt(2.05)], rtol=1e-13)
    assert pp.solve(1.56, extrapolate=False).size == 0
    clamped = PiecewisePolynomial(pp.breakpoints, pp.coeffs, extrapolate="clamp")
    assert clamped.solve(1.56).size == 0


def test_roots_of_several_polynomials_come_per_polynomial():
    one = _quadratic_with_roots(0.3, 1.7, np.array([0.0, 1.0, 2.0]))
    two = _quadratic_with_roots(0.5, 1.5, np.array([0.0, 1.0, 2.0]))
    both = PiecewisePolynomial(one.breakpoints, jnp.stack([one.coeffs, two.coeffs], axis=-1))
    roots = both.roots()
    assert roots.shape == (2,)
    np.testing.assert_allclose(roots[0], [0.3, 1.7], rtol=1e-13)
    np.testing.assert_allclose(roots[1], [0.5, 1.5], rtol=1e-13)


def test_from_torchpace_raises_no_jax_dtype_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pp = PiecewisePolynomial.from_torchpace(np.ones((4, 3)), np.linspace(0.0, 1.0, 5))
    assert pp.dtype == jax.dtypes.canonicalize_dtype(np.float64)


def test_static_breakpoints_are_not_a_leaf_and_survive_jit_and_grad():
    pp = PiecewisePolynomial(X, np.ones((4, X.size - 1)), static_breakpoints=True)
    assert len(jax.tree.leaves(pp)) == 1
    value = jax.jit(lambda p, z: p(z, backend="reference"))(pp, jnp.asarray([0.4]))
    np.testing.assert_allclose(value, pp(jnp.asarray([0.4]), backend="reference"))
    grad = jax.grad(lambda p: p(jnp.asarray(0.4), backend="reference").sum())(pp)
    assert grad.static_breakpoints and grad.coeffs.shape == pp.coeffs.shape
    with pytest.raises(TypeError, match="static_breakpoints=True needs concrete"):
        jax.jit(lambda b: PiecewisePolynomial(b, jnp.ones((1, 8)), static_breakpoints=True))(X)


def _decayed_step(params):
    """One AdamW step with weight decay on every inexact leaf of ``params``."""
    opt = optax.adamw(0.1, weight_decay=0.5)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = opt.update(grads, opt.init(params), params)
    return optax.apply_updates(params, updates)


def test_equinox_weight_decay_moves_only_the_coefficients():
    eqx = pytest.importorskip("equinox")

    class Activation(eqx.Module):
        pp: PiecewisePolynomial

        def __call__(self, x):
            return self.pp(x, backend="reference")

    model = Activation(PiecewisePolynomial(X, np.ones((4, X.size - 1)), static_breakpoints=True))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    stepped = eqx.combine(_decayed_step(params), static)
    np.testing.assert_array_equal(stepped.pp.breakpoints, model.pp.breakpoints)
    assert not np.allclose(stepped.pp.coeffs, model.pp.coeffs)
    # breakpoints held as a leaf would be moved by the same step
    leafy = Activation(PiecewisePolynomial(X, np.ones((4, X.size - 1))))
    params, static = eqx.partition(leafy, eqx.is_inexact_array)
    moved = eqx.combine(_decayed_step(params), static)
    assert not np.allclose(moved.pp.breakpoints, leafy.pp.breakpoints)


def test_flax_nnx_parameter_is_only_the_coefficients():
    nnx = pytest.importorskip("flax.nnx")

    class Activation(nnx.Module):
        def __init__(self, breakpoints, coeffs):
            self.pp = nnx.data(PiecewisePolynomial(breakpoints, coeffs, static_breakpoints=True))

        def __call__(self, x):
            return self.pp(x, backend="reference")

    model = Activation(X, np.ones((4, X.size - 1)))
    graphdef, state = nnx.split(model)
    assert len(jax.tree.leaves(state)) == 1
    stepped = nnx.merge(graphdef, _decayed_step(state))
    np.testing.assert_array_equal(stepped.pp.breakpoints, model.pp.breakpoints)
    assert not np.allclose(stepped.pp.coeffs, model.pp.coeffs)
    np.testing.assert_allclose(stepped(jnp.asarray([0.5])), stepped.pp(jnp.asarray([0.5]),
                                                                       backend="reference"))

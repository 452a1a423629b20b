"""Public piecewise API: validation, converters, dtype rules, jit/vmap/grad, fitting API."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

import gpustat
from gpustat import BackendUnavailableError
from gpustat.piecewise import (
    ACTIVATIONS,
    PiecewisePolynomial,
    activation,
    aos_to_soa,
    fit_piecewise,
    ppoly_eval,
    soa_to_aos,
)
from tests.helpers import assert_close

BP = np.array([-1.0, 0.0, 0.5, 2.0])
COEFFS = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0], [2.0, 0.0, -1.0], [1.0, 2.0, 0.25]])


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("breakpoints, match", [
    ([0.0, 2.0, 1.0, 3.0], "strictly increasing"),
    ([0.0, 1.0, 1.0, 3.0], "strictly increasing"),
    ([0.0, np.nan, 1.0, 3.0], "finite"),
    ([0.0, 1.0, 2.0, np.inf], "finite"),
    ([[0.0, 1.0, 2.0, 3.0]], "shape"),
    ([0.0], "shape"),
])
def test_bad_breakpoints(breakpoints, match):
    with pytest.raises(ValueError, match=match) as info:
        PiecewisePolynomial(np.asarray(breakpoints), np.ones((2, 3)))
    assert "breakpoints" in str(info.value)


def test_duplicates_after_the_dtype_cast_are_rejected():
    bp = np.array([0.0, 1.0, 1.0 + 1e-12, 2.0])
    PiecewisePolynomial(bp, np.ones((2, 3)))  # distinct in float64
    with pytest.raises(ValueError, match="breakpoints"):
        PiecewisePolynomial(bp, np.ones((2, 3), np.float32))


def test_bad_coeffs_and_modes():
    with pytest.raises(ValueError, match=r"coeffs.*coeffs.shape=\(4, 2\)"):
        PiecewisePolynomial(BP, np.ones((4, 2)))
    with pytest.raises(ValueError, match="coeffs"):
        PiecewisePolynomial(BP, np.ones(3))
    with pytest.raises(TypeError, match="coeffs"):
        PiecewisePolynomial(BP, np.ones((2, 3), np.int32))
    with pytest.raises(ValueError, match="extrapolate"):
        PiecewisePolynomial(BP, COEFFS, extrapolate="linear")
    # scipy's spellings are taken: True (and None) extend, False is "nan"
    assert PiecewisePolynomial(BP, COEFFS, extrapolate=True).extrapolate == "extend"
    assert PiecewisePolynomial(BP, COEFFS, extrapolate=False).extrapolate == "nan"


def test_bad_eval_arguments():
    pp = PiecewisePolynomial(BP, COEFFS)
    with pytest.raises(ValueError, match="nu"):
        pp(np.zeros(3), nu=-1)
    with pytest.raises(ValueError, match="nu"):
        pp.derivative(1.5)
    with pytest.raises(ValueError, match="nu"):  # a bool was taken as order 1
        pp.antiderivative(True)
    with pytest.raises(ValueError, match="backend"):
        pp(np.zeros(3), backend="cuda")
    with pytest.raises(TypeError, match="x must be real"):
        pp(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="PiecewisePolynomial"):
        ppoly_eval((BP, COEFFS), np.zeros(3))


@pytest.mark.skipif(gpustat.available_backends()[0] == "pallas", reason="machine has a GPU")
def test_pallas_without_gpu_raises():
    with pytest.raises(BackendUnavailableError, match="ppoly_eval"):
        PiecewisePolynomial(BP, COEFFS)(np.zeros(3), backend="pallas")


def test_fit_bad_input():
    fn = np.tanh
    with pytest.raises(ValueError, match="method"):
        fit_piecewise(fn, -1, 1, 4, 3, method="spline")
    with pytest.raises(ValueError, match="odd degree"):
        fit_piecewise(fn, -1, 1, 4, 2, method="hermite")
    with pytest.raises(ValueError, match="lo < hi"):
        fit_piecewise(fn, 1, -1, 4, 3)
    with pytest.raises(ValueError, match="num_pieces"):
        fit_piecewise(fn, -1, 1, 0, 3)
    with pytest.raises(ValueError, match="degree"):
        fit_piecewise(fn, -1, 1, 4, -1)
    with pytest.raises(ValueError, match="breakpoints"):
        fit_piecewise(fn, -1, 1, 4, 3, breakpoints=[-1, 0, 1])
    with pytest.raises(ValueError, match="breakpoints"):
        fit_piecewise(fn, -1, 1, 2, 3, breakpoints=[-1, 0.5, 0.2])
    with pytest.raises(ValueError, match="breakpoints"):
        fit_piecewise(fn, -1, 1, 2, 3, breakpoints="chebyshev")
    with pytest.raises(ValueError, match="tails"):
        fit_piecewise(fn, -1, 1, 4, 3, tails=((0.0,), None), extrapolate="clamp")
    with pytest.raises(ValueError, match="tail"):
        fit_piecewise(fn, -1, 1, 4, 1, tails=((1.0, 2.0, 3.0), None))
    with pytest.raises(ValueError, match="non-finite"):
        fit_piecewise(lambda v: np.where(v > 0, v, np.nan), -1, 1, 4, 3)
    with pytest.raises(TypeError, match="callable"):
        fit_piecewise("tanh", -1, 1, 4, 3)
    with pytest.raises(ValueError, match="name"):
        activation("relu6")


# -- semantics and converters ----------------------------------------------------------------
def test_scipy_round_trip_and_modes():
    for mode, scipy_mode in (("extend", True), ("nan", False), ("periodic", "periodic")):
        sp = PPoly(COEFFS, BP, extrapolate=scipy_mode)
        pp = PiecewisePolynomial.from_scipy(sp)
        assert pp.extrapolate == mode
        back = pp.to_scipy()
        np.testing.assert_array_equal(back.c, COEFFS)
        np.testing.assert_array_equal(back.x, BP)
        assert back.extrapolate == scipy_mode
    with pytest.raises(ValueError, match="clamp"):
        PiecewisePolynomial(BP, COEFFS, extrapolate="clamp").to_scipy()


def torchpace_oracle(x, coeffs_aos, partition):
    """torchPACE's pwpa written out: linear scan, global x, x >= pp[P] -> piece 0."""
    out = np.empty_like(x)
    num_pieces = coeffs_aos.shape[0]
    for n, xv in enumerate(x):
        piece = 0
        for i in range(num_pieces):
            if xv < partition[i + 1]:
                piece = i
                break
        out[n] = np.polyval(coeffs_aos[piece], xv)
    return out


def test_from_torchpace_matches_its_scan_inside_and_fixes_the_end():
    rng = np.random.default_rng(0)
    partition = np.array([-3.0, -1.0, 0.5, 2.0, 4.0])
    coeffs_aos = rng.normal(size=(4, 4))
    pp = PiecewisePolynomial.from_torchpace(coeffs_aos, partition)
    x = np.concatenate([rng.uniform(-3.0, 4.0, 50), partition[:-1]])
    assert_close(pp(x), torchpace_oracle(x, coeffs_aos, partition), rtol=1e-12, atol=1e-12)
    # torchPACE sends x >= partition[P] to piece 0; here the last piece continues
    end = np.array([4.0, 5.0])
    assert_close(pp(end), np.polyval(coeffs_aos[-1], end), rtol=1e-12)
    soa = pp.from_torchpace(aos_to_soa(coeffs_aos), partition, aos=False)
    assert_close(soa.coeffs, pp.coeffs, rtol=0)
    back, points = pp.to_torchpace()
    assert_close(back, coeffs_aos, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(points, partition)
    np.testing.assert_array_equal(soa_to_aos(aos_to_soa(coeffs_aos)), coeffs_aos)


def test_calculus_methods_match_scipy():
    pp = PiecewisePolynomial(BP, COEFFS)
    sp = PPoly(COEFFS, BP)
    x = np.linspace(-2.0, 3.0, 41)
    assert_close(pp.derivative(2)(x), sp.derivative(2)(x), rtol=1e-12, atol=1e-12)
    assert_close(pp(x, nu=1), sp(x, nu=1), rtol=1e-12, atol=1e-12)
    assert_close(pp.antiderivative(2)(x), sp.antiderivative(2)(x), rtol=1e-12, atol=1e-12)
    assert_close(pp.integrate(-0.7, 2.5), sp.integrate(-0.7, 2.5), rtol=1e-12)
    periodic = PiecewisePolynomial(BP, COEFFS, extrapolate="periodic")
    assert periodic.antiderivative().extrapolate == "nan"
    assert pp.derivative(7).degree == 0


def test_dtype_rules_and_shapes():
    pp64 = PiecewisePolynomial(BP, COEFFS)
    pp32 = PiecewisePolynomial(BP.astype(np.float32), COEFFS.astype(np.float32))
    assert pp64(jnp.zeros((2, 3), jnp.bfloat16)).dtype == jnp.bfloat16
    assert pp64(jnp.zeros((2, 3), jnp.float32)).dtype == jnp.float32
    assert pp32(jnp.zeros(4, jnp.float64)).dtype == jnp.float64
    assert pp32(jnp.arange(4)).dtype == jnp.float32
    assert pp64(jnp.arange(4)).dtype == jnp.float64
    trailing = PiecewisePolynomial(BP, np.ones((2, 3, 4, 5)))
    assert trailing(jnp.zeros((6, 7))).shape == (6, 7, 4, 5)
    assert trailing.trailing_shape == (4, 5)
    assert PiecewisePolynomial(np.linspace(0, 1, 9), np.ones((2, 8))).uniform
    assert not PiecewisePolynomial(BP, COEFFS).uniform
    assert pp32(jnp.float32(0.25)).shape == ()


def test_jit_vmap_with_traced_polynomials():
    pp = PiecewisePolynomial(BP, COEFFS, extrapolate="clamp")
    x = jnp.linspace(-2.0, 3.0, 11)
    expected = PPoly(COEFFS, BP)(np.clip(np.asarray(x), BP[0], BP[-1]))

    @jax.jit
    def rebuild(bp, coeffs, points):  # traced breakpoints: value checks are skipped
        return PiecewisePolynomial(bp, coeffs, extrapolate="clamp")(points)

    assert_close(rebuild(jnp.asarray(BP), jnp.asarray(COEFFS), x), expected, rtol=1e-12)
    assert_close(jax.jit(lambda p, v: p(v))(pp, x), expected, rtol=1e-12)
    batch = jnp.stack([jnp.asarray(COEFFS), 2.0 * jnp.asarray(COEFFS)])
    mapped = jax.vmap(lambda c: PiecewisePolynomial(BP, c, extrapolate="clamp")(x))(batch)
    assert_close(mapped, np.stack([expected, 2.0 * expected]), rtol=1e-12)
    assert_close(jax.vmap(pp)(x[:, None])[:, 0], expected, rtol=1e-12)


def test_grad_and_jvp_in_x_and_coefficients():
    pp = PiecewisePolynomial(BP, COEFFS)
    x = jnp.asarray([-1.5, -0.3, 0.2, 0.9, 2.7])
    grad_x = jax.vmap(jax.grad(lambda v: pp(v)))(x)
    assert_close(grad_x, PPoly(COEFFS, BP).derivative()(np.asarray(x)), rtol=1e-12)
    _, tangent = jax.jvp(lambda v: pp(v), (x,), (jnp.ones_like(x),))
    assert_close(tangent, grad_x, rtol=1e-12)

    def loss(coeffs):  # d/dc of sum_x p(x): a sum of powers of u per piece (closed form)
        return jnp.sum(PiecewisePolynomial(BP, coeffs)(x))

    grad_c = np.asarray(jax.grad(loss)(jnp.asarray(COEFFS)))
    piece = np.clip(np.searchsorted(BP, np.asarray(x), side="right") - 1, 0, 2)
    expected = np.zeros_like(COEFFS)
    for xv, i in zip(np.asarray(x), piece, strict=True):
        expected[:, i] += (xv - BP[i]) ** np.arange(3, -1, -1)
    assert_close(grad_c, expected, rtol=1e-12, atol=1e-12)
    # breakpoints are constants: no gradient flows to them
    grad_bp = jax.grad(lambda bp: jnp.sum(PiecewisePolynomial(bp, COEFFS)(x)))(jnp.asarray(BP))
    np.testing.assert_array_equal(grad_bp, 0.0)


def test_activation_api():
    pp = activation("silu", num_pieces=64, degree=3, dtype=jnp.float64)
    assert pp.num_pieces == 66 and pp.dtype == jnp.float64 and pp.uniform
    assert activation("silu", num_pieces=64, dtype=jnp.float64) is pp  # cached
    x = np.linspace(-60.0, 60.0, 2001)
    err = np.max(np.abs(np.asarray(pp(x)) - ACTIVATIONS["silu"].fn(x)))
    assert err < 3e-5  # fit error at P=64 on [-20, 20]; tails within 4e-8
    assert activation("exp", num_pieces=16).num_pieces == 17


# -- clamp calculus, immutability, scipy conversions of other forms -------------------------
def _clamped_scipy(x):
    """The clamped function p(clip(x)) evaluated by scipy (the oracle)."""
    return PPoly(COEFFS, BP)(np.clip(x, BP[0], BP[-1]))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_clamp_derivatives_are_those_of_the_clamped_function(backend):
    jax.config.update("jax_enable_x64", True)
    pp = PiecewisePolynomial(BP, COEFFS, extrapolate="clamp")
    x = np.array([-3.0, -1.5, -0.7, 0.3, 1.1, 1.9, 2.5, 7.0])  # no breakpoint within 1e-4
    h = 1e-5
    slope = (_clamped_scipy(x + h) - _clamped_scipy(x - h)) / (2 * h)
    assert_close(pp(x, nu=1, backend=backend), slope, rtol=1e-8, atol=1e-8)
    assert_close(pp.derivative()(x, backend=backend), slope, rtol=1e-8, atol=1e-8)
    assert_close(jax.vmap(jax.grad(lambda t: pp(t, backend=backend)))(x), slope, rtol=1e-8,
                 atol=1e-8)
    assert pp.derivative().extrapolate == "extend"


@pytest.mark.parametrize("nu", [1, 2])
def test_clamp_antiderivative_is_that_of_the_clamped_function(nu):
    jax.config.update("jax_enable_x64", True)
    pp = PiecewisePolynomial(BP, COEFFS, extrapolate="clamp")
    F = pp.antiderivative(nu)
    x = np.array([-3.0, -1.5, -0.7, 0.3, 1.1, 1.9, 2.5, 7.0])
    h = 1e-3
    if nu == 1:  # F' = p(clip(x)); and F(b) - F(a) = the clamped integral, bounds outside
        derived = (F(x + h) - F(x - h)) / (2 * h)
        assert_close(F(6.0) - F(-4.0), pp.integrate(-4.0, 6.0), rtol=1e-12)
    else:  # F'' = p(clip(x))
        derived = (F(x + h) - 2 * F(x) + F(x - h)) / h**2
    assert_close(derived, _clamped_scipy(x), rtol=1e-5, atol=1e-5)
    assert float(F(BP[0])) == 0.0


def test_piecewise_polynomial_is_immutable_and_a_new_one_is_not_stale():
    pp = PiecewisePolynomial(BP, COEFFS)
    x = np.array([-0.5, 1.0])
    before = np.asarray(pp(x, backend="interpret"))  # caches the kernel tables
    with pytest.raises(AttributeError, match="immutable"):
        pp.coeffs = 2 * pp.coeffs
    doubled = PiecewisePolynomial(pp.breakpoints, 2 * pp.coeffs)
    assert_close(doubled(x, backend="interpret"), 2 * before, rtol=1e-6)
    shared = activation("tanh", 16, 3)
    with pytest.raises(AttributeError):
        shared.coeffs *= 0


def test_from_scipy_converts_bernstein_and_decreasing_breakpoints():
    from scipy.interpolate import BPoly

    jax.config.update("jax_enable_x64", True)
    bern = BPoly.from_derivatives([0.0, 1.0, 3.0], [[0.0, 1.0], [1.0, -0.5], [0.0, 2.0]])
    down = PPoly(np.random.default_rng(0).normal(size=(4, 3, 2)), [2.0, 1.0, 0.5, -1.0])
    x = np.linspace(-2.0, 4.0, 40)  # no inner breakpoint: there scipy's decreasing PPoly
    for obj in (bern, down):        # takes the lower piece, an increasing one the upper
        assert_close(PiecewisePolynomial.from_scipy(obj)(x), obj(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match=r"PPoly \(or subclass\), BPoly or BSpline"):
        PiecewisePolynomial.from_scipy(np.polynomial.Polynomial([1.0]))


def test_degenerate_shapes():
    with pytest.raises(ValueError, match="D >= 0"):
        PiecewisePolynomial(BP, np.zeros((0, 3)))
    empty = PiecewisePolynomial(BP, np.zeros((2, 3, 0)))  # no polynomials
    for backend in ("reference", "interpret"):
        assert empty(np.ones(4), backend=backend).shape == (4, 0)
    with pytest.raises(ValueError, match="num_pieces must be an int"):
        activation("tanh", num_pieces=16.5)

"""Public piecewise API: validation, converters, dtype rules, jit/vmap/grad, fitting API."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.interpolate import PPoly

import gpustat
from gpustat import BackendUnavailableError
from gpustat.piecewise import PiecewisePolynomial, aos_to_soa, ppoly_eval, soa_to_aos
from gpustat.piecewise_activations import ACTIVATIONS, activation
from gpustat.piecewise_fit import fit_piecewise
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
    with pytest.raises(ValueError, match="extrapolate"):
        PiecewisePolynomial(BP, COEFFS, extrapolate=True)


def test_bad_eval_arguments():
    pp = PiecewisePolynomial(BP, COEFFS)
    with pytest.raises(ValueError, match="nu"):
        pp(np.zeros(3), nu=-1)
    with pytest.raises(ValueError, match="nu"):
        pp.derivative(1.5)
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

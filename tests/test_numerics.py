"""Public numerics API: dispatch, dtypes, jit/vmap, derivatives, bad input."""

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import mpmath as mp
import numpy as np
import pytest

import gpustat
from gpustat import numerics
from gpustat.testing import check_derivatives
from tests.oracles.numerics_mp import curvature_derivative

OPS = ["erfc", "erfcx", "ndtr", "log_ndtr", "probit_curvature"]


@pytest.mark.parametrize("op", [*OPS, "log_ndtr_and_mills"])
def test_jit_and_vmap(op):
    x = jnp.linspace(-20.0, 8.0, 12).reshape(3, 4)
    fn = getattr(numerics, op)
    eager = fn(x)
    for got in (jax.jit(fn)(x), jax.vmap(fn)(x)):
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(eager), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-14)


def test_integers_promote_and_dtypes_are_kept():
    assert numerics.erfc(jnp.arange(3)).dtype == jnp.float64
    assert numerics.erfc(jnp.ones(3, jnp.float32)).dtype == jnp.float32
    assert numerics.erfc(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


# Derivatives against autodiff of log(ndtr) from jax.scipy.special (lax.erf based, so
# independent; jax's own log_ndtr has a less accurate derivative near 0, so not that).
# Its tails lose accuracy, hence |x| <= 6 here; deep tails are checked vs mpmath.
def test_derivatives_against_jax_scipy():
    x = jnp.array([-6.0, -3.5, -0.3, 0.0, 0.8, 4.0])

    def analytic(v):
        log_cdf, mills = numerics.log_ndtr_and_mills(v)
        return jnp.sum(log_cdf), mills, -jnp.diag(numerics.probit_curvature(v))

    check_derivatives(analytic, lambda v: jnp.sum(jnp.log(jss.ndtr(v))), x).assert_ok()

    def analytic_erfc(v):
        return jnp.sum(numerics.erfc(v)), jax.grad(lambda u: jnp.sum(numerics.erfc(u)))(v)

    check_derivatives(analytic_erfc, lambda v: jnp.sum(jss.erfc(v)), x[1:]).assert_ok()


@pytest.mark.parametrize("op", OPS)
def test_custom_jvp_matches_finite_differences(op):
    fn = getattr(numerics, op)
    x = jnp.array([-12.0, -3.2, -0.7, 0.4, 2.5])
    grad = jax.vmap(jax.grad(fn))(x)
    h = 1e-6
    fd = (fn(x + h) - fn(x - h)) / (2 * h)
    # central-difference rounding: |f| eps / h <= 2 * 2.2e-16 / 1e-6 = 4.4e-10 absolute
    np.testing.assert_allclose(np.asarray(grad), np.asarray(fd), rtol=2e-7, atol=1e-9)


def test_deep_tail_derivatives_against_mpmath():
    x = np.array([-1e3, -45.0, -9.0, 9.0])
    dlog = jax.vmap(jax.grad(numerics.log_ndtr))(jnp.asarray(x))
    with mp.workdps(40):  # its own precision (another module's global setting need not run first)
        expected = [float(mp.npdf(v) / mp.ncdf(v)) for v in x]
    np.testing.assert_allclose(np.asarray(dlog), expected, rtol=1e-14)


def test_mills_jvp_is_minus_curvature():
    x = jnp.array([-50.0, -2.0, 1.0])
    dmills = jax.vmap(jax.grad(lambda v: numerics.log_ndtr_and_mills(v)[1]))(x)
    np.testing.assert_allclose(np.asarray(dmills), -np.asarray(numerics.probit_curvature(x)),
                               rtol=1e-15)


@pytest.mark.parametrize("bad", [jnp.array([1 + 2j]), jnp.array([True])])
def test_bad_dtype_raises_naming_x(bad):
    with pytest.raises(TypeError, match="x must be real"):
        numerics.log_ndtr(bad)


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="backend must be one of"):
        numerics.erfc(jnp.ones(2), backend="cuda")


@pytest.mark.skipif(gpustat._backend.cuda_gpu_available(), reason="this machine has a GPU")
def test_pallas_without_gpu_raises_clearly():
    with pytest.raises(gpustat.BackendUnavailableError, match="needs a CUDA GPU"):
        numerics.erfc(jnp.ones(2), backend="pallas")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("op", ["log_ndtr", "probit_curvature", "erfcx"])
def test_16_bit_derivatives_are_the_float32_ones_rounded(op, dtype):
    """16-bit x computes in float32: its derivative too (it overflowed or cancelled)."""
    x = jnp.array([-8.0, -5.0, -3.0, -1.0, 0.5, 2.0])
    fn = getattr(numerics, op)
    want = jax.vmap(jax.grad(fn))(x)  # float32
    got = jax.vmap(jax.grad(fn))(x.astype(dtype))
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float64),  # out of range: +-inf alike
                               np.asarray(want.astype(dtype), np.float64),
                               rtol=float(jnp.finfo(dtype).eps))


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_empty_input_keeps_its_shape(backend):
    for shape in [(0,), (3, 0, 2)]:
        assert numerics.ndtr(jnp.zeros(shape), backend=backend).shape == shape
        pair = numerics.log_ndtr_and_mills(jnp.zeros(shape), backend=backend)
        assert [p.shape for p in pair] == [shape, shape]


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_erfcx_derivative_in_the_far_tail_against_mpmath(backend):
    """2x erfcx(x) - 2/√π cancels for large x: the tail form keeps full precision."""
    x = np.array([-20.0, -0.3, 0.0, 1.0, 3.9, 4.0, 4.1, 10.0, 1e3, 1e6, 1e8, 1e15])
    got = jax.vmap(jax.grad(lambda t: numerics.erfcx(t, backend=backend)))(jnp.asarray(x))
    with mp.workdps(60):
        want = [float(2 * mp.mpf(v) * mp.erfc(v) * mp.exp(mp.mpf(v) ** 2) - 2 / mp.sqrt(mp.pi))
                for v in x]
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-14)
    assert float(jax.grad(lambda t: numerics.erfcx(t, backend=backend))(jnp.inf)) == 0.0


@pytest.mark.parametrize("dtype, rtol", [(jnp.float64, 5e-13), (jnp.float32, 2e-5)])
def test_curvature_derivative_against_mpmath(dtype, rtol):
    """Its two terms cancel for x << 0 (4e-5 relative at -1e3 in float64, 2.5e-4 at -8
    in float32, NaN at -inf before): the continued fraction's q'' replaces them there."""
    x = jnp.concatenate([jnp.linspace(-12.0, 8.0, 81), jnp.array([-1e8, -1e3, -30.0])])
    x = x.astype(dtype)
    got = np.asarray(jax.jit(jax.vmap(jax.grad(numerics.probit_curvature)))(x), np.float64)
    want = np.array([curvature_derivative(v) for v in np.asarray(x, np.float64)])
    np.testing.assert_allclose(got, want, rtol=rtol)
    at_inf = jax.vmap(jax.grad(numerics.probit_curvature))(jnp.array([-jnp.inf, jnp.inf], dtype))
    assert np.array_equal(np.asarray(at_inf), [0.0, 0.0])


def test_ndtr_and_pdf_against_mpmath():
    """The shared-exponential pair of the BMS calibration (gpustat.reference.numerics):
    relative error below 1e-13 while Φ(-|x|) is a normal float64, on a grid that
    crosses Cody's interval ends (|x| = 0.46875 √2 and 4 √2)."""
    from gpustat.reference.numerics import ndtr_and_pdf

    x = np.r_[np.linspace(-37.0, 37.0, 1481), [-0.6629126, 0.6629126, -5.6568542, 5.6568542]]
    cdf, pdf = map(np.asarray, ndtr_and_pdf(jnp.asarray(x, jnp.float64)))
    with mp.workdps(40):
        want_cdf = np.array([float(mp.ncdf(v)) for v in x])
        want_pdf = np.array([float(mp.npdf(v)) for v in x])
    np.testing.assert_allclose(cdf, want_cdf, rtol=1e-13, atol=0)
    np.testing.assert_allclose(pdf, want_pdf, rtol=1e-13, atol=0)

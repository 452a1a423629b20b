"""Public numerics at the ends of the real line, higher derivatives, 16-bit tangents and
non-numeric input, against mpmath, the functions' closed-form limits and asymptotics."""

import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest

from gpustat import numerics
from tests.oracles.numerics_mp import curvature_derivative

BACKENDS = ["reference", "interpret"]
DTYPES = [jnp.float32, jnp.float64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mills_is_finite_down_to_the_most_negative_float(dtype, backend):
    """λ(x) = -x + 1/(-x) + O(x^-3) (Laplace), which is -x to the dtype's precision here.

    The tail's erfcx(-x/√2) is subnormal there and flushes to 0: λ and (log Φ)' were +inf
    below x = -6.7e37 in float32 and -3.6e307 in float64.
    """
    big = float(jnp.finfo(dtype).max)
    x = jnp.array([-big / 4, -big / 2, -big], dtype)
    want = -np.asarray(x, np.float64)
    mills = numerics.log_ndtr_and_mills(x, backend=backend)[1]
    dlog = jax.vmap(jax.grad(lambda v: numerics.log_ndtr(v, backend=backend)))(x)
    for got in (mills, dlog):
        np.testing.assert_allclose(np.asarray(got, np.float64), want,
                                   rtol=float(jnp.finfo(dtype).eps))


def _mills(v, backend="auto"):
    return numerics.log_ndtr_and_mills(v, backend=backend)[1]


# Second derivatives at x = -max/4, -inf, +inf. The limits, from the closed forms:
# erfc'' = 4x e^{-x^2}/√π, Φ'' = -x φ(x), erfcx'' ~ 2/(√π x^3) (x -> +inf), (log Φ)'' = -C
# with C(-inf) = 1, C(+inf) = 0 (spec A.6; C = 1 - 1/x^2 + ... rounds to 1 at -max/4),
# λ'' = -C' and C'' ~ 6/x^4 as x -> -inf, both vanishing at +inf.
SECOND_LIMITS = {
    "erfc": [0.0, 0.0, 0.0],
    "ndtr": [0.0, 0.0, 0.0],
    "log_ndtr": [-1.0, -1.0, 0.0],
    "mills": [0.0, 0.0, 0.0],
    "probit_curvature": [0.0, 0.0, 0.0],
}


@pytest.mark.parametrize("name", list(SECOND_LIMITS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_second_derivatives_at_the_ends_of_the_line(name, dtype):
    """They were NaN there: exp(-x*x) differentiated at ±inf (erfc, ndtr), the rational
    approximations differentiated where x^2 overflows ((log Φ)'' below -1.9e154, λ'' at
    +inf) and the tail root's s^3 in C'' below -1.3e154 (float32: -1.8e19)."""
    fn = _mills if name == "mills" else getattr(numerics, name)
    x = jnp.array([-float(jnp.finfo(dtype).max) / 4, -jnp.inf, jnp.inf], dtype)
    got = jax.vmap(jax.grad(jax.grad(fn)))(x)
    np.testing.assert_array_equal(np.asarray(got, np.float64), SECOND_LIMITS[name])


@pytest.mark.parametrize("dtype", DTYPES)
def test_erfcx_second_derivative_on_the_right(dtype):
    """erfcx'' = 2 erfcx + 2x erfcx' ~ 2/(√π x^3) (1 - 6/x^2 ...): NaN at +inf before, 0 from
    x ~ 1e77 on (1/x^2 squared underflowed in its tail's z = 1/x^2) in float64."""
    x = jnp.array([1e25, 1e80, 1e100, jnp.inf] if dtype == jnp.float64 else [1e4, 1e12, jnp.inf],
                  dtype)
    got = np.asarray(jax.vmap(jax.grad(jax.grad(numerics.erfcx)))(x), np.float64)
    x64 = np.asarray(x, np.float64)
    with np.errstate(divide="ignore"):
        want = 2 / (np.sqrt(np.pi) * x64**3)
    # Cody's tail rational gives its z -> 0 slope 1/(2√π) to 4.4e-15
    np.testing.assert_allclose(got, want, rtol=1e-14 if dtype == jnp.float64 else 1e-6)


def _mp_gaussian_derivative(name, order, x):
    """erfc' = -2/√π e^{-x^2}, erfc'' = -2x erfc'; Φ' = φ, Φ'' = -x φ; at 40 digits."""
    with mp.workdps(40):
        x = mp.mpf(x)
        if name == "erfc":
            first = -2 / mp.sqrt(mp.pi) * mp.exp(-x * x)
            return float(first if order == 1 else -2 * x * first)
        first = mp.exp(-x * x / 2) / mp.sqrt(2 * mp.pi)
        return float(first if order == 1 else -x * first)


# The derivatives of erfc and Φ carry the values' Gaussian factor. With exp(-x*x) unsplit
# the first lost x^2 ulps (5.7e-14 near |x| = 25 in float64, 3.9e-6 near 9 in float32)
# where the values keep 7e-16 and 4e-7. The second is checked where that factor is nearly
# subnormal but the result is not (float32 x in [8.8, 9.3] for erfc): differentiating the
# split exponent added a flushed (y - h) e term (3e-3 off in float32).
@pytest.mark.parametrize("dtype, rtol, stop, band", [(jnp.float64, 2e-15, 26.0, (26.0, 26.6)),
                                                     (jnp.float32, 1e-6, 9.0, (8.8, 9.3))])
@pytest.mark.parametrize("name", ["erfc", "ndtr"])
@pytest.mark.parametrize("order", [1, 2])
def test_gaussian_derivatives_against_mpmath(order, name, dtype, rtol, stop, band):
    scale = 1.0 if name == "erfc" else np.sqrt(2.0)  # Φ's factor is exp(-x^2/2)
    if order == 1:
        x = np.linspace(-stop, stop, 211)
    else:
        x = np.concatenate([-np.linspace(*band, 101), np.linspace(-4.0, 4.0, 41),
                            np.linspace(*band, 101)])
    x = jnp.asarray(x * scale, dtype)
    fn = jax.grad(getattr(numerics, name))
    if order == 2:
        fn = jax.grad(fn)
    got = np.asarray(jax.jit(jax.vmap(fn))(x), np.float64)
    want = [_mp_gaussian_derivative(name, order, v) for v in np.asarray(x, np.float64)]
    np.testing.assert_allclose(got, want, rtol=rtol)


@pytest.mark.parametrize("dtype, rtol", [(jnp.float64, 5e-13), (jnp.float32, 2e-5)])
def test_third_derivative_of_log_ndtr_against_mpmath(dtype, rtol):
    """(log Φ)''' = λ'' = -C'. They differentiated the reference's λ(x + λ) (cancelling for
    x < 0: 1.3e-4 at x = -2.8 in float32), not the curvature's own exact derivative."""
    x = jnp.concatenate([jnp.linspace(-12.0, 8.0, 81), jnp.linspace(-3.5, -2.0, 61),
                         jnp.array([-1e3, -30.0])]).astype(dtype)
    want = -np.array([curvature_derivative(v) for v in np.asarray(x, np.float64)])
    third = jax.grad(jax.grad(jax.grad(numerics.log_ndtr)))
    for fn in (jax.grad(jax.grad(_mills)), third):
        got = np.asarray(jax.jit(jax.vmap(fn))(x), np.float64)
        np.testing.assert_allclose(got, want, rtol=rtol)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_16_bit_pair_tangents_are_the_float32_ones_rounded(dtype):
    """16-bit x differentiates in float32 (as the single-output ops): λ' = -C was rounded to
    16 bits before the product (bfloat16 tangent at x = 0.5, dx = -7: 3.609, not 3.594)."""
    x = jnp.array([-8.0, -3.0, -1.0, 0.5, 2.0])
    dx = jnp.array([3.0, -7.0, 5.0, -7.0, 3.0])
    want = jax.jvp(numerics.log_ndtr_and_mills, (x,), (dx,))[1]
    got = jax.jvp(numerics.log_ndtr_and_mills, (x.astype(dtype),), (dx.astype(dtype),))[1]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_array_equal(np.asarray(g, np.float64),
                                      np.asarray(w.astype(dtype), np.float64))


@pytest.mark.parametrize("bad", ["abc", None, [1.0, "a"], np.array(["a"])])
@pytest.mark.parametrize("op", ["erfc", "log_ndtr_and_mills"])
def test_non_numeric_input_raises_naming_x(op, bad):
    with pytest.raises(TypeError, match=rf"numerics\.{op}: x must be"):
        getattr(numerics, op)(bad)

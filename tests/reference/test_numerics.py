"""Probit numerics reference vs mpmath (independent arbitrary precision) and identities."""

import functools

import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest

from gpustat.reference import numerics as ref

mp.mp.dps = 40

# Spec bms_flex.md A.6 table: x, log Φ(x), λ(x), C(x) (mpmath, rel err <= 9e-15).
SPEC_TABLE = [
    (-40, -8.04608442013753574e02, 4.00249688472072620e01, 9.99377331621408627e-01),
    (-10, -5.32312851505124627e01, 1.00980932339624960e01, 9.90554622174343757e-01),
    (-4, -1.03601014865272898e01, 4.22560714448947294e00, 9.53327161602580686e-01),
    (-1, -1.84102164500926335e00, 1.52513527616098132e00, 8.00902334429651419e-01),
    (0, -6.93147180559945286e-01, 7.97884560802865406e-01, 6.36619772367581382e-01),
    (1, -1.72753779023449905e-01, 2.87599970939178384e-01, 3.70313714223394597e-01),
    (5, -2.86651612963764265e-07, 1.48671994090490585e-06, 7.43360191486071192e-06),
    (10, -7.61985302416059304e-24, 7.69459862670641994e-23, 7.69459862670641947e-22),
]

# [-1e3, 1e3]: a dense core, log-spaced tails on both sides and Cody's interval edges.
GRID = np.unique(np.concatenate([
    np.linspace(-40.0, 40.0, 641),
    -np.logspace(-6, 3, 180), np.logspace(-6, 3, 180),
    [0.0, 0.46875, -0.46875, 4.0, -4.0, 3.0, -3.0, 26.0, -26.0, 26.5, -26.5, 1e3, -1e3],
]))


def _mp_log_ndtr(x):
    x = mp.mpf(x)
    return mp.log(mp.ncdf(x)) if x < 0 else mp.log1p(-mp.ncdf(-x))


def _mp_mills(x):
    x = mp.mpf(x)
    return mp.npdf(x) / mp.ncdf(x)


def _mp_curvature(x):
    lam = _mp_mills(x)
    return lam * (mp.mpf(x) + lam)


ORACLES = {
    "erfc": lambda x: mp.erfc(mp.mpf(x)),
    "erfcx": lambda x: mp.exp(mp.mpf(x) ** 2) * mp.erfc(mp.mpf(x)),
    "ndtr": lambda x: mp.ncdf(mp.mpf(x)),
    "log_ndtr": _mp_log_ndtr,
    "mills": _mp_mills,
    "probit_curvature": _mp_curvature,
}

FUNCTIONS = {
    "erfc": ref.erfc,
    "erfcx": ref.erfcx,
    "ndtr": ref.ndtr,
    "log_ndtr": ref.log_ndtr,
    "mills": lambda x: ref.log_ndtr_and_mills(x)[1],
    "probit_curvature": ref.probit_curvature,
}

# Documented float64 bounds (module docstring of gpustat.numerics).
F64_BOUND = {"probit_curvature": 1e-14}
F64_DEFAULT = 2e-15
# float32: 2e-6, except the curvature, whose x + λ cancels by up to 12x just above
# the continued-fraction switch (measured 2.8e-6 near x = -2.7).
F32_BOUND = {"probit_curvature": 5e-6}
F32_DEFAULT = 2e-6


@functools.cache
def _oracle(name: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(inputs rounded to dtype, mpmath values at exactly those inputs)."""
    xs = GRID.astype(dtype)
    return xs, np.array([float(ORACLES[name](float(x))) for x in xs])


def _relative_errors(actual, expected, smallest):
    actual = np.asarray(actual, dtype=np.float64)
    keep = np.isfinite(expected) & (np.abs(expected) >= smallest)
    return np.abs(actual[keep] - expected[keep]) / np.abs(expected[keep])


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_float64_against_mpmath(name):
    xs, expected = _oracle(name, "float64")
    errors = _relative_errors(FUNCTIONS[name](jnp.asarray(xs)), expected, 1e-300)
    assert errors.size > 0.8 * xs.size
    assert errors.max() <= F64_BOUND.get(name, F64_DEFAULT), (name, errors.max())


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_float32_against_mpmath(name):
    xs, expected = _oracle(name, "float32")
    actual = FUNCTIONS[name](jnp.asarray(xs))
    assert actual.dtype == jnp.float32
    # Judged where the result is a normal, finite float32 (subnormals flush on the GPU).
    finfo = np.finfo(np.float32)
    representable = np.abs(expected) <= float(finfo.max)
    errors = _relative_errors(np.asarray(actual)[representable], expected[representable],
                              float(finfo.tiny) * 16)
    assert errors.max() <= F32_BOUND.get(name, F32_DEFAULT), (name, errors.max())


@pytest.mark.parametrize("x, log_cdf, mills, curvature", SPEC_TABLE)
def test_spec_table(x, log_cdf, mills, curvature):
    got_log, got_mills = ref.log_ndtr_and_mills(jnp.float64(x))
    np.testing.assert_allclose(float(got_log), log_cdf, rtol=1e-14)
    np.testing.assert_allclose(float(got_mills), mills, rtol=1e-14)
    np.testing.assert_allclose(float(ref.probit_curvature(jnp.float64(x))), curvature, rtol=1e-14)


def test_deep_tails():
    # λ(-1e100) = 1e100 (spec), log Φ keeps going where Φ underflows, C -> 1.
    log_cdf, mills = ref.log_ndtr_and_mills(jnp.array([-1e100, -1e5, -1e200]))
    np.testing.assert_allclose(np.asarray(mills), [1e100, float(_mp_mills(-1e5)), 1e200],
                               rtol=1e-15)
    np.testing.assert_allclose(float(log_cdf[1]), float(_mp_log_ndtr(-1e5)), rtol=1e-15)
    assert float(ref.probit_curvature(jnp.float64(-1e8))) == pytest.approx(1.0, abs=1e-15)
    # erfcx far right: 1/(x √π) without overflow; erfc in the subnormal range
    np.testing.assert_allclose(float(ref.erfcx(jnp.float64(1e300))),
                               1 / (1e300 * np.sqrt(np.pi)), rtol=1e-15)
    np.testing.assert_allclose(float(ref.erfc(jnp.float64(26.5))),
                               float(mp.erfc(26.5)), rtol=1e-12)


NAN, INF = float("nan"), float("inf")
SPECIAL = {  # x: NaN, +inf, -inf  (spec A.6; erfcx follows scipy on the left)
    "erfc": [NAN, 0.0, 2.0],
    "erfcx": [NAN, 0.0, INF],
    "ndtr": [NAN, 1.0, 0.0],
    "log_ndtr": [NAN, 0.0, -INF],
    "mills": [NAN, 0.0, INF],
    "probit_curvature": [NAN, 0.0, 1.0],
}


@pytest.mark.parametrize("name", list(SPECIAL))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_special_values(name, dtype):
    got = FUNCTIONS[name](jnp.array([NAN, INF, -INF], dtype=dtype))
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), SPECIAL[name])


def test_symmetry_identities():
    x = jnp.asarray(np.linspace(-30, 30, 601))
    np.testing.assert_allclose(np.asarray(ref.erfc(x) + ref.erfc(-x)), 2.0, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(ref.ndtr(x) + ref.ndtr(-x)), 1.0, rtol=1e-15)
    small = jnp.asarray(np.linspace(-5, 5, 101))
    np.testing.assert_allclose(np.asarray(ref.erfcx(small)),
                               np.asarray(jnp.exp(small**2) * ref.erfc(small)), rtol=1e-13)
    # d log Φ / dx = λ and d λ / dx = -C, by central differences in float64
    h = 1e-5
    fd_log = (ref.log_ndtr(x + h) - ref.log_ndtr(x - h)) / (2 * h)
    lam = ref.log_ndtr_and_mills(x)[1]
    np.testing.assert_allclose(np.asarray(fd_log), np.asarray(lam), rtol=1e-7, atol=1e-12)
    fd_lam = (ref.log_ndtr_and_mills(x + h)[1] - ref.log_ndtr_and_mills(x - h)[1]) / (2 * h)
    np.testing.assert_allclose(np.asarray(fd_lam), -np.asarray(ref.probit_curvature(x)),
                               rtol=1e-6, atol=1e-12)


def test_log_ndtr_and_mills_first_output_is_log_ndtr_bitwise():
    x = jnp.asarray(np.linspace(-50, 50, 1001))
    np.testing.assert_array_equal(np.asarray(ref.log_ndtr_and_mills(x)[0]),
                                  np.asarray(ref.log_ndtr(x)))

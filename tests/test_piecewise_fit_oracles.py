"""fit_piecewise and activation against float64 oracles."""

import jax.numpy as jnp
import numpy as np
import pytest

from gpustat.piecewise import activation, fit_piecewise


def test_coefficients_that_overflow_dtype_are_an_error_not_nan():
    """tanh on [-9, 9], P = 1024, D = 9: the top local coefficients reach 1.4e5 (rounding
    noise over h^9), past float16's 65504. The old fit cast them to inf, reported
    max_error 5e-15 and evaluated to NaN on much of the domain."""
    with pytest.raises(ValueError, match="dtype=float16 overflows"):
        fit_piecewise(np.tanh, -9.0, 9.0, 1024, 9, dtype=np.float16)
    with pytest.raises(ValueError, match="dtype=float16 overflows"):
        activation("tanh", 1024, 9, dtype=jnp.float16)
    # a table that fits float16 is still returned, finite and close to tanh
    fit = fit_piecewise(np.tanh, -9.0, 9.0, 64, 3, dtype=np.float16)
    x = np.linspace(-9.0, 9.0, 4001).astype(np.float16)
    y = np.asarray(fit.pp(x), dtype=np.float64)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=0, atol=2e-3)


@pytest.mark.parametrize("f, lo, hi", [(np.tanh, -8.0, 8.0),
                                       (lambda x: 0.5 + 0.5 * np.tanh(0.5 * x), -16.0, 16.0)])
def test_reported_max_error_finds_the_largest_of_equioscillating_peaks(f, lo, hi):
    """Chebyshev fit, P = 16, D = 3 (the docs' tanh and sigmoid rows): the error of the
    middle piece has near-equal peaks; the largest sample (s = 0.5, 1.19168e-3 for tanh)
    is not on the largest peak (s = 0.1475, 1.19471e-3), so the old estimate, refined
    only around it, was 0.24% low."""
    fit = fit_piecewise(f, lo, hi, 16, 3)
    x = np.linspace(lo, hi, 2_000_001)
    dense = np.max(np.abs(fit.pp.to_scipy()(x) - f(x)))
    assert dense * (1 - 1e-5) <= fit.max_error <= dense * (1 + 1e-9), (fit.max_error, dense)


@pytest.mark.parametrize("lo, hi", [("a", 1.0), (None, 1.0), (-1.0, [0.0, 1.0]), (1.0, -1.0)])
def test_bad_interval_names_lo_and_hi(lo, hi):
    """A string, None or an array used to escape as numpy's TypeError ("ufunc 'isfinite'
    not supported") or "truth value ... is ambiguous", naming neither argument."""
    with pytest.raises(ValueError, match=r"lo < hi, got lo=.*, hi="):
        fit_piecewise(np.tanh, lo, hi, 4, 3)

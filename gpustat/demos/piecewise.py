"""Demo: fitted GELU as a piecewise cubic, evaluated through the chosen backend.

Fits GELU on [-8, 8] (P = 256, D = 3, Chebyshev nodes, asymptotic tails), then
evaluates it and its derivative on random points, compared with the exact
float64 GELU and its derivative; also a non-uniform (searched) polynomial
against scipy's ``PPoly``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from scipy import special
from scipy.interpolate import PPoly

from gpustat.demos import DemoRow, max_rel_error, timed
from gpustat.piecewise import PiecewisePolynomial, activation, ppoly_eval

CAPABILITY = "piecewise"


def run(backend: str, small: bool) -> list[DemoRow]:
    n = 4096 if small else 1 << 22
    rng = np.random.default_rng(0)
    x = rng.uniform(-10.0, 10.0, n)
    rows = []

    gelu = activation("gelu", num_pieces=256, degree=3, dtype=jnp.float32)
    x32 = jnp.asarray(x, jnp.float32)
    exact = np.asarray(x32, np.float64) * special.ndtr(np.asarray(x32, np.float64))
    y, seconds = timed(lambda v: ppoly_eval(gelu, v, backend=backend), x32)
    rows.append(DemoRow(CAPABILITY, f"GELU P=256 D=3 f32, n={n}", backend,
                        max_rel_error(y, exact), seconds, "vs exact float64 GELU"))

    slope_exact = special.ndtr(np.asarray(x32, np.float64)) + np.asarray(x32, np.float64) * \
        np.exp(-0.5 * np.asarray(x32, np.float64) ** 2) / np.sqrt(2 * np.pi)
    slope, seconds = timed(lambda v: ppoly_eval(gelu, v, nu=1, backend=backend), x32)
    rows.append(DemoRow(CAPABILITY, "GELU' (nu=1)", backend, max_rel_error(slope, slope_exact),
                        seconds, "derivative piece vs exact"))

    bp = np.sort(rng.uniform(-8.0, 8.0, 101))
    coeffs = rng.normal(size=(4, 100))
    pp = PiecewisePolynomial(bp, coeffs, extrapolate="nan")
    y64, seconds = timed(lambda v: ppoly_eval(pp, v, backend=backend), jnp.asarray(x))
    expected = PPoly(coeffs, bp, extrapolate=False)(x)
    rows.append(DemoRow(CAPABILITY, f"random P=100 D=3 f64 search, n={n}", backend,
                        max_rel_error(y64, expected), seconds, "vs scipy PPoly"))
    return rows

"""Fit a piecewise polynomial to a function on the host, in float64.

On each piece [a, b] (width h, local s = (x - a) / h in [0, 1]) the degree-D
polynomial is found in s, then rescaled to the local coordinate u = x - a:

* ``"chebyshev"``: interpolation at the D+1 Chebyshev points of the first kind,
  within a factor (2/pi) log D + 1 of the best uniform approximation;
* ``"lstsq"``: least squares on max(4(D+1), 16) equispaced samples;
* ``"hermite"`` (odd D): value and the first (D-1)/2 derivatives match at both
  ends, so the result is C^((D-1)/2): f itself at every knot, and derivatives
  from Chebyshev interpolants of f on the two pieces beside the knot (degree
  doubled from 16 up to 256 until the series converges), averaged, so both
  pieces share them;
* ``"chord"``: interpolation at D+1 equispaced points including both ends
  (continuous for D >= 1; D = 1 is the chord, D = 0 takes the midpoint value).

Breakpoints are "uniform", "adaptive" (equidistributes the error: piece i gets a
density (e_i)^(1/(D+1)) / h_i, re-fitted 12 times, best kept) or given.
The error of degree-D interpolation scales as h^(D+1) |f^(D+1)|.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from gpustat._checks import check_int
from gpustat.piecewise._polynomial import PiecewisePolynomial, _real_float64, _taylor_shift

__all__ = ["FIT_METHODS", "PiecewiseFit", "fit_piecewise"]

FIT_METHODS = ("chebyshev", "lstsq", "hermite", "chord")
_ERROR_SAMPLES = 65  # equispaced points per piece for the max-error estimate
_ADAPTIVE_ROUNDS = 12
_DERIVATIVE_DEGREES = (16, 32, 64, 128, 256)  # Chebyshev degrees tried for knot derivatives


class PiecewiseFit(NamedTuple):
    """Result of :func:`fit_piecewise`: the polynomial and its max |p - f| on [lo, hi]."""

    pp: PiecewisePolynomial
    max_error: float


def _vandermonde(s: np.ndarray, degree: int) -> np.ndarray:
    return s[:, None] ** np.arange(degree, -1, -1)[None, :]


def _sample_nodes(method: str, degree: int) -> np.ndarray:
    if method == "chebyshev":
        j = np.arange(degree + 1)
        return np.sort(0.5 * (1.0 + np.cos((2 * j + 1) * np.pi / (2 * degree + 2))))
    if method == "lstsq":
        return np.linspace(0.0, 1.0, max(4 * (degree + 1), 16))
    if degree == 0:  # chord of degree 0: the midpoint value
        return np.array([0.5])
    return np.linspace(0.0, 1.0, degree + 1)


def _values(f: Callable, x: np.ndarray) -> np.ndarray:
    """f at every x: one vectorised call, else one call a point (f of a scalar only)."""
    try:
        y = np.asarray(f(x))
    except (TypeError, ValueError):  # e.g. math.exp, or ``if x > 0`` on an array
        y = None
    if y is None or y.ndim == 0:
        y = np.array([f(float(v)) for v in x.ravel()]).reshape(x.shape)
    return y


def _call(f: Callable, x: np.ndarray) -> np.ndarray:
    y = _real_float64(_values(f, x), "f(x)")
    if y.shape != x.shape:
        raise ValueError(f"f must map an array to one of the same shape, got {x.shape=} -> "
                         f"{y.shape=}")
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        raise ValueError(f"f returned non-finite values on [lo, hi]: f(x)={y.flat[bad[0]]} at "
                         f"x={float(x.flat[bad[0]])!r} ({bad.size} of {y.size} samples)")
    return y


def _chebyshev_series(f: Callable, starts: np.ndarray, ends: np.ndarray,
                      degree: int) -> np.ndarray:
    """(P, degree+1) Chebyshev coefficients of f's interpolant at the first-kind points of
    each piece [start, end] (the discrete cosine transform of the samples)."""
    n = degree + 1
    angles = (np.arange(n) + 0.5) * np.pi / n
    mid, half = 0.5 * (starts + ends), 0.5 * (ends - starts)
    values = _call(f, mid[:, None] + half[:, None] * np.cos(angles)[None, :])
    series = values @ np.cos(np.outer(angles, np.arange(n))) * (2.0 / n)
    series[:, 0] *= 0.5
    return series


def _end_derivatives(series: np.ndarray, widths: np.ndarray,
                     orders: int) -> tuple[np.ndarray, np.ndarray]:
    """Derivatives 1..orders-1 of each piece's Chebyshev series at its left and right
    ends, (orders-1, P) each: T_j^(r)(+-1) = (+-1)^(j+r) prod_{m<r} (j^2 - m^2) / (2m+1)."""
    j = np.arange(series.shape[1])
    at_one = np.ones(j.shape)
    left, right = [], []
    for r in range(1, orders):
        at_one = at_one * (j**2 - (r - 1) ** 2) / (2 * r - 1)
        scale = (2.0 / widths) ** r
        right.append(series @ at_one * scale)
        left.append(series @ (at_one * (-1.0) ** (j + r)) * scale)
    return np.array(left), np.array(right)


def _knot_derivatives(f: Callable, bp: np.ndarray, orders: int) -> np.ndarray:
    """(orders, P+1): f and its derivatives 1..orders-1 at every knot, one value per knot
    for both pieces beside it (so the Hermite fit is C^(orders-1) by construction)."""
    widths = np.diff(bp)
    left = np.zeros((orders - 1, widths.size))
    right = np.zeros_like(left)
    todo = np.arange(widths.size if orders > 1 else 0)
    for series_degree in _DERIVATIVE_DEGREES:
        if not todo.size:
            break
        series = _chebyshev_series(f, bp[todo], bp[todo + 1], series_degree)
        left[:, todo], right[:, todo] = _end_derivatives(series, widths[todo], orders)
        # converged once the last terms are at rounding level
        scale = np.max(np.abs(series), axis=1)
        todo = todo[np.max(np.abs(series[:, -4:]), axis=1) > 1e-14 * scale]
    knots = np.empty((orders, bp.shape[0]))
    knots[0] = _call(f, bp)
    knots[1:, 0], knots[1:, -1] = left[:, 0], right[:, -1]
    knots[1:, 1:-1] = 0.5 * (right[:, :-1] + left[:, 1:])
    return knots


def _hermite_system(degree: int, orders: int) -> np.ndarray:
    """d^r/ds^r of s^p (p = D..0) at s = 0 (first ``orders`` rows) and s = 1."""
    powers = np.arange(degree, -1, -1)
    return np.array([[math.perm(p, r) * end ** (p - r) if p >= r else 0.0 for p in powers]
                     for end in (0.0, 1.0) for r in range(orders)])


def _fit_pieces(f: Callable, bp: np.ndarray, degree: int, method: str) -> np.ndarray:
    """Local-coordinate coefficients (D+1, P), highest power first."""
    widths = np.diff(bp)
    powers = np.arange(degree, -1, -1)
    if method == "hermite":
        orders = (degree + 1) // 2
        knots = _knot_derivatives(f, bp, orders)
        scale = widths[None, :] ** np.arange(orders)[:, None]  # d/ds = h d/dx
        rhs = np.concatenate([knots[:, :-1] * scale, knots[:, 1:] * scale])
        coeffs_s = np.linalg.solve(_hermite_system(degree, orders), rhs)
    else:
        s = _sample_nodes(method, degree)
        values = _call(f, bp[:-1, None] + widths[:, None] * s[None, :])  # (P, m)
        vander = _vandermonde(s, degree)
        coeffs_s = np.linalg.lstsq(vander, values.T, rcond=None)[0]
    return coeffs_s / widths[None, :] ** powers[:, None]


def _abs_errors(f: Callable, bp: np.ndarray, coeffs: np.ndarray, s: np.ndarray) -> np.ndarray:
    """|p - f| at the fractions s (P, m) of each piece."""
    u = np.diff(bp)[:, None] * s
    x = bp[:-1, None] + u
    approx = np.zeros_like(x)
    for c in coeffs:
        approx = approx * u + c[:, None]
    return np.abs(approx - _call(f, x))


def _piece_errors(f: Callable, bp: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """Max |p - f| on each piece: over equispaced samples (both ends included), then over
    as many again between the two neighbours of each of the piece's D+2 largest local
    maxima (a near-best fit equioscillates: the largest sample may sit on the wrong peak)."""
    pieces = bp.shape[0] - 1
    s = np.linspace(0.0, 1.0, _ERROR_SAMPLES)
    coarse = _abs_errors(f, bp, coeffs, np.broadcast_to(s, (pieces, s.shape[0])))
    padded = np.pad(coarse, ((0, 0), (1, 1)), constant_values=-1.0)
    peaks = (coarse >= padded[:, :-2]) & (coarse >= padded[:, 2:])
    top = np.argsort(np.where(peaks, coarse, -1.0), axis=1)[:, -(coeffs.shape[0] + 1):]
    around = s[top][..., None] + (s - 0.5) * (2.0 / (_ERROR_SAMPLES - 1))  # (P, D+2, m)
    fine = _abs_errors(f, bp, coeffs, np.clip(around, 0.0, 1.0).reshape(pieces, -1))
    return np.maximum(coarse.max(axis=1), fine.max(axis=1))


def _equidistribute(bp: np.ndarray, errors: np.ndarray, degree: int) -> np.ndarray:
    density = np.maximum(errors, 1e-300) ** (1.0 / (degree + 1)) / np.diff(bp)
    density = np.maximum(density, 1e-3 * density.max())  # no piece grows without bound
    mass = np.concatenate([[0.0], np.cumsum(density * np.diff(bp))])
    targets = np.linspace(0.0, mass[-1], bp.shape[0])
    new = np.interp(targets, mass, bp)
    new[0], new[-1] = bp[0], bp[-1]
    return new


def _tail_piece(coeffs_global: Sequence[float], knot: float, degree: int) -> np.ndarray:
    c = np.asarray(coeffs_global, dtype=np.float64)
    if c.ndim != 1 or c.shape[0] > degree + 1 or c.shape[0] == 0:
        raise ValueError(f"each tail must be 1 to D+1 = {degree + 1} global coefficients, got "
                         f"shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"tails must be finite, got {c}")
    c = np.concatenate([np.zeros(degree + 1 - c.shape[0]), c])[:, None]
    return _taylor_shift(c, np.array([knot]))[:, 0]


def _check_args(f, lo, hi, num_pieces, degree, method, breakpoints) -> np.ndarray | None:
    if not callable(f):
        raise TypeError(f"f must be callable, got {type(f).__name__}")
    try:
        ok = bool(np.isfinite(lo) and np.isfinite(hi) and lo < hi)
    except (TypeError, ValueError):  # not a real number, or an array of several
        ok = False
    if not ok:
        raise ValueError(f"need finite real numbers lo < hi, got {lo=}, {hi=}")
    check_int(num_pieces, "num_pieces", 1)
    check_int(degree, "degree", 0)
    if method not in FIT_METHODS:
        raise ValueError(f"method must be one of {FIT_METHODS}, got {method=!r}")
    if method == "hermite" and degree % 2 == 0:
        raise ValueError(f"method='hermite' needs an odd degree, got {degree=}")
    if isinstance(breakpoints, str):
        if breakpoints not in ("uniform", "adaptive"):
            raise ValueError(f"breakpoints must be 'uniform', 'adaptive' or an array, got "
                             f"{breakpoints=!r}")
        return None
    bp = np.asarray(breakpoints, dtype=np.float64)
    if bp.shape != (num_pieces + 1,):
        raise ValueError(f"breakpoints must have shape (num_pieces+1,) = ({num_pieces + 1},), "
                         f"got {bp.shape=}")
    if not np.all(np.isfinite(bp)) or np.any(np.diff(bp) <= 0):
        raise ValueError("breakpoints must be finite and strictly increasing")
    if bp[0] != lo or bp[-1] != hi:
        raise ValueError(f"breakpoints must run from lo to hi, got {bp[0]=}, {bp[-1]=}, "
                         f"{lo=}, {hi=}")
    return bp


def fit_piecewise(f: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, num_pieces: int,
                  degree: int, *, method: str = "chebyshev",
                  breakpoints: str | Sequence[float] = "uniform",
                  tails: tuple[Sequence[float] | None, Sequence[float] | None] | None = None,
                  extrapolate: str = "extend", dtype=np.float64) -> PiecewiseFit:
    """Fit a degree-D piecewise polynomial to ``f`` on [lo, hi] (host, float64).

    Args:
        f: real function, finite on [lo, hi]: vectorised (a float64 numpy array in,
            the same shape out), or else called once a point with a float.
        lo, hi: finite interval ends, lo < hi.
        num_pieces: P, pieces inside [lo, hi].
        degree: D (odd for "hermite").
        method: "chebyshev", "lstsq", "hermite" or "chord" (module docstring).
        breakpoints: "uniform", "adaptive", or a (P+1,) strictly increasing array
            from lo to hi.
        tails: optional ``(left, right)``; each None (the end piece continues) or
            the global-coordinate coefficients (highest power first, at most D+1)
            of an asymptote, e.g. ``(0.0,)`` for 0 or ``(1.0, 0.0)`` for x. Each
            given tail adds one piece of the mean width outside [lo, hi] holding
            the asymptote, which then continues to +-inf. Needs "extend".
        extrapolate: the result's extrapolation mode.
        dtype: dtype of the returned coefficients (the fit itself is float64).

    Returns:
        ``PiecewiseFit(pp, max_error)``: max |p - f| on [lo, hi] over 65 equispaced
        points per piece and 65 more between the neighbours of each of the piece's
        D+2 largest local maxima, evaluated in float64 before any cast to ``dtype``.

    Raises:
        ValueError: bad sizes, interval, method, breakpoints or tails, f not
            finite on the samples (the message names the first such x), or
            coefficients that overflow ``dtype``.
        TypeError: f not callable or complex-valued.
    """
    given = _check_args(f, lo, hi, num_pieces, degree, method, breakpoints)
    lo, hi = float(lo), float(hi)
    bp = given if given is not None else np.linspace(lo, hi, num_pieces + 1)
    coeffs = _fit_pieces(f, bp, degree, method)
    errors = _piece_errors(f, bp, coeffs)
    if isinstance(breakpoints, str) and breakpoints == "adaptive":
        trial_bp, trial_errors = bp, errors
        for _ in range(_ADAPTIVE_ROUNDS):  # each round from the last trial, not the best
            trial_bp = _equidistribute(trial_bp, trial_errors, degree)
            trial = _fit_pieces(f, trial_bp, degree, method)
            trial_errors = _piece_errors(f, trial_bp, trial)
            if trial_errors.max() < errors.max():
                bp, coeffs, errors = trial_bp, trial, trial_errors
    max_error = float(errors.max())
    if tails is not None:
        if extrapolate != "extend":
            raise ValueError(f"tails need extrapolate='extend', got {extrapolate=!r}")
        if len(tails) != 2:
            raise ValueError(f"tails must be (left, right), got {len(tails)} entries")
        width = (hi - lo) / num_pieces
        left, right = tails
        if left is not None:
            bp = np.concatenate([[lo - width], bp])
            coeffs = np.concatenate([_tail_piece(left, lo - width, degree)[:, None], coeffs], 1)
        if right is not None:
            bp = np.concatenate([bp, [hi + width]])
            coeffs = np.concatenate([coeffs, _tail_piece(right, hi, degree)[:, None]], 1)
    with np.errstate(over="ignore"):  # reported below
        cast = coeffs.astype(dtype)
    if not np.all(np.isfinite(cast.astype(np.float64))):
        raise ValueError(f"dtype={cast.dtype} overflows on the fitted coefficients (up to "
                         f"{np.max(np.abs(coeffs)):.3g}); use a wider dtype, fewer pieces or a "
                         f"lower degree")
    pp = PiecewisePolynomial(bp.astype(dtype), cast, extrapolate=extrapolate)
    return PiecewiseFit(pp, max_error)

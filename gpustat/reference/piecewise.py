"""Piecewise polynomials in pure ``jax.numpy``: the meaning of every piecewise op.

A piecewise polynomial of degree D on P pieces has breakpoints
``x_0 < x_1 < ... < x_P`` and coefficients ``c`` of shape (D+1, P, *t), highest
power first, in the **local** coordinate of each piece (scipy ``PPoly``)::

    p(x) = sum_k c[k, i] * (x - x_i) ** (D - k)
    i = clip(searchsorted(breakpoints, x, side="right") - 1, 0, P-1)

Piece i covers [x_i, x_{i+1}); the last piece also covers x_P. Out-of-range
points follow ``extrapolate``: "extend" (end pieces continue), "nan", "clamp"
(evaluate at clip(x, x_0, x_P)) or "periodic" (x_0 + (x - x_0) mod (x_P - x_0)).

Evaluation uses Horner's rule that skips leading zero coefficients, so the
polynomial's limit comes out at x = +-inf (plain Horner or scipy's power sum
give NaN from 0 * inf there). Every function here is elementwise over ``x`` and
differentiable in the coefficients; breakpoints are constants.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gpustat._arrays import next_pow2

__all__ = [
    "EXTRAPOLATE_MODES",
    "GUIDE_MAX_BUCKETS",
    "antiderivative_coeffs",
    "derivative_coeffs",
    "eytzinger_order",
    "guide_tables",
    "horner",
    "integrate_reference",
    "kernel_tables",
    "map_to_domain",
    "piece_index",
    "piece_index_uniform",
    "ppoly_eval_reference",
    "search_levels",
    "side_rows",
]

EXTRAPOLATE_MODES = ("extend", "nan", "clamp", "periodic")


def horner(coeffs: jax.Array, u: jax.Array, skip_leading_zeros: bool = True) -> jax.Array:
    """sum_k coeffs[k] * u ** (D - k) by Horner's rule, skipping leading zeros.

    ``acc == 0`` restarts at the next coefficient only where u = +-inf, avoiding
    0 * inf there; for finite u the plain step ``0 * u + c`` is already c exactly,
    and it keeps the gradient of a zero accumulator (a zero leading coefficient,
    or a root passed on the way). A NaN u gives NaN (also for an all-zero polynomial).

    Args:
        coeffs: (D+1, ...) highest power first, broadcastable against ``u``.
        u: local coordinate.
        skip_leading_zeros: False gives plain Horner, linear (and so transposable)
            in ``coeffs``: the form a coefficient tangent needs.
    """
    acc = jnp.broadcast_to(coeffs[0], jnp.broadcast_shapes(coeffs.shape[1:], u.shape))
    at_inf = jnp.isinf(u)
    for k in range(1, coeffs.shape[0]):
        step = acc * u + coeffs[k]
        acc = jnp.where((acc == 0) & at_inf, coeffs[k], step) if skip_leading_zeros else step
    return jnp.where(u != u, u, acc) if skip_leading_zeros else acc


def map_to_domain(breakpoints: jax.Array, x: jax.Array, extrapolate: str) -> jax.Array:
    """Apply the ``extrapolate`` rule that moves x before the piece search.

    "clamp" clips to [x_0, x_P] (NaN stays NaN); "periodic" folds into
    [x_0, x_P) like scipy (``x_0 + (x - x_0) % period``); the others leave x.
    """
    lo, hi = breakpoints[0], breakpoints[-1]
    if extrapolate == "clamp":
        return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))
    if extrapolate == "periodic":
        return lo + jnp.mod(x - lo, hi - lo)
    return x


def piece_index(breakpoints: jax.Array, x: jax.Array) -> jax.Array:
    """Piece of each x: clip(searchsorted(breakpoints, x, "right") - 1, 0, P-1).

    Counting the interior breakpoints <= x gives the clipped index directly.
    """
    return jnp.searchsorted(breakpoints[1:-1], x, side="right").astype(jnp.int32)


def piece_index_uniform(breakpoints: jax.Array, x: jax.Array) -> jax.Array:
    """:func:`piece_index` in O(1) for (near-)uniform breakpoints.

    ``floor((x - x_0) / h)`` is within one piece of the answer when every
    breakpoint lies within h/4 of the uniform grid; one comparison with each
    neighbouring breakpoint makes it exact. The float-to-int conversion comes
    before the clip, so +-inf and NaN never reach an index.
    """
    num_pieces = breakpoints.shape[0] - 1
    lo, hi = breakpoints[0], breakpoints[-1]
    t = jnp.floor((x - lo) * (num_pieces / (hi - lo)))
    guess = jnp.clip(jnp.where(jnp.isnan(t), 0, t), -1, num_pieces).astype(jnp.int32)
    guess = jnp.clip(guess, 0, num_pieces - 1)
    up = (guess < num_pieces - 1) & (x >= breakpoints[jnp.minimum(guess + 1, num_pieces)])
    down = (guess > 0) & (x < breakpoints[guess])
    return guess + up.astype(jnp.int32) - down.astype(jnp.int32)


def derivative_coeffs(coeffs: jax.Array, nu: int = 1) -> jax.Array:
    """Coefficients of the nu-th derivative (nu >= 0), shape (max(D+1-nu, 1), P, *t)."""
    degree = coeffs.shape[0] - 1
    if nu == 0:
        return coeffs
    if nu > degree:
        return jnp.zeros((1, *coeffs.shape[1:]), coeffs.dtype)
    powers = range(degree, nu - 1, -1)  # powers of the surviving coefficients
    factors = jnp.asarray([math.perm(k, nu) for k in powers], coeffs.dtype)
    return coeffs[: degree + 1 - nu] * factors.reshape((-1,) + (1,) * (coeffs.ndim - 1))


def antiderivative_coeffs(breakpoints: jax.Array, coeffs: jax.Array, nu: int = 1) -> jax.Array:
    """Coefficients of the nu-th antiderivative, zero at x_0 and continuous (scipy's).

    Each step divides by the new powers and sets the constant term of piece i
    to the integral over pieces 0..i-1 (an exclusive cumulative sum).
    """
    widths = jnp.diff(breakpoints).astype(coeffs.dtype)
    for _ in range(nu):
        degree = coeffs.shape[0] - 1
        divisors = jnp.arange(degree + 1, 0, -1, dtype=coeffs.dtype)
        lifted = coeffs / divisors.reshape((-1,) + (1,) * (coeffs.ndim - 1))
        zero_const = jnp.zeros((1, *coeffs.shape[1:]), coeffs.dtype)
        lifted = jnp.concatenate([lifted, zero_const])
        w = widths.reshape((-1,) + (1,) * (coeffs.ndim - 2))
        piece_integrals = horner(lifted, w)
        offsets = jnp.cumsum(piece_integrals, axis=0) - piece_integrals
        coeffs = lifted.at[-1].set(offsets)
    return coeffs


def ppoly_eval_reference(breakpoints: jax.Array, coeffs: jax.Array, x: jax.Array, *,
                         extrapolate: str = "extend", uniform: bool = False,
                         skip_leading_zeros: bool = True) -> jax.Array:
    """Evaluate the piecewise polynomial at every x.

    Args:
        breakpoints: (P+1,) strictly increasing, finite.
        coeffs: (D+1, P, *t) highest power first, local coordinate.
        x: any shape; computed in ``coeffs``' dtype (cast first).
        extrapolate: one of :data:`EXTRAPOLATE_MODES`.
        uniform: use the O(1) index (:func:`piece_index_uniform`) instead of a search.
        skip_leading_zeros: see :func:`horner` (False: linear in ``coeffs``).

    Returns:
        (*x.shape, *t) in ``coeffs``' dtype.
    """
    x = jnp.asarray(x, coeffs.dtype)
    breakpoints = lax.stop_gradient(breakpoints.astype(coeffs.dtype))
    xm = map_to_domain(breakpoints, x, extrapolate)
    index = (piece_index_uniform if uniform else piece_index)(breakpoints, xm)
    u = xm - breakpoints[index]
    trailing = coeffs.ndim - 2
    y = horner(coeffs[:, index], u.reshape(u.shape + (1,) * trailing), skip_leading_zeros)
    if extrapolate == "nan":
        outside = (x < breakpoints[0]) | (x > breakpoints[-1])
        y = jnp.where(outside.reshape(outside.shape + (1,) * trailing), jnp.nan, y)
    return y


def integrate_reference(breakpoints: jax.Array, coeffs: jax.Array, a, b, *,
                        extrapolate: str = "extend") -> jax.Array:
    """Definite integral over [a, b] with scipy ``PPoly.integrate`` semantics.

    "nan" gives NaN when a bound leaves [x_0, x_P]; "periodic" counts whole
    periods and wraps the rest; "clamp" integrates the clamped function (the
    end values continue as constants). b < a flips the sign.

    Returns:
        (*t,) for scalar bounds (bounds broadcast over leading axes otherwise).
    """
    anti = antiderivative_coeffs(breakpoints, coeffs, 1)
    trailing = coeffs.ndim - 2
    a = jnp.asarray(a, coeffs.dtype)
    b = jnp.asarray(b, coeffs.dtype)
    sign = jnp.where(b < a, -1.0, 1.0).astype(coeffs.dtype)
    a, b = jnp.minimum(a, b), jnp.maximum(a, b)

    def expand(v):
        return v.reshape(v.shape + (1,) * trailing)

    def anti_at(v, mode):
        return ppoly_eval_reference(breakpoints, anti, v, extrapolate=mode)

    lo, hi = breakpoints[0].astype(coeffs.dtype), breakpoints[-1].astype(coeffs.dtype)
    if extrapolate == "periodic":
        period = hi - lo
        n_periods = jnp.floor((b - a) / period)
        left = (b - a) - n_periods * period
        full = anti_at(hi, "extend")
        a0 = lo + jnp.mod(a - lo, period)
        b0 = a0 + left
        wraps = b0 > hi
        inside = anti_at(jnp.minimum(b0, hi), "extend") - anti_at(a0, "extend")
        wrapped = anti_at(lo + (b0 - hi), "extend")
        total = expand(n_periods) * full + inside + jnp.where(expand(wraps), wrapped, 0.0)
    elif extrapolate == "clamp":
        ac, bc = jnp.clip(a, lo, hi), jnp.clip(b, lo, hi)
        y_lo = ppoly_eval_reference(breakpoints, coeffs, lo, extrapolate="extend")
        y_hi = ppoly_eval_reference(breakpoints, coeffs, hi, extrapolate="extend")
        below = expand(jnp.clip(lo - a, 0.0) - jnp.clip(lo - b, 0.0))
        above = expand(jnp.clip(b - hi, 0.0) - jnp.clip(a - hi, 0.0))

        def flat(length, value):  # a zero end value adds 0, also over an infinite length
            return jnp.where(value == 0, 0.0, length * value)

        total = (anti_at(bc, "extend") - anti_at(ac, "extend") + flat(below, y_lo)
                 + flat(above, y_hi))
    else:
        total = anti_at(b, extrapolate) - anti_at(a, extrapolate)
    return expand(sign) * total


# -- kernel table layouts (what the Pallas and Triton kernels read) -----------------------

@functools.cache
def eytzinger_order(levels: int) -> np.ndarray:
    """Sorted rank stored at each breadth-first node 1..2^levels-1 (entry 0 unused).

    Node k has children 2k and 2k+1; an in-order walk visits ranks 0, 1, 2, ...
    """
    size = (1 << levels) - 1
    order = np.zeros(size + 1, dtype=np.int64)
    rank = 0
    stack, node = [], 1
    while stack or node <= size:
        while node <= size:
            stack.append(node)
            node *= 2
        node = stack.pop()
        order[node] = rank
        rank += 1
        node = 2 * node + 1
    return order


def search_levels(num_pieces: int) -> int:
    """Tree depth holding the P-1 interior breakpoints: 2^levels - 1 >= P - 1."""
    return (num_pieces - 1).bit_length()


# Most buckets of the guided lookup (guide_tables): 1024 (below, split) pairs, one
# 64-bit word each in float32, are 16 registers a thread at 4 warps before the Triton
# kernel stages them.
GUIDE_MAX_BUCKETS = 1024


def kernel_tables(breakpoints, coeffs, uniform: bool):
    """(keys, rows, params) the kernel reads, in ``coeffs``' dtype.

    keys: the sorted breakpoints (uniform path) or the Eytzinger tree of the
    interior ones, NaN-padded to 2^levels entries (entry 0 unused); rows:
    (*t, P, W) coefficient rows padded to W = next_pow2(D+1); params:
    [x_0, x_P, P / (x_P - x_0), 0]. Built with numpy when the inputs are
    concrete, so a constant polynomial under ``jit`` costs no device work per call.
    """
    concrete = not any(isinstance(a, jax.core.Tracer) for a in (breakpoints, coeffs))
    xp = np if concrete else jnp
    dtype = coeffs.dtype
    breakpoints = xp.asarray(breakpoints, dtype=dtype)
    coeffs = xp.asarray(coeffs)
    degree, num_pieces = coeffs.shape[0] - 1, coeffs.shape[1]
    width = next_pow2(degree + 1)
    rows = xp.moveaxis(coeffs, (0, 1), (-1, -2))  # (*t, P, D+1)
    pad = [(0, 0)] * (rows.ndim - 1) + [(0, width - degree - 1)]
    rows = xp.pad(rows, pad)
    if uniform:
        keys = breakpoints
    else:
        levels = search_levels(num_pieces)
        # in-order ranks 0..2^L-2: the P-1 interior breakpoints, then NaN padding
        nan_pad = xp.full(((1 << levels) - num_pieces,), np.nan, dtype=dtype)
        sorted_keys = xp.concatenate([breakpoints[1:-1], nan_pad])
        unused = xp.full((1,), np.nan, dtype=dtype)
        keys = xp.concatenate([unused, sorted_keys[eytzinger_order(levels)[1:]]])
    lo, hi = breakpoints[0], breakpoints[-1]
    params = xp.stack([lo, hi, num_pieces / (hi - lo), xp.zeros((), dtype)]).astype(dtype)
    return keys, rows, params


def guide_tables(breakpoints) -> tuple[np.ndarray, ...] | None:
    """Tables of the guided piece lookup for concrete breakpoints, or None.

    M equal buckets over [x_0, x_P], M the smallest power of two >= max(P, 16) that
    puts at most one interior breakpoint in each bucket, up to 1024 (None beyond:
    the kernel keeps its search). A point x of bucket b lies in piece
    ``max(below[b] + (x >= split[b]), 0)``, whose left knot is ``split[b]`` when
    ``x >= split[b]`` and ``knots[piece]`` otherwise:

    * a bucket holding breakpoint x_j: ``split = x_j``, ``below = j - 1``;
    * a bucket inside piece q: ``split = x_q`` (its left knot; x_0 for q = 0),
      ``below = q - 1``, so every point of the bucket but a clipped x < x_0 or a
      NaN takes ``split`` as its knot.

    Returns (below (M,) int32, split (M,), knots = x_0..x_{P-1} (P,),
    [M / (x_P - x_0)]), floats in the breakpoints' dtype. A breakpoint's bucket is
    computed exactly as the kernel computes a point's (same dtype, same two
    operations, same clipping), and the map is monotone, so the points of a bucket
    lie on either side of its one breakpoint only: the ``x >= split`` test is exact.
    """
    bp = np.asarray(breakpoints)
    lo, hi, interior = bp[0], bp[-1], bp[1:-1]
    buckets = max(next_pow2(bp.size - 1), 16)
    while buckets <= GUIDE_MAX_BUCKETS:
        scale = np.asarray([bp.dtype.type(buckets) / (hi - lo)], bp.dtype)
        bucket = np.clip(np.floor((interior - lo) * scale[0]), 0, buckets - 1).astype(np.int64)
        counts = np.bincount(bucket, minlength=buckets)
        if counts.max(initial=0) <= 1:
            first = np.cumsum(counts) - counts  # piece at the bucket's left edge
            split = bp[first].copy()
            split[bucket] = interior
            below = (first - 1 + counts).astype(np.int32)
            return below, split, bp[:-1].copy(), scale
        buckets *= 2
    return None


def side_rows(knots, rows, degree: int):
    """(T + P, W) coefficient rows of the guided lookup without knots, T = next_pow2(P).

    Row T + q is piece q's row (``rows[q]``). Row q, 1 < q < P, is piece q - 1
    re-expanded at its right end x_q (a Taylor shift by x_q - x_{q-1}); row 0 is piece
    0; rows 1 and P..T-1 are zero. A point of bucket b evaluates at ``u = x - split[b]``
    whichever side of split it lies on: right of it in row ``T + below[b] + 1``, left of
    it in row ``below[b] + 1`` (the piece below, centred on split), except that the
    points of piece 0 take row 0 at ``u = x - x_0`` (so p(x_0) stays exact). No lane
    gathers its knot, at the cost of rounding the shifted coefficients: the results'
    errors are comparable to the reference's (0.93 against 0.73 float32 ulp on a smooth
    fit in the tests; near a zero of the polynomial both lose relative accuracy, the
    shifted rows up to about twice as much).

    Args:
        knots: x_0..x_{P-1}, the third of :func:`guide_tables`.
        rows: (P, W) from :func:`kernel_tables`.
        degree: D, the coefficients being the rows' first D + 1 columns.

    The shift runs in float64 for concrete inputs (numpy), in the rows' dtype for
    traced ones.
    """
    concrete = not any(isinstance(a, jax.core.Tracer) for a in (knots, rows))
    xp, work = (np, np.float64) if concrete else (jnp, rows.dtype)
    num_pieces, width = rows.shape
    knots = xp.asarray(knots, work)
    step = knots[2:] - knots[1:-1]  # x_q - x_{q-1}, q = 2..P-1
    cols = [xp.asarray(rows[1:-1, k], work) for k in range(degree + 1)]
    for i in range(degree):  # Taylor shift of the highest-first coefficients
        for k in range(1, degree + 1 - i):
            cols[k] = cols[k] + step * cols[k - 1]
    zeros = xp.zeros((max(num_pieces - 2, 0), width - degree - 1), work)
    shifted = xp.concatenate([xp.stack(cols, axis=1), zeros], axis=1).astype(rows.dtype)
    unused = xp.zeros((next_pow2(num_pieces) - num_pieces, width), rows.dtype)
    row1 = xp.zeros((min(num_pieces - 1, 1), width), rows.dtype)
    return xp.concatenate([rows[:1], row1, shifted, unused, rows])

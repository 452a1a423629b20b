"""Pallas kernel: evaluate a piecewise polynomial at a stream of points.

Each program owns ``block_n`` consecutive points (several per thread): one
masked, vectorised read of x in its own dtype, the piece search, one gather of
the piece's coefficient row, Horner in the compute dtype, one masked write. The
coefficient table and search keys are a few KiB and stay in L1/L2 after the
first programs touch them, so HBM traffic is x once and y once.

Piece search (the result equals ``clip(searchsorted(bp, x, "right") - 1, 0, P-1)``):

* uniform breakpoints: ``floor((x - x_0) * P / (x_P - x_0))`` clipped, then one
  comparison with each neighbouring breakpoint makes it exact (O(1));
* otherwise a branch-free search over the interior breakpoints in Eytzinger
  (breadth-first) order: ``node = 2 * node + (key[node] <= x)`` for
  ceil(log2 P) levels. The top five levels share one 128-byte line, so a warp's
  gathers touch few cache lines; the last key passed on the right is the piece's
  left breakpoint, so no extra gather is needed. Padding keys are NaN, which
  compare false like +inf, and a NaN x ends in piece 0 (its output stays NaN).

Coefficients are stored array-of-structures, each piece's D+1 values padded to
a power-of-two row (16 bytes for a float32 cubic), gathered as one vector.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from gpustat._arrays import next_pow2
from gpustat.pallas._common import pallas_call, register_lowering_case
from gpustat.reference.piecewise import EXTRAPOLATE_MODES

__all__ = [
    "default_config",
    "eytzinger_order",
    "guide_tables",
    "kernel_tables",
    "ppoly_eval_pallas",
    "ppoly_eval_tables",
    "side_rows",
]

# Default (block_n, num_warps, chunks, num_stages) by (x itemsize, uniform): the
# fastest of the sweep in benchmarks/results/nvidia-h100-80gb-hbm3/piecewise.jsonl
# (P = 256, D = 3, N = 2^26 on an H100; neighbouring settings were within ~10%).
_DEFAULT_CONFIG = {
    (4, False): (512, 4, 8, 2),
    (4, True): (1024, 4, 4, 1),
    (2, False): (1024, 4, 1, 1),
    (2, True): (512, 4, 8, 1),
    (8, False): (512, 4, 1, 1),
    (8, True): (1024, 8, 4, 1),
}


def default_config(x_dtype, uniform: bool) -> tuple[int, int, int, int]:
    """(block_n, num_warps, chunks, num_stages) used when the caller gives none."""
    return _DEFAULT_CONFIG[(min(max(jnp.dtype(x_dtype).itemsize, 2), 8), uniform)]


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


def _search_levels(num_pieces: int) -> int:
    """Tree depth holding the P-1 interior breakpoints: 2^levels - 1 >= P - 1."""
    return (num_pieces - 1).bit_length()


# Most buckets of the guided lookup (guide_tables): 1024 (below, split) pairs, one
# 64-bit word each in float32, are 16 registers a thread at 4 warps before the Triton
# kernel stages them.
_GUIDE_MAX_BUCKETS = 1024


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
        levels = _search_levels(num_pieces)
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
    while buckets <= _GUIDE_MAX_BUCKETS:
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


def _column(rows, cols, k):
    """Column k of a (block, width) block of rows, kept in registers."""
    return jnp.sum(jnp.where(cols[None, :] == k, rows, 0), axis=1)


def _evaluate_block(x_raw, keys_ref, rows_ref, params, *, num_pieces: int, degree: int,
                    uniform: bool, extrapolate: str, gather: str):
    """p(x) for one loaded block of points, in the table's dtype."""
    lo, hi, scale = params
    dtype = rows_ref.dtype
    x = x_raw.astype(dtype)
    if extrapolate == "clamp":  # comparisons keep NaN as NaN
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))
    elif extrapolate == "periodic":
        x = lo + jnp.mod(x - lo, hi - lo)

    if uniform:
        t = jnp.floor((x - lo) * scale)
        t = jnp.where(t == t, jnp.clip(t, 0, num_pieces - 1), 0)  # NaN -> 0 before the cast
        guess = t.astype(jnp.int32)
        left = keys_ref[guess]
        right = keys_ref[guess + 1]
        up = (guess < num_pieces - 1) & (x >= right)
        down = (guess > 0) & (x < left)
        below = plt.load(keys_ref.at[jnp.maximum(guess - 1, 0)], mask=down, other=0)
        index = guess + up.astype(jnp.int32) - down.astype(jnp.int32)
        knot = jnp.where(up, right, jnp.where(down, below, left))
    else:
        levels = _search_levels(num_pieces)
        node = jnp.ones(x.shape, jnp.int32)
        knot = jnp.full(x.shape, lo, dtype)
        for _ in range(levels):
            key = keys_ref[node]
            go_right = key <= x
            knot = jnp.where(go_right, key, knot)
            node = 2 * node + go_right.astype(jnp.int32)
        index = node - (1 << levels)

    u = x - knot
    width = rows_ref.shape[1]
    if gather == "row":  # one vector gather of the padded coefficient row
        cols = jnp.arange(width, dtype=jnp.int32)
        rows = rows_ref[index[:, None], cols[None, :]]
        coeff = functools.partial(_column, rows, cols)
    else:  # one scalar gather per coefficient
        def coeff(k):
            return rows_ref[index, k]
    # Horner in the compute dtype; a zero accumulator restarts (no 0 * inf at +-inf).
    y = coeff(0)
    for k in range(1, degree + 1):
        c = coeff(k)
        y = jnp.where(y == 0, c, y * u + c)
    y = jnp.where(u != u, u, y)  # NaN in, NaN out (also for an all-zero piece)
    if extrapolate == "nan":
        y = jnp.where((x < lo) | (x > hi), jnp.nan, y)
    return y


def _ppoly_eval_kernel(x_ref, keys_ref, rows_ref, params_ref, out_ref, *, size: int,
                       block_n: int, chunks: int, **settings):
    # A program owns `chunks` consecutive blocks of `block_n` points. With
    # chunks > 1 the next block's x is loaded before this block's search and
    # Horner, so HBM reads stay in flight while the gathers wait on L1.
    params = (params_ref[0], params_ref[1], params_ref[2])
    # 32-bit point offsets unless the padded grid passes 2^31 points.
    span = pl.cdiv(size, block_n * chunks) * block_n * chunks
    offset_dtype = jnp.int32 if span < 2**31 else jnp.int64
    base = pl.program_id(0).astype(offset_dtype) * (block_n * chunks)
    lanes = jnp.arange(block_n, dtype=offset_dtype)

    def load(j, valid=True):
        offsets = base + j * block_n + lanes
        return plt.load(x_ref.at[offsets], mask=(offsets < size) & valid, other=0)

    def process(j, x_raw):
        offsets = base + j * block_n + lanes
        y = _evaluate_block(x_raw, keys_ref, rows_ref, params, **settings)
        plt.store(out_ref.at[offsets], y.astype(out_ref.dtype), mask=offsets < size)

    if chunks == 1:
        process(0, load(0))
        return

    def body(j, x_raw):
        x_next = load(j + 1, j + 1 < chunks)
        process(j, x_raw)
        return x_next

    jax.lax.fori_loop(0, chunks, body, load(0))


@functools.partial(jax.jit, static_argnames=("num_pieces", "degree", "extrapolate", "uniform",
                                             "interpret", "block_n", "num_warps", "gather",
                                             "chunks", "num_stages"))
def ppoly_eval_tables(keys: jax.Array, rows: jax.Array, params: jax.Array, x: jax.Array, *,
                      num_pieces: int, degree: int, extrapolate: str = "extend",
                      uniform: bool = False, interpret: bool = False, block_n: int | None = None,
                      num_warps: int | None = None, gather: str = "row",
                      chunks: int | None = None, num_stages: int | None = None) -> jax.Array:
    """Run the kernel on prepared :func:`kernel_tables` (rows (P, W), no trailing axes).

    Args:
        keys, rows, params: from :func:`kernel_tables`, in the compute dtype.
        x: (n,) any floating dtype; read and written in that dtype.
        num_pieces, degree: P and D of the table.
        extrapolate: one of "extend", "nan", "clamp", "periodic".
        uniform: the keys are the sorted breakpoints of a near-uniform grid.
        interpret: run in interpret mode.
        block_n: points per block (power of two). This and the next three
            settings default to :func:`default_config`.
        num_warps: Triton warps per program.
        gather: "row" (one vector gather per point) or "column" (D+1 scalar gathers).
        chunks: blocks per program, the next one prefetched while this one computes.
        num_stages: Triton software-pipelining stages for the chunk loop.

    Returns:
        (n,) in x's dtype.
    """
    if extrapolate not in EXTRAPOLATE_MODES:
        raise ValueError(f"extrapolate must be one of {EXTRAPOLATE_MODES}, got {extrapolate=!r}")
    size = x.shape[0]
    if size == 0:
        return jnp.zeros((0,), x.dtype)
    defaults = default_config(x.dtype, uniform)
    num_warps, num_stages = num_warps or defaults[1], num_stages or defaults[3]
    block = min(block_n or defaults[0], next_pow2(size))
    chunks = max(1, min(chunks or defaults[2], pl.cdiv(size, block)))
    kernel = functools.partial(
        _ppoly_eval_kernel, size=size, block_n=block, chunks=chunks, num_pieces=num_pieces,
        degree=degree, uniform=uniform, extrapolate=extrapolate, gather=gather)
    return pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((size,), x.dtype),
        grid=(pl.cdiv(size, block * chunks),),
        interpret=interpret,
        num_warps=num_warps,
        num_stages=num_stages,
    )(x, keys, rows, params)


def ppoly_eval_pallas(breakpoints: jax.Array, coeffs: jax.Array, x: jax.Array, *,
                      uniform: bool = False, **kwargs) -> jax.Array:
    """Kernel twin of :func:`gpustat.reference.piecewise.ppoly_eval_reference` (no trailing axes).

    Args:
        breakpoints: (P+1,) strictly increasing.
        coeffs: (D+1, P) in the compute dtype (float32 or float64).
        x: (n,) any floating dtype.
        uniform: breakpoints lie within h/4 of a uniform grid (O(1) index).
        **kwargs: the static settings of :func:`ppoly_eval_tables`.

    Returns:
        (n,) in x's dtype.
    """
    keys, rows, params = kernel_tables(breakpoints, coeffs, uniform)
    return ppoly_eval_tables(keys, rows, params, x, num_pieces=coeffs.shape[1],
                             degree=coeffs.shape[0] - 1, uniform=uniform, **kwargs)


def _register_lowering_cases() -> None:
    cases = [  # (x dtype, table dtype, uniform, extrapolate, gather, chunks)
        (jnp.float32, jnp.float32, False, "extend", "row", 1),
        (jnp.float32, jnp.float32, True, "clamp", "row", 4),
        (jnp.float32, jnp.float32, False, "periodic", "column", 1),
        (jnp.bfloat16, jnp.float32, True, "nan", "row", 1),
        (jnp.float64, jnp.float64, False, "nan", "row", 4),
        (jnp.float64, jnp.float64, True, "extend", "column", 1),
    ]
    num_pieces, degree = 256, 3
    for x_dtype, dtype, uniform, extrapolate, gather, chunks in cases:
        fn = functools.partial(ppoly_eval_pallas, extrapolate=extrapolate, uniform=uniform,
                               gather=gather, chunks=chunks, block_n=1024)
        name = (f"ppoly_eval[{jnp.dtype(x_dtype).name},{'uniform' if uniform else 'search'},"
                f"{extrapolate},{gather},chunks={chunks}]")
        register_lowering_case("piecewise", name, fn, [
            jax.ShapeDtypeStruct((num_pieces + 1,), dtype),
            jax.ShapeDtypeStruct((degree + 1, num_pieces), dtype),
            jax.ShapeDtypeStruct((5000,), x_dtype),
        ])


_register_lowering_cases()

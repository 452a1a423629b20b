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
from jax.experimental import pallas as pl

from gpustat._arrays import next_pow2
from gpustat.pallas._common import pallas_call, plt
from gpustat.reference.piecewise import EXTRAPOLATE_MODES, kernel_tables, search_levels

__all__ = [
    "default_config",
    "ppoly_eval_pallas",
    "ppoly_eval_tables",
]

# Default (block_n, num_warps, chunks, num_stages) by (x itemsize, uniform): the
# fastest of the launch sweep of benchmarks/bench_piecewise.py (P = 256, D = 3,
# N = 2^26); neighbouring settings are close, so these are not sharp optima.
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
        levels = search_levels(num_pieces)
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

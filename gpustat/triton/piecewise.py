"""Triton-language kernels: evaluate a piecewise polynomial at a stream of points.

The jax-triton twins of :mod:`gpustat.pallas.piecewise`, reading the same tables
(:func:`gpustat.reference.piecewise.kernel_tables`): Eytzinger-ordered interior
breakpoints (or the sorted ones on a uniform grid), coefficient rows padded to
a power-of-two width W, and ``[x_0, x_P, P / (x_P - x_0), 0]``. x is streamed
once (read in its own dtype, evicted first) and y written once. The piece
index is found once per point:

* guided (concrete breakpoints, :func:`gpustat.reference.piecewise.guide_tables`;
  shared-memory kernel): the point's bucket on a grid of up to 1024 equal
  buckets, each holding at most one interior breakpoint, gives its piece as
  ``below[b] + (x >= split[b])`` (one 64-bit lookup in float32) and its left knot
  as ``split[b]``, or ``knots[piece]`` for the points of a bucket below its
  breakpoint (the only lanes whose knot gather is random), whatever the grading.
  float32 tables come with :func:`gpustat.reference.piecewise.side_rows`: the piece
  below each breakpoint re-expanded at it, so every point evaluates at
  ``x - split[b]`` and none looks its knot up (three lookups a point, not four);
* uniform breakpoints: ``floor((x - x_0) * P / (x_P - x_0))`` clipped, then one
  comparison with each neighbouring breakpoint makes it exact;
* otherwise ``node = 2 * node + (key[node] <= x)`` for ceil(log2 P) levels over
  the Eytzinger tree; the last key passed on the right is the piece's left
  breakpoint. NaN padding keys compare false; a NaN x ends in piece 0.

Two kernels differ in where the tables are read from:

* shared memory (one polynomial, P <= 1024; the default there): a program
  loads the tables into registers and looks them up with ``tl.gather``, which
  goes through shared memory: a warp's random lookups cost a few bank conflicts
  instead of one L1 wavefront per distinct 128-byte line. float32 columns (and
  the guide's (below, split) pairs) travel as 64-bit words; float64 columns as two
  interleaved copies (:func:`_copy_slot`, faster: see ``_FLOAT64_COPIES_MAX_PIECES``).
  A program walks ``chunks`` blocks, prefetching the next block's x;
* the caches (trailing polynomials): gathers from global memory through L1; on
  a uniform grid the breakpoints ride in the coefficient row
  (:func:`uniform_rows`), so a point costs one gather. Polynomials on shared
  breakpoints (trailing axes ``t``) reuse the index: the kernel loops over them,
  gathering one W-wide row per point and polynomial, and writes ``y[i, t]``.

The shared-memory kernel is bound by its random shared-memory lookups (bank-conflicted
wavefronts), not by HBM or by instruction count: a plain Triton copy kernel reaches the
copy bandwidth, and this kernel takes the same time for bfloat16, float32, guided and
searched lookups (``benchmarks/results/*/probes/piecewise_history.md``).
Horner runs in the table's dtype (float32 for 16-bit x) with a restart on a zero
accumulator (no 0 * inf at +-inf), exactly as the reference.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from gpustat._arrays import next_pow2
from gpustat.reference.piecewise import EXTRAPOLATE_MODES, search_levels
from gpustat.triton._common import CompileCase, launch

__all__ = ["COMPILE_CASES", "default_launch", "ppoly_eval_triton",
           "staging_supported", "uniform_rows"]

# x above this many points streams from HBM: the launch tables switch settings
_STREAMING_POINTS = 1 << 22

# Default (block_n, num_warps, chunks) by (table itemsize, streaming: n > 2^22 points)
# of the shared-memory kernel, chosen from the launch sweeps of
# benchmarks/bench_triton.py (P = 256, D = 3; 2^26 points streaming, 2e6 not).
_STAGED_LAUNCH = {
    (4, True): (4096, 8, 1),
    (4, False): (2048, 8, 8),
    (8, True): (4096, 8, 1),
    (8, False): (1024, 8, 8),
}
# Streaming float32 with the guided lookup: several blocks a program, so its tables are
# read from L2 once per program (held in registers across the blocks) instead of once
# per 4096 points; by guide size: a guide of over 256 buckets (a graded grid) at
# 2048 x 4 warps x 8 blocks, one of 256 (a uniform grid) at 2048 x 8 x 4, each the
# fastest in interleaved timings at P = 256, 2^26 points. float64 keeps one block a
# program, which is faster there.
_GUIDED_FLOAT32_STREAMING_LAUNCH = {True: (2048, 4, 8), False: (2048, 8, 4)}  # > 256 buckets?
_SMALL_GUIDE_BUCKETS = 256
# Streaming guided lookup with side_rows (float32: no knot lookup): 2048 x 8 warps x 8
# blocks, the fastest in interleaved timings at P = 256, 2^26 points, and faster than
# the knot lookup at its launch above on graded and uniform grids
# (benchmarks/results/*/probes/piecewise_side_rows_*.md).
_SIDE_ROWS_STREAMING_LAUNCH = (2048, 8, 8)
# Cached-table kernel (trailing polynomials): 16 points a thread in float32, 8 in
# float64, 4 warps (the fastest of the launch sweep of benchmarks/bench_triton.py).
_CACHE_LAUNCH = {4: (2048, 4, 1), 8: (1024, 4, 1)}
# float64 coefficient columns are staged as two interleaved copies (_copy_slot) up to
# this many pieces: faster than one copy at P = 256 (graded, 2^26 points); four copies
# cost more in registers than they save, and float32's paired 8-byte words gain nothing
# from copies. The shared-load wavefronts are the same with and without the copies, the
# barrier and scoreboard stalls fewer: the gain is in how the lookups are scheduled, not
# fewer bank conflicts (a half-warp's worst bank stays as loaded until 8-16 copies, whose
# staging and registers cost more; benchmarks/results/*/probes/piecewise_history.md).
_FLOAT64_COPIES_MAX_PIECES = 256
# Largest P the shared-memory kernel stages (see staging_supported).
_STAGED_MAX_PIECES = 1024
# extrapolate mode -> the kernel's MODE constexpr
_MODE_CODE = {"extend": 0, "nan": 1, "clamp": 2, "periodic": 3}


@triton.jit
def _fold(x, lo, hi, MODE: tl.constexpr):
    """x moved into [x_0, x_P] under "clamp" and "periodic"; unchanged otherwise."""
    if MODE == 2:  # clamp; comparisons keep NaN as NaN
        x = tl.where(x < lo, lo, tl.where(x > hi, hi, x))
    if MODE == 3:  # periodic: jnp.mod = fmod (Triton's float %), moved into [0, period)
        period = hi - lo
        folded = (x - lo) % period
        x = lo + tl.where(folded < 0, folded + period, folded)
    return x


@triton.jit
def _horner_step(y, c, u):
    """One Horner step; a zero accumulator restarts (no 0 * inf at +-inf), as the reference."""
    return tl.where(y == 0, c, y * u + c)


@triton.jit
def _finish(y, u, x, lo, hi, MODE: tl.constexpr):
    """NaN in, NaN out (also for an all-zero piece); NaN outside [x_0, x_P] under "nan"."""
    y = tl.where(u != u, u, y)
    if MODE == 1:
        y = tl.where((x < lo) | (x > hi), float("nan"), y)
    return y


@triton.jit
def _grid_cell(x, lo, scale, CELLS: tl.constexpr):
    """floor((x - lo) * scale) clipped to [0, CELLS - 1] (0 for NaN x): the cell of x on
    an equal grid, e.g. its piece on uniform breakpoints (scale = P / (x_P - x_0), up
    to one step off by rounding) or its guide bucket."""
    t = tl.floor((x - lo) * scale)
    t = tl.where(t == t, tl.minimum(tl.maximum(t, 0.0), CELLS - 1.0), 0.0)
    return t.to(tl.int32)


@triton.jit
def _ppoly_eval_kernel(x_ptr, keys_ptr, rows_ptr, params_ptr, out_ptr,
                       SIZE: tl.constexpr, NUM_PIECES: tl.constexpr, DEGREE: tl.constexpr,
                       WIDTH: tl.constexpr, NUM_POLYS: tl.constexpr, LEVELS: tl.constexpr,
                       UNIFORM: tl.constexpr, MODE: tl.constexpr, INDEX_64: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if INDEX_64:  # n * t >= 2^31: output offsets need 64 bits
        offsets = offsets.to(tl.int64)
    in_range = offsets < SIZE
    dtype = rows_ptr.dtype.element_ty
    x = tl.load(x_ptr + offsets, mask=in_range, other=0, eviction_policy="evict_first")
    lo = tl.load(params_ptr)
    hi = tl.load(params_ptr + 1)
    x = _fold(x.to(dtype), lo, hi, MODE)

    cols = tl.arange(0, WIDTH)
    if UNIFORM:
        # rows hold [coefficients, 0..., x_i, x_{i+1}]: one gather gives the piece's
        # coefficients and both neighbouring breakpoints for the exactness check
        guess = _grid_cell(x, lo, tl.load(params_ptr + 2), NUM_PIECES)
        rows = tl.load(rows_ptr + (guess * WIDTH)[:, None] + cols[None, :],
                       eviction_policy="evict_last")
        left = tl.sum(tl.where(cols[None, :] == WIDTH - 2, rows, 0), axis=1)
        right = tl.sum(tl.where(cols[None, :] == WIDTH - 1, rows, 0), axis=1)
        up = (guess < NUM_PIECES - 1) & (x >= right)
        down = (guess > 0) & (x < left)
        index = guess + up.to(tl.int32) - down.to(tl.int32)
        moved = up | down  # rare: only lanes off by one read the neighbouring row
        fixed = tl.load(rows_ptr + (index * WIDTH)[:, None] + cols[None, :],
                        mask=moved[:, None], other=0)
        rows = tl.where(moved[:, None], fixed, rows)
        knot = tl.sum(tl.where(cols[None, :] == WIDTH - 2, rows, 0), axis=1)
    else:
        node = tl.full([BLOCK_N], 1, tl.int32)
        knot = tl.full([BLOCK_N], 0, dtype) + lo
        for _ in tl.static_range(LEVELS):
            key = tl.load(keys_ptr + node, eviction_policy="evict_last")
            go_right = key <= x
            knot = tl.where(go_right, key, knot)
            node = 2 * node + go_right.to(tl.int32)
        index = node - (1 << LEVELS)

    u = x - knot
    for poly in range(NUM_POLYS):  # trailing polynomials share the index
        if UNIFORM and NUM_POLYS == 1:  # the row gathered by the search
            coeffs = rows
        else:
            row = (poly * NUM_PIECES + index) * WIDTH
            coeffs = tl.load(rows_ptr + row[:, None] + cols[None, :],
                             eviction_policy="evict_last")
        # columns of the (block_n, W) tile are picked in registers (each row is one thread's)
        y = tl.sum(tl.where(cols[None, :] == 0, coeffs, 0), axis=1)
        for k in tl.static_range(1, DEGREE + 1):
            y = _horner_step(y, tl.sum(tl.where(cols[None, :] == k, coeffs, 0), axis=1), u)
        y = _finish(y, u, x, lo, hi, MODE)
        tl.store(out_ptr + offsets * NUM_POLYS + poly, y.to(out_ptr.dtype.element_ty),
                 mask=in_range, eviction_policy="evict_first")


@triton.jit
def _staged_columns(rows_ptr, NUM_PIECES: tl.constexpr, DEGREE: tl.constexpr,
                    WIDTH: tl.constexpr, TABLE: tl.constexpr, PAIRED: tl.constexpr,
                    COPIES: tl.constexpr):
    """The coefficient columns as register tensors of TABLE * COPIES entries (a tuple):
    entry ``piece * COPIES + c`` is copy c of the piece's coefficient (see
    :func:`_copy_slot`).

    Paired (float32): columns 2j and 2j+1 travel as one 64-bit word (little-endian:
    column 2j in the low half), so a point costs one 8-byte shared load per two
    coefficients.
    """
    table = tl.arange(0, TABLE * COPIES) // COPIES
    columns = ()
    if PAIRED:
        words = rows_ptr.to(tl.pointer_type(tl.uint64))
        for j in tl.static_range((DEGREE + 2) // 2):
            # Triton's frontend has no starred tuples: concatenate
            columns = columns + (tl.load(words + table * (WIDTH // 2) + j,  # noqa: RUF005
                                         mask=table < NUM_PIECES, other=0),)
    else:
        for k in tl.static_range(DEGREE + 1):
            columns = columns + (tl.load(rows_ptr + table * WIDTH + k,  # noqa: RUF005
                                         mask=table < NUM_PIECES, other=0),)
    return columns


@triton.jit
def _copy_slot(index, lanes, COPIES: tl.constexpr):
    """The slot of each point's piece in columns of COPIES interleaved copies, neighbouring
    threads reading different copies (see _FLOAT64_COPIES_MAX_PIECES for what it buys
    and why). float64 x sits two consecutive points to a thread (16-byte vectors), hence
    ``lanes // 2``; a wrong guess of the layout costs speed, never correctness."""
    if COPIES > 1:
        index = index * COPIES + (lanes // 2) % COPIES
    return index


@triton.jit
def _staged_coefficient(columns, k: tl.constexpr, index, PAIRED: tl.constexpr):
    """Coefficient k of each point's piece, gathered through shared memory."""
    if PAIRED:
        word = tl.gather(columns[k // 2], index, 0)
        if k % 2 == 1:
            word = word >> 32
        c = word.to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        c = tl.gather(columns[k], index, 0)
    return c


@triton.jit
def _bucket_tables(below_ptr, split_ptr, knots_ptr, NUM_PIECES: tl.constexpr,
                   BUCKETS: tl.constexpr, TABLE: tl.constexpr, PAIRED: tl.constexpr):
    """The guide tables in registers: (below, split, knots) of ``guide_tables``.

    Paired (float32): below and split travel as one 64-bit word per bucket (below in
    the low half), returned as the first entry; the second repeats it (unused).
    """
    # two entries a thread: the 64-bit words are then staged lane-contiguous (16-byte
    # stores without bank conflicts; at four entries a thread they conflicted 2-way)
    slots = tl.max_contiguous(tl.arange(0, BUCKETS), 2)
    below = tl.load(below_ptr + slots)
    split = tl.load(split_ptr + slots)
    if PAIRED:
        below = (below.to(tl.uint32, bitcast=True).to(tl.uint64)
                 | (split.to(tl.uint32, bitcast=True).to(tl.uint64) << 32))
        split = below
    table = tl.arange(0, TABLE)
    knots = tl.load(knots_ptr + table, mask=table < NUM_PIECES, other=0)
    return below, split, knots


@triton.jit
def _guided_piece(buckets, x, lo, bucket_scale, BUCKETS: tl.constexpr, PAIRED: tl.constexpr,
                  SIDES: tl.constexpr):
    """(row index, expansion point) of each x from the guide tables (``guide_tables``).

    Bucket b = floor((x - x_0) * M / (x_P - x_0)) clipped to [0, M - 1] (0 for NaN);
    piece = max(below + (x >= split), 0). Its knot is split where x >= split (nearly
    every point); the other lanes look it up in ``knots``, and the lanes that do not
    need it read entry 0 (a broadcast, no bank conflict). With ``side_rows``
    (SIDES = T > 0) no lane gathers its knot: the row is ``T + below + 1`` right of
    split, ``below + 1`` (the piece below, re-expanded at split) left of it, except
    that piece 0 keeps its own row 0 and knot x_0 (so p(x_0) stays exact, e.g. every
    x <= x_0 under "clamp").
    """
    bucket = _grid_cell(x, lo, bucket_scale, BUCKETS)
    if PAIRED:
        word = tl.gather(buckets[0], bucket, 0)
        below = word.to(tl.uint32).to(tl.int32, bitcast=True)
        split = (word >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        below = tl.gather(buckets[0], bucket, 0)
        split = tl.gather(buckets[1], bucket, 0)
    above = x >= split
    if SIDES > 0:
        first = (below <= 0) & ~above  # piece 0, and NaN x
        row = tl.where(first, 0, below + 1 + tl.where(above, SIDES, 0))
        return row, tl.where(first, lo, split)
    index = tl.maximum(below + tl.where(above, 1, 0), 0)
    left = tl.gather(buckets[2], tl.where(above, 0, index), 0)
    return index, tl.where(above, split, left)


@triton.jit
def _ppoly_eval_staged_kernel(x_ptr, keys_ptr, rows_ptr, params_ptr, below_ptr, split_ptr,
                              knots_ptr, bucket_scale_ptr, out_ptr,
                              SIZE: tl.constexpr, NUM_PIECES: tl.constexpr,
                              DEGREE: tl.constexpr, WIDTH: tl.constexpr, LEVELS: tl.constexpr,
                              UNIFORM: tl.constexpr, MODE: tl.constexpr,
                              INDEX_64: tl.constexpr, TABLE: tl.constexpr,
                              KEYS: tl.constexpr, PAIRED: tl.constexpr, BLOCK_N: tl.constexpr,
                              CHUNKS: tl.constexpr, BUCKETS: tl.constexpr,
                              COPIES: tl.constexpr, SIDES: tl.constexpr):
    # A program reads the keys and each coefficient column once into registers,
    # then walks CHUNKS blocks of BLOCK_N points; every lookup is a tl.gather
    # through shared memory (a warp's random lookups cost a few bank conflicts
    # instead of one L1 wavefront per distinct 128-byte line). The next block's x
    # is loaded before this block's search and Horner, so HBM reads stay in flight.
    dtype = keys_ptr.dtype.element_ty
    lo = tl.load(params_ptr)
    hi = tl.load(params_ptr + 1)
    scale = tl.load(params_ptr + 2)
    if BUCKETS > 0:  # guided: per bucket (below, split), and the pieces' left knots
        # (rows_ptr: side_rows when SIDES > 0)
        buckets = _bucket_tables(below_ptr, split_ptr, knots_ptr, NUM_PIECES, BUCKETS, TABLE,
                                 PAIRED)
        bucket_scale = tl.load(bucket_scale_ptr)
    else:
        slots = tl.arange(0, KEYS)
        if UNIFORM:  # keys: the P+1 sorted breakpoints
            keys = tl.load(keys_ptr + slots, mask=slots <= NUM_PIECES, other=float("inf"))
        else:  # keys: the Eytzinger tree of the interior breakpoints
            keys = tl.load(keys_ptr + slots)
    if CHUNKS > 1:  # read once, kept in registers across the blocks
        columns = _staged_columns(rows_ptr, NUM_PIECES + SIDES, DEGREE, WIDTH, TABLE + SIDES,
                                  PAIRED, COPIES)

    lanes = tl.arange(0, BLOCK_N)
    start = tl.program_id(0) * (BLOCK_N * CHUNKS)
    if INDEX_64:  # n >= 2^31: point offsets need 64 bits
        start = start.to(tl.int64)
    x_next = tl.load(x_ptr + start + lanes, mask=start + lanes < SIZE, other=0,
                     eviction_policy="evict_first")
    for j in range(CHUNKS):
        offsets = start + j * BLOCK_N + lanes
        x = _fold(x_next.to(dtype), lo, hi, MODE)
        if CHUNKS > 1:  # (one block: no prefetch registers held)
            following = offsets + BLOCK_N
            x_next = tl.load(x_ptr + following, mask=(following < SIZE) & (j + 1 < CHUNKS),
                             other=0, eviction_policy="evict_first")
        if BUCKETS > 0:
            index, knot = _guided_piece(buckets, x, lo, bucket_scale, BUCKETS, PAIRED, SIDES)
        elif UNIFORM:
            guess = _grid_cell(x, lo, scale, NUM_PIECES)
            up = (guess < NUM_PIECES - 1) & (x >= tl.gather(keys, guess + 1, 0))
            down = (guess > 0) & (x < tl.gather(keys, guess, 0))
            index = guess + up.to(tl.int32) - down.to(tl.int32)
            knot = tl.gather(keys, index, 0)
        else:
            node = tl.full([BLOCK_N], 1, tl.int32)
            knot = tl.full([BLOCK_N], 0, dtype) + lo
            for _ in tl.static_range(LEVELS):
                key = tl.gather(keys, node, 0)
                go_right = key <= x
                knot = tl.where(go_right, key, knot)
                node = 2 * node + go_right.to(tl.int32)
            index = node - (1 << LEVELS)
        u = x - knot
        if CHUNKS == 1:  # read after the search: fewer registers live through it
            columns = _staged_columns(rows_ptr, NUM_PIECES + SIDES, DEGREE, WIDTH, TABLE + SIDES,
                                      PAIRED, COPIES)
        slot = _copy_slot(index, lanes, COPIES)
        y = _staged_coefficient(columns, 0, slot, PAIRED).to(dtype)
        for k in tl.static_range(1, DEGREE + 1):
            y = _horner_step(y, _staged_coefficient(columns, k, slot, PAIRED).to(dtype), u)
        y = _finish(y, u, x, lo, hi, MODE)
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=offsets < SIZE,
                 eviction_policy="evict_first")


def uniform_rows(keys: jax.Array, rows: jax.Array, degree: int) -> jax.Array:
    """(*t, P, W') rows of the uniform path: coefficients, zeros, then x_i and x_{i+1}.

    W' = next_pow2(D + 3): 32 bytes per piece for a float32 cubic.
    """
    width = next_pow2(degree + 3)
    lead = rows.shape[:-1]
    knots = jnp.stack([keys[:-1], keys[1:]], axis=-1).astype(rows.dtype)
    return jnp.concatenate([rows[..., : degree + 1],
                            jnp.zeros((*lead, width - degree - 3), rows.dtype),
                            jnp.broadcast_to(knots, (*lead, 2))], axis=-1)


def staging_supported(rows_shape, num_pieces: int) -> bool:
    """Whether the shared-memory kernel takes these tables: one polynomial, P <= 1024.

    A 1024-entry column is 8 registers a thread at 4 warps before it is staged.
    """
    return len(rows_shape) == 2 and num_pieces <= _STAGED_MAX_PIECES


def default_launch(table_dtype, size: int, staged: bool, buckets: int = 0,
                   sides: bool = False) -> tuple[int, int, int]:
    """(block_n, num_warps, chunks) used where the caller gives none (``buckets``: the
    guide's bucket count, 0 without a guide; ``sides``: with ``side_rows``)."""
    itemsize = jnp.dtype(table_dtype).itemsize
    streaming = size > _STREAMING_POINTS
    if staged and streaming and sides:
        return _SIDE_ROWS_STREAMING_LAUNCH
    if staged and itemsize == 4 and streaming and buckets:
        return _GUIDED_FLOAT32_STREAMING_LAUNCH[buckets > _SMALL_GUIDE_BUCKETS]
    if staged:
        return _STAGED_LAUNCH[(itemsize, streaming)]
    return _CACHE_LAUNCH[itemsize]


def _settings(x_dtype, table_dtype, size: int, rows_shape, *, num_pieces: int, degree: int,
              extrapolate: str, uniform: bool, block_n: int | None, staged: bool,
              chunks: int | None = None, buckets: int = 0, sides: bool = False) -> dict:
    """The constexprs of one call of the shared-memory (``staged``) or the cached-table kernel
    (``sides``: ``rows_shape`` is that of ``side_rows``)."""
    num_polys = 1
    for s in rows_shape[:-2]:
        num_polys *= s
    default_block, _, default_chunks = default_launch(table_dtype, size, staged, buckets, sides)
    block = min(block_n or default_block, next_pow2(size))
    chunks = max(1, min(chunks or default_chunks, triton.cdiv(size, block))) if staged else 1
    levels = search_levels(num_pieces)
    settings = dict(SIZE=size, NUM_PIECES=num_pieces, DEGREE=degree, WIDTH=rows_shape[-1],
                    LEVELS=levels, UNIFORM=uniform, MODE=_MODE_CODE[extrapolate],
                    INDEX_64=size * num_polys + block * (chunks + 1) >= 2**31, BLOCK_N=block)
    if staged:
        paired = jnp.dtype(table_dtype) == jnp.float32 and rows_shape[-1] >= 2
        table = next_pow2(num_pieces)
        copies = 2 if (jnp.dtype(table_dtype) == jnp.float64
                       and table <= _FLOAT64_COPIES_MAX_PIECES) else 1
        settings.update(TABLE=table, PAIRED=paired, CHUNKS=chunks, COPIES=copies,
                        KEYS=next_pow2(num_pieces + 1) if uniform else 1 << levels,
                        BUCKETS=buckets, SIDES=table if sides else 0)
    else:
        settings.update(NUM_POLYS=num_polys)
    return settings


@functools.cache
def _batched_launcher(config: tuple):
    """``(keys, rows, params, below, split, knots, scale, x) -> y`` for one static config,
    with a vmap rule (``below, split, knots, scale``: ``guide_tables``, or placeholders;
    ``rows``: ``side_rows`` when ``sides``).

    Under ``jax.vmap`` a batch of x sharing the tables is one launch over the
    flattened points; batched tables (rare) launch once per batch element.
    """
    (extrapolate, uniform, num_pieces, degree, interpret, block_n, num_warps, tables,
     chunks, guided, sides) = config

    @jax.custom_batching.custom_vmap
    def evaluate(keys, rows, params, below, split, knots, scale, x):
        size = x.shape[0]
        trailing = rows.shape[:-2]
        if size == 0:
            return jnp.zeros((0, *trailing), x.dtype)
        staged = tables == "shared" or (tables is None
                                        and staging_supported(rows.shape, num_pieces))
        if uniform and not staged:
            rows = uniform_rows(keys, rows, degree)
        settings = _settings(x.dtype, rows.dtype, size, rows.shape, num_pieces=num_pieces,
                             degree=degree, extrapolate=extrapolate, uniform=uniform,
                             block_n=block_n, staged=staged, chunks=chunks,
                             buckets=below.shape[0] if guided else 0, sides=sides)
        kernel = _ppoly_eval_staged_kernel if staged else _ppoly_eval_kernel
        per_program = settings["BLOCK_N"] * settings.get("CHUNKS", 1)
        operands = ((x, keys, rows, params, below, split, knots, scale) if staged
                    else (x, keys, rows, params))
        y = launch(kernel, operands,
                   jax.ShapeDtypeStruct((size * math.prod(trailing),), x.dtype),
                   (triton.cdiv(size, per_program),),
                   num_warps=num_warps or default_launch(rows.dtype, size, staged,
                                                         settings.get("BUCKETS", 0), sides)[1],
                   interpret=interpret, **settings)
        return y.reshape((size, *trailing))

    @evaluate.def_vmap
    def _vmap(axis_size, in_batched, keys, rows, params, below, split, knots, scale, x):
        *tables_batched, x_batched = in_batched
        tables = (keys, rows, params, below, split, knots, scale)
        if not any(tables_batched):
            x = x if x_batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            y = evaluate(*tables, x.reshape(-1))
            return y.reshape((axis_size, *x.shape[1:], *y.shape[1:])), True
        args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                for a, b in zip((*tables, x), in_batched)]
        return jax.lax.map(lambda a: evaluate(*a), args), True

    return evaluate


@functools.partial(jax.jit, static_argnames=("num_pieces", "degree", "extrapolate", "uniform",
                                             "interpret", "block_n", "num_warps", "tables",
                                             "chunks"))
def ppoly_eval_triton(keys: jax.Array, rows: jax.Array, params: jax.Array, x: jax.Array, *,
                      num_pieces: int, degree: int, extrapolate: str = "extend",
                      uniform: bool = False, interpret: bool = False, block_n: int | None = None,
                      num_warps: int | None = None, tables: str | None = None,
                      chunks: int | None = None, guide: tuple | None = None,
                      side_rows: jax.Array | None = None) -> jax.Array:
    """Evaluate on prepared :func:`gpustat.reference.piecewise.kernel_tables` with a Triton kernel.

    Args:
        keys, rows, params: from ``kernel_tables`` in the compute dtype (float32
            or float64); ``rows`` is (*t, P, W) (trailing axes allowed).
        x: (n,) any floating dtype; read and written in that dtype.
        num_pieces, degree: P and D of the table.
        extrapolate: one of "extend", "nan", "clamp", "periodic".
        uniform: the keys are the sorted breakpoints of a near-uniform grid.
        interpret: run the kernel in Triton's interpreter on the host (tests).
        block_n: points per block (power of two). This, ``num_warps`` and
            ``chunks`` default to :func:`default_launch` (by dtype and size).
        num_warps: warps per program.
        tables: "shared" (keys and coefficients staged in shared memory, gathered
            with ``tl.gather``; one polynomial, P <= 1024), "cache" (gathered from
            global memory through L1) or None (shared where supported).
        chunks: blocks of ``block_n`` points per program of the shared-memory
            kernel (tables read once per program, next block's x prefetched).
        guide: :func:`gpustat.reference.piecewise.guide_tables` of the breakpoints,
            or None. The shared-memory kernel then finds a point's piece from its
            bucket (``below``, ``split``) instead of the uniform guess or the Eytzinger
            search of ``keys``.
        side_rows: :func:`gpustat.reference.piecewise.side_rows` of ``rows`` and ``guide``,
            or None. The shared-memory kernel then reads them instead of ``rows`` and
            looks up no knot (one lookup a point fewer). Needs ``guide`` and one
            polynomial.

    Returns:
        (n, *t) in x's dtype. Works under ``jax.jit`` and ``jax.vmap``; not
        differentiable by itself (the public ``ppoly_eval`` attaches the JVP).
    """
    if extrapolate not in EXTRAPOLATE_MODES:
        raise ValueError(f"extrapolate must be one of {EXTRAPOLATE_MODES}, got {extrapolate=!r}")
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D (n,), got {x.shape=}")
    if tables not in (None, "shared", "cache"):
        raise ValueError(f"tables must be None, 'shared' or 'cache', got {tables=!r}")
    if tables == "shared" and not staging_supported(rows.shape, num_pieces):
        raise ValueError(f"tables='shared' needs one polynomial and P <= {_STAGED_MAX_PIECES}, "
                         f"got {rows.shape=}")
    if guide is None:  # placeholders: the kernel reads them only when guided
        guide = (jnp.zeros((1,), jnp.int32), *(jnp.zeros((1,), rows.dtype),) * 3)
        guided = False
    else:
        guided = True
        if len(guide) != 4 or any(g.dtype != rows.dtype for g in guide[1:]):
            raise ValueError(f"guide must be guide_tables(breakpoints) in {rows.dtype}")
    sides = side_rows is not None
    if sides:
        if not guided or tables == "cache" or not staging_supported(rows.shape, num_pieces):
            raise ValueError("side_rows need guide and the shared-memory kernel (one "
                             f"polynomial, P <= {_STAGED_MAX_PIECES}), got {rows.shape=}, "
                             f"{tables=!r}, guide {'given' if guided else 'None'}")
        expected = (next_pow2(num_pieces) + num_pieces, rows.shape[-1])
        if side_rows.shape != expected or side_rows.dtype != rows.dtype:
            raise ValueError(f"side_rows must be side_rows(knots, rows, degree): {expected} "
                             f"in {rows.dtype}, got {side_rows.shape} {side_rows.dtype}")
        rows = side_rows
    config = (extrapolate, uniform, num_pieces, degree, interpret, block_n, num_warps, tables,
              chunks, guided, sides)
    return _batched_launcher(config)(keys, rows, params, *guide, x)


def _compile_cases() -> tuple[CompileCase, ...]:
    """Configurations the CPU tests compile for sm_90 (P = 256 cubic pieces)."""
    cases = []
    for x_dtype, dtype, uniform, extrapolate, polys, size, buckets, sides in [
        # polys 0: one polynomial, shared tables; 2^23 points: the streaming defaults;
        # buckets > 0: the guided lookup (1024 buckets: the benchmark's graded grid),
        # with side_rows (what float32 tables take) or the knot lookup
        (jnp.float32, jnp.float32, False, "extend", 0, 1 << 23, 1024, True),
        (jnp.float32, jnp.float32, False, "extend", 0, 1 << 23, 1024, False),
        (jnp.float32, jnp.float32, False, "extend", 0, 1 << 23, 0, False),
        (jnp.bfloat16, jnp.float32, True, "nan", 0, 5000, 256, True),
        (jnp.bfloat16, jnp.float32, True, "nan", 0, 5000, 0, False),
        (jnp.float64, jnp.float64, False, "periodic", 0, 5000, 0, False),
        (jnp.float64, jnp.float64, False, "extend", 0, 1 << 23, 1024, False),
        (jnp.float64, jnp.float64, True, "clamp", 0, 1 << 23, 0, False),
        (jnp.float16, jnp.float32, False, "clamp", 3, 5000, 0, False),  # trailing: cached
        (jnp.float64, jnp.float64, True, "periodic", 2, 5000, 0, False),
    ]:
        staged = polys == 0
        if staged:
            rows_shape = (256 + 256, 4) if sides else (256, 4)
        else:
            rows_shape = (polys, 256, 8 if uniform else 4)
        settings = _settings(x_dtype, dtype, size, rows_shape, num_pieces=256, degree=3,
                             extrapolate=extrapolate, uniform=uniform, block_n=None,
                             staged=staged, buckets=buckets, sides=sides)
        lookup = f"guided{buckets}" if buckets else "uniform" if uniform else "search"
        name = (f"ppoly_eval[{jnp.dtype(x_dtype).name},{lookup}{',sides' if sides else ''},"
                f"{extrapolate},{'shared' if staged else f't={polys}'},n={size}]")
        kernel = _ppoly_eval_staged_kernel if staged else _ppoly_eval_kernel
        guide = (jnp.int32, dtype, dtype, dtype) if staged else ()
        cases.append(CompileCase(name, kernel, (x_dtype, dtype, dtype, dtype, *guide, x_dtype),
                                 settings, default_launch(dtype, size, staged, buckets, sides)[1]))
    return tuple(cases)


COMPILE_CASES = _compile_cases()

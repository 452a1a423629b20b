"""Mosaic GPU kernel: evaluate one float32 piecewise polynomial at a stream of points.

The Mosaic GPU twin of :mod:`gpustat.pallas.piecewise` and
:mod:`gpustat.triton.piecewise` for float32 tables of one polynomial, reading the
same tables (:func:`gpustat.reference.piecewise.kernel_tables`,
:func:`~gpustat.reference.piecewise.guide_tables`,
:func:`~gpustat.reference.piecewise.side_rows`), packed into one float32 array
that each CTA copies into shared memory once.

A persistent grid of CTAs (a few per SM) streams x viewed as (n / 128, 128) in
(block_rows, 128) tiles through a TMA pipeline (``plgpu.emit_pipeline``): the
next tiles' copies are in flight while a tile is evaluated, and the tail of the
last tile falls outside the array, where TMA reads zeros and drops the writes.
Every table lookup is a per-lane shared-memory load (:func:`gpustat.pallas._mosaic.lookup`).
The piece is found as in the Triton kernel:

* ``lookup="guided"`` (concrete breakpoints, guide and side rows): the point's
  bucket gives ``below`` and ``split``; the row is ``T + below + 1`` right of
  split, ``below + 1`` left of it, row 0 for piece 0, expanded at ``split``
  (``x_0`` for piece 0);
* ``lookup="uniform"``: ``floor((x - x_0) * P / (x_P - x_0))`` clipped, then one
  comparison with each neighbouring breakpoint;
* ``lookup="search"``: ``node = 2 * node + (key[node] <= x)`` over the Eytzinger
  tree; the last key passed on the right is the piece's left breakpoint.

Horner runs in float32 with a restart on a zero accumulator (no 0 * inf at
+-inf), NaN in gives NaN out, exactly as the reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from gpustat._arrays import next_pow2
from gpustat.pallas._mosaic import LANES, lookup, num_sms, table_shape
from gpustat.reference.piecewise import EXTRAPOLATE_MODES, search_levels

__all__ = [
    "LOOKUPS",
    "MAX_PIECES",
    "evaluate_points",
    "pack_tables",
    "ppoly_eval_mosaic",
    "supports",
    "table_offsets",
]

LOOKUPS = ("guided", "uniform", "search")

# The packed table: PARAMS entries first ([x_0, x_P, P / (x_P - x_0), M / (x_P - x_0)]),
# then the lookup's tables, each starting on a LANES boundary.
_PARAMS = 4
# Most pieces: the packed table (at most 256 x 128 float32 entries, one TMA copy)
# then holds any lookup's tables for cubics (W = 4).
MAX_PIECES = 2048

# Shared memory of one CTA on sm_90 (227 KB).
_SMEM_BYTES = 232448
# Default (block_rows, CTAs per SM, pipeline depth, sub_rows, vec): the fastest guided
# launch of the benchmark's sweep (benchmarks/results/nvidia-h200/probes/mosaic_gpu.md).
_DEFAULT_LAUNCH = (32, 4, 2, 32, 4)


def _align(n: int) -> int:
    return -(-n // LANES) * LANES


def table_offsets(lookup_kind: str, num_pieces: int, width: int, buckets: int = 0):
    """Entry offsets of the packed tables ((below, split) pairs and side rows for
    "guided"; keys and rows otherwise) and the packed size: static, from the shapes."""
    if lookup_kind == "guided":
        sizes = (2 * buckets, (next_pow2(num_pieces) + num_pieces) * width)
    elif lookup_kind == "uniform":
        sizes = (num_pieces + 1, num_pieces * width)
    else:
        sizes = (1 << search_levels(num_pieces), num_pieces * width)
    offsets, at = [], _align(_PARAMS)
    for size in sizes:
        offsets.append(at)
        at += _align(size)
    return tuple(offsets), at


def pack_tables(keys, rows, params, guide=None, sides=None):
    """The (R, 128) float32 table the kernel copies into shared memory.

    Args:
        keys, rows, params: :func:`~gpustat.reference.piecewise.kernel_tables`
            (rows (P, W), float32).
        guide: :func:`~gpustat.reference.piecewise.guide_tables` (with ``sides``).
        sides: :func:`~gpustat.reference.piecewise.side_rows`, or None: the kernel
            then searches ``keys`` (sorted breakpoints or Eytzinger tree).

    Returns:
        [x_0, x_P, P / (x_P - x_0), M / (x_P - x_0)], then each table at its
        :func:`table_offsets` offset, zero padded: the guide as (below, split) pairs
        (int32 ``below`` bitcast, one 8-byte load a point), rows of width W (one
        16-byte load per 4 coefficients). numpy for concrete inputs, jax.numpy for
        traced ones.
    """
    concrete = not any(isinstance(a, jax.core.Tracer)
                       for a in (keys, rows, params, *(guide or ()), sides))
    xp = np if concrete else jnp
    f32 = np.float32
    bucket_scale = (xp.asarray(guide[3], f32).reshape(-1)[:1] if sides is not None
                    else xp.zeros((1,), f32))
    parts = [xp.concatenate([xp.asarray(params, f32)[:3], bucket_scale])]
    if sides is not None:
        below = xp.asarray(guide[0], np.int32)
        below = below.view(f32) if concrete else jax.lax.bitcast_convert_type(below, f32)
        pairs = xp.stack([below, xp.asarray(guide[1], f32)], axis=1).reshape(-1)
        parts += [pairs, xp.asarray(sides, f32).reshape(-1)]
    else:
        parts += [xp.asarray(keys, f32), xp.asarray(rows, f32).reshape(-1)]
    table = xp.concatenate([xp.pad(part, (0, _align(part.size) - part.size)) for part in parts])
    return table.reshape(table_shape(table.size))


def supports(compute_dtype, trailing: tuple, num_pieces: int, size: int,
             extrapolate: str) -> str:
    """Why the kernel cannot run a call ('' when it can): float32 compute, one
    polynomial, n a multiple of 128, P <= MAX_PIECES, no periodic extrapolation."""
    if extrapolate == "periodic":
        return "the Mosaic GPU lowering has no float remainder (extrapolate='periodic')"
    if jnp.dtype(compute_dtype) != jnp.float32:
        return ("the Mosaic GPU kernel computes in float32 (TMA moves no float64), got "
                f"{jnp.dtype(compute_dtype).name}")
    if trailing:
        return "the Mosaic GPU kernel evaluates one polynomial (no trailing axes)"
    if size % LANES:
        return (f"the Mosaic GPU kernel streams x as (n / {LANES}, {LANES}): n must be a "
                f"multiple of {LANES}, got n={size}")
    if num_pieces > MAX_PIECES:
        return f"the Mosaic GPU kernel's tables hold at most {MAX_PIECES} pieces"
    return ""


def _cell(x, lo, scale, cells: int):
    """floor((x - lo) * scale) clipped to [0, cells - 1], 0 for NaN (as the other kernels).

    Clipped in float first, so the int cast (which truncates) is the floor.
    """
    t = (x - lo) * scale
    t = jnp.where(t == t, jnp.minimum(jnp.maximum(t, 0.0), cells - 1.0), 0.0)
    return t.astype(jnp.int32)


def evaluate_points(x, params, gather, *, lookup_kind: str, offsets: tuple, num_pieces: int,
                    degree: int, width: int, buckets: int, extrapolate: str):
    """p(x) for an array of float32 points.

    ``gather(index, offset=, stride=, dtypes=)`` reads, for every element, the
    ``len(dtypes)`` packed-table entries from ``offset + index * stride`` (the
    kernel's per-lane shared-memory vector load, :func:`gpustat.pallas._mosaic.lookup`;
    a jnp gather in the tests) and returns one array per entry.
    """
    lo, hi, scale, bucket_scale = params
    if extrapolate == "clamp":  # comparisons keep NaN as NaN
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))

    def at(offset, index):
        (value,) = gather(index, offset=offset, stride=1, dtypes=(jnp.float32,))
        return value

    if lookup_kind == "guided":
        off_pairs, off_rows = offsets
        bucket = _cell(x, lo, bucket_scale, buckets)
        below, split = gather(bucket, offset=off_pairs, stride=2,
                              dtypes=(jnp.int32, jnp.float32))
        above = (x >= split).astype(jnp.int32)  # (no boolean negation in the lowering)
        first = (below <= 0) & (above == 0)  # piece 0, and NaN x
        sides = next_pow2(num_pieces)
        index = jnp.where(first, 0, below + 1 + above * sides)
        knot = jnp.where(first, lo, split)
    elif lookup_kind == "uniform":
        off_keys, off_rows = offsets
        guess = _cell(x, lo, scale, num_pieces)
        left = at(off_keys, guess)
        right = at(off_keys + 1, guess)
        up = (guess < num_pieces - 1) & (x >= right)
        down = (guess > 0) & (x < left)
        before = at(off_keys, jnp.maximum(guess - 1, 0))
        index = guess + up.astype(jnp.int32) - down.astype(jnp.int32)
        knot = jnp.where(up, right, jnp.where(down, before, left))
    else:
        off_keys, off_rows = offsets
        levels = search_levels(num_pieces)
        node = jnp.full(x.shape, 1, jnp.int32)
        knot = jnp.full(x.shape, lo, x.dtype)
        for _ in range(levels):
            key = at(off_keys, node)
            go_right = key <= x
            knot = jnp.where(go_right, key, knot)
            node = 2 * node + go_right.astype(jnp.int32)
        index = node - (1 << levels)

    u = x - knot
    vec = min(width, 4)
    coeffs = []
    for start in range(0, degree + 1, vec):  # the row, 4 entries a load
        coeffs += gather(index, offset=off_rows + start, stride=width,
                         dtypes=(jnp.float32,) * vec)
    return _horner(coeffs, u, x, lo, hi, degree, extrapolate)


def _horner(coeffs, u, x, lo, hi, degree: int, extrapolate: str):
    """p at local coordinate u from highest-first coefficients, as the reference: a zero
    accumulator restarts (no 0 * inf at +-inf), NaN in gives NaN out (also for an
    all-zero piece), NaN outside [x_0, x_P] under "nan"."""
    y = coeffs[0]
    for c in coeffs[1:degree + 1]:
        y = jnp.where(y == 0, c, y * u + c)
    y = jnp.where(u != u, u, y)
    if extrapolate == "nan":
        y = jnp.where((x < lo) | (x > hi), jnp.nan, y)
    return y


def _kernel(x_gmem, table_gmem, o_gmem, table, barrier, *, block_rows: int, per_cta: int,
            depth: int, sub_rows: int, vec: int, **settings):
    plgpu.copy_gmem_to_smem(table_gmem, table, barrier)
    plgpu.barrier_wait(barrier)
    params = tuple(table[0, k] for k in range(_PARAMS))
    cta = jax.lax.axis_index("cta")
    # sub_rows rows of a tile at a time: sub_rows points a thread, so the values of a
    # point's lookup chain stay in registers
    layout = plgpu.Layout.WG_STRIDED((sub_rows, LANES), vec_size=vec)

    def gather(index, **row):
        return lookup(table, index, layout, **row)

    def step(_, x_tile, o_tile):
        def part(i, carry):
            rows = pl.ds(i * sub_rows, sub_rows)
            x = plgpu.layout_cast(x_tile[rows], layout)
            o_tile[rows] = evaluate_points(x, params, gather, **settings)
            return carry

        jax.lax.fori_loop(0, block_rows // sub_rows, part, 0)

    spec = plgpu.BlockSpec((block_rows, LANES), lambda j: (cta * per_cta + j, 0))
    plgpu.emit_pipeline(step, grid=(per_cta,), in_specs=[spec], out_specs=[spec],
                        max_concurrent_steps=depth)(x_gmem, o_gmem)


@functools.partial(jax.jit, static_argnames=(
    "lookup_kind", "num_pieces", "degree", "buckets", "extrapolate", "block_rows",
    "ctas_per_sm", "depth", "sub_rows", "vec"))
def ppoly_eval_mosaic(table: jax.Array, x: jax.Array, *, lookup_kind: str, num_pieces: int,
                      degree: int, buckets: int = 0,
                      extrapolate: str = "extend", block_rows: int | None = None,
                      ctas_per_sm: int | None = None, depth: int | None = None,
                      sub_rows: int | None = None, vec: int | None = None) -> jax.Array:
    """p(x) for float32 x (n,), n a multiple of 128, from :func:`pack_tables`' table.

    Args:
        table: (R, 128) float32 from :func:`pack_tables`.
        x: (n,) float32.
        lookup_kind: one of :data:`LOOKUPS` ("guided": the table holds the guide and
            side rows).
        num_pieces, degree: P and D (coefficient rows of width next_pow2(D + 1)).
        buckets: the guide's bucket count M ("guided").
        extrapolate: one of "extend", "nan", "clamp" ("periodic": see :func:`supports`).
        block_rows: rows of 128 points a pipeline step evaluates; this and the next
            two settings default to ``_DEFAULT_LAUNCH``.
        ctas_per_sm: persistent CTAs per SM; 0: one CTA per tile (each copies the
            table; the hardware schedules them).
        depth: TMA pipeline depth (tiles in flight).
        sub_rows: rows evaluated at a time inside a tile (a divisor of block_rows).
        vec: consecutive points a thread holds (1, 2 or 4; its x and y move in
            ``4 * vec``-byte shared-memory accesses).

    Returns:
        (n,) float32.
    """
    if extrapolate not in EXTRAPOLATE_MODES:
        raise ValueError(f"extrapolate must be one of {EXTRAPOLATE_MODES}, got {extrapolate=!r}")
    if lookup_kind not in LOOKUPS:
        raise ValueError(f"lookup_kind must be one of {LOOKUPS}, got {lookup_kind=!r}")
    reason = supports(x.dtype, (), num_pieces, x.shape[0], extrapolate)
    if reason:
        raise ValueError(reason)
    width = next_pow2(degree + 1)
    offsets, entries = table_offsets(lookup_kind, num_pieces, width, buckets)
    if table.shape != table_shape(entries):
        raise ValueError(f"table must be pack_tables(...) of shape {table_shape(entries)}, "
                         f"got {table.shape}")
    block_rows = block_rows or _DEFAULT_LAUNCH[0]
    ctas_per_sm = _DEFAULT_LAUNCH[1] if ctas_per_sm is None else ctas_per_sm
    depth = depth or _DEFAULT_LAUNCH[2]
    sub_rows = min(sub_rows or _DEFAULT_LAUNCH[3], block_rows)
    vec = vec or _DEFAULT_LAUNCH[4]
    if vec not in (1, 2, 4):
        raise ValueError(f"vec must be 1, 2 or 4, got {vec}")
    if block_rows % sub_rows:
        raise ValueError(f"sub_rows={sub_rows} must divide block_rows={block_rows}")
    smem = 4 * (table.size + 2 * depth * block_rows * LANES)  # table, x and y tiles
    if smem > _SMEM_BYTES:
        raise ValueError(f"block_rows={block_rows} and depth={depth} need {smem} bytes of "
                         f"shared memory with this table, more than {_SMEM_BYTES}")
    size = x.shape[0]
    if size == 0:
        return jnp.zeros((0,), x.dtype)
    rows = size // LANES
    tiles = pl.cdiv(rows, block_rows)
    ctas = tiles if ctas_per_sm == 0 else max(1, min(num_sms() * ctas_per_sm, tiles))
    per_cta = pl.cdiv(tiles, ctas)
    ctas = pl.cdiv(tiles, per_cta)
    kernel = functools.partial(
        _kernel, block_rows=block_rows, per_cta=per_cta, depth=depth, sub_rows=sub_rows, vec=vec,
        lookup_kind=lookup_kind,
        offsets=offsets, num_pieces=num_pieces, degree=degree, width=width, buckets=buckets,
        extrapolate=extrapolate)
    run = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((rows, LANES), jnp.float32),
        grid=(ctas,), grid_names=("cta",),
        scratch_types=[plgpu.SMEM(table.shape, jnp.float32), plgpu.Barrier()],
    )
    return run(x.reshape(rows, LANES), table).reshape(size)

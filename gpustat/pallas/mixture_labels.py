"""Pallas-Triton kernel for the statistics of hard labels (Gibbs sweeps, k-means-style
counts): (N_j, sum_i w_i x_i, sum_i w_i x_i x_i^T) over the rows labelled j.

Rows are sorted by label (stable, so the sums are deterministic): component j owns the run
of rows [start_j, end_j), which spans row tiles first_j .. last_j of ``block_n`` rows. A
*work item* is up to ``tiles_per_item`` consecutive tiles of one run; its program sums
w x x^T over them with one (P, block_n) @ (block_n, P) product per tile, rows outside the
run weighted 0. No product multiplies the zeros of other components (one-hot
responsibilities over (block_n, block_k) tiles spend block_k times the work).

A run of m tiles makes ceil(m / tiles_per_item) items, so there are at most
n_tiles / tiles_per_item + K items: a static bound, the unused ones empty. The items'
partial sums are added per component by a one-hot (k, items) product at full precision
(XLA; no atomics, so deterministic). Large components are spread over many programs, so
imbalanced labels (a Gibbs sweep's start) keep every SM busy.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat._arrays import pad_axis
from gpustat.pallas._common import pallas_call, register_lowering_case
from gpustat.reference.mixture import SuffStats

__all__ = ["LABEL_BLOCKS", "label_stats"]

# Row tile, tiles per work item and warps per float32 dot algorithm (float64 takes
# "highest"): among the fastest of a sweep on an H100 at n = 1e6, p = 16, k = 256, away
# from settings that ran ~10x slower there (tf32x3 with 256-row tiles on 2 warps, highest
# with 128-row tiles on 2 warps, 512-row tiles on 1 warp): kernel 0.085 / 0.086 ms.
# float64 (same H100 and size, 2026-11-25): draw + label statistics 8.70-8.77 ms for six
# settings from 32 to 256 rows on 1 to 4 warps, so it keeps "highest"'s.
LABEL_BLOCKS = {
    "tf32x3": {"block_n": 128, "tiles_per_item": 16, "num_warps": 2},
    "highest": {"block_n": 256, "tiles_per_item": 8, "num_warps": 2},
}


def _work_items(start, end, block_n, tiles_per_item, n_items):
    """(component (n_items,), bounds (4, n_items) int32: first tile, end tile, first row,
    end row) of each work item, from the runs [start_j, end_j) of the sorted rows; unused
    items have no tiles and component 0."""
    first = start // block_n
    tiles = jnp.where(end > start, (end - 1) // block_n + 1 - first, 0)
    items = -(-tiles // tiles_per_item)
    items_end = jnp.cumsum(items)
    item = jnp.arange(n_items, dtype=jnp.int32)
    used = item < items_end[-1]
    component = jnp.searchsorted(items_end, item, side="right", method="scan_unrolled")
    component = jnp.where(used, component, 0).astype(jnp.int32)
    tile_lo = first[component] + (item - (items_end - items)[component]) * tiles_per_item
    tile_hi = jnp.minimum(tile_lo + tiles_per_item, first[component] + tiles[component])
    bounds = jnp.stack([tile_lo, jnp.where(used, tile_hi, tile_lo), start[component],
                        end[component]])
    return component, bounds


def _item_kernel(x_ref, w_ref, bounds_ref, counts_ref, s1_ref, s2_ref, *, block_n,
                 algorithm):
    """Partial sums of one work item: its tiles' rows in [first row, end row)."""
    i = pl.program_id(0)
    P = x_ref.shape[1]
    dtype = x_ref.dtype
    row_lo, row_hi = bounds_ref[2, i], bounds_ref[3, i]

    def body(t, acc):
        count, s1, s2 = acc
        rows = pl.ds(t * block_n, block_n)
        row = t * block_n + jax.lax.broadcasted_iota(jnp.int32, (block_n, 1), 0)
        w = jnp.where((row >= row_lo) & (row < row_hi), w_ref[rows][:, None], 0)
        x = x_ref[rows, :]
        xw = x * w
        # rows contract: (block_n, P)^T x (block_n, P)
        s2 = s2 + jax.lax.dot_general(xw, x, (((0,), (0,)), ((), ())), precision=algorithm,
                                      preferred_element_type=dtype)
        return count + jnp.sum(w, axis=0), s1 + jnp.sum(xw, axis=0), s2

    init = (jnp.zeros((1,), dtype), jnp.zeros((P,), dtype), jnp.zeros((P, P), dtype))
    count, s1, s2 = jax.lax.fori_loop(bounds_ref[0, i], bounds_ref[1, i], body, init)
    counts_ref[pl.ds(i, 1)] = count
    s1_ref[i, :] = s1
    s2_ref[i, :, :] = s2


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def label_stats(Xp, w, labels, n_components: int, p: int, *, algorithm, interpret: bool,
                block_n: int, tiles_per_item: int, num_warps: int) -> SuffStats:
    """Statistics of ``labels`` over the rows of ``Xp`` (n, P) (features padded to a power
    of two P >= 16, the first ``p`` real) weighted by ``w``; labels outside
    [0, n_components) count nowhere. ``algorithm``: the float32 dot algorithm (None for
    native float64)."""
    dtype = Xp.dtype
    P = Xp.shape[1]
    # out-of-range labels sort after every run and are not counted
    labels = jnp.where((labels >= 0) & (labels < n_components), labels, n_components)
    sorted_labels, order = jax.lax.sort_key_val(
        labels, jnp.arange(labels.shape[0], dtype=jnp.int32), is_stable=True)
    # run edges: one fused binary search (a scatter-add count contends on k bins; the
    # looped search launches kernels per step)
    edges = jnp.searchsorted(sorted_labels, jnp.arange(n_components + 1, dtype=jnp.int32),
                             method="scan_unrolled").astype(jnp.int32)
    # one gather of the sorted rows, padded to whole tiles (the padding rows lie after
    # every run, so the kernel gives them weight 0)
    order = pad_axis(order, 0, block_n)
    x, w = Xp[order], w[order]
    n_tiles = order.shape[0] // block_n
    n_items = -(-n_tiles // tiles_per_item) + n_components
    component, bounds = _work_items(edges[:-1], edges[1:], block_n, tiles_per_item, n_items)
    inputs = (x, w, bounds)
    out_shape = [jax.ShapeDtypeStruct((n_items,), dtype),
                 jax.ShapeDtypeStruct((n_items, P), dtype),
                 jax.ShapeDtypeStruct((n_items, P, P), dtype)]
    count, s1, s2 = pallas_call(
        functools.partial(_item_kernel, block_n=block_n, algorithm=algorithm),
        interpret=interpret, num_warps=num_warps, grid=(n_items,),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=[_full_spec(s.shape) for s in out_shape], out_shape=out_shape,
    )(*inputs)
    # per component: a one-hot product over the items (exact, deterministic)
    onehot = (component[None, :] == jnp.arange(n_components)[:, None]).astype(dtype)
    flat = jnp.concatenate([count[:, None], s1, s2.reshape(n_items, P * P)], axis=1)
    total = jnp.dot(onehot, flat, precision=jax.lax.Precision.HIGHEST)
    s2 = total[:, 1 + P:].reshape(n_components, P, P)[:, :p, :p]
    return SuffStats(total[:, 0], total[:, 1:1 + p], 0.5 * (s2 + jnp.swapaxes(s2, 1, 2)),
                     jnp.zeros((), dtype))


def _register_lowering_cases() -> None:
    """float32 with both dot algorithms and float64; n = 100 ragged rows, p = 16, k = 40."""
    n, P, k = 100, 16, 40
    algorithms = {"float32_highest": (jnp.float32, jax.lax.DotAlgorithmPreset.F32_F32_F32),
                  "float32_tf32x3": (jnp.float32, jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3),
                  "float64": (jnp.float64, None)}
    for name, (dtype, algorithm) in algorithms.items():
        register_lowering_case(
            "mixture_labels", f"label_stats_{name}",
            functools.partial(label_stats, n_components=k, p=P, algorithm=algorithm,
                              interpret=False, **LABEL_BLOCKS["highest"]),
            (jax.ShapeDtypeStruct((n, P), dtype), jax.ShapeDtypeStruct((n,), dtype),
             jax.ShapeDtypeStruct((n,), jnp.int32)))


_register_lowering_cases()

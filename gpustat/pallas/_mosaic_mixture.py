"""Mosaic GPU E-step of a Gaussian mixture at precision "f16x3" (sm_90+, ``wgmma``).

The Mosaic GPU twin of :mod:`gpustat.triton.mixture`: with quadratic features
phi(x) = [x_a x_b (a <= b), x, 1] and per-component weights W (F, m),
``log w_j + log N(x | mu_j, Sigma_j) = phi(x)^T W[:, j]``, and the statistics are
R^T Phi. Operands are split into float16 hi + lo after power-of-two scaling
(:mod:`gpustat.reference._mixture_split`); each product is lo*hi + hi*lo + hi*hi on
the tensor cores with float32 accumulation.

Two kernels per chunk of rows:

* density (one CTA per 64 rows, every component at once): a TMA pipeline over
  32-feature slices of Phi and W feeds three ``wgmma`` a slice into a (64, K)
  float32 accumulator; the epilogue in registers writes log p(x), the
  responsibilities scaled per (64-row block, component) to a maximum <= 2^14 and
  split into float16 hi and lo, and the blocks' exponents;
* statistics (grid: 32-feature slice, row range): a TMA pipeline over 64-row tiles
  of R and Phi; R^T Phi of a tile is three ``wgmma`` with R read transposed from
  shared memory into a (K, 32) accumulator, which is rescaled like flash attention
  when a tile with a larger exponent arrives. The row ranges are summed by XLA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from gpustat._arrays import next_pow2, over_row_chunks, row_weights
from gpustat.pallas._mosaic import num_sms
from gpustat.reference._mixture_split import MIN_EXP, SPLIT_EXP, split_features, split_weights
from gpustat.reference.mixture import (
    MixtureParams,
    SuffStats,
    n_features,
    quadratic_weights,
    stats_from_quadratic,
)

__all__ = ["MAX_COMPONENTS", "log_prob", "suff_stats", "supports"]

MAX_COMPONENTS = 256  # the density accumulator holds (64, K) float32, K <= 256 (wgmma N)
MAX_FEATURES = 32
ROWS_PER_CHUNK = 1 << 20
BLOCK_M = 64  # density rows per CTA (= the responsibilities' scaling block)
BLOCK_F = 32  # features per pipeline step (density) and per statistics CTA
_DEPTH = 2  # TMA pipeline depth of both kernels
# scratch of the cross-warp reductions (a (64, 256) tile's column maxima)
_PARAMS = plgpu.CompilerParams(reduction_scratch_bytes=4 * 256 * 4 * 4,
                               lowering_semantics=plgpu.LoweringSemantics.Lane)


def lowers_with_this_jax() -> bool:
    """The kernels' shared-memory transfers lower with jax 0.11's Mosaic GPU; the transfer
    planner of jax 0.12 finds no bank-conflict-free pattern for them."""
    return tuple(int(part) for part in jax.__version__.split(".")[:2]) < (0, 12)


def supports(dtype, n_features_: int, n_components: int) -> str:
    """Why the kernels cannot run a call ('' when they can)."""
    if not lowers_with_this_jax():
        return (f"the Mosaic GPU E-step lowers with jax 0.11 only (jax {jax.__version__}'s "
                "Mosaic GPU plans no bank-conflict-free transfer for it)")
    if jnp.dtype(dtype) != jnp.float32:
        return f"the Mosaic GPU E-step takes float32 X, got {jnp.dtype(dtype).name}"
    if n_components > MAX_COMPONENTS:
        return (f"the Mosaic GPU E-step takes n_components <= {MAX_COMPONENTS}, got "
                f"{n_components}")
    if n_features_ > MAX_FEATURES:
        return f"the Mosaic GPU E-step takes p <= {MAX_FEATURES} features, got {n_features_}"
    return ""


# Tiling + swizzle of every float16 SMEM operand: wgmma needs one swizzle for both
# operands, and the 32-feature slices have 64-byte rows.
_F16_TRANSFORMS = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))


def _spread(v, shape, axis: int):
    """A per-row (``axis=0``) or per-column (``axis=1``) vector broadcast over a WGMMA tile."""
    return plgpu.layout_cast(jax.lax.broadcast_in_dim(v, shape, (axis,)), plgpu.Layout.WGMMA)


def _pow2(e):
    """2^max(e, -126) for integer-valued float32 e, exactly (from the bits). Factors are
    at most 2^126 apart where used, so the clamp never changes a non-zero product by
    more than 2^-100 of the accumulator."""
    bits = (jnp.maximum(e, -126.0).astype(jnp.int32) + 127) << 23
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _ceil_log2(v):
    """ceil(log2 v) for v > 0 from the bits (v = 0 and subnormals give <= -126)."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int32)
    exponent = (bits >> 23) - 127
    return (exponent + ((bits & 0x7FFFFF) != 0).astype(jnp.int32)).astype(jnp.float32)


def _density_kernel(phi_hi, phi_lo, w_hi, w_lo, inv_scale_g, bias_g, weight_g,
                    lse_g, r_hi_g, r_lo_g, r_exp_g,
                    vec_smem, weight_smem, lse_smem, r_hi_smem, r_lo_smem, r_exp_smem, barriers,
                    *, features: int, components: int, write_resp: bool):
    tile = jax.lax.axis_index("tile")
    rows = pl.ds(tile * BLOCK_M, BLOCK_M)
    plgpu.copy_gmem_to_smem(inv_scale_g, vec_smem.at[0], barriers.at[0])
    plgpu.copy_gmem_to_smem(bias_g, vec_smem.at[1], barriers.at[1])
    plgpu.copy_gmem_to_smem(weight_g.at[rows], weight_smem, barriers.at[2])

    def products(acc_ref):
        def step(_, a_hi, a_lo, b_hi, b_lo):
            plgpu.wgmma(acc_ref, a_lo, b_hi)  # small terms first
            plgpu.wgmma(acc_ref, a_hi, b_lo)
            plgpu.wgmma(acc_ref, a_hi, b_hi)
            plgpu.wgmma_wait(0)

        phi_spec = plgpu.BlockSpec((BLOCK_M, BLOCK_F), lambda f: (tile, f),
                                   transforms=_F16_TRANSFORMS)
        w_spec = plgpu.BlockSpec((BLOCK_F, components), lambda f: (f, 0),
                                 transforms=_F16_TRANSFORMS)
        plgpu.emit_pipeline(step, grid=(features // BLOCK_F,),
                            in_specs=[phi_spec, phi_spec, w_spec, w_spec],
                            max_concurrent_steps=_DEPTH)(phi_hi, phi_lo, w_hi, w_lo)
        return acc_ref[...]

    acc = pl.run_scoped(products, plgpu.ACC((BLOCK_M, components), jnp.float32))
    for i in range(3):
        plgpu.barrier_wait(barriers.at[i])
    per_component = plgpu.Layout.WGMMA.reduce(0)
    inv_scale = plgpu.load(vec_smem.at[0], layout=per_component, optimized=False)
    bias = plgpu.load(vec_smem.at[1], layout=per_component, optimized=False)
    shape = acc.shape
    logit = acc * _spread(inv_scale, shape, 1) + _spread(bias, shape, 1)
    top = jnp.max(logit, axis=1)
    e = jnp.exp(logit - _spread(top, shape, 0))
    total = jnp.sum(e, axis=1)
    lse_smem[...] = top + jnp.log(total)
    if write_resp:
        weight = plgpu.load(weight_smem, layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
        r = e * _spread(weight / total, shape, 0)
        # per component: the block's column scaled to a maximum <= 2^SPLIT_EXP, then split
        r_exp = jnp.maximum(_ceil_log2(jnp.max(r, axis=0)), MIN_EXP)
        scaled = r * _spread(_pow2(SPLIT_EXP - r_exp), shape, 1)
        hi = scaled.astype(jnp.float16)
        r_hi_smem[...] = hi
        r_lo_smem[...] = (scaled - hi.astype(jnp.float32)).astype(jnp.float16)
        r_exp_smem[...] = r_exp
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(lse_smem, lse_g.at[rows])
    if write_resp:
        plgpu.copy_smem_to_gmem(r_hi_smem, r_hi_g.at[rows])
        plgpu.copy_smem_to_gmem(r_lo_smem, r_lo_g.at[rows])
        plgpu.copy_smem_to_gmem(r_exp_smem, r_exp_g.at[tile])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("write_resp",))
def _density(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, weight, *, write_resp: bool = True):
    """log p(x) (n,) and, with ``write_resp``, R hi, lo (n, K) float16 and the blocks'
    exponents (blocks, K)."""
    n, features = phi_hi.shape
    components = w_hi.shape[1]
    blocks = pl.cdiv(n, BLOCK_M)
    resp_rows = n if write_resp else BLOCK_M
    out = (jax.ShapeDtypeStruct((n,), jnp.float32),
           jax.ShapeDtypeStruct((resp_rows, components), jnp.float16),
           jax.ShapeDtypeStruct((resp_rows, components), jnp.float16),
           jax.ShapeDtypeStruct((blocks if write_resp else 1, components), jnp.float32))
    kernel = functools.partial(_density_kernel, features=features, components=components,
                               write_resp=write_resp)
    return plgpu.kernel(
        kernel, out_type=out, grid=(blocks,), grid_names=("tile",),
        scratch_types=[plgpu.SMEM((2, components), jnp.float32),
                       plgpu.SMEM((BLOCK_M,), jnp.float32),
                       plgpu.SMEM((BLOCK_M,), jnp.float32),
                       plgpu.SMEM((BLOCK_M, components), jnp.float16, transforms=_F16_TRANSFORMS),
                       plgpu.SMEM((BLOCK_M, components), jnp.float16, transforms=_F16_TRANSFORMS),
                       plgpu.SMEM((components,), jnp.float32),
                       plgpu.Barrier(num_barriers=3)],
        compiler_params=_PARAMS,
    )(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, weight)


def _stats_kernel(r_hi_g, r_lo_g, phi_hi_g, phi_lo_g, r_exp_g, t_g, t_smem,
                  *, tiles_per_split: int, components: int):
    fb = jax.lax.axis_index("feature_block")
    split = jax.lax.axis_index("split")
    first = split * tiles_per_split
    r_spec = plgpu.BlockSpec((BLOCK_M, components), lambda t: (first + t, 0),
                             transforms=_F16_TRANSFORMS)
    phi_spec = plgpu.BlockSpec((BLOCK_M, BLOCK_F), lambda t: (first + t, fb),
                               transforms=_F16_TRANSFORMS)
    exp_spec = plgpu.BlockSpec((1, components), lambda t: (first + t, 0))
    per_component = plgpu.Layout.WGMMA.reduce(1)

    def step(_, r_hi, r_lo, p_hi, p_lo, tile_exp_ref, carry):
        acc, acc_exp = carry

        def products(part_ref):
            plgpu.wgmma(part_ref, r_lo.transpose((1, 0)), p_hi)
            plgpu.wgmma(part_ref, r_hi.transpose((1, 0)), p_lo)
            plgpu.wgmma(part_ref, r_hi.transpose((1, 0)), p_hi)
            return part_ref[...]

        part = pl.run_scoped(products, plgpu.ACC((components, BLOCK_F), jnp.float32))
        tile_exp = plgpu.load(tile_exp_ref.at[0], layout=per_component, optimized=False)
        new_exp = jnp.maximum(acc_exp, tile_exp)
        acc = (acc * _spread(_pow2(acc_exp - new_exp), part.shape, 0)
               + part * _spread(_pow2(tile_exp - new_exp), part.shape, 0))
        return acc, new_exp

    init = (plgpu.layout_cast(jnp.zeros((components, BLOCK_F), jnp.float32),
                              plgpu.Layout.WGMMA),
            plgpu.layout_cast(jnp.full((components,), 2.0 * MIN_EXP, jnp.float32),
                              per_component))
    acc, acc_exp = plgpu.emit_pipeline(
        step, grid=(tiles_per_split,),
        in_specs=[r_spec, r_spec, phi_spec, phi_spec, exp_spec],
        max_concurrent_steps=_DEPTH, init_carry=init,
    )(r_hi_g, r_lo_g, phi_hi_g, phi_lo_g, r_exp_g)
    t_smem[...] = acc * _spread(_pow2(acc_exp - SPLIT_EXP), acc.shape, 0)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(t_smem, t_g.at[split, :, pl.ds(fb * BLOCK_F, BLOCK_F)])
    plgpu.wait_smem_to_gmem(0)


@jax.jit
def _stats(r_hi, r_lo, phi_hi, phi_lo, r_exp):
    """R^T Phi (K, F), unscaled from the responsibilities' exponents."""
    n, components = r_hi.shape
    features = phi_hi.shape[1]
    tiles = pl.cdiv(n, BLOCK_M)
    splits = min(num_sms(), tiles)
    tiles_per_split = pl.cdiv(tiles, splits)
    splits = pl.cdiv(tiles, tiles_per_split)
    # tiles past the last block read zeros; their exponent is the "nothing yet" value
    r_exp = jnp.pad(r_exp, ((0, splits * tiles_per_split - tiles), (0, 0)),
                    constant_values=2.0 * MIN_EXP)
    kernel = functools.partial(_stats_kernel, tiles_per_split=tiles_per_split,
                               components=components)
    partial = plgpu.kernel(
        kernel, out_type=jax.ShapeDtypeStruct((splits, components, features), jnp.float32),
        grid=(features // BLOCK_F, splits), grid_names=("feature_block", "split"),
        scratch_types=[plgpu.SMEM((components, BLOCK_F), jnp.float32)],
        compiler_params=_PARAMS,
    )(r_hi, r_lo, phi_hi, phi_lo, r_exp)
    return jnp.sum(partial, axis=0)


def _padded_sizes(p: int, m: int) -> tuple[int, int]:
    """(F_pad, K): features padded to BLOCK_F, components to a power of two >= 64 (the
    statistics accumulator has K rows, wgmma takes M in multiples of 64)."""
    return -(-n_features(p) // BLOCK_F) * BLOCK_F, max(64, next_pow2(m))


def _chunk_density(X, w, W, write_resp: bool):
    """(log p(x) (n,), [R hi, R lo, exponents], (Phi hi, Phi lo), s) of one chunk, the
    rows padded to BLOCK_M with zero-weight rows (TMA tiles need whole 8-row tiles)."""
    n = X.shape[0]
    F_pad, K = _padded_sizes(X.shape[1], W.shape[1])
    pad = pl.cdiv(n, BLOCK_M) * BLOCK_M - n
    X, w = jnp.pad(X, ((0, pad), (0, 0))), jnp.pad(w, (0, pad))
    phi_hi, phi_lo, s = split_features(X, F_pad)
    w_hi, w_lo, inv_scale, bias = split_weights(W, s, K)
    lse, *resp = _density(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, w,
                          write_resp=write_resp)
    return lse[:n], resp, (phi_hi, phi_lo), s


def _checked_weights(X, params: MixtureParams):
    reason = supports(X.dtype, X.shape[1], params.n_components)
    if reason:
        raise ValueError(reason)
    return quadratic_weights(params).astype(jnp.float32)


def log_prob(X, params: MixtureParams, *, rows_per_chunk: int = ROWS_PER_CHUNK):
    """(n,) log p(x_i) from the density kernel at "f16x3" (no responsibilities written).

    Args:
        X: (n, p) float32, centred near the mixture (the quadratic form cancels like
            |x|^2 |Lambda| eps).
        params: :class:`MixtureParams`, m <= :data:`MAX_COMPONENTS`.
        rows_per_chunk: rows per pass.
    """
    W = _checked_weights(X, params)

    def chunk(Xc, wc):
        return (), _chunk_density(Xc, wc, W, write_resp=False)[0]

    return over_row_chunks(chunk, rows_per_chunk, (X, row_weights(X, None)))[1]


def suff_stats(X, params: MixtureParams, sample_weight=None, *,
               rows_per_chunk: int = ROWS_PER_CHUNK) -> SuffStats:
    """Fused E-step statistics at precision "f16x3" (float32 X, m <= 256, p <= 32).

    Args:
        X: (n, p) float32 data, centred near the mixture.
        params: :class:`MixtureParams`, any covariance type.
        sample_weight: optional (n,) non-negative row weights (default 1).
        rows_per_chunk: rows per pass (memory O(chunk m)).

    Returns:
        :class:`SuffStats` (float32), moments about the origin.
    """
    W = _checked_weights(X, params)
    F, m = W.shape

    def chunk(Xc, wc):
        lse, resp, phi, s = _chunk_density(Xc, wc, W, write_resp=True)
        T = _stats(resp[0], resp[1], *phi, resp[2])
        return (T[:m, :F] / s[None, :F], jnp.sum(wc * lse)),

    T, loglik = over_row_chunks(chunk, rows_per_chunk, (X, row_weights(X, sample_weight)))[0]
    return stats_from_quadratic(T, X.shape[1], loglik)

"""Triton E-step of a Gaussian mixture: quadratic features, three fp16 products per term.

With quadratic features phi(x) = [x_a x_b (a <= b), x, 1] (F = p(p+1)/2 + p + 1) and
per-component weights W[:, j] (:func:`quadratic_weights`),

    log w_j + log N(x | mu_j, Sigma_j) = phi(x)^T W[:, j],

so the density of a row tile against every component is one GEMM, and the statistics
N_j, sum r x, sum r x x^T are the GEMM R^T Phi (the rows of Phi carry x x^T, x and 1).

**Precision "f16x3".** Every operand v is scaled by a power of two so that |v| <= 2^14
and split v = hi + lo in float16 (hi: v rounded to 11 significant bits; lo: the float32
remainder rounded to float16). The products lo*hi + hi*lo + hi*hi accumulate in float32
on the tensor cores at float16 rate (twice TF32's): 22 significant bits per product, as
"tf32x3". Scales: Phi per feature (from max |x_a| max |x_b| of the chunk), W per
component, and R per (128-row block, component) from the block's column maximum, so
small responsibilities keep their relative precision; the statistics kernel rescales its
accumulator like flash attention when a block with a larger exponent arrives. The
density needs centred X (the public ops centre it): the quadratic form cancels like
|x|^2 |Lambda| eps.

Passes per chunk of rows: XLA builds the split features; :func:`_density_kernel`
(one program per 128 rows, every component at once) writes log p(x), the split scaled
responsibilities and their block exponents; :func:`_stats_kernel` (grid: feature block,
row range; every component in one program) accumulates R^T Phi, the row ranges summed
by XLA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from gpustat._arrays import next_pow2, over_row_chunks, row_weights
from gpustat.reference._mixture_split import MIN_EXP as _MIN_EXP
from gpustat.reference._mixture_split import SPLIT_EXP as _SPLIT_EXP
from gpustat.reference._mixture_split import split_features as _split_features
from gpustat.reference._mixture_split import split_weights as _split_weights
from gpustat.reference.mixture import (
    MixtureParams,
    SuffStats,
    n_features,
    quadratic_weights,
    stats_from_quadratic,
)
from gpustat.triton._common import CompileCase, launch

__all__ = ["COMPILE_CASES", "MAX_COMPONENTS", "log_prob", "suff_stats"]

MAX_COMPONENTS = 256  # the density program holds (128, m) logits in registers
ROWS_PER_CHUNK = 1 << 20
_BLOCK_M = 128  # density rows per program (= the responsibilities' scaling block)
_BLOCK_F = 32  # features per k-step (both kernels)
_STATS_ROWS = 64  # rows per statistics k-step
_STATS_SPLITS = 132  # row ranges of the statistics grid: one per SM of a 132-SM GPU


@triton.jit
def _density_kernel(phi_hi_ref, phi_lo_ref, w_hi_ref, w_lo_ref, inv_scale_ref, bias_ref,
                    weight_ref, lse_ref, r_hi_ref, r_lo_ref, r_exp_ref, N: tl.constexpr,
                    F: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_F: tl.constexpr, SPLIT_EXP: tl.constexpr, MIN_EXP: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, K)
    live = rows < N
    acc = tl.zeros((BLOCK_M, K), tl.float32)
    for f0 in tl.range(0, F, BLOCK_F):
        fs = f0 + tl.arange(0, BLOCK_F)
        a_hi = tl.load(phi_hi_ref + rows[:, None] * F + fs[None, :], mask=live[:, None], other=0.0)
        a_lo = tl.load(phi_lo_ref + rows[:, None] * F + fs[None, :], mask=live[:, None], other=0.0)
        b_hi = tl.load(w_hi_ref + fs[:, None] * K + ks[None, :])
        b_lo = tl.load(w_lo_ref + fs[:, None] * K + ks[None, :])
        # small terms first; fp16 operands, float32 accumulation
        acc = tl.dot(a_lo, b_hi, acc)
        acc = tl.dot(a_hi, b_lo, acc)
        acc = tl.dot(a_hi, b_hi, acc)
    logit = acc * tl.load(inv_scale_ref + ks)[None, :] + tl.load(bias_ref + ks)[None, :]
    top = tl.max(logit, 1)
    e = tl.exp(logit - top[:, None])
    total = tl.sum(e, 1)
    tl.store(lse_ref + rows, top + tl.log(total), mask=live)
    w = tl.load(weight_ref + rows, mask=live, other=0.0)
    r = e * (w / total)[:, None]
    # per component, the block's column scaled to a maximum <= 2^SPLIT_EXP, then split
    r_exp = tl.maximum(tl.ceil(tl.log2(tl.max(r, 0))), MIN_EXP)
    tl.store(r_exp_ref + tl.program_id(0) * K + ks, r_exp)
    scaled = r * tl.exp2(SPLIT_EXP - r_exp)[None, :]
    hi = scaled.to(tl.float16)
    out = rows[:, None] * K + ks[None, :]
    tl.store(r_hi_ref + out, hi, mask=live[:, None])
    tl.store(r_lo_ref + out, (scaled - hi.to(tl.float32)).to(tl.float16), mask=live[:, None])


@triton.jit
def _stats_kernel(r_hi_ref, r_lo_ref, phi_hi_ref, phi_lo_ref, r_exp_ref, t_ref,
                  N: tl.constexpr, F: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_PER_SPLIT: tl.constexpr,
                  SPLIT_EXP: tl.constexpr, MIN_EXP: tl.constexpr):
    # one program: every component (K <= 256) against one feature block and row range
    fb, split = tl.program_id(0), tl.program_id(1)
    ks = tl.arange(0, K)
    fs = fb * BLOCK_F + tl.arange(0, BLOCK_F)
    acc = tl.zeros((K, BLOCK_F), tl.float32)
    acc_exp = tl.full((K,), 2.0 * MIN_EXP, tl.float32)
    first = split * ROWS_PER_SPLIT
    for n0 in tl.range(0, ROWS_PER_SPLIT, BLOCK_N):
        rows = first + n0 + tl.arange(0, BLOCK_N)
        live = rows < N
        p_hi = tl.load(phi_hi_ref + rows[:, None] * F + fs[None, :], mask=live[:, None], other=0.0)
        p_lo = tl.load(phi_lo_ref + rows[:, None] * F + fs[None, :], mask=live[:, None], other=0.0)
        r_hi = tl.load(r_hi_ref + rows[None, :] * K + ks[:, None], mask=live[None, :], other=0.0)
        r_lo = tl.load(r_lo_ref + rows[None, :] * K + ks[:, None], mask=live[None, :], other=0.0)
        # the tile lies in one density block (BLOCK_N divides BLOCK_M): one exponent a row
        block = (first + n0) // BLOCK_M
        tile_exp = tl.load(r_exp_ref + block * K + ks, mask=(first + n0) < N,
                           other=2.0 * MIN_EXP)
        part = tl.dot(r_lo, p_hi)
        part = tl.dot(r_hi, p_lo, part)
        part = tl.dot(r_hi, p_hi, part)
        new_exp = tl.maximum(acc_exp, tile_exp)
        acc = (acc * tl.exp2(acc_exp - new_exp)[:, None]
               + part * tl.exp2(tile_exp - new_exp)[:, None])
        acc_exp = new_exp
    tl.store(t_ref + split * K * F + ks[:, None] * F + fs[None, :],
             acc * tl.exp2(acc_exp - SPLIT_EXP)[:, None])


def _density(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, weight, *, num_stages, interpret):
    n, F = phi_hi.shape
    K = w_hi.shape[1]
    blocks = -(-n // _BLOCK_M)
    out = (jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n, K), jnp.float16),
           jax.ShapeDtypeStruct((n, K), jnp.float16),
           jax.ShapeDtypeStruct((blocks, K), jnp.float32))
    return launch(_density_kernel, (phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, weight), out,
                  (blocks,), num_warps=8, num_stages=num_stages, interpret=interpret,
                  **_density_constexprs(n, F, K))


def _density_constexprs(n, F, K):
    return dict(N=n, F=F, K=K, BLOCK_M=_BLOCK_M, BLOCK_F=_BLOCK_F, SPLIT_EXP=float(_SPLIT_EXP),
                MIN_EXP=_MIN_EXP)


def _stats(r_hi, r_lo, phi_hi, phi_lo, r_exp, *, num_stages, interpret):
    n, K = r_hi.shape
    F = phi_hi.shape[1]
    splits = min(_STATS_SPLITS, -(-n // _BLOCK_M))
    per_split = -(-n // (splits * _BLOCK_M)) * _BLOCK_M
    splits = -(-n // per_split)
    out = jax.ShapeDtypeStruct((splits, K, F), jnp.float32)
    partial = launch(_stats_kernel, (r_hi, r_lo, phi_hi, phi_lo, r_exp), out,
                     (F // _BLOCK_F, splits), num_warps=8, num_stages=num_stages,
                     interpret=interpret, **_stats_constexprs(n, F, K, per_split))
    return jnp.sum(partial, axis=0)


def _stats_constexprs(n, F, K, per_split):
    return dict(N=n, F=F, K=K, BLOCK_F=_BLOCK_F, BLOCK_N=_STATS_ROWS,
                BLOCK_M=_BLOCK_M, ROWS_PER_SPLIT=per_split, SPLIT_EXP=float(_SPLIT_EXP),
                MIN_EXP=_MIN_EXP)


def _chunk_density(X, w, W, *, num_stages, interpret):
    """The density pass of one chunk of rows: (log p(x) (n,), the split scaled
    responsibilities and their exponents, the split features, their scales s)."""
    p = X.shape[1]
    F_pad = -(-n_features(p) // _BLOCK_F) * _BLOCK_F
    K = max(16, next_pow2(W.shape[1]))
    phi_hi, phi_lo, s = _split_features(X, F_pad)
    w_hi, w_lo, inv_scale, bias = _split_weights(W, s, K)
    lse, *resp = _density(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, w,
                          num_stages=num_stages, interpret=interpret)
    return lse, resp, (phi_hi, phi_lo), s


def _chunk_stats(X, w, W, *, num_stages, interpret):
    """(R^T Phi (m, F) unscaled, sum_i w_i log p(x_i)) of one chunk of rows."""
    lse, resp, phi, s = _chunk_density(X, w, W, num_stages=num_stages, interpret=interpret)
    T = _stats(*resp[:2], *phi, resp[2], num_stages=num_stages, interpret=interpret)
    F, m = W.shape
    return (T[:m, :F] / s[None, :F], jnp.sum(w * lse)),


def _checked_weights(X, params):
    """W (F, m) in float32, after the checks of what the kernels take."""
    if X.dtype != jnp.float32:
        raise ValueError(f"precision='f16x3' takes float32 X, got X.dtype={X.dtype}")
    if params.n_components > MAX_COMPONENTS:
        raise ValueError(f"precision='f16x3' takes n_components <= {MAX_COMPONENTS}, got "
                         f"{params.n_components}")
    return quadratic_weights(params).astype(jnp.float32)


def log_prob(X, params: MixtureParams, *, interpret: bool = False,
             rows_per_chunk: int = ROWS_PER_CHUNK, num_stages: int = 3):
    """(n,) log p(x_i) from the density pass at "f16x3" (its responsibilities discarded)."""
    W = _checked_weights(X, params)
    w = row_weights(X, None)

    def chunk(Xc, wc):
        return (), _chunk_density(Xc, wc, W, num_stages=num_stages, interpret=interpret)[0]

    return over_row_chunks(chunk, rows_per_chunk, (X, w))[1]


def suff_stats(X, params: MixtureParams, sample_weight=None, *, interpret: bool = False,
               rows_per_chunk: int = ROWS_PER_CHUNK, num_stages: int = 3) -> SuffStats:
    """Fused E-step statistics at precision "f16x3" (float32 X, m <= 256 components).

    Args:
        X: (n, p) float32 data, centred near the mixture (see the module docstring).
        params: :class:`MixtureParams` of m <= :data:`MAX_COMPONENTS` components, any
            covariance type.
        sample_weight: optional (n,) non-negative row weights (default 1).
        interpret: run the kernels in Triton's interpreter on the host.
        rows_per_chunk: rows per pass (memory O(chunk m)).
        num_stages: software-pipelining depth of both kernels' k-loops.

    Returns:
        :class:`SuffStats` (float32).
    """
    W = _checked_weights(X, params)
    chunk = functools.partial(_chunk_stats, W=W, num_stages=num_stages, interpret=interpret)
    T, loglik = over_row_chunks(chunk, rows_per_chunk, (X, row_weights(X, sample_weight)))[0]
    return stats_from_quadratic(T, X.shape[1], loglik)


def _compile_cases() -> tuple[CompileCase, ...]:
    """The two kernels at the benchmark's shape (p = 16: F = 160, m = 256) and a small one
    (F = 32, m = 16), compiled for sm_90 by the CPU tests."""
    cases = []
    for F, K in ((160, 256), (32, 16)):
        n = 1000
        cases.append(CompileCase(f"mixture_density[F={F},K={K}]", _density_kernel,
                                 (jnp.float16,) * 4 + (jnp.float32,) * 4 + (jnp.float16,) * 2
                                 + (jnp.float32,), _density_constexprs(n, F, K), 8))
        cases.append(CompileCase(f"mixture_stats[F={F},K={K}]", _stats_kernel,
                                 (jnp.float16,) * 4 + (jnp.float32,) * 2,
                                 _stats_constexprs(n, F, K, 1024), 8))
    return tuple(cases)


COMPILE_CASES = _compile_cases()

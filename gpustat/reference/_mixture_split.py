"""The "f16x3" operand splits of the quadratic-feature mixture E-step, shared by the
Triton (:mod:`gpustat.triton.mixture`) and Mosaic GPU (:mod:`gpustat.pallas._mosaic_mixture`)
kernels.

Every operand v is scaled by a power of two so that |v| <= 2^14 and split v = hi + lo in
float16 (hi: v rounded to 11 significant bits; lo: the float32 remainder rounded to
float16); the products lo*hi + hi*lo + hi*hi accumulate in float32 on the tensor cores:
22 significant bits per product. Scales: the features per feature (from the chunk's
max |x_a| max |x_b|), the weights per component.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpustat.reference.mixture import n_features, quadratic_features

__all__ = ["MIN_EXP", "SPLIT_EXP", "pow2_scale", "split_f16", "split_features", "split_weights"]

SPLIT_EXP = 14  # operands scaled to |v| <= 2^14: float16 hi and lo stay normal
MIN_EXP = -100.0  # responsibilities below 2^-100 of a whole block count as zero


def pow2_scale(bound):
    """2^(14 - ceil(log2 bound)): brings |v| <= bound to |v| <= 2^14."""
    return jnp.exp2(SPLIT_EXP - jnp.ceil(jnp.log2(jnp.maximum(bound, 1e-30))))


def split_f16(v):
    """v = hi + lo in float16. hi rounds v to 11 significant bits with integer operations
    (XLA folds an f32 -> f16 -> f32 convert pair away); v - hi is exact in float32."""
    bits = jax.lax.bitcast_convert_type(v, jnp.uint32)
    hi = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x1000)) & jnp.uint32(0xFFFFE000),
                                      jnp.float32)
    return hi.astype(jnp.float16), (v - hi).astype(jnp.float16)


def split_features(X, F_pad):
    """Scaled split features (hi, lo (n, F_pad) float16) and the per-feature scales s."""
    p = X.shape[1]
    bound_x = jnp.max(jnp.abs(X), axis=0)
    a, b = np.triu_indices(p)
    # bound 1 for the constant feature and the zero padding
    bound = jnp.concatenate([bound_x[a] * bound_x[b], bound_x,
                             jnp.ones(F_pad - n_features(p) + 1, X.dtype)])
    s = pow2_scale(bound)
    Phi = jnp.pad(quadratic_features(X), ((0, 0), (0, F_pad - n_features(p))))
    return (*split_f16(Phi * s), s)


def split_weights(W, s, K):
    """W / s scaled per component to <= 2^14 and split; (hi, lo (F_pad, K), 1 / scale, bias)
    with bias -inf on the K - m padded components."""
    F, m = W.shape
    W = jnp.pad(W, ((0, s.shape[0] - F), (0, K - m))) / s[:, None]
    c = pow2_scale(jnp.max(jnp.abs(W), axis=0))
    hi, lo = split_f16(W * c[None, :])
    bias = jnp.where(jnp.arange(K) < m, 0.0, -jnp.inf).astype(jnp.float32)
    return hi, lo, 1.0 / c, bias

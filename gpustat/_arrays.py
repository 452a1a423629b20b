"""Array helpers shared by the references and the kernels: compute dtype, padding, sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["compute_dtype", "next_pow2", "nonempty", "pad_axis"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def compute_dtype(dtype) -> jnp.dtype:
    """Accumulation dtype: float64 stays float64; 16-bit and float32 compute in float32."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)


def pad_axis(x: jax.Array, axis: int, multiple: int, value=0) -> jax.Array:
    """Pad ``x`` along ``axis`` up to a multiple of ``multiple`` with ``value``."""
    size = x.shape[axis]
    target = -(-size // multiple) * multiple
    if target == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, target - size)
    return jnp.pad(x, widths, constant_values=value)


def nonempty(x: jax.Array, axis: int = 0) -> jax.Array:
    """``x``, or zeros with ``axis`` of length 1 when ``x`` is empty (a static shape).

    Masked loads and gathers need an in-range slot even when every index is padding
    (e.g. a packed border array no atom has entries in, no BMS rows, or FM factors with
    k = 0 along the last axis); the callers mask it or it adds nothing, so the
    substitute's value never matters. A non-empty ``x`` is returned as it is (no copy)."""
    if x.size:
        return x
    shape = list(x.shape)
    shape[axis] = 1
    return jnp.zeros(shape, x.dtype)

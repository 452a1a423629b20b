"""Shared Pallas-Triton plumbing: compiler params, block sizes, padding, lowering cases.

Facts of the Triton lowering in jax 0.11.2 that shape every kernel here
(see ``docs/design.md``): every in-kernel tensor has power-of-two dimensions,
partial edge blocks are not masked for us, gathers work only on refs, and
``lax.erf`` does not lower (use :mod:`gpustat.reference.numerics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

__all__ = [
    "LOWERING_CASES",
    "LoweringCase",
    "compiler_params",
    "compute_dtype",
    "next_pow2",
    "nonempty",
    "pad_axis",
    "pallas_call",
    "register_lowering_case",
]


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


def compiler_params(num_warps: int = 4, num_stages: int = 1) -> plt.CompilerParams:
    """Triton compiler parameters (ignored in interpret mode)."""
    return plt.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def pallas_call(kernel: Callable, *, interpret: bool, num_warps: int = 4, num_stages: int = 1,
                **kwargs) -> Callable:
    """``pl.pallas_call`` with the project's compiler params and interpret switch."""
    return pl.pallas_call(
        kernel,
        interpret=interpret,
        compiler_params=compiler_params(num_warps, num_stages),
        **kwargs,
    )


@dataclasses.dataclass(frozen=True)
class LoweringCase:
    """One call of a kernel wrapper to be lowered for CUDA on a CPU machine.

    ``fn`` takes arrays positionally (static settings bound with a closure);
    ``args`` are ``jax.ShapeDtypeStruct``s. The test suite lowers every
    registered case (``tests/pallas/test_lowering.py``).
    """

    module: str
    name: str
    fn: Callable
    args: Sequence[jax.ShapeDtypeStruct]


LOWERING_CASES: list[LoweringCase] = []


def register_lowering_case(module: str, name: str, fn: Callable,
                           args: Sequence[jax.ShapeDtypeStruct]) -> None:
    """Record a kernel call whose CUDA lowering the tests must check."""
    LOWERING_CASES.append(LoweringCase(module, name, fn, tuple(args)))

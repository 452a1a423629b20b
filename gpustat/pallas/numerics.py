"""Elementwise Pallas kernels for the probit numerics.

The kernel body is the reference itself (:mod:`gpustat.reference.numerics` uses
only operations the Triton lowering accepts), applied to one block of the
flattened input. No host padding: each program loads ``block`` elements with a
mask on the ragged tail and stores with the same mask, so the kernel moves
exactly one read and one write per element per output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat._arrays import compute_dtype
from gpustat.pallas._common import pallas_call, plt
from gpustat.reference import numerics as ref

__all__ = ["elementwise"]

# Elements per program: 8 per thread at 4 warps in float32, 4 in float64.
_BLOCK = {jnp.dtype(jnp.float32): 1024, jnp.dtype(jnp.float64): 512}


def _elementwise_kernel(x_ref, *out_refs, fn: Callable, size: int, block: int):
    offsets = pl.program_id(0) * block + jnp.arange(block)
    mask = offsets < size
    x = plt.load(x_ref.at[offsets], mask=mask, other=0.0)
    outs = fn(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    for out_ref, out in zip(out_refs, outs, strict=True):
        plt.store(out_ref.at[offsets], out.astype(out_ref.dtype), mask=mask)


@functools.partial(jax.jit, static_argnames=("fn", "num_outputs", "interpret"))
def elementwise(x: jax.Array, *, fn: Callable, num_outputs: int = 1, interpret: bool = False):
    """Apply the kernel-safe ``fn`` to every element of ``x`` in one Pallas kernel.

    Args:
        x: array of any shape; float16/bfloat16 compute in float32, float32 and
            float64 in their own precision.
        fn: elementwise function of one block returning an array or a tuple.
        num_outputs: number of arrays ``fn`` returns.
        interpret: run the kernel in interpret mode (any platform).

    Returns:
        ``fn(x)`` in ``x``'s dtype (a tuple when ``num_outputs > 1``).
    """
    dtype = compute_dtype(x.dtype)
    flat = x.reshape(-1).astype(dtype)
    size = flat.shape[0]
    if size == 0:  # nothing to launch (a grid of one program would read out of bounds)
        empty = tuple(jnp.zeros(x.shape, x.dtype) for _ in range(num_outputs))
        return empty if num_outputs > 1 else empty[0]
    block = _BLOCK[dtype]
    out_shape = tuple(jax.ShapeDtypeStruct((size,), dtype) for _ in range(num_outputs))
    outs = pallas_call(
        functools.partial(_elementwise_kernel, fn=fn, size=size, block=block),
        out_shape=out_shape,
        grid=(max(pl.cdiv(size, block), 1),),
        interpret=interpret,
    )(flat)
    outs = tuple(o.reshape(x.shape).astype(x.dtype) for o in outs)
    return outs if num_outputs > 1 else outs[0]


KERNELS: dict[str, tuple[Callable, int]] = {
    "erfc": (ref.erfc, 1),
    "erfcx": (ref.erfcx, 1),
    "ndtr": (ref.ndtr, 1),
    "log_ndtr": (ref.log_ndtr, 1),
    "log_ndtr_and_mills": (ref.log_ndtr_and_mills, 2),
    "probit_curvature": (ref.probit_curvature, 1),
}

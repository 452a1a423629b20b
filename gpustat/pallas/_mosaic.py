"""Shared Mosaic GPU plumbing (``jax.experimental.pallas.mosaic_gpu``, sm_90 and later).

Facts of the Mosaic GPU lowering in jax 0.11.2 that shape the kernels here
(``benchmarks/results/nvidia-h200/probes/mosaic_gpu.md``):

* kernels are written with ``plgpu.kernel`` (a grid of CTAs, one warpgroup of 128
  threads each unless ``num_threads`` asks for more) and stream blocks with
  ``plgpu.emit_pipeline``, whose TMA copies move at most 256 elements along each
  dimension and no float64;
* indexing a ref with an array of indices does not lower: per-element lookups
  into a table go through :func:`lookup` (inline Mosaic GPU, one scalar load per
  element);
* ``jnp.dot`` does not lower; matrix products are ``plgpu.wgmma`` on SMEM operands.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = [
    "LANES",
    "lookup",
    "num_sms",
    "table_shape",
]

# Minor dimension of the 2-D views the kernels stream and of their SMEM tables.
LANES = 128


def table_shape(size: int) -> tuple[int, int]:
    """(rows, LANES) holding ``size`` table entries (a TMA copy moves <= 256 per axis)."""
    return (-(-size // LANES), LANES)


def num_sms() -> int:
    """Streaming multiprocessors of the device a kernel is traced for."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.num_cores
    return jax.devices()[0].core_count


def lookup(table_ref, index, layout, dtype=jnp.float32):
    """``table.reshape(-1)[index]`` for every element of ``index`` (int32, ``layout``).

    ``table_ref`` is a 2-D (rows, LANES) float32 ref in SMEM (or GMEM); entry i sits
    at row ``i >> 7``, column ``i & 127``. Each lane issues one scalar load per
    element. ``dtype=jnp.int32`` reinterprets the float32 bits (int tables are
    stored bitcast). Indices are not checked: out-of-range reads are undefined.
    """
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, memref

    @plgpu.inline_mgpu(
        arg_types=(plgpu.RefType(), layout),
        return_type=plgpu.ShapeDtypeStruct(index.shape, dtype, layout=layout),
    )
    def gather(ctx, ref, index_fa):
        del ctx
        index_ty = ir.IndexType.get()
        i32 = ir.IntegerType.get_signless(32)
        shift = arith.constant(i32, 7)
        mask = arith.constant(i32, LANES - 1)

        def load(i, _):
            row = arith.index_cast(index_ty, arith.shrui(i, shift))
            col = arith.index_cast(index_ty, arith.andi(i, mask))
            value = memref.load(ref, [row, col])
            return arith.bitcast(i32, value) if dtype == jnp.int32 else value

        return index_fa.foreach(load, create_array=True,
                                is_signed=True if dtype == jnp.int32 else None)

    return gather(table_ref, index)

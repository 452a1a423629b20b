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

import math

import jax
import jax.numpy as jnp
import numpy as np
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


def lookup(table_ref, index, layout, *, offset: int = 0, stride: int = 1,
           dtypes: tuple = (jnp.float32,)) -> tuple:
    """Row ``index`` of a table in shared memory, for every element of ``index``.

    ``table_ref`` is a 2-D (rows, LANES) float32 SMEM ref holding the table flat;
    element ``e`` of ``index`` (int32, ``layout``) reads the ``len(dtypes)``
    consecutive entries starting at ``offset + index[e] * stride`` with one
    vector load (``ld.shared.v2`` / ``.v4``: ``offset`` and ``stride`` must be
    multiples of that width). Entries whose dtype is int32 are stored bitcast.
    Indices are not checked: out-of-range reads are undefined.

    Returns:
        one array (``index``'s shape and layout) per entry of ``dtypes``.
    """
    from jax.experimental.mosaic import gpu as mgpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import arith, llvm, memref, vector

    width = len(dtypes)
    if width not in (1, 2, 4) or offset % width or stride % width:
        raise ValueError(f"lookup: {width} entries a row need offset and stride multiples of "
                         f"the width, got {offset=}, {stride=}")

    # a constant index (a splat) must be laid out as declared before the inline code
    # reads its registers: the inline call would reinterpret the splat's registers
    index = plgpu.layout_cast(index, layout)

    @plgpu.inline_mgpu(
        arg_types=(plgpu.RefType(), layout),
        return_type=tuple(plgpu.ShapeDtypeStruct(index.shape, d, layout=layout)
                          for d in dtypes),
    )
    def gather(ctx, ref, index_fa):
        del ctx
        f32 = ir.F32Type.get()
        i32 = ir.IntegerType.get_signless(32)
        index_ty = ir.IndexType.get()
        flat = mgpu.utils.memref_reshape(ref, (math.prod(ir.MemRefType(ref.type).shape),))
        row_ty = ir.VectorType.get([width], f32)

        def load(i):
            # 32-bit address arithmetic (a 64-bit index costs two instructions an add)
            entry = arith.addi(arith.muli(i, arith.constant(i32, stride)),
                               arith.constant(i32, offset))
            address = arith.index_cast(index_ty, entry)
            if width == 1:
                values = [memref.load(flat, [address])]
            else:
                row = vector.load(row_ty, flat, [address], alignment=4 * width)
                values = [vector.extract(row, dynamic_position=[],
                                         static_position=ir.DenseI64ArrayAttr.get([w]))
                          for w in range(width)]
            return [arith.bitcast(i32, v) if d == jnp.int32 else v
                    for v, d in zip(values, dtypes, strict=True)]

        outs = [np.empty_like(index_fa.registers) for _ in dtypes]
        for reg_idx in np.ndindex(index_fa.registers.shape):
            reg = index_fa.registers[reg_idx]
            if not isinstance(reg.type, ir.VectorType):
                for out, v in zip(outs, load(reg), strict=True):
                    out[reg_idx] = v
                continue
            [elems] = ir.VectorType(reg.type).shape
            new = [llvm.mlir_undef(ir.VectorType.get([elems], i32 if d == jnp.int32 else f32))
                   for d in dtypes]
            for e in range(elems):
                position = ir.DenseI64ArrayAttr.get([e])
                i = vector.extract(reg, dynamic_position=[], static_position=position)
                for w, v in enumerate(load(i)):
                    new[w] = vector.insert(v, new[w], dynamic_position=[],
                                           static_position=position)
            for out, v in zip(outs, new, strict=True):
                out[reg_idx] = v
        return tuple(
            mgpu.FragmentedArray(_registers=out, _layout=index_fa.layout,
                                 _is_signed=True if d == jnp.int32 else None)
            for out, d in zip(outs, dtypes, strict=True))

    return gather(table_ref, index)

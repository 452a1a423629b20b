"""Pallas kernel: sparse gradient accumulation (scatter-add of contribution rows).

Each program takes ``block_entries`` contribution rows and their target
indices and adds them into the dense ``(n_targets, m)`` gradient table with
``atomic_add``; the table lives in HBM (``memory_space=ANY``) and is aliased
to a zero-initialised input, so no program ever reads it. On the GPU,
duplicate indices inside one vector add correctly. Interpret mode emulates an
atomic as a gather and a scatter, which loses duplicate updates inside one
call: :func:`scatter_add_rows` therefore runs one entry per grid step there.

Tiling: entries are padded on the host to a multiple of ``block_entries`` with
zero rows aimed at row 0 (adding 0 changes nothing); columns are padded to a
power of two (Triton tensors must have power-of-two shapes) and sliced off
after. Accumulation is in the rows' dtype (float32 or float64 atomics).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from gpustat._arrays import next_pow2, pad_axis
from gpustat.pallas._common import pallas_call, plt

__all__ = ["scatter_add_rows"]

# Elements (entries x columns) one program adds: 8 per thread of 4 warps. A
# batch of 4096 rows x 16 nonzeros then spreads over >= 128 programs even for
# the narrow FM tables (4096 elements per program left most SMs idle).
_ELEMENTS_PER_PROGRAM = 1024


def _scatter_add_rows_kernel(indices_ref, rows_ref, table_in_ref, table_ref):
    del table_in_ref  # aliased to table_ref: the zero table the atomics land in
    indices = indices_ref[...]
    rows = rows_ref[...]
    cols = jnp.arange(rows.shape[1], dtype=jnp.int32)
    plt.atomic_add(table_ref, (indices[:, None], cols[None, :]), rows)


def default_block_entries(n_entries: int, width: int) -> int:
    """Entries per program: about 1024 elements, at most the (padded) entry count."""
    return max(1, min(next_pow2(n_entries), _ELEMENTS_PER_PROGRAM // next_pow2(width)))


@functools.partial(jax.jit, static_argnames=("n_targets", "block_entries", "interpret"))
def scatter_add_rows(indices: Int[Array, " e"], rows: Float[Array, "e m"], n_targets: int, *,
                     block_entries: int | None = None,
                     interpret: bool = False) -> Float[Array, "t m"]:
    """Kernel twin of :func:`gpustat.reference.estimators.scatter_add_rows_reference`.

    Args:
        indices: (e,) int target row of each contribution, in ``[0, n_targets)``.
        rows: (e, m) float32/float64 contributions.
        n_targets: number of table rows.
        block_entries: entries per program (power of two); default from
            :func:`default_block_entries`, 1 in interpret mode.
        interpret: run under the Pallas interpreter.

    Returns:
        (n_targets, m) table in the rows' dtype.
    """
    n_entries, width = rows.shape
    if interpret:
        block_entries = 1
    elif block_entries is None:
        block_entries = default_block_entries(n_entries, width)
    width_pad = next_pow2(width)
    rows = pad_axis(pad_axis(rows, 1, width_pad), 0, block_entries)
    indices = pad_axis(indices.astype(jnp.int32), 0, block_entries)
    table = jnp.zeros((n_targets, width_pad), rows.dtype)
    out = pallas_call(
        _scatter_add_rows_kernel,
        interpret=interpret,
        grid=(rows.shape[0] // block_entries,),
        in_specs=[
            pl.BlockSpec((block_entries,), lambda i: (i,)),
            pl.BlockSpec((block_entries, width_pad), lambda i: (i, 0)),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(table.shape, table.dtype),
        input_output_aliases={2: 0},
    )(indices, rows, table)
    return out[:, :width] if width_pad != width else out

"""BMS Stage-2 row derivatives with the rows (and their cells) split over a mesh.

A :class:`~gpustat.bms.BmsRows` stores each row's cells in CSR order, so a row
block owns a contiguous run of cells whose length differs between blocks.
``shard_map`` needs equal shapes, so (host-side, once) every device gets
``ceil(n / D)`` rows plus one **spare row** that owns the padding cells (zeros):
rows past n and the spare row are computed and dropped. The joint operators
(:func:`gpustat.distributed.joint_hvp` and friends) then take the sharded
(n, r, r) Hessians directly.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat import bms
from gpustat.distributed._mesh import check_blocks, mesh_size, place, row_axis

__all__ = ["ShardedBmsRows", "row_derivatives", "shard_bms_rows"]

_ROW_FIELDS = ("q", "b", "a", "z_obs", "y", "w", "mu_1", "mu_2", "e_obs", "chi", "xi", "rho",
               "tau", "r_uv")
_CELL_FIELDS = ("cell_lo", "cell_hi", "cell_c", "cell_jet", "cell_jet_a", "cell_jet_b",
                "cell_moments", "cell_status")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedBmsRows:
    """Per-device :class:`~gpustat.bms.BmsRows` blocks stacked on a leading (D,) axis.

    Attributes:
        local: BmsRows whose arrays have a leading (D,) axis (n_local + 1 rows each).
        n_rows: static total rows n.
        n_local: static real-row slots per device.
    """

    local: bms.BmsRows
    n_rows: int = dataclasses.field(metadata={"static": True})
    n_local: int = dataclasses.field(metadata={"static": True})


def _pad(a: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros((length, *a.shape[1:]), a.dtype)
    out[:a.shape[0]] = a
    return out


def shard_bms_rows(rows: bms.BmsRows, mesh: Mesh) -> ShardedBmsRows:
    """Split concrete :class:`~gpustat.bms.BmsRows` into equal row blocks on the mesh.

    Args:
        rows: from :func:`gpustat.bms.build_rows` (n rows, c cells).
        mesh: 1-D mesh.

    Returns:
        :class:`ShardedBmsRows`.
    """
    if not isinstance(rows, bms.BmsRows):
        raise TypeError(f"rows must be a BmsRows, got {type(rows).__name__}")
    d = mesh_size(mesh)
    n = rows.n
    n_local = max(-(-n // d), 1)
    off = np.asarray(rows.cell_offsets, np.int64)
    bounds = [(min(g * n_local, n), min((g + 1) * n_local, n)) for g in range(d)]
    c_max = max(max(off[hi] - off[lo] for lo, hi in bounds), 1)
    blocks = []
    for lo, hi in bounds:
        block = {name: _pad(np.asarray(getattr(rows, name))[lo:hi], n_local + 1)
                 for name in _ROW_FIELDS}
        block.update({name: _pad(np.asarray(getattr(rows, name))[off[lo]:off[hi]], c_max)
                      for name in _CELL_FIELDS})
        local_off = np.full(n_local + 2, off[hi] - off[lo], np.int32)
        local_off[:hi - lo + 1] = off[lo:hi + 1] - off[lo]
        local_off[-1] = c_max  # the spare row owns the padding cells
        block["cell_offsets"] = local_off
        block["s_f"] = np.asarray(rows.s_f)
        blocks.append(block)
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    stacked = {name: place(np.stack([b[name] for b in blocks]), sharding)
               for name in blocks[0]}
    return ShardedBmsRows(bms.BmsRows(**stacked, p_h=rows.p_h, p_w=rows.p_w), n, n_local)


def row_derivatives(rows: ShardedBmsRows, mesh: Mesh, *,
                    backend: str = "auto") -> bms.RowDerivatives:
    """:func:`gpustat.bms.row_derivatives` with the rows split over the mesh.

    Args:
        rows: from :func:`shard_bms_rows` on the same mesh.
        mesh: 1-D mesh.
        backend: passed to the single-device op on every device.

    Returns:
        :class:`~gpustat.bms.RowDerivatives` (neglog (n,), grad (n, r), hess (n, r, r),
        status (n,)), sharded along n when n is a multiple of the device count.
    """
    if not isinstance(rows, ShardedBmsRows):
        raise TypeError(f"rows must be a ShardedBmsRows (see shard_bms_rows), got "
                        f"{type(rows).__name__}")
    check_blocks("rows", rows.local.cell_offsets.shape[0], mesh)
    n_local = rows.n_local

    def block(local):
        one = jax.tree.map(lambda a: a[0], local)
        out = bms.row_derivatives(one, backend=backend)
        return bms.RowDerivatives(*(a[:n_local] for a in out))

    spec = PartitionSpec(row_axis(mesh))
    out = jax.shard_map(block, mesh=mesh, in_specs=(spec,), out_specs=spec,
                        check_vma=False)(rows.local)
    return bms.RowDerivatives(*(a[:rows.n_rows] for a in out))

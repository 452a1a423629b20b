"""Sparse rows split over a mesh: one equal-shaped :class:`~gpustat.csr.CSR` block per device.

``shard_map`` runs one program on every device, so every device's block must
have the same array shapes and the same static layout. A row block of a CSR
matrix has its own nonzero count and its own length buckets; the blocks are
made uniform on the host, once:

* rows: ``n_local = ceil(n / D)`` per device plus one **empty spare row** at
  the end (rows past ``n`` on the last device are empty too);
* nonzeros: ``data``/``indices`` padded to the largest block's count with
  zeros (past ``indptr[-1]``, so no row owns them);
* buckets: the union of every block's bucket widths, each bucket's row list
  padded to its longest with the spare row, which is empty and scores ``w0``
  like any empty row (its duplicates write the same value).

The blocks are stacked along a leading device axis and placed with
``NamedSharding(mesh, P(axis))``; inside ``shard_map`` each device rebuilds
its block as a plain :class:`CSR` and calls the single-device op.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat.csr import CSR, RowBuckets
from gpustat.distributed._mesh import mesh_size, place, row_axis

__all__ = ["ShardedCSR", "shard_csr"]


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ShardedCSR:
    """A CSR matrix of n rows split into equal row blocks, one per device of a 1-D mesh.

    Attributes:
        data: (D, z) values of every block (z = largest block nonzero count).
        indices: (D, z) int32 columns.
        indptr: (D, n_local + 2) int32 block row offsets (the last row is the spare).
        bucket_rows: one (D, len) int32 array per bucket width.
        widths: static bucket widths shared by every block.
        shape: static (n, p) of the whole matrix.
        n_local: static rows per device (without the spare row).
    """

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    bucket_rows: tuple[jax.Array, ...]
    widths: tuple[int, ...]
    shape: tuple[int, int]
    n_local: int

    def tree_flatten(self):
        return (self.data, self.indices, self.indptr, self.bucket_rows), (
            self.widths, self.shape, self.n_local)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    def local_block(self) -> CSR:
        """Inside ``shard_map``: this device's block as a CSR of n_local + 1 rows."""
        obj = object.__new__(CSR)
        obj.data, obj.indices, obj.indptr = self.data[0], self.indices[0], self.indptr[0]
        obj.bucket_rows = tuple(r[0] for r in self.bucket_rows)
        obj.shape = (self.n_local + 1, self.shape[1])
        obj.buckets = RowBuckets(self.widths, False)
        return obj


def _row_blocks(matrix, n_devices: int):
    """Per-device CSR blocks of ``ceil(n / D)`` rows (the last one may be shorter)."""
    n = matrix.shape[0]
    n_local = max(-(-n // n_devices), 1)
    blocks = []
    for d in range(n_devices):
        lo, hi = min(d * n_local, n), min((d + 1) * n_local, n)
        sub = matrix[lo:hi]
        blocks.append(CSR(sub.data, sub.indices, sub.indptr, (hi - lo, matrix.shape[1])))
    return blocks, n_local


def shard_csr(X, mesh: Mesh) -> ShardedCSR:
    """Split a CSR (or scipy sparse) matrix into uniform row blocks on the mesh's devices.

    Args:
        X: a :class:`~gpustat.csr.CSR` or ``scipy.sparse`` matrix, (n, p), concrete.
            On a mesh spanning several processes every process passes the same X
            and places its own devices' blocks.
        mesh: a 1-D mesh (:func:`gpustat.distributed.make_mesh`).

    Returns:
        :class:`ShardedCSR` whose leaves are sharded over the mesh axis.

    Raises:
        TypeError: ``X`` is neither a CSR nor a scipy sparse matrix.
    """
    import scipy.sparse as sp

    if isinstance(X, CSR):
        X = X.to_scipy()
    if not sp.issparse(X):
        raise TypeError(f"X must be a CSR or a scipy sparse matrix, got {type(X).__name__}")
    X = sp.csr_array(X)
    X.sum_duplicates()
    d = mesh_size(mesh)
    blocks, n_local = _row_blocks(X, d)
    spare = n_local  # local id of the empty spare row
    nnz = max(max(b.nnz for b in blocks), 1)
    widths = tuple(sorted({w for b in blocks for w in b.buckets.widths}))
    data = np.zeros((d, nnz), np.asarray(blocks[0].data).dtype)
    indices = np.zeros((d, nnz), np.int32)
    indptr = np.zeros((d, n_local + 2), np.int32)
    for i, b in enumerate(blocks):
        data[i, :b.nnz] = np.asarray(b.data)
        indices[i, :b.nnz] = np.asarray(b.indices)
        ptr = np.asarray(b.indptr)
        indptr[i, :ptr.size] = ptr
        indptr[i, ptr.size:] = ptr[-1]  # rows past n and the spare row are empty
    bucket_rows = []
    for w in widths:
        lists = [np.asarray(b.bucket_rows[b.buckets.widths.index(w)])
                 if w in b.buckets.widths else np.zeros(0, np.int32) for b in blocks]
        rows = np.full((d, max(r.size for r in lists)), spare, np.int32)
        for i, r in enumerate(lists):
            rows[i, :r.size] = r
        bucket_rows.append(rows)
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    put = lambda a: place(a, sharding)  # noqa: E731
    return ShardedCSR(put(data), put(indices), put(indptr), tuple(put(r) for r in bucket_rows),
                      widths, tuple(X.shape), n_local)

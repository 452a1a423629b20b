"""Data-parallel FM / FFM / FwFM training: rows split over a mesh, parameters replicated.

Each device holds a block of the training rows (the padded-row layout of
:func:`gpustat.estimators._train.to_device_rows`) and walks its own row order in local
batches of ``batch_size / D`` rows. Per global batch, every device computes the
gradient of its rows with the single-device math of :mod:`gpustat.estimators._train`
(scores, loss derivative, sparse scatter to the dense gradient tables, Pallas
scatter on GPUs), scaled by the **global** batch row count; one all-reduce
(:func:`~gpustat.distributed._mesh.psum_packed`) adds the gradients, the touched
masks and the loss, and the optax step runs replicated, so every device keeps
identical parameters (a synchronous data-parallel all-reduce, as in PyTorch DDP).
With ``exchange="rows"`` (row-wise optimizers) only the touched rows travel instead
(:func:`gpustat.distributed._fm_rows.replicated_rows_step`): the exchange scales
with the batch, not with p.

A global batch is the union of the devices' local batches, so an epoch equals
the single-device epoch over the interleaved order :func:`global_order`
(up to the order of the floating-point sums).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.sparse as sp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat.distributed._fm_rows import replicated_rows_step
from gpustat.distributed._mesh import check_blocks, mesh_size, place, psum_packed, row_axis
from gpustat.estimators import _train as fm_train

__all__ = ["ShardedRows", "global_order", "shard_training_rows", "train_epoch"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedRows:
    """Training rows in D contiguous blocks, one per device, of ``n // D`` or ``n // D + 1``
    rows (the larger blocks first).

    Attributes:
        rows: :class:`~gpustat.estimators._train.DeviceRows` whose arrays carry a leading (D,)
            axis (sharded over the mesh); each block's last row is padding (weight 0).
        n_local: static real rows of the largest block.
        n_rows: static total real rows n.
    """

    rows: fm_train.DeviceRows
    n_local: int = dataclasses.field(metadata={"static": True})
    n_rows: int = dataclasses.field(metadata={"static": True})

    def block_rows(self, device: int) -> np.ndarray:
        """Global row ids of block ``device``'s real rows."""
        bounds = _block_bounds(self.n_rows, self.rows.weight.shape[0])
        return np.arange(bounds[device], bounds[device + 1])


def _block_bounds(n: int, n_devices: int) -> np.ndarray:
    """(D + 1,) row offsets of D contiguous blocks whose sizes differ by at most one.

    Balanced blocks keep every global batch but the last full (with whole-block orders),
    which is what makes an epoch equal the single-device epoch over :func:`global_order`;
    blocks of ``ceil(n / D)`` rows would leave the last device short early.
    """
    size, extra = divmod(n, n_devices)
    return np.array([g * size + min(g, extra) for g in range(n_devices + 1)])


def _pad_to(a: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(shape, a.dtype)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out


def shard_training_rows(X, field_ids, target, weight, dtype, mesh: Mesh) -> ShardedRows:
    """Split training rows into contiguous blocks (sizes differ by at most one) on the mesh.

    Args:
        X: (n, p) scipy CSR matrix, canonical (sorted, duplicate-free, no explicit zeros).
        field_ids: (p,) int field of each feature.
        target: (n, C) targets; weight: (n,) row weights.
        dtype: float dtype of values, targets and weights.
        mesh: 1-D mesh.

    Returns:
        :class:`ShardedRows`.
    """
    if not sp.issparse(X):
        raise TypeError(f"X must be a scipy sparse matrix, got {type(X).__name__}")
    X = sp.csr_matrix(X)
    n = X.shape[0]
    d = mesh_size(mesh)
    bounds = _block_bounds(n, d)
    target = np.asarray(target).reshape(n, -1)
    weight = np.asarray(weight).reshape(n)
    blocks = []
    for lo, hi in itertools.pairwise(bounds):
        blocks.append(fm_train.to_device_rows(X[lo:hi], field_ids, target[lo:hi],
                                              weight[lo:hi], dtype))
    # common shape: the largest padded row count (+ padding rows) and slot width
    n_pad = max(b.idx.shape[0] for b in blocks)
    z = max(b.idx.shape[1] for b in blocks)
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    fields = []
    for name in fm_train.DeviceRows._fields:
        parts = [np.asarray(getattr(b, name)) for b in blocks]
        shape = {"idx": (n_pad, z), "val": (n_pad, z), "fld": (n_pad, z),
                 "target": (n_pad, parts[0].shape[1] if parts[0].ndim == 2 else 0),
                 "weight": (n_pad,)}[name]
        fields.append(place(np.stack([_pad_to(p, shape) for p in parts]), sharding))
    return ShardedRows(fm_train.DeviceRows(*fields), max(-(-n // d), 1), n)


def _local_batches(data: ShardedRows, local_orders, local_batch: int):
    """(D, n_batches, local_batch) local row ids (padding row where short) and global counts."""
    d = len(local_orders)
    pad_row = data.rows.idx.shape[1] - 1
    n_batches = max(max(-(-len(o) // local_batch) for o in local_orders), 1)
    table = np.full((d, n_batches * local_batch), pad_row, np.int32)
    counts = np.zeros(n_batches, np.int64)
    for g, order in enumerate(local_orders):
        table[g, :len(order)] = order
        filled = np.zeros(n_batches * local_batch, bool)
        filled[:len(order)] = True
        counts += filled.reshape(n_batches, local_batch).sum(1)
    return table.reshape(d, n_batches, local_batch), counts


def _check_orders(data: ShardedRows, local_orders, d: int):
    if len(local_orders) != d:
        raise ValueError(f"local_orders needs one order per device ({d}), got {len(local_orders)}")
    orders = []
    for g, order in enumerate(local_orders):
        order = np.asarray(order, np.int64)
        size = data.block_rows(g).size
        if order.ndim != 1 or (order.size and (order.min() < 0 or order.max() >= size)):
            raise ValueError(f"local_orders[{g}] must be 1-D local row ids in [0, {size}), got "
                             f"shape {order.shape}")
        orders.append(order)
    return orders


def global_order(data: ShardedRows, local_orders, batch_size: int) -> np.ndarray:
    """The single-device visit order whose batches are the union of the devices' batches."""
    d = len(local_orders)
    if batch_size % d:
        raise ValueError(f"batch_size must be a multiple of the device count {d} (as in "
                         f"train_epoch), got {batch_size=}")
    local_batch = batch_size // d
    table, _ = _local_batches(data, local_orders, local_batch)
    pad_row = data.rows.idx.shape[1] - 1
    order = []
    for b in range(table.shape[1]):
        for g in range(d):
            local = table[g, b][table[g, b] != pad_row]
            order.append(data.block_rows(g)[local])
    return np.concatenate(order)


def _allreduce_step(cfg: fm_train.TrainConfig, axis: str, params, opt_state, data, rows, count):
    """One global batch: local gradients, one psum, replicated optax step."""
    idx, val, fld = data.idx[rows], data.val[rows], data.fld[rows]
    target, weight = data.target[rows], data.weight[rows]
    s, cache = fm_train._scores(cfg.model, params, idx, val, fld)
    dlds, row_loss = fm_train._loss_grad_and_value(cfg.loss, s, target)
    coef = dlds * (weight / count)[:, None]  # global count: the psum is the batch mean
    grads, touched = fm_train._gradients(cfg, params, idx, val, fld, coef, cache)
    grads, touched, loss = psum_packed((grads, touched, (weight * row_loss).sum()), axis)
    grads = fm_train._add_l2(cfg, grads, touched, params)
    if cfg.lazy:
        updates, opt_state = cfg.tx.update(grads, opt_state, params, touched=touched)
    else:
        updates, opt_state = cfg.tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


EXCHANGES = ("dense", "rows")


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("exchange",))
def _epoch(cfg, mesh, params, opt_state, rows, table, counts, exchange="dense"):
    axis = row_axis(mesh)
    step = _allreduce_step if exchange == "dense" else replicated_rows_step

    def block(params, opt_state, rows, table, counts):
        rows = jax.tree.map(lambda a: a[0], rows)
        table = table[0]

        def body(b, carry):
            params, opt_state, loss_sum = carry
            params, opt_state, loss = step(cfg, axis, params, opt_state, rows, table[b],
                                           counts[b])
            return params, opt_state, loss_sum + loss

        zero = jnp.zeros((), rows.val.dtype)
        return jax.lax.fori_loop(0, table.shape[0], body, (params, opt_state, zero))

    row, shared = PartitionSpec(axis), PartitionSpec()
    return jax.shard_map(block, mesh=mesh, in_specs=(shared, shared, row, row, shared),
                         out_specs=shared, check_vma=False)(params, opt_state, rows, table,
                                                            counts)


def train_epoch(cfg: fm_train.TrainConfig, params, opt_state, data: ShardedRows, local_orders,
                mesh: Mesh, *, exchange: str = "dense"):
    """One data-parallel epoch: every device walks its block in ``local_orders[device]``.

    Args:
        cfg: static settings (:class:`~gpustat.estimators._train.TrainConfig`); ``cfg.batch_size``
            is the global batch B and must be a multiple of the device count D.
        params, opt_state: replicated parameters (internal layout of
            :mod:`gpustat.estimators._train`) and optimizer state.
        data: :class:`ShardedRows` from :func:`shard_training_rows` on the same mesh.
        local_orders: D arrays of local row ids (a permutation of each block's rows).
        mesh: 1-D mesh.
        exchange: ``"dense"``: one ``psum`` of the dense (p, ...) gradient tables per batch
            (any optax transformation); ``"rows"``: only the batch's touched rows and
            their gradients are all-gathered and every device steps them (a row-wise
            transformation: ``cfg.sparse``; what crosses the devices grows with the
            batch, not with p).

    Returns:
        ``(params, opt_state, weighted loss sum)`` replicated; equal to
        :func:`gpustat.estimators._train.train_epoch` over :func:`global_order`.
    """
    check_blocks("data", data.rows.weight.shape[0], mesh)
    d = mesh_size(mesh)
    check_batch(cfg, d)
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange=}")
    if exchange == "rows":
        check_rowwise(cfg, "exchange='rows'")
    table, counts = _epoch_tables(data, local_orders, cfg.batch_size, mesh)
    return _epoch(cfg, mesh, params, opt_state, data.rows, table, counts, exchange=exchange)


def check_batch(cfg: fm_train.TrainConfig, n_devices: int) -> None:
    """Raise unless the global batch splits evenly over the devices."""
    if cfg.batch_size % n_devices:
        raise ValueError(f"cfg.batch_size must be a multiple of the device count {n_devices}, "
                         f"got {cfg.batch_size=}")


def check_rowwise(cfg: fm_train.TrainConfig, what: str) -> None:
    """Raise unless ``cfg.tx`` steps rows independently (the built-in optimizers)."""
    if not cfg.sparse:
        raise TypeError(f"{what} needs a row-wise optimizer (gpustat's lazy_sgd, lazy_adagrad, "
                        f"lazy_adam or ftrl), got cfg.tx of type {type(cfg.tx).__name__}")


def _epoch_tables(data: ShardedRows, local_orders, batch_size: int, mesh: Mesh):
    """The host-built batch tables of one epoch, on the devices: (D, batches, B / D)
    local row ids (sharded) and the (batches,) global row counts (replicated)."""
    d = mesh_size(mesh)
    table, counts = _local_batches(data, _check_orders(data, local_orders, d), batch_size // d)
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    return place(table, sharding), jnp.asarray(counts, data.rows.val.dtype)

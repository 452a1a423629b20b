"""Model-parallel FM / FFM / FwFM training: the parameter table row-sharded over the mesh.

The feature rows of ``w`` (p, C) and ``V`` (p, C, [F,] k) and the optimizer state of
those rows are split into D contiguous blocks of ``p_local = ceil(p / D)`` rows:
device ``g`` owns features ``[g p_local, (g + 1) p_local)`` (the table is padded
with zero rows to ``D p_local``; padding rows are never touched). The bias ``w0``
and FwFM's (C, F, F) ``r`` are replicated. A table of ``D`` devices' memory therefore
trains as one; a hashed vocabulary spreads its rows evenly over the owners (a
vocabulary numbered by frequency should be hashed or permuted first, else the
low-numbered owners serve most requests).

The training rows are data parallel at the same time (:func:`shard_training_rows`),
and each global batch is one step of
:func:`gpustat.distributed._fm_rows.table_rows_step`: every device requests its
batch's unique rows from their owners (``all_to_all`` with a static
per-owner ``capacity``), scores its rows on them, sends the summed row gradients
back (``all_to_all``), and each owner steps its rows once with every requester's
contributions summed. With a row-wise optimizer (SGD, AdaGrad, Adam, FTRL of
:mod:`gpustat.estimators._optim`) an epoch equals the single-device
:func:`gpustat.estimators._train.train_epoch` over :func:`global_order`, up to the
order of floating-point sums.

``capacity`` bounds the row ids one device may ask of one owner in one batch; where it
reaches an owner's rows (a small or densely used table), the steps exchange whole shards
instead (no ids, no sorts).
:func:`plan_capacity` finds the largest such count of an epoch on the devices
(one pass of the batches' unique-index sorts) and rounds it up to a grid of
32 steps per octave (at most 3.2% padding: every padded slot is exchanged and
stepped). A too small ``capacity`` given by hand is detected in the
step that exceeds it: that batch and the rest of the epoch are not applied and
:class:`CapacityError` carries the state after the last complete batch.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat._arrays import grid_size
from gpustat._checks import check_int, check_real
from gpustat.distributed._fm import (
    ShardedRows,
    _epoch_tables,
    check_batch,
    check_rowwise,
)
from gpustat.distributed._fm_rows import owner_requests, table_rows_step
from gpustat.distributed._mesh import check_blocks, mesh_size, row_axis
from gpustat.estimators import _train as fm_train

__all__ = ["CapacityError", "init_fm_table", "plan_capacity", "shard_fm_table",
           "train_epoch_model_parallel"]

_ROW_LEAVES = fm_train._ROW_LEAVES


class CapacityError(ValueError):
    """A batch needed more than ``capacity`` rows of one owner on some device.

    The epoch stopped before that batch; nothing after it was applied.

    Attributes:
        batch: index of the batch in the epoch.
        params, opt_state: the table after the last complete batch.
        loss: the weighted loss sum of the complete batches.
    """

    def __init__(self, message: str, batch: int, params, opt_state, loss):
        super().__init__(message)
        self.batch, self.params, self.opt_state, self.loss = batch, params, opt_state, loss


def _leaf_specs(tree, axis: str):
    """Row sharding for the feature-axis leaves of a parameter-shaped dict, else replicated."""
    return {name: PartitionSpec(axis) if name in _ROW_LEAVES else PartitionSpec()
            for name in tree}


def _table_specs(params, opt_state, axis: str):
    return _leaf_specs(params, axis), fm_train._state_map(lambda f: _leaf_specs(f, axis),
                                                          opt_state)


def _shardings(specs, mesh: Mesh):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def table_rows_per_device(n_features: int, n_devices: int) -> int:
    """Rows each device owns: ``ceil(p / D)``."""
    return max(-(-n_features // n_devices), 1)


def _pad_rows(leaf, n_rows: int):
    widths = [(0, n_rows - leaf.shape[0])] + [(0, 0)] * (leaf.ndim - 1)
    return jnp.pad(leaf, widths)


def shard_fm_table(params, opt_state, mesh: Mesh):
    """Row-shard an internal-layout parameter table and its row-wise optimizer state.

    Args:
        params: ``{"w0": (C,), "w": (p, C), "V": (p, C, k) or (p, C, F, k)[, "r": (C, F, F)]}``
            (the layout of :mod:`gpustat.estimators._train`).
        opt_state: the row-wise transformation's state for ``params``.
        mesh: 1-D mesh of D devices.

    Returns:
        ``(params, opt_state)`` with the feature rows padded with zeros to
        ``D ceil(p / D)`` and split over the devices in contiguous blocks; ``w0`` and
        ``r`` (and their state) replicated.

    Raises:
        ValueError: ``params`` without ``"w"`` and ``"V"`` of a common leading axis.
    """
    if not isinstance(params, dict) or not {"w0", "w", "V"} <= set(params):
        raise ValueError(f"params must be a dict with w0, w and V, got {type(params).__name__}")
    p = jnp.shape(params["w"])[0]
    if jnp.shape(params["V"])[0] != p:
        raise ValueError(f"w and V need the same feature axis, got {jnp.shape(params['w'])=} "
                         f"and {jnp.shape(params['V'])=}")
    n_rows = mesh_size(mesh) * table_rows_per_device(p, mesh_size(mesh))
    pspecs, sspecs = _table_specs(params, opt_state, row_axis(mesh))
    out = _shardings((pspecs, sspecs), mesh)

    def pad(tree):
        return {name: _pad_rows(leaf, n_rows) if name in _ROW_LEAVES else leaf
                for name, leaf in tree.items()}

    placed = jax.jit(lambda p_, s_: (pad(p_), fm_train._state_map(pad, s_)),
                     out_shardings=out)(params, opt_state)
    return placed


#: factor values one device draws at a time when it builds its rows of a new table
_INIT_CHUNK_VALUES = 1 << 26


@functools.partial(jax.jit, static_argnums=tuple(range(9)))
def _init_table(model, n_features, n_factors, tx, mesh, n_fields, n_classes, init_scale, dtype,
                key):
    axis = row_axis(mesh)
    p_local = table_rows_per_device(n_features, mesh_size(mesh))
    row_shape = (n_classes, n_fields, n_factors) if model == "ffm" else (n_classes, n_factors)
    chunk = min(p_local, max(1, _INIT_CHUNK_VALUES // math.prod(row_shape)))

    def block(key):
        me = jax.lax.axis_index(axis)

        def draw(c, V):
            start = jnp.minimum(c * chunk, p_local - chunk)  # the last chunk overlaps
            sub = jax.random.fold_in(jax.random.fold_in(key, me), c)
            if model == "ffm":
                values = jax.random.uniform(sub, (chunk, *row_shape), dtype, 0.0,
                                            init_scale / math.sqrt(n_factors))
            else:
                values = init_scale * jax.random.normal(sub, (chunk, *row_shape), dtype)
            real = me * p_local + start + jnp.arange(chunk) < n_features
            values = jnp.where(real.reshape(-1, *[1] * len(row_shape)), values, 0)
            return jax.lax.dynamic_update_slice_in_dim(V, values, start, 0)

        V = jax.lax.fori_loop(0, -(-p_local // chunk), draw,
                              jnp.zeros((p_local, *row_shape), dtype))
        params = {"w0": jnp.zeros(n_classes, dtype),
                  "w": jnp.zeros((p_local, n_classes), dtype), "V": V}
        if model == "fwfm":
            params["r"] = jnp.ones((n_classes, n_fields, n_fields), dtype)
        return params, tx.init(params)

    # the specs need only the pytree structure: the state's, from a stand-in table
    names = ("w0", "w", "V", "r") if model == "fwfm" else ("w0", "w", "V")
    params = {name: jax.ShapeDtypeStruct((1,), dtype) for name in names}
    state = jax.eval_shape(tx.init, params)
    return jax.shard_map(block, mesh=mesh, in_specs=PartitionSpec(),
                         out_specs=_table_specs(params, state, axis), check_vma=False)(key)


def init_fm_table(model: str, n_features: int, n_factors: int, tx, mesh: Mesh, *,
                  key: jax.Array, n_fields: int = 1, n_classes: int = 1,
                  init_scale: float = 0.01, dtype=jnp.float32):
    """A fresh row-sharded table and optimizer state, drawn on the devices.

    Each device draws only its own rows, a bounded chunk at a time: no host copy
    and no whole-table temporary exists, so the table may fill most of the devices'
    memory. Initial values follow the estimators: ``w0``, ``w`` zero; ``V``
    normal(0, ``init_scale``) (FM, FwFM) or uniform(0, ``init_scale / sqrt(k)``)
    (FFM); FwFM's ``r`` ones. The draw depends on ``key`` and on the device count.

    Args:
        model: "fm", "ffm" or "fwfm".
        n_features: p.
        n_factors: k.
        tx: a row-wise transformation (gpustat's ``lazy_sgd``, ``lazy_adagrad``,
            ``lazy_adam``, ``ftrl``); its state is built beside the table.
        mesh: 1-D mesh of D devices.
        key: ``jax.random`` key.
        n_fields: F (FFM, FwFM).
        n_classes: C.
        init_scale: scale of the initial factors.
        dtype: float dtype of the table.

    Returns:
        ``(params, opt_state)`` as :func:`shard_fm_table` returns them
        (``D ceil(p / D)`` feature rows, the rows past p zero).
    """
    if model not in fm_train.MODELS:
        raise ValueError(f"model must be one of {fm_train.MODELS}, got {model!r}")
    for name, value in (("n_features", n_features), ("n_factors", n_factors),
                        ("n_fields", n_fields), ("n_classes", n_classes)):
        check_int(value, name, 1)
    check_real(init_scale, "init_scale", 0)
    return _init_table(model, n_features, n_factors, tx, mesh, n_fields, n_classes,
                       float(init_scale), jnp.dtype(dtype), key)


def _round_capacity(n: int, limit: int) -> int:
    """``n`` rounded up to a grid of 32 steps per octave (few distinct compiles), at most
    ``limit`` and at least 1."""
    return min(grid_size(n, 32), limit)


def _capacity_limit(data: ShardedRows, batch_size: int, n_rows: int, n_devices: int) -> int:
    """The most row ids one device can ask of one owner in a batch: its batch slots,
    and the owner's rows."""
    slots = batch_size // n_devices * data.rows.idx.shape[2]
    return min(slots, n_rows // n_devices)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _max_requests(mesh: Mesh, n_rows: int, idx, table):
    """The largest number of unique row ids one device asks of one owner in any batch."""
    axis = row_axis(mesh)
    n_dev = mesh_size(mesh)

    def block(idx, table):
        idx, table = idx[0], table[0]

        def body(b, most):
            uniq, _ = fm_train.touched_rows(idx[table[b]], n_rows)
            _, _, counts = owner_requests(uniq, n_dev, n_rows // n_dev, 1)
            return jnp.maximum(most, counts.max())

        most = jax.lax.fori_loop(0, table.shape[0], body, jnp.zeros((), jnp.int32))
        return jax.lax.pmax(most, axis)

    row = PartitionSpec(axis)
    return jax.shard_map(block, mesh=mesh, in_specs=(row, row), out_specs=PartitionSpec(),
                         check_vma=False)(idx, table)


def plan_capacity(data: ShardedRows, local_orders, batch_size: int, n_rows: int,
                  mesh: Mesh) -> int:
    """The per-owner request capacity an epoch needs (rounded up, see the module notes).

    Args:
        data: :class:`ShardedRows` on ``mesh``.
        local_orders: D arrays of local row ids, as for :func:`train_epoch_model_parallel`.
        batch_size: the global batch B (a multiple of D).
        n_rows: feature rows of the sharded table (``params["w"].shape[0]``).
        mesh: 1-D mesh.

    Returns:
        An int in ``[1, min(B / D * z, n_rows / D)]``.

    Raises:
        ValueError: ``data`` planned for another mesh, or ``batch_size`` or ``n_rows``
            not a multiple of D.
    """
    check_blocks("data", data.rows.weight.shape[0], mesh)
    d = mesh_size(mesh)
    if batch_size % d or n_rows % d:
        raise ValueError(f"batch_size and n_rows must be multiples of the device count {d}, "
                         f"got {batch_size=}, {n_rows=}")
    table, _ = _epoch_tables(data, local_orders, batch_size, mesh)
    most = int(_max_requests(mesh, n_rows, data.rows.idx, table))
    return _round_capacity(most, _capacity_limit(data, batch_size, n_rows, d))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
def _table_epoch(cfg, mesh, capacity, params, opt_state, rows, table, counts):
    axis = row_axis(mesh)

    def block(params, opt_state, rows, table, counts):
        rows = jax.tree.map(lambda a: a[0], rows)
        table = table[0]

        def body(b, carry):
            params, opt_state, loss_sum, stopped_at = carry
            params, opt_state, loss, overflow = table_rows_step(
                cfg, axis, capacity, params, opt_state, rows, table[b], counts[b],
                stopped_at >= 0)
            stopped_at = jnp.where((stopped_at < 0) & overflow, b, stopped_at)
            return params, opt_state, loss_sum + loss, stopped_at

        start = (params, opt_state, jnp.zeros((), rows.val.dtype), jnp.full((), -1, jnp.int32))
        return jax.lax.fori_loop(0, table.shape[0], body, start)

    pspecs, sspecs = _table_specs(params, opt_state, axis)
    row, shared = PartitionSpec(axis), PartitionSpec()
    return jax.shard_map(block, mesh=mesh, in_specs=(pspecs, sspecs, row, row, shared),
                         out_specs=(pspecs, sspecs, shared, shared), check_vma=False)(
        params, opt_state, rows, table, counts)


def train_epoch_model_parallel(cfg: fm_train.TrainConfig, params, opt_state, data: ShardedRows,
                               local_orders, mesh: Mesh, *, capacity: int | None = None):
    """One epoch on a row-sharded table: data parallel over rows, model parallel over features.

    Args:
        cfg: static settings; ``cfg.tx`` a row-wise transformation; ``cfg.batch_size``
            is the global batch B, a multiple of the device count D.
        params, opt_state: the table from :func:`shard_fm_table` or
            :func:`init_fm_table` on ``mesh``. **Donated**: their buffers hold the
            result (a table near the devices' memory has no room for two copies);
            do not use them after the call.
        data: :class:`ShardedRows` from :func:`shard_training_rows` on ``mesh``.
        local_orders: D arrays of local row ids (a permutation of each block's rows).
        mesh: 1-D mesh.
        capacity: row ids one device may ask of one owner per batch; ``None`` plans
            it (:func:`plan_capacity`). At an owner's row count or more, no ids travel:
            the steps exchange whole shards (``all_gather`` of the rows,
            ``psum_scatter`` of their gradients).

    Returns:
        ``(params, opt_state, weighted loss sum)``; equal to
        :func:`gpustat.estimators._train.train_epoch` over :func:`global_order` on the
        unsharded table.

    Raises:
        CapacityError: a batch exceeded ``capacity``; the error holds the state
            after the batches before it.
        ValueError: data or table planned for another mesh, a batch size that does
            not split over the devices, ``capacity`` not an integer >= 1.
        TypeError: ``cfg.tx`` not row-wise.
    """
    check_blocks("data", data.rows.weight.shape[0], mesh)
    d = mesh_size(mesh)
    check_batch(cfg, d)
    check_rowwise(cfg, "train_epoch_model_parallel")
    n_rows = params["w"].shape[0]
    spec = getattr(getattr(params["w"], "sharding", None), "spec", None)
    if n_rows % d or spec != PartitionSpec(row_axis(mesh)):
        raise ValueError(f"params must be row-sharded over the mesh's {d} devices (see "
                         f"shard_fm_table), got w of shape {params['w'].shape} with "
                         f"sharding spec {spec}")
    if capacity is None:
        capacity = plan_capacity(data, local_orders, cfg.batch_size, n_rows, mesh)
    else:
        capacity = check_int(capacity, "capacity", 1)
    table, counts = _epoch_tables(data, local_orders, cfg.batch_size, mesh)
    params, opt_state, loss, stopped_at = _table_epoch(cfg, mesh, capacity, params, opt_state,
                                                       data.rows, table, counts)
    stopped_at = int(stopped_at)
    if stopped_at >= 0:
        raise CapacityError(
            f"batch {stopped_at} of the epoch asks one owner for more than {capacity=} rows "
            f"on some device; the epoch stopped before it (the error's params and opt_state "
            f"hold the state after batch {stopped_at - 1}); pass capacity=None to plan it",
            stopped_at, params, opt_state, loss)
    return params, opt_state, loss

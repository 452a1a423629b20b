"""Row exchanges of sparse FM / FFM / FwFM training steps on a mesh: only touched rows travel.

Both steps run inside ``shard_map`` on one device's share of a global batch and use
the single-device row-wise step of :mod:`gpustat.estimators._train` (a
:class:`~gpustat.estimators._optim.RowwiseTransformation`): the device's batch
indices are made unique (a static capacity ``min(B_local z, p)``, padded with the
out-of-range index), the parameter rows they name are gathered, the batch is
scored on them and its slot contributions are summed into those rows. What differs
is where the rows live (a list of ids as long as the table is the table's own
rows, :func:`~gpustat.estimators._train.touched_rows`):

* :func:`replicated_rows_step` (every device holds the whole table): the
  ``(capacity,)`` index lists and the summed row gradients are all-gathered; every
  device merges them into the batch's global unique rows and steps them. Each
  device's list is duplicate-free, so every merged row receives at most one
  nonzero contribution per device, added in device order: the merge is the same
  on every device and the replicas stay identical.
* :func:`table_rows_step` (the feature rows of ``w`` and ``V`` and their optimizer
  state row-sharded: device ``g`` owns the contiguous rows
  ``[g p_local, (g + 1) p_local)``): the sorted unique list is already grouped by
  owner; one ``all_to_all`` sends each owner up to ``capacity`` requested row ids,
  a second returns the rows, a third sends the summed row gradients back (the
  arrays of one exchange packed into one buffer where they are small, one collective
  each where they are large).
  Each owner keeps the requested rows in the layout it served them in (D sorted
  blocks, one per requester): a row asked by several requesters is stepped once, at
  its first request, with every requester's contribution added there
  (:func:`merge_requests`); the other requests of that row are dropped. A device with
  more than ``capacity`` rows for one owner raises the step's overflow flag (the
  driver raises; nothing is dropped silently). Where ``capacity`` reaches an owner's
  rows (every row may be asked), no ids travel: the shards are all-gathered, each
  device scores its rows on the whole table, and the row gradients are summed onto
  their owners by one ``psum_scatter``.

The bias ``w0`` and FwFM's ``r`` stay replicated: their gradients, the touched mask
of ``r`` and the loss are summed by one packed ``psum``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpustat.distributed._mesh import psum_packed
from gpustat.estimators import _train as fm_train

__all__ = ["merge_requests", "owner_requests", "replicated_rows_step", "table_rows_step"]


def _row_gradients(cfg: fm_train.TrainConfig, sub, local, data: fm_train.DeviceRows, rows,
                   count):
    """The batch rows ``rows`` scored on the gathered parameter rows ``sub`` (slot
    ``e`` reads row ``local[e]``), their contributions summed into those rows.

    Returns ``(small, r_touched, aux, factors, loss)``: the gradients of the small
    leaves, FwFM's touched mask of ``r`` (else None), the (rows, C + 1 [+ F]) linear
    gradients and touch counts, the (rows, C [F] k) factor gradients, and the
    batch's weighted loss.
    """
    inputs, loss = fm_train._batch_inputs(cfg, sub, local, data.val[rows], data.fld[rows],
                                          data.target[rows], data.weight[rows], count)
    small, r_touched, lin, factor_rows = fm_train._contributions(cfg, sub, *inputs)
    scatter = fm_train._scatter_fn(cfg.backend)
    n_rows, slots = sub["w"].shape[0], local.reshape(-1)
    return (small, r_touched, scatter(slots, lin, n_rows), scatter(slots, factor_rows, n_rows),
            loss)


def replicated_rows_step(cfg: fm_train.TrainConfig, axis: str, params, opt_state,
                         data: fm_train.DeviceRows, rows, count):
    """One global batch with the table replicated and only touched rows exchanged.

    Args:
        cfg: static settings; ``cfg.tx`` a row-wise transformation.
        axis: the mesh axis.
        params, opt_state: the whole (replicated) parameters and state.
        data: this device's rows; ``rows`` (B / D,) its share of the batch.
        count: the global batch's row count.

    Returns:
        ``(params, opt_state, loss)``, identical on every device.
    """
    idx = data.idx[rows]
    p = params["w"].shape[0]
    uniq, local = fm_train.touched_rows(idx, p)
    sub = fm_train._gather_rows(params, uniq)
    small, r_touched, aux, factors, loss = _row_gradients(cfg, sub, local, data, rows, count)
    small, r_touched, loss = psum_packed((small, r_touched, loss), axis)
    every_uniq = jax.lax.all_gather(uniq, axis)
    every_aux, every_factors = _packed(lambda a: jax.lax.all_gather(a, axis), (aux, factors), 1)
    n_dev = every_uniq.shape[0]
    merged, where = fm_train.touched_rows(every_uniq, p)
    # device by device: within one list the rows are distinct (the padding entries,
    # which carry zeros, excepted), so no row sees two contributions in one scatter
    aux = jnp.zeros((merged.shape[0], aux.shape[1]), aux.dtype)
    factors = jnp.zeros((merged.shape[0], factors.shape[1]), factors.dtype)
    for g in range(n_dev):
        aux = aux.at[where[g]].add(every_aux[g])
        factors = factors.at[where[g]].add(every_factors[g])
    grads, touched = fm_train._unpacked(cfg, small, r_touched, aux, factors)
    params, opt_state = fm_train._step_rows(cfg, params, opt_state, merged,
                                            fm_train._gather_rows(params, merged), grads,
                                            touched)
    return params, opt_state, loss


def owner_requests(uniq, n_dev: int, rows_per_device: int, capacity: int):
    """Split a sorted unique id list (padded with ``n_dev * rows_per_device``) by owner.

    Returns ``(ask, slot, counts)``: (D, capacity) ids local to each owner (the
    out-of-range ``rows_per_device`` where unused); for each entry of ``uniq`` the row
    of the flattened (D capacity) answer block its row comes back in (0 for padding
    entries and for ids past an owner's ``capacity``, which make the step overflow);
    and the (D,) number of ids per owner.
    """
    bounds = jnp.arange(n_dev + 1, dtype=uniq.dtype) * rows_per_device
    starts = jnp.searchsorted(uniq, bounds).astype(jnp.int32)
    counts = starts[1:] - starts[:-1]
    rank = jnp.arange(capacity, dtype=jnp.int32)
    valid = rank[None, :] < counts[:, None]
    pos = jnp.where(valid, starts[:-1, None] + rank[None, :], uniq.shape[0])
    ask = jnp.where(valid, uniq.at[pos].get(mode="fill", fill_value=0) - bounds[:-1, None],
                    rows_per_device)
    owner = jnp.minimum(uniq // rows_per_device, n_dev).astype(jnp.int32)  # padding: D
    within = jnp.arange(uniq.shape[0], dtype=jnp.int32) - starts[owner]
    slot = jnp.where((owner < n_dev) & (within < capacity), owner * capacity + within, 0)
    return ask, slot, counts


def _packed(collective, arrays, lead: int):
    """``collective`` applied once to ``arrays`` (one dtype, the same ``lead`` leading
    axes) joined along their flattened trailing axes, the result split back: one
    collective instead of one per array (each carries a fixed latency on GPUs)."""
    flat = [a.reshape(*a.shape[:lead], -1) for a in arrays]
    out = collective(jnp.concatenate(flat, axis=-1))
    parts = jnp.split(out, np.cumsum([f.shape[-1] for f in flat])[:-1], axis=-1)
    return [part.reshape(*out.shape[:-1], *a.shape[lead:]) for part, a in zip(parts, arrays)]


#: exchanges up to this size travel packed in one collective: packing copies the
#: arrays in and out, which below it costs less than a second collective's fixed latency
_PACK_BYTES = 16 << 20


def _exchange(arrays, axis: str):
    """``all_to_all`` of (D, capacity, ...) arrays of one dtype: block ``t`` goes to device
    ``t``, and block ``s`` of the result came from device ``s``. Small exchanges travel
    packed (``_PACK_BYTES``), large ones one collective per array (no copies)."""
    def collective(a):
        return jax.lax.all_to_all(a, axis, 0, 0)

    if sum(a.size * a.dtype.itemsize for a in arrays) <= _PACK_BYTES:
        return _packed(collective, arrays, 2)
    return [collective(a) for a in arrays]


def merge_requests(asked, tables, n_rows: int):
    """Sum each requested row's contributions at its first request.

    Args:
        asked: (D, capacity) row ids the requesters sent one owner, distinct within a
            block (one block per requester); ``n_rows`` is the padding.
        tables: arrays of shape (D capacity, ...) in the layout of ``asked``: entry ``e``
            holds the contribution of requester ``e // capacity`` to row
            ``asked.flat[e]``.
        n_rows: the owner's row count.

    Returns:
        ``(first, summed)``: (D capacity,) bool, true at the first request of each row
        (blocks in device order) and false at padding and at repeated requests; and
        ``tables`` with each first request holding the sum over every request of its row
        (other entries hold partial sums; a caller drops them). At most D entries
        share a row, so the sums take D - 1 shifted reads of the stably sorted ids.
    """
    n_dev = asked.shape[0]
    flat = asked.reshape(-1)
    size = flat.shape[0]
    iota = jnp.arange(size, dtype=jnp.int32)
    ids, order = jax.lax.sort((flat, iota), num_keys=1, is_stable=True)
    rank = jnp.zeros(size, jnp.int32).at[order].set(iota, unique_indices=True)
    first = ((rank == 0) | (ids[jnp.maximum(rank - 1, 0)] != flat)) & (flat < n_rows)
    summed = list(tables)
    for shift in range(1, n_dev):
        later = jnp.minimum(rank + shift, size - 1)
        same = (rank + shift < size) & (ids[later] == flat)
        partner = jnp.where(same, order[later], 0)
        summed = [acc + jnp.where(same.reshape(-1, *[1] * (acc.ndim - 1)), table[partner], 0)
                  for acc, table in zip(summed, tables)]
    return first, summed


def _whole_shard_step(cfg: fm_train.TrainConfig, axis: str, params, opt_state,
                      data: fm_train.DeviceRows, rows, count, stopped):
    """The step where a batch may ask every row of an owner: no ids travel; each device
    gathers every shard (the whole table, in id order), scores its rows on it, and the
    row gradients are summed onto their owners (``psum_scatter``); every row of the
    shard is stepped (rows no batch touched are left alone by the lazy step)."""
    sub = dict(params)
    for name in fm_train._ROW_LEAVES:
        sub[name] = jax.lax.all_gather(params[name], axis, tiled=True)
    small, r_touched, aux, factors, loss = _row_gradients(cfg, sub, data.idx[rows], data,
                                                          rows, count)
    small, r_touched, loss = psum_packed((small, r_touched, loss), axis)
    aux, factors = (jax.lax.psum_scatter(a, axis, scatter_dimension=0, tiled=True)
                    for a in (aux, factors))
    grads, touched = fm_train._unpacked(cfg, small, r_touched, aux, factors)
    p_local = params["w"].shape[0]
    every = jnp.where(stopped, p_local, jnp.arange(p_local))  # stopped: out of range
    new_params, new_state = fm_train._step_rows(cfg, params, opt_state, every, params, grads,
                                                touched)
    return new_params, new_state, loss, jnp.zeros((), bool)


def _requested_rows_step(cfg: fm_train.TrainConfig, axis: str, capacity: int, params,
                         opt_state, data: fm_train.DeviceRows, rows, count, stopped):
    """The step where each device requests its batch's unique rows from their owners
    (at most ``capacity`` of each); see :func:`table_rows_step`."""
    n_dev = jax.lax.axis_size(axis)
    p_local = params["w"].shape[0]
    uniq, local = fm_train.touched_rows(data.idx[rows], n_dev * p_local)
    ask, slot, counts = owner_requests(uniq, n_dev, p_local, capacity)
    (asked,) = _exchange([ask], axis)  # asked[s]: ids device s wants from this device
    served = fm_train._gather_rows(params, asked.reshape(-1))
    # the batch is scored on the answer blocks as they arrive (D capacity rows, unused
    # ones zero), its slots pointing at their id's answer row; the row gradients come
    # out in the same layout and go straight back
    answers = _exchange([served[name].reshape(n_dev, capacity, *served[name].shape[1:])
                         for name in fm_train._ROW_LEAVES], axis)
    sub = dict(params)
    for name, got in zip(fm_train._ROW_LEAVES, answers):
        sub[name] = got.reshape(served[name].shape)
    small, r_touched, aux, factors, loss = _row_gradients(cfg, sub, slot[local], data, rows,
                                                          count)
    overflow = (counts > capacity).any()
    small, r_touched, loss, overflow = psum_packed((small, r_touched, loss, overflow), axis)
    back = _exchange([a.reshape(n_dev, capacity, -1) for a in (aux, factors)], axis)
    first, (aux, factors) = merge_requests(
        asked, [b.reshape(n_dev * capacity, -1) for b in back], p_local)
    grads, touched = fm_train._unpacked(cfg, small, r_touched, aux, factors)
    # each row is stepped at its first request, on the rows served from it; repeats,
    # padding and a skipped step's ids are out of range (dropped)
    ids = jnp.where(first & ~(stopped | overflow), asked.reshape(-1), p_local)
    new_params, new_state = fm_train._step_rows(cfg, params, opt_state, ids, served, grads,
                                                touched, ids_sorted=False)
    return new_params, new_state, loss, overflow


def table_rows_step(cfg: fm_train.TrainConfig, axis: str, capacity: int, params, opt_state,
                    data: fm_train.DeviceRows, rows, count, stopped):
    """One global batch on a row-sharded table.

    Args:
        cfg: static settings; ``cfg.tx`` a row-wise transformation.
        axis: the mesh axis.
        capacity: static number of row ids one device may request from one owner; at
            least ``p_local`` (every row of an owner), the whole shards are exchanged
            instead of requested rows.
        params, opt_state: this device's rows of ``w``, ``V`` and of their state
            (``p_local`` rows each), the replicated ``w0`` and ``r``.
        data: this device's rows; ``rows`` (B / D,) its share of the batch.
        count: the global batch's row count.
        stopped: replicated bool: apply nothing (an earlier batch overflowed).

    Returns:
        ``(params, opt_state, loss, overflow)``: the stepped local rows, the global
        batch's loss and whether any device needed more than ``capacity`` rows of
        one owner, both replicated. An overflowing (or stopped) step changes nothing
        and its loss is 0.
    """
    p_local = params["w"].shape[0]
    if capacity >= p_local:
        new_params, new_state, loss, overflow = _whole_shard_step(
            cfg, axis, params, opt_state, data, rows, count, stopped)
    else:
        new_params, new_state, loss, overflow = _requested_rows_step(
            cfg, axis, capacity, params, opt_state, data, rows, count, stopped)
    skip = stopped | overflow

    def keep(new, old):
        return {name: leaf if name in fm_train._ROW_LEAVES else jnp.where(skip, old[name], leaf)
                for name, leaf in new.items()}

    return (keep(new_params, params), fm_train._state_map(keep, new_state, opt_state),
            jnp.where(skip, 0, loss), overflow)

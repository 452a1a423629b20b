"""Row sharding on a 1-D device mesh: the mesh, placement helpers and two ``shard_map`` patterns.

Every batched gpustat op is independent across rows (or atoms), so it scales over
devices by splitting the rows into equal contiguous blocks along one mesh axis:

* **map** (:func:`map_rows`): each device runs the op on its block; the output
  keeps the row sharding (elementwise evaluation, scoring, per-row derivatives).
* **sum** (:func:`sum_rows`): each device reduces its block to a small pytree
  (sufficient statistics, joint Hessian products, gradients) and one
  ``lax.psum`` over the axis adds the blocks; the result is replicated.

Rows are padded to a multiple of the device count with values that change
nothing (``pad_value``: zero weights for reductions, any finite value for maps,
whose padded outputs are dropped). Inside the blocks the single-device op runs
unchanged, Pallas kernel included: ``shard_map`` hands each device its local
block, so the kernels need no knowledge of the mesh.

Built on ``jax.sharding.Mesh``, ``NamedSharding`` and ``jax.shard_map``; across
hosts the same code runs after ``jax.distributed.initialize()`` (see
``docs/distributed.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat._checks import check_int

__all__ = [
    "ROW_AXIS",
    "check_blocks",
    "make_mesh",
    "map_rows",
    "mesh_size",
    "pad_rows",
    "padded_rows",
    "place",
    "psum_packed",
    "replicate",
    "row_axis",
    "shard_rows",
    "spans_processes",
    "sum_rows",
    "to_mesh",
]

#: Default name of the mesh axis rows are split over.
ROW_AXIS = "rows"


def make_mesh(n_devices: int | None = None, *, axis_name: str = ROW_AXIS,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh of devices whose single axis carries rows (or atoms).

    Args:
        n_devices: how many devices to use (default: all of ``devices``).
        axis_name: name of the mesh axis.
        devices: the devices to choose from (default ``jax.devices()``: every
            device of every process after ``jax.distributed.initialize``).

    Returns:
        A ``jax.sharding.Mesh`` of shape ``(n_devices,)``.

    Raises:
        ValueError: ``n_devices`` not an integer >= 1, or more than the devices available.
        TypeError: ``axis_name`` is not a string.
    """
    if not isinstance(axis_name, str):
        raise TypeError(f"axis_name must be a str, got {type(axis_name).__name__}")
    pool = list(jax.devices() if devices is None else devices)
    n = len(pool) if n_devices is None else check_int(n_devices, "n_devices", 1)
    if n > len(pool):
        raise ValueError(f"n_devices must lie in [1, {len(pool)}] (devices available), "
                         f"got {n_devices=}")
    return Mesh(np.asarray(pool[:n]), (axis_name,))


def _check_mesh(mesh) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (see make_mesh), "
                        f"got {type(mesh).__name__}")
    if len(mesh.axis_names) != 1:
        raise ValueError(f"mesh must be 1-D (one axis for rows), got {mesh.axis_names=}")
    return mesh


def row_axis(mesh: Mesh) -> str:
    """Name of the (single) axis of a 1-D mesh."""
    return _check_mesh(mesh).axis_names[0]


def mesh_size(mesh: Mesh) -> int:
    """Number of devices on the mesh's row axis."""
    return int(_check_mesh(mesh).devices.size)


def check_blocks(name: str, n_blocks: int, mesh: Mesh) -> None:
    """Raise unless ``name`` (a host-planned sharded input) has one block per mesh device."""
    if n_blocks != mesh_size(mesh):
        raise ValueError(f"{name} was sharded for {n_blocks} devices, the mesh has "
                         f"{mesh_size(mesh)}")


def padded_rows(n: int, mesh: Mesh) -> int:
    """Smallest multiple of the device count that is >= n (and >= the device count)."""
    d = mesh_size(mesh)
    return max(-(-n // d), 1) * d


def pad_rows(x: Any, n_to: int, pad_value: float | int = 0) -> Any:
    """Pad the leading axis of every leaf of ``x`` to ``n_to`` rows with ``pad_value``."""
    def pad(a):
        a = jnp.asarray(a)
        if a.shape[0] == n_to:
            return a
        widths = [(0, n_to - a.shape[0])] + [(0, 0)] * (a.ndim - 1)
        return jnp.pad(a, widths, constant_values=jnp.asarray(pad_value, a.dtype))
    return jax.tree.map(pad, x)


def spans_processes(mesh: Mesh) -> bool:
    """Whether the mesh holds devices of several processes (after ``jax.distributed``)."""
    return not NamedSharding(_check_mesh(mesh), PartitionSpec()).is_fully_addressable


def _place_leaf(a, sharding: NamedSharding):
    if isinstance(a, jax.core.Tracer):
        return a  # under jit: shard_map places it
    if sharding.is_fully_addressable or (isinstance(a, jax.Array)
                                         and not a.is_fully_addressable):
        return jax.device_put(a, sharding)
    # a host value every process holds whole: each process places its addressable shards
    host = np.asarray(a)
    host = host.astype(jax.dtypes.canonicalize_dtype(host.dtype), copy=False)  # as device_put
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place(x: Any, sharding: NamedSharding) -> Any:
    """``jax.device_put`` of every leaf of ``x`` that also works across processes.

    On a mesh of one process this is ``jax.device_put``. On a mesh spanning several
    processes every process must call it with the same host values; each builds its
    addressable shards (``jax.make_array_from_callback``). Global arrays are
    resharded and tracers pass through.
    """
    return jax.tree.map(lambda a: _place_leaf(a, sharding), x)


def to_mesh(x: Any, mesh: Mesh, spec: PartitionSpec) -> Any:
    """Entry-point inputs as global arrays when the mesh spans processes, else unchanged.

    ``shard_map`` places single-process inputs itself; a host array cannot enter a
    program over several processes' devices, so it is placed with :func:`place`.
    """
    return place(x, NamedSharding(mesh, spec)) if spans_processes(mesh) else x


def shard_rows(x: Any, mesh: Mesh, *, pad_value: float | int = 0) -> Any:
    """Place every leaf of ``x`` on the mesh, its leading axis split over the devices.

    The leading axis is padded with ``pad_value`` to a multiple of the device
    count first. Padding rows are rows to every op that receives the array:
    pass an unpadded array to the sharded entry points (they pad and unpad
    themselves, with weight 0 where they reduce) or give padding rows weight 0.

    Args:
        x: an array or pytree of arrays with a common leading axis (n rows).
        mesh: a 1-D mesh.
        pad_value: value of the padding rows.

    Returns:
        The same pytree, each leaf a ``jax.Array`` with ``NamedSharding(mesh, P(axis))``.
    """
    leaves = jax.tree.leaves(x)
    if not leaves:
        return x
    sizes = {jnp.shape(a)[0] if jnp.ndim(a) else None for a in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(f"every leaf needs the same leading (row) axis, got leading sizes "
                         f"{sorted(s for s in sizes if s is not None)} "
                         f"{'and a scalar' if None in sizes else ''}".rstrip())
    n_to = padded_rows(sizes.pop(), mesh)
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    return place(pad_rows(x, n_to, pad_value), sharding)


def replicate(x: Any, mesh: Mesh) -> Any:
    """Place every leaf of ``x`` on every device of the mesh (parameters, small tables).

    On a mesh spanning several processes every process passes the same values.
    """
    return place(x, NamedSharding(mesh, PartitionSpec()))


def _row_specs(tree, axis):
    return jax.tree.map(lambda _: PartitionSpec(axis), tree)


def _shared_specs(tree):
    return jax.tree.map(lambda _: PartitionSpec(), tree)


def _row_count(rows) -> int:
    sizes = {jnp.shape(a)[0] for a in jax.tree.leaves(rows)}
    if len(sizes) != 1:
        raise ValueError(f"row arguments must share their leading axis, got sizes {sorted(sizes)}")
    return sizes.pop()


def map_rows(fn: Callable, mesh: Mesh, rows: Any, shared: Any = (), *,
             pad_value: float | int = 0) -> Any:
    """``fn(rows_block, shared)`` on every device's block of rows; outputs stay row-sharded.

    ``fn`` must map a block of ``b`` rows to outputs whose leading axis is ``b``
    (row ``i`` of the output depends on row ``i`` of the input only).

    Args:
        fn: the single-device op, ``fn(rows, shared) -> pytree`` of (b, ...) arrays.
        mesh: a 1-D mesh.
        rows: pytree of (n, ...) arrays split over the devices.
        shared: pytree of arrays every device sees whole (parameters).
        pad_value: value of padding rows (their outputs are dropped).

    Returns:
        ``fn``'s outputs for the n rows, sharded along the leading axis.
    """
    axis = row_axis(mesh)
    n = _row_count(rows)
    n_to = padded_rows(n, mesh)
    out = jax.shard_map(fn, mesh=mesh, in_specs=(_row_specs(rows, axis), _shared_specs(shared)),
                        out_specs=PartitionSpec(axis), check_vma=False)(
        to_mesh(pad_rows(rows, n_to, pad_value), mesh, PartitionSpec(axis)),
        to_mesh(shared, mesh, PartitionSpec()))
    return out if n_to == n else jax.tree.map(lambda a: a[:n], out)


def psum_packed(tree: Any, axis: str) -> Any:
    """``lax.psum`` of a pytree as ONE collective: leaves packed into one flat buffer.

    XLA issues one all-reduce per leaf here, and on GPUs each carries a fixed latency
    that dominates a short training step. The buffer has the widest floating dtype
    among the leaves; integer and boolean leaves travel as that float (exact for sums
    below 2**24 in float32) and come back in their own dtype (booleans as ``sum > 0``).

    Args:
        tree: pytree of arrays, the same structure and shapes on every device.
        axis: the mesh axis name.

    Returns:
        The summed pytree, leaves in their input dtypes.
    """
    leaves, treedef = jax.tree.flatten(tree)
    floats = [leaf.dtype for leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating)]
    dtype = jnp.result_type(*floats) if floats else jnp.float32
    flat = jax.lax.psum(jnp.concatenate([jnp.ravel(leaf).astype(dtype) for leaf in leaves]),
                        axis)
    out, start = [], 0
    for leaf in leaves:
        part = flat[start:start + leaf.size].reshape(leaf.shape)
        out.append(part > 0 if leaf.dtype == jnp.bool_ else part.astype(leaf.dtype))
        start += leaf.size
    return jax.tree.unflatten(treedef, out)


def sum_rows(fn: Callable, mesh: Mesh, rows: Any, shared: Any = (), *,
             pad_value: float | int = 0) -> Any:
    """``psum`` over devices of ``fn(rows_block, shared)``: a sum over all rows, replicated.

    ``fn`` must be additive over rows (its value on the union of two blocks is the
    sum of its values on each), and padding rows filled with ``pad_value`` must
    contribute zero (pad weights with 0).

    Args:
        fn: block reduction, ``fn(rows, shared) -> pytree`` of arrays.
        mesh: a 1-D mesh.
        rows: pytree of (n, ...) arrays split over the devices.
        shared: pytree of arrays every device sees whole.
        pad_value: value of padding rows.

    Returns:
        The summed pytree, replicated on every device.
    """
    axis = row_axis(mesh)
    n_to = padded_rows(_row_count(rows), mesh)

    def block_sum(block, params):
        return jax.lax.psum(fn(block, params), axis)

    return jax.shard_map(block_sum, mesh=mesh,
                         in_specs=(_row_specs(rows, axis), _shared_specs(shared)),
                         out_specs=PartitionSpec(), check_vma=False)(
        to_mesh(pad_rows(rows, n_to, pad_value), mesh, PartitionSpec(axis)),
        to_mesh(shared, mesh, PartitionSpec()))

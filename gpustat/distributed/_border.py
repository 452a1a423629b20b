"""Border (arrow-Schur) solves with the atoms of a batch split over a mesh.

Atoms are independent, so a batch scales over devices by giving each device a
share of the atoms. ``shard_map`` runs one program everywhere, which needs one
static :class:`~gpustat.reference.border.BorderLayout` for every device. The plan
(host-side, once per batch structure):

* atoms are grouped by **type** ``(n_a, k_a)``; each type's atoms are dealt
  round-robin to the D devices, so the devices' counts of a type differ by at
  most one;
* the shared local layout lists, type after type, ``ceil(count / D)`` slots of
  that type; a device with one atom fewer of a type fills the slot with a
  **dummy atom**: identity row blocks and border, zero cross blocks and
  gradients (always positive definite, solution 0), whose results are dropped.

Each device then solves its local batch with the single-device
:func:`gpustat.border.solve_batched_border` (Pallas kernel on GPUs), and
:meth:`ShardedBorderSolution.gather` puts the per-atom results back into the
original packed order. The dummy overhead is at most one atom per type per
device.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gpustat import border
from gpustat.distributed._mesh import check_blocks, mesh_size, place, row_axis, to_mesh

__all__ = ["BorderPlan", "ShardedBorderBatch", "ShardedBorderSolution", "shard_border_batch",
           "solve_batched_border"]


@dataclasses.dataclass(frozen=True, eq=False)
class BorderPlan:
    """Where every atom of a batch went: device ``g``, local slot ``slots[g, s]``.

    Attributes:
        layout: the original batch layout (b atoms).
        local: the layout every device solves (b_local slots).
        slot_atom: (D, b_local) original atom of each slot, -1 for a dummy atom.
    """

    layout: border.BorderLayout
    local: border.BorderLayout
    slot_atom: np.ndarray

    @property
    def n_devices(self) -> int:
        return self.slot_atom.shape[0]

    def gather_index(self, offsets_name: str) -> np.ndarray:
        """Flat index into the stacked (D * local size) array for every original entry."""
        lay, loc = self.layout, self.local
        orig_off = getattr(lay, offsets_name)
        local_off = getattr(loc, offsets_name)
        local_size = int(local_off[-1])
        index = np.zeros(int(orig_off[-1]), np.int64)
        g, s = np.nonzero(self.slot_atom >= 0)
        atoms = self.slot_atom[g, s]
        sizes = orig_off[atoms + 1] - orig_off[atoms]
        index[_spans(orig_off[atoms], sizes)] = _spans(g * local_size + local_off[s], sizes)
        return index


def _spans(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(start, start + size)`` over the pairs."""
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.repeat(starts, sizes) + within


def _plan(layout: border.BorderLayout, n_devices: int) -> BorderPlan:
    types, type_of = np.unique(np.stack([layout.n_rows, layout.k_dims], 1), axis=0,
                               return_inverse=True)
    type_of = type_of.reshape(-1)
    n_rows, k_dims, slot_atom = [], [], []
    for t, (n_a, k_a) in enumerate(types):
        atoms = np.flatnonzero(type_of == t)
        cap = -(-atoms.size // n_devices)
        dealt = np.full((n_devices, cap), -1, np.int64)
        for g in range(n_devices):
            share = atoms[g::n_devices]
            dealt[g, :share.size] = share
        n_rows += [n_a] * cap
        k_dims += [k_a] * cap
        slot_atom.append(dealt)
    slot_atom = np.concatenate(slot_atom, axis=1) if slot_atom else np.zeros((n_devices, 0),
                                                                               np.int64)
    return BorderPlan(layout, border.BorderLayout(layout.d, np.array(n_rows, np.int64),
                                                  np.array(k_dims, np.int64)), slot_atom)


def _local_arrays(batch: border.BorderBatch, plan: BorderPlan, g: int):
    """Device g's packed arrays: its atoms' entries, dummy atoms as identity / zero."""
    lay, loc = batch.layout, plan.local
    d = lay.d
    atoms = plan.slot_atom[g]
    real = atoms >= 0
    sizes = plan.local.packed_sizes()
    out = {name: np.zeros(shape, np.asarray(batch.H_tt).dtype) for name, shape in sizes.items()}
    host = {name: np.asarray(getattr(batch, name)) for name in sizes}
    slots = np.flatnonzero(real)
    for name, offsets in (("H_tt", "row_offsets"), ("g_t", "row_offsets"),
                          ("H_tb", "cross_offsets"), ("H_bb", "hbb_offsets"),
                          ("g_b", "border_offsets")):
        src = getattr(lay, offsets)
        dst = getattr(loc, offsets)
        sizes_a = src[atoms[slots] + 1] - src[atoms[slots]]
        out[name][_spans(dst[slots], sizes_a)] = host[name][_spans(src[atoms[slots]], sizes_a)]
    for s in np.flatnonzero(~real):  # dummy atoms: identity blocks, zero everything else
        r0, r1 = loc.row_offsets[s], loc.row_offsets[s + 1]
        out["H_tt"][r0:r1] = np.eye(d)
        k = int(loc.k_dims[s])
        h0 = loc.hbb_offsets[s]
        out["H_bb"][h0:h0 + k * k] = np.eye(k).reshape(-1)
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedBorderBatch:
    """Per-device local batches stacked on a leading device axis (sharded over the mesh).

    Attributes:
        local: :class:`~gpustat.border.BorderBatch` whose arrays carry a leading (D,)
            axis; its layout is the shared local layout.
        plan: static :class:`BorderPlan`.
    """

    local: border.BorderBatch
    plan: BorderPlan = dataclasses.field(metadata={"static": True})


def shard_border_batch(batch: border.BorderBatch, mesh: Mesh) -> ShardedBorderBatch:
    """Deal the atoms of a batch to the mesh's devices (host-side, once per batch).

    Args:
        batch: a :class:`~gpustat.border.BorderBatch` (b atoms), concrete. On a mesh
            spanning several processes every process passes the same batch and places
            its own devices' local batches.
        mesh: 1-D mesh.

    Returns:
        :class:`ShardedBorderBatch` with every device's local batch on that device.

    Raises:
        TypeError: ``batch`` not a :class:`~gpustat.border.BorderBatch`.
        ValueError: ``batch`` has per-atom row dimensions (a mixed-``d`` layout).
    """
    if not isinstance(batch, border.BorderBatch):
        raise TypeError(f"batch must be a BorderBatch, got {type(batch).__name__}")
    if not batch.layout.uniform:
        raise ValueError(f"shard_border_batch takes one row dimension d per batch, got "
                         f"{batch.layout}: build one batch per d (BorderBatch.from_atoms) "
                         f"and shard each")
    n_dev = mesh_size(mesh)
    plan = _plan(batch.layout, n_dev)
    per_device = [_local_arrays(batch, plan, g) for g in range(n_dev)]
    sharding = NamedSharding(mesh, PartitionSpec(row_axis(mesh)))
    stacked = {name: place(np.stack([p[name] for p in per_device]), sharding)
               for name in per_device[0]}
    local = border.BorderBatch(**stacked, layout=plan.local)
    return ShardedBorderBatch(local, plan)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ShardedBorderSolution:
    """Per-device solutions (leading (D,) axis, sharded) and the plan to reassemble them."""

    local: border.BorderSolution
    plan: BorderPlan = dataclasses.field(metadata={"static": True})

    def gather(self) -> border.BorderSolution:
        """The solution in the original batch's packed order (as one device would return)."""
        plan, loc = self.plan, self.local
        atoms = np.zeros(plan.layout.num_atoms, np.int64)
        g, s = np.nonzero(plan.slot_atom >= 0)
        atoms[plan.slot_atom[g, s]] = g * plan.local.num_atoms + s
        take = lambda x, idx: jnp.take(x.reshape((-1, *x.shape[2:])), jnp.asarray(idx),  # noqa: E731
                                       axis=0)
        return border.BorderSolution(
            take(loc.delta_t, plan.gather_index("row_offsets")),
            take(loc.delta_beta, plan.gather_index("border_offsets")),
            take(loc.log_det, atoms), take(loc.status, atoms), take(loc.row, atoms),
            take(loc.bump, atoms), layout=plan.layout)


def _slot_ridges(name, ridge, plan: BorderPlan, dtype):
    """(D, b_local) slot ridges: per-atom (b,) ridges follow their atoms (dummies get 0).

    Concrete ridges must be finite and >= 0 (checked here: inside ``shard_map`` the
    single-device solve sees tracers and skips its own value check).
    """
    if not isinstance(ridge, jax.core.Tracer):
        values = np.asarray(ridge, np.float64)
        if not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError(f"{name} must be finite and >= 0, got min "
                             f"{np.nanmin(values, initial=0)} (non-finite: "
                             f"{int(np.sum(~np.isfinite(values)))})")
    ridge = jnp.asarray(ridge, dtype)
    if ridge.ndim == 0:
        return jnp.broadcast_to(ridge, plan.slot_atom.shape)
    if ridge.shape != (plan.layout.num_atoms,):
        raise ValueError(f"{name} must be a scalar or shape ({plan.layout.num_atoms},), got "
                         f"{ridge.shape=}")
    idx = jnp.asarray(np.maximum(plan.slot_atom, 0))
    return jnp.where(jnp.asarray(plan.slot_atom >= 0), ridge[idx], 0)


def solve_batched_border(batch: ShardedBorderBatch, ridge_t, ridge_beta, mesh: Mesh, *,
                         backend: str = "auto") -> ShardedBorderSolution:
    """:func:`gpustat.border.solve_batched_border` with the atoms split over the mesh.

    Args:
        batch: from :func:`shard_border_batch` (built once, reused every Newton step).
        ridge_t, ridge_beta: scalars or (b,) per-atom ridges (original atom order).
        mesh: the 1-D mesh the batch was sharded on.
        backend: passed to the single-device solve on every device.

    Returns:
        :class:`ShardedBorderSolution`; call ``.gather()`` for the original order.
    """
    if not isinstance(batch, ShardedBorderBatch):
        raise TypeError(f"batch must be a ShardedBorderBatch (see shard_border_batch), got "
                        f"{type(batch).__name__}")
    check_blocks("batch", batch.plan.n_devices, mesh)
    dtype = batch.local.H_tt.dtype
    rt = _slot_ridges("ridge_t", ridge_t, batch.plan, dtype)
    rb = _slot_ridges("ridge_beta", ridge_beta, batch.plan, dtype)
    axis = row_axis(mesh)

    def block(local, rt, rb):
        one = jax.tree.map(lambda a: a[0], local)
        sol = border.solve_batched_border(one, rt[0], rb[0], backend=backend)
        return jax.tree.map(lambda a: a[None], sol)

    spec = PartitionSpec(axis)
    local = jax.shard_map(block, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                          check_vma=False)(batch.local, *to_mesh((rt, rb), mesh, spec))
    return ShardedBorderSolution(local, batch.plan)

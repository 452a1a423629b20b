# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Several devices with `gpustat.distributed`
#
# Rows are split over a 1-D mesh and every device runs the single-device op
# (Pallas kernel included) on its block under `jax.shard_map`; reductions end in
# one `psum`. Without GPUs we ask XLA for 4 CPU devices, which must happen
# before JAX starts; the small run (`GPUSTAT_NOTEBOOK_SMALL=1`, what CI runs) always
# uses them, the full run every GPU of the machine when it has GPUs.

# %%
import os
import tempfile

SMALL = os.environ.get("GPUSTAT_NOTEBOOK_SMALL") == "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")
if SMALL and "JAX_PLATFORMS" not in os.environ:
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from gpustat import distributed, mixture

# Compiled programs persist across runs (JAX's compilation cache; the library itself never
# switches it on).
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(os.path.expanduser("~"), ".cache", "gpustat-jax", "jax"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

mesh = distributed.make_mesh()
print(mesh, jax.devices())

# %% [markdown]
# ## Placing rows
#
# `shard_rows` pads the leading axis to a multiple of the device count and puts
# one contiguous block on each device.

# %%
x = distributed.shard_rows(jnp.arange(10.0), mesh)
for shard in x.addressable_shards:
    print(shard.device, shard.index, np.asarray(shard.data))

# %% [markdown]
# ## EM with one psum per iteration
#
# Three well separated clusters; the sharded fit is compared with the
# single-device `gpustat.mixture.fit_em` from the same start.

# %%
rng = np.random.default_rng(0)
n, k, p = (2_000 if SMALL else 200_000), 3, 2
centres = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, 0.0]])
X = jnp.asarray(centres[rng.integers(0, k, n)] + rng.normal(size=(n, p)))
init = mixture.MixtureParams.from_covariances(
    jnp.full((k,), 1.0 / k), jnp.asarray(centres + rng.normal(0, 1.5, (k, p))),
    jnp.broadcast_to(jnp.eye(p), (k, p, p)))
sharded = jax.jit(lambda X: distributed.fit_em(X, init, mesh, max_iter=30, tol=1e-8))(
    distributed.shard_rows(X, mesh))
single = mixture.fit_em(X, init, max_iter=30, tol=1e-8)
print("iterations", int(sharded.n_iter), int(single.n_iter))
print("max |means difference|", float(jnp.max(jnp.abs(sharded.params.means
                                                       - single.params.means))))

# %%
fig, ax = plt.subplots(figsize=(5, 3))
steps = np.arange(1, int(single.n_iter) + 1)
ax.plot(steps, np.asarray(single.lower_bounds)[: steps.size], "o-", label="1 device")
ax.plot(steps, np.asarray(sharded.lower_bounds)[: steps.size], "x--",
        label=f"{mesh.size} devices")
ax.set(xlabel="EM iteration", ylabel="mean log-likelihood", title="EM, one device vs sharded")
ax.legend()
fig.tight_layout()
figure_path = os.path.join(tempfile.gettempdir(), "gpustat_distributed.png")
fig.savefig(figure_path, dpi=80)
print("figure written to", figure_path)

# %% [markdown]
# ## Border solves: atoms dealt by type
#
# Atoms of equal `(n_a, k_a)` are dealt round-robin, so every device solves the
# same layout (each device holds at most one dummy atom per type).

# %%
from gpustat import border

sizes = rng.integers(1, 5, (40 if SMALL else 400, 2))
atoms = []
for n_a, k_a in sizes:
    A = rng.normal(size=(n_a, 2, 2))
    atoms.append((A @ A.transpose(0, 2, 1) + np.eye(2), 0.1 * rng.normal(size=(n_a, 2, k_a)),
                  rng.normal(size=(n_a, 2)), 3.0 * np.eye(k_a), rng.normal(size=k_a)))
batch = border.BorderBatch.from_atoms(*(list(a) for a in zip(*atoms, strict=True)))
plan_batch = distributed.shard_border_batch(batch, mesh)
solution = distributed.solve_batched_border(plan_batch, 1e-6, 1e-6, mesh).gather()
reference = border.solve_batched_border(batch, 1e-6, 1e-6)
slots = plan_batch.plan.local.num_atoms
types = len({(int(n_a), int(k_a)) for n_a, k_a in sizes})
print(f"atoms {batch.num_atoms} of {types} types; slots per device {slots}; dummy atoms "
      f"{slots * mesh.size - batch.num_atoms} (at most {types * (mesh.size - 1)})")
print("max |delta_t difference|", float(jnp.max(jnp.abs(solution.delta_t - reference.delta_t))))

# %% [markdown]
# ## FFM training with the table split over the devices
#
# `train_epoch_model_parallel` keeps each feature row of `w` and `V` (and its
# optimizer state) on one device only, so a table larger than one device's memory
# trains on several. Each step, every device asks the owners for the rows its share
# of the batch touches (at most `capacity` of an owner, planned from the epoch), scores
# its rows on them and sends the row gradients back; each owner steps a row once.
# Where a batch may touch every row of an owner (a small table), the devices
# exchange whole shards instead. Both give the single-device epoch over
# `global_order`, up to the order of floating-point sums.

# %%
import scipy.sparse as sp

from gpustat.estimators import _train as fm_train
from gpustat.estimators import lazy_adagrad

n_fields, k, rows = 8, 4, (512 if SMALL else 65_536)
tx = lazy_adagrad(0.05)
for p in (64, 1 << 16):                           # a small table, a hashed vocabulary
    hashed = rng.integers(0, p // n_fields, (rows, n_fields)) * n_fields + np.arange(n_fields)
    X_ctr = sp.csr_matrix((np.ones(rows * n_fields), np.sort(hashed, axis=1).ravel(),
                           np.arange(rows + 1) * n_fields), shape=(rows, p))
    X_ctr.sum_duplicates()
    y_ctr = rng.integers(0, 2, rows).astype(float)[:, None]
    field_of = np.arange(p) % n_fields
    cfg = fm_train.TrainConfig("ffm", "logistic", p, n_fields, 64 * mesh.size, tx, True,
                               1e-5, 1e-5, fm_train.scatter_backend("auto"))
    data = distributed.shard_training_rows(X_ctr, field_of, y_ctr, np.ones(rows), np.float64,
                                           mesh)
    orders = [rng.permutation(data.block_rows(g).size) for g in range(mesh.size)]
    start = {"w0": jnp.zeros(1), "w": jnp.zeros((p, 1)),
             "V": jnp.asarray(rng.uniform(0, 0.05, (p, 1, n_fields, k)))}
    table, state = distributed.shard_fm_table(start, tx.init(start), mesh)
    capacity = distributed.plan_capacity(data, orders, cfg.batch_size, table["w"].shape[0],
                                         mesh)
    table, state, loss = distributed.train_epoch_model_parallel(cfg, table, state, data,
                                                                orders, mesh)
    one_device = fm_train.train_epoch(
        cfg, start, tx.init(start),
        fm_train.to_device_rows(X_ctr, field_of, y_ctr, np.ones(rows), np.float64),
        distributed.global_order(data, orders, cfg.batch_size))
    shard = table["V"].addressable_shards[0].data
    per_owner = table["w"].shape[0] // mesh.size
    exchange = "whole shards" if capacity >= per_owner else "requested rows"
    print(f"p = {p}: V {table['V'].shape} as {mesh.size} shards of {shard.shape} "
          f"({shard.nbytes / 2**20:.1f} MiB each); capacity {capacity} of {per_owner} rows "
          f"an owner ({exchange}); loss {float(loss):.6f} "
          f"(one device {float(one_device[2]):.6f}); max |V difference| "
          f"{float(jnp.max(jnp.abs(table['V'][:p] - one_device[0]['V']))):.1e}")

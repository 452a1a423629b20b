"""Multi-GPU and multi-host gpustat through JAX's own sharding (``jax.sharding``, ``shard_map``).

Every batched gpustat op is independent across rows (or atoms). This namespace
splits the rows over a 1-D device mesh and runs the single-device op (its
validation, dispatch and Pallas kernel unchanged) on each device's block under
``jax.shard_map``; reductions finish with one ``lax.psum``.

* Mesh and placement: :func:`make_mesh`, :func:`shard_rows`, :func:`replicate`,
  and the two patterns :func:`map_rows` (per-row outputs stay sharded) and
  :func:`sum_rows` (block sums, one ``psum``).
* Row-wise ops: :func:`ppoly_eval`, :func:`fm_predict`, :func:`ffm_predict`,
  :func:`fwfm_predict` (sparse rows via :func:`shard_csr`), :func:`suff_stats`,
  :func:`row_derivatives` (via :func:`shard_bms_rows`), :func:`joint_hvp`,
  :func:`joint_diagonal`, :func:`joint_dense`, :func:`joint_gradient`.
* Drivers: :func:`fit_em`, :func:`fit_gibbs` (mixtures),
  :func:`train_epoch` (FM/FFM/FwFM data-parallel training, dense or touched-row
  exchange), :func:`train_epoch_model_parallel` (the parameter table row-sharded
  over the devices: :func:`shard_fm_table`, :func:`init_fm_table`,
  :func:`plan_capacity`),
  :func:`solve_batched_border` (atoms dealt to devices by :func:`shard_border_batch`).

Multi-process and multi-host: call :func:`initialize` (``jax.distributed.initialize``
from the ``GPUSTAT_*`` environment, or auto-detected) first in every process; then
``make_mesh()`` spans every device of every process, the placement helpers build
each process's shards of the global arrays, and the same code runs unchanged.
``python -m gpustat.distributed.launch`` starts the processes of one host
(``docs/distributed.md`` gives the recipe).
"""

from gpustat.distributed._bms import ShardedBmsRows as ShardedBmsRows
from gpustat.distributed._bms import row_derivatives as row_derivatives
from gpustat.distributed._bms import shard_bms_rows as shard_bms_rows
from gpustat.distributed._border import ShardedBorderBatch as ShardedBorderBatch
from gpustat.distributed._border import ShardedBorderSolution as ShardedBorderSolution
from gpustat.distributed._border import shard_border_batch as shard_border_batch
from gpustat.distributed._border import solve_batched_border as solve_batched_border
from gpustat.distributed._csr import ShardedCSR as ShardedCSR
from gpustat.distributed._csr import shard_csr as shard_csr
from gpustat.distributed._fm import ShardedRows as ShardedRows
from gpustat.distributed._fm import global_order as global_order
from gpustat.distributed._fm import shard_training_rows as shard_training_rows
from gpustat.distributed._fm import train_epoch as train_epoch
from gpustat.distributed._fm_table import CapacityError as CapacityError
from gpustat.distributed._fm_table import init_fm_table as init_fm_table
from gpustat.distributed._fm_table import plan_capacity as plan_capacity
from gpustat.distributed._fm_table import shard_fm_table as shard_fm_table
from gpustat.distributed._fm_table import (
    train_epoch_model_parallel as train_epoch_model_parallel,
)
from gpustat.distributed._launch import initialize as initialize
from gpustat.distributed._mesh import ROW_AXIS as ROW_AXIS
from gpustat.distributed._mesh import make_mesh as make_mesh
from gpustat.distributed._mesh import map_rows as map_rows
from gpustat.distributed._mesh import mesh_size as mesh_size
from gpustat.distributed._mesh import replicate as replicate
from gpustat.distributed._mesh import shard_rows as shard_rows
from gpustat.distributed._mesh import sum_rows as sum_rows
from gpustat.distributed._mixture import fit_em as fit_em
from gpustat.distributed._mixture import fit_gibbs as fit_gibbs
from gpustat.distributed._ops import ffm_predict as ffm_predict
from gpustat.distributed._ops import fm_predict as fm_predict
from gpustat.distributed._ops import fwfm_predict as fwfm_predict
from gpustat.distributed._ops import joint_dense as joint_dense
from gpustat.distributed._ops import joint_diagonal as joint_diagonal
from gpustat.distributed._ops import joint_gradient as joint_gradient
from gpustat.distributed._ops import joint_hvp as joint_hvp
from gpustat.distributed._ops import ppoly_eval as ppoly_eval
from gpustat.distributed._ops import suff_stats as suff_stats

__all__ = [
    "ROW_AXIS",
    "CapacityError",
    "ShardedBmsRows",
    "ShardedBorderBatch",
    "ShardedBorderSolution",
    "ShardedCSR",
    "ShardedRows",
    "ffm_predict",
    "fit_em",
    "fit_gibbs",
    "fm_predict",
    "fwfm_predict",
    "global_order",
    "init_fm_table",
    "initialize",
    "joint_dense",
    "joint_diagonal",
    "joint_gradient",
    "joint_hvp",
    "make_mesh",
    "map_rows",
    "mesh_size",
    "plan_capacity",
    "ppoly_eval",
    "replicate",
    "row_derivatives",
    "shard_bms_rows",
    "shard_border_batch",
    "shard_csr",
    "shard_fm_table",
    "shard_rows",
    "shard_training_rows",
    "solve_batched_border",
    "suff_stats",
    "sum_rows",
    "train_epoch",
    "train_epoch_model_parallel",
]

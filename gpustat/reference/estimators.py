"""Reference sparse gradient accumulation for factorization-machine training.

Training an FM, FFM or FwFM on a mini-batch produces one contribution row per
nonzero entry of the batch (its linear-term gradient, its touched counter, its
factor gradient); the dense gradient is the sum of the rows that share a
feature index:

    table[i, :] = sum_{e : indices[e] = i} rows[e, :]

Duplicate indices add up. This is the meaning of the Pallas kernel in
:mod:`gpustat.pallas.estimators`.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

__all__ = ["scatter_add_rows_reference"]


def scatter_add_rows_reference(indices: Int[Array, " e"], rows: Float[Array, "e m"],
                               n_targets: int) -> Float[Array, "t m"]:
    """Sum the rows of ``rows`` into a ``(n_targets, m)`` table at ``indices``.

    Args:
        indices: (e,) int target row of each contribution, in ``[0, n_targets)``.
        rows: (e, m) contributions; the table has their dtype.
        n_targets: number of table rows.

    Returns:
        (n_targets, m) table, zero where no index points.
    """
    table = jnp.zeros((n_targets, rows.shape[1]), rows.dtype)
    return table.at[indices].add(rows, mode="promise_in_bounds")

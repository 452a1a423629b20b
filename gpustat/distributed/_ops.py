"""Sharded entry points of the row-wise ops: piecewise evaluation, FM/FFM/FwFM scoring,
mixture statistics and the BMS joint operators.

Each function takes the single-device op's arguments plus a 1-D ``mesh`` and runs
that op on every device's block of rows under ``jax.shard_map``
(:func:`~gpustat.distributed.map_rows` for per-row outputs, which stay
sharded; :func:`~gpustat.distributed.sum_rows` for reductions, one ``psum``).
Validation, dispatch and the Pallas kernels are the single-device op's own:
``backend`` is passed through unchanged. All work under ``jax.jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, ArrayLike, Float

from gpustat import bms, factorization, mixture, piecewise
from gpustat._arrays import row_weights
from gpustat.distributed._csr import ShardedCSR, shard_csr
from gpustat.distributed._mesh import check_blocks, map_rows, row_axis, sum_rows, to_mesh
from gpustat.mixture._validation import check_data, check_params, check_sample_weight

__all__ = [
    "ffm_predict",
    "fm_predict",
    "fwfm_predict",
    "joint_dense",
    "joint_diagonal",
    "joint_gradient",
    "joint_hvp",
    "ppoly_eval",
    "suff_stats",
]


def _leading_rows(name: str, x) -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise ValueError(f"{name} needs a leading row axis to shard, got {name}.shape={x.shape}")
    return x


def ppoly_eval(pp: piecewise.PiecewisePolynomial, x: Float[ArrayLike, " n *s"], mesh: Mesh, *,
               nu: int = 0, backend: str = "auto") -> Float[Array, " n *s_and_t"]:
    """:func:`gpustat.piecewise.ppoly_eval` with x's leading axis split over the mesh.

    Args:
        pp: the piecewise polynomial (replicated on every device).
        x: (n, *s) evaluation points; dtype rules as the single-device op.
        mesh: 1-D mesh (:func:`gpustat.distributed.make_mesh`).
        nu: derivative order.
        backend: passed to :func:`gpustat.piecewise.ppoly_eval`.

    Returns:
        (n, *s, *t) values, sharded along n (when n is a multiple of the device count).
    """
    x = _leading_rows("x", x)
    return map_rows(lambda xb, p: piecewise.ppoly_eval(p, xb, nu=nu, backend=backend),
                    mesh, x, pp)


def _check_params_concretely(op, block_of, X, params, backend: str) -> None:
    """The single-device op's checks of the (replicated) parameters: field id ranges and
    finiteness. Inside ``shard_map`` they are tracers and the op skips its value checks,
    so it is traced here once (``eval_shape``: no computation) closing over them as
    concrete arrays."""
    jax.eval_shape(lambda rows: op(block_of(rows), *params, backend=backend), X)


def _predict(op, X, params, mesh: Mesh, backend: str):
    """Scores of every row of X under ``op(X_block, *params, backend=...)``."""
    params = jax.tree.map(jnp.asarray, params)
    if not isinstance(X, ShardedCSR) and not isinstance(X, factorization.CSR) \
            and not hasattr(X, "tocsr"):
        X = _leading_rows("X", X)
        _check_params_concretely(op, lambda rows: rows, X, params, backend)
        return map_rows(lambda xb, prm: op(xb, *prm, backend=backend), mesh, X, params)
    sharded = X if isinstance(X, ShardedCSR) else shard_csr(X, mesh)
    check_blocks("X", sharded.indptr.shape[0], mesh)
    _check_params_concretely(op, ShardedCSR.local_block, sharded, params, backend)
    axis = row_axis(mesh)

    def block(blocks: ShardedCSR, prm):
        return op(blocks.local_block(), *prm, backend=backend)[: blocks.n_local]

    row_spec = jax.tree.map(lambda _: PartitionSpec(axis), sharded)
    shared = jax.tree.map(lambda _: PartitionSpec(), params)
    out = jax.shard_map(block, mesh=mesh, in_specs=(row_spec, shared),
                        out_specs=PartitionSpec(axis), check_vma=False)(
        sharded, to_mesh(params, mesh, PartitionSpec()))
    return out[: sharded.shape[0]]


def fm_predict(X, w0, w, V, mesh: Mesh, *, backend: str = "auto") -> Array:
    """:func:`gpustat.factorization.fm_predict` with the rows of X split over the mesh.

    Args:
        X: :class:`~gpustat.distributed.ShardedCSR` (from :func:`shard_csr`, built
            once and reused), a CSR / scipy sparse matrix (split on every call), or a
            dense (n, p) array.
        w0, w, V: parameters as for the single-device op, replicated on every device.
        mesh: 1-D mesh.
        backend: passed to the single-device op.

    Returns:
        (n,) or (n, c) scores, sharded along n.
    """
    return _predict(factorization.fm_predict, X, (w0, w, V), mesh, backend)


def ffm_predict(X, field_ids, w0, w, V, mesh: Mesh, *, backend: str = "auto") -> Array:
    """:func:`gpustat.factorization.ffm_predict` with the rows of X split over the mesh.

    Args:
        X: as :func:`fm_predict`.
        field_ids: (p,) int field of each feature; w0, w, V (p, f, k): replicated.
        mesh: 1-D mesh.
        backend: passed to the single-device op.

    Returns:
        (n,) or (n, c) scores, sharded along n.
    """
    return _predict(factorization.ffm_predict, X, (field_ids, w0, w, V), mesh, backend)


def fwfm_predict(X, field_ids, w0, w, V, R, mesh: Mesh, *, backend: str = "auto") -> Array:
    """:func:`gpustat.factorization.fwfm_predict` with the rows of X split over the mesh.

    Args:
        X: as :func:`fm_predict`.
        field_ids: (p,) int field of each feature; w0, w, V (p, k), R (f, f): replicated.
        mesh: 1-D mesh.
        backend: passed to the single-device op.

    Returns:
        (n,) or (n, c) scores, sharded along n.
    """
    return _predict(factorization.fwfm_predict, X, (field_ids, w0, w, V, R), mesh, backend)


def suff_stats(X: Float[ArrayLike, "n p"], params: mixture.MixtureParams, mesh: Mesh,
               sample_weight: Float[ArrayLike, " n"] | None = None, *, backend: str = "auto",
               precision: str = "highest") -> mixture.SuffStats:
    """:func:`gpustat.mixture.suff_stats` over rows split across the mesh, one ``psum``.

    Each device computes the fused E-step statistics of its rows; one ``psum`` of
    k (1 + p + p^2) + 1 numbers adds them. Padding rows carry weight 0.

    Args:
        X: (n, p) data (centre it first, as the single-device op asks).
        params: :class:`~gpustat.mixture.MixtureParams` (k components), replicated.
        mesh: 1-D mesh.
        sample_weight: optional (n,) non-negative weights (default 1).
        backend, precision: passed to the single-device op.

    Returns:
        :class:`~gpustat.mixture.SuffStats`, replicated on every device.
    """
    # the single-device op's value checks (finite X, weights >= 0) see tracers inside
    # shard_map and are skipped there: run them here on the whole input
    X = check_data(X)
    params = check_params(params, X.shape[1], X.dtype)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    w = row_weights(X, w)

    def block(rows, prm):
        xb, wb = rows
        return mixture.suff_stats(xb, prm, wb, backend=backend, precision=precision)

    return sum_rows(block, mesh, (X, w), params)


def joint_hvp(hess: Float[ArrayLike, "n r r"], x: Float[ArrayLike, "n p_m"],
              g: Float[ArrayLike, "n p_g"], v: Float[ArrayLike, "*R p_total"], mesh: Mesh, *,
              backend: str = "auto") -> Array:
    """:func:`gpustat.bms.joint_hvp` with the rows split over the mesh (one ``psum``).

    Args:
        hess: (n, r, r) row Hessians (``RowDerivatives.hess``); x: (n, p_m); g: (n, p_g).
        v: (p_total,) or (R, p_total) directions, replicated.
        mesh: 1-D mesh.
        backend: passed to the single-device op.

    Returns:
        Array of v's shape, replicated. Padding rows have zero Hessians.
    """
    return sum_rows(lambda rows, vv: bms.joint_hvp(*rows, vv, backend=backend), mesh,
                    (hess, x, g), v)


def joint_diagonal(hess: Float[ArrayLike, "n r r"], x: Float[ArrayLike, "n p_m"],
                   g: Float[ArrayLike, "n p_g"], mesh: Mesh, *,
                   backend: str = "auto") -> Float[Array, " p_total"]:
    """:func:`gpustat.bms.joint_diagonal` with the rows split over the mesh (one ``psum``).

    Args:
        hess: (n, r, r); x: (n, p_m); g: (n, p_g).
        mesh: 1-D mesh.
        backend: passed to the single-device op.
    """
    return sum_rows(lambda rows, _: bms.joint_diagonal(*rows, backend=backend), mesh,
                    (hess, x, g))


def joint_dense(hess: Float[ArrayLike, "n r r"], x: Float[ArrayLike, "n p_m"],
                g: Float[ArrayLike, "n p_g"], mesh: Mesh, *,
                backend: str = "auto") -> Float[Array, "p_total p_total"]:
    """:func:`gpustat.bms.joint_dense` with the rows split over the mesh (one ``psum``).

    Args:
        hess: (n, r, r); x: (n, p_m); g: (n, p_g).
        mesh: 1-D mesh.
        backend: passed to the single-device op.
    """
    return sum_rows(lambda rows, _: bms.joint_dense(*rows, backend=backend), mesh,
                    (hess, x, g))


def joint_gradient(derivs: bms.RowDerivatives, x: Float[ArrayLike, "n p_m"],
                   g: Float[ArrayLike, "n p_g"], mesh: Mesh, *,
                   backend: str = "auto") -> Float[Array, " 1+p_total"]:
    """:func:`gpustat.bms.joint_gradient` with the rows split over the mesh (one ``psum``).

    Args:
        derivs: :class:`~gpustat.bms.RowDerivatives` (neglog (n,), grad (n, r)).
        x: (n, p_m); g: (n, p_g).
        mesh: 1-D mesh.
        backend: passed to the single-device op.
    """
    if not isinstance(derivs, bms.RowDerivatives):
        raise TypeError(f"derivs must be RowDerivatives, got {type(derivs).__name__}")

    def block(rows, _):
        neglog, grad, xb, gb = rows
        n = neglog.shape[0]
        local = bms.RowDerivatives(neglog, grad, jnp.zeros((n, 0, 0), grad.dtype),
                                   jnp.zeros((n,), jnp.int32))
        return bms.joint_gradient(local, xb, gb, backend=backend)

    return sum_rows(block, mesh, (derivs.neglog, derivs.grad, x, g))

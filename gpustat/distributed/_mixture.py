"""Data-parallel mixture drivers: EM and blocked Gibbs with rows split over a mesh.

These are the single-device loops of :mod:`gpustat.mixture` run inside one
``jax.shard_map`` with their ``axis_name``: each device keeps its block of rows resident,
computes the fused E-step statistics of its block (Pallas kernel on GPUs) and one
``lax.psum`` of the :class:`~gpustat.mixture.SuffStats` makes them global; the
closed-form M-step then runs replicated on every device, so the parameters never leave
the devices and every device takes the same branch of the ``while_loop``. The data are
centred by their global weighted mean (one ``psum``) as on one device.

Gibbs: each device draws the labels of its rows from its own key
(``fold_in(key, device index)``), the label statistics are ``psum``-ed, and the
conjugate draws (NIW, sticks, alpha) use one key shared by every device, so the
replicated parameters stay identical.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float

from gpustat import mixture
from gpustat._arrays import row_weights
from gpustat.distributed._mesh import pad_rows, padded_rows, row_axis, to_mesh
from gpustat.mixture import _ops as mixture_ops
from gpustat.mixture._em import check_em_arguments, fit_em_rows, weighted_shift
from gpustat.mixture._gibbs import run_chain
from gpustat.mixture._validation import (
    check_data,
    check_params,
)

__all__ = ["fit_em", "fit_gibbs"]


def _rows_in(mesh: Mesh, X, w):
    n_to = padded_rows(X.shape[0], mesh)
    padded = pad_rows(X, n_to), pad_rows(w, n_to, 0)  # padding rows weigh nothing
    return to_mesh(padded, mesh, PartitionSpec(row_axis(mesh)))


def fit_em(X: Float[Array, "n p"], init: mixture.MixtureParams, mesh: Mesh, *,
           sample_weight: Float[Array, " n"] | None = None, tol: float = 1e-3,
           max_iter: int = 100, reg_covar: float = 1e-6,
           weight_prior: mixture.DirichletPrior | mixture.StickBreakingPrior | None = None,
           component_prior: mixture.NIWPrior | None = None, backend: str = "auto",
           precision: str = "highest") -> mixture.EMResult:
    """:func:`gpustat.mixture.fit_em` with the rows of X split over the mesh.

    One ``psum`` of the E-step statistics per iteration; parameters are replicated.
    The same stopping rule (mean log-likelihood change < ``tol``) and status codes
    as the single-device driver, so both give the same fit up to the order of the
    floating-point sums.

    Args:
        X: (n, p) data, float32 or float64. Pass it already sharded with
            :func:`gpustat.distributed.shard_rows` to avoid a transfer, with n a
            multiple of the device count (else the zero rows ``shard_rows`` adds
            would count as data); otherwise pass the host array and the driver
            pads with weight-0 rows.
        init: initial :class:`~gpustat.mixture.MixtureParams` (k components); a
            leading (r,) axis on every array runs r restarts batched (``vmap``
            inside ``shard_map``: one ``psum`` of r statistics per iteration) and
            returns the one with the largest final lower bound.
        mesh: 1-D mesh.
        sample_weight: optional (n,) non-negative weights.
        tol, max_iter, reg_covar, weight_prior, component_prior: as the single-device op.
        backend, precision: for the per-device E-step.

    Returns:
        :class:`~gpustat.mixture.EMResult`, replicated on every device.

    Raises:
        ValueError: as :func:`gpustat.mixture.fit_em`.
    """
    X, w, init, settings = check_em_arguments(
        X, init, sample_weight=sample_weight, tol=tol, max_iter=max_iter, reg_covar=reg_covar,
        weight_prior=weight_prior, component_prior=component_prior, backend=backend,
        precision=precision)
    w = row_weights(X, w)
    axis = row_axis(mesh)
    priors = settings.pop("weight_prior"), settings.pop("component_prior")

    def block(X, w, init, priors):
        return fit_em_rows(X, w, init, jnp.asarray(-jnp.inf, X.dtype), weight_prior=priors[0],
                           component_prior=priors[1], axis_name=axis, **settings)

    row, shared = PartitionSpec(axis), PartitionSpec()
    return jax.shard_map(block, mesh=mesh, in_specs=(row, row, shared, shared),
                         out_specs=shared, check_vma=False)(
        *_rows_in(mesh, X, w), *to_mesh((init, priors), mesh, shared))


def fit_gibbs(key, X: Float[Array, "n p"], init: mixture.MixtureParams, mesh: Mesh, *,
              n_sweeps: int = 200, alpha: float = 1.0,
              component_prior: mixture.NIWPrior | None = None,
              weight_prior: mixture.StickBreakingPrior | None = None, sample_alpha: bool = True,
              backend: str = "auto", precision: str = "highest") -> mixture.GibbsResult:
    """Blocked Gibbs sampling of the truncated DP mixture (one chain), rows split over the mesh.

    Args:
        key: PRNG key.
        X: (n, p) data, float32 or float64.
        init: starting full-covariance :class:`~gpustat.mixture.MixtureParams`
            (m components; e.g. a sharded :func:`fit_em` fit).
        mesh: 1-D mesh.
        n_sweeps: sweeps (all recorded).
        alpha: initial stick-breaking concentration.
        component_prior: NIW prior; default ``NIWPrior.weak(X)``.
        weight_prior: stick-breaking prior; default (alpha, 1, 1).
        sample_alpha: resample alpha every sweep.
        backend, precision: for the per-device label and statistics ops.

    Returns:
        :class:`~gpustat.mixture.GibbsResult` with a chain axis of 1, replicated.
    """
    X = check_data(X)
    if n_sweeps < 1:
        raise ValueError(f"n_sweeps must be >= 1, got {n_sweeps=}")
    init = check_params(init, X.shape[1], X.dtype)
    if init.covariance_type != "full":
        raise ValueError(f"fit_gibbs needs full covariances, got {init.covariance_type=!r}")
    dtype = X.dtype
    prior = mixture.NIWPrior.weak(X) if component_prior is None else component_prior
    prior = jax.tree.map(lambda a: jnp.asarray(a, dtype), prior)
    sticks = mixture.StickBreakingPrior(jnp.asarray(alpha, dtype)) if weight_prior is None \
        else weight_prior
    axis = row_axis(mesh)

    path = mixture_ops.resolve_mixture_backend(backend, X.shape[1], "fit_gibbs", precision)

    def chain(X, w, start, prior, sticks, key):
        shift, _ = weighted_shift(X, w, axis)
        prior = dataclasses.replace(prior, mean=prior.mean - shift)
        start = dataclasses.replace(start, means=start.means - shift)
        final, trace = run_chain(key, X - shift, start, prior, sticks, shift,
                                 n_sweeps=n_sweeps, sample_alpha=sample_alpha, path=path,
                                 precision=precision, w=w, axis_name=axis)
        final, trace = jax.tree.map(lambda a: a[None], (final, trace))
        return mixture.GibbsResult(final, *trace)

    row, shared = PartitionSpec(axis), PartitionSpec()
    w = jnp.ones(X.shape[:1], dtype)
    return jax.shard_map(chain, mesh=mesh, in_specs=(row, row, shared, shared, shared, shared),
                         out_specs=shared, check_vma=False)(
        *_rows_in(mesh, X, w), *to_mesh((init, prior, sticks, key), mesh, shared))

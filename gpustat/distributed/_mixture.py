"""Data-parallel mixture drivers: EM and blocked Gibbs with rows split over a mesh.

The whole loop runs inside one ``jax.shard_map``: each device keeps its block of
rows resident, computes the fused E-step statistics of its block
(:func:`gpustat.mixture.suff_stats`, Pallas kernel on GPUs) and one ``lax.psum``
of the :class:`~gpustat.mixture.SuffStats` (k (1 + p + p^2) + 1 numbers) makes them
global; the closed-form M-step then runs replicated on every device, so the
parameters never leave the devices and every device takes the same branch of the
``while_loop``. The data are centred by their global weighted mean (also one
``psum``) as the single-device drivers do.

Gibbs: each device draws the labels of its rows from its own key
(``fold_in(key, device index)``), the label statistics are ``psum``-ed, and the
conjugate draws (NIW, sticks, alpha) use one key shared by every device, so the
replicated parameters stay identical.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float

from gpustat import mixture
from gpustat.distributed._mesh import pad_rows, padded_rows, row_axis, to_mesh
from gpustat.mixture._validation import (
    check_data,
    check_params,
    check_reg_covar,
    check_sample_weight,
)

__all__ = ["fit_em", "fit_gibbs", "gibbs_sweep"]


def _rows_in(mesh: Mesh, X, w):
    n_to = padded_rows(X.shape[0], mesh)
    padded = pad_rows(X, n_to), pad_rows(w, n_to, 0)  # padding rows weigh nothing
    return to_mesh(padded, mesh, PartitionSpec(row_axis(mesh)))


def _global_mean(X, w, axis):
    """The weighted mean of all devices' rows (the drivers' centring shift) and the total
    weight, from one block of rows each."""
    total_w = jax.lax.psum(jnp.sum(w), axis)
    weighted_sum = jax.lax.psum(jnp.matmul(w, X, precision=jax.lax.Precision.HIGHEST), axis)
    return weighted_sum / total_w, total_w


def _em_block(X, w, init, *, axis, tol, max_iter, reg_covar, weight_prior, component_prior,
              backend, precision):
    """The EM loop on one device's rows; statistics are summed over ``axis``."""
    shift, total_w = _global_mean(X, w, axis)
    Xc = X - shift
    prior = None if component_prior is None else dataclasses.replace(
        component_prior, mean=component_prior.mean - shift)

    def stats_of(params):
        local = mixture.suff_stats(Xc, params, w, backend=backend, precision=precision)
        return jax.lax.psum(local, axis)

    def cond(state):
        _, _, n_iter, converged, status, _ = state
        return (n_iter < max_iter) & ~converged & (status == mixture.STATUS_OK)

    def body(state):
        params, lb, n_iter, _, _, trace = state
        stats = stats_of(params)
        new_lb = stats.loglik / total_w
        new = mixture.m_step(stats, covariance_type=params.covariance_type, reg_covar=reg_covar,
                             weight_prior=weight_prior, component_prior=prior)
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(a)) for a in
                                    (new.weights, new.means, new.precisions_cholesky)]))
        params = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, params)
        converged = finite & (jnp.abs(new_lb - lb) < tol)
        status = jnp.where(finite, mixture.STATUS_OK,
                           mixture.STATUS_ILL_DEFINED_COVARIANCE).astype(jnp.int32)
        return params, new_lb, n_iter + 1, converged, status, trace.at[n_iter].set(new_lb)

    start = dataclasses.replace(init, means=init.means - shift)
    state = (start, jnp.asarray(-jnp.inf, X.dtype), jnp.int32(0), jnp.bool_(False),
             jnp.int32(mixture.STATUS_OK), jnp.full((max(max_iter, 1),), jnp.nan, X.dtype))
    params, lb, n_iter, converged, status, trace = jax.lax.while_loop(cond, body, state)
    params = dataclasses.replace(params, means=params.means + shift)
    return mixture.EMResult(params, lb, trace[:max_iter], n_iter, converged, status, lb[None])


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
    X = check_data(X)
    if init.weights.ndim not in (1, 2):
        raise ValueError(f"init.weights must be (k,) or, with restarts, (r, k), got "
                         f"{init.weights.shape=}")
    check_reg_covar(reg_covar)
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter=}")
    batched = init.weights.ndim == 2
    check_params(jax.tree.map(lambda a: a[0], init) if batched else init, X.shape[1], X.dtype)
    init = jax.tree.map(lambda a: jnp.asarray(a, X.dtype), init)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    w = jnp.ones(X.shape[:1], X.dtype) if w is None else w
    axis = row_axis(mesh)
    block = functools.partial(
        _em_block, axis=axis, tol=tol, max_iter=max_iter, reg_covar=reg_covar,
        weight_prior=weight_prior, component_prior=component_prior, backend=backend,
        precision=precision)
    if batched:
        block = jax.vmap(block, in_axes=(None, None, 0))
    row, shared = PartitionSpec(axis), PartitionSpec()
    result = jax.shard_map(block, mesh=mesh, in_specs=(row, row, shared), out_specs=shared,
                           check_vma=False)(*_rows_in(mesh, X, w), to_mesh(init, mesh, shared))
    return _best_restart(result) if batched else result


def _best_restart(result: mixture.EMResult) -> mixture.EMResult:
    """The restart with the largest final lower bound among those with status OK."""
    ok = result.status == mixture.STATUS_OK
    best = jnp.argmax(jnp.where(ok, jnp.nan_to_num(result.lower_bound, nan=-jnp.inf), -jnp.inf))
    pick = jax.tree.map(lambda a: a[best], result)
    return dataclasses.replace(pick, status=jnp.min(result.status),
                               restart_lower_bounds=result.lower_bound)


def gibbs_sweep(key, X: Float[Array, "n p"], w: Float[Array, " n"], state: mixture.GibbsState,
                *, axis: str, component_prior: mixture.NIWPrior,
                weight_prior: mixture.StickBreakingPrior, sample_alpha: bool = True,
                backend: str = "auto", precision: str = "highest"):
    """One blocked-Gibbs sweep on a device's block of (centred) rows, inside ``shard_map``.

    Labels come from ``fold_in(k_z, axis_index(axis))``; rows with weight 0
    (padding) are drawn but not counted. Returns (new state, summed loglik, counts),
    identical on every device.
    """
    k_z, k_niw, k_v = jax.random.split(key, 3)
    m = state.params.n_components
    local_key = jax.random.fold_in(k_z, jax.lax.axis_index(axis))
    labels, lp = mixture.sample_labels(local_key, X, state.params, backend=backend,
                                       precision=precision, return_log_prob=True)
    local = mixture.suff_stats_from_labels(X, labels, m, w, backend=backend,
                                           precision=precision)
    stats, loglik = jax.lax.psum((local, jnp.sum(w * lp)), axis)
    drawn = mixture.sample_niw_posterior(k_niw, component_prior, stats)
    v, weights, alpha = mixture.sample_sticks(k_v, stats.counts, weight_prior, state.alpha,
                                              sample_alpha=sample_alpha)
    params = dataclasses.replace(drawn, weights=weights)
    return mixture.GibbsState(params, v, alpha), loglik, stats.counts


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
    m = init.n_components
    axis = row_axis(mesh)

    def chain(X, w, start, prior, sticks, key):
        shift, _ = _global_mean(X, w, axis)
        Xc = X - shift
        prior = dataclasses.replace(prior, mean=prior.mean - shift)
        state = mixture.GibbsState(dataclasses.replace(start, means=start.means - shift),
                                   jnp.zeros((m,), dtype), jnp.asarray(sticks.alpha, dtype))

        def step(state, sweep_key):
            state, loglik, counts = gibbs_sweep(
                sweep_key, Xc, w, state, axis=axis, component_prior=prior, weight_prior=sticks,
                sample_alpha=sample_alpha, backend=backend, precision=precision)
            return state, (loglik, state.alpha, counts, state.params.weights,
                           state.params.means + shift, state.params.covariances)

        final, trace = jax.lax.scan(step, state, jax.random.split(key, n_sweeps))
        final = dataclasses.replace(final, params=dataclasses.replace(
            final.params, means=final.params.means + shift))
        final, trace = jax.tree.map(lambda a: a[None], (final, trace))
        return mixture.GibbsResult(final, *trace)

    row, shared = PartitionSpec(axis), PartitionSpec()
    w = jnp.ones(X.shape[:1], dtype)
    return jax.shard_map(chain, mesh=mesh, in_specs=(row, row, shared, shared, shared, shared),
                         out_specs=shared, check_vma=False)(
        *_rows_in(mesh, X, w), *to_mesh((init, prior, sticks, key), mesh, shared))

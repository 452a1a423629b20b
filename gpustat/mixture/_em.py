"""EM drivers: maximum-likelihood EM, posterior-mode EM (BEM) and streaming mini-batch EM.

Each EM iteration is one fused :func:`gpustat.mixture.suff_stats` pass (E-step and
statistics, O(n p + m p^2) memory) followed by the closed-form :func:`m_step`. The loop is
a ``lax.while_loop`` that stops when the mean log-likelihood changes by less than ``tol``
(scikit-learn's rule); ``n_init`` restarts run batched with ``vmap``. Data are centred by
their (weighted) mean inside the drivers so that covariances formed from raw moments do
not cancel; the returned means are in the original coordinates.

Streaming EM follows Cappe and Moulines (2009): the normalised statistics are averaged
with their step sizes gamma_n = n^-kappa for batch n = 1, 2, ..., i.e. rho_t = (t + 1)^-kappa
for the 0-based step count t (rho_0 = 1: the first batch replaces the zero initial
statistics), and the M-step is applied after every batch.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from gpustat._arrays import row_weights
from gpustat._checks import check_int
from gpustat.mixture import _ops as mixture_ops
from gpustat.mixture._mstep import m_step
from gpustat.mixture._priors import (
    DirichletPrior,
    NIWPrior,
    StickBreakingPrior,
    check_component_prior,
    check_weight_prior,
)
from gpustat.mixture._validation import (
    check_data,
    check_params,
    check_precision,
    check_reg_covar,
    check_sample_weight,
    is_concrete,
)
from gpustat.reference.mixture import MixtureParams, SuffStats

__all__ = [
    "QUICK_COMPILE",
    "STATUS_ILL_DEFINED_COVARIANCE",
    "STATUS_OK",
    "EMResult",
    "OnlineEMState",
    "fit_bem",
    "fit_em",
    "online_em_init",
    "online_em_step",
    "online_params",
]

STATUS_OK = 0
STATUS_ILL_DEFINED_COVARIANCE = 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EMResult:
    """Result of :func:`fit_em` / :func:`fit_bem` (the best restart).

    Attributes:
        params: fitted :class:`MixtureParams` (original coordinates).
        lower_bound: () mean log-likelihood at the last E-step (scikit-learn's lower_bound_).
        lower_bounds: (max_iter,) mean log-likelihood per iteration, NaN after n_iter.
        n_iter: () iterations run.
        converged: () whether the change fell below tol.
        status: () 0 = ok, 1 = a component's covariance became ill-defined (collapsed);
            then ``params`` are those of the last good iteration.
        restart_lower_bounds: (n_init,) final lower bound of every restart.
    """

    params: MixtureParams
    lower_bound: Float[Array, ""]
    lower_bounds: Float[Array, " t"]
    n_iter: Int[Array, ""]
    converged: Bool[Array, ""]
    status: Int[Array, ""]
    restart_lower_bounds: Float[Array, " r"]


def _check_fit_weight(sample_weight, X):
    """``sample_weight`` checked as :func:`check_sample_weight`, and with a positive sum
    when concrete (all zeros made every parameter NaN, reported as status 1)."""
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    if w is not None and is_concrete(w):
        with jax.ensure_compile_time_eval():
            total = float(jnp.sum(w))
        if not total > 0:
            raise ValueError(f"sample_weight must have a positive sum, got sum={total!r}")
    return w


def _weighted_weak_prior(X, w) -> NIWPrior:
    """:meth:`NIWPrior.weak` of X with the moments weighted by the row weights ``w``,
    as it is of X with every row repeated w_i times."""
    mean = jnp.matmul(w, X, precision=jax.lax.Precision.HIGHEST) / jnp.sum(w)
    sd = jnp.sqrt(jnp.matmul(w, (X - mean) ** 2, precision=jax.lax.Precision.HIGHEST)
                  / jnp.sum(w))
    # weak uses only the mean and (population) variance: two rows mean -+ sd have these
    return NIWPrior.weak(jnp.stack([mean - sd, mean + sd]))


def _shift_means(params: MixtureParams, shift) -> MixtureParams:
    return dataclasses.replace(params, means=params.means + shift)


def _is_finite(params: MixtureParams):
    return jnp.all(jnp.isfinite(params.precisions_cholesky)) & jnp.all(
        jnp.isfinite(params.means)) & jnp.all(jnp.isfinite(params.weights))


def _report_iteration(restart, n_iter, lower_bound, change, *, every: int) -> None:
    """Host callback of :func:`fit_em`'s ``report_every``: one line per restart (none for
    ``n_iter < 0``, a step repeated about new pivots)."""
    if int(n_iter) > 0 and int(n_iter) % every == 0:
        print(f"  Iteration {int(n_iter)} (restart {int(restart)})\t lower bound "
              f"{float(lower_bound):.5f}\t ll change {float(change):.5f}", flush=True)


def _far_from_pivot(new: MixtureParams, pivot):
    """True when a component's new mean lies farther than its RMS spread from its pivot
    (S2'/N = Sigma + d d^T then loses more than half its digits to d d^T), or a
    parameter is not finite."""
    spread = {"full": lambda c: jnp.trace(c, axis1=-2, axis2=-1),
              "tied": lambda c: jnp.trace(c), "diag": lambda c: jnp.sum(c, axis=-1),
              "spherical": lambda c: c * pivot.shape[-1]}[new.covariance_type](new.covariances)
    moved = jnp.sum((new.means - pivot) ** 2, axis=-1)
    return ~_is_finite(new) | jnp.any(~(moved <= spread))


def _em_loop(Xc, w, total_w, init, initial_lower_bound, restart, diagonal, *, tol, max_iter,
             reg_covar, weight_prior, component_prior, path, precision, report_every,
             axis_name=None):
    """The EM ``while_loop`` on centred rows ``Xc``; ``axis_name``: rows split over that
    ``shard_map`` axis (statistics summed over it, so every device takes the same branch);
    ``diagonal``: :func:`m_step`'s (None, or the diag model in dense full form).

    Each trip is one fused :func:`suff_stats` pass about a pivot per component (the
    current means; the Triton E-step sums about the origin of the centred data) and the
    M-step. Where a component's new mean lands farther than its spread from that pivot,
    or a parameter is not finite, the trip is not counted and the next one repeats the
    step about the new means (same parameters, same responsibilities), so covariances
    keep their small eigenvalues wherever the components sit; a repeated step is
    accepted as it comes. One E-step and one M-step in the program, whichever trip runs.
    A component whose weight is 0 keeps weight 0.
    """
    dtype = Xc.dtype
    m_step_kwargs = dict(reg_covar=reg_covar, weight_prior=weight_prior,
                         component_prior=component_prior, diagonal=diagonal)
    # their GEMM sums raw moments: m_step's collapse floor applies
    pivoted = path not in ("triton", "mosaic")

    def cond(state):
        _, _, n_iter, converged, status, _, _, _ = state
        return (n_iter < max_iter) & ~converged & (status == STATUS_OK)

    def body(state):
        params, lb, n_iter, _, status, trace, pivot, repeat = state
        pivot_arg = pivot if pivoted else None
        stats = mixture_ops.dispatch_suff_stats(Xc, params, w, path=path, precision=precision,
                                                pivot=pivot_arg)
        if axis_name is not None:
            stats = jax.lax.psum(stats, axis_name)
        new = m_step(stats, covariance_type=params.covariance_type, pivot=pivot_arg,
                     **m_step_kwargs)
        # a component of weight 0 has no responsibility and keeps weight 0 (the
        # estimator's absent components, padding its count up to a shared program's)
        alive = jnp.where(params.weights > 0, new.weights, 0)
        new = dataclasses.replace(new, weights=alive / jnp.sum(alive))
        again = (~repeat & _far_from_pivot(new, params.means)) if pivoted else jnp.bool_(False)
        new_lb = stats.loglik / total_w
        ok = _is_finite(new)
        accept = ~again & ok
        if report_every:
            jax.debug.callback(functools.partial(_report_iteration, every=report_every),
                               restart, jnp.where(again, -1, n_iter + 1), new_lb, new_lb - lb)
        done = ~again
        kept = jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, params)
        next_pivot = jnp.where(again, jnp.where(jnp.isfinite(new.means), new.means,
                                                params.means), kept.means)
        return (kept, jnp.where(done, new_lb, lb), n_iter + done.astype(jnp.int32),
                done & ok & (jnp.abs(new_lb - lb) < tol),
                jnp.where(done & ~ok, STATUS_ILL_DEFINED_COVARIANCE, status).astype(jnp.int32),
                jnp.where(done, trace.at[n_iter].set(new_lb), trace), next_pivot, again)

    state = (init, jnp.asarray(initial_lower_bound, dtype), jnp.int32(0), jnp.bool_(False),
             jnp.int32(STATUS_OK), jnp.full((max(max_iter, 1),), jnp.nan, dtype), init.means,
             jnp.bool_(False))
    params, lb, n_iter, converged, status, trace, _, _ = jax.lax.while_loop(cond, body, state)
    return params, lb, n_iter, converged, status, trace[:max_iter]


def fit_em(X: Float[Array, "n p"], init: MixtureParams, *,
           sample_weight: Float[Array, " n"] | None = None, tol: float = 1e-3,
           max_iter: int = 100, reg_covar: float = 1e-6,
           weight_prior: DirichletPrior | StickBreakingPrior | None = None,
           component_prior: NIWPrior | None = None, initial_lower_bound: float = -jnp.inf,
           backend: str = "auto", precision: str = "highest",
           report_every: int = 0) -> EMResult:
    """Fit a Gaussian mixture by EM (MLE, or MAP with priors) from given initial parameters.

    Args:
        X: (n, p) data, float32 or float64 (16-bit computes in float32).
        init: initial :class:`MixtureParams`; a leading (r,) axis on every array runs r
            restarts batched (e.g. from :func:`gpustat.mixture.initialize`); the restart
            with the largest final lower bound is returned. A component of initial
            weight 0 takes no part (it keeps weight 0).
        sample_weight: optional (n,) non-negative row weights.
        tol: stop when the mean log-likelihood changes by less than tol.
        max_iter: maximum number of iterations (0 returns ``init``).
        reg_covar: non-negative value added to covariance diagonals.
        weight_prior: Dirichlet or stick-breaking prior for MAP weights (BEM).
        component_prior: normal-inverse-Wishart prior for MAP means/covariances (full only).
        initial_lower_bound: lower bound before the first iteration (warm starts).
        backend: "auto", "pallas", "reference", "interpret", "triton" or "mosaic" (for the
            E-step).
        precision: float32 matmul precision of the kernels, "highest", "tf32x3" or "f16x3"
            (the Triton E-step: float32, m <= 256; :func:`gpustat.mixture.suff_stats`).
        report_every: print every restart's iteration, lower bound and change every this
            many iterations (a host callback; 0, the default, prints nothing).

    Returns:
        :class:`EMResult`. Compiled once per static setting (tol, max_iter, reg_covar,
        backend, precision); works under ``jax.jit`` and ``jax.vmap``. A collapsing component
        is reported by ``status == 1``, not an exception.
    """
    X, w, init, settings = check_em_arguments(
        X, init, sample_weight=sample_weight, tol=tol, max_iter=max_iter, reg_covar=reg_covar,
        weight_prior=weight_prior, component_prior=component_prior, backend=backend,
        precision=precision, report_every=report_every)
    return fit_em_rows_jit(X, w, init, jnp.asarray(initial_lower_bound, X.dtype), **settings)


def check_em_arguments(X, init, *, sample_weight, tol, max_iter, reg_covar, weight_prior,
                       component_prior, backend, precision, report_every=0):
    """Validate :func:`fit_em`'s arguments once: (X, w, init, the keyword settings of
    :func:`fit_em_rows`), with the backend resolved to its path."""
    X = check_data(X)
    check_reg_covar(reg_covar)
    if not (isinstance(tol, numbers.Real) and tol >= 0):  # NaN never converged
        raise ValueError(f"tol must be a non-negative number, got {tol=}")
    max_iter = check_int(max_iter, "max_iter", 0)
    if init.weights.ndim not in (1, 2):
        raise ValueError(f"init.weights must be (k,) or, with restarts, (r, k), got "
                         f"{init.weights.shape=}")
    batched = init.weights.ndim == 2
    one = jax.tree.map(lambda a: a[0], init) if batched else init
    check_params(one, X.shape[1], X.dtype)
    init = jax.tree.map(lambda a: jnp.asarray(a, X.dtype), init)
    w = _check_fit_weight(sample_weight, X)
    weight_prior = check_weight_prior(weight_prior, X.dtype)
    component_prior = check_component_prior(component_prior, X.shape[1], X.dtype)
    check_precision(precision)
    path = mixture_ops.resolve_mixture_backend(backend, X.shape[1], "fit_em", precision,
                                               dtype=X.dtype, n_components=one.n_components)
    return X, w, init, dict(weight_prior=weight_prior, component_prior=component_prior,
                            tol=tol, max_iter=max_iter, reg_covar=reg_covar, path=path,
                            precision=precision,
                            report_every=check_int(report_every, "report_every", 0))


def weighted_shift(X, w, axis_name=None):
    """(the weighted mean of the rows, the total weight): the drivers' centring shift;
    with ``axis_name``, of every device's block of rows (one ``psum``)."""
    weights = row_weights(X, w)
    total_w = jnp.sum(weights)
    weighted_sum = jnp.matmul(weights, X, precision=jax.lax.Precision.HIGHEST)
    if axis_name is not None:
        total_w, weighted_sum = jax.lax.psum((total_w, weighted_sum), axis_name)
    return weighted_sum / total_w, total_w


def fit_em_rows(X, w, init, initial_lower_bound, diagonal=None, *, tol, max_iter, reg_covar,
                weight_prior, component_prior, path, precision, report_every=0,
                axis_name=None) -> EMResult:
    """EM on validated rows: centring, the loop (restarts vmapped), the best restart.

    The single-device driver calls it under ``jit``; :mod:`gpustat.distributed` calls it
    inside ``shard_map`` with ``axis_name``, each device holding a block of rows.
    ``diagonal``: optional bool () (traced under ``jit``) with full ``init``: fit the diag
    model in dense form where true (:func:`m_step`'s ``diagonal``), so that one program
    fits both.
    """
    shift, total_w = weighted_shift(X, w, axis_name)
    Xc = X - shift
    if component_prior is not None:
        component_prior = dataclasses.replace(component_prior,
                                              mean=component_prior.mean - shift)

    def run(start, restart):
        out = _em_loop(Xc, w, total_w, _shift_means(start, -shift), initial_lower_bound,
                       restart, diagonal, tol=tol, max_iter=max_iter, reg_covar=reg_covar,
                       weight_prior=weight_prior, component_prior=component_prior,
                       path=path, precision=precision, report_every=report_every,
                       axis_name=axis_name)
        return (_shift_means(out[0], shift), *out[1:])

    if init.weights.ndim == 2 and init.weights.shape[0] == 1:
        # one restart runs unbatched: vmap's batching of the loop would trace it again
        init = jax.tree.map(lambda a: a[0], init)
    if init.weights.ndim == 1:
        params, lb, n_iter, converged, status, trace = run(init, 0)
        return EMResult(params, lb, trace, n_iter, converged, status, lb[None])
    restarts = jnp.arange(init.weights.shape[0])
    params, lb, n_iter, converged, status, trace = jax.vmap(run)(init, restarts)
    best = jnp.argmax(jnp.where(status == STATUS_OK, jnp.nan_to_num(lb, nan=-jnp.inf),
                                -jnp.inf))
    pick = lambda a: a[best]  # noqa: E731
    return EMResult(jax.tree.map(pick, params), lb[best], trace[best], n_iter[best],
                    converged[best], jnp.min(status), lb)


_FIT_EM_STATIC = ("tol", "max_iter", "reg_covar", "path", "precision", "report_every",
                  "axis_name")
fit_em_rows_jit = jax.jit(fit_em_rows, static_argnames=_FIT_EM_STATIC)
# XLA options for a program whose run is short next to its compilation (small data on a
# CPU): without LLVM's optimisation passes it compiles about a third faster
QUICK_COMPILE = {"xla_backend_optimization_level": 0}
fit_em_rows_quick_jit = jax.jit(fit_em_rows, static_argnames=_FIT_EM_STATIC,
                                compiler_options=QUICK_COMPILE)


def fit_bem(X: Float[Array, "n p"], init: MixtureParams, *, alpha: float = 1.0,
            component_prior: NIWPrior | None = None, **kwargs) -> EMResult:
    """Posterior-mode EM ("BEM") of the truncated Dirichlet-process mixture.

    MAP weights under stick-breaking(alpha) and MAP means/covariances under a
    normal-inverse-Wishart prior (default :meth:`NIWPrior.weak` of X). Full covariances.

    Args:
        X: (n, p) data.
        init: initial :class:`MixtureParams` (``covariance_type="full"``).
        alpha: stick-breaking concentration.
        component_prior: NIW prior; default weakly informative (:meth:`NIWPrior.weak`),
            centred on X, with X's moments weighted by ``sample_weight`` when given.
        **kwargs: passed to :func:`fit_em` (sample_weight, tol, max_iter, backend, ...).

    Returns:
        :class:`EMResult`.
    """
    X = check_data(X)
    if component_prior is not None:
        prior = component_prior
    elif kwargs.get("sample_weight") is None:
        prior = NIWPrior.weak(X)
    else:  # rows of weight 0 (padding) changed the default prior and with it the fit
        prior = _weighted_weak_prior(X, _check_fit_weight(kwargs["sample_weight"], X))
    return fit_em(X, init, weight_prior=StickBreakingPrior(jnp.asarray(alpha, X.dtype)),
                  component_prior=prior, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OnlineEMState:
    """State of streaming EM: per-row averaged statistics, parameters, shift, step count."""

    stats: SuffStats
    params: MixtureParams
    shift: Float[Array, " p"]
    step: Int[Array, ""]


def online_em_init(X_first: Float[Array, "b p"], params: MixtureParams) -> OnlineEMState:
    """Streaming-EM state from initial parameters; the first batch (b, p) fixes the centring."""
    X_first = check_data(X_first, "X_first")
    params = check_params(params, X_first.shape[1], X_first.dtype)
    shift = jnp.mean(X_first, axis=0)
    k, p = params.means.shape
    zero = SuffStats(jnp.zeros(k, X_first.dtype), jnp.zeros((k, p), X_first.dtype),
                     jnp.zeros((k, p, p), X_first.dtype), jnp.zeros((), X_first.dtype))
    return OnlineEMState(zero, _shift_means(params, -shift), shift, jnp.int32(0))


def online_em_step(state: OnlineEMState, X_batch: Float[Array, "b p"], *,
                   reg_covar: float = 1e-6, kappa: float = 0.6, backend: str = "auto",
                   precision: str = "highest") -> tuple[OnlineEMState, Float[Array, ""]]:
    """One mini-batch of streaming EM: s <- (1 - rho) s + rho stats(batch) / b, then M-step.

    Args:
        state: :class:`OnlineEMState` from :func:`online_em_init` or a previous step.
        X_batch: (b, p) mini-batch, p as in the state; a narrower float dtype is cast up
            to the state's, a wider one raises.
        reg_covar: non-negative value added to covariance diagonals.
        kappa: step-size exponent in (0.5, 1]; rho_t = (t + 1)^-kappa with t = ``state.step``
            (0 for the first batch: rho_0 = 1, then 2^-kappa, 3^-kappa, ...).
        backend: E-step backend.
        precision: float32 matmul precision of the kernels.

    Returns:
        (new state, mean log-likelihood of the batch under the old parameters).
    """
    X_batch = check_data(X_batch, "X_batch")
    p = state.params.n_features
    if X_batch.shape[1] != p:
        raise ValueError(f"X_batch must have the state's p={p} features, got "
                         f"{X_batch.shape=}")
    dtype = state.params.means.dtype
    if jnp.finfo(X_batch.dtype).bits > jnp.finfo(dtype).bits:
        raise ValueError(f"X_batch must not be wider than the state's {dtype} (it would "
                         f"change the state's dtype), got {X_batch.dtype=}")
    X_batch = X_batch.astype(dtype)
    check_reg_covar(reg_covar)
    if not 0.5 < kappa <= 1:
        raise ValueError(f"kappa must lie in (0.5, 1], got {kappa=}")
    check_precision(precision)
    path = mixture_ops.resolve_mixture_backend(backend, p, "online_em_step", precision,
                                               dtype=dtype,
                                               n_components=state.params.n_components)
    return _online_em_step_jit(state, X_batch, reg_covar=reg_covar, kappa=kappa, path=path,
                               precision=precision)


@functools.partial(jax.jit, static_argnames=("reg_covar", "kappa", "path", "precision"))
def _online_em_step_jit(state, X_batch, *, reg_covar, kappa, path, precision):
    Xc = X_batch - state.shift
    stats = mixture_ops.dispatch_suff_stats(Xc, state.params, None, path=path,
                                            precision=precision)
    batch = stats.scale(1.0 / X_batch.shape[0])
    rho = ((state.step + 1.0) ** -kappa).astype(Xc.dtype)  # 1 at step 0: replaces the zeros
    averaged = state.stats.scale(1 - rho) + batch.scale(rho)
    # m_step pads counts with 10 eps, so it needs counts on the data's scale, not per row
    params = m_step(averaged.scale(X_batch.shape[0]),
                    covariance_type=state.params.covariance_type, reg_covar=reg_covar)
    return OnlineEMState(averaged, params, state.shift, state.step + 1), batch.loglik


def online_params(state: OnlineEMState) -> MixtureParams:
    """Current parameters of a streaming-EM state in the original coordinates."""
    return _shift_means(state.params, state.shift)

"""Blocked Gibbs sampler of the truncated Dirichlet-process Gaussian mixture.

One sweep (Ishwaran and James 2001; Suchard et al. 2010, section 2.2):

1. z_i ~ Categorical(r_i.): fused densities + inverse-CDF draw, one uniform per row
   (:func:`gpustat.mixture.sample_labels`), and
2. (N_j, sum x, sum x x^T) of the labels (:func:`gpustat.mixture.suff_stats_from_labels`),
   both in the same kernel pass on the kernel backends;
3. Sigma_j^-1 ~ Wishart(nu_n, Phi_n^-1) (Bartlett decomposition), mu_j | Sigma_j ~
   N(m_n, Sigma_j / kappa_n) (:func:`sample_niw_posterior`);
4. V_j ~ Beta(1 + N_j, alpha + sum_{l>j} N_l), V_m = 1, w = stick weights;
   alpha ~ Gamma(m + e - 1, f - sum_{j<m} log(1 - V_j)) (:func:`sample_sticks`).

Chains run by ``vmap`` over keys; every sweep records log-likelihood, alpha, counts,
weights, means and covariances (relabelled and summarised by
:mod:`gpustat.mixture._posterior`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from gpustat._checks import check_int
from gpustat.mixture import _ops as mixture_ops
from gpustat.mixture import _random as random_draws
from gpustat.mixture._initialize import initialize
from gpustat.mixture._priors import (
    NIWPrior,
    StickBreakingPrior,
    check_component_prior,
    check_weight_prior,
    niw_posterior,
    stick_weights,
)
from gpustat.mixture._validation import check_data, check_params, check_precision
from gpustat.reference.mixture import MixtureParams, SuffStats

__all__ = ["GibbsResult", "GibbsState", "fit_gibbs", "gibbs_sweep", "sample_niw_posterior",
           "sample_sticks"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GibbsState:
    """One chain's state: parameters, stick fractions V (m,) and concentration alpha."""

    params: MixtureParams
    sticks: Float[Array, " m"]
    alpha: Float[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GibbsResult:
    """Final states and per-sweep traces of c chains over t sweeps (original coordinates).

    Attributes:
        state: final :class:`GibbsState` with a leading (c,) axis.
        loglik: (c, t) sum_i log p(x_i) under the parameters each sweep's labels came from.
        alpha: (c, t) concentration draws.
        counts: (c, t, m) component sizes N_j.
        weights: (c, t, m) weight draws.
        means: (c, t, m, p) mean draws.
        covariances: (c, t, m, p, p) covariance draws (the largest trace: c t m p^2
            numbers).

    The components of the traces switch labels between and within chains; summarise them
    through :func:`gpustat.mixture.relabel`.
    """

    state: GibbsState
    loglik: Float[Array, "c t"]
    alpha: Float[Array, "c t"]
    counts: Float[Array, "c t m"]
    weights: Float[Array, "c t m"]
    means: Float[Array, "c t m p"]
    covariances: Float[Array, "c t m p p"]


def _bartlett_upper(key, dof, p, dtype):
    """Upper-triangular B with B B^T ~ Wishart(dof, I).

    The Bartlett factor with its coordinates reversed: B_ii^2 ~ chi2(dof - (p - 1 - i)),
    B_ij ~ N(0, 1) above the diagonal (reversing the coordinates keeps Wishart(dof, I)).
    """
    k_diag, k_off = jax.random.split(key)
    half_dof = (dof - jnp.arange(p - 1, -1, -1, dtype=dtype)) / 2.0
    diag = jnp.sqrt(2.0 * random_draws.gamma(k_diag, half_dof))
    normal = jax.random.normal(k_off, (p, p), dtype)
    return jnp.triu(normal, 1) + jnp.diag(diag)


def sample_niw_posterior(key, prior: NIWPrior, stats: SuffStats) -> MixtureParams:
    """Draw (mu_j, Sigma_j) for every component from its normal-inverse-Wishart posterior.

    With Phi_n = L L^T and B from :func:`_bartlett_upper`, U = L^-T B is upper triangular
    and U U^T ~ Wishart(nu_n, Phi_n^-1): the precision Cholesky factor in scikit-learn's
    convention, drawn with one Cholesky and two triangular solves per component.

    Args:
        key: PRNG key.
        prior: :class:`NIWPrior` (mean (p,), kappa, dof, scale (p, p)).
        stats: :class:`SuffStats` of the labels (counts (m,), sum_x (m, p), sum_xx (m, p, p)).

    Returns:
        :class:`MixtureParams` (full covariance; weights uniform, to be replaced).
    """
    kappa_n, m_n, nu_n, phi_n = niw_posterior(prior, stats)
    k, p = m_n.shape
    dtype = m_n.dtype
    eye = jnp.eye(p, dtype=dtype)
    solve = jax.scipy.linalg.solve_triangular

    def one(key, kappa, mean, nu, phi):
        k_w, k_mu = jax.random.split(key)
        lower = jnp.linalg.cholesky(phi)
        u = solve(lower.T, _bartlett_upper(k_w, nu, p, dtype), lower=False)
        inv_u = solve(u, eye, lower=False)
        covariance = jnp.matmul(inv_u.T, inv_u, precision=jax.lax.Precision.HIGHEST)
        # mu = m_n + U^-T z / sqrt(kappa_n): cov(U^-T z) = (U U^T)^-1 = Sigma
        z = jax.random.normal(k_mu, (p,), dtype)
        mu = mean + jnp.matmul(inv_u.T, z, precision=jax.lax.Precision.HIGHEST) / jnp.sqrt(kappa)
        return mu, covariance, u

    means, covariances, chol = jax.vmap(one)(jax.random.split(key, k), kappa_n, m_n, nu_n, phi_n)
    return MixtureParams(jnp.full((k,), 1.0 / k, dtype), means, covariances, chol, "full")


def sample_sticks(key, counts: Float[Array, " m"], prior: StickBreakingPrior, alpha,
                  *, sample_alpha: bool = True):
    """Draw stick fractions V (m,) given counts, then alpha given V.

    Returns:
        (V (m,) with V_m = 1, weights (m,), alpha ()).
    """
    k_v, k_a = jax.random.split(key)
    dtype = counts.dtype
    later = jnp.cumsum(counts[::-1])[::-1] - counts  # sum_{l > j} N_l
    v = random_draws.beta(k_v, (1.0 + counts).astype(dtype), (alpha + later).astype(dtype))
    tiny = jnp.finfo(dtype).eps
    v = jnp.clip(v, tiny, 1 - tiny).at[-1].set(1.0)
    m = counts.shape[0]
    if sample_alpha:
        rate = prior.alpha_rate - jnp.sum(jnp.log1p(-v[:-1]))
        alpha = random_draws.gamma(k_a, jnp.asarray(prior.alpha_shape + m - 1, dtype)) / rate
    return v, stick_weights(v), alpha


def gibbs_sweep(key, X, state: GibbsState, *, component_prior: NIWPrior,
                weight_prior: StickBreakingPrior, sample_alpha: bool = True,
                path: str = "reference", precision: str = "highest", w=None, axis_name=None):
    """One blocked-Gibbs sweep on (centred) X; returns (new state, loglik, counts).

    ``w``: optional (n,) row weights (0 for padding rows: drawn, not counted).
    ``axis_name``: inside ``shard_map``, X is one device's block of rows; its labels come
    from ``fold_in(key, axis_index)``, the label statistics and log-likelihood are summed
    over the axis and the conjugate draws share one key, so every device holds the same
    state.
    """
    k_z, k_niw, k_v = jax.random.split(key, 3)
    m = state.params.n_components
    if axis_name is not None:
        k_z = jax.random.fold_in(k_z, jax.lax.axis_index(axis_name))
    if w is None:
        _, lp, stats = mixture_ops.dispatch_sample_labels_with_stats(
            k_z, X, state.params, path=path, precision=precision)
        loglik = jnp.sum(lp)
    else:
        labels, lp = mixture_ops.dispatch_sample_labels(k_z, X, state.params, path=path,
                                                        precision=precision,
                                                        return_log_prob=True)
        stats = mixture_ops.dispatch_suff_stats_from_labels(X, labels, m, w, path=path,
                                                            precision=precision)
        loglik = jnp.sum(w * lp)
    if axis_name is not None:
        stats, loglik = jax.lax.psum((stats, loglik), axis_name)
    drawn = sample_niw_posterior(k_niw, component_prior, stats)
    v, weights, alpha = sample_sticks(k_v, stats.counts, weight_prior, state.alpha,
                                      sample_alpha=sample_alpha)
    params = dataclasses.replace(drawn, weights=weights)
    return GibbsState(params, v, alpha), loglik, stats.counts


def run_chain(key, Xc, start: MixtureParams, prior: NIWPrior, sticks_prior, shift, *,
              n_sweeps: int, sample_alpha: bool, path: str, precision: str,
              progress: bool = False, w=None, axis_name=None):
    """One chain of ``n_sweeps`` sweeps on centred rows from ``start`` (centred means):
    (final state, trace (loglik, alpha, counts, weights, means, covariances) per sweep),
    means in the original coordinates (``+ shift``). ``w`` and ``axis_name`` as
    :func:`gibbs_sweep`."""
    dtype = Xc.dtype
    state = GibbsState(start, jnp.zeros((start.n_components,), dtype),
                       jnp.asarray(sticks_prior.alpha, dtype))

    def step(state, sweep):
        sweep_key, index = sweep
        state, loglik, counts = gibbs_sweep(
            sweep_key, Xc, state, component_prior=prior, weight_prior=sticks_prior,
            sample_alpha=sample_alpha, path=path, precision=precision, w=w,
            axis_name=axis_name)
        if progress:
            jax.debug.callback(_report_sweep, index + 1, loglik)
        trace = (loglik, state.alpha, counts, state.params.weights,
                 state.params.means + shift, state.params.covariances)
        return state, trace

    final, trace = jax.lax.scan(step, state, (jax.random.split(key, n_sweeps),
                                              jnp.arange(n_sweeps)))
    final = dataclasses.replace(final, params=dataclasses.replace(
        final.params, means=final.params.means + shift))
    return final, trace


def fit_gibbs(key, X: Float[Array, "n p"], n_components: int, *, n_sweeps: int = 200,
              n_chains: int = 1, init: MixtureParams | None = None, alpha: float = 1.0,
              component_prior: NIWPrior | None = None,
              weight_prior: StickBreakingPrior | None = None, sample_alpha: bool = True,
              backend: str = "auto", precision: str = "highest",
              progress: bool = False) -> GibbsResult:
    """Blocked Gibbs sampling of the truncated DP mixture, ``n_chains`` chains by vmap.

    Args:
        key: PRNG key (split per chain).
        X: (n, p) data, float32 or float64.
        n_components: truncation level m.
        n_sweeps: sweeps per chain (all recorded; discard burn-in yourself).
        n_chains: independent chains c.
        init: starting :class:`MixtureParams` (full; e.g. a BEM fit); default k-means++
            seeds per chain.
        alpha: initial stick-breaking concentration.
        component_prior: NIW prior; default :meth:`NIWPrior.weak` of X (its feature
            variances floored, so a constant feature or identical points give finite
            chains).
        weight_prior: stick-breaking prior with Gamma(e, f) on alpha; default (alpha, 1, 1).
        sample_alpha: resample alpha every sweep.
        backend: "auto", "pallas", "reference" or "interpret" for the label/statistics ops.
        precision: float32 matmul precision of the kernels.
        progress: show a progress bar of the sweeps (tqdm; every chain reports each sweep
            to the host as it ends, so it costs a host callback a sweep). Eager calls
            only: the bar closes when the draws are ready.

    Returns:
        :class:`GibbsResult` with (c, t, ...) traces; :func:`gpustat.mixture.relabel`
        drops the burn-in and undoes label switching before summaries and ArviZ.
    """
    X = check_data(X)
    check_precision(precision)
    n_components = check_int(n_components, "n_components", 1)
    n_sweeps = check_int(n_sweeps, "n_sweeps", 1)
    n_chains = check_int(n_chains, "n_chains", 1)
    path = mixture_ops.resolve_mixture_backend(backend, X.shape[1], "fit_gibbs", precision)
    if init is not None:
        init = _check_init(init, X, n_components)
    component_prior = check_component_prior(component_prior, X.shape[1], X.dtype)
    sticks_prior = check_weight_prior(
        StickBreakingPrior(alpha) if weight_prior is None else weight_prior, X.dtype)
    if not isinstance(sticks_prior, StickBreakingPrior):
        raise TypeError(f"weight_prior must be a StickBreakingPrior or None, got "
                        f"{type(weight_prior).__name__}")
    run = functools.partial(_fit_gibbs_jit, key, X, init, component_prior, sticks_prior,
                            n_components=n_components, n_sweeps=n_sweeps, n_chains=n_chains,
                            sample_alpha=sample_alpha, path=path, precision=precision,
                            progress=bool(progress))
    if not progress:
        return run()
    with _sweep_bar(n_sweeps, n_chains):
        return jax.block_until_ready(run())


# the bar the running fit_gibbs call reports to (None between calls)
_active_bar = None


@contextlib.contextmanager
def _sweep_bar(n_sweeps: int, n_chains: int):
    """A tqdm bar of ``n_sweeps`` that :func:`_report_sweep` advances while it is open."""
    global _active_bar
    from tqdm.auto import tqdm

    with tqdm(total=n_sweeps, desc=f"Gibbs ({n_chains} chain{'s' * (n_chains > 1)})",
              unit="sweep") as bar:
        _active_bar = bar
        try:
            yield bar
        finally:
            _active_bar = None


def _report_sweep(done, loglik) -> None:
    """Host callback: ``done`` sweeps of one chain have ended (chains report separately;
    the bar shows the furthest). ``loglik``, the sweep's output, is passed only so that
    the report waits for the sweep."""
    del loglik
    bar = _active_bar
    if bar is not None and int(done) > bar.n:
        bar.update(int(done) - bar.n)


def _check_init(init, X, n_components: int) -> MixtureParams:
    """``init`` as full-covariance parameters of ``n_components`` components on X's p."""
    init = check_params(init, X.shape[1], X.dtype)
    if init.covariance_type != "full":
        raise ValueError(f"init must have covariance_type='full' (the NIW draws are full), "
                         f"got {init.covariance_type=!r}")
    if init.n_components != n_components:
        raise ValueError(f"init must have {n_components=} components, got "
                         f"{init.n_components=}")
    return init


@functools.partial(jax.jit, static_argnames=("n_components", "n_sweeps", "n_chains",
                                             "sample_alpha", "path", "precision", "progress"))
def _fit_gibbs_jit(key, X, init, component_prior, sticks_prior, *, n_components, n_sweeps,
                   n_chains, sample_alpha, path, precision, progress):
    dtype = X.dtype
    shift = jnp.mean(X, axis=0)
    Xc = X - shift
    prior = NIWPrior.weak(X) if component_prior is None else component_prior
    prior = jax.tree.map(lambda a: jnp.asarray(a, dtype), prior)
    prior = dataclasses.replace(prior, mean=prior.mean - shift)
    # separate streams for the seeding and the chains: initialize splits its key into
    # one per restart, which were the chains' own keys when both came from ``key``
    init_key, chains_key = jax.random.split(key)
    keys = jax.random.split(chains_key, n_chains)
    if init is None:
        starts = initialize(init_key, Xc, n_components, method="k-means++", n_init=n_chains,
                            reg_covar=1e-6)
        starts = jax.vmap(lambda s: MixtureParams.from_covariances(
            s.weights, s.means, s.covariances + jnp.diag(jnp.diag(prior.scale)), "full"))(starts)
    else:
        one = dataclasses.replace(init, means=init.means - shift)
        starts = jax.tree.map(lambda a: jnp.broadcast_to(a, (n_chains, *a.shape)), one)

    def chain(chain_key, start):
        return run_chain(chain_key, Xc, start, prior, sticks_prior, shift, n_sweeps=n_sweeps,
                         sample_alpha=sample_alpha, path=path, precision=precision,
                         progress=progress)

    final, trace = jax.vmap(chain)(keys, starts)
    return GibbsResult(final, *trace)


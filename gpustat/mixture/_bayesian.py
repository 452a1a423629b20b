"""``BayesianGaussianMixture``: scikit-learn's variational Bayesian mixture on the E-step kernels.

Mean-field variational inference for a Gaussian mixture (Bishop 2006, *Pattern
Recognition and Machine Learning*, sec. 10.2; the truncated Dirichlet process of Blei and
Jordan 2006, *Variational inference for Dirichlet process mixtures*, Bayesian Analysis
1(1)), with scikit-learn's parameterisation, update formulas and lower bound. The
posterior of component j is Dirichlet (or Beta sticks) on the weights, N(m_j, (beta_j
Lambda_j)^-1) on the mean and Wishart(nu_j, W_j) on the precision Lambda_j. The
variational E-step

    log rho_ij = E[log pi_j] + 1/2 E[log |Lambda_j|] - p / (2 beta_j)
                 - nu_j / 2 (x_i - m_j)^T W_j (x_i - m_j) - p/2 log 2 pi

is a Gaussian log-density with mean m_j and precision nu_j W_j (scikit-learn's
``covariances_`` = (nu_j W_j)^-1) plus a per-component constant

    c_j = E[log pi_j] - p/2 log nu_j + 1/2 (p log 2 + sum_{d<p} psi((nu_j - d) / 2) - p / beta_j),

with E[log pi_j] = psi(a_j) - psi(a_j + b_j) + sum_{l<j} (psi(b_l) - psi(a_l + b_l)) for the
Dirichlet process (sticks Beta(a_j, b_j)) and psi(alpha_j) - psi(sum_l alpha_l) for the
Dirichlet distribution. So every iteration is one pass of the fused E-step kernel
(:func:`gpustat.mixture.suff_stats`) with mixing weights softmax(c): its responsibilities
are the variational ones, its statistics N_j, S1_j, S2_j feed the M-step, and its
log-likelihood is sum_i log sum_j rho_ij - n logsumexp(c). The lower bound's entropy term
comes from the same statistics, with no n x m matrix:

    sum_ij r_ij log r_ij = sum_j [N_j (c_j + log det U_j - p/2 log 2 pi) - 1/2 tr(U_j^T M_j U_j)]
                           - sum_i log sum_j rho_ij,   M_j = sum_i r_ij (x_i - m_j)(x_i - m_j)^T.

The loop (E-step, M-step, bound) runs on the device in ``lax.while_loop``, restarts
batched by ``vmap``; X is centred by its mean first, as the EM drivers do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma, gammaln
from jaxtyping import Array
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from gpustat._checks import is_int
from gpustat.mixture._em import _report_iteration
from gpustat.mixture._estimator import _is_real, check_settings, mixture_settings, sample_mixture
from gpustat.mixture._initialize import kmeans_labels, kmeans_plusplus
from gpustat.mixture._mstep import _mle_covariances
from gpustat.mixture._ops import (
    dispatch_suff_stats,
    log_prob,
    mvn_logpdf,
    resolve_mixture_backend,
    responsibilities,
)
from gpustat.mixture._priors import stick_weights
from gpustat.mixture._validation import check_data, check_positive_definite, integers_as_float
from gpustat.reference.mixture import (
    MixtureParams,
    SuffStats,
    full_precision_cholesky,
    log_det_precision_cholesky,
    precisions_cholesky_from_covariances,
    suff_stats_from_labels,
    suff_stats_from_responsibilities,
)

__all__ = ["WEIGHT_PRIOR_TYPES", "BayesianGaussianMixture"]

WEIGHT_PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
# the E-step is the Pallas kernels' (or the reference); the Triton path's "f16x3" is not taken
_PRECISIONS = ("highest", "tf32x3")
_KMEANS_MAX_ITER = 100
_EXACT = jax.lax.Precision.HIGHEST


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Prior:
    """Priors in the fitting dtype: alpha_0 (), beta_0 (), m_0 (p,), nu_0 (), Psi_0 (type shape)."""

    weight_concentration: Array
    mean_precision: Array
    mean: Array
    degrees_of_freedom: Array
    covariance: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Posterior:
    """Variational posterior: weight concentrations (a (m,), b (m,); the Dirichlet
    distribution's alpha in ``conc_a``, ``conc_b`` unused), beta (m,), means m (m, p),
    nu ((m,), () for "tied"), covariances (nu W)^-1 and their precision Cholesky factors."""

    conc_a: Array
    conc_b: Array
    mean_precision: Array
    means: Array
    degrees_of_freedom: Array
    covariances: Array
    precisions_cholesky: Array
    covariance_type: str = dataclasses.field(metadata=dict(static=True))

    def shifted(self, shift) -> _Posterior:
        """The posterior of the data moved by ``shift`` (p,): only the means move."""
        return dataclasses.replace(self, means=self.means + shift)

    def mixture(self, weights) -> MixtureParams:
        """The Gaussian mixture of these means and covariances with the given weights."""
        return MixtureParams(weights, self.means, self.covariances, self.precisions_cholesky,
                             self.covariance_type)


def _expected_log_weights(post: _Posterior, prior_type: str):
    """(m,) E[log pi_j] under the Dirichlet process (Beta sticks) or Dirichlet posterior."""
    if prior_type == "dirichlet_process":
        digamma_sum = digamma(post.conc_a + post.conc_b)
        tail = jnp.cumsum(digamma(post.conc_b) - digamma_sum)[:-1]
        return digamma(post.conc_a) - digamma_sum + jnp.concatenate([jnp.zeros(1, tail.dtype),
                                                                     tail])
    return digamma(post.conc_a) - digamma(jnp.sum(post.conc_a))


def _dof(post: _Posterior):
    """(m,) nu_j (the tied posterior's one nu repeated)."""
    return jnp.broadcast_to(post.degrees_of_freedom, post.mean_precision.shape)


def _log_offsets(post: _Posterior, prior_type: str):
    """(m,) c_j: log rho_ij = log N(x_i | m_j, covariances_j) + c_j."""
    p = post.means.shape[-1]
    nu = _dof(post)
    log_lambda = p * math.log(2.0) + jnp.sum(
        digamma(0.5 * (nu[:, None] - jnp.arange(p, dtype=nu.dtype))), axis=1)
    return (_expected_log_weights(post, prior_type) - 0.5 * p * jnp.log(nu)
            + 0.5 * (log_lambda - p / post.mean_precision))


def _density_params(post: _Posterior, offsets) -> MixtureParams:
    """The E-step's mixture: the posterior's means and covariances, weights softmax(c)."""
    return post.mixture(jax.nn.softmax(offsets))


def _vb_m_step(stats: SuffStats, prior: _Prior, *, covariance_type: str, prior_type: str,
               reg_covar) -> _Posterior:
    """Posterior from E-step statistics (scikit-learn's ``_m_step``; N_j = counts + 10 eps)."""
    dtype = stats.counts.dtype
    k = stats.counts.shape[0]
    nk = stats.counts + 10 * jnp.finfo(dtype).eps
    xk = stats.sum_x / nk[:, None]
    sk = _mle_covariances(stats, nk, xk, covariance_type, reg_covar)
    if prior_type == "dirichlet_process":
        later = jnp.concatenate([jnp.cumsum(nk[::-1])[-2::-1], jnp.zeros(1, dtype)])
        conc_a, conc_b = 1.0 + nk, prior.weight_concentration + later
    else:
        conc_a, conc_b = prior.weight_concentration + nk, jnp.zeros_like(nk)
    beta0 = prior.mean_precision
    beta = beta0 + nk
    means = (beta0 * prior.mean + nk[:, None] * xk) / beta[:, None]
    diff = xk - prior.mean
    shrink = nk * beta0 / beta  # N_j beta_0 / beta_j
    if covariance_type == "full":
        nu = prior.degrees_of_freedom + nk
        cov = (prior.covariance + nk[:, None, None] * sk
               + shrink[:, None, None] * diff[:, :, None] * diff[:, None, :])
        cov = cov / nu[:, None, None]
    elif covariance_type == "tied":
        nu = prior.degrees_of_freedom + jnp.sum(nk) / k
        cov = (prior.covariance + sk * jnp.sum(nk) / k
               + jnp.einsum("k,ka,kb->ab", shrink, diff, diff, precision=_EXACT) / k) / nu
    elif covariance_type == "diag":
        nu = prior.degrees_of_freedom + nk
        cov = (prior.covariance + nk[:, None] * sk
               + shrink[:, None] * diff**2) / nu[:, None]
    else:
        nu = prior.degrees_of_freedom + nk
        cov = (prior.covariance + nk * sk + shrink * jnp.mean(diff**2, axis=1)) / nu
    return _Posterior(conc_a, conc_b, beta, means, nu, cov,
                      precisions_cholesky_from_covariances(cov, covariance_type),
                      covariance_type)


def _entropy_sum(stats: SuffStats, params: MixtureParams, offsets):
    """sum_ij r_ij log r_ij of the E-step that produced ``stats`` from the mixture
    ``params`` (weights softmax(c)), from the statistics alone (module docstring)."""
    p = params.n_features
    n_rows_log_z = stats.loglik + jnp.sum(stats.counts) * jax.nn.logsumexp(offsets)
    chol = full_precision_cholesky(params)
    m = params.means
    outer = stats.sum_x[:, :, None] * m[:, None, :]
    scatter = (stats.sum_xx - outer - jnp.swapaxes(outer, 1, 2)
               + stats.counts[:, None, None] * m[:, :, None] * m[:, None, :])
    quad = jnp.einsum("kad,kab,kbd->k", chol, scatter, chol, precision=_EXACT)
    const = offsets + log_det_precision_cholesky(params) - 0.5 * p * math.log(2 * math.pi)
    return jnp.sum(stats.counts * const - 0.5 * quad) - n_rows_log_z


def _lower_bound(entropy_sum, post: _Posterior, prior: _Prior, prior_type: str):
    """scikit-learn's lower bound (constants dropped) after the M-step to ``post``."""
    p = post.means.shape[-1]
    nu = _dof(post)
    log_det = log_det_precision_cholesky(post.mixture(None)) - 0.5 * p * jnp.log(nu)
    log_wishart = -jnp.sum(nu * log_det + nu * p * 0.5 * math.log(2.0) + jnp.sum(
        gammaln(0.5 * (nu[:, None] - jnp.arange(p, dtype=nu.dtype))), axis=1))
    if prior_type == "dirichlet_process":
        # log B(a, b) from gammaln: jax's betaln is off by up to ~1e-6 for arguments ~1e6
        log_norm_weight = -jnp.sum(gammaln(post.conc_a) + gammaln(post.conc_b)
                                   - gammaln(post.conc_a + post.conc_b))
    else:
        log_norm_weight = gammaln(jnp.sum(post.conc_a)) - jnp.sum(gammaln(post.conc_a))
    return (-entropy_sum - log_wishart - log_norm_weight
            - 0.5 * p * jnp.sum(jnp.log(post.mean_precision)))


def _failed_components(precisions_cholesky, covariance_type: str, n_components: int):
    """(m,) True where a component's precision Cholesky factor is not finite (its
    covariance was not positive definite); for "tied" all or none."""
    finite = jnp.isfinite(precisions_cholesky)
    if covariance_type == "tied":
        return jnp.broadcast_to(~jnp.all(finite), (n_components,))
    return ~jnp.all(finite.reshape(n_components, -1), axis=1)


def _vb_loop(Xc, start: _Posterior, prior: _Prior, initial_lower_bound, restart, tol,
             reg_covar, *, prior_type, max_iter, path, precision, report_every):
    """Variational EM from ``start`` until the bound changes by less than tol (device loop);
    a covariance that is not positive definite stops it, keeping the last good posterior,
    with the failed components marked."""
    dtype = Xc.dtype
    k = start.mean_precision.shape[0]
    m_step = functools.partial(_vb_m_step, covariance_type=start.covariance_type,
                               prior_type=prior_type, reg_covar=reg_covar)

    def cond(state):
        _, _, n_iter, converged, failed, _ = state
        return (n_iter < max_iter) & ~converged & ~jnp.any(failed)

    def body(state):
        post, lb, n_iter, _, _, trace = state
        offsets = _log_offsets(post, prior_type)
        params = _density_params(post, offsets)
        stats = dispatch_suff_stats(Xc, params, None, path=path, precision=precision)
        new = m_step(stats, prior)
        new_lb = _lower_bound(_entropy_sum(stats, params, offsets), new, prior, prior_type)
        failed = _failed_components(new.precisions_cholesky, new.covariance_type, k)
        ok = ~jnp.any(failed)
        post = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, post)
        new_lb = jnp.where(ok, new_lb, lb)
        converged = ok & (jnp.abs(new_lb - lb) < tol)
        if report_every:
            jax.debug.callback(functools.partial(_report_iteration, every=report_every),
                               restart, n_iter + 1, new_lb, new_lb - lb)
        return post, new_lb, n_iter + 1, converged, failed, trace.at[n_iter].set(new_lb)

    state = (start, jnp.asarray(initial_lower_bound, dtype), jnp.int32(0), jnp.bool_(False),
             jnp.zeros(k, bool), jnp.full((max_iter,), jnp.nan, dtype))
    return jax.lax.while_loop(cond, body, state)


@functools.partial(jax.jit, static_argnames=("covariance_type", "n_components"))
def _prior_jit(X, user: dict, *, covariance_type: str, n_components: int) -> _Prior:
    """The priors; None entries of ``user`` take scikit-learn's defaults: alpha_0 = 1/m,
    beta_0 = 1, m_0 = mean(X), nu_0 = p, Psi_0 = cov(X) (ddof 1, from centred X; its
    diagonal for "diag", the mean variance for "spherical")."""
    n, p = X.shape
    dtype = X.dtype
    mean = jnp.mean(X, axis=0)
    value = lambda name, default: jnp.asarray(  # noqa: E731
        default if user[name] is None else user[name], dtype)
    cov = user["covariance"]
    if cov is None:
        Xc = X - mean
        if covariance_type in ("full", "tied"):
            cov = jnp.matmul(Xc.T, Xc, precision=_EXACT) / (n - 1)
        else:
            cov = jnp.sum(Xc**2, axis=0) / (n - 1)
            cov = cov if covariance_type == "diag" else jnp.mean(cov)
    return _Prior(value("weight_concentration", 1.0 / n_components),
                  value("mean_precision", 1.0), value("mean", mean),
                  value("degrees_of_freedom", float(p)), jnp.asarray(cov, dtype))


def _centred(X, prior: _Prior):
    """(X - s, the prior with m_0 - s, s), s the mean of X: the fits run centred."""
    shift = jnp.mean(X, axis=0)
    return X - shift, dataclasses.replace(prior, mean=prior.mean - shift), shift


def _initial_stats(key, seeds, Xc, n_components: int, method: str) -> SuffStats:
    """E-step statistics of scikit-learn's initial responsibilities for one restart:
    one-hot at the ``seeds`` rows ("random_from_data"), at k-means++ seeds, at the
    labels of Lloyd's k-means from k-means++ seeds ("kmeans"), or uniform random rows
    normalised to one ("random")."""
    labels = jnp.arange(n_components)
    if method == "random_from_data":
        return suff_stats_from_labels(Xc[seeds], labels, n_components)
    if method == "k-means++":
        return suff_stats_from_labels(Xc[kmeans_plusplus(key, Xc, n_components)], labels,
                                      n_components)
    if method == "kmeans":
        centres = Xc[kmeans_plusplus(key, Xc, n_components)]
        return suff_stats_from_labels(Xc, kmeans_labels(Xc, centres, _KMEANS_MAX_ITER),
                                      n_components)
    resp = jax.random.uniform(key, (Xc.shape[0], n_components), dtype=Xc.dtype)
    return suff_stats_from_responsibilities(Xc, resp / jnp.sum(resp, axis=1, keepdims=True))


@functools.partial(jax.jit, static_argnames=("n_components", "covariance_type", "prior_type",
                                             "method", "n_init"))
def _start_jit(X, user, seeds, key, reg_covar, *, n_components, covariance_type, prior_type,
               method, n_init):
    """The priors (:func:`_prior_jit`), the (n_init,)-batched initial posteriors (original
    coordinates), the M-step of the initial responsibilities' statistics, and their
    (n_init, m) failed-component masks."""
    prior = _prior_jit(X, user, covariance_type=covariance_type, n_components=n_components)
    Xc, centred_prior, shift = _centred(X, prior)
    keys = jax.random.split(key, n_init)
    stats = jax.vmap(lambda k, s: _initial_stats(k, s, Xc, n_components, method))(keys, seeds)
    m_step = functools.partial(_vb_m_step, covariance_type=covariance_type,
                               prior_type=prior_type, reg_covar=reg_covar)
    starts = jax.vmap(lambda s: m_step(s, centred_prior))(stats)
    failed = jax.vmap(lambda c: _failed_components(c, covariance_type, n_components))(
        starts.precisions_cholesky)
    return prior, starts.shifted(shift), failed


@functools.partial(jax.jit, static_argnames=("prior_type",))
def _mixture_of(post: _Posterior, *, prior_type: str):
    """(E-step mixture with weights softmax(c), logsumexp(c), the posterior mean weights)."""
    offsets = _log_offsets(post, prior_type)
    if prior_type == "dirichlet_process":
        weights = stick_weights(post.conc_a / (post.conc_a + post.conc_b))
    else:
        weights = post.conc_a
    return (_density_params(post, offsets), jax.nn.logsumexp(offsets),
            weights / jnp.sum(weights))


@functools.partial(jax.jit, static_argnames=("prior_type", "max_iter", "path", "precision",
                                             "report_every"))
def _fit_jit(X, prior, starts, bounds, tol, reg_covar, *, prior_type, max_iter, path,
             precision, report_every):
    """The restarts' variational loops from the (r,)-batched ``starts`` and their bounds
    (original coordinates): the best restart's posterior and its :func:`_mixture_of`,
    bound, bound trace, iterations and convergence, every restart's (r, m)
    failed-component mask and final bound."""
    Xc, prior, shift = _centred(X, prior)

    def run(post, bound, restart):
        return _vb_loop(Xc, post.shifted(-shift), prior, bound, restart, tol, reg_covar,
                        prior_type=prior_type, max_iter=max_iter, path=path,
                        precision=precision, report_every=report_every)

    post, lb, n_iter, converged, failed, trace = jax.vmap(run)(
        starts, bounds, jnp.arange(bounds.shape[0]))
    # the first restart with the largest bound, as scikit-learn keeps it
    best = jnp.argmax(lb)
    pick = lambda a: a[best]  # noqa: E731
    post = jax.tree.map(pick, post).shifted(shift)
    return (post, _mixture_of(post, prior_type=prior_type), lb[best], trace[best],
            n_iter[best], converged[best], failed, lb)


@functools.partial(jax.jit, static_argnames=("path", "precision"))
def _predict_jit(X, params, *, path, precision):
    log_dens = mvn_logpdf(X, params, backend=path, precision=precision)
    return jnp.argmax(log_dens + jnp.log(params.weights), axis=1)


@functools.partial(jax.jit, static_argnames=("path", "precision"))
def _predict_proba_jit(X, params, *, path, precision):
    return responsibilities(X, params, backend=path, precision=precision)


@functools.partial(jax.jit, static_argnames=("path", "precision"))
def _score_samples_jit(X, params, log_offset, *, path, precision):
    return log_prob(X, params, backend=path, precision=precision) + log_offset


def _raise_if_failed(failed, covariance_type: str) -> None:
    """ValueError naming the components whose covariance is not positive definite in any
    restart (``failed``: (r, m) masks)."""
    bad = np.asarray(failed).any(axis=0)
    if bad.any():
        which = ("the tied covariance" if covariance_type == "tied"
                 else f"components {np.flatnonzero(bad).tolist()}")
        raise ValueError(
            "Fitting the mixture model failed because some components have ill-defined "
            f"empirical covariance: {which} not positive definite (their scatter plus "
            "covariance_prior is singular). Increase reg_covar, or pass a positive definite "
            "covariance_prior.")


def _positive_or_none(value) -> bool:
    return value is None or (_is_real(value) and value > 0)


class BayesianGaussianMixture(DensityMixin, BaseEstimator):
    """Variational Bayesian Gaussian mixture; scikit-learn's ``BayesianGaussianMixture`` API.

    Same constructor, attributes and methods as scikit-learn's (the fitted parameters
    agree with scikit-learn's from the same initial responsibilities, to roundoff), plus
    ``backend`` and ``precision`` for the E-step kernels. Integer settings take Python
    or numpy integers, not bools.

    Args:
        n_components: m, the number of components (the truncation level of the Dirichlet
            process); unneeded components get weights near zero.
        covariance_type: "full", "tied", "diag" or "spherical".
        tol: convergence threshold on the change of the lower bound (a sum over rows).
        reg_covar: non-negative value added to the diagonal of every component's scatter.
        max_iter: iterations per restart (0 returns the initial posterior).
        n_init: restarts, run batched on the device; the one with the largest lower
            bound is kept.
        init_params: initial responsibilities: "kmeans" (Lloyd from k-means++ seeds),
            "k-means++", "random" or "random_from_data" (m distinct random rows, drawn
            with numpy from ``random_state`` exactly as scikit-learn draws them).
        weight_concentration_prior_type: "dirichlet_process" (stick-breaking) or
            "dirichlet_distribution".
        weight_concentration_prior: alpha_0 > 0 (None: 1 / m).
        mean_precision_prior: beta_0 > 0 (None: 1).
        mean_prior: (p,) m_0 (None: the mean of X).
        degrees_of_freedom_prior: nu_0 > p - 1 (None: p).
        covariance_prior: Psi_0: full and tied (p, p) symmetric positive definite, diag
            (p,) positive, spherical a positive number (None: the covariance of X, ddof 1,
            its diagonal, or the mean of its diagonal).
        random_state: None (fresh randomness), an int or a ``numpy.random.RandomState``,
            as in scikit-learn; it seeds the initialisation and ``sample``.
        warm_start: start the next ``fit`` from the current posterior (one restart).
        verbose: 0 silent; >= 1 prints every restart's iteration, lower bound and its change
            every ``verbose_interval`` iterations, and the restarts' final bounds.
        verbose_interval: iterations between those lines.
        backend: E-step backend, "auto", "pallas", "reference" or "interpret".
        precision: float32 matmul precision of the kernels, "highest" or "tf32x3".

    Attributes (after ``fit``), m components and p features: ``weights_`` (m,) (posterior
    mean weights), ``means_`` (m, p), ``covariances_`` and ``precisions_`` (full (m, p, p),
    tied (p, p), diag (m, p), spherical (m,); covariances_ = (nu_j W_j)^-1),
    ``precisions_cholesky_``, ``weight_concentration_prior_``,
    ``weight_concentration_`` ((a (m,), b (m,)) for the Dirichlet process, (m,)
    otherwise), ``mean_precision_prior_``, ``mean_precision_`` (m,), ``mean_prior_`` (p,),
    ``degrees_of_freedom_prior_``, ``degrees_of_freedom_`` ((m,), a float for "tied"),
    ``covariance_prior_``, ``converged_``, ``n_iter_``, ``lower_bound_``,
    ``lower_bounds_``, ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame).

    float32 X is fitted in float32, float64 in float64 (with ``jax_enable_x64``; without
    it float64 is fitted in float32 with a warning); integers and bools become float64
    (float32 without x64). In float32 the lower bound (a sum over rows; its entropy term
    is a difference of two such sums, formed from the statistics) carries roundoff of up
    to ~1e-6 of its magnitude, far above the default ``tol``: pass float64, or a ``tol``
    above that, for convergence to be detected.
    """

    def __init__(self, *, n_components: int = 1, covariance_type: str = "full",
                 tol: float = 1e-3, reg_covar: float = 1e-6, max_iter: int = 100,
                 n_init: int = 1, init_params: str = "kmeans",
                 weight_concentration_prior_type: str = "dirichlet_process",
                 weight_concentration_prior: float | None = None,
                 mean_precision_prior: float | None = None, mean_prior=None,
                 degrees_of_freedom_prior: float | None = None, covariance_prior=None,
                 random_state=None, warm_start: bool = False, verbose: int = 0,
                 verbose_interval: int = 10, backend: str = "auto",
                 precision: str = "highest"):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weight_concentration_prior_type = weight_concentration_prior_type
        self.weight_concentration_prior = weight_concentration_prior
        self.mean_precision_prior = mean_precision_prior
        self.mean_prior = mean_prior
        self.degrees_of_freedom_prior = degrees_of_freedom_prior
        self.covariance_prior = covariance_prior
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.verbose_interval = verbose_interval
        self.backend = backend
        self.precision = precision

    # ------------------------------------------------------------------ validation

    def _check_settings(self) -> None:
        check_settings(self, [
            *mixture_settings(self),
            (self.weight_concentration_prior_type in WEIGHT_PRIOR_TYPES,
             "weight_concentration_prior_type", f"one of {WEIGHT_PRIOR_TYPES}"),
            (_positive_or_none(self.weight_concentration_prior), "weight_concentration_prior",
             "None or a real number > 0"),
            (_positive_or_none(self.mean_precision_prior), "mean_precision_prior",
             "None or a real number > 0"),
            (_positive_or_none(self.degrees_of_freedom_prior), "degrees_of_freedom_prior",
             "None or a real number > 0"),
            (isinstance(self.warm_start, (bool, np.bool_)), "warm_start", "a bool"),
            (is_int(self.verbose) and self.verbose >= 0, "verbose", "an int >= 0"),
            (self.precision in _PRECISIONS, "precision", f"one of {_PRECISIONS}"),
        ])
        check_random_state(self.random_state)  # scikit-learn's ValueError for anything else

    def _check_X(self, X, *, fitting: bool) -> jax.Array:
        # scikit-learn's checks and messages (sparse, complex, object, 1-D, empty, non-finite
        # input, feature count and names), then gpustat's dtype rules
        X = validate_data(self, X, reset=fitting, dtype="numeric",
                          ensure_min_samples=2 if fitting else 1)
        if (X.dtype == np.float64 and not jax.config.jax_enable_x64
                and (fitting or self._params.means.dtype != jnp.float32)):
            warnings.warn("X is float64 but jax_enable_x64 is off: computing in float32 "
                          "(call jax.config.update('jax_enable_x64', True) for float64)",
                          UserWarning, stacklevel=4)
        X = check_data(integers_as_float(X))
        if fitting:
            if X.shape[0] < self.n_components:
                raise ValueError(f"Expected n_samples >= n_components but got n_components = "
                                 f"{self.n_components}, n_samples = {X.shape[0]}")
            return X
        # a narrower X is cast up to the fitted parameters' dtype, never the reverse
        return X.astype(jnp.promote_types(X.dtype, self._params.means.dtype))

    def _user_prior(self, p: int) -> dict:
        """The given priors as float64 numpy arrays (None where not given), checked."""
        if self.degrees_of_freedom_prior is not None and not self.degrees_of_freedom_prior > p - 1:
            raise ValueError(f"The parameter 'degrees_of_freedom_prior' should be greater than "
                             f"{p - 1}, but got {self.degrees_of_freedom_prior:.3f}.")
        mean = cov = None
        if self.mean_prior is not None:
            mean = np.asarray(self.mean_prior, dtype=np.float64)
            if mean.shape != (p,):
                raise ValueError(f"mean_prior must have shape ({p},), got {mean.shape}")
            if not np.all(np.isfinite(mean)):
                raise ValueError("mean_prior must be finite")
        if self.covariance_prior is not None:
            kind = self.covariance_type
            if kind == "spherical":
                if not (_is_real(self.covariance_prior) and self.covariance_prior > 0
                        and math.isfinite(self.covariance_prior)):
                    raise ValueError(f"covariance_prior for covariance_type='spherical' must be "
                                     f"a finite number > 0, got {self.covariance_prior!r}")
            expected = {"full": (p, p), "tied": (p, p), "diag": (p,), "spherical": ()}[kind]
            cov = np.asarray(self.covariance_prior, dtype=np.float64)
            if cov.shape != expected:
                raise ValueError(f"covariance_prior for covariance_type={kind!r} must have "
                                 f"shape {expected}, got {cov.shape}")
            if not np.all(np.isfinite(cov)):
                raise ValueError("covariance_prior must be finite")
            if kind in ("full", "tied"):
                check_positive_definite(cov, "covariance_prior")
            elif np.any(cov <= 0):
                raise ValueError("covariance_prior must be positive")
        return {"weight_concentration": self.weight_concentration_prior,
                "mean_precision": self.mean_precision_prior, "mean": mean,
                "degrees_of_freedom": self.degrees_of_freedom_prior, "covariance": cov}

    # ------------------------------------------------------------------ fitting

    def _path(self, p: int) -> str:
        return resolve_mixture_backend(self.backend, p, "BayesianGaussianMixture",
                                       self.precision)

    def _fit(self, X) -> jax.Array:
        """Validate, fit, set the attributes; returns the checked X."""
        self._check_settings()
        X = self._check_X(X, fitting=True)
        n, p = X.shape
        dtype = X.dtype
        path = self._path(p)
        k = int(self.n_components)
        as_dtype = lambda a: None if a is None else jnp.asarray(a, dtype)  # noqa: E731
        user = {name: as_dtype(value) for name, value in self._user_prior(p).items()}
        reg_covar = jnp.asarray(self.reg_covar, dtype)
        if self.warm_start and hasattr(self, "converged_"):
            prior = _prior_jit(X, user, covariance_type=self.covariance_type, n_components=k)
            starts = jax.tree.map(lambda a: jnp.asarray(a, dtype)[None], self._posterior)
            bounds = jnp.full((1,), self.lower_bound_, dtype)
        else:
            rng = check_random_state(self.random_state)
            n_init = int(self.n_init)
            if self.init_params == "random_from_data":  # scikit-learn's draws from rng
                seeds = np.stack([rng.choice(n, size=k, replace=False) for _ in range(n_init)])
                key = jax.random.key(0)
            else:
                seeds = np.zeros((n_init, k), np.int32)
                key = jax.random.key(rng.randint(np.iinfo(np.int32).max))
            prior, starts, failed = _start_jit(
                X, user, jnp.asarray(seeds, jnp.int32), key, reg_covar, n_components=k,
                covariance_type=self.covariance_type,
                prior_type=self.weight_concentration_prior_type, method=self.init_params,
                n_init=n_init)
            bounds = jnp.full((n_init,), -jnp.inf, dtype)
            _raise_if_failed(failed, self.covariance_type)
        if self.max_iter == 0:  # scikit-learn keeps the last restart's initial posterior
            post = jax.tree.map(lambda a: a[-1], starts)
            mixture = _mixture_of(post, prior_type=self.weight_concentration_prior_type)
            lb, trace, n_iter, converged = -math.inf, [], 0, False
        else:
            post, mixture, lb, trace, n_iter, converged, failed, restart_lbs = _fit_jit(
                X, prior, starts, bounds, jnp.asarray(self.tol, dtype), reg_covar,
                prior_type=self.weight_concentration_prior_type, max_iter=int(self.max_iter),
                path=path, precision=self.precision,
                report_every=int(self.verbose_interval) if self.verbose else 0)
            _raise_if_failed(failed, self.covariance_type)
            if self.verbose:
                print(f"BayesianGaussianMixture: restarts' lower bounds "
                      f"{np.asarray(restart_lbs)}, best {float(lb):.6g}")
        self._set_fitted(post, prior, mixture)
        self.converged_ = bool(converged)
        self.n_iter_ = int(n_iter)
        self.lower_bound_ = float(lb)
        self.lower_bounds_ = [float(v) for v in np.asarray(trace)[:self.n_iter_]]
        if not self.converged_ and self.max_iter > 0:
            warnings.warn("Best performing initialization did not converge. Try different "
                          "init parameters, or increase max_iter, tol, or check for "
                          "degenerate data.", ConvergenceWarning, stacklevel=3)
        return X

    def _set_fitted(self, post: _Posterior, prior: _Prior, mixture) -> None:
        prior_type = self.weight_concentration_prior_type
        self._posterior = post
        self._params, self._log_offset, weights = mixture
        self.weights_ = np.asarray(weights)
        self.means_ = np.asarray(post.means)
        self.covariances_ = np.asarray(post.covariances)
        chol = np.asarray(post.precisions_cholesky)
        self.precisions_cholesky_ = chol
        if self.covariance_type in ("full", "tied"):
            self.precisions_ = chol @ np.swapaxes(chol, -1, -2)
        else:
            self.precisions_ = chol**2
        a = np.asarray(post.conc_a)
        self.weight_concentration_ = ((a, np.asarray(post.conc_b))
                                      if prior_type == "dirichlet_process" else a)
        self.mean_precision_ = np.asarray(post.mean_precision)
        dof = np.asarray(post.degrees_of_freedom)
        self.degrees_of_freedom_ = float(dof) if self.covariance_type == "tied" else dof
        self.weight_concentration_prior_ = float(prior.weight_concentration)
        self.mean_precision_prior_ = float(prior.mean_precision)
        self.mean_prior_ = np.asarray(prior.mean)
        self.degrees_of_freedom_prior_ = float(prior.degrees_of_freedom)
        cov = np.asarray(prior.covariance)
        self.covariance_prior_ = float(cov) if self.covariance_type == "spherical" else cov

    def fit(self, X, y=None) -> BayesianGaussianMixture:
        """Fit the variational posterior (``n_init`` batched restarts, the best kept).

        Args:
            X: (n, p) data, finite, n >= max(2, m); float32 or float64 (integer and bool
                become float64, or float32 when ``jax_enable_x64`` is off).
            y: ignored.

        Returns:
            self.

        Raises:
            ValueError: bad input, settings or priors, or a covariance that is not positive
                definite (possible with ``reg_covar=0`` and a singular covariance prior).
        """
        del y
        self._fit(X)
        return self

    def fit_predict(self, X, y=None) -> np.ndarray:
        """Fit, then return the (n,) most probable component of every row of X (n, p)."""
        del y
        X = self._fit(X)
        return np.asarray(_predict_jit(X, self._params, **self._settings(X)))

    # ------------------------------------------------------------------ inference

    def _settings(self, X) -> dict:
        return {"path": self._path(X.shape[1]), "precision": self.precision}

    def _checked(self, X) -> jax.Array:
        check_is_fitted(self, "_params")
        return self._check_X(X, fitting=False)

    def predict(self, X) -> np.ndarray:
        """(n,) index of the component with the largest responsibility for every row."""
        X = self._checked(X)
        return np.asarray(_predict_jit(X, self._params, **self._settings(X)))

    def predict_proba(self, X) -> np.ndarray:
        """(n, m) variational responsibilities r_ij = rho_ij / sum_l rho_il of every row."""
        X = self._checked(X)
        return np.asarray(_predict_proba_jit(X, self._params, **self._settings(X)))

    def score_samples(self, X) -> np.ndarray:
        """(n,) log sum_j rho_ij of every row (scikit-learn's ``score_samples`` of this model:
        the E-step's normaliser, not a normalised density)."""
        X = self._checked(X)
        return np.asarray(_score_samples_jit(X, self._params, self._log_offset,
                                             **self._settings(X)))

    def score(self, X, y=None) -> float:
        """Mean of :meth:`score_samples` over the rows of X (n, p)."""
        del y
        return float(np.mean(self.score_samples(X)))

    def sample(self, n_samples: int = 1):
        """Draw (X (n_samples, p) float64, labels (n_samples,)) from the mixture with the
        fitted ``weights_``, ``means_`` and ``covariances_``: scikit-learn's draws from the
        same parameters and ``random_state``."""
        check_is_fitted(self, "_params")
        if not is_int(n_samples) or n_samples < 1:
            raise ValueError(f"n_samples must be an int >= 1, got {n_samples=}")
        return sample_mixture(check_random_state(self.random_state), self.weights_,
                              self.means_, self.covariances_, self.covariance_type,
                              int(n_samples))


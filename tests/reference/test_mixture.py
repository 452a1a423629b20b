"""Reference mixture ops vs independent oracles: scipy densities, numpy loops, scikit-learn EM,
autodiff of independently written log-posteriors, closed-form moments of the Gibbs draws."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture

from gpustat import mixture
from gpustat.mixture import MixtureParams, SuffStats
from gpustat.reference import mixture as ref
from tests.helpers import assert_close, tol

K, P = 4, 3


def random_covariances(rng, covariance_type, k=K, p=P):
    A = rng.normal(size=(k, p, p))
    full = A @ A.transpose(0, 2, 1) + np.eye(p)
    return {"full": full, "tied": full[0], "diag": rng.uniform(0.5, 2.0, (k, p)),
            "spherical": rng.uniform(0.5, 2.0, k)}[covariance_type]


def dense_covariance(cov, covariance_type, j):
    return {"full": lambda: cov[j], "tied": lambda: cov, "diag": lambda: np.diag(cov[j]),
            "spherical": lambda: cov[j] * np.eye(P)}[covariance_type]()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(23, P)) * 2
    weights = rng.dirichlet(np.ones(K))
    means = rng.normal(size=(K, P))
    return rng, X, weights, means


def oracle_weighted_log_prob(X, weights, means, cov, covariance_type):
    return np.stack([np.log(weights[j]) + multivariate_normal(
        means[j], dense_covariance(cov, covariance_type, j)).logpdf(X) for j in range(K)], 1)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_densities_and_statistics_vs_scipy_and_loops(data, covariance_type):
    rng, X, weights, means = data
    cov = random_covariances(rng, covariance_type)
    params = MixtureParams.from_covariances(weights, means, cov, covariance_type)
    wlp = oracle_weighted_log_prob(X, weights, means, cov, covariance_type)
    lse = logsumexp(wlp, axis=1)
    resp = np.exp(wlp - lse[:, None])
    rtol = tol(np.float64, "oracle") * 1e3  # scipy's own logpdf is accurate to ~1e-13
    assert_close(ref.mvn_logpdf(X, params, batch_size=5), wlp - np.log(weights), rtol=rtol)
    assert_close(ref.log_prob(X, params, batch_size=7), lse, rtol=rtol)
    assert_close(ref.responsibilities(X, params), resp, rtol=rtol, atol=1e-15)
    w = rng.uniform(0.1, 2.0, X.shape[0])
    stats = ref.suff_stats(X, params, w, batch_size=6)  # 23 rows: 4 chunks, ragged last
    wr = resp * w[:, None]
    expected_xx = np.stack([sum(wr[i, j] * np.outer(X[i], X[i]) for i in range(len(X)))
                            for j in range(K)])
    assert_close(stats.counts, wr.sum(0), rtol=1e-12)
    assert_close(stats.sum_x, wr.T @ X, rtol=1e-12, atol=1e-13)
    assert_close(stats.sum_xx, expected_xx, rtol=1e-12, atol=1e-13)
    assert_close(stats.loglik, np.sum(w * lse), rtol=1e-12)
    # about a pivot per component: sum r (x - c_j), sum r (x - c_j)(x - c_j)^T
    pivot = means + rng.normal(size=means.shape)
    centred = ref.suff_stats(X, params, w, pivot, batch_size=6)
    expected_xx = np.stack([sum(wr[i, j] * np.outer(X[i] - pivot[j], X[i] - pivot[j])
                                for i in range(len(X))) for j in range(K)])
    assert_close(centred.counts, wr.sum(0), rtol=1e-12)
    assert_close(centred.sum_x, wr.T @ X - wr.sum(0)[:, None] * pivot, rtol=1e-12, atol=1e-13)
    assert_close(centred.sum_xx, expected_xx, rtol=1e-12, atol=1e-13)


def test_sample_labels_is_the_inverse_cdf_of_one_uniform(data):
    rng, X, weights, means = data
    cov = random_covariances(rng, "full")
    params = MixtureParams.from_covariances(weights, means, cov, "full")
    key = jax.random.key(3)
    u = np.asarray(jax.random.uniform(key, (X.shape[0],), dtype=jnp.float64))
    wlp = oracle_weighted_log_prob(X, weights, means, cov, "full")
    cdf = np.cumsum(np.exp(wlp - logsumexp(wlp, axis=1)[:, None]), axis=1)
    expected = np.array([min(np.searchsorted(c, ui, side="right"), K - 1)
                         for c, ui in zip(cdf, u, strict=True)])
    labels, lp = ref.sample_labels(key, X, params, return_log_prob=True)
    np.testing.assert_array_equal(labels, expected)
    assert_close(lp, logsumexp(wlp, axis=1), rtol=1e-12)
    hard = ref.suff_stats_from_labels(X, labels, K, batch_size=5)
    for j in range(K):
        rows = X[expected == j]
        assert_close(hard.counts[j], len(rows), rtol=0)
        assert_close(hard.sum_x[j], rows.sum(0), rtol=1e-12, atol=1e-13)
        assert_close(hard.sum_xx[j], rows.T @ rows, rtol=1e-12, atol=1e-13)


def sklearn_init(covariance_type, X):
    k, p = 3, X.shape[1]
    precisions = {"full": np.stack([np.eye(p) * (1 + j) for j in range(k)]),
                  "tied": np.eye(p) * 1.5, "diag": np.ones((k, p)) + np.arange(k)[:, None],
                  "spherical": np.array([1.0, 2.0, 0.5])}[covariance_type]
    return dict(weights_init=np.array([0.2, 0.3, 0.5]), means_init=X[[0, 40, 80]] + 0.25,
                precisions_init=precisions)


@pytest.fixture(scope="module")
def clustered():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0, 0.0], [4.0, 1.0, -2.0], [-3.0, 5.0, 1.0]])
    X = np.concatenate([rng.normal(size=(40, 3)) * (0.5 + 0.5 * j) + centres[j]
                        for j in range(3)]) + 7.0
    return X


def fit_both(X, covariance_type, backend, max_iter=12):
    """scikit-learn and gpustat from the same initial parameters, tol=0 (fixed iterations)."""
    kwargs = dict(covariance_type=covariance_type, tol=0.0, max_iter=max_iter,
                  **sklearn_init(covariance_type, X))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SklearnGaussianMixture(3, **kwargs).fit(X)
        ours = mixture.GaussianMixture(3, backend=backend, **kwargs).fit(X)
    return theirs, ours


def assert_same_fit(theirs, ours, X):
    assert ours.n_iter_ == theirs.n_iter_
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-8, atol=1e-10,
                     err_msg=name)
    assert abs(ours.lower_bound_ - theirs.lower_bound_) <= 1e-8 * abs(theirs.lower_bound_)
    assert_close(ours.score_samples(X), theirs.score_samples(X), rtol=1e-8)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_em_equals_sklearn_from_the_same_start_reference(clustered, covariance_type):
    theirs, ours = fit_both(clustered, covariance_type, "reference")
    assert_same_fit(theirs, ours, clustered)


def test_converged_run_stops_like_sklearn(clustered):
    kwargs = dict(tol=1e-3, max_iter=100, **sklearn_init("full", clustered))
    theirs = SklearnGaussianMixture(3, **kwargs).fit(clustered)
    ours = mixture.GaussianMixture(3, backend="reference", **kwargs).fit(clustered)
    assert ours.converged_ and theirs.converged_ and ours.n_iter_ == theirs.n_iter_
    assert_close(ours.means_, theirs.means_, rtol=1e-8)


def log_niw(mu, sigma, prior):
    """log NIW(mu, Sigma) up to a constant, written from the density."""
    p = mu.shape[0]
    prec = jnp.linalg.inv(sigma)
    d = mu - prior.mean
    _, logdet = jnp.linalg.slogdet(sigma)
    return (-0.5 * (prior.dof + p + 2) * logdet - 0.5 * jnp.trace(prior.scale @ prec)
            - 0.5 * prior.kappa * d @ prec @ d)


def test_map_m_step_is_a_stationary_point_of_the_log_posterior(data):
    rng, X, _, _ = data
    resp = rng.dirichlet(np.ones(K), size=X.shape[0])
    stats = ref.suff_stats_from_responsibilities(jnp.asarray(X), jnp.asarray(resp))
    prior = mixture.NIWPrior(jnp.array([0.5, -0.2, 0.1]), jnp.asarray(0.3), jnp.asarray(P + 3.0),
                             jnp.eye(P) * 0.7)
    params = mixture.m_step(stats, reg_covar=0.0, component_prior=prior,
                            weight_prior=mixture.DirichletPrior(jnp.asarray(2.5)))

    def log_post(mu, sigma, r):
        ll = jnp.sum(r * jax.scipy.stats.multivariate_normal.logpdf(X, mu, sigma))
        return ll + log_niw(mu, sigma, prior)

    grad = jax.jit(jax.grad(log_post, argnums=(0, 1)))
    for j in range(K):
        g_mu, g_sigma = grad(params.means[j], params.covariances[j], jnp.asarray(resp[:, j]))
        assert float(jnp.max(jnp.abs(g_mu))) < 1e-9
        assert float(jnp.max(jnp.abs(g_sigma + g_sigma.T))) < 1e-9
    expected_w = (resp.sum(0) + 10 * np.finfo(float).eps + 1.5)
    assert_close(params.weights, expected_w / expected_w.sum(), rtol=1e-12)


def test_stick_breaking_map_maximises_its_objective():
    counts = jnp.array([30.0, 5.0, 12.0, 0.0, 3.0])
    alpha = 2.0
    stats = SuffStats(counts, jnp.zeros((5, 2)), jnp.broadcast_to(jnp.eye(2), (5, 2, 2)) * 10,
                      jnp.zeros(()))
    w = mixture.m_step(stats, weight_prior=mixture.StickBreakingPrior(jnp.asarray(alpha))).weights
    v = w / (1 - jnp.concatenate([jnp.zeros(1), jnp.cumsum(w)[:-1]]))

    def objective(v_head):
        later = jnp.cumsum(counts[::-1])[::-1] - counts
        return jnp.sum(counts[:-1] * jnp.log(v_head) + (later[:-1] + alpha - 1)
                       * jnp.log1p(-v_head))

    grad = jax.grad(objective)(v[:-1])
    nonzero = counts[:-1] > 0  # V_j -> eps where N_j = 0 (boundary optimum)
    assert float(jnp.max(jnp.abs(jnp.where(nonzero, grad, 0.0)))) < 1e-8
    assert_close(jnp.sum(w), 1.0, rtol=1e-12)


def test_niw_posterior_draws_match_closed_form_moments():
    p, draws = 2, 4000
    prior = mixture.NIWPrior(jnp.array([1.0, -1.0]), jnp.asarray(0.5), jnp.asarray(6.0),
                             jnp.array([[2.0, 0.3], [0.3, 1.0]]))
    stats = SuffStats(jnp.array([10.0, 0.0]), jnp.array([[5.0, 2.0], [0.0, 0.0]]),
                      jnp.array([[[8.0, 1.5], [1.5, 4.0]], [[0.0, 0.0], [0.0, 0.0]]]),
                      jnp.zeros(()))
    keys = jax.random.split(jax.random.key(11), draws)
    sampled = jax.jit(jax.vmap(lambda k: mixture.sample_niw_posterior(k, prior, stats)))(keys)
    # closed form: kappa_n, m_n, nu_n, Phi_n written out independently
    for j, (n, s1, s2) in enumerate(zip([10.0, 0.0], stats.sum_x, stats.sum_xx, strict=True)):
        s1, s2 = np.asarray(s1), np.asarray(s2)
        xbar = s1 / n if n else np.zeros(p)
        kappa_n = 0.5 + n
        m_n = (0.5 * np.array([1.0, -1.0]) + s1) / kappa_n
        scatter = s2 - n * np.outer(xbar, xbar)
        d = xbar - np.array([1.0, -1.0])
        phi_n = np.asarray(prior.scale) + scatter + 0.5 * n / kappa_n * np.outer(d, d)
        nu_n = 6.0 + n
        mean_sigma = phi_n / (nu_n - p - 1)
        sig = np.asarray(sampled.covariances[:, j])
        mu = np.asarray(sampled.means[:, j])
        u = np.asarray(sampled.precisions_cholesky[:, j])
        assert np.all(np.tril(u, -1) == 0) and np.all(np.diagonal(u, axis1=1, axis2=2) > 0)
        lam = u @ u.transpose(0, 2, 1)  # ~ Wishart(nu_n, Phi_n^-1): mean nu_n Phi_n^-1
        assert_close(sig @ lam, np.broadcast_to(np.eye(p), sig.shape), rtol=0, atol=1e-10)
        for got, want in ((mu, m_n), (sig, mean_sigma), (lam, nu_n * np.linalg.inv(phi_n))):
            se = got.std(axis=0) / np.sqrt(draws)
            z = np.abs(got.mean(axis=0) - want) / se
            assert np.all(z < 4.0), (j, z)


def test_stick_and_alpha_draws_match_closed_form_moments():
    counts = jnp.array([20.0, 7.0, 0.0, 3.0])
    prior = mixture.StickBreakingPrior(jnp.asarray(1.5), jnp.asarray(2.0), jnp.asarray(1.0))
    draws = 4000
    keys = jax.random.split(jax.random.key(5), draws)
    v, w, alphas = jax.jit(jax.vmap(
        lambda k: mixture.sample_sticks(k, counts, prior, prior.alpha)))(keys)
    later = np.array([10.0, 3.0, 3.0, 0.0])
    a, b = 1 + np.asarray(counts[:-1]), 1.5 + later[:-1]
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    z = np.abs(np.asarray(v[:, :-1]).mean(0) - mean) / np.sqrt(var / draws)
    assert np.all(z < 4.0), z
    assert_close(np.asarray(w).sum(1), np.ones(draws), rtol=1e-12)
    # alpha | V ~ Gamma(e + m - 1, rate f - sum_{j<m} log(1 - V_j)), V = the same key's sticks
    rate = 1.0 - np.log1p(-np.asarray(v[:, :-1])).sum(1)
    shape = 2.0 + 4 - 1
    standardised = np.asarray(alphas) * rate  # ~ Gamma(shape, 1) for every key
    z = abs(standardised.mean() - shape) / np.sqrt(shape / draws)
    assert z < 4.0, z


@pytest.fixture(scope="module")
def planted():
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [6.0, -6.0], [12.0, 6.0]])
    X = np.concatenate([rng.normal(size=(100, 2)) * 0.5 + c for c in centres])
    result = mixture.fit_gibbs(jax.random.key(0), jnp.asarray(X), 5, n_sweeps=300,
                               backend="reference")
    return X, centres, result


def test_gibbs_recovers_planted_components(planted):
    X, centres, result = planted
    burn = 100
    means = np.asarray(result.means[0, burn:])  # (t, m, p)
    counts = np.asarray(result.counts[0, burn:])
    occupied = np.argsort(counts.mean(0))[-3:]
    assert np.all(counts.mean(0)[occupied] > 90)
    for c in centres:
        j = occupied[np.argmin(np.linalg.norm(means[-1, occupied] - c, axis=1))]
        draws = means[:, j]
        posterior_mean = draws.mean(0)
        # the planted centre lies within 3 posterior standard errors of the mean draw:
        # sd of the draws ~ 0.5 / sqrt(100); the planted truth is one such draw away
        se = draws.std(0)
        assert np.all(np.abs(posterior_mean - c) < 3 * se + 1e-12), (c, posterior_mean, se)
        # and the data mean of its cluster (the posterior mean's target) within 3 MC errors
        cluster = X[np.linalg.norm(X - c, axis=1) < 3]
        mc = se / np.sqrt(len(draws) / 10)  # conservative effective sample size t/10
        assert np.all(np.abs(posterior_mean - cluster.mean(0)) < 3 * mc + 0.02)

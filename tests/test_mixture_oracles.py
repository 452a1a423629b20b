"""Functional core of the mixtures against independent oracles: kernel-path
responsibilities of rows far from every component, the tied collapse floor, the M-step's
checks of its priors and statistics, and the mixing weights' check."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.mixture._gaussian_mixture import _estimate_gaussian_parameters

from gpustat import mixture
from gpustat.mixture import SuffStats
from tests.helpers import assert_close


def _responsibilities_float64(X, weights, means, cov):
    """r_ij of a shared covariance, in float64 by numpy: softmax of log w_j - d_ij^2 / 2."""
    prec = np.linalg.inv(cov)
    diff = X[:, None, :] - means[None]
    logits = np.log(weights) - 0.5 * np.einsum("nka,ab,nkb->nk", diff, prec, diff)
    logits -= logits.max(axis=1, keepdims=True)
    r = np.exp(logits)
    return r / r.sum(axis=1, keepdims=True)


def test_kernel_responsibilities_of_far_rows_sum_to_one():
    """float32 rows 10 to 1e4 standard deviations from every component: the kernel path
    normalised the log-densities by log p(x) from another pass, which rounds differently
    (rows summed to 1 + 6e-6 at 10 sd and to 1.064 at 1000 sd)."""
    rng = np.random.default_rng(0)
    weights = np.array([0.2, 0.3, 0.5], np.float32)
    means = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], np.float32)
    params = mixture.MixtureParams.from_covariances(
        weights, means, np.broadcast_to(np.eye(2, dtype=np.float32), (3, 2, 2)))
    X = np.concatenate([rng.normal(size=(8, 2)) + d * np.array([1.0, 0.7])
                        for d in (0.0, 10.0, 300.0, 1000.0)] + [[[1e4, 1e4]]]).astype(np.float32)
    got = np.asarray(mixture.responsibilities(X, params, backend="interpret"), np.float64)
    assert_close(got.sum(axis=1), np.ones(len(X)), rtol=0, atol=1e-6)
    # the last row ties components 1 and 2 below float32's resolution: only its sum is defined
    want = _responsibilities_float64(X[:-1].astype(np.float64), weights.astype(np.float64),
                                     means.astype(np.float64), np.eye(2))
    assert_close(got[:-1], want, rtol=0, atol=5e-6)


def _stats(X, resp, dtype):
    """SuffStats of responsibilities (n, k), summed in float64 by numpy, rounded to dtype."""
    return SuffStats(jnp.asarray(resp.sum(0), dtype), jnp.asarray(resp.T @ X, dtype),
                     jnp.asarray(np.einsum("nk,na,nb->kab", resp, X, X), dtype),
                     jnp.zeros((), dtype))


def _outlying_pair(dtype):
    """Centred data: 1000 points round the origin and 5 far (~1000 sd), one component each."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(1000, 2)), rng.normal(size=(5, 2)) * 1.5 + 1000.0])
    X -= X.mean(axis=0)
    resp = np.zeros((len(X), 2))
    resp[:1000, 0] = 1.0
    resp[1000:, 1] = 1.0
    return X, resp, _stats(X, resp, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tied_covariance_with_a_small_far_component_is_resolved(dtype):
    """The tied covariance cancels in the pooled moments sum_j S2_j / sum_j N_j (second
    moment ~5e3 here): the floor taken from the far component's own moments (1e6) marked
    the float32 pooled covariance (~I, accurate to ~1e-3) as collapsed (NaN)."""
    X, resp, stats = _outlying_pair(dtype)
    _, _, want = _estimate_gaussian_parameters(X, resp, 1e-6, "tied")
    got = mixture.m_step(stats, covariance_type="tied")
    assert_close(got.covariances, want, rtol=0, atol=2e-3 if dtype == np.float32 else 1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tied_covariance_of_components_on_repeated_points_is_still_reported(dtype):
    X = np.repeat(np.array([[3.0, -1.0], [-2.0, 5.0]]), 50, axis=0)
    X = X - X.mean(axis=0)
    resp = np.repeat(np.eye(2), 50, axis=0)
    got = mixture.m_step(_stats(X, resp, dtype), covariance_type="tied", reg_covar=0.0)
    assert np.all(np.isnan(np.asarray(got.covariances)))


def _niw_mode(stats, prior):
    """(means, covariances) of the NIW posterior mode from the statistics, in float64."""
    counts, sum_x, sum_xx = (np.asarray(a, np.float64)
                             for a in (stats.counts, stats.sum_x, stats.sum_xx))
    m0, kappa, nu, phi = (np.asarray(a, np.float64) for a in dataclasses.astuple(prior))
    p = m0.shape[0]
    means, covs = [], []
    for n, s1, s2 in zip(counts, sum_x, sum_xx, strict=True):
        xbar = s1 / n
        scatter = s2 - n * np.outer(xbar, xbar)
        phi_n = phi + scatter + kappa * n / (kappa + n) * np.outer(xbar - m0, xbar - m0)
        means.append((kappa * m0 + s1) / (kappa + n))
        covs.append(phi_n / (nu + n + p + 2))
    return np.array(means), np.array(covs)


def test_map_m_step_computes_a_float64_prior_in_the_statistics_dtype():
    """float32 statistics with float64 NIW / Dirichlet priors: float32 parameters (the means
    and covariances came back float64 beside float32 weights), equal to the closed form."""
    rng = np.random.default_rng(1)
    stats = _stats(rng.normal(size=(40, 2)), rng.dirichlet(np.ones(3), 40), np.float32)
    prior = mixture.NIWPrior(jnp.array([0.5, -0.5]), jnp.asarray(0.7), jnp.asarray(4.5),
                             jnp.array([[2.0, 0.3], [0.3, 1.0]]))
    got = mixture.m_step(stats, reg_covar=0.0, component_prior=prior,
                         weight_prior=mixture.DirichletPrior(jnp.asarray(3.0)))
    assert {a.dtype for a in jax.tree.leaves(got)} == {jnp.dtype(jnp.float32)}
    means, covs = _niw_mode(stats, prior)
    assert_close(got.means, means, rtol=1e-5, atol=1e-6)
    assert_close(got.covariances, covs, rtol=1e-5, atol=1e-6)
    counts = np.asarray(stats.counts, np.float64)
    assert_close(got.weights, (counts + 2.0) / np.sum(counts + 2.0), rtol=1e-6)


def test_diagonal_m_step_is_the_diag_model_in_dense_form_from_one_program():
    """m_step(covariance_type="full", diagonal=flag) under one jit, the flag traced: true
    gives scikit-learn's diag estimates (float64) as dense matrices with zero off-diagonal
    entries and diagonal precision factors; false its full estimates."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 3)) @ np.array([[1.0, 0.5, 0.0], [0.0, 1.0, 0.3], [0.0, 0.0, 1.0]])
    X -= X.mean(axis=0)
    resp = rng.dirichlet(np.ones(2), len(X))
    stats = _stats(X, resp, np.float64)
    step = jax.jit(lambda stats, diagonal: mixture.m_step(stats, diagonal=diagonal))
    for diagonal, kind in ((True, "diag"), (False, "full")):
        got = step(stats, np.asarray(diagonal))
        _, means, want = _estimate_gaussian_parameters(X, resp, 1e-6, kind)
        assert_close(got.means, means, rtol=1e-12, atol=1e-14)
        dense = want[..., None] * np.eye(3) if kind == "diag" else want
        assert_close(got.covariances, dense, rtol=1e-12, atol=1e-15)
        chol = np.asarray(got.precisions_cholesky)
        assert_close(chol @ np.swapaxes(chol, 1, 2), np.linalg.inv(dense), rtol=1e-10)
        assert np.all(chol[:, ~np.eye(3, dtype=bool)] == 0) == (kind == "diag")
    assert step._cache_size() == 1
    with pytest.raises(ValueError, match="diagonal needs covariance_type='full'"):
        mixture.m_step(stats, covariance_type="tied", diagonal=True)


def test_m_step_bad_input_names_the_argument():
    _, _, stats = _outlying_pair(np.float64)
    with pytest.raises(TypeError, match="stats must be a SuffStats"):
        mixture.m_step((stats.counts, stats.sum_x, stats.sum_xx))
    batched = jax.tree.map(lambda a: jnp.stack([a, a]), stats)  # k = p = 2 broadcast silently
    with pytest.raises(ValueError, match="vmap"):
        mixture.m_step(batched)
    with pytest.raises(ValueError, match="reg_covar"):
        mixture.m_step(stats, reg_covar=-1.0)
    with pytest.raises(ValueError, match=r"weight_prior\.alpha"):
        mixture.m_step(stats, weight_prior=mixture.DirichletPrior(jnp.asarray(-1.0)))
    good = mixture.NIWPrior(jnp.zeros(2), jnp.asarray(1.0), jnp.asarray(4.0), jnp.eye(2))
    with pytest.raises(ValueError, match=r"component_prior\.mean must have shape \(2,\)"):
        mixture.m_step(stats, component_prior=dataclasses.replace(good, mean=jnp.zeros(1)))
    with pytest.raises(ValueError, match=r"component_prior\.kappa"):
        mixture.m_step(stats, component_prior=dataclasses.replace(good, kappa=-1.0))


@pytest.mark.parametrize("weights", [[0.5, 0.5, 0.5], [-0.25, 0.75, 0.5], [np.nan, 0.5, 0.5]])
def test_mixing_weights_must_be_a_distribution(weights):
    """Weights summing to 1.5 shifted every log p(x) by log 1.5 with no error."""
    X = np.random.default_rng(0).normal(size=(5, 2))
    params = mixture.MixtureParams.from_covariances(
        jnp.asarray(weights), jnp.zeros((3, 2)), jnp.broadcast_to(jnp.eye(2), (3, 2, 2)))
    with pytest.raises(ValueError, match=r"params\.weights must be finite, non-negative and sum"):
        mixture.log_prob(X, params)


def test_float32_weights_normalised_in_float32_pass():
    """The tolerance is the weights' own: 256 float32 weights off 1 by their roundoff pass,
    also with float64 data."""
    w = jax.random.dirichlet(jax.random.key(0), jnp.ones(256, jnp.float32))
    params = mixture.MixtureParams.from_covariances(
        w, jnp.zeros((256, 1), jnp.float32), jnp.ones((256,), jnp.float32), "spherical")
    X = np.zeros((3, 1))
    assert_close(mixture.log_prob(X, params), np.full(3, -0.5 * np.log(2 * np.pi)), rtol=1e-5)

"""One-point seeds and the collapse floor of the M-step against scikit-learn: data far from
unit scale, float32, and features of very different scales fit as scikit-learn fits them,
while a component on one repeated point is still reported at any feature scaling."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture
from sklearn.mixture._gaussian_mixture import _estimate_gaussian_parameters

from gpustat import mixture
from gpustat.mixture import kmeans_plusplus
from tests.helpers import assert_close


def _three_blobs(scale, n=60, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [4.0, 4.0], [-4.0, 3.0]])
    X = np.concatenate([rng.normal(size=(n // 3, 2)) + c for c in centres])
    return X * np.asarray(scale)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_one_point_seeds_equal_sklearn_one_hot_estimates(covariance_type):
    """scikit-learn seeds k-means++ with one-hot responsibilities; its estimates of those
    are the weights, means and covariances to expect (tied differs by design, see
    gpustat.mixture._initialize)."""
    X = jnp.asarray(_three_blobs(1.0))
    key = jax.random.key(1)
    seeds = np.asarray(kmeans_plusplus(jax.random.split(key, 1)[0], X, 3))
    resp = np.zeros((X.shape[0], 3))
    resp[seeds, np.arange(3)] = 1.0
    nk, means, covariances = _estimate_gaussian_parameters(np.asarray(X), resp, 1e-6,
                                                           covariance_type)
    ours = jax.tree.map(lambda a: a[0], mixture.initialize(
        key, X, 3, covariance_type=covariance_type, reg_covar=1e-6, method="k-means++"))
    assert_close(ours.weights, nk / nk.sum(), rtol=1e-12)
    assert_close(ours.means, means, rtol=1e-12)
    # scikit-learn's one-point covariances are reg_covar plus its roundoff (~1e-15 here)
    assert_close(ours.covariances, covariances, rtol=1e-8, atol=1e-13)


@pytest.mark.parametrize("init_params", ["k-means++", "random_from_data"])
def test_one_point_seeds_fit_float32_data(init_params):
    X = _three_blobs(10.0).astype(np.float32)
    gm = mixture.GaussianMixture(3, init_params=init_params, random_state=0).fit(X)
    assert gm.means_.dtype == np.float32 and np.all(np.isfinite(gm.covariances_))
    assert gm.converged_


@pytest.mark.parametrize(("dtype", "scale"), [(np.float64, [1e5, 1e-3]),
                                              (np.float32, [1e2, 1e-1])])
def test_features_of_very_different_scales_fit_as_sklearn(dtype, scale):
    X = _three_blobs(scale).astype(dtype)
    start = dict(weights_init=np.full(3, 1 / 3), means_init=X[[0, 20, 40]].astype(np.float64),
                 precisions_init=np.broadcast_to(np.diag(1 / np.asarray(scale) ** 2),
                                                 (3, 2, 2)).copy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SklearnGaussianMixture(3, max_iter=5, tol=0.0, **start).fit(
            X.astype(np.float64))
    ours = mixture.GaussianMixture(3, max_iter=5, tol=0.0, **start).fit(X)
    rtol = 1e-8 if dtype == np.float64 else 1e-3
    assert_close(ours.means_, theirs.means_, rtol=rtol)
    assert_close(np.diagonal(ours.covariances_, axis1=1, axis2=2),
                 np.diagonal(theirs.covariances_, axis1=1, axis2=2), rtol=rtol * 10)


@pytest.mark.parametrize("scale", [[1.0, 1.0], [1e4, 1e-4]])
def test_a_component_on_one_repeated_point_is_reported_at_any_scale(scale):
    X = np.concatenate([np.tile([[50.0, 3.0]], (10, 1)), _three_blobs(1.0)[:20]]) * scale
    gm = mixture.GaussianMixture(2, reg_covar=0.0, weights_init=[0.5, 0.5],
                                 means_init=np.array([[50.0, 3.0], [0.0, 0.0]]) * scale,
                                 precisions_init=np.broadcast_to(
                                     np.diag(1 / np.asarray(scale) ** 2), (2, 2, 2)).copy())
    with pytest.raises(ValueError, match="reg_covar"):
        gm.fit(X)


def test_kmeans_passes_equal_numpy_over_ragged_row_chunks(monkeypatch):
    """The Lloyd iterations and the hard-label statistics, summed by weighted one-hot
    GEMMs over row steps (a fixed order of additions), equal numpy's per-label sums with
    the same weights: zero-weight rows take no part, an empty cluster keeps its centre."""
    from gpustat.mixture import _initialize

    monkeypatch.setattr(_initialize, "_CHUNK_ELEMENTS", 13 * 128)  # 128-row steps, ragged
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal(size=(500, 3)), rng.normal(size=(500, 3)) + 6.0])
    w = rng.uniform(0.5, 2.0, 1000) * (rng.uniform(size=1000) > 0.1)
    start = np.array([[0.5, 0.0, 0.0], [5.0, 6.0, 6.0], [6.0, 5.0, 6.5], [90.0, 90, 90]])

    def nearest(centres):
        return np.argmin(((X[:, None] - centres[None]) ** 2).sum(-1), axis=1)

    want = start.copy()
    for _ in range(3):
        labels = nearest(want)
        want = np.stack([np.average(X[labels == j], axis=0, weights=w[labels == j])
                         if w[labels == j].sum() > 0 else want[j] for j in range(4)])
    got = _initialize._lloyd(jnp.asarray(X), jnp.asarray(w), jnp.asarray(start), 3, 0.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(got)[3], start[3])
    stats = _initialize._label_stats(jnp.asarray(X), jnp.asarray(w), jnp.asarray(want),
                                     jnp.ones(4, bool))
    labels = nearest(want)
    y = X - want[labels]
    one_hot = np.eye(4)[labels] * w[:, None]
    np.testing.assert_allclose(np.asarray(stats.counts), one_hot.sum(0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(stats.sum_x), one_hot.T @ y, atol=1e-10)
    np.testing.assert_allclose(np.asarray(stats.sum_xx),
                               np.einsum("nk,na,nb->kab", one_hot, y, y), rtol=1e-12)
    # an absent centre (a padded component slot) gets no rows, even inside a cluster
    inside = want.copy()
    inside[3] = X[0]
    absent = _initialize._label_stats(jnp.asarray(X), jnp.asarray(w), jnp.asarray(inside),
                                      jnp.array([True, True, True, False]))
    np.testing.assert_allclose(np.asarray(absent.counts), stats.counts, rtol=1e-12)


@pytest.mark.parametrize(("n", "k"), [(3000, 8), (34_000, 12)])
def test_kmeans_init_inertia_near_sklearn_kmeans(n, k):
    """The "kmeans" initial means (greedy k-means++ seeds, over a 2^15-row sample when
    n is larger, and Lloyd to scikit-learn's tolerance) reach an inertia within 2% of
    scikit-learn's KMeans (full k-means++ seeding) on blobs."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n, n_features=4, centers=k, cluster_std=1.5, random_state=0)
    X = X.astype(np.float32)

    def inertia(centres):
        return ((X[:, None] - np.asarray(centres)[None]) ** 2).sum(-1).min(1).sum()

    ours = [inertia(mixture.initialize(jax.random.key(seed), X, k).means[0])
            for seed in range(3)]
    theirs = [KMeans(k, n_init=1, random_state=seed).fit(X).inertia_ for seed in range(3)]
    assert np.median(ours) <= 1.02 * np.median(theirs), (ours, theirs)

"""scikit-learn's conventions in GaussianMixture (random_state, feature names, float64 without
x64) and the functional API's argument checks (issue 35, item 6)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture

from gpustat import mixture
from gpustat.reference.mixture import MixtureParams


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [6.0, 6.0], [-6.0, 5.0]])
    return np.concatenate([rng.normal(size=(40, 2)) + c for c in centres])


def _fit_means(random_state, X):
    gm = mixture.GaussianMixture(3, init_params="random_from_data", max_iter=0,
                                 random_state=random_state, backend="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=0 does not converge
        return gm.fit(X).means_


def test_random_state_none_is_fresh_an_int_repeats_a_random_state_streams(blobs):
    """As scikit-learn: None draws fresh seeds, an int the same, a RandomState the next of
    its stream (the same stream from the same seed)."""
    nones = [_fit_means(None, blobs) for _ in range(3)]
    assert not all(np.array_equal(nones[0], m) for m in nones[1:])
    np.testing.assert_array_equal(_fit_means(5, blobs), _fit_means(5, blobs))
    stream = np.random.RandomState(3)
    first, second = _fit_means(stream, blobs), _fit_means(stream, blobs)
    assert not np.array_equal(first, second)
    again = np.random.RandomState(3)
    np.testing.assert_array_equal(_fit_means(again, blobs), first)


def test_sample_with_a_random_state_draws_what_sklearn_draws(blobs):
    ours = mixture.GaussianMixture(3, random_state=0, backend="reference").fit(blobs)
    theirs = SklearnGaussianMixture(3, random_state=0).fit(blobs)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        setattr(theirs, name, getattr(ours, name))
    ours.random_state = np.random.RandomState(11)
    theirs.random_state = np.random.RandomState(11)
    (x1, y1), (x2, y2) = ours.sample(50), theirs.sample(50)
    np.testing.assert_allclose(x1, x2, rtol=1e-12)
    np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("value", [np.random.default_rng(0), "seed", 1.5])
def test_other_random_states_are_named(blobs, value):
    with pytest.raises(ValueError, match="random_state must be None or an int"):
        mixture.GaussianMixture(2, random_state=value).fit(blobs)


def test_dataframe_sets_and_checks_feature_names_as_sklearn(blobs):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(blobs, columns=["height", "width"])
    ours = mixture.GaussianMixture(3, random_state=0, backend="reference").fit(frame)
    theirs = SklearnGaussianMixture(3, random_state=0).fit(frame)
    np.testing.assert_array_equal(ours.feature_names_in_, theirs.feature_names_in_)
    renamed = frame.rename(columns={"width": "depth"})
    for est in (ours, theirs):
        with pytest.raises(ValueError, match="feature names"):
            est.predict(renamed)
        with pytest.warns(UserWarning, match="does not have valid feature names"):
            est.predict(blobs)
    refit = mixture.GaussianMixture(3, random_state=0, backend="reference").fit(frame)
    refit.fit(blobs)  # a fit on an array drops the names, as scikit-learn's does
    assert not hasattr(refit, "feature_names_in_")


def test_float64_input_without_x64_warns(blobs):
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match="jax_enable_x64 is off"):
            gm = mixture.GaussianMixture(3, random_state=0, backend="reference").fit(blobs)
        assert gm.means_.dtype == np.float32
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # float32 input: no warning
            gm.fit(blobs.astype(np.float32))


def test_more_components_than_rows_are_rejected():
    X = jnp.asarray(np.random.default_rng(1).normal(size=(4, 2)))
    with pytest.raises(ValueError, match="n_components must be <= n"):
        mixture.initialize(jax.random.key(0), X, 5)
    with pytest.raises(ValueError, match="n_components must be <= n"):
        mixture.kmeans_plusplus(jax.random.key(0), X, 5)
    assert mixture.kmeans_plusplus(jax.random.key(0), X, 4).shape == (4,)


@pytest.mark.parametrize("sticks", [[0.5, 1.5, 1.0], [-0.1, 0.5, 1.0], [0.5, np.nan, 1.0]])
def test_sticks_outside_the_unit_interval_are_rejected(sticks):
    with pytest.raises(ValueError, match=r"v must lie in \[0, 1\]"):
        mixture.stick_weights(jnp.asarray(sticks))
    # in range: w_j = v_j prod_{l<j} (1 - v_l)
    np.testing.assert_allclose(mixture.stick_weights(jnp.asarray([0.5, 0.25, 1.0])),
                               [0.5, 0.125, 0.375], rtol=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_params_whose_k_disagrees_are_rejected(covariance_type):
    k, p = 3, 2
    cov = {"full": np.broadcast_to(np.eye(p), (k, p, p)), "tied": np.eye(p),
           "diag": np.ones((k, p)), "spherical": np.ones(k)}[covariance_type]
    with pytest.raises(ValueError, match="one k"):
        MixtureParams.from_covariances(np.full(k - 1, 1 / (k - 1)), np.zeros((k, p)), cov,
                                       covariance_type)
    wrong = {"full": np.broadcast_to(np.eye(p), (k + 1, p, p)), "tied": np.eye(p + 1),
             "diag": np.ones((k + 1, p)), "spherical": np.ones(k + 1)}[covariance_type]
    with pytest.raises(ValueError, match="must have shape"):
        MixtureParams.from_precisions(np.full(k, 1 / k), np.zeros((k, p)), wrong,
                                      covariance_type)

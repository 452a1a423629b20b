"""``GaussianMixture`` settings against scikit-learn: settings named in messages, the
weights_init tolerance, the dtype of scores on narrower X, partial_fit's lower_bounds_."""

import warnings

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture

from gpustat import mixture


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0, 0.0], [5.0, 5.0, 0.0], [-5.0, 4.0, 2.0]])
    return np.concatenate([rng.normal(size=(40, 3)) + c for c in centres])


def _gm(**kwargs):
    return mixture.GaussianMixture(3, backend="reference", **kwargs)


@pytest.mark.parametrize("name", ["tol", "reg_covar"])
@pytest.mark.parametrize("value", [None, "1e-3"])
def test_non_numeric_tol_and_reg_covar_are_named(data, name, value):
    with pytest.raises(ValueError, match=f"{name} must be a real number >= 0"):
        _gm(**{name: value}).fit(data)


@pytest.mark.parametrize("value", [-1, 2**32, 1.5])  # a RandomState is taken (issue 35)
def test_random_state_outside_numpy_seeds_is_named_at_fit(data, value):
    # such a seed used to fit, and only sample() failed (numpy: "Seed must be between ...")
    with pytest.raises(ValueError, match="random_state must be None or an int"):
        _gm(random_state=value).fit(data)
    ours = _gm(random_state=np.uint32(2**32 - 1)).fit(data)
    assert ours.sample(5)[0].shape == (5, 3)


def test_weights_init_off_by_more_than_the_drivers_tolerance_names_weights_init(data):
    # float64: sum 1 + 1e-6 passed the estimator's check and failed in the driver naming
    # params.weights; scikit-learn rejects it too
    with pytest.raises(ValueError, match="should be normalized"):
        SklearnGaussianMixture(3, weights_init=[1 / 3, 1 / 3, 1 / 3 + 1e-6]).fit(data)
    with pytest.raises(ValueError, match="weights_init must lie in"):
        _gm(weights_init=[1 / 3, 1 / 3, 1 / 3 + 1e-6]).fit(data)
    # float32 fits within the driver's sqrt(eps) = 3.5e-4 (1e-4 was rejected)
    ours = _gm(weights_init=[1 / 3, 1 / 3, 1 / 3 + 1e-4]).fit(data.astype(np.float32))
    assert ours.means_.dtype == np.float32 and ours.converged_


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_float32_x_on_a_float64_fit_scores_in_float64(data, covariance_type):
    """scikit-learn scores float32 X with its float64 parameters in float64; the estimator
    used to cast its parameters down to float32 (1.2e-5 off in score_samples)."""
    X = data * 100 + 1e4
    k, p = 3, X.shape[1]
    precisions = {"full": np.broadcast_to(np.eye(p) / 1e4, (k, p, p)).copy(),
                  "tied": np.eye(p) / 1e4, "diag": np.full((k, p), 1e-4),
                  "spherical": np.full(k, 1e-4)}[covariance_type]
    start = dict(covariance_type=covariance_type, weights_init=np.full(k, 1 / k),
                 means_init=X[[0, 50, 100]], precisions_init=precisions)
    theirs = SklearnGaussianMixture(k, **start).fit(X)
    ours = _gm(**start).fit(X)
    X32 = X.astype(np.float32)
    # oracle: scikit-learn on the same values in float64 (its float32 path itself rounds
    # some intermediates to float32, up to 3e-7 off in score_samples)
    X32_wide = X32.astype(np.float64)
    for method in ("score_samples", "predict_proba"):
        got, want = getattr(ours, method)(X32), getattr(theirs, method)(X32_wide)
        assert got.dtype == getattr(theirs, method)(X32).dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert ours.score(X32) == pytest.approx(theirs.score(X32_wide), rel=1e-12)
    np.testing.assert_array_equal(ours.predict(X32), theirs.predict(X32_wide))


def test_partial_fit_sets_lower_bounds_to_its_own_step(data):
    """After fit then partial_fit, lower_bounds_ was the old fit's; alone, it was missing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = _gm(max_iter=5).fit(data)
    fitted.partial_fit(data[::2])
    streamed = _gm(random_state=0).partial_fit(data)
    for gm in (fitted, streamed):
        assert gm.lower_bounds_ == [gm.lower_bound_]

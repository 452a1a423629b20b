"""BayesianGaussianMixture against scikit-learn's (the oracle): parameters, bounds and
predictions from the same start in float64, scikit-learn's estimator checks, compile-free
refits, bad input."""

import re
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
import sklearn.mixture
from sklearn.utils.estimator_checks import check_estimator

import gpustat
from gpustat import BayesianGaussianMixture
from gpustat.mixture import _bayesian as mixture_bayesian
from tests.helpers import assert_close, assert_lowers_for_cuda, count_compiles

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
PRIOR_TYPES = ("dirichlet_process", "dirichlet_distribution")
# the variational posterior scikit-learn's fit continues from (its _get_parameters)
POSTERIOR = ("weight_concentration_", "mean_precision_", "means_", "degrees_of_freedom_",
             "covariances_", "precisions_cholesky_")
FITTED = ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_",
          "mean_precision_", "degrees_of_freedom_", "weight_concentration_prior_",
          "mean_precision_prior_", "mean_prior_", "degrees_of_freedom_prior_",
          "covariance_prior_")
RTOL = 1e-6


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    mix = np.array([[1.0, 0.3, 0.0], [0.0, 1.0, 0.2], [0.0, 0.0, 1.0]])
    return np.concatenate([rng.normal(-2.0, 1.0, (60, 3)),
                           rng.normal(3.0, 0.5, (50, 3)) @ mix + 5.0])


def _settings(covariance_type, prior_type, **extra):
    return dict(n_components=4, covariance_type=covariance_type,
                weight_concentration_prior_type=prior_type, init_params="random_from_data",
                random_state=3, tol=1e-8, **extra)


def _assert_same(ours, theirs, names, rtol=RTOL):
    for name in names:
        mine, ref = getattr(ours, name), getattr(theirs, name)
        if isinstance(ref, tuple):  # the Dirichlet process's (a, b)
            for m, r in zip(mine, ref, strict=True):
                assert_close(m, r, rtol=rtol, err_msg=name)
        else:
            assert_close(np.squeeze(mine), np.squeeze(ref), rtol=rtol,
                         atol=rtol * np.max(np.abs(ref)), err_msg=name)


@pytest.mark.parametrize("prior_type", PRIOR_TYPES)
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_fit_matches_scikit_learn_from_the_same_start(data, covariance_type, prior_type):
    """scikit-learn continues (warm_start) from gpustat's initial posterior; both run to
    convergence at tol 1e-8 and agree on every fitted attribute, the bound, the iteration
    count and the predictions. The initial posteriors themselves agree too: the
    "random_from_data" rows are drawn from random_state as scikit-learn draws them (except
    "tied", whose initial scatter in scikit-learn adds x x^T of rows with no
    responsibility)."""
    ours = BayesianGaussianMixture(backend="reference", max_iter=0,
                                   **_settings(covariance_type, prior_type)).fit(data)
    theirs = sklearn.mixture.BayesianGaussianMixture(
        max_iter=0, **_settings(covariance_type, prior_type)).fit(data)
    if covariance_type != "tied":
        _assert_same(ours, theirs, POSTERIOR + FITTED)
    for name in POSTERIOR:
        setattr(theirs, name, getattr(ours, name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both converge
        theirs.set_params(warm_start=True, max_iter=200).fit(data)
        ours.set_params(warm_start=True, max_iter=200).fit(data)
    assert ours.n_iter_ == theirs.n_iter_ and ours.converged_
    _assert_same(ours, theirs, (*FITTED, "weight_concentration_"))
    assert_close(ours.lower_bound_, np.squeeze(theirs.lower_bound_), rtol=1e-12)
    assert_close(ours.lower_bounds_, np.squeeze(theirs.lower_bounds_), rtol=1e-12)
    assert_close(ours.predict_proba(data), theirs.predict_proba(data), rtol=RTOL, atol=1e-12)
    assert_close(ours.score_samples(data), theirs.score_samples(data), rtol=1e-12)
    np.testing.assert_array_equal(ours.predict(data), theirs.predict(data))
    X_ours, y_ours = ours.sample(7)
    X_theirs, y_theirs = theirs.sample(7)
    assert_close(X_ours, X_theirs, rtol=1e-12)
    np.testing.assert_array_equal(y_ours, y_theirs)


def test_restarts_from_the_same_rows_keep_scikit_learns_best(data):
    """n_init restarts run batched, from the rows scikit-learn draws for its restarts, and
    the best bound is kept as scikit-learn keeps it (user priors given)."""
    settings = _settings("diag", "dirichlet_process", n_init=3, max_iter=300,
                         weight_concentration_prior=0.05, mean_precision_prior=0.5,
                         mean_prior=np.array([1.0, 0.0, -1.0]),
                         degrees_of_freedom_prior=4.5, covariance_prior=np.array([1.0, 2.0, 0.5]))
    ours = BayesianGaussianMixture(backend="reference", **settings).fit(data)
    theirs = sklearn.mixture.BayesianGaussianMixture(**settings).fit(data)
    assert ours.n_iter_ == theirs.n_iter_
    _assert_same(ours, theirs, (*FITTED, "weight_concentration_"))
    assert_close(ours.lower_bound_, theirs.lower_bound_, rtol=1e-12)
    np.testing.assert_array_equal(ours.fit_predict(data), theirs.fit_predict(data))


def test_passes_scikit_learns_estimator_checks():
    """With no expected failures. The checks exercise the API, not the initialisation:
    "random_from_data" compiles the cheapest start (the default "kmeans" passes them too,
    in ~40% more time; its start is compiled by the compilation and docs tests)."""
    est = BayesianGaussianMixture(n_components=2, backend="reference", random_state=0,
                                  init_params="random_from_data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(est, on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])) for r in results
              if r["status"] == "failed"]
    assert not failed, failed


def test_second_fit_and_inference_of_the_same_shapes_compile_nothing(data):
    def run(X):
        est = BayesianGaussianMixture(n_components=3, backend="reference", random_state=1,
                                      max_iter=500).fit(X)
        est.predict(X)
        est.predict_proba(X)
        est.score(X)
        est.set_params(warm_start=True).fit(X + 0.5)  # the same loop program
        return est

    assert count_compiles(lambda: run(data)) > 0
    assert count_compiles(lambda: run(data[::-1] * 2.0)) == 0


def test_float32_fit_stays_float32_and_near_scikit_learns_float64_fit(data):
    settings = _settings("full", "dirichlet_process", max_iter=500)
    settings["tol"] = 1e-2  # the float32 bound's roundoff is ~1e-4 here
    ours = BayesianGaussianMixture(backend="reference", **settings).fit(
        data.astype(np.float32))
    theirs = sklearn.mixture.BayesianGaussianMixture(**settings).fit(data)
    assert ours.means_.dtype == np.float32
    assert ours.predict_proba(data.astype(np.float32)).dtype == np.float32
    _assert_same(ours, theirs, ("weights_", "means_", "covariances_"), rtol=1e-4)


def test_kernel_path_in_interpret_mode_matches_the_reference(data):
    settings = dict(n_components=3, covariance_type="diag", random_state=0, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpustat.mixture.ConvergenceWarning)
        kernel = BayesianGaussianMixture(backend="interpret", **settings).fit(data[:40])
        reference = BayesianGaussianMixture(backend="reference", **settings).fit(data[:40])
    _assert_same(kernel, reference, FITTED, rtol=1e-10)
    assert_close(kernel.lower_bound_, reference.lower_bound_, rtol=1e-12)


@pytest.mark.parametrize(("covariance_type", "dtype"), [("full", np.float64),
                                                      ("diag", np.float32)])
def test_fit_and_inference_lower_for_cuda_with_the_kernels(data, covariance_type, dtype,
                                                          monkeypatch):
    """The device loop (E-step kernel, digamma / gammaln, Cholesky) and the inference
    programs lower for CUDA with their Triton kernel calls (deviceless, PALLAS.md; the
    public density ops inside the inference programs are told a GPU is there)."""
    X = data.astype(dtype)
    est = BayesianGaussianMixture(n_components=3, covariance_type=covariance_type,
                                  init_params="random_from_data", max_iter=0,
                                  backend="reference", random_state=0).fit(X)
    user = dict.fromkeys(("weight_concentration", "mean_precision", "mean",
                          "degrees_of_freedom", "covariance"))
    prior = mixture_bayesian._prior_jit(X, user, covariance_type=covariance_type,
                                        n_components=3)
    starts = jax.tree.map(lambda a: a[None], est._posterior)
    settings = dict(path="pallas", precision="highest")

    def fit(X):
        return mixture_bayesian._fit_jit(
            X, prior, starts, np.full(1, -np.inf, dtype), 1e-3, 1e-6,
            prior_type="dirichlet_process", max_iter=5, report_every=0, **settings)

    shape = [jax.ShapeDtypeStruct(X.shape, dtype)]
    assert_lowers_for_cuda(fit, shape)
    monkeypatch.setattr(gpustat._backend, "cuda_gpu_available", lambda: True)
    for program in (mixture_bayesian._predict_jit, mixture_bayesian._predict_proba_jit):
        assert_lowers_for_cuda(lambda X, program=program: program(X, est._params, **settings),
                               shape)


def test_singular_covariance_raises_naming_the_cause(data):
    """A constant feature makes the default covariance prior singular; with reg_covar=0
    scikit-learn raises too."""
    X = data.copy()
    X[:, 1] = 4.0
    settings = dict(n_components=2, reg_covar=0.0, random_state=0, covariance_type="diag")
    with pytest.raises(ValueError, match=r"components \[0, 1\] not positive definite"):
        BayesianGaussianMixture(backend="reference", **settings).fit(X)
    with pytest.raises(ValueError):
        sklearn.mixture.BayesianGaussianMixture(**settings).fit(X)


@pytest.mark.parametrize(("change", "message"), [
    (dict(degrees_of_freedom_prior=1.5), "should be greater than 2"),
    (dict(covariance_prior=np.eye(2)), r"covariance_prior .* shape \(3, 3\)"),
    (dict(covariance_prior=-np.eye(3)), "covariance_prior must be positive definite"),
    (dict(covariance_type="diag", covariance_prior=np.array([1.0, 0.0, 1.0])),
     "covariance_prior must be positive"),
    (dict(covariance_type="spherical", covariance_prior=np.ones(3)), "a finite number > 0"),
    (dict(mean_prior=np.zeros(2)), r"mean_prior must have shape \(3,\)"),
    (dict(weight_concentration_prior=0.0), "weight_concentration_prior must be"),
    (dict(mean_precision_prior=-1.0), "mean_precision_prior must be"),
    (dict(weight_concentration_prior_type="beta"), "weight_concentration_prior_type must"),
    (dict(covariance_type="banded"), "covariance_type must"),
    (dict(init_params="grid"), "init_params must"),
    (dict(precision="f16x3"), "precision must be one of"),
    (dict(backend="triton"), "backend must be one of"),
    (dict(random_state="seed"), "cannot be used to seed"),
    (dict(n_components=200), "Expected n_samples >= n_components"),
])
def test_bad_settings_raise_naming_the_argument(data, change, message):
    with pytest.raises(ValueError, match=message):
        BayesianGaussianMixture(**{"backend": "reference", **change}).fit(data)


def test_unavailable_backend_raises_before_fitting(data):
    if "pallas" in gpustat.available_backends():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(gpustat.BackendUnavailableError):
        BayesianGaussianMixture(backend="pallas").fit(data)


def test_docs_example_runs():
    text = (Path(__file__).resolve().parent.parent / "docs" / "mixture.md").read_text()
    section = text[text.index("## Variational Bayesian mixture"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "docs/mixture.md", "exec"), {})

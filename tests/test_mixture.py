"""Public mixture API: validation and bad input, dispatch, jit/vmap, estimator methods,
BEM, streaming EM and batched restarts."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture

import gpustat
from gpustat import mixture
from gpustat._backend import BackendUnavailableError, cuda_gpu_available
from gpustat.mixture import _ops as mixture_ops
from gpustat.reference import mixture as ref
from tests.helpers import assert_close, count_compiles


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 4.0]])
    X = np.concatenate([rng.normal(size=(40, 2)) * 0.7 + c for c in centres])
    return X[rng.permutation(len(X))]


@pytest.fixture(scope="module")
def params(blobs):
    return mixture.MixtureParams.from_covariances(
        jnp.array([0.3, 0.3, 0.4]), jnp.asarray(blobs[:3]), jnp.broadcast_to(jnp.eye(2), (3, 2, 2)))


def test_public_names_are_exported():
    assert gpustat.GaussianMixture is mixture.GaussianMixture
    assert gpustat.MixtureParams is mixture.MixtureParams
    for name in mixture.__all__:
        assert getattr(mixture, name).__doc__, name


def test_ops_match_reference_under_jit_and_vmap(blobs, params):
    X = jnp.asarray(blobs)
    want = ref.log_prob(X, params)
    assert_close(jax.jit(lambda X: mixture.log_prob(X, params))(X), want, rtol=1e-12)
    # vmap over a batch of parameter sets (e.g. restarts or chains)
    batch = jax.tree.map(lambda a: jnp.stack([a, a]), params)
    got = jax.vmap(lambda prm: mixture.log_prob(X, prm))(batch)
    assert_close(got, jnp.stack([want, want]), rtol=1e-12)
    stats = jax.jit(lambda X: mixture.suff_stats(X, params))(X)
    assert_close(stats.loglik, jnp.sum(want), rtol=1e-12)
    resp = mixture.responsibilities(X, params)
    assert_close(jnp.sum(resp, axis=1), jnp.ones(X.shape[0]), rtol=1e-12)
    labels = jax.jit(lambda k, X: mixture.sample_labels(k, X, params))(jax.random.key(0), X)
    hard = jax.vmap(lambda X: mixture.suff_stats_from_labels(X, labels, 3))(jnp.stack([X, X]))
    assert_close(hard.counts[1], jnp.bincount(labels, length=3), rtol=0)


def test_kernel_ops_keep_float32_accuracy_on_uncentred_data(blobs, params):
    """Public kernel paths shift X by sum_j w_j mu_j: an offset of 1000 costs no accuracy."""
    offset = 1000.0
    X64 = jnp.asarray(blobs) + offset
    p64 = mixture.MixtureParams.from_covariances(params.weights, params.means + offset,
                                                 params.covariances)
    p32 = jax.tree.map(lambda a: a.astype(jnp.float32), p64)
    want = ref.log_prob(X64, p64)
    got = mixture.log_prob(X64.astype(jnp.float32), p32, backend="interpret")
    assert float(jnp.max(jnp.abs(got - want))) < 1e-3
    stats = mixture.suff_stats(X64, p64, backend="interpret")
    oracle = ref.suff_stats(X64, p64)
    assert_close(stats.sum_x, oracle.sum_x, rtol=1e-12)
    assert_close(stats.sum_xx, oracle.sum_xx, rtol=1e-12)
    labels = mixture.sample_labels(jax.random.key(2), X64, p64, backend="interpret")
    assert_close(labels, ref.sample_labels(jax.random.key(2), X64, p64), rtol=0)
    hard = mixture.suff_stats_from_labels(X64, labels, 3, backend="interpret")
    assert_close(hard.sum_xx, ref.suff_stats_from_labels(X64, labels, 3).sum_xx, rtol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_data_raises(blobs, params, bad):
    X = blobs.copy()
    X[3, 1] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        mixture.log_prob(X, params)
    with pytest.raises(ValueError, match="NaN or infinite"):
        mixture.GaussianMixture(2).fit(X)


def test_shape_dtype_and_backend_errors(blobs, params):
    with pytest.raises(ValueError, match="2-D"):
        mixture.log_prob(blobs[0], params)
    with pytest.raises(TypeError, match="floating"):
        mixture.log_prob(blobs.astype(np.int32), params)
    with pytest.raises(ValueError, match="means"):
        mixture.suff_stats(np.zeros((4, 3)), params)
    with pytest.raises(ValueError, match="sample_weight"):
        mixture.suff_stats(blobs, params, np.ones(5))
    with pytest.raises(ValueError, match="non-negative"):
        mixture.suff_stats(blobs, params, -np.ones(len(blobs)))
    with pytest.raises(ValueError, match="labels must lie"):
        mixture.suff_stats_from_labels(blobs, np.full(len(blobs), 3), 3)
    with pytest.raises(ValueError, match="precision"):
        mixture.log_prob(blobs, params, precision="tf32")
    with pytest.raises(ValueError, match="backend"):
        mixture.log_prob(blobs, params, backend="cuda")
    if not cuda_gpu_available():
        with pytest.raises(BackendUnavailableError):
            mixture.log_prob(blobs, params, backend="pallas")
    with pytest.raises(ValueError, match="p <= 32"):
        wide = mixture.MixtureParams.from_covariances(jnp.ones(1), jnp.zeros((1, 40)),
                                                      jnp.eye(40)[None])
        mixture.log_prob(np.zeros((3, 40)), wide, backend="interpret")


def test_auto_takes_the_kernels_on_a_gpu_for_every_dtype(monkeypatch):
    """The committed H100 benchmarks measured the kernels faster than XLA's reference in
    float32 and float64 (docs/mixture.md); past p = 32 features "auto" takes the reference."""
    monkeypatch.setattr(gpustat._backend, "cuda_gpu_available", lambda: True)
    assert mixture_ops.resolve_mixture_backend("auto", 32, "log_prob") == "pallas"
    assert mixture_ops.resolve_mixture_backend("auto", 33, "log_prob") == "reference"


def test_estimator_bad_input(blobs):
    with pytest.raises(ValueError, match="n_samples >= n_components"):
        mixture.GaussianMixture(5).fit(blobs[:4])
    with pytest.raises(ValueError, match="reg_covar"):
        mixture.GaussianMixture(2, reg_covar=-1e-3).fit(blobs)
    with pytest.raises(ValueError, match=r"precisions_init .* shape"):
        mixture.GaussianMixture(3, precisions_init=np.ones((3, 2))).fit(blobs)
    with pytest.raises(ValueError, match="positive definite"):
        bad = np.broadcast_to(np.array([[1.0, 2.0], [2.0, 1.0]]), (3, 2, 2))
        mixture.GaussianMixture(3, precisions_init=bad).fit(blobs)
    with pytest.raises(ValueError, match="positive"):
        mixture.GaussianMixture(3, covariance_type="diag", precisions_init=-np.ones((3, 2))).fit(
            blobs)
    with pytest.raises(ValueError, match="weights_init"):
        mixture.GaussianMixture(3, weights_init=np.array([0.5, 0.5, 0.5])).fit(blobs)
    with pytest.raises(ValueError, match="covariance_type"):
        mixture.GaussianMixture(3, covariance_type="banded").fit(blobs)
    with pytest.raises(ValueError, match="not fitted"):
        mixture.GaussianMixture(3).predict(blobs)


def test_collapsing_component_suggests_reg_covar(blobs):
    X = np.concatenate([np.tile([[50.0, 3.0]], (10, 1)), blobs[:20]])
    gm = mixture.GaussianMixture(2, reg_covar=0.0, weights_init=[0.5, 0.5],
                                 means_init=[[50.0, 3.0], [0.0, 0.0]],
                                 precisions_init=np.broadcast_to(np.eye(2), (2, 2, 2)))
    with pytest.raises(ValueError, match="reg_covar"):
        gm.fit(X)
    # the functional driver reports it per fit instead of raising
    init = mixture.MixtureParams.from_precisions(jnp.array([0.5, 0.5]),
                                                 jnp.array([[50.0, 3.0], [0.0, 0.0]]),
                                                 jnp.broadcast_to(jnp.eye(2), (2, 2, 2)))
    result = mixture.fit_em(X, init, reg_covar=0.0, backend="reference")
    assert int(result.status) == mixture.STATUS_ILL_DEFINED_COVARIANCE


def test_estimator_methods_match_sklearn(blobs):
    start = dict(weights_init=np.full(3, 1 / 3), means_init=blobs[:3],
                 precisions_init=np.broadcast_to(np.eye(2), (3, 2, 2)).copy())
    theirs = SklearnGaussianMixture(3, **start).fit(blobs)
    ours = mixture.GaussianMixture(3, backend="reference", **start).fit(blobs)
    assert ours.converged_ and ours.n_iter_ == theirs.n_iter_
    np.testing.assert_array_equal(ours.predict(blobs), theirs.predict(blobs))
    assert_close(ours.predict_proba(blobs), theirs.predict_proba(blobs), rtol=1e-8, atol=1e-12)
    assert_close(ours.precisions_, theirs.precisions_, rtol=1e-8)
    for method in ("score", "bic", "aic"):
        assert_close(getattr(ours, method)(blobs), getattr(theirs, method)(blobs), rtol=1e-9)
    Xs, ys = ours.sample(500)
    assert Xs.shape == (500, 2) and ys.shape == (500,)
    assert np.all(np.bincount(ys, minlength=3) > 50)
    assert ours.get_params()["n_components"] == 3


def test_restarts_kmeans_init_and_warm_start(blobs):
    X32 = blobs.astype(np.float32)
    gm = mixture.GaussianMixture(3, n_init=2, random_state=1, backend="reference").fit(X32)
    assert gm.means_.dtype == np.float32 and gm.converged_
    # all three planted centres found
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 4.0]])
    dist = np.linalg.norm(gm.means_[:, None] - centres[None], axis=2)
    assert np.all(dist.min(axis=0) < 0.5)
    lb = gm.lower_bound_
    gm.set_params(warm_start=True, max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(X32)
    assert gm.lower_bound_ >= lb - 1e-4


def test_partial_fit_streams_to_the_planted_centres(blobs):
    rng = np.random.default_rng(3)
    gm = mixture.GaussianMixture(3, init_params="k-means++", random_state=0,
                                 backend="reference")
    big = np.concatenate([blobs + rng.normal(size=blobs.shape) * 0.05 for _ in range(4)])
    for _ in range(3):
        for batch in np.split(big[rng.permutation(len(big))], 6):  # 80 rows each
            gm.partial_fit(batch)
    assert gm.n_iter_ == 18 and np.isfinite(gm.lower_bound_)
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 4.0]])
    dist = np.linalg.norm(gm.means_[:, None] - centres[None], axis=2)
    assert np.all(dist.min(axis=0) < 0.5), gm.means_
    assert_close(gm.weights_.sum(), 1.0, rtol=1e-12)


def test_fit_bem_recovers_centres_and_runs_batched_restarts(blobs):
    X = jnp.asarray(blobs)
    init = mixture.initialize(jax.random.key(0), X, 3, method="kmeans", n_init=2)
    result = mixture.fit_bem(X, init, alpha=1.0, backend="reference", max_iter=200)
    assert int(result.status) == mixture.STATUS_OK and bool(result.converged)
    assert result.restart_lower_bounds.shape == (2,)
    assert_close(jnp.sum(result.params.weights), 1.0, rtol=1e-12)
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 4.0]])
    dist = np.linalg.norm(np.asarray(result.params.means)[:, None] - centres[None], axis=2)
    assert np.all(dist.min(axis=0) < 0.5)


def _sklearn_one_em_step(X, gm):
    """scikit-learn's single EM iteration on X from the parameters of ``gm``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=1 does not converge
        return SklearnGaussianMixture(
            gm.n_components, covariance_type=gm.covariance_type, max_iter=1,
            weights_init=gm.weights_, means_init=gm.means_,
            precisions_init=gm.precisions_).fit(X)


@pytest.mark.parametrize("first_shape", [(60, 3, 3), (60, 2, 2)])
def test_partial_fit_after_fit_continues_from_the_fitted_parameters(first_shape):
    """fit resets the stream: a later partial_fit is one EM step on its batch from the
    fitted parameters, whatever a partial_fit before the fit streamed (same or other p, m)."""
    rng = np.random.default_rng(4)
    n, p, k = first_shape
    gm = mixture.GaussianMixture(k, backend="reference", random_state=0)
    gm.partial_fit(rng.normal(size=(n, p)) + np.arange(n)[:, None] % k * 5)
    X = rng.normal(size=(90, 3)) + np.arange(90)[:, None] % 3 * np.array([5.0, -4.0, 3.0])
    gm.set_params(n_components=3).fit(X)
    batch = X[rng.permutation(90)[:45]] + 0.1 * rng.normal(size=(45, 3))
    want = _sklearn_one_em_step(batch, gm)
    gm.partial_fit(batch)
    assert_close(gm.weights_, want.weights_, rtol=1e-8)
    assert_close(gm.means_, want.means_, rtol=1e-8)
    assert_close(gm.covariances_, want.covariances_, rtol=1e-8)


def test_estimator_takes_integer_data_and_numpy_integer_settings(blobs):
    """scikit-learn converts integer and bool X to float64 and takes numpy integers."""
    Xi = np.round(blobs * 10).astype(np.int64)
    start = dict(weights_init=np.full(3, 1 / 3), means_init=Xi[:3].astype(np.float64),
                 precisions_init=np.broadcast_to(np.eye(2) / 100, (3, 2, 2)).copy())
    settings = dict(max_iter=np.int64(100), n_init=np.int32(1), **start)
    theirs = SklearnGaussianMixture(np.int64(3), **settings).fit(Xi)
    ours = mixture.GaussianMixture(np.int64(3), backend="reference", **settings).fit(Xi)
    assert ours.means_.dtype == np.float64 and ours.n_iter_ == theirs.n_iter_
    assert_close(ours.means_, theirs.means_, rtol=1e-8)
    np.testing.assert_array_equal(ours.predict(Xi), theirs.predict(Xi))
    flags = Xi[:10] > 0  # scikit-learn 1.9 scores bool rows wrongly: give it the floats
    assert_close(ours.score_samples(flags), theirs.score_samples(flags.astype(np.float64)),
                 rtol=1e-9)
    with jax.enable_x64(False):
        assert mixture.GaussianMixture(3, backend="reference").fit(Xi).means_.dtype == np.float32
    with pytest.raises(ValueError, match="n_components"):
        mixture.GaussianMixture(True).fit(blobs)
    with pytest.raises(ValueError, match="max_iter"):
        mixture.GaussianMixture(2, max_iter=10.0).fit(blobs)


@pytest.mark.parametrize("name,covariance_type,value", [
    ("means_init", "full", [[np.nan, 0.0], [5.0, 5.0]]),
    ("weights_init", "full", [np.nan, 0.5]),
    ("precisions_init", "full", [[[np.nan, 0.0], [0.0, 1.0]], np.eye(2)]),
    ("precisions_init", "diag", [[np.nan, 1.0], [1.0, 1.0]]),
    ("precisions_init", "spherical", [np.inf, 1.0]),
])
def test_non_finite_user_inits_are_named(blobs, name, covariance_type, value):
    gm = mixture.GaussianMixture(2, covariance_type=covariance_type, backend="reference",
                                 **{name: value})
    with pytest.raises(ValueError, match=f"{name} contains 1 NaN or infinite"):
        gm.fit(blobs)


@pytest.mark.parametrize("backend", ["reference", "interpret"])
def test_sample_labels_are_int32_on_every_backend(blobs, params, backend):
    """Documented int32 labels; the kernel's sum over component blocks promoted to int64."""
    key = jax.random.key(0)
    labels, lp = mixture.sample_labels(key, blobs, params, backend=backend,
                                       return_log_prob=True)
    assert labels.dtype == jnp.int32 and lp.dtype == jnp.float64
    from_stats, _, _ = mixture_ops.dispatch_sample_labels_with_stats(
        key, jnp.asarray(blobs), params, path=backend, precision="highest")
    assert from_stats.dtype == jnp.int32


def _scalar_objectives(backend, labels):
    """Smooth scalars of every differentiable output of the ops, in (X, params, w)."""
    def total(tree):
        return sum(jnp.sum(jnp.cos(leaf)) for leaf in jax.tree.leaves(tree))

    return {
        "mvn_logpdf": lambda X, prm, w: total(mixture.mvn_logpdf(X, prm, backend=backend)),
        "log_prob": lambda X, prm, w: jnp.sum(w * mixture.log_prob(X, prm, backend=backend)),
        "responsibilities": lambda X, prm, w: total(
            mixture.responsibilities(X, prm, backend=backend)),
        "suff_stats": lambda X, prm, w: total(mixture.suff_stats(X, prm, w, backend=backend)),
        "suff_stats_from_labels": lambda X, prm, w: total(
            mixture.suff_stats_from_labels(X, labels, 3, w, backend=backend)),
        "sample_labels": lambda X, prm, w: total(mixture.sample_labels(
            jax.random.key(1), X, prm, backend=backend, return_log_prob=True)[1]),
    }


@pytest.mark.parametrize("op", ["mvn_logpdf", "log_prob", "responsibilities", "suff_stats",
                                "suff_stats_from_labels", "sample_labels"])
def test_gradients_on_the_kernel_path_equal_the_reference(op):
    """jax.grad through the kernels (backend="interpret", as "auto" on a GPU) equals the
    reference's in X, every parameter array and the sample weights (float64)."""
    rng = np.random.default_rng(5)
    X = jnp.asarray(rng.normal(size=(11, 3)) * 2)
    A = rng.normal(size=(3, 3, 3))
    prm = mixture.MixtureParams.from_covariances(
        jnp.array([0.2, 0.3, 0.5]), jnp.asarray(rng.normal(size=(3, 3))),
        jnp.asarray(A @ np.swapaxes(A, 1, 2) + np.eye(3)))
    w = jnp.asarray(rng.uniform(0.5, 2.0, 11))
    labels = jnp.asarray(rng.integers(0, 3, 11))
    f_kernel = _scalar_objectives("interpret", labels)[op]
    f_ref = _scalar_objectives("reference", labels)[op]
    got = jax.grad(f_kernel, argnums=(0, 1, 2))(X, prm, w)
    want = jax.grad(f_ref, argnums=(0, 1, 2))(X, prm, w)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert_close(g, r, rtol=1e-10, atol=1e-12)
    # forward mode too, and the reference's gradient against finite differences
    _, tangent = jax.jvp(f_kernel, (X, prm, w), (X, prm, w))
    assert_close(tangent, jax.jvp(f_ref, (X, prm, w), (X, prm, w))[1], rtol=1e-10)
    check_grads(lambda X, means: f_ref(
        X, mixture.MixtureParams.from_covariances(prm.weights, means, prm.covariances), w),
        (X, prm.means), order=1, modes=("rev",))


def test_streaming_step_sizes_follow_cappe_moulines():
    """rho_t = (t + 1)^-kappa: 1, 2^-kappa, 3^-kappa. With one component every row has
    responsibility 1, so the averaged statistics are weighted batch means (numpy)."""
    rng = np.random.default_rng(6)
    batches = [rng.normal(size=(20, 2)) + 3 * t for t in range(3)]
    init = mixture.MixtureParams.from_covariances(jnp.ones(1), jnp.zeros((1, 2)),
                                                  jnp.eye(2)[None])
    for kappa in (0.6, 0.9):
        state = mixture.online_em_init(batches[0], init)
        shift = batches[0].mean(axis=0)
        want_mean, want_moment = 0.0, 0.0
        for t, batch in enumerate(batches):
            state, _ = mixture.online_em_step(state, batch, kappa=kappa, backend="reference")
            rho = [1.0, 2.0**-kappa, 3.0**-kappa][t]
            centred = batch - shift
            want_mean = (1 - rho) * want_mean + rho * centred.mean(axis=0)
            want_moment = (1 - rho) * want_moment + rho * centred.T @ centred / len(batch)
            assert_close(state.stats.sum_x[0], want_mean, rtol=1e-12, atol=1e-12)
            assert_close(state.stats.sum_xx[0], want_moment, rtol=1e-12, atol=1e-12)
        assert_close(mixture.online_params(state).means[0], want_mean + shift, rtol=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_sample_equals_sklearn_with_the_same_parameters(blobs, covariance_type):
    ours = mixture.GaussianMixture(3, covariance_type=covariance_type, random_state=7,
                                   backend="reference").fit(blobs)
    theirs = SklearnGaussianMixture(3, covariance_type=covariance_type, random_state=7).fit(blobs)
    for name in ("weights_", "means_", "covariances_", "precisions_", "precisions_cholesky_"):
        setattr(theirs, name, getattr(ours, name))
    X, y = ours.sample(200)
    want_X, want_y = theirs.sample(200)
    assert X.dtype == want_X.dtype
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(X, want_X)


def test_jit_closing_over_concrete_data_checks_it_eagerly(blobs, params):
    X = jnp.asarray(blobs)
    labels = jnp.zeros(X.shape[0], jnp.int32)
    weights = jnp.ones(X.shape[0])
    assert_close(jax.jit(lambda: mixture.log_prob(X, params))(), ref.log_prob(X, params),
                 rtol=1e-12)
    stats = jax.jit(lambda: mixture.suff_stats(X, params, sample_weight=weights))()
    assert float(stats.counts.sum()) == pytest.approx(X.shape[0])
    by_label = jax.jit(lambda: mixture.suff_stats_from_labels(X, labels, 3))()
    assert float(by_label.counts[0]) == X.shape[0]
    X_bad, labels_bad = X.at[0, 0].set(jnp.nan), labels + 5  # concrete, built outside jit
    with pytest.raises(ValueError, match="NaN or infinite"):
        jax.jit(lambda: mixture.log_prob(X_bad, params))()
    with pytest.raises(ValueError, match="labels must lie in"):
        jax.jit(lambda: mixture.suff_stats_from_labels(X, labels_bad, 3))()


def test_second_fit_and_inference_of_the_same_shapes_compile_nothing():
    """A fit, predict, predict_proba, score_samples and score of new data of the same
    shapes (a new estimator, as in cross-validation) compiles no program. So does one of
    "diag" after "full" on fewer rows: "diag" runs the programs of "full" on the reference
    path (its M-step keeping the diagonals), and small data (n p^2 <= 2^11) are padded to
    one row count (128 at p = 3)."""
    rng = np.random.default_rng(4)
    X = np.concatenate([rng.normal(size=(60, 3)), rng.normal(size=(60, 3)) + 4.0])

    def run(X, covariance_type="full"):
        # reg_covar of this test alone: its first fit compiles its programs
        gm = gpustat.GaussianMixture(2, covariance_type=covariance_type, random_state=0,
                                     reg_covar=2e-6, backend="reference").fit(X)
        gm.predict(X)
        gm.predict_proba(X)
        gm.score_samples(X)
        gm.score(X)

    assert count_compiles(lambda: run(X)) > 0
    assert count_compiles(lambda: run(X[::-1] * 1.5 + 1.0)) == 0
    assert count_compiles(lambda: run(X[:50], "diag")) == 0


def test_folds_of_nearby_sizes_share_compiled_programs():
    """Rows are padded to a bucket (four sizes per octave) with weight 0: a fit on 106
    rows after one on 100, and inference on 53 rows after 50 (as cross-validation folds),
    by a new estimator with the same settings, compile nothing; the padding changes no
    result (the labels and scores of the rows given, against a fit on the rows alone
    computed by scikit-learn from the fitted parameters). Five features: buckets above
    the small-data minimum (64 rows)."""
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(size=(80, 5)), rng.normal(size=(80, 5)) + 4.0])
    rng.shuffle(X)

    def run(train, test):
        gm = gpustat.GaussianMixture(2, random_state=0, backend="reference").fit(train)
        return gm, gm.predict(test), gm.score_samples(test), gm.score(test)

    assert count_compiles(lambda: run(X[:100], X[100:150])) > 0
    assert count_compiles(lambda: run(X[:106], X[106:159])) == 0
    gm, labels, scores, _ = run(X[:106], X[106:159])
    assert labels.shape == (53,) and scores.shape == (53,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=1 does not converge
        sk = SklearnGaussianMixture(2, weights_init=gm.weights_, means_init=gm.means_,
                                    precisions_init=gm.precisions_, max_iter=1).fit(X[:106])
    # a fixed point of scikit-learn's EM on the 106 rows (six zero rows counted would
    # pull a mean by ~0.4)
    np.testing.assert_allclose(sk.means_, gm.means_, atol=1e-2)
    sk.weights_, sk.means_ = gm.weights_, gm.means_
    sk.precisions_cholesky_ = gm.precisions_cholesky_
    np.testing.assert_allclose(scores, sk.score_samples(X[106:159]), rtol=1e-10)
    np.testing.assert_array_equal(labels, sk.predict(X[106:159]))


def test_functional_ops_called_again_compile_nothing():
    X, params = jnp.ones((7, 2)), mixture.MixtureParams.from_covariances(
        jnp.array([0.4, 0.6]), jnp.array([[0.0, 0.0], [1.0, 1.0]]), jnp.stack([jnp.eye(2)] * 2))

    def run(X):
        for op in (mixture.mvn_logpdf, mixture.log_prob, mixture.responsibilities,
                   mixture.suff_stats):
            op(X, params, backend="reference")
        mixture.sample_labels(jax.random.key(0), X, params, backend="reference")

    other = X * 2.0  # (its own multiply compiles once)
    assert count_compiles(lambda: run(X)) > 0
    assert count_compiles(lambda: run(other)) == 0

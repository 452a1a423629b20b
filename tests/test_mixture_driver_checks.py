"""The drivers' priors and settings: checked and named (fit_em / fit_bem / fit_gibbs /
online_em_step), and priors of another float dtype than X."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.exceptions
from scipy.stats import multivariate_normal
from sklearn.utils.estimator_checks import check_estimator

from gpustat import mixture
from tests.helpers import assert_close

P = 2


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    return np.concatenate([rng.normal(-2.0, 1.0, (15, P)), rng.normal(3.0, 0.5, (15, P))])


@pytest.fixture(scope="module")
def init():
    return mixture.MixtureParams.from_covariances(
        np.array([0.4, 0.6]), np.array([[-2.0, -1.0], [3.0, 2.0]]), np.stack([np.eye(P)] * 2))


def _prior(**change):
    fields = dict(mean=jnp.zeros(P), kappa=jnp.array(0.5), dof=jnp.array(5.0),
                  scale=jnp.array([[1.0, 0.2], [0.2, 2.0]]))
    return mixture.NIWPrior(**{**fields, **change})


def _one_map_em_step(X, init, prior, alpha):
    """One MAP-EM step in numpy float64: scipy responsibilities, NIW posterior mode
    Phi_n / (nu_n + p + 2) (+ reg_covar), Dirichlet mode w_j propto N_j + alpha - 1."""
    m0, kappa, nu, phi = (np.asarray(a, np.float64) for a in
                          (prior.mean, prior.kappa, prior.dof, prior.scale))
    log_w = np.stack([np.log(w) + multivariate_normal(mu, c).logpdf(X) for w, mu, c in zip(
        np.asarray(init.weights), np.asarray(init.means), np.asarray(init.covariances))], 1)
    resp = np.exp(log_w - np.logaddexp.reduce(log_w, axis=1)[:, None])
    counts = resp.sum(0)
    covariances = []
    for r, n in zip(resp.T, counts):
        xbar = r @ X / n
        d = xbar - m0
        phi_n = phi + (X - xbar).T * r @ (X - xbar) + kappa * n / (kappa + n) * np.outer(d, d)
        covariances.append(phi_n / (nu + n + P + 2) + 1e-6 * np.eye(P))
    weights = (counts + alpha - 1) / np.sum(counts + alpha - 1)
    return weights, np.array(covariances)


def test_float64_priors_fit_float32_data(data, init):
    """With x64 on, priors built from jnp arrays are float64; float32 X used to stop with
    a while_loop carry TypeError. They now compute in X's dtype."""
    prior = _prior()
    X32 = data.astype(np.float32)
    init32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), init)
    result = mixture.fit_em(X32, init32, max_iter=1, backend="reference",
                            weight_prior=mixture.DirichletPrior(jnp.array(2.0)),
                            component_prior=prior)
    want_weights, want_covariances = _one_map_em_step(data, init, prior, 2.0)
    assert result.params.covariances.dtype == jnp.float32
    assert_close(result.params.weights, want_weights, rtol=1e-5)
    assert_close(result.params.covariances, want_covariances, rtol=1e-4)


BAD_PRIORS = [
    (dict(component_prior=_prior(mean=jnp.zeros(1))), "component_prior.mean"),
    (dict(component_prior=_prior(kappa=jnp.array(-1.0))), "component_prior.kappa"),
    (dict(component_prior=_prior(dof=jnp.array(0.5))), "component_prior.dof"),
    (dict(component_prior=_prior(scale=-jnp.eye(P))), "component_prior.scale"),
    (dict(weight_prior=mixture.StickBreakingPrior(-1.0)), "weight_prior.alpha"),
]


@pytest.mark.parametrize("bad,name", BAD_PRIORS)
def test_improper_priors_are_named(data, init, bad, name):
    """These ran: a (1,) mean broadcast over p features, a negative-definite scale fit with
    status 0, and the Gibbs chains of every case returned NaN without an error."""
    with pytest.raises(ValueError, match=name):
        mixture.fit_em(data, init, max_iter=1, backend="reference", **bad)
    with pytest.raises(ValueError, match=name):
        mixture.fit_gibbs(jax.random.key(0), data, 2, n_sweeps=1, backend="reference", **bad)


def test_driver_settings_are_named(data, init):
    with pytest.raises(ValueError, match=r"weight_prior\.alpha"):
        mixture.fit_em(data, init, weight_prior=mixture.DirichletPrior(0.0))
    with pytest.raises(TypeError, match="weight_prior"):
        mixture.fit_em(data, init, weight_prior="dirichlet")
    with pytest.raises(ValueError, match="tol"):
        mixture.fit_em(data, init, tol=-1.0)
    diag = mixture.MixtureParams.from_covariances(init.weights, init.means, np.ones((2, P)),
                                                  "diag")
    with pytest.raises(ValueError, match="init"):
        mixture.fit_gibbs(jax.random.key(0), data, 2, init=diag)
    with pytest.raises(ValueError, match="init"):
        mixture.fit_gibbs(jax.random.key(0), data, 3, init=init)


def test_streaming_step_checks_its_batch_and_settings(data, init):
    """A one-feature batch used to broadcast against the state's (p,) shift and run; NaN
    batches, kappa outside (0.5, 1] and negative reg_covar ran too."""
    state = mixture.online_em_init(data, init)
    for p in (1, 3):
        with pytest.raises(ValueError, match="X_batch"):
            mixture.online_em_step(state, np.ones((5, p)))
    with pytest.raises(ValueError, match="NaN"):
        mixture.online_em_step(state, np.full((5, P), np.nan))
    for kappa in (0.0, 0.5, 1.5):
        with pytest.raises(ValueError, match="kappa"):
            mixture.online_em_step(state, data, kappa=kappa)
    with pytest.raises(ValueError, match="reg_covar"):
        mixture.online_em_step(state, data, reg_covar=-1.0)


def test_streaming_step_keeps_the_state_dtype(data, init):
    """A float64 batch turned a float32 stream into a float64 one; a float32 batch is cast
    up to a float64 state (the same step as from the float64 batch)."""
    state32 = mixture.online_em_init(data.astype(np.float32),
                                     jax.tree.map(lambda a: a.astype(np.float32), init))
    with pytest.raises(ValueError, match="X_batch"):
        mixture.online_em_step(state32, data.astype(np.float64))
    state64 = mixture.online_em_init(data, init)
    batch = data[:20].astype(np.float32)
    got, _ = mixture.online_em_step(state64, batch)
    want, _ = mixture.online_em_step(state64, batch.astype(np.float64))
    assert got.params.means.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(got.params.means), np.asarray(want.params.means))


def test_estimator_stream_names_a_wider_batch(data):
    """A stream runs in the dtype it started from: a float64 batch had silently turned a
    float32 stream into a float64 one."""
    gm = mixture.GaussianMixture(2, backend="reference", random_state=0)
    gm.fit(data.astype(np.float32))
    gm.partial_fit(data[:30].astype(np.float32))  # starts the stream in float32
    with pytest.raises(ValueError, match="X is float64 but the stream computes in float32"):
        gm.partial_fit(data[:30])
    assert gm.means_.dtype == np.float32


def test_estimator_passes_scikit_learns_checks():
    """It was not a BaseEstimator: clone / tags failed, predict before fit raised a plain
    ValueError, and sparse, complex, object, 1-D and empty X got gpustat's messages (or a
    JAX TypeError) instead of scikit-learn's."""
    est = mixture.GaussianMixture(2, backend="reference", random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(est, on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])) for r in results
              if r["status"] == "failed"]
    assert not failed, failed
    assert issubclass(mixture.ConvergenceWarning, sklearn.exceptions.ConvergenceWarning)


def test_gibbs_seeding_and_chains_draw_from_separate_keys(data, monkeypatch):
    """The k-means++ seeding split ``key`` into one key per restart, the very keys the
    chains then ran on: each chain's start and sweeps came from one stream."""
    from gpustat.mixture import _gibbs as mixture_gibbs

    seen = []

    def spy(key, *args, **kwargs):  # records the restart keys when the program runs
        restart_keys = jax.random.key_data(jax.random.split(key, kwargs["n_init"]))
        jax.debug.callback(lambda k: seen.append(np.asarray(k)), restart_keys)
        return initialize(key, *args, **kwargs)

    initialize = mixture_gibbs.initialize
    monkeypatch.setattr(mixture_gibbs, "initialize", spy)
    key = jax.random.key(3)
    jax.block_until_ready(mixture.fit_gibbs(key, data, 2, n_sweeps=1, n_chains=1,
                                            backend="reference"))
    seeding = np.asarray(seen[0])
    # the chains' keys are a split of what is left of ``key`` (any split will do): none of
    # the seeding's per-restart keys may be among the keys ``key`` itself splits into
    assert not np.any(np.all(seeding[:, None] == np.asarray(
        jax.random.key_data(jax.random.split(key, 1)))[None], axis=-1))


def test_gibbs_progress_bar_counts_the_sweeps(data, capsys):
    result = mixture.fit_gibbs(jax.random.key(5), data, 2, n_sweeps=3, n_chains=2,
                               backend="reference", progress=True)
    assert np.all(np.isfinite(np.asarray(result.loglik)))
    assert "3/3" in capsys.readouterr().err


def test_verbose_estimator_reports_every_interval(data, capsys):
    """verbose_interval was accepted and ignored; the restarts report side by side."""
    mixture.GaussianMixture(2, max_iter=4, tol=0.0, n_init=2, verbose=1, verbose_interval=2,
                            backend="reference", random_state=0).fit(data)
    lines = [line.split("\t")[0].strip() for line in capsys.readouterr().out.splitlines()
             if "Iteration" in line]
    assert sorted(lines) == [f"Iteration {i} (restart {r})" for i in (2, 4) for r in (0, 1)]
    with pytest.raises(ValueError, match="verbose_interval"):
        mixture.GaussianMixture(2, verbose_interval=0).fit(data)


def test_fit_bem_default_prior_weighs_the_rows(data, init):
    """Oracle: integer sample weights fit as the rows repeated that many times. fit_bem's
    default NIWPrior.weak used the unweighted rows: rows of weight 0 moved the fitted
    covariances by 1.5e-3 and the lower bound by 6e-4."""
    counts = np.random.default_rng(4).integers(0, 4, len(data))
    assert np.any(counts == 0)
    settings = dict(tol=0.0, max_iter=6, backend="reference")
    weighted = mixture.fit_bem(data, init, sample_weight=counts.astype(float), **settings)
    repeated = mixture.fit_bem(np.repeat(data, counts, axis=0), init, **settings)
    for a, b in [(weighted.params.weights, repeated.params.weights),
                 (weighted.params.means, repeated.params.means),
                 (weighted.params.covariances, repeated.params.covariances),
                 (weighted.lower_bound, repeated.lower_bound)]:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_all_zero_sample_weight_is_named(data, init):
    """All-zero weights made every parameter NaN and were reported as status 1 (a
    collapsed covariance)."""
    for fit in (mixture.fit_em, mixture.fit_bem):
        with pytest.raises(ValueError, match="sample_weight"):
            fit(data, init, sample_weight=np.zeros(len(data)), backend="reference")


def test_fit_em_tol_and_max_iter_are_named(data, init):
    """tol=NaN never converged (ran to max_iter with converged False); a non-numeric tol
    and a fractional max_iter failed with messages that named neither."""
    for tol in (float("nan"), "1e-3"):
        with pytest.raises(ValueError, match="tol"):
            mixture.fit_em(data, init, tol=tol, backend="reference")
    for max_iter in (2.5, True):
        with pytest.raises(ValueError, match="max_iter"):
            mixture.fit_em(data, init, max_iter=max_iter, backend="reference")


@pytest.mark.parametrize("name", ["n_components", "n_sweeps", "n_chains"])
def test_fit_gibbs_counts_must_be_integers(data, name):
    """A fractional count failed inside jit with a shape TypeError that named none."""
    counts = dict(n_components=2, n_sweeps=1, n_chains=1)
    counts[name] = 2.5
    with pytest.raises(ValueError, match=name):
        mixture.fit_gibbs(jax.random.key(0), data, counts.pop("n_components"),
                          backend="reference", **counts)


@pytest.mark.parametrize(("bad", "error", "name"), [
    (dict(n_components=0), ValueError, "n_components"),  # was an IndexError
    (dict(n_components=2.0), ValueError, "n_components"),
    (dict(n_init=0), ValueError, "n_init"),  # returned empty parameters
    (dict(n_init=-1), ValueError, "n_init"),
    (dict(kmeans_max_iter=-1), ValueError, "kmeans_max_iter"),
    (dict(reg_covar=-1.0, method="k-means++"), ValueError, "reg_covar"),  # NaN factors
    (dict(X=np.zeros(10)), ValueError, "^X "),
    (dict(X=np.arange(20).reshape(10, P)), TypeError, "^X "),  # was an OverflowError
    (dict(X=np.full((10, P), np.nan)), ValueError, "^X "),  # returned NaN parameters
])
def test_initialize_names_bad_arguments(data, bad, error, name):
    args = {"X": data, "n_components": 2, **bad}
    with pytest.raises(error, match=name):
        mixture.initialize(jax.random.key(0), args.pop("X"), args.pop("n_components"),
                           **args)


def test_kmeans_plusplus_names_a_bad_count(data):
    """n_components=0 failed with an IndexError on the split keys; 2.0 with a shape error."""
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="n_components"):
            mixture.kmeans_plusplus(jax.random.key(0), data, bad)

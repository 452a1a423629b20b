"""The Triton E-step (precision "f16x3"): statistics against the float64 reference, in
Triton's interpreter on CPU and compiled on a GPU, and the choice of path by precision."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpustat import mixture
from gpustat._backend import available_backends
from gpustat.mixture import MixtureParams
from gpustat.reference import mixture as ref

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton package is not installed")


def _problem(n, p, m, covariance_type="full", seed=0, far=False):
    """Centred float32 data from m components and parameters near them; ``far`` puts the
    last component 9 standard deviations beyond every point along the first axis
    (responsibilities 1e-15 and below)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(m, p)) * 2.0
    labels = rng.integers(0, m - 1 if far else m, n)
    X = means[labels] + rng.normal(size=(n, p)) * 0.6
    X -= X.mean(axis=0)
    if far:
        means[-1] = 0.0
        means[-1, 0] = X[:, 0].max() + 9.0 * 0.6
    scale = rng.uniform(0.4, 0.9, size=m)
    if far:
        scale[-1] = 0.6
    cov = {"full": np.einsum("k,ab->kab", scale ** 2, np.eye(p)) + 0.05,
           "tied": np.eye(p) * 0.5 + 0.05,
           "diag": np.outer(scale ** 2, np.ones(p)),
           "spherical": scale ** 2}[covariance_type]
    weights = rng.uniform(0.5, 1.5, size=m)
    params = MixtureParams.from_covariances(jnp.asarray(weights / weights.sum(), jnp.float32),
                                            jnp.asarray(means, jnp.float32),
                                            jnp.asarray(cov, jnp.float32), covariance_type)
    return jnp.asarray(X, jnp.float32), params


def _float64_stats(X, params, w):
    p64 = jax.tree.map(lambda a: a.astype(jnp.float64), params)
    st = ref.suff_stats(X.astype(jnp.float64), p64, None if w is None else w.astype(jnp.float64))
    return jax.tree.map(np.asarray, st)


def _assert_stats_close(got, want, rtol):
    """Each statistic within rtol of its largest magnitude; counts also per component."""
    for name in ("counts", "sum_x", "sum_xx", "loglik"):
        g = np.asarray(getattr(got, name), np.float64)
        e = getattr(want, name)
        assert np.max(np.abs(g - e)) <= rtol * np.max(np.abs(e)), name


@needs_triton
@pytest.mark.parametrize("n,p,m,covariance_type,chunk,weighted", [
    (700, 5, 20, "full", 256, True),   # three chunks, padded components and features
    (300, 16, 256, "full", 1 << 20, False),  # the benchmark's p and m
    (400, 3, 4, "diag", 1 << 20, True),
    (400, 3, 4, "spherical", 1 << 20, False),
    (400, 3, 4, "tied", 128, True),
])
def test_interpreted_statistics_equal_the_float64_reference(n, p, m, covariance_type, chunk,
                                                            weighted):
    from gpustat.triton.mixture import suff_stats

    X, params = _problem(n, p, m, covariance_type)
    w = (jnp.asarray(np.random.default_rng(1).uniform(0, 2, n), jnp.float32) if weighted
         else None)
    got = suff_stats(X, params, w, interpret=True, rows_per_chunk=chunk)
    _assert_stats_close(got, _float64_stats(X, params, w), rtol=2e-6)


@needs_triton
def test_interpreted_log_prob_equals_the_float64_reference():
    from gpustat.triton.mixture import log_prob

    X, params = _problem(700, 4, 9)
    want = ref.log_prob(X.astype(jnp.float64), jax.tree.map(lambda a: a.astype(jnp.float64),
                                                             params))
    got = log_prob(X, params, interpret=True, rows_per_chunk=256)
    # the quadratic form cancels like |x|^2 |Lambda| eps32 (1.4e-5 here); a lost float16 low
    # part would cost ~1e-1
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want), atol=1e-4)


@needs_triton
def test_far_component_keeps_its_relative_precision():
    """Responsibilities below 1e-15 are scaled per row block before the float16 split: the
    far component's statistics keep their relative precision (a fixed 2^14 scale would
    flush them to zero)."""
    from gpustat.triton.mixture import suff_stats

    X, params = _problem(500, 3, 4, far=True)
    got = suff_stats(X, params, interpret=True)
    want = _float64_stats(X, params, None)
    assert 0 < want.counts[-1] < 1e-12
    np.testing.assert_allclose(np.asarray(got.counts[-1], np.float64), want.counts[-1],
                               rtol=1e-3)
    np.testing.assert_allclose(np.asarray(got.sum_x[-1], np.float64), want.sum_x[-1],
                               rtol=1e-3, atol=1e-3 * np.abs(want.sum_x[-1]).max())


@needs_triton
def test_triton_estep_rejects_what_it_cannot_do():
    from gpustat.triton.mixture import suff_stats

    X, params = _problem(64, 2, 3)
    with pytest.raises(ValueError, match="float32"):
        suff_stats(X.astype(jnp.float64), params, interpret=True)
    X, params = _problem(600, 2, 257)
    with pytest.raises(ValueError, match="n_components <= 256"):
        suff_stats(X, params, interpret=True)


def test_f16x3_is_the_estep_precision_only():
    X, params = _problem(64, 2, 3)
    for backend in ("pallas", "interpret"):
        with pytest.raises(ValueError, match="backend='triton'"):
            mixture.suff_stats(X, params, backend=backend, precision="f16x3")
    for op in (mixture.log_prob, mixture.mvn_logpdf, mixture.responsibilities):
        with pytest.raises(ValueError, match="Triton E-step"):
            op(X, params, backend="reference", precision="f16x3")
    with pytest.raises(ValueError, match="pass it explicitly"):
        mixture.suff_stats(X, params, backend="triton", precision="highest")
    with pytest.raises(ValueError, match="backend must be one of"):
        mixture.log_prob(X, params, backend="triton")


def test_auto_f16x3_without_a_gpu_runs_the_reference():
    if "triton" in available_backends():
        pytest.skip("this machine runs the Triton path")
    X, params = _problem(200, 3, 4)
    got = mixture.suff_stats(X, params, precision="f16x3")
    want = _float64_stats(X, params, None)
    _assert_stats_close(got, want, rtol=1e-5)


@pytest.mark.gpu
def test_compiled_statistics_and_em_equal_the_float64_reference():
    X, params = _problem(20_000, 16, 256)
    got = jax.jit(lambda X, params: mixture.suff_stats(X, params, backend="triton",
                                                       precision="f16x3"))(X, params)
    _assert_stats_close(got, _float64_stats(X, params, None), rtol=2e-6)
    fitted = mixture.fit_em(X, params, max_iter=3, backend="triton", precision="f16x3")
    exact = mixture.fit_em(X, params, max_iter=3, backend="pallas", precision="highest")
    np.testing.assert_allclose(np.asarray(fitted.params.means), np.asarray(exact.params.means),
                               atol=2e-4)


def test_estimator_at_f16x3_fits_and_scores_like_highest_off_gpu():
    """GaussianMixture(precision="f16x3"): the E-step's precision; its densities run at
    "highest". Off a GPU "auto" runs the reference for both, so the fits agree."""
    if "triton" in available_backends():
        pytest.skip("this machine runs the Triton path")
    from gpustat import GaussianMixture

    X = np.asarray(_problem(300, 2, 3)[0], np.float64)
    fits = [GaussianMixture(3, precision=precision, random_state=0, max_iter=5).fit(X)
            for precision in ("f16x3", "highest")]
    np.testing.assert_allclose(fits[0].means_, fits[1].means_, rtol=1e-12)
    np.testing.assert_allclose(fits[0].score_samples(X), fits[1].score_samples(X), rtol=1e-12)

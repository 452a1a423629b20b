"""Mixture kernels (interpret mode on CPU, compiled on a GPU) vs the reference ops."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.mixture import GaussianMixture as SklearnGaussianMixture

from gpustat import mixture
from gpustat.mixture import MixtureParams
from gpustat.mixture import _ops as mixture_ops
from gpustat.pallas import mixture as kernels
from gpustat.reference import mixture as ref
from tests.helpers import KernelTests, assert_close, tol

# small blocks so that a few rows/components already span several tiles
BLOCKS = dict(block_n=16, block_k=8)
STATS_BLOCKS = dict(block_n=16, block_k=8, tiles_per_program=2)
LABEL_BLOCKS = dict(block_n=16, tiles_per_item=2)


def make_case(n, p, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * 1.5
    A = rng.normal(size=(k, p, p)) * 0.5
    cov = A @ A.transpose(0, 2, 1) + np.eye(p)
    params = MixtureParams.from_covariances(rng.dirichlet(np.ones(k)), rng.normal(size=(k, p)),
                                            cov, "full")
    return jnp.asarray(X, dtype), jax.tree.map(lambda a: jnp.asarray(a, dtype), params), rng


def kernel_rtol(dtype):
    # float32 whitened products x^T U_j[:, d] - m_jd round like |x| |U| eps: ~10 ulp
    return tol(dtype, "kernel") * (1.0 if dtype == np.float64 else 10.0)


# size 1; ragged rows and components (3 row tiles, 2 component blocks); p = 17 -> P = 32.
# float32 is also covered at k = 256 below and by the label tests. The last column picks
# the second-moment products of the statistics pass.
CASES = [(1, 2, 1, np.float64, "packed"), (37, 3, 9, np.float64, "full"),
         (37, 3, 9, np.float64, "packed"), (50, 17, 9, np.float32, "packed")]


class TestMixtureKernels(KernelTests):
    def compiled_kwargs(self):
        return dict(interpret=True) if self.backend == "interpret" else {}

    @pytest.mark.parametrize("n,p,k,dtype,moments", CASES)
    def test_densities_and_suff_stats(self, n, p, k, dtype, moments):
        X, params, rng = make_case(n, p, k, dtype)
        kw = self.compiled_kwargs()
        rtol = kernel_rtol(dtype)
        assert_close(kernels.log_prob(X, params, **kw, **BLOCKS), ref.log_prob(X, params),
                     rtol=rtol, atol=rtol)
        assert_close(kernels.mvn_logpdf(X, params, **kw, **BLOCKS),
                     ref.mvn_logpdf(X, params), rtol=rtol, atol=rtol)
        w = jnp.asarray(rng.uniform(0.1, 2.0, n), dtype)
        got = kernels.suff_stats(X, params, w, density_blocks=BLOCKS,
                                 stats_blocks=dict(STATS_BLOCKS, moments=moments), **kw)
        want = ref.suff_stats(X, params, w)
        scale = float(jnp.max(jnp.abs(want.sum_xx)))
        assert_close(got.counts, want.counts, rtol=rtol, atol=rtol * n)
        assert_close(got.sum_x, want.sum_x, rtol=rtol, atol=rtol * scale)
        assert_close(got.sum_xx, want.sum_xx, rtol=rtol, atol=rtol * scale)
        np.testing.assert_array_equal(got.sum_xx, jnp.swapaxes(got.sum_xx, 1, 2))
        assert_close(got.loglik, want.loglik, rtol=rtol)

    @pytest.mark.parametrize("n,p,k,dtype", [(1, 2, 1, np.float64), (37, 3, 9, np.float64),
                                             (50, 17, 9, np.float32)])
    def test_centred_suff_stats_vs_numpy(self, n, p, k, dtype):
        """Statistics about a pivot per component against float64 numpy sums of
        r (x - c_j) (x - c_j)^T; ragged rows and components, P = 32 for p = 17."""
        X, params, rng = make_case(n, p, k, dtype)
        kw = self.compiled_kwargs()
        w = rng.uniform(0.1, 2.0, n)
        pivot = np.asarray(params.means, np.float64) + rng.normal(size=(k, p)) * 0.3
        got = kernels.suff_stats(X, params, jnp.asarray(w, dtype), jnp.asarray(pivot, dtype),
                                 density_blocks=BLOCKS, centred_blocks=STATS_BLOCKS, **kw)
        resp = np.asarray(ref.responsibilities(X.astype(jnp.float64), jax.tree.map(
            lambda a: a.astype(jnp.float64), params))) * w[:, None]
        Y = np.asarray(X, np.float64)[:, None, :] - pivot[None]
        want_xx = np.einsum("nk,nka,nkb->kab", resp, Y, Y)
        rtol = kernel_rtol(dtype)
        scale = np.abs(want_xx).max()
        assert_close(got.counts, resp.sum(0), rtol=rtol, atol=rtol * n)
        assert_close(got.sum_x, np.einsum("nk,nka->ka", resp, Y), rtol=rtol, atol=rtol * scale)
        assert_close(got.sum_xx, want_xx, rtol=rtol, atol=rtol * scale)

    def test_centred_statistics_keep_thin_far_components_in_float32(self):
        """Two thin components at +-1e3 from the origin (smallest variance 1e-4): covariances
        from the kernel's statistics about the means keep the smallest eigenvalue to 1e-2
        relative; the raw moments about the origin lose it (cancellation ~eps 1e6)."""
        rng = np.random.default_rng(3)
        p, per = 4, 48
        thin = np.diag([1.0, 0.5, 0.1, 1e-4]) ** 0.5
        means = np.array([[1e3, -1e3, 5e2, 1e3], [-1e3, 1e3, -5e2, -1e3]])
        X = np.concatenate([m + rng.normal(size=(per, p)) @ thin for m in means])
        cov64 = np.stack([np.cov(X[i * per:(i + 1) * per].T, bias=True) for i in range(2)])
        params = MixtureParams.from_covariances(np.full(2, 0.5), means, cov64, "full")
        params32 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
        X32 = jnp.asarray(X, jnp.float32)
        kw = self.compiled_kwargs()
        stats = kernels.suff_stats(X32, params32, None, params32.means, density_blocks=BLOCKS,
                                   centred_blocks=STATS_BLOCKS, **kw)
        got = mixture.m_step(stats, reg_covar=0.0, pivot=params32.means).covariances
        X64 = np.asarray(X32, np.float64)  # the float32 data, exactly
        want = np.stack([np.cov(X64[i * per:(i + 1) * per].T, bias=True) for i in range(2)])
        assert_close(np.linalg.eigvalsh(np.asarray(got, np.float64))[:, 0],
                     np.linalg.eigvalsh(want)[:, 0], rtol=1e-2)
        raw = kernels.suff_stats(X32, params32, density_blocks=BLOCKS,
                                 stats_blocks=STATS_BLOCKS, **kw)
        raw_cov = np.asarray(raw.sum_xx / raw.counts[:, None, None], np.float64) - np.einsum(
            "ka,kb->kab", *(2 * [np.asarray(raw.sum_x / raw.counts[:, None], np.float64)]))
        assert np.all(np.abs(np.linalg.eigvalsh(raw_cov)[:, 0] / np.linalg.eigvalsh(want)[:, 0]
                             - 1) > 1e-1)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_sample_labels_and_label_stats(self, dtype):
        X, params, _ = make_case(37, 3, 5, dtype)
        key = jax.random.key(4)
        kw = self.compiled_kwargs()
        labels, lp = kernels.sample_labels(key, X, params, return_log_prob=True, **kw,
                                           density_blocks=BLOCKS, stats_blocks=BLOCKS)
        want_labels, want_lp = ref.sample_labels(key, X, params, return_log_prob=True)
        # identical uniforms: labels agree except within rounding of a CDF boundary
        assert np.mean(np.asarray(labels) == np.asarray(want_labels)) >= (
            1.0 if dtype == np.float64 else 0.95)
        assert_close(lp, want_lp, rtol=kernel_rtol(dtype), atol=kernel_rtol(dtype))
        rtol = kernel_rtol(dtype)
        got = kernels.suff_stats_from_labels(X, want_labels, 5, **kw, **LABEL_BLOCKS)
        want = ref.suff_stats_from_labels(X, want_labels, 5)
        assert_close(got.counts, want.counts, rtol=0)
        assert_close(got.sum_x, want.sum_x, rtol=rtol, atol=rtol * 10)
        assert_close(got.sum_xx, want.sum_xx, rtol=rtol, atol=rtol * 100)
        # the fused draw + statistics: statistics of the labels it drew, counted apart
        fused_labels, _, fused = kernels.sample_labels_with_stats(
            key, X, params, density_blocks=BLOCKS,
            stats_blocks=dict(STATS_BLOCKS, moments="packed" if dtype == np.float64 else "full"),
            label_blocks=LABEL_BLOCKS, **kw)
        assert_close(fused_labels, labels, rtol=0)
        want = ref.suff_stats_from_labels(X, fused_labels, 5)
        assert_close(fused.counts, want.counts, rtol=0)
        assert_close(fused.sum_x, want.sum_x, rtol=rtol, atol=rtol * 10)
        assert_close(fused.sum_xx, want.sum_xx, rtol=rtol, atol=rtol * 100)

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_label_statistics_of_unsorted_rows_over_many_blocks(self, dtype):
        """k = 29, 150 rows in random order, weighted: most components have no rows,
        component 20 takes half of them (a run over five or six 16-row tiles, so three
        work items of up to 2 tiles), and the other runs start and end inside tiles."""
        rng = np.random.default_rng(7)
        X = jnp.asarray(rng.normal(size=(150, 3)), dtype)
        labels = np.concatenate([np.full(75, 20), rng.choice([0, 3, 7, 16, 23, 28], 75)])
        labels = jnp.asarray(rng.permutation(labels), jnp.int32)
        w = jnp.asarray(rng.uniform(0.1, 2.0, 150), dtype)
        got = kernels.suff_stats_from_labels(X, labels, 29, w, **self.compiled_kwargs(),
                                             **LABEL_BLOCKS)
        want = ref.suff_stats_from_labels(X, labels, 29, w)
        rtol = kernel_rtol(dtype)
        assert_close(got.counts, want.counts, rtol=rtol, atol=rtol * 100)
        assert_close(got.sum_x, want.sum_x, rtol=rtol, atol=rtol * 100)
        assert_close(got.sum_xx, want.sum_xx, rtol=rtol, atol=rtol * 100)

    def test_draws_skip_a_component_block_of_zero_weight(self):
        """k = 9 over two blocks of 8; the first block (and a padded tail) has no mass."""
        X, params, _ = make_case(20, 3, 9, np.float64)
        params = dataclasses.replace(params, weights=jnp.zeros(9).at[8].set(1.0))
        key = jax.random.key(1)
        labels, lp, stats = kernels.sample_labels_with_stats(
            key, X, params, **self.compiled_kwargs(), density_blocks=BLOCKS,
            stats_blocks=STATS_BLOCKS)
        np.testing.assert_array_equal(labels, np.full(20, 8))
        assert_close(lp, ref.mvn_logpdf(X, params)[:, 8], rtol=kernel_rtol(np.float64))
        assert_close(stats.counts, jnp.zeros(9).at[8].set(20.0), rtol=0)
        assert_close(stats.sum_xx[8], X.T @ X, rtol=kernel_rtol(np.float64))

    def test_float32_log_prob_is_within_1e3_of_float64_at_k_256(self):
        """The acceptance precision check at the benchmark's k and p, small n."""
        X64, params64, _ = make_case(64, 16, 256, np.float64, seed=3)
        X32 = X64.astype(jnp.float32)
        params32 = jax.tree.map(lambda a: a.astype(jnp.float32), params64)
        want = np.asarray(ref.log_prob(X64, params64))
        # XLA:CPU has no TF32 dot algorithm: "tf32x3" runs only compiled on the GPU
        precisions = ["highest"] + (["tf32x3"] if self.backend == "pallas" else [])
        for precision in precisions:
            got = kernels.log_prob(X32, params32, precision=precision, block_n=64, block_k=32,
                                   **self.compiled_kwargs())
            err = np.max(np.abs(np.asarray(got, np.float64) - want))
            assert err < 1e-3, (precision, err)

    def test_row_chunks_equal_one_pass(self):
        """37 rows in chunks of 16 (three chunks, the last ragged): statistics, labels and
        log p(x) equal the reference's."""
        X, params, rng = make_case(37, 3, 9, np.float64)
        w = jnp.asarray(rng.uniform(0.1, 2.0, 37))
        kw = dict(self.compiled_kwargs(), rows_per_chunk=16, density_blocks=BLOCKS,
                  stats_blocks=STATS_BLOCKS)
        rtol = kernel_rtol(np.float64)
        key = jax.random.key(3)
        want = ref.suff_stats(X, params, w)
        want_labels, want_lp = ref.sample_labels(key, X, params, return_log_prob=True)
        got = kernels.suff_stats(X, params, w, **kw)
        assert_close(got.sum_xx, want.sum_xx, rtol=rtol, atol=rtol * 100)
        assert_close(got.loglik, want.loglik, rtol=rtol)
        labels, lp, stats = kernels.sample_labels_with_stats(key, X, params, **kw)
        np.testing.assert_array_equal(labels, want_labels)
        assert_close(lp, want_lp, rtol=rtol)
        assert_close(stats.counts, jnp.bincount(want_labels, length=9), rtol=0)


def test_kernel_settings_are_checked():
    X, params, _ = make_case(4, 2, 2, np.float64)
    with pytest.raises(TypeError, match="unknown kernel settings"):
        kernels.log_prob(X, params, interpret=True, moments="quadratic")
    with pytest.raises(ValueError, match="moments"):
        kernels.suff_stats(X, params, interpret=True, stats_blocks=dict(moments="cubic"))
    with pytest.raises(ValueError, match="num_stages"):
        kernels.log_prob(X, params, interpret=True, num_stages=0)
    # precision is checked once, at the public boundary (the kernels trust it)
    with pytest.raises(ValueError, match="precision"):
        mixture.log_prob(X, params, backend="interpret", precision="tf32")
    with pytest.raises(ValueError, match="block_k"):
        kernels.sample_labels(jax.random.key(0), X, params, interpret=True,
                              density_blocks=dict(block_k=16), stats_blocks=dict(block_k=8))


def sklearn_start(covariance_type, p, k):
    precisions = {"full": np.stack([np.eye(p) * (1 + j) for j in range(k)]),
                  "tied": np.eye(p) * 1.5, "diag": np.ones((k, p)) + np.arange(k)[:, None],
                  "spherical": 1.0 + np.arange(k)}[covariance_type]
    return precisions


@pytest.fixture(scope="module")
def clustered():
    rng = np.random.default_rng(2)
    centres = np.array([[0.0, 0.0, 0.0], [4.0, 1.0, -2.0], [-3.0, 5.0, 1.0]])
    return np.concatenate([rng.normal(size=(15, 3)) * (0.5 + 0.5 * j) + centres[j]
                           for j in range(3)]) + 5.0


class TestEMEqualsSklearnThroughKernels(KernelTests):
    @pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
    def test_em_from_the_same_start(self, clustered, covariance_type):
        X = clustered
        kwargs = dict(covariance_type=covariance_type, tol=0.0, max_iter=6,
                      weights_init=np.array([0.2, 0.3, 0.5]), means_init=X[[0, 16, 32]] + 0.25,
                      precisions_init=sklearn_start(covariance_type, 3, 3))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = SklearnGaussianMixture(3, **kwargs).fit(X)
            ours = mixture.GaussianMixture(3, backend=self.backend, **kwargs).fit(X)
        for name in ("weights_", "means_", "covariances_"):
            assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-8, atol=1e-10,
                         err_msg=name)
        assert abs(ours.lower_bound_ - theirs.lower_bound_) <= 1e-8 * abs(theirs.lower_bound_)
        assert_close(ours.score_samples(X), theirs.score_samples(X), rtol=1e-8)


class TestBatchedRestartsThroughKernels(KernelTests):
    def test_vmapped_restarts_match_the_reference(self, clustered):
        X = jnp.asarray(clustered)
        starts = [MixtureParams.from_covariances(jnp.array([0.3, 0.3, 0.4]), X[s:s + 3],
                                                 jnp.broadcast_to(jnp.eye(3), (3, 3, 3)))
                  for s in (0, 20)]
        init = jax.tree.map(lambda *a: jnp.stack(a), *starts)
        got = mixture.fit_em(X, init, tol=0.0, max_iter=4, backend=self.backend)
        want = mixture.fit_em(X, init, tol=0.0, max_iter=4, backend="reference")
        assert_close(got.restart_lower_bounds, want.restart_lower_bounds, rtol=1e-10)
        assert_close(got.params.means, want.params.means, rtol=1e-10, atol=1e-12)


class TestGibbsDrawThroughKernels(KernelTests):
    def test_fused_draw_equals_the_reference_draw_and_count(self, clustered):
        """What a Gibbs sweep takes from the kernels (labels, log p, label statistics) equals
        the reference's separate draw and count from the same key."""
        X = jnp.asarray(clustered - clustered.mean(axis=0))
        params = mixture.MixtureParams.from_covariances(
            jnp.array([0.3, 0.3, 0.4]), X[jnp.array([0, 16, 32])],
            jnp.broadcast_to(jnp.eye(3), (3, 3, 3)))
        key = jax.random.key(7)
        labels, lp, stats = mixture_ops.dispatch_sample_labels_with_stats(
            key, X, params, path=self.backend, precision="highest")
        want_labels, want_lp = ref.sample_labels(key, X, params, return_log_prob=True)
        want = ref.suff_stats_from_labels(X, want_labels, 3)
        np.testing.assert_array_equal(labels, want_labels)
        assert_close(lp, want_lp, rtol=1e-12)
        assert_close(stats.counts, want.counts, rtol=0)
        assert_close(stats.sum_x, want.sum_x, rtol=1e-12, atol=1e-12)
        assert_close(stats.sum_xx, want.sum_xx, rtol=1e-12, atol=1e-12)


def test_benchmark_times_the_default_settings_first():
    """bench_mixture records its first density and statistics settings as the defaults."""
    from benchmarks import bench_mixture

    for precision in ("tf32x3", "highest"):
        defaults = kernels.default_blocks(np.float32, precision)
        for piece, configs in (("density", bench_mixture.DENSITY_CONFIGS),
                               ("stats", bench_mixture.STATS_CONFIGS)):
            first = kernels._settings(defaults[piece], configs[precision][0])
            assert first == defaults[piece], (precision, piece)

"""Mosaic GPU "f16x3" mixture E-step: the kernels' CUDA lowering on CPU, the host side
(padding, splits, unscaling) with the kernels replaced by jnp twins of their contract,
the backend errors, and the compiled kernels on an sm_90 GPU (marked gpu)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jax.experimental.pallas.mosaic_gpu")

from gpustat import mixture
from gpustat._backend import BackendUnavailableError, mosaic_unavailable_reason
from gpustat.pallas import _mosaic_mixture as mm
from gpustat.reference import mixture as ref
from gpustat.reference._mixture_split import MIN_EXP, SPLIT_EXP
from tests.helpers import assert_lowers_for_cuda

HIGHEST = jax.lax.Precision.HIGHEST


def problem(n, p, k, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, p)) * 2.0
    A = rng.normal(size=(k, p, p)) * 0.2
    cov = A @ np.swapaxes(A, 1, 2) + 0.4 * np.eye(p)
    labels = rng.integers(0, k, n)
    X = means[labels] + rng.normal(size=(n, p))
    X -= X.mean(axis=0)
    params = ref.MixtureParams.from_covariances(np.full(k, 1.0 / k), means * 1.05, cov * 1.1,
                                                "full")
    as32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    return as32(X), jax.tree.map(as32, params), X, jax.tree.map(np.asarray, params)


def float64_stats(X64, params64, w=None):
    """The reference statistics in float64 (the test session runs with x64 on)."""
    return jax.tree.map(np.asarray, ref.suff_stats(
        jnp.asarray(X64), jax.tree.map(jnp.asarray, params64),
        None if w is None else jnp.asarray(w, jnp.float64)))


def assert_stats_close(got, want, rtol):
    for name in ("counts", "sum_x", "sum_xx"):
        g, e = np.asarray(getattr(got, name), np.float64), getattr(want, name)
        scale = np.max(np.abs(e))
        np.testing.assert_allclose(g / scale, e / scale, rtol=0, atol=rtol, err_msg=name)
    np.testing.assert_allclose(float(got.loglik), float(want.loglik), rtol=rtol)


def density_twin(phi_hi, phi_lo, w_hi, w_lo, inv_scale, bias, weight, *, write_resp=True):
    """The density kernel's contract in jnp: three products, log p(x), R scaled per
    (64-row block, component) to <= 2^SPLIT_EXP and split, the blocks' exponents."""
    f32 = jnp.float32

    def dot(a, b):
        return jnp.dot(a.astype(f32), b.astype(f32), precision=HIGHEST)

    logit = (dot(phi_lo, w_hi) + dot(phi_hi, w_lo) + dot(phi_hi, w_hi)) * inv_scale + bias
    lse = jax.nn.logsumexp(logit, axis=1)
    r = (jnp.exp(logit - lse[:, None]) * weight[:, None]).reshape(-1, mm.BLOCK_M, w_hi.shape[1])
    r_exp = jnp.maximum(jnp.ceil(jnp.log2(jnp.max(r, axis=1))), MIN_EXP)
    scaled = (r * jnp.exp2(SPLIT_EXP - r_exp)[:, None, :]).reshape(phi_hi.shape[0], -1)
    hi = scaled.astype(jnp.float16)
    return lse, hi, (scaled - hi.astype(f32)).astype(jnp.float16), r_exp


def stats_twin(r_hi, r_lo, phi_hi, phi_lo, r_exp):
    f32 = jnp.float32
    blocks = r_exp.shape[0]
    r = (r_hi.astype(f32) + r_lo.astype(f32)).reshape(blocks, mm.BLOCK_M, -1)
    phi = (phi_hi.astype(f32) + phi_lo.astype(f32)).reshape(blocks, mm.BLOCK_M, -1)
    T = jnp.einsum("bik,bif->bkf", r, phi, precision=HIGHEST)
    return jnp.sum(T * jnp.exp2(r_exp - SPLIT_EXP)[:, :, None], axis=0)


def test_host_side_with_kernel_twins_matches_float64(monkeypatch):
    """Padding to 64-row blocks, zero-weight pad rows, feature and weight splits, the
    unscaling of R^T Phi and the assembled statistics, with sample weights."""
    monkeypatch.setattr(mm, "_density", density_twin)
    monkeypatch.setattr(mm, "_stats", stats_twin)
    monkeypatch.setattr(mm, "lowers_with_this_jax", lambda: True)  # no kernel is lowered
    X, params, X64, params64 = problem(300, 3, 5)  # 300 rows: a partial last block
    w = np.random.default_rng(1).uniform(0.5, 2.0, 300)
    got = jax.jit(functools.partial(mm.suff_stats, rows_per_chunk=256))(
        X, params, jnp.asarray(w, jnp.float32))
    assert_stats_close(got, float64_stats(X64, params64, w), rtol=2e-5)


def _lower_both_kernels(n_features, n_components):
    F_pad, K = mm._padded_sizes(n_features, n_components)
    n = 4 * mm.BLOCK_M
    S = jax.ShapeDtypeStruct
    f16, f32 = jnp.float16, jnp.float32
    assert_lowers_for_cuda(mm._density, (S((n, F_pad), f16), S((n, F_pad), f16),
                                         S((F_pad, K), f16), S((F_pad, K), f16), S((K,), f32),
                                         S((K,), f32), S((n,), f32)), calls=("mosaic_gpu",))
    assert_lowers_for_cuda(mm._stats, (S((n, K), f16), S((n, K), f16), S((n, F_pad), f16),
                                       S((n, F_pad), f16), S((4, K), f32)), calls=("mosaic_gpu",))


@pytest.mark.parametrize("n_features, n_components", [(2, 5), (16, 256)])
def test_kernels_lower_for_cuda(n_features, n_components):
    """jax 0.11: both kernels lower. Later jax: they do not, and the dispatch says so
    (backend='mosaic' raises that reason) instead of failing inside the lowering."""
    if mm.lowers_with_this_jax():
        _lower_both_kernels(n_features, n_components)
        assert mm.supports(jnp.float32, n_features, n_components) == ""
    else:
        from jax.experimental.mosaic.gpu.fragmented_array import TransferPlanDerivationError

        with pytest.raises(TransferPlanDerivationError):
            _lower_both_kernels(n_features, n_components)
        assert "jax 0.11 only" in mm.supports(jnp.float32, n_features, n_components)


@pytest.mark.skipif(not mosaic_unavailable_reason(), reason="this machine runs Mosaic GPU")
def test_mosaic_backend_unavailable_names_why():
    X, params, _, _ = problem(64, 2, 3)
    with pytest.raises(BackendUnavailableError, match=r"Mosaic GPU.*needs"):
        mixture.suff_stats(X, params, backend="mosaic", precision="f16x3")


def test_mosaic_needs_f16x3():
    X, params, _, _ = problem(64, 2, 3)
    with pytest.raises(ValueError, match="pass it explicitly"):
        mixture.suff_stats(X, params, backend="mosaic", precision="highest")


@pytest.mark.gpu
def test_compiled_statistics_and_log_prob_match_float64():
    if mosaic_unavailable_reason():
        pytest.skip(f"Mosaic GPU needs {mosaic_unavailable_reason()}")
    X, params, X64, params64 = problem(20_000 + 37, 16, 256)
    got = mixture.suff_stats(X, params, backend="mosaic", precision="f16x3")
    assert_stats_close(got, float64_stats(X64, params64), rtol=1e-5)
    exact = np.asarray(ref.log_prob(jnp.asarray(X64), jax.tree.map(jnp.asarray, params64)))
    lp = np.asarray(jax.jit(mm.log_prob)(X, params))
    assert np.max(np.abs(lp - exact)) <= 2e-4


@pytest.mark.gpu
def test_fit_em_on_mosaic_follows_the_float64_fit():
    """Three EM iterations through the public driver on the Mosaic GPU E-step track the
    same iterations in float64 on the reference path."""
    if mosaic_unavailable_reason():
        pytest.skip(f"Mosaic GPU needs {mosaic_unavailable_reason()}")
    X, params, X64, params64 = problem(8192, 8, 32, seed=3)
    got = mixture.fit_em(X, params, tol=0.0, max_iter=3, backend="mosaic", precision="f16x3")
    want = mixture.fit_em(jnp.asarray(X64), jax.tree.map(jnp.asarray, params64), tol=0.0,
                          max_iter=3, backend="reference")
    np.testing.assert_allclose(np.asarray(got.lower_bounds), np.asarray(want.lower_bounds),
                               rtol=0, atol=2e-4)
    np.testing.assert_allclose(np.asarray(got.params.means), np.asarray(want.params.means),
                               rtol=0, atol=1e-3)

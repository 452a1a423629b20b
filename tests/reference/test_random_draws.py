"""Batched-proposal gamma and beta draws vs scipy (Kolmogorov-Smirnov) and closed-form moments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gpustat.mixture import _random as random_draws

DRAWS = 20_000


def ks_pvalue(sample, dist):
    return stats.kstest(np.asarray(sample, np.float64), dist.cdf).pvalue


@pytest.mark.parametrize("shape", [0.05, 0.3, 1.0, 2.5, 40.0, 1e4])
def test_gamma_float64_follows_scipy(shape):
    draws = random_draws.gamma(jax.random.key(3), jnp.full((DRAWS,), shape, jnp.float64))
    assert draws.dtype == jnp.float64
    assert ks_pvalue(draws, stats.gamma(shape)) > 1e-3


@pytest.mark.parametrize("shape", [0.5, 3.0, 100.0])
def test_gamma_float32_follows_scipy(shape):
    draws = random_draws.gamma(jax.random.key(4), jnp.full((DRAWS,), shape, jnp.float32))
    assert draws.dtype == jnp.float32
    assert ks_pvalue(draws, stats.gamma(shape)) > 1e-3


def test_redraw_loop_keeps_the_distribution():
    # one proposal a round: ~5% of the elements at shape 1 go through the while_loop
    draws = random_draws.gamma(jax.random.key(5), jnp.ones(DRAWS), proposals=1)
    assert ks_pvalue(draws, stats.gamma(1.0)) > 1e-3


def test_log_gamma_keeps_tiny_draws_in_logarithms():
    logs = random_draws.log_gamma(jax.random.key(6), jnp.full((DRAWS,), 0.01, jnp.float32))
    assert np.all(np.isfinite(logs))
    assert ks_pvalue(np.exp(np.asarray(logs, np.float64)), stats.gamma(0.01)) > 1e-3


@pytest.mark.parametrize("a, b", [(0.7, 3.0), (25.0, 4000.0), (1.0, 1.0)])
def test_beta_follows_scipy(a, b):
    draws = random_draws.beta(jax.random.key(7), jnp.full((DRAWS,), a), b)
    assert ks_pvalue(draws, stats.beta(a, b)) > 1e-3


def test_invalid_shapes_give_nan_and_the_rest_draw():
    a = jnp.array([jnp.nan, -1.0, 0.0, jnp.inf, 2.0])
    draws = np.asarray(random_draws.gamma(jax.random.key(8), a))
    assert np.all(np.isnan(draws[:4])) and np.isfinite(draws[4]) and draws[4] > 0


def test_jit_and_vmap_over_keys_give_independent_draws():
    keys = jax.random.split(jax.random.key(9), 4000)
    draws = jax.jit(jax.vmap(lambda k: random_draws.gamma(k, jnp.array([2.0, 0.4]))))(keys)
    assert draws.shape == (4000, 2)
    assert ks_pvalue(draws[:, 0], stats.gamma(2.0)) > 1e-3
    assert ks_pvalue(draws[:, 1], stats.gamma(0.4)) > 1e-3


@pytest.mark.parametrize("dtype, shape", [(jnp.bfloat16, 300.0), (jnp.float16, 1000.0),
                                          (jnp.float32, 1e8)])
def test_gamma_moments_in_low_precision(dtype, shape):
    # 16-bit parameters are drawn in float32; large shapes need d (1 - v + log v) in the
    # acceptance test (d - d v loses d * eps: variance 0.84 a at a = 1e8 in float32)
    draws = random_draws.gamma(jax.random.key(10), jnp.full((DRAWS,), shape, dtype))
    assert draws.dtype == dtype
    draws = np.asarray(draws, np.float64)
    assert abs(draws.mean() - shape) < 5 * np.sqrt(shape / DRAWS)  # Gamma: mean = var = a
    assert abs(draws.var() / shape - 1) < 6 * np.sqrt(2 / DRAWS)


def test_beta_takes_the_array_dtype_over_a_python_number():
    draws = jax.eval_shape(lambda: random_draws.beta(jax.random.key(11), jnp.ones(3, jnp.float32), 2.0))
    assert draws.dtype == jnp.float32


def test_proposals_below_one_are_rejected():
    with pytest.raises(ValueError, match="proposals"):
        random_draws.gamma(jax.random.key(12), jnp.ones(3), proposals=0)

"""Quadratic features of a Gaussian mixture's log-densities.

With phi(x) = [x_a x_b (a <= b, row-major), x, 1] (F = p(p+1)/2 + p + 1 features) and, per
component j with precision Lambda_j = U_j U_j^T,

    W[:, j] = [-1/2 Lambda_ab (x2 off the diagonal), Lambda mu, c_j],
    c_j = log w_j + log det U_j - p/2 log 2 pi - 1/2 mu^T Lambda mu,

phi(x)^T W[:, j] = log w_j + log N(x | mu_j, Sigma_j): the densities of a row block are one
GEMM and the statistics N_j, sum r x, sum r x x^T one more (R^T Phi,
:func:`stats_from_quadratic`). Used by the Triton
E-step (:mod:`gpustat.triton.mixture`) and the benchmarks' plain-XLA baseline. The form
cancels like |x|^2 |Lambda| eps: centre X first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gpustat.mixture_params import MixtureParams, SuffStats, full_precision_cholesky

__all__ = ["n_features", "quadratic_features", "quadratic_weights", "stats_from_quadratic"]

HIGHEST = jax.lax.Precision.HIGHEST


def n_features(p: int) -> int:
    """F = p(p+1)/2 + p + 1 quadratic features."""
    return p * (p + 1) // 2 + p + 1


def quadratic_features(X):
    """(n, F) Phi = [x_a x_b (a <= b, row-major), x, 1], built from column slices."""
    p = X.shape[1]
    products = [X[:, a:a + 1] * X[:, a:] for a in range(p)]
    return jnp.concatenate([*products, X, jnp.ones((X.shape[0], 1), X.dtype)], axis=1)


def quadratic_weights(params: MixtureParams):
    """(F, m) W with Phi(x) W[:, j] = log w_j + log N(x | mu_j, Sigma_j), any covariance type."""
    p = params.means.shape[1]
    chol = full_precision_cholesky(params)
    prec = jnp.matmul(chol, jnp.swapaxes(chol, 1, 2), precision=HIGHEST)
    a, b = np.triu_indices(p)
    quad = -0.5 * prec[:, a, b] * np.where(a == b, 1.0, 2.0).astype(prec.dtype)
    lin = jnp.einsum("kab,kb->ka", prec, params.means, precision=HIGHEST)
    logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(chol, axis1=1, axis2=2))), axis=1)
    const = (jnp.log(params.weights) + logdet - 0.5 * p * np.log(2 * np.pi)
             - 0.5 * jnp.sum(lin * params.means, axis=1))
    return jnp.concatenate([quad, lin, const[:, None]], axis=1).T


def stats_from_quadratic(T, p: int, loglik=0.0) -> SuffStats:
    """:class:`SuffStats` from T = R^T Phi (m, F): the columns of x x^T (a <= b, mirrored),
    of x and of 1, and the given log-likelihood."""
    a, b = np.triu_indices(p)
    nq = len(a)
    sum_xx = (jnp.zeros((T.shape[0], p, p), T.dtype).at[:, a, b].set(T[:, :nq])
              .at[:, b, a].set(T[:, :nq]))
    return SuffStats(T[:, nq + p], T[:, nq:nq + p], sum_xx, jnp.asarray(loglik, T.dtype))

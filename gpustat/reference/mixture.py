"""Reference (pure jax.numpy) Gaussian-mixture E-step operations: the meaning of each op.

Per row x and component j (scikit-learn's formulation, Suchard et al. 2010, eq. 1):

    log N(x | mu_j, Sigma_j) = -p/2 log 2 pi + log det U_j - 1/2 ||(x - mu_j)^T U_j||^2,

with U_j U_j^T = Sigma_j^-1. Rows are processed by ``lax.map`` in chunks of
``batch_size`` rows (vmapped inside a chunk), so no op ever holds more than
``batch_size x k`` log-densities except ``mvn_logpdf``/``responsibilities``,
whose outputs are n x k by definition.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from gpustat.mixture_params import (
    MixtureParams,
    SuffStats,
    full_precision_cholesky,
    log_det_precision_cholesky,
)

__all__ = [
    "log_prob",
    "mvn_logpdf",
    "responsibilities",
    "sample_labels",
    "suff_stats",
    "suff_stats_from_labels",
    "suff_stats_from_responsibilities",
    "weighted_log_prob",
]

DEFAULT_BATCH_SIZE = 4096
# XLA runs float32 matmuls as TF32 on NVIDIA GPUs unless told otherwise.
_EXACT = jax.lax.Precision.HIGHEST


def _row_mvn_logpdf(x, means, chol, log_det):
    """(k,) component log-densities of one row x (p,)."""
    y = jnp.einsum("kp,kpq->kq", x[None, :] - means, chol, precision=_EXACT)
    return -0.5 * (x.shape[0] * math.log(2 * math.pi) + jnp.sum(y * y, axis=-1)) + log_det


def _map_rows(row_fn, X, batch_size):
    return jax.lax.map(row_fn, X, batch_size=max(1, min(batch_size, X.shape[0])))


def mvn_logpdf(X, params: MixtureParams, *, batch_size: int = DEFAULT_BATCH_SIZE):
    """(n, k) log N(x_i | mu_j, Sigma_j)."""
    chol = full_precision_cholesky(params)
    log_det = log_det_precision_cholesky(params)
    return _map_rows(lambda x: _row_mvn_logpdf(x, params.means, chol, log_det), X, batch_size)


def _row_weighted_fn(params: MixtureParams):
    chol = full_precision_cholesky(params)
    log_det = log_det_precision_cholesky(params)
    log_w = jnp.log(params.weights)
    return lambda x: _row_mvn_logpdf(x, params.means, chol, log_det) + log_w


def weighted_log_prob(X, params: MixtureParams, *, batch_size: int = DEFAULT_BATCH_SIZE):
    """(n, k) log w_j + log N(x_i | mu_j, Sigma_j)."""
    return _map_rows(_row_weighted_fn(params), X, batch_size)


def log_prob(X, params: MixtureParams, *, batch_size: int = DEFAULT_BATCH_SIZE):
    """(n,) log p(x_i) = logsumexp_j (log w_j + log N(x_i | mu_j, Sigma_j))."""
    row = _row_weighted_fn(params)
    return _map_rows(lambda x: jax.nn.logsumexp(row(x)), X, batch_size)


def responsibilities(X, params: MixtureParams, *, batch_size: int = DEFAULT_BATCH_SIZE):
    """(n, k) posterior component probabilities r_ij."""
    row = _row_weighted_fn(params)
    return _map_rows(lambda x: jax.nn.softmax(row(x)), X, batch_size)


def _chunked_stats(chunk_fn, batch_size, X, *row_arrays):
    """Sum ``chunk_fn(X_chunk, *row_array_chunks)`` over row chunks (padding rows are 0).

    Padded rows have weight 0 (the first row array is always the weights).
    """
    n = X.shape[0]
    chunk = max(1, min(batch_size, n))
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    chunks = [jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(n_chunks, chunk,
                                                                        *a.shape[1:])
              for a in (X, *row_arrays)]
    first = chunk_fn(*(c[0] for c in chunks))
    if n_chunks == 1:
        return first
    return jax.lax.fori_loop(1, n_chunks, lambda i, acc: acc + chunk_fn(*(c[i] for c in chunks)),
                             first)


def _stats_of(X, resp, loglik, pivot=None):
    """SuffStats of one chunk from its (already weighted) responsibilities (c, k); with a
    pivot (k, p), of the deviations x - c_j from component j's pivot."""
    if pivot is not None:
        Y = X[:, None, :] - pivot[None, :, :]  # (c, k, p)
        return SuffStats(
            counts=jnp.sum(resp, axis=0),
            sum_x=jnp.einsum("ck,cka->ka", resp, Y, precision=_EXACT),
            sum_xx=jnp.einsum("ck,cka,ckb->kab", resp, Y, Y, precision=_EXACT),
            loglik=loglik,
        )
    return SuffStats(
        counts=jnp.sum(resp, axis=0),
        sum_x=jnp.matmul(resp.T, X, precision=_EXACT),
        sum_xx=jnp.einsum("ck,ca,cb->kab", resp, X, X, precision=_EXACT),
        loglik=loglik,
    )


def _unit_weights(X, sample_weight):
    return jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight


def suff_stats(X, params: MixtureParams, sample_weight=None, pivot=None, *,
               batch_size: int = DEFAULT_BATCH_SIZE) -> SuffStats:
    """E-step statistics (N, sum r x, sum r x x^T, sum w log p) accumulated over row chunks.

    With ``pivot`` (k, p) the moments are centred per component: sum_i r_ij (x_i - c_j)
    and sum_i r_ij (x_i - c_j)(x_i - c_j)^T, each deviation formed before its product, so
    that a covariance S2'/N - d d^T (d = S1'/N) keeps the small eigenvalues of a
    component far from the origin when c_j is near its mean.
    """
    row = _row_weighted_fn(params)

    def chunk_fn(Xc, wc):
        wlp = jax.vmap(row)(Xc)
        lse = jax.nn.logsumexp(wlp, axis=1)
        resp = jnp.exp(wlp - lse[:, None]) * wc[:, None]
        return _stats_of(Xc, resp, jnp.sum(wc * lse), pivot)

    return _chunked_stats(chunk_fn, batch_size, X, _unit_weights(X, sample_weight))


def suff_stats_from_responsibilities(X, resp, sample_weight=None) -> SuffStats:
    """Statistics of given responsibilities (n, k) (loglik 0: none is defined)."""
    w = _unit_weights(X, sample_weight)
    return _stats_of(X, resp * w[:, None], jnp.zeros((), X.dtype))


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           batch_size: int = DEFAULT_BATCH_SIZE) -> SuffStats:
    """Statistics of hard labels (n,) in [0, k): one-hot responsibilities, chunked."""
    def chunk_fn(Xc, wc, labels_c):
        onehot = jax.nn.one_hot(labels_c, n_components, dtype=X.dtype) * wc[:, None]
        return _stats_of(Xc, onehot, jnp.zeros((), X.dtype))

    return _chunked_stats(chunk_fn, batch_size, X, _unit_weights(X, sample_weight), labels)


def sample_labels(key, X, params: MixtureParams, *, batch_size: int = DEFAULT_BATCH_SIZE,
                  return_log_prob: bool = False):
    """One categorical draw per row from its responsibilities, by inverse CDF.

    Row i uses one uniform u_i ~ U(0, 1) (``jax.random.uniform(key, (n,))``): the label
    is the first j with sum_{l<=j} r_il > u_i. Returns labels (n,) int32, and with
    ``return_log_prob`` also log p(x_i) (n,).
    """
    row = _row_weighted_fn(params)
    u = jax.random.uniform(key, (X.shape[0],), dtype=X.dtype)

    def draw(args):
        x, ui = args
        wlp = row(x)
        top = jnp.max(wlp)
        cdf = jnp.cumsum(jnp.exp(wlp - top))
        label = jnp.minimum(jnp.sum(cdf <= ui * cdf[-1]), wlp.shape[0] - 1)
        return label.astype(jnp.int32), top + jnp.log(cdf[-1])

    labels, lp = jax.lax.map(draw, (X, u), batch_size=max(1, min(batch_size, X.shape[0])))
    return (labels, lp) if return_log_prob else labels


"""Gaussian mixtures, the meaning: parameters, sufficient statistics, E-step ops.

A mixture of k normals in p dimensions, x ~ sum_j w_j N(mu_j, Sigma_j), is stored the
way scikit-learn stores it: ``weights`` (k,), ``means`` (k, p), ``covariances`` and
``precisions_cholesky`` whose shapes depend on ``covariance_type``:

=============  ==================  =========================================
type           covariances         precisions_cholesky (U with U U^T = Sigma^-1)
=============  ==================  =========================================
``full``       (k, p, p)           (k, p, p), upper triangular
``tied``       (p, p)              (p, p), upper triangular
``diag``       (k, p)              (k, p), 1 / sqrt(variances)
``spherical``  (k,)                (k,), 1 / sqrt(variance)
=============  ==================  =========================================

The log-density of component j is
``log N(x | mu_j, Sigma_j) = -p/2 log(2 pi) + sum log diag U_j - 1/2 ||(x - mu_j)^T U_j||^2``.

Per row x and component j (scikit-learn's formulation, Suchard et al. 2010, eq. 1):

    log N(x | mu_j, Sigma_j) = -p/2 log 2 pi + log det U_j - 1/2 ||(x - mu_j)^T U_j||^2,

with U_j U_j^T = Sigma_j^-1. Rows are processed by ``lax.map`` in chunks of
``batch_size`` rows (vmapped inside a chunk), so no op ever holds more than
``batch_size x k`` log-densities except ``mvn_logpdf``/``responsibilities``,
whose outputs are n x k by definition.

Quadratic features (:func:`quadratic_features`, :func:`quadratic_weights`):
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

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from gpustat._arrays import row_weights

__all__ = [
    "COVARIANCE_TYPES",
    "MixtureParams",
    "SuffStats",
    "covariances_from_precisions_cholesky",
    "full_precision_cholesky",
    "log_det_precision_cholesky",
    "log_prob",
    "mvn_logpdf",
    "n_features",
    "precisions_cholesky_from_covariances",
    "precisions_cholesky_from_precisions",
    "quadratic_features",
    "quadratic_weights",
    "responsibilities",
    "sample_labels",
    "stats_from_quadratic",
    "suff_stats",
    "suff_stats_from_labels",
    "suff_stats_from_responsibilities",
    "weighted_log_prob",
]

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def _check_type(covariance_type: str) -> None:
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type=!r}")


def _check_shapes(weights, means, matrices, covariance_type: str, name: str) -> None:
    """Raise unless weights (*b, k), means (*b, k, p) and ``name`` (the covariance type's
    shape) agree on k and p."""
    if means.ndim < 2 or weights.shape != means.shape[:-1]:
        raise ValueError(f"weights must be (*b, k) and means (*b, k, p) with one k, got "
                         f"{weights.shape=} and {means.shape=}")
    *batch, k, p = means.shape
    expected = tuple(batch) + {"full": (k, p, p), "tied": (p, p), "diag": (k, p),
                               "spherical": (k,)}[covariance_type]
    if matrices.shape != expected:
        raise ValueError(f"{name} for covariance_type={covariance_type!r} must have shape "
                         f"{expected}, got {matrices.shape}")


def _upper_cholesky_of_inverse(cov: Float[Array, "p p"]) -> Float[Array, "p p"]:
    """U upper triangular with U U^T = cov^-1 (scikit-learn's convention); NaN if not PD."""
    lower = jnp.linalg.cholesky(cov)
    eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
    return jax.scipy.linalg.solve_triangular(lower, eye, lower=True).T


def _upper_cholesky(precision: Float[Array, "p p"]) -> Float[Array, "p p"]:
    """U upper triangular with U U^T = precision (Cholesky of the flipped matrix, flipped back)."""
    return jnp.flip(jnp.linalg.cholesky(jnp.flip(precision, (-2, -1))), (-2, -1))


def precisions_cholesky_from_covariances(covariances, covariance_type: str):
    """Precision Cholesky factors from covariances; NaN entries where a covariance is not PD."""
    _check_type(covariance_type)
    if covariance_type == "full":
        return jax.vmap(_upper_cholesky_of_inverse)(covariances)
    if covariance_type == "tied":
        return _upper_cholesky_of_inverse(covariances)
    return jnp.where(covariances > 0, jax.lax.rsqrt(jnp.abs(covariances)), jnp.nan)


def precisions_cholesky_from_precisions(precisions, covariance_type: str):
    """Precision Cholesky factors from precision matrices (scikit-learn's ``precisions_init``)."""
    _check_type(covariance_type)
    if covariance_type == "full":
        return jax.vmap(_upper_cholesky)(precisions)
    if covariance_type == "tied":
        return _upper_cholesky(precisions)
    return jnp.where(precisions > 0, jnp.sqrt(jnp.abs(precisions)), jnp.nan)


def covariances_from_precisions_cholesky(precisions_cholesky, covariance_type: str):
    """Covariances (U U^T)^-1 from precision Cholesky factors."""
    _check_type(covariance_type)
    if covariance_type in ("full", "tied"):
        def one(u):
            eye = jnp.eye(u.shape[-1], dtype=u.dtype)
            inv_u = jax.scipy.linalg.solve_triangular(u, eye, lower=False)
            return jnp.matmul(inv_u.T, inv_u, precision=jax.lax.Precision.HIGHEST)
        return jax.vmap(one)(precisions_cholesky) if covariance_type == "full" else one(
            precisions_cholesky)
    return 1.0 / precisions_cholesky**2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MixtureParams:
    """Parameters of a Gaussian mixture (a pytree; ``covariance_type`` is static).

    Attributes:
        weights: (k,) mixing weights, positive, summing to one.
        means: (k, p) component means.
        covariances: covariances in scikit-learn's shape for ``covariance_type``
            (full (k, p, p), tied (p, p), diag (k, p), spherical (k,)).
        precisions_cholesky: U with U U^T = Sigma^-1, same shape as ``covariances``.
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.

    All arrays share one floating dtype (float32 or float64). Build with
    :meth:`from_covariances` or :meth:`from_precisions`; leading batch axes (one per
    restart or chain) are allowed on every array.
    """

    weights: Float[Array, "*b k"]
    means: Float[Array, "*b k p"]
    covariances: Array
    precisions_cholesky: Array
    covariance_type: str = dataclasses.field(default="full", metadata=dict(static=True))

    @property
    def n_components(self) -> int:
        """Number of components k."""
        return self.means.shape[-2]

    @property
    def n_features(self) -> int:
        """Number of features p."""
        return self.means.shape[-1]

    @classmethod
    def from_covariances(cls, weights, means, covariances, covariance_type: str = "full"):
        """Parameters from weights (k,), means (k, p) and covariances (type-dependent shape).

        Raises:
            ValueError: an unknown covariance type, or shapes that disagree on k or p.
        """
        _check_type(covariance_type)
        weights, means, covariances = map(jnp.asarray, (weights, means, covariances))
        _check_shapes(weights, means, covariances, covariance_type, "covariances")
        return cls(weights, means, covariances,
                   precisions_cholesky_from_covariances(covariances, covariance_type),
                   covariance_type)

    @classmethod
    def from_precisions(cls, weights, means, precisions, covariance_type: str = "full"):
        """Parameters from weights (k,), means (k, p) and precisions (type-dependent shape).

        Raises:
            ValueError: an unknown covariance type, or shapes that disagree on k or p.
        """
        _check_type(covariance_type)
        weights, means, precisions = map(jnp.asarray, (weights, means, precisions))
        _check_shapes(weights, means, precisions, covariance_type, "precisions")
        chol = precisions_cholesky_from_precisions(precisions, covariance_type)
        return cls(weights, means,
                   covariances_from_precisions_cholesky(chol, covariance_type), chol,
                   covariance_type)


def full_precision_cholesky(params: MixtureParams) -> Float[Array, "k p p"]:
    """The precision Cholesky factor of every component as a dense (k, p, p) array."""
    k, p = params.means.shape
    chol = params.precisions_cholesky
    if params.covariance_type == "full":
        return chol
    if params.covariance_type == "tied":
        return jnp.broadcast_to(chol, (k, p, p))
    if params.covariance_type == "diag":
        return jax.vmap(jnp.diag)(chol)
    return chol[:, None, None] * jnp.eye(p, dtype=chol.dtype)


def log_det_precision_cholesky(params: MixtureParams) -> Float[Array, " k"]:
    """log det U_j = 1/2 log det Sigma_j^-1 for every component."""
    k, p = params.means.shape
    chol = params.precisions_cholesky
    if params.covariance_type == "full":
        return jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    if params.covariance_type == "tied":
        return jnp.full((k,), jnp.sum(jnp.log(jnp.diagonal(chol))), dtype=chol.dtype)
    if params.covariance_type == "diag":
        return jnp.sum(jnp.log(chol), axis=-1)
    return p * jnp.log(chol)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffStats:
    """Weighted sufficient statistics of a mixture's E-step (or of hard labels).

    Attributes:
        counts: (k,) N_j = sum_i w_i r_ij.
        sum_x: (k, p) sum_i w_i r_ij x_i.
        sum_xx: (k, p, p) sum_i w_i r_ij x_i x_i^T.
        loglik: () sum_i w_i log p(x_i) under the parameters of the E-step
            (0 for statistics of hard labels, which carry no likelihood).
    """

    counts: Float[Array, "*b k"]
    sum_x: Float[Array, "*b k p"]
    sum_xx: Float[Array, "*b k p p"]
    loglik: Float[Array, "*b"]

    def __add__(self, other: SuffStats) -> SuffStats:
        return jax.tree.map(jnp.add, self, other)

    def scale(self, factor) -> SuffStats:
        """Every statistic multiplied by ``factor`` (mini-batch -> full-data scale)."""
        return jax.tree.map(lambda s: s * factor, self)


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

    return _chunked_stats(chunk_fn, batch_size, X, row_weights(X, sample_weight))


def suff_stats_from_responsibilities(X, resp, sample_weight=None) -> SuffStats:
    """Statistics of given responsibilities (n, k) (loglik 0: none is defined)."""
    w = row_weights(X, sample_weight)
    return _stats_of(X, resp * w[:, None], jnp.zeros((), X.dtype))


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           batch_size: int = DEFAULT_BATCH_SIZE) -> SuffStats:
    """Statistics of hard labels (n,) in [0, k): one-hot responsibilities, chunked."""
    def chunk_fn(Xc, wc, labels_c):
        onehot = jax.nn.one_hot(labels_c, n_components, dtype=X.dtype) * wc[:, None]
        return _stats_of(Xc, onehot, jnp.zeros((), X.dtype))

    return _chunked_stats(chunk_fn, batch_size, X, row_weights(X, sample_weight), labels)


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
    prec = jnp.matmul(chol, jnp.swapaxes(chol, 1, 2), precision=_EXACT)
    a, b = np.triu_indices(p)
    quad = -0.5 * prec[:, a, b] * np.where(a == b, 1.0, 2.0).astype(prec.dtype)
    lin = jnp.einsum("kab,kb->ka", prec, params.means, precision=_EXACT)
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

"""Initial mixture parameters, computed on the device (scikit-learn's ``init_params`` choices).

* ``"k-means++"``: D^2 seeding (Arthur and Vassilvitskii 2007); each seed is a
  one-point component: weight 1/m, covariance reg_covar I (scikit-learn's one-hot
  responsibilities give the same up to roundoff, except "tied", where scikit-learn
  adds the scatter of all rows).
* ``"kmeans"``: Lloyd iterations from k-means++ seeds, then hard-label statistics.
* ``"random"``: uniform random responsibilities (holds an n x m matrix).
* ``"random_from_data"``: m distinct random rows as one-point components (as above).

Restarts are batched: ``n_init`` keys give parameters with a leading (n_init,) axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gpustat._checks import check_int, check_real
from gpustat.mixture._mstep import m_step
from gpustat.mixture._validation import check_data
from gpustat.reference.mixture import (
    COVARIANCE_TYPES,
    MixtureParams,
    SuffStats,
    suff_stats_from_responsibilities,
)

__all__ = ["INIT_METHODS", "initialize", "kmeans_plusplus"]

INIT_METHODS = ("kmeans", "k-means++", "random", "random_from_data")
# rows per step of the k-means passes: each step holds (chunk, m) distances; steps run in
# sequence, so a chunk large enough to fill a GPU keeps a Lloyd iteration to a few steps
_ROW_CHUNK = 1 << 16


# XLA runs float32 matmuls as TF32 on NVIDIA GPUs unless told otherwise.
_EXACT = jax.lax.Precision.HIGHEST

def _check_components(n_components, X) -> int:
    """``n_components`` as an int in [1, n] for X (n, p)."""
    n_components = check_int(n_components, "n_components", 1)
    if n_components > X.shape[0]:
        raise ValueError(f"n_components must be <= n, the rows of X (distinct seeds), got "
                         f"{n_components=} and {X.shape=}")
    return n_components


def kmeans_plusplus(key, X, n_components: int):
    """(m,) row indices of k-means++ seeds (first uniform, then proportional to D^2);
    m <= n (more seeds than rows would repeat rows)."""
    n_components = _check_components(n_components, X)
    n = X.shape[0]
    keys = jax.random.split(key, n_components)
    first = jax.random.randint(keys[0], (), 0, n, dtype=jnp.int32)
    dist = jnp.sum((X - X[first]) ** 2, axis=1)
    indices = jnp.zeros((n_components,), jnp.int32).at[0].set(first)

    def body(j, carry):
        indices, dist = carry
        # rows already chosen have D^2 = 0 and are never drawn again (unless all are 0)
        logits = jnp.where(dist > 0, jnp.log(jnp.where(dist > 0, dist, 1)), -jnp.inf)
        logits = jnp.where(jnp.any(dist > 0), logits, 0.0)
        idx = jax.random.categorical(keys[j], logits).astype(jnp.int32)
        dist = jnp.minimum(dist, jnp.sum((X - X[idx]) ** 2, axis=1))
        return indices.at[j].set(idx), dist

    indices, _ = jax.lax.fori_loop(1, n_components, body, (indices, dist))
    return indices


def _nearest_centre(X, centres):
    """(n,) index of the nearest centre, in row chunks (no n x m matrix at once)."""
    sq = jnp.sum(centres**2, axis=1)

    def row(x):
        return jnp.argmin(sq - 2 * jnp.matmul(centres, x, precision=_EXACT)).astype(jnp.int32)

    return jax.lax.map(row, X, batch_size=min(_ROW_CHUNK, X.shape[0]))


def _label_sums(X, labels, n_components):
    """(counts (m,), row sums (m, p)) of each label by one-hot products over row chunks
    (memory O(chunk m), no n x m matrix), added in a fixed order: reproducible bit for bit,
    where XLA's scatter-add (``segment_sum``) adds in no fixed order on a GPU."""
    chunk = min(_ROW_CHUNK, X.shape[0])
    pad = -X.shape[0] % chunk
    rows = jnp.pad(X, ((0, pad), (0, 0))).reshape(-1, chunk, X.shape[1])
    row_labels = jnp.pad(labels, (0, pad), constant_values=n_components).reshape(-1, chunk)

    def part(block):
        x, lab = block
        one_hot = (lab[:, None] == jnp.arange(n_components)).astype(X.dtype)  # padding: none
        return one_hot.sum(0), jnp.matmul(one_hot.T, x, precision=_EXACT)

    counts, sums = jax.lax.map(part, (rows, row_labels))
    return counts.sum(0), sums.sum(0)


def _label_stats(X, labels, centres):
    """Hard-label statistics about each label's centre (m, p) (no n x m matrix): the
    deviations x - c_j are formed before their products, for ``m_step(pivot=centres)``."""
    counts, sum_x = _label_sums(X, labels, centres.shape[0])

    def scatter(j):
        y = X - centres[j]
        return jnp.matmul((y * (labels == j)[:, None]).T, y, precision=_EXACT)

    sum_xx = jax.lax.map(scatter, jnp.arange(centres.shape[0]))
    return SuffStats(counts, sum_x - counts[:, None] * centres, sum_xx,
                     jnp.zeros((), X.dtype))


def _lloyd(X, centres, max_iter: int):
    n_components = centres.shape[0]

    def body(state):
        i, centres, _ = state
        labels = _nearest_centre(X, centres)
        counts, sums = _label_sums(X, labels, n_components)
        new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1)[:, None], centres)
        return i + 1, new, jnp.max(jnp.abs(new - centres))

    def cond(state):
        i, _, shift = state
        return (i < max_iter) & (shift > 0)

    _, centres, _ = jax.lax.while_loop(cond, body, (0, centres, jnp.array(jnp.inf, X.dtype)))
    return _nearest_centre(X, centres), centres


def _one_point_components(X, indices, covariance_type: str, reg_covar):
    """Seeds as one-point components: equal weights, means at the rows, covariance
    reg_covar I. (The raw moments of a single point cancel to noise of about eps x^2,
    which m_step rightly cannot resolve, so the seeds are built directly.)"""
    k, p = indices.shape[0], X.shape[1]
    reg = jnp.asarray(reg_covar, X.dtype)
    covariances = {"full": jnp.broadcast_to(reg * jnp.eye(p, dtype=X.dtype), (k, p, p)),
                   "tied": reg * jnp.eye(p, dtype=X.dtype),
                   "diag": jnp.full((k, p), reg),
                   "spherical": jnp.full((k,), reg)}[covariance_type]
    return MixtureParams.from_covariances(jnp.full((k,), 1 / k, X.dtype), X[indices],
                                          covariances, covariance_type)


def _initialize_one(key, X, n_components, covariance_type, reg_covar, method,
                    kmeans_max_iter):
    if method == "k-means++":
        seeds = kmeans_plusplus(key, X, n_components)
        return _one_point_components(X, seeds, covariance_type, reg_covar)
    if method == "random_from_data":
        seeds = jax.random.choice(key, X.shape[0], (n_components,), replace=False)
        return _one_point_components(X, seeds, covariance_type, reg_covar)
    if method == "kmeans":
        seeds = X[kmeans_plusplus(key, X, n_components)]
        labels, centres = _lloyd(X, seeds, kmeans_max_iter)
        return m_step(_label_stats(X, labels, centres), covariance_type=covariance_type,
                      reg_covar=reg_covar, pivot=centres)
    resp = jax.random.uniform(key, (X.shape[0], n_components), dtype=X.dtype)
    stats = suff_stats_from_responsibilities(X, resp / resp.sum(axis=1, keepdims=True))
    return m_step(stats, covariance_type=covariance_type, reg_covar=reg_covar)


def initialize(key, X, n_components: int, *, covariance_type: str = "full",
               reg_covar: float = 1e-6, method: str = "kmeans", n_init: int = 1,
               kmeans_max_iter: int = 100) -> MixtureParams:
    """Initial parameters for ``n_init`` restarts, stacked on a leading (n_init,) axis.

    Args:
        key: JAX PRNG key (split into one key per restart).
        X: (n, p) data (centred by the caller when it will be fitted centred).
        n_components: m.
        covariance_type: "full", "tied", "diag" or "spherical".
        reg_covar: added to covariance diagonals.
        method: one of :data:`INIT_METHODS`.
        n_init: number of restarts.
        kmeans_max_iter: Lloyd iterations for ``"kmeans"``.

    Returns:
        :class:`MixtureParams` whose arrays have a leading (n_init,) axis.

    Raises:
        ValueError / TypeError: naming the argument: X not a finite 2-D float array,
            n_components < 1 or > n, n_init < 1, kmeans_max_iter < 0, a negative
            reg_covar, an unknown method or covariance_type.
    """
    if method not in INIT_METHODS:
        raise ValueError(f"init_params must be one of {INIT_METHODS}, got {method=!r}")
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got "
                         f"{covariance_type=!r}")
    X = check_data(X)
    return _initialize(key, X, _check_components(n_components, X),
                       covariance_type=covariance_type,
                       reg_covar=check_real(reg_covar, "reg_covar", 0), method=method,
                       n_init=check_int(n_init, "n_init", 1),
                       kmeans_max_iter=check_int(kmeans_max_iter, "kmeans_max_iter", 0))


@functools.partial(jax.jit, static_argnames=("n_components", "covariance_type", "reg_covar",
                                             "method", "n_init", "kmeans_max_iter"))
def _initialize(key, X, n_components, *, covariance_type, reg_covar, method, n_init,
                kmeans_max_iter):
    keys = jax.random.split(key, n_init)
    return jax.vmap(lambda k: _initialize_one(k, X, n_components, covariance_type, reg_covar,
                                              method, kmeans_max_iter))(keys)

"""Initial mixture parameters, computed on the device (scikit-learn's ``init_params`` choices).

* ``"k-means++"``: greedy D^2 seeding (Arthur and Vassilvitskii 2007, with
  scikit-learn's 2 + log m candidates per seed) over the rows, or over a weighted sample of
  2^15 rows when there are more; each seed is a one-point component: weight 1/m,
  covariance reg_covar I (scikit-learn's one-hot responsibilities give the same up to
  roundoff, except "tied", where scikit-learn adds the scatter of all rows).
* ``"kmeans"``: Lloyd iterations from k-means++ seeds until the centres move less than
  scikit-learn's ``KMeans`` tolerance, one fused pass (distance GEMM, argmin, one-hot
  GEMM sums) per iteration inside one ``while_loop``, then hard-label statistics.
* ``"random"``: uniform random responsibilities (holds an n x m matrix).
* ``"random_from_data"``: m distinct random rows as one-point components (as above).

Row weights (``sample_weight``) let padding rows of weight 0 take no part, so that data
of nearby sizes padded to one bucket share one program. Restarts are batched: ``n_init``
keys give parameters with a leading (n_init,) axis.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from gpustat._arrays import over_row_chunks, row_weights
from gpustat._checks import check_int, check_real
from gpustat._compile_ahead import run_program
from gpustat.mixture._em import QUICK_COMPILE, weighted_shift
from gpustat.mixture._mstep import m_step
from gpustat.mixture._validation import check_data, check_sample_weight
from gpustat.reference.mixture import (
    COVARIANCE_TYPES,
    MixtureParams,
    SuffStats,
    suff_stats_from_responsibilities,
)

__all__ = ["INIT_METHODS", "initialize", "initialize_rows", "initialize_rows_quick",
           "kmeans_labels", "kmeans_plusplus"]

INIT_METHODS = ("kmeans", "k-means++", "random", "random_from_data")
# k-means++ seeds are drawn from a weighted sample of at most this many rows (all rows
# when there are fewer): each seed then costs O(rows p) whatever n is
_SEED_ROWS = 1 << 15
# elements of the (rows, width) temporaries of one step of the k-means passes; steps run
# in sequence, so a step large enough to fill a GPU keeps a pass to a few steps
_CHUNK_ELEMENTS = 1 << 24
# scikit-learn's KMeans tolerance: Lloyd stops when the centres' total squared shift is
# at most this times the mean feature variance
_LLOYD_TOL = 1e-4


# XLA runs float32 matmuls as TF32 on NVIDIA GPUs unless told otherwise.
_EXACT = jax.lax.Precision.HIGHEST

def _check_components(n_components, X) -> int:
    """``n_components`` as an int in [1, n] for X (n, p)."""
    n_components = check_int(n_components, "n_components", 1)
    if n_components > X.shape[0]:
        raise ValueError(f"n_components must be <= n, the rows of X (distinct seeds), got "
                         f"{n_components=} and {X.shape=}")
    return n_components


def _draw(weights, u):
    """Indices drawn proportional to ``weights`` (s,) >= 0 by inverse CDF at the uniforms u
    (rows of weight 0 are never drawn while any weight is positive)."""
    cdf = jnp.cumsum(weights)
    # a few draws (the seeds' candidates) compare with every entry; many bisect
    method = "compare_all" if jnp.size(u) <= 64 else "scan"
    return jnp.minimum(jnp.searchsorted(cdf, u * cdf[-1], side="right", method=method),
                       weights.shape[0] - 1).astype(jnp.int32)


def _greedy_seeds(key, S, ws, n_components: int, active=None):
    """(m,) row indices into S (s, p) with weights ws (s,): greedy k-means++ (scikit-learn's
    ``kmeans_plusplus``): the first row drawn by weight, every later one the best of
    2 + floor(log m) candidates drawn by weight x D^2 (the one that lowers the weighted
    potential sum_i w_i D_i^2 most). Rows of weight 0 are never drawn. One uniform draw
    for all seeds; the candidates by inverse CDF. ``active`` (traced): seed only the first
    ``active`` (the others stay row 0)."""
    trials = 2 + int(math.log(n_components))
    u = jax.random.uniform(key, (n_components, trials), S.dtype)
    first = _draw(ws, u[0, 0])
    closest = jnp.sum((S - S[first]) ** 2, axis=1)
    indices = jnp.zeros((n_components,), jnp.int32).at[0].set(first)

    def body(j, carry):
        indices, closest = carry
        potential = ws * closest
        # chosen rows have D^2 = 0 and are not drawn again, unless every row is (fewer
        # distinct rows than seeds): then by weight
        candidates = _draw(jnp.where(jnp.any(potential > 0), potential, ws), u[j])
        dist = jnp.sum((S[:, None, :] - S[candidates][None]) ** 2, axis=-1)  # (s, trials)
        dist = jnp.minimum(closest[:, None], dist)
        best = jnp.argmin(jnp.matmul(ws, dist, precision=_EXACT))
        return indices.at[j].set(candidates[best]), dist[:, best]

    stop = n_components if active is None else active
    indices, _ = jax.lax.fori_loop(1, stop, body, (indices, closest))
    return indices


def _seed_rows(key, X, w, n_components: int, active=None):
    """(m,) row indices of k-means++ seeds of X (n, p) with row weights w (n,): greedy
    k-means++ over X, or over a sample of ``_SEED_ROWS`` rows drawn by weight when n is
    larger."""
    n = X.shape[0]
    if n <= _SEED_ROWS:
        return _greedy_seeds(key, X, w, n_components, active)
    sample_key, key = jax.random.split(key)
    rows = _draw(w, jax.random.uniform(sample_key, (_SEED_ROWS,), X.dtype))
    return rows[_greedy_seeds(key, X[rows], jnp.ones(_SEED_ROWS, X.dtype), n_components,
                              active)]


def kmeans_plusplus(key, X, n_components: int, sample_weight=None):
    """(m,) row indices of greedy k-means++ seeds (scikit-learn's: each seed the best of
    2 + floor(log m) candidates drawn proportional to weight x D^2); m <= n (more seeds
    than rows would repeat rows). Beyond 2^15 rows the seeds come from a sample of 2^15
    rows drawn by weight. ``sample_weight``: optional (n,) non-negative row weights
    (rows of weight 0 are never chosen)."""
    X = check_data(X)
    n_components = _check_components(n_components, X)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    return _seed_rows(key, X, row_weights(X, w), n_components)


def _rows_per_step(n: int, width: int) -> int:
    """Rows per step of a pass holding (rows, width) temporaries: a power of two (it
    divides the padded row counts of :func:`row_bucket`, so no step is padded), or n."""
    rows = max(1, _CHUNK_ELEMENTS // max(width, 1))
    return min(n, 1 << (rows.bit_length() - 1))


def _one_hot_nearest(x, wc, centres, present):
    """(rows, m) one-hot rows of the nearest present centre (weighted by wc) and the
    labels: one distance GEMM and an argmin."""
    sq = jnp.where(present, jnp.sum(centres**2, axis=1), jnp.inf)
    labels = jnp.argmin(sq - 2 * jnp.matmul(x, centres.T, precision=_EXACT), axis=1)
    one_hot = (labels[:, None] == jnp.arange(centres.shape[0])).astype(x.dtype)
    return one_hot * wc[:, None], labels


def _lloyd(X, w, centres, max_iter: int, tol, present=None):
    """Lloyd iterations from ``centres`` (m, p) until the centres' total squared shift is
    at most ``tol`` (or ``max_iter``): one pass over the rows per iteration (distance GEMM,
    argmin, and the weighted one-hot sums as a GEMM, added in a fixed order: reproducible
    bit for bit, where XLA's scatter-add adds in no fixed order on a GPU), the loop and
    its test on the device. An empty cluster keeps its centre. ``present``: optional (m,)
    mask of the centres that take part (the others get no rows). Returns the centres."""
    n, p = X.shape
    present = jnp.ones(centres.shape[0], bool) if present is None else present
    step = _rows_per_step(n, centres.shape[0] + p)

    def sums(x, wc, centres):
        one_hot, _ = _one_hot_nearest(x, wc, centres, present)
        return (one_hot.sum(0), jnp.matmul(one_hot.T, x, precision=_EXACT)),

    def body(state):
        i, centres, _ = state
        (counts, totals), = over_row_chunks(lambda x, wc: sums(x, wc, centres), step, (X, w))
        new = jnp.where(counts[:, None] > 0, totals / jnp.where(counts > 0, counts, 1)[:, None],
                        centres)
        return i + 1, new, jnp.sum((new - centres) ** 2)

    def cond(state):
        i, _, shift = state
        return (i < max_iter) & (shift > tol)

    _, centres, _ = jax.lax.while_loop(cond, body, (0, centres, jnp.array(jnp.inf, X.dtype)))
    return centres


def _lloyd_tol(Xc, w):
    """scikit-learn's KMeans tolerance of the centred rows Xc with weights w: 1e-4 x the
    mean weighted feature variance."""
    return _LLOYD_TOL * jnp.mean(jnp.matmul(w, Xc**2, precision=_EXACT) / jnp.sum(w))


def kmeans_labels(Xc, centres, max_iter: int):
    """(n,) labels of Lloyd's k-means on the centred rows Xc (n, p) from ``centres``
    (m, p) (at most ``max_iter`` steps, scikit-learn's tolerance): each row's nearest
    final centre."""
    w = jnp.ones(Xc.shape[0], Xc.dtype)
    centres = _lloyd(Xc, w, centres, max_iter, _lloyd_tol(Xc, w))
    present = jnp.ones(centres.shape[0], bool)

    def part(x, wc):
        return jnp.zeros((), x.dtype), _one_hot_nearest(x, wc, centres, present)[1]

    _, labels = over_row_chunks(part, _rows_per_step(Xc.shape[0], centres.shape[0] + 1),
                                (Xc, w))
    return labels.astype(jnp.int32)


def _label_stats(X, w, centres, present):
    """Hard-label statistics of the rows' nearest centres about those centres (m, p):
    counts, sum w (x - c_j) and sum w (x - c_j)(x - c_j)^T over the rows nearest c_j, the
    deviations formed before their products (for ``m_step(pivot=centres)``), in one pass
    of one-hot GEMMs (no n x m matrix at once). Centres not ``present`` get no rows."""
    n, p = X.shape
    m = centres.shape[0]

    def part(x, wc):
        one_hot, labels = _one_hot_nearest(x, wc, centres, present)
        y = x - centres[labels]
        outer = (y[:, :, None] * y[:, None, :]).reshape(y.shape[0], p * p)
        return (one_hot.sum(0), jnp.matmul(one_hot.T, y, precision=_EXACT),
                jnp.matmul(one_hot.T, outer, precision=_EXACT).reshape(m, p, p)),

    (counts, sum_y, sum_yy), = over_row_chunks(part, _rows_per_step(n, m + p * p), (X, w))
    return SuffStats(counts, sum_y, sum_yy, jnp.zeros((), X.dtype))


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


def _kmeans_params(X, w, centres, present, covariance_type, reg_covar, diagonal):
    """Parameters from the hard labels of the rows' nearest ``centres`` (k-means' end)."""
    return m_step(_label_stats(X, w, centres, present), covariance_type=covariance_type,
                  reg_covar=reg_covar, pivot=centres, diagonal=diagonal)


def _present(n_components: int, active):
    return jnp.arange(n_components) < active


def _only_present(init: MixtureParams, present) -> MixtureParams:
    """Components not ``present`` are absent: weight 0 (EM keeps it 0)."""
    weights = jnp.where(present, init.weights, 0)
    return dataclasses.replace(init, weights=weights / jnp.sum(weights))


def _initialize_one(key, X, w, n_components, covariance_type, reg_covar, method, active,
                    diagonal):
    """One restart of the methods other than "kmeans" on centred rows X."""
    present = _present(n_components, active)
    if method == "k-means++":
        seeds = _seed_rows(key, X, w, n_components, active)
        init = _one_point_components(X, seeds, covariance_type, reg_covar)
    elif method == "random_from_data":
        seeds = jax.random.choice(key, X.shape[0], (n_components,), replace=False,
                                  p=w / jnp.sum(w))
        init = _one_point_components(X, seeds, covariance_type, reg_covar)
    else:
        resp = jax.random.uniform(key, (X.shape[0], n_components), dtype=X.dtype) * present
        stats = suff_stats_from_responsibilities(X, resp / resp.sum(axis=1, keepdims=True), w)
        init = m_step(stats, covariance_type=covariance_type, reg_covar=reg_covar,
                      diagonal=diagonal)
    return _only_present(init, present)


def initialize(key, X, n_components: int, *, covariance_type: str = "full",
               reg_covar: float = 1e-6, method: str = "kmeans", n_init: int = 1,
               kmeans_max_iter: int = 100, sample_weight=None) -> MixtureParams:
    """Initial parameters for ``n_init`` restarts, stacked on a leading (n_init,) axis.

    The rows are centred by their weighted mean inside (the returned means are in X's
    coordinates), so that statistics do not cancel far from the origin.

    Args:
        key: JAX PRNG key (split into one key per restart).
        X: (n, p) data.
        n_components: m.
        covariance_type: "full", "tied", "diag" or "spherical".
        reg_covar: added to covariance diagonals.
        method: one of :data:`INIT_METHODS`.
        n_init: number of restarts.
        kmeans_max_iter: most Lloyd iterations for ``"kmeans"`` (they stop earlier when
            the centres' total squared shift is at most 1e-4 x the mean feature variance,
            scikit-learn's ``KMeans`` rule).
        sample_weight: optional (n,) non-negative row weights (rows of weight 0 take no
            part: never seeds, no share of any statistic).

    Returns:
        :class:`MixtureParams` whose arrays have a leading (n_init,) axis.

    Raises:
        ValueError / TypeError: naming the argument: X not a finite 2-D float array,
            n_components < 1 or > n, n_init < 1, kmeans_max_iter < 0, a negative
            reg_covar, an unknown method or covariance_type, a bad sample_weight.
    """
    if method not in INIT_METHODS:
        raise ValueError(f"init_params must be one of {INIT_METHODS}, got {method=!r}")
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got "
                         f"{covariance_type=!r}")
    X = check_data(X)
    w = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    return initialize_rows(key, X, row_weights(X, w), _check_components(n_components, X),
                           covariance_type=covariance_type,
                           reg_covar=check_real(reg_covar, "reg_covar", 0), method=method,
                           n_init=check_int(n_init, "n_init", 1),
                           kmeans_max_iter=check_int(kmeans_max_iter, "kmeans_max_iter", 0))


def _per_restart(fn, n_init: int, *batched):
    """``fn`` over the leading (n_init,) axis of ``batched``; stacked results."""
    if n_init == 1:  # unbatched: vmap's batching of the loops would trace them again
        return jax.tree.map(lambda a: a[None], fn(*(a[0] for a in batched)))
    return jax.vmap(fn)(*batched)


def _other_methods(key, X, w, n_components, active, diagonal, *, covariance_type, reg_covar,
                   method, n_init):
    """The methods other than "kmeans", each restart about the rows' weighted mean."""
    shift = weighted_shift(X, w)[0]
    init = _per_restart(
        lambda k: _initialize_one(k, X - shift, w, n_components, covariance_type, reg_covar,
                                  method, active, diagonal),
        n_init, jax.random.split(key, n_init))
    return dataclasses.replace(init, means=init.means + shift)


def _kmeans_seeds(key, X, w, n_components, active, *, n_init):
    """k-means' first stage: the centring shift (the rows' weighted mean), k-means'
    tolerance and each restart's k-means++ seeds (n_init, m, p) about the shift."""
    shift = weighted_shift(X, w)[0]
    Xc = X - shift
    seeds = _per_restart(lambda k: Xc[_seed_rows(k, Xc, w, n_components, active)], n_init,
                         jax.random.split(key, n_init))
    return shift, _lloyd_tol(Xc, w), seeds


def _kmeans_centres(X, w, shift, seeds, tol, active, *, kmeans_max_iter):
    """k-means' second stage: Lloyd iterations from each restart's seeds."""
    present = _present(seeds.shape[1], active)
    return _per_restart(lambda s: _lloyd(X - shift, w, s, kmeans_max_iter, tol, present),
                        seeds.shape[0], seeds)


def _kmeans_final(X, w, shift, centres, active, diagonal, *, covariance_type, reg_covar):
    """k-means' last stage: each restart's parameters from its centres' hard labels."""
    present = _present(centres.shape[1], active)
    init = _per_restart(
        lambda c: _only_present(_kmeans_params(X - shift, w, c, present, covariance_type,
                                               reg_covar, diagonal), present),
        centres.shape[0], centres)
    return dataclasses.replace(init, means=init.means + shift)


# Programs that run once a fit are compiled without XLA's GEMM autotuning, which compiles
# candidate kernels for each new matmul (on an H200: 5.5-6.5 s for the k-means label
# statistics, against 3-19 ms more run time untuned). The Lloyd loop, run up to
# kmeans_max_iter times, keeps it (2.2x slower untuned).
_UNTUNED = {"xla_gpu_autotune_level": 0}
_other_methods_jit = jax.jit(_other_methods, static_argnames=(
    "n_components", "covariance_type", "reg_covar", "method", "n_init"),
    compiler_options=_UNTUNED)
_kmeans_seeds_jit = jax.jit(_kmeans_seeds, static_argnames=("n_components", "n_init"),
                            compiler_options=_UNTUNED)
_kmeans_centres_jit = jax.jit(_kmeans_centres, static_argnames="kmeans_max_iter")
_kmeans_final_jit = jax.jit(_kmeans_final, static_argnames=("covariance_type", "reg_covar"),
                            compiler_options=_UNTUNED)


def _inline(program, *args, **kwargs):
    """The runner that traces a jitted ``program``'s function into the caller's program
    (a nested jit may not carry compiler options)."""
    return program.__wrapped__(*args, **kwargs)


def initialize_rows(key, X, w, n_components, active=None, diagonal=None, *, covariance_type,
                    reg_covar, method, n_init, kmeans_max_iter=100, run=run_program):
    """:func:`initialize` on validated rows X (n, p) with row weights w (n,) (zero for rows
    that take no part, e.g. padding), as compiled programs: ``"kmeans"`` in three (seeds,
    the Lloyd loop, the final statistics), so that only the loop pays for tuned matmuls;
    the other methods in one. Inside a caller's trace it is traced into the caller's
    program.

    ``active``: optional traced count a <= m of components that take part; the others get
    weight 0 (so one program serves every a up to m). ``diagonal``: optional traced bool
    () with covariance_type "full": where true, the diag model's start in dense form
    (:func:`m_step`'s ``diagonal``). ``run``: the runner of the programs
    (:mod:`gpustat._compile_ahead`; it passes keyword arguments through unchanged: static
    ones go by keyword)."""
    if any(isinstance(a, jax.core.Tracer) for a in (key, X, w, active, diagonal)):
        run = _inline
    active = n_components if active is None else active
    if method != "kmeans":
        return run(_other_methods_jit, key, X, w, active=active, diagonal=diagonal,
                   n_components=n_components, covariance_type=covariance_type,
                   reg_covar=reg_covar, method=method, n_init=n_init)
    shift, tol, seeds = run(_kmeans_seeds_jit, key, X, w, active=active,
                            n_components=n_components, n_init=n_init)
    centres = run(_kmeans_centres_jit, X, w, shift, seeds, tol, active,
                  kmeans_max_iter=kmeans_max_iter)
    return run(_kmeans_final_jit, X, w, shift, centres, active, diagonal,
               covariance_type=covariance_type, reg_covar=reg_covar)


# the same programs as one, compiled without LLVM's optimisation passes (small data on a
# CPU, where compiling dominates)
initialize_rows_quick = jax.jit(initialize_rows, static_argnames=(
    "n_components", "covariance_type", "reg_covar", "method", "n_init", "kmeans_max_iter"),
    compiler_options=QUICK_COMPILE)

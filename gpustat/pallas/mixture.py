"""Pallas-Triton kernels for Gaussian mixtures: fused E-step statistics, densities, label draws.

Quadratic-feature form (Suchard et al. 2010 Appendix B, done as GEMMs): with precision
Lambda_j = U_j U_j^T and q(x) = vec(x x^T),

    log w_j + log N(x | mu_j, Sigma_j) = q(x) . a_j + x . b_j + c_j,
    a_j = -vec(Lambda_j) / 2,  b_j = Lambda_j mu_j,
    c_j = log w_j + log det U_j - p/2 log 2 pi - mu_j^T Lambda_j mu_j / 2.

Features are padded to P = max(16, next_pow2(p)) (Triton tensors are powers of two; float64
dots need contraction >= 16) and components to a multiple of ``block_k`` (padded components
get c = -inf, so they carry zero probability). Rows are padded to a multiple of ``block_n``
with zero weight. Row arrays are passed whole and sliced in-kernel with ``pl.ds``; nothing
of size n x k is ever written except by :func:`mvn_logpdf`.

Kernels:

* ``_log_prob_kernel``: per row tile, an online log-sum-exp over component blocks -> log p(x).
* ``_suff_stats_kernel``: grid (component block, row group); recomputes the logits of its
  component block for each row tile, r = w exp(logit - log p(x)), and accumulates
  N, sum r x, sum r q(x) in registers; one partial per row group, summed by XLA.
* ``_label_stats_kernel``: the same accumulation with one-hot r from labels.
* ``_sample_labels_kernel``: log p(x) pass, then an inverse-CDF pass with one uniform per row.
* ``_mvn_logpdf_kernel``: one (block_n, block_k) tile of log-densities.

Precision: float32 dots run as ``"highest"`` (IEEE fp32 FMA, exact float32) or
``"tf32x3"`` (three TF32 tensor-core products, error-compensated, close to fp32); plain
TF32 is never used. float64 dots are native float64.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat.mixture_params import (
    MixtureParams,
    SuffStats,
    full_precision_cholesky,
    log_det_precision_cholesky,
)
from gpustat.pallas._common import next_pow2, pad_axis, pallas_call, register_lowering_case

__all__ = [
    "MAX_FEATURES",
    "PRECISIONS",
    "log_prob",
    "mvn_logpdf",
    "sample_labels",
    "suff_stats",
    "suff_stats_from_labels",
]

MAX_FEATURES = 32  # q(x) has P^2 <= 1024 columns; larger p would spill the registers
PRECISIONS = {
    "highest": jax.lax.DotAlgorithmPreset.F32_F32_F32,
    "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}
DEFAULT_BLOCKS = {"block_n": 64, "block_k": 32, "tiles_per_program": 64, "num_warps": 4}


def padded_features(p: int) -> int:
    """P: feature axis padded to a power of two >= 16."""
    return max(16, next_pow2(p))


def _dot_algorithm(dtype, precision: str):
    """Dot algorithm for float32 (never plain TF32); None = native float64."""
    return None if jnp.dtype(dtype) == jnp.float64 else PRECISIONS[precision]


def _dot_rows(u, v, algorithm):
    """u^T v contracting the row axis: (block_n, m) x (block_n, block_k) -> (m, block_k)."""
    return jax.lax.dot_general(u, v, (((0,), (0,)), ((), ())), precision=algorithm,
                               preferred_element_type=u.dtype)


def _coefficients(params: MixtureParams, P: int, K: int, *, weighted: bool = True):
    """(a (P*P, K), b (P, K), c (K,)) of the quadratic-feature logits, in float64-safe order."""
    k, p = params.means.shape
    chol = full_precision_cholesky(params)
    prec = chol @ jnp.swapaxes(chol, -1, -2)
    prec_mean = jnp.einsum("kab,kb->ka", prec, params.means)
    c = (log_det_precision_cholesky(params) - 0.5 * p * math.log(2 * math.pi)
         - 0.5 * jnp.sum(prec_mean * params.means, axis=-1))
    if weighted:
        c = c + jnp.log(params.weights)
    prec = jnp.pad(prec, ((0, K - k), (0, P - p), (0, P - p)))
    a = (-0.5 * prec).reshape(K, P * P).T
    b = jnp.pad(prec_mean, ((0, K - k), (0, P - p))).T
    c = jnp.pad(c, (0, K - k), constant_values=-jnp.inf)
    return a, b, c


def _quad_features(x):
    """q(x) = vec(x x^T), (block_n, P) -> (block_n, P*P)."""
    n, P = x.shape
    return (x[:, :, None] * x[:, None, :]).reshape(n, P * P)


def _logits(x, q, a_ref, b_ref, c_ref, kb, block_k, algorithm):
    """(block_n, block_k) logits of component block kb."""
    cols = pl.ds(kb * block_k, block_k)
    quad = jnp.dot(q, a_ref[:, cols], precision=algorithm, preferred_element_type=q.dtype)
    lin = jnp.dot(x, b_ref[:, cols], precision=algorithm, preferred_element_type=q.dtype)
    return quad + lin + c_ref[cols][None, :]


def _row_log_normalizer(x, q, a_ref, b_ref, c_ref, n_kb, block_k, algorithm):
    """Online log-sum-exp over all component blocks (running max and rescaled sum)."""
    n = x.shape[0]

    def body(kb, carry):
        top, total = carry
        logits = _logits(x, q, a_ref, b_ref, c_ref, kb, block_k, algorithm)
        new_top = jnp.maximum(top, jnp.max(logits, axis=1))
        total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[:, None]),
                                                         axis=1)
        return new_top, total

    init = (jnp.full((n,), -jnp.inf, x.dtype), jnp.zeros((n,), x.dtype))
    top, total = jax.lax.fori_loop(0, n_kb, body, init)
    return top + jnp.log(total)


def _log_prob_kernel(x_ref, a_ref, b_ref, c_ref, out_ref, *, block_n, block_k, n_kb,
                     algorithm):
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    x = x_ref[rows, :]
    out_ref[rows] = _row_log_normalizer(x, _quad_features(x), a_ref, b_ref, c_ref, n_kb,
                                        block_k, algorithm)


def _sample_labels_kernel(x_ref, u_ref, a_ref, b_ref, c_ref, label_ref, lse_ref, *, block_n,
                          block_k, n_kb, n_components, algorithm):
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    x = x_ref[rows, :]
    q = _quad_features(x)
    lse = _row_log_normalizer(x, q, a_ref, b_ref, c_ref, n_kb, block_k, algorithm)
    u = u_ref[rows]

    # Inverse CDF: the label is the number of components whose cumulative probability is <= u.
    def body(kb, carry):
        below, running = carry
        prob = jnp.exp(_logits(x, q, a_ref, b_ref, c_ref, kb, block_k, algorithm)
                       - lse[:, None])
        cdf = running[:, None] + jnp.cumsum(prob, axis=1)
        below = below + jnp.sum(cdf <= u[:, None], axis=1, dtype=jnp.int32)
        return below, running + jnp.sum(prob, axis=1)

    init = (jnp.zeros((block_n,), jnp.int32), jnp.zeros((block_n,), x.dtype))
    below, _ = jax.lax.fori_loop(0, n_kb, body, init)
    label_ref[rows] = jnp.minimum(below, n_components - 1)
    lse_ref[rows] = lse


def _accumulate_stats(x_ref, w_ref, responsibilities_fn, counts_ref, s1_ref, s2_ref, *,
                      block_n, block_k, tiles_per_program, n_tiles, algorithm):
    """Sum r, x^T r and q^T r over this program's row tiles into its output partial.

    Program (kb, g) owns component block kb and row tiles [g * tiles_per_program, ...);
    accumulators live in registers across the tile loop (no n x k intermediate).
    """
    kb, g = pl.program_id(0), pl.program_id(1)
    first = g * tiles_per_program
    last = jnp.minimum(first + tiles_per_program, n_tiles)
    P = x_ref.shape[1]
    dtype = x_ref.dtype

    def body(t, acc):
        counts, s1, s2 = acc
        rows = pl.ds(t * block_n, block_n)
        x = x_ref[rows, :]
        q = _quad_features(x)
        r = responsibilities_fn(x, q, rows, kb) * w_ref[rows][:, None]
        counts = counts + jnp.sum(r, axis=0)
        s1 = s1 + _dot_rows(x, r, algorithm)
        s2 = s2 + _dot_rows(q, r, algorithm)
        return counts, s1, s2

    init = (jnp.zeros((block_k,), dtype), jnp.zeros((P, block_k), dtype),
            jnp.zeros((P * P, block_k), dtype))
    counts, s1, s2 = jax.lax.fori_loop(first, last, body, init)
    cols = pl.ds(kb * block_k, block_k)
    counts_ref[g, cols] = counts
    s1_ref[g, :, cols] = s1
    s2_ref[g, :, cols] = s2


def _suff_stats_kernel(x_ref, w_ref, lse_ref, a_ref, b_ref, c_ref, counts_ref, s1_ref, s2_ref,
                       *, block_n, block_k, tiles_per_program, n_tiles, algorithm):
    def responsibilities_fn(x, q, rows, kb):
        logits = _logits(x, q, a_ref, b_ref, c_ref, kb, block_k, algorithm)
        return jnp.exp(logits - lse_ref[rows][:, None])

    _accumulate_stats(x_ref, w_ref, responsibilities_fn, counts_ref, s1_ref, s2_ref,
                      block_n=block_n, block_k=block_k, tiles_per_program=tiles_per_program,
                      n_tiles=n_tiles, algorithm=algorithm)


def _label_stats_kernel(x_ref, w_ref, label_ref, counts_ref, s1_ref, s2_ref, *, block_n,
                        block_k, tiles_per_program, n_tiles, algorithm):
    def responsibilities_fn(x, q, rows, kb):
        component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)
        return (label_ref[rows][:, None] == component).astype(x.dtype)

    _accumulate_stats(x_ref, w_ref, responsibilities_fn, counts_ref, s1_ref, s2_ref,
                      block_n=block_n, block_k=block_k, tiles_per_program=tiles_per_program,
                      n_tiles=n_tiles, algorithm=algorithm)


def _mvn_logpdf_kernel(x_ref, a_ref, b_ref, c_ref, out_ref, *, block_n, block_k, algorithm):
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    kb = pl.program_id(1)
    x = x_ref[rows, :]
    out_ref[rows, pl.ds(kb * block_k, block_k)] = _logits(x, _quad_features(x), a_ref, b_ref,
                                                          c_ref, kb, block_k, algorithm)


# ---------------------------------------------------------------------------------------
# Wrappers: same signatures as gpustat.reference.mixture (plus kernel settings).


def _layout(X, n_components, block_n, block_k):
    """Pad rows to block_n and features to P; return (X_padded, n, P, K, n_tiles)."""
    n, p = X.shape
    P = padded_features(p)
    K = -(-n_components // block_k) * block_k
    Xp = pad_axis(jnp.pad(X, ((0, 0), (0, P - p))), 0, block_n)
    return Xp, n, P, K, Xp.shape[0] // block_n


def _full_spec(arr):
    return pl.BlockSpec(arr.shape, lambda *_: (0,) * arr.ndim)


def _settings(block_n, block_k, tiles_per_program, num_warps):
    return (block_n or DEFAULT_BLOCKS["block_n"], block_k or DEFAULT_BLOCKS["block_k"],
            tiles_per_program or DEFAULT_BLOCKS["tiles_per_program"],
            num_warps or DEFAULT_BLOCKS["num_warps"])


def _log_prob_padded(Xp, a, b, c, *, block_n, block_k, algorithm, interpret, num_warps):
    n_pad = Xp.shape[0]
    kernel = functools.partial(_log_prob_kernel, block_n=block_n, block_k=block_k,
                               n_kb=c.shape[0] // block_k, algorithm=algorithm)
    return pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(n_pad // block_n,),
        in_specs=[_full_spec(Xp), _full_spec(a), _full_spec(b), _full_spec(c)],
        out_specs=pl.BlockSpec((n_pad,), lambda i: (0,)),
        out_shape=jax.ShapeDtypeStruct((n_pad,), Xp.dtype),
    )(Xp, a, b, c)


def log_prob(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
             block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None):
    """(n,) log p(x_i) by the fused online log-sum-exp kernel."""
    block_n, block_k, _, num_warps = _settings(block_n, block_k, 1, num_warps)
    Xp, n, P, K, _ = _layout(X, params.n_components, block_n, block_k)
    a, b, c = _coefficients(params, P, K)
    return _log_prob_padded(Xp, a, b, c, block_n=block_n, block_k=block_k,
                            algorithm=_dot_algorithm(X.dtype, precision), interpret=interpret,
                            num_warps=num_warps)[:n]


def _stats_call(kernel, Xp, w, extra_row_arrays, coefficient_arrays, *, K, block_n, block_k,
                tiles_per_program, interpret, num_warps):
    """Launch a stats kernel on grid (component blocks, row groups) and sum the partials."""
    n_tiles = Xp.shape[0] // block_n
    groups = -(-n_tiles // tiles_per_program)
    P = Xp.shape[1]
    dtype = Xp.dtype
    inputs = (Xp, w, *extra_row_arrays, *coefficient_arrays)
    out_shape = (jax.ShapeDtypeStruct((groups, K), dtype),
                 jax.ShapeDtypeStruct((groups, P, K), dtype),
                 jax.ShapeDtypeStruct((groups, P * P, K), dtype))
    counts, s1, s2 = pallas_call(
        functools.partial(kernel, block_n=block_n, block_k=block_k,
                          tiles_per_program=tiles_per_program, n_tiles=n_tiles),
        interpret=interpret, num_warps=num_warps, grid=(K // block_k, groups),
        in_specs=[_full_spec(arr) for arr in inputs],
        out_specs=[_full_spec(s) for s in out_shape],
        out_shape=out_shape,
    )(*inputs)
    return counts.sum(0), s1.sum(0), s2.sum(0)


def _unpad_stats(counts, s1, s2, k, p, loglik):
    P = s1.shape[0]
    s2 = s2.T.reshape(-1, P, P)
    return SuffStats(counts[:k], s1.T[:k, :p], s2[:k, :p, :p], loglik)


def _row_weights(X, sample_weight, n_pad):
    w = jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight.astype(X.dtype)
    return jnp.pad(w, (0, n_pad - X.shape[0]))


def suff_stats(X, params: MixtureParams, sample_weight=None, *, precision: str = "highest",
               interpret: bool = False, block_n: int | None = None, block_k: int | None = None,
               tiles_per_program: int | None = None, num_warps: int | None = None) -> SuffStats:
    """Fused E-step statistics: log p(x) kernel, then the per-component-block stats kernel."""
    block_n, block_k, tiles_per_program, num_warps = _settings(block_n, block_k,
                                                               tiles_per_program, num_warps)
    k, p = params.means.shape
    Xp, _, P, K, _ = _layout(X, k, block_n, block_k)
    a, b, c = _coefficients(params, P, K)
    algorithm = _dot_algorithm(X.dtype, precision)
    lse = _log_prob_padded(Xp, a, b, c, block_n=block_n, block_k=block_k, algorithm=algorithm,
                           interpret=interpret, num_warps=num_warps)
    w = _row_weights(X, sample_weight, Xp.shape[0])
    kernel = functools.partial(_suff_stats_kernel, algorithm=algorithm)
    counts, s1, s2 = _stats_call(kernel, Xp, w, (lse,), (a, b, c), K=K, block_n=block_n,
                                 block_k=block_k, tiles_per_program=tiles_per_program,
                                 interpret=interpret, num_warps=num_warps)
    return _unpad_stats(counts, s1, s2, k, p, jnp.sum(w * lse))


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           precision: str = "highest", interpret: bool = False,
                           block_n: int | None = None, block_k: int | None = None,
                           tiles_per_program: int | None = None,
                           num_warps: int | None = None) -> SuffStats:
    """Statistics of hard labels with one-hot responsibilities built in-kernel."""
    block_n, block_k, tiles_per_program, num_warps = _settings(block_n, block_k,
                                                               tiles_per_program, num_warps)
    p = X.shape[1]
    Xp, n, _, K, _ = _layout(X, n_components, block_n, block_k)
    w = _row_weights(X, sample_weight, Xp.shape[0])
    labels = jnp.pad(labels.astype(jnp.int32), (0, Xp.shape[0] - n))
    kernel = functools.partial(_label_stats_kernel, algorithm=_dot_algorithm(X.dtype, precision))
    counts, s1, s2 = _stats_call(kernel, Xp, w, (labels,), (), K=K,
                                 block_n=block_n, block_k=block_k,
                                 tiles_per_program=tiles_per_program, interpret=interpret,
                                 num_warps=num_warps)
    return _unpad_stats(counts, s1, s2, n_components, p, jnp.zeros((), X.dtype))


def sample_labels(key, X, params: MixtureParams, *, precision: str = "highest",
                  interpret: bool = False, return_log_prob: bool = False,
                  block_n: int | None = None, block_k: int | None = None,
                  num_warps: int | None = None):
    """One inverse-CDF categorical draw per row (uniforms as in the reference)."""
    block_n, block_k, _, num_warps = _settings(block_n, block_k, 1, num_warps)
    k = params.n_components
    Xp, n, P, K, n_tiles = _layout(X, k, block_n, block_k)
    a, b, c = _coefficients(params, P, K)
    u = jnp.pad(jax.random.uniform(key, (n,), dtype=X.dtype), (0, Xp.shape[0] - n))
    kernel = functools.partial(_sample_labels_kernel, block_n=block_n, block_k=block_k,
                               n_kb=K // block_k, n_components=k,
                               algorithm=_dot_algorithm(X.dtype, precision))
    n_pad = Xp.shape[0]
    labels, lse = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(n_tiles,),
        in_specs=[_full_spec(arr) for arr in (Xp, u, a, b, c)],
        out_specs=[pl.BlockSpec((n_pad,), lambda i: (0,))] * 2,
        out_shape=(jax.ShapeDtypeStruct((n_pad,), jnp.int32),
                   jax.ShapeDtypeStruct((n_pad,), X.dtype)),
    )(Xp, u, a, b, c)
    return (labels[:n], lse[:n]) if return_log_prob else labels[:n]


def mvn_logpdf(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
               block_n: int | None = None, block_k: int | None = None,
               num_warps: int | None = None):
    """(n, k) component log-densities, one (block_n, block_k) tile per program."""
    block_n, block_k, _, num_warps = _settings(block_n, block_k, 1, num_warps)
    k = params.n_components
    Xp, n, P, K, n_tiles = _layout(X, k, block_n, block_k)
    a, b, c = _coefficients(params, P, K, weighted=False)
    kernel = functools.partial(_mvn_logpdf_kernel, block_n=block_n, block_k=block_k,
                               algorithm=_dot_algorithm(X.dtype, precision))
    out_shape = jax.ShapeDtypeStruct((Xp.shape[0], K), X.dtype)
    out = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(n_tiles, K // block_k),
        in_specs=[_full_spec(arr) for arr in (Xp, a, b, c)],
        out_specs=pl.BlockSpec(out_shape.shape, lambda i, j: (0, 0)),
        out_shape=out_shape,
    )(Xp, a, b, c)
    return out[:n, :k]


def _register_lowering_cases() -> None:
    """One lowering case per kernel and dtype (n = 100 ragged rows, p = 16, k = 40)."""
    n, p, k = 100, 16, 40

    def params_of(dtype):
        return MixtureParams(
            jax.ShapeDtypeStruct((k,), dtype), jax.ShapeDtypeStruct((k, p), dtype),
            jax.ShapeDtypeStruct((k, p, p), dtype), jax.ShapeDtypeStruct((k, p, p), dtype),
            "full")

    cases = {
        "log_prob": lambda X, prm, _: log_prob(X, prm),
        "suff_stats": lambda X, prm, _: suff_stats(X, prm, precision="tf32x3"),
        "mvn_logpdf": lambda X, prm, _: mvn_logpdf(X, prm),
        "sample_labels": lambda X, prm, _: sample_labels(jax.random.key(0), X, prm),
        "suff_stats_from_labels": lambda X, _, labels: suff_stats_from_labels(X, labels, k),
    }
    for dtype in (jnp.float32, jnp.float64):
        for name, fn in cases.items():
            register_lowering_case(
                "mixture", f"{name}_{jnp.dtype(dtype).name}", fn,
                (jax.ShapeDtypeStruct((n, p), dtype), params_of(dtype),
                 jax.ShapeDtypeStruct((n,), jnp.int32)))


_register_lowering_cases()

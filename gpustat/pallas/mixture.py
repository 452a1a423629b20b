"""Pallas-Triton kernels for Gaussian mixtures: fused E-step statistics, densities, label draws.

Whitened form (scikit-learn's; Suchard et al. 2010, eq. 1): with precision
Lambda_j = U_j U_j^T (U_j upper triangular),

    log w_j + log N(x | mu_j, Sigma_j) = c_j - 1/2 sum_d (x^T U_j[:, d] - m_jd)^2,
    m_jd = mu_j^T U_j[:, d],   c_j = log w_j + log det U_j - p/2 log 2 pi.

For each whitened coordinate d the kernels run one (block_n, P) @ (P, block_k) product
x W_d against the stacked columns W_d[:, j] = U_j[:, d] of a component block, subtract
m_d and accumulate the square: p products per tile and no n x k x p intermediate. The
squares are of centred whitened coordinates, so float32 keeps ~1e-5 absolute accuracy
where the expanded quadratic x^T Lambda x - 2 mu^T Lambda x + mu^T Lambda mu cancels
(the public ops and the drivers pass centred X; the products themselves still cancel
like |x| |U| eps, small once X is centred).

Features are padded to P = max(16, next_pow2(p)) (Triton tensors are powers of two;
float64 dots need a contraction >= 16), components to a multiple of ``block_k`` (padded
components get c = -inf and zero probability), rows to a multiple of ``block_n`` (zero
weight). Every kernel runs on grid (component block, row group): program (kb, g) walks
``tiles_per_program`` row tiles with its component block's W (p x P x block_k) reused
from L1, and writes one partial per (block, group), combined by XLA. Nothing of size
n x k is written except by :func:`mvn_logpdf`.

Kernels:

* ``_block_lse_kernel``: log sum_{j in block} exp(logit_ij) per row -> (blocks, n);
  XLA's logsumexp over blocks gives log p(x).
* ``_suff_stats_kernel``: recomputes the block's logits, r = w exp(logit - log p(x)), and
  accumulates N, sum r x and sum r x x^T (one (block_k, P) product per coordinate d,
  r x_d against x) in registers over the row group.
* ``_sample_stats_kernel``: the same with r the one-hot of an inverse-CDF draw: the
  block where row i's uniform lands is known from the block masses of the lse pass, the
  draw inside it is a cumulative sum over the block (one uniform per row).
* ``_label_stats_kernel``: the statistics of given labels (one-hot r).
* ``_mvn_logpdf_kernel``: one (block_n, block_k) tile of log-densities.

Precision: float32 dots run as ``"highest"`` (IEEE fp32 FMA) or ``"tf32x3"`` (three TF32
tensor-core products, error-compensated, close to fp32); plain TF32 is never used.
float64 dots are native float64.
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
    "responsibility_stats",
    "sample_labels",
    "sample_labels_with_stats",
    "suff_stats",
    "suff_stats_from_labels",
]

MAX_FEATURES = 32  # p products of (block_n, P) x (P, block_k) per tile; p^2 accumulators
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
    """u^T v contracting the row axis: (block_n, a) x (block_n, b) -> (a, b)."""
    return jax.lax.dot_general(u, v, (((0,), (0,)), ((), ())), precision=algorithm,
                               preferred_element_type=u.dtype)


def _whitening(params: MixtureParams, P: int, K: int, *, weighted: bool = True):
    """(W (p, P, K), m (p, K), c (K,)): W[d, :, j] = U_j[:, d], m[d, j] = mu_j^T U_j[:, d]."""
    k, p = params.means.shape
    chol = full_precision_cholesky(params)
    shift = jnp.einsum("ka,kad->kd", params.means, chol, precision=jax.lax.Precision.HIGHEST)
    c = log_det_precision_cholesky(params) - 0.5 * p * math.log(2 * math.pi)
    if weighted:
        c = c + jnp.log(params.weights)
    W = jnp.pad(jnp.transpose(chol, (2, 1, 0)), ((0, 0), (0, P - p), (0, K - k)))
    m = jnp.pad(shift.T, ((0, 0), (0, K - k)))
    c = jnp.pad(c, (0, K - k), constant_values=-jnp.inf)
    return W, m, c


def _block_logits(x, W_ref, m_ref, c_ref, kb, block_k, algorithm):
    """(block_n, block_k) logits of component block kb for the row tile x (block_n, P)."""
    cols = pl.ds(kb * block_k, block_k)
    sq = None
    for d in range(W_ref.shape[0]):  # static: one product per whitened coordinate
        z = jnp.dot(x, W_ref[d, :, cols], precision=algorithm,
                    preferred_element_type=x.dtype) - m_ref[d, cols][None, :]
        sq = z * z if sq is None else sq + z * z
    return c_ref[cols][None, :] - 0.5 * sq


def _safe_max(logits):
    """Row max, 0 where a row's block is all -inf (zero weights), so exp(-inf - 0) = 0."""
    top = jnp.max(logits, axis=1)
    return jnp.where(top > -jnp.inf, top, 0.0)


def _tile_loop(body, init, *, tiles_per_program, n_tiles):
    """fori_loop over this program's row tiles [g * tiles_per_program, ...)."""
    first = pl.program_id(1) * tiles_per_program
    return jax.lax.fori_loop(first, jnp.minimum(first + tiles_per_program, n_tiles), body, init)


def _block_lse_kernel(x_ref, W_ref, m_ref, c_ref, out_ref, *, block_n, block_k,
                      tiles_per_program, n_tiles, algorithm):
    kb = pl.program_id(0)

    def body(t, carry):
        rows = pl.ds(t * block_n, block_n)
        logits = _block_logits(x_ref[rows, :], W_ref, m_ref, c_ref, kb, block_k, algorithm)
        top = _safe_max(logits)
        out_ref[kb, rows] = top + jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=1))
        return carry

    _tile_loop(body, 0, tiles_per_program=tiles_per_program, n_tiles=n_tiles)


def _stats_init(block_k, P, p, dtype):
    return (jnp.zeros((block_k,), dtype), jnp.zeros((block_k, P), dtype),
            tuple(jnp.zeros((block_k, P), dtype) for _ in range(p)))


def _add_stats(acc, x_ref, rows, x, r, algorithm):
    """N += sum r, S1 += r^T x, S2[d] += (r x_d)^T x for every coordinate d (register accs)."""
    counts, s1, s2 = acc
    s2 = tuple(s2_d + _dot_rows(r * x_ref[rows, d][:, None], x, algorithm)
               for d, s2_d in enumerate(s2))
    return counts + jnp.sum(r, axis=0), s1 + _dot_rows(r, x, algorithm), s2


def _store_stats(acc, counts_ref, s1_ref, s2_ref, block_k):
    kb, g = pl.program_id(0), pl.program_id(1)
    cols = pl.ds(kb * block_k, block_k)
    counts, s1, s2 = acc
    counts_ref[g, cols] = counts
    s1_ref[g, cols, :] = s1
    for d, s2_d in enumerate(s2):
        s2_ref[g, d, cols, :] = s2_d


def _suff_stats_kernel(x_ref, w_ref, lse_ref, W_ref, m_ref, c_ref, counts_ref, s1_ref, s2_ref,
                       *, block_n, block_k, tiles_per_program, n_tiles, algorithm):
    kb = pl.program_id(0)

    def body(t, acc):
        rows = pl.ds(t * block_n, block_n)
        x = x_ref[rows, :]
        logits = _block_logits(x, W_ref, m_ref, c_ref, kb, block_k, algorithm)
        r = jnp.exp(logits - lse_ref[rows][:, None]) * w_ref[rows][:, None]
        return _add_stats(acc, x_ref, rows, x, r, algorithm)

    acc = _tile_loop(body, _stats_init(block_k, x_ref.shape[1], W_ref.shape[0], x_ref.dtype),
                     tiles_per_program=tiles_per_program, n_tiles=n_tiles)
    _store_stats(acc, counts_ref, s1_ref, s2_ref, block_k)


def _sample_stats_kernel(x_ref, w_ref, u_ref, lse_ref, start_ref, landing_ref, W_ref, m_ref, c_ref,
                         label_ref, counts_ref, s1_ref, s2_ref, *, block_n, block_k,
                         tiles_per_program, n_tiles, n_components, algorithm):
    kb = pl.program_id(0)
    component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def body(t, acc):
        rows = pl.ds(t * block_n, block_n)
        x = x_ref[rows, :]
        prob = jnp.exp(_block_logits(x, W_ref, m_ref, c_ref, kb, block_k, algorithm)
                       - lse_ref[rows][:, None])
        # inverse CDF inside the block: components whose cumulative probability is <= u
        cdf = start_ref[kb, rows][:, None] + jnp.cumsum(prob, axis=1)
        below = jnp.sum(cdf <= u_ref[rows][:, None], axis=1, dtype=jnp.int32)
        label = jnp.minimum(kb * block_k + jnp.minimum(below, block_k - 1), n_components - 1)
        mine = landing_ref[rows] == kb  # u_i lands in this block (from the lse pass)
        label_ref[kb, rows] = jnp.where(mine, label, 0)
        r = (((label[:, None] == component) & mine[:, None]).astype(x.dtype)
             * w_ref[rows][:, None])
        return _add_stats(acc, x_ref, rows, x, r, algorithm)

    acc = _tile_loop(body, _stats_init(block_k, x_ref.shape[1], W_ref.shape[0], x_ref.dtype),
                     tiles_per_program=tiles_per_program, n_tiles=n_tiles)
    _store_stats(acc, counts_ref, s1_ref, s2_ref, block_k)


def _label_stats_kernel(x_ref, w_ref, label_ref, counts_ref, s1_ref, s2_ref, *, block_n,
                        block_k, tiles_per_program, n_tiles, p, algorithm):
    kb = pl.program_id(0)
    component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def body(t, acc):
        rows = pl.ds(t * block_n, block_n)
        x = x_ref[rows, :]
        r = (label_ref[rows][:, None] == component).astype(x.dtype) * w_ref[rows][:, None]
        return _add_stats(acc, x_ref, rows, x, r, algorithm)

    acc = _tile_loop(body, _stats_init(block_k, x_ref.shape[1], p, x_ref.dtype),
                     tiles_per_program=tiles_per_program, n_tiles=n_tiles)
    _store_stats(acc, counts_ref, s1_ref, s2_ref, block_k)


def _mvn_logpdf_kernel(x_ref, W_ref, m_ref, c_ref, out_ref, *, block_n, block_k, algorithm):
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    kb = pl.program_id(1)
    out_ref[rows, pl.ds(kb * block_k, block_k)] = _block_logits(
        x_ref[rows, :], W_ref, m_ref, c_ref, kb, block_k, algorithm)


# ---------------------------------------------------------------------------------------
# Wrappers: same signatures as gpustat.reference.mixture (plus kernel settings).


def _settings(block_n, block_k, tiles_per_program, num_warps):
    return (block_n or DEFAULT_BLOCKS["block_n"], block_k or DEFAULT_BLOCKS["block_k"],
            tiles_per_program or DEFAULT_BLOCKS["tiles_per_program"],
            num_warps or DEFAULT_BLOCKS["num_warps"])


def _layout(X, n_components, block_n, block_k):
    """Pad rows to block_n and features to P; return (X_padded, n, P, K, n_tiles)."""
    n, p = X.shape
    P = padded_features(p)
    K = -(-n_components // block_k) * block_k
    Xp = pad_axis(jnp.pad(X, ((0, 0), (0, P - p))), 0, block_n)
    return Xp, n, P, K, Xp.shape[0] // block_n


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def _grouped_call(kernel, inputs, out_shape, *, n_blocks, n_tiles, tiles_per_program,
                  interpret, num_warps, **static):
    """Launch ``kernel`` on grid (component blocks, row groups) with whole-array refs."""
    groups = -(-n_tiles // tiles_per_program)
    return pallas_call(
        functools.partial(kernel, tiles_per_program=tiles_per_program, n_tiles=n_tiles,
                          **static),
        interpret=interpret, num_warps=num_warps, grid=(n_blocks, groups),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=[_full_spec(s.shape) for s in out_shape],
        out_shape=out_shape,
    )(*inputs)


def _stats_shapes(groups, K, P, p, dtype):
    return [jax.ShapeDtypeStruct((groups, K), dtype),
            jax.ShapeDtypeStruct((groups, K, P), dtype),
            jax.ShapeDtypeStruct((groups, p, K, P), dtype)]


def _sum_stats(counts, s1, s2, k, p, loglik):
    """Sum the per-group partials and cut the padding: S2[j, d, b] = s2[d, j, b]."""
    s2 = jnp.transpose(s2.sum(0), (1, 0, 2))
    return SuffStats(counts.sum(0)[:k], s1.sum(0)[:k, :p], s2[:k, :, :p], loglik)


class _Problem:
    """Padded data and whitened coefficients shared by the wrappers."""

    def __init__(self, X, params, *, precision, interpret, block_n, block_k,
                 tiles_per_program, num_warps, weighted=True):
        self.block_n, self.block_k, self.tiles, self.num_warps = _settings(
            block_n, block_k, tiles_per_program, num_warps)
        self.k, self.p = params.means.shape
        self.Xp, self.n, P, self.K, self.n_tiles = _layout(X, self.k, self.block_n,
                                                           self.block_k)
        self.n_pad = self.Xp.shape[0]
        self.coefficients = _whitening(params, P, self.K, weighted=weighted)
        self.algorithm = _dot_algorithm(X.dtype, precision)
        self.interpret = interpret
        self.n_blocks = self.K // self.block_k
        self.groups = -(-self.n_tiles // self.tiles)

    def call(self, kernel, inputs, out_shape, **static):
        return _grouped_call(kernel, inputs, out_shape, n_blocks=self.n_blocks,
                             n_tiles=self.n_tiles, tiles_per_program=self.tiles,
                             interpret=self.interpret, num_warps=self.num_warps,
                             block_n=self.block_n, block_k=self.block_k,
                             algorithm=self.algorithm, **static)

    def block_lse(self):
        """(blocks, n_pad) log-sum-exp of each component block's weighted logits."""
        out = jax.ShapeDtypeStruct((self.n_blocks, self.n_pad), self.Xp.dtype)
        return self.call(_block_lse_kernel, (self.Xp, *self.coefficients), [out])[0]

    def stats_shapes(self):
        return _stats_shapes(self.groups, self.K, self.Xp.shape[1], self.p, self.Xp.dtype)


def _row_weights(X, sample_weight, n_pad):
    w = jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight.astype(X.dtype)
    return jnp.pad(w, (0, n_pad - X.shape[0]))


def log_prob(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
             block_n: int | None = None, block_k: int | None = None,
             tiles_per_program: int | None = None, num_warps: int | None = None):
    """(n,) log p(x_i): per-block log-sum-exp kernel, combined over blocks by XLA."""
    prob = _Problem(X, params, precision=precision, interpret=interpret, block_n=block_n,
                    block_k=block_k, tiles_per_program=tiles_per_program, num_warps=num_warps)
    return jax.nn.logsumexp(prob.block_lse(), axis=0)[:prob.n]


def responsibility_stats(X, params: MixtureParams, log_prob_x, sample_weight=None, *,
                         precision: str = "highest", interpret: bool = False,
                         block_n: int | None = None, block_k: int | None = None,
                         tiles_per_program: int | None = None,
                         num_warps: int | None = None) -> SuffStats:
    """The statistics pass alone, given log p(x_i) (n,): N, sum r x, sum r x x^T, sum w log p."""
    prob = _Problem(X, params, precision=precision, interpret=interpret, block_n=block_n,
                    block_k=block_k, tiles_per_program=tiles_per_program, num_warps=num_warps)
    lse = jnp.pad(log_prob_x, (0, prob.n_pad - prob.n))
    w = _row_weights(X, sample_weight, prob.n_pad)
    counts, s1, s2 = prob.call(_suff_stats_kernel, (prob.Xp, w, lse, *prob.coefficients),
                               prob.stats_shapes())
    return _sum_stats(counts, s1, s2, prob.k, prob.p, jnp.sum(w * lse))


def suff_stats(X, params: MixtureParams, sample_weight=None, *, precision: str = "highest",
               interpret: bool = False, block_n: int | None = None, block_k: int | None = None,
               tiles_per_program: int | None = None, num_warps: int | None = None) -> SuffStats:
    """Fused E-step statistics: the log p(x) pass, then the per-component-block stats pass."""
    settings = dict(precision=precision, interpret=interpret, block_n=block_n, block_k=block_k,
                    tiles_per_program=tiles_per_program, num_warps=num_warps)
    return responsibility_stats(X, params, log_prob(X, params, **settings), sample_weight,
                                **settings)


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           precision: str = "highest", interpret: bool = False,
                           block_n: int | None = None, block_k: int | None = None,
                           tiles_per_program: int | None = None,
                           num_warps: int | None = None) -> SuffStats:
    """Statistics of hard labels with one-hot responsibilities built in-kernel."""
    block_n, block_k, tiles, num_warps = _settings(block_n, block_k, tiles_per_program,
                                                   num_warps)
    p = X.shape[1]
    Xp, n, P, K, n_tiles = _layout(X, n_components, block_n, block_k)
    w = _row_weights(X, sample_weight, Xp.shape[0])
    labels = jnp.pad(labels.astype(jnp.int32), (0, Xp.shape[0] - n))
    counts, s1, s2 = _grouped_call(
        _label_stats_kernel, (Xp, w, labels), _stats_shapes(-(-n_tiles // tiles), K, P, p,
                                                            X.dtype),
        n_blocks=K // block_k, n_tiles=n_tiles, tiles_per_program=tiles, interpret=interpret,
        num_warps=num_warps, block_n=block_n, block_k=block_k, p=p,
        algorithm=_dot_algorithm(X.dtype, precision))
    return _sum_stats(counts, s1, s2, n_components, p, jnp.zeros((), X.dtype))


def sample_labels_with_stats(key, X, params: MixtureParams, *, precision: str = "highest",
                             interpret: bool = False, block_n: int | None = None,
                             block_k: int | None = None, tiles_per_program: int | None = None,
                             num_warps: int | None = None):
    """Inverse-CDF draw per row fused with the statistics of the drawn labels.

    Returns (labels (n,) int32, log p(x) (n,), :class:`SuffStats` of the labels).
    """
    prob = _Problem(X, params, precision=precision, interpret=interpret, block_n=block_n,
                    block_k=block_k, tiles_per_program=tiles_per_program, num_warps=num_warps)
    part = prob.block_lse()
    lse = jax.nn.logsumexp(part, axis=0)
    u = jnp.pad(jax.random.uniform(key, (prob.n,), dtype=X.dtype), (0, prob.n_pad - prob.n))
    # block masses -> exclusive prefix (start of each block's CDF) and the landing block:
    # the last block of positive mass whose start is <= u
    mass = jnp.exp(part - lse)
    start = jnp.cumsum(mass, axis=0) - mass
    block_ids = jnp.arange(prob.n_blocks, dtype=jnp.int32)[:, None]
    landing = jnp.max(jnp.where((start <= u) & (mass > 0), block_ids, 0), axis=0)
    w = _row_weights(X, None, prob.n_pad)  # 0 on padding rows
    labels, counts, s1, s2 = prob.call(
        _sample_stats_kernel, (prob.Xp, w, u, lse, start, landing, *prob.coefficients),
        [jax.ShapeDtypeStruct((prob.n_blocks, prob.n_pad), jnp.int32), *prob.stats_shapes()],
        n_components=prob.k)
    labels = jnp.sum(labels, axis=0)[:prob.n]
    return labels, lse[:prob.n], _sum_stats(counts, s1, s2, prob.k, prob.p,
                                             jnp.zeros((), X.dtype))


def sample_labels(key, X, params: MixtureParams, *, precision: str = "highest",
                  interpret: bool = False, return_log_prob: bool = False,
                  block_n: int | None = None, block_k: int | None = None,
                  tiles_per_program: int | None = None, num_warps: int | None = None):
    """One inverse-CDF categorical draw per row (uniforms as in the reference)."""
    labels, lse, _ = sample_labels_with_stats(
        key, X, params, precision=precision, interpret=interpret, block_n=block_n,
        block_k=block_k, tiles_per_program=tiles_per_program, num_warps=num_warps)
    return (labels, lse) if return_log_prob else labels


def mvn_logpdf(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
               block_n: int | None = None, block_k: int | None = None,
               num_warps: int | None = None):
    """(n, k) component log-densities, one (block_n, block_k) tile per program."""
    prob = _Problem(X, params, precision=precision, interpret=interpret, block_n=block_n,
                    block_k=block_k, tiles_per_program=1, num_warps=num_warps, weighted=False)
    kernel = functools.partial(_mvn_logpdf_kernel, block_n=prob.block_n, block_k=prob.block_k,
                               algorithm=prob.algorithm)
    inputs = (prob.Xp, *prob.coefficients)
    out_shape = jax.ShapeDtypeStruct((prob.n_pad, prob.K), X.dtype)
    out = pallas_call(
        kernel, interpret=interpret, num_warps=prob.num_warps,
        grid=(prob.n_tiles, prob.n_blocks),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=_full_spec(out_shape.shape), out_shape=out_shape,
    )(*inputs)
    return out[:prob.n, :prob.k]


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
        "sample_labels_with_stats": lambda X, prm, _: sample_labels_with_stats(
            jax.random.key(0), X, prm),
        "suff_stats_from_labels": lambda X, _, labels: suff_stats_from_labels(X, labels, k),
    }
    for dtype in (jnp.float32, jnp.float64):
        for name, fn in cases.items():
            register_lowering_case(
                "mixture", f"{name}_{jnp.dtype(dtype).name}", fn,
                (jax.ShapeDtypeStruct((n, p), dtype), params_of(dtype),
                 jax.ShapeDtypeStruct((n,), jnp.int32)))


_register_lowering_cases()

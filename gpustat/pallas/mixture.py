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

MAX_FEATURES = 32  # p products of (block_n, P) x (P, block_k) per tile; P^2 x block_k accumulators
PRECISIONS = {
    "highest": jax.lax.DotAlgorithmPreset.F32_F32_F32,
    "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}
# Kernel settings per family: "density" (the log p(x) pass, mvn_logpdf) and "stats" (the
# statistics passes; sampling uses them for its lse pass too, whose blocks it shares).
# density: the fastest of four settings timed on an H100 (4.4 ms for the pass at n = 1e6,
# p = 16, k = 256, "tf32x3"). stats: not timed since its rewrite; of the settings compiled
# offline for sm_90 (triton 3.6, ptxas resource report) the one with no register spills
# (255 registers, 0 bytes of stack; 64-row tiles at 4 or 8 warps spill 2 KB).
DEFAULT_BLOCKS = {
    "density": {"block_n": 64, "block_k": 32, "tiles_per_program": 64, "num_warps": 4},
    "stats": {"block_n": 32, "block_k": 32, "tiles_per_program": 128, "num_warps": 8,
              "moments": "quadratic"},
}


def padded_features(p: int) -> int:
    """P: feature axis padded to a power of two >= 16."""
    return max(16, next_pow2(p))


def _dot_algorithm(dtype, precision: str):
    """Dot algorithm for float32 (never plain TF32); None = native float64."""
    return None if jnp.dtype(dtype) == jnp.float64 else PRECISIONS[precision]


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


def _stats_init(block_k, P, p, moments, dtype):
    if moments == "coordinate":
        s2 = tuple(jnp.zeros((P, block_k), dtype) for _ in range(p))
    else:
        s2 = jnp.zeros((P * P, block_k), dtype)
    return jnp.zeros((block_k,), dtype), jnp.zeros((P, block_k), dtype), s2


def _add_stats(acc, xt_ref, rows, r, moments, algorithm):
    """N += sum r, S1 += x^T r, S2 += (x x^T)^T r over one row tile (register accumulators).

    Rows are the contraction axis of every product, so the tile is read transposed
    (xt (P, block_n), from X^T) and r (block_n, block_k) is the right operand as it
    stands: no in-register transposes. ``moments`` picks the S2 products: "quadratic",
    one (P*P, block_n) x (block_n, block_k) product of q = vec(x x^T); "coordinate",
    p products (x * x_d)^T r of (P, block_n) x (block_n, block_k).
    """
    counts, s1, s2 = acc
    xt = xt_ref[:, rows]

    def dot(a, b):
        return jnp.dot(a, b, precision=algorithm, preferred_element_type=a.dtype)

    if moments == "coordinate":
        s2 = tuple(s2_d + dot(xt * xt_ref[d, rows][None, :], r) for d, s2_d in enumerate(s2))
    else:
        P, block_n = xt.shape
        s2 = s2 + dot((xt[:, None, :] * xt[None, :, :]).reshape(P * P, block_n), r)
    return counts + jnp.sum(r, axis=0), s1 + dot(xt, r), s2


def _store_stats(acc, counts_ref, s1_ref, s2_ref, block_k):
    """This program's partials; S2 rows a * P + b (a < p for "coordinate") hold sum r x_a x_b."""
    kb, g = pl.program_id(0), pl.program_id(1)
    cols = pl.ds(kb * block_k, block_k)
    counts, s1, s2 = acc
    counts_ref[g, cols] = counts
    s1_ref[g, :, cols] = s1
    if isinstance(s2, tuple):
        P = s1.shape[0]
        for d, s2_d in enumerate(s2):
            s2_ref[g, pl.ds(d * P, P), cols] = s2_d
    else:
        s2_ref[g, :, cols] = s2


def _run_stats(xt_ref, responsibilities_fn, outs, *, p, block_n, block_k, tiles_per_program,
               n_tiles, moments, algorithm):
    """Accumulate the statistics of ``responsibilities_fn(rows)`` over this program's tiles."""
    def body(t, acc):
        rows = pl.ds(t * block_n, block_n)
        return _add_stats(acc, xt_ref, rows, responsibilities_fn(rows), moments, algorithm)

    acc = _tile_loop(body, _stats_init(block_k, xt_ref.shape[0], p, moments, xt_ref.dtype),
                     tiles_per_program=tiles_per_program, n_tiles=n_tiles)
    _store_stats(acc, *outs, block_k)


def _suff_stats_kernel(x_ref, xt_ref, w_ref, lse_ref, W_ref, m_ref, c_ref, *outs, block_n,
                       block_k, algorithm, **loop):
    kb = pl.program_id(0)

    def responsibilities(rows):
        logits = _block_logits(x_ref[rows, :], W_ref, m_ref, c_ref, kb, block_k, algorithm)
        return jnp.exp(logits - lse_ref[rows][:, None]) * w_ref[rows][:, None]

    _run_stats(xt_ref, responsibilities, outs, p=W_ref.shape[0], block_n=block_n,
               block_k=block_k, algorithm=algorithm, **loop)


def _sample_stats_kernel(x_ref, xt_ref, w_ref, u_ref, lse_ref, start_ref, landing_ref, W_ref,
                         m_ref, c_ref, label_ref, *outs, block_n, block_k, n_components,
                         algorithm, **loop):
    kb = pl.program_id(0)
    component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def responsibilities(rows):
        prob = jnp.exp(_block_logits(x_ref[rows, :], W_ref, m_ref, c_ref, kb, block_k,
                                     algorithm) - lse_ref[rows][:, None])
        # inverse CDF inside the block: components whose cumulative probability is <= u
        cdf = start_ref[kb, rows][:, None] + jnp.cumsum(prob, axis=1)
        below = jnp.sum(cdf <= u_ref[rows][:, None], axis=1, dtype=jnp.int32)
        label = jnp.minimum(kb * block_k + jnp.minimum(below, block_k - 1), n_components - 1)
        mine = landing_ref[rows] == kb  # u_i lands in this block (from the lse pass)
        label_ref[kb, rows] = jnp.where(mine, label, 0)
        onehot = (label[:, None] == component) & mine[:, None]
        return onehot.astype(prob.dtype) * w_ref[rows][:, None]

    _run_stats(xt_ref, responsibilities, outs, p=W_ref.shape[0], block_n=block_n,
               block_k=block_k, algorithm=algorithm, **loop)


def _label_stats_kernel(xt_ref, w_ref, label_ref, *outs, p, block_n, block_k, algorithm,
                        **loop):
    kb = pl.program_id(0)
    component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def responsibilities(rows):
        onehot = label_ref[rows][:, None] == component
        return onehot.astype(xt_ref.dtype) * w_ref[rows][:, None]

    _run_stats(xt_ref, responsibilities, outs, p=p, block_n=block_n, block_k=block_k,
               algorithm=algorithm, **loop)


def _mvn_logpdf_kernel(x_ref, W_ref, m_ref, c_ref, out_ref, *, block_n, block_k, algorithm):
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    kb = pl.program_id(1)
    out_ref[rows, pl.ds(kb * block_k, block_k)] = _block_logits(
        x_ref[rows, :], W_ref, m_ref, c_ref, kb, block_k, algorithm)


# ---------------------------------------------------------------------------------------
# Wrappers: same signatures as gpustat.reference.mixture (plus kernel settings).


def _settings(blocks: dict, family: str) -> dict:
    """DEFAULT_BLOCKS[family] updated with the caller's non-None settings."""
    defaults = DEFAULT_BLOCKS[family]
    unknown = set(blocks) - set(defaults)
    if unknown:
        raise TypeError(f"unknown kernel settings {sorted(unknown)}; known: {list(defaults)}")
    settings = {**defaults, **{k: v for k, v in blocks.items() if v is not None}}
    if settings.get("moments", "quadratic") not in ("quadratic", "coordinate"):
        raise ValueError("moments must be 'quadratic' or 'coordinate', got "
                         f"{settings['moments']!r}")
    return settings


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


class _Layout:
    """Padded rows (X and X^T) and the grid of one kernel family; see the module docstring."""

    def __init__(self, X, n_components, *, precision, interpret, blocks, family="stats"):
        s = _settings(blocks, family)
        self.block_n, self.block_k = s["block_n"], s["block_k"]
        self.tiles = s["tiles_per_program"]
        self.num_warps, self.moments = s["num_warps"], s.get("moments")
        self.n, self.p = X.shape
        self.k = n_components
        self.P = padded_features(self.p)
        self.K = -(-n_components // self.block_k) * self.block_k
        self.Xp = pad_axis(jnp.pad(X, ((0, 0), (0, self.P - self.p))), 0, self.block_n)
        self.n_pad = self.Xp.shape[0]
        self.n_tiles = self.n_pad // self.block_n
        self.n_blocks = self.K // self.block_k
        self.groups = -(-self.n_tiles // self.tiles)
        self.algorithm = _dot_algorithm(X.dtype, precision)
        self.interpret = interpret

    def pad_rows(self, a):
        return jnp.pad(a, (0, self.n_pad - a.shape[0]))

    def call(self, kernel, inputs, out_shape, *, stats=False, **static):
        """Launch on grid (component blocks, row groups) with whole-array refs."""
        if stats:
            static.update(moments=self.moments)
        kernel = functools.partial(kernel, tiles_per_program=self.tiles, n_tiles=self.n_tiles,
                                   block_n=self.block_n, block_k=self.block_k,
                                   algorithm=self.algorithm, **static)
        return pallas_call(
            kernel, interpret=self.interpret, num_warps=self.num_warps,
            grid=(self.n_blocks, self.groups),
            in_specs=[_full_spec(a.shape) for a in inputs],
            out_specs=[_full_spec(s.shape) for s in out_shape], out_shape=out_shape,
        )(*inputs)

    def stats_shapes(self):
        dtype = self.Xp.dtype
        return [jax.ShapeDtypeStruct((self.groups, self.K), dtype),
                jax.ShapeDtypeStruct((self.groups, self.P, self.K), dtype),
                jax.ShapeDtypeStruct((self.groups, self.P * self.P, self.K), dtype)]

    def sum_stats(self, counts, s1, s2, loglik) -> SuffStats:
        """Sum the per-group partials and cut the padding (S2 rows a * P + b)."""
        k, p, P = self.k, self.p, self.P
        s2 = s2.sum(0).reshape(P, P, self.K)[:p, :p, :k]
        return SuffStats(counts.sum(0)[:k], s1.sum(0)[:p, :k].T, jnp.transpose(s2, (2, 0, 1)),
                         loglik)


class _Problem(_Layout):
    """The layout plus the whitened coefficients of the parameters."""

    def __init__(self, X, params, *, weighted=True, **kw):
        super().__init__(X, params.n_components, **kw)
        self.coefficients = _whitening(params, self.P, self.K, weighted=weighted)

    def block_lse(self):
        """(blocks, n_pad) log-sum-exp of each component block's weighted logits."""
        out = jax.ShapeDtypeStruct((self.n_blocks, self.n_pad), self.Xp.dtype)
        return self.call(_block_lse_kernel, (self.Xp, *self.coefficients), [out])[0]


def _row_weights(X, sample_weight, layout: _Layout):
    w = jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight.astype(X.dtype)
    return layout.pad_rows(w)


def log_prob(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
             **blocks):
    """(n,) log p(x_i): per-block log-sum-exp kernel, combined over blocks by XLA.

    ``blocks``: kernel settings overriding :data:`DEFAULT_BLOCKS` (here and below).
    """
    prob = _Problem(X, params, precision=precision, interpret=interpret, blocks=blocks,
                    family="density")
    return jax.nn.logsumexp(prob.block_lse(), axis=0)[:prob.n]


def responsibility_stats(X, params: MixtureParams, log_prob_x, sample_weight=None, *,
                         precision: str = "highest", interpret: bool = False,
                         **blocks) -> SuffStats:
    """The statistics pass alone, given log p(x_i) (n,): N, sum r x, sum r x x^T, sum w log p."""
    prob = _Problem(X, params, precision=precision, interpret=interpret, blocks=blocks)
    lse = prob.pad_rows(log_prob_x)
    w = _row_weights(X, sample_weight, prob)
    partials = prob.call(_suff_stats_kernel, (prob.Xp, prob.Xp.T, w, lse, *prob.coefficients),
                         prob.stats_shapes(), stats=True)
    return prob.sum_stats(*partials, jnp.sum(w * lse))


def suff_stats(X, params: MixtureParams, sample_weight=None, *, precision: str = "highest",
               interpret: bool = False, **blocks) -> SuffStats:
    """Fused E-step statistics: the log p(x) pass, then the per-component-block stats pass."""
    density_blocks = {k: v for k, v in blocks.items() if k != "moments"}
    lse = log_prob(X, params, precision=precision, interpret=interpret, **density_blocks)
    return responsibility_stats(X, params, lse, sample_weight, precision=precision,
                                interpret=interpret, **blocks)


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           precision: str = "highest", interpret: bool = False,
                           **blocks) -> SuffStats:
    """Statistics of hard labels with one-hot responsibilities built in-kernel."""
    layout = _Layout(X, n_components, precision=precision, interpret=interpret, blocks=blocks)
    w = _row_weights(X, sample_weight, layout)
    labels = layout.pad_rows(labels.astype(jnp.int32))
    partials = layout.call(_label_stats_kernel, (layout.Xp.T, w, labels),
                           layout.stats_shapes(), stats=True, p=layout.p)
    return layout.sum_stats(*partials, jnp.zeros((), X.dtype))


def sample_labels_with_stats(key, X, params: MixtureParams, *, precision: str = "highest",
                             interpret: bool = False, **blocks):
    """Inverse-CDF draw per row fused with the statistics of the drawn labels.

    Returns (labels (n,) int32, log p(x) (n,), :class:`SuffStats` of the labels).
    """
    prob = _Problem(X, params, precision=precision, interpret=interpret, blocks=blocks)
    part = prob.block_lse()
    lse = jax.nn.logsumexp(part, axis=0)
    u = prob.pad_rows(jax.random.uniform(key, (prob.n,), dtype=X.dtype))
    # block masses -> exclusive prefix (start of each block's CDF) and the landing block:
    # the last block of positive mass whose start is <= u
    mass = jnp.exp(part - lse)
    start = jnp.cumsum(mass, axis=0) - mass
    block_ids = jnp.arange(prob.n_blocks, dtype=jnp.int32)[:, None]
    landing = jnp.max(jnp.where((start <= u) & (mass > 0), block_ids, 0), axis=0)
    w = _row_weights(X, None, prob)  # 0 on padding rows
    labels, *partials = prob.call(
        _sample_stats_kernel,
        (prob.Xp, prob.Xp.T, w, u, lse, start, landing, *prob.coefficients),
        [jax.ShapeDtypeStruct((prob.n_blocks, prob.n_pad), jnp.int32), *prob.stats_shapes()],
        stats=True, n_components=prob.k)
    labels = jnp.sum(labels, axis=0)[:prob.n]
    return labels, lse[:prob.n], prob.sum_stats(*partials, jnp.zeros((), X.dtype))


def sample_labels(key, X, params: MixtureParams, *, precision: str = "highest",
                  interpret: bool = False, return_log_prob: bool = False, **blocks):
    """One inverse-CDF categorical draw per row (uniforms as in the reference)."""
    labels, lse, _ = sample_labels_with_stats(key, X, params, precision=precision,
                                              interpret=interpret, **blocks)
    return (labels, lse) if return_log_prob else labels


def mvn_logpdf(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
               **blocks):
    """(n, k) component log-densities, one (block_n, block_k) tile per program."""
    prob = _Problem(X, params, weighted=False, precision=precision, interpret=interpret,
                    blocks=blocks, family="density")
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
    """Lowering cases per kernel and dtype (n = 100 ragged rows, p = 16, k = 40)."""
    n, p, k = 100, 16, 40

    def params_of(dtype):
        return MixtureParams(
            jax.ShapeDtypeStruct((k,), dtype), jax.ShapeDtypeStruct((k, p), dtype),
            jax.ShapeDtypeStruct((k, p, p), dtype), jax.ShapeDtypeStruct((k, p, p), dtype),
            "full")

    cases = {
        "log_prob": lambda X, prm, _: log_prob(X, prm),
        "suff_stats": lambda X, prm, _: suff_stats(X, prm, precision="tf32x3"),
        "suff_stats_coordinate_moments": lambda X, prm, _: suff_stats(X, prm,
                                                                      moments="coordinate"),
        # the smallest blocks the tests use (float64 dots need M, K >= 16 and N >= 8)
        "suff_stats_small_blocks": lambda X, prm, _: suff_stats(X, prm, block_n=16, block_k=8),
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

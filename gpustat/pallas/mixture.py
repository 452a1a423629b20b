"""Pallas-Triton kernels for Gaussian mixtures: fused E-step statistics, densities, label draws.

Two forms of the weighted log-density logit_ij = log w_j + log N(x_i | mu_j, Sigma_j),
with precision Lambda_j = U_j U_j^T (U_j upper triangular):

* ``"whitened"`` (scikit-learn's; Suchard et al. 2010, eq. 1):
  logit_ij = c_j - 1/2 sum_d (x_i^T U_j[:, d] - m_jd)^2, m_jd = mu_j^T U_j[:, d],
  c_j = log w_j + log det U_j - p/2 log 2 pi. One (block_n, P) @ (P, block_k) product per
  whitened coordinate d, each followed by a subtract and a square: p small products whose
  results are needed at once. Accurate: the squares are of centred whitened coordinates.
* ``"quadratic"``: logit_ij = Phi(x_i) . W_j + c'_j with the packed quadratic features
  Phi(x) = [x_a x_b (a <= b), x_a] (F = p(p+1)/2 + p columns), W_j = [-Lambda_ab (a < b),
  -Lambda_aa / 2, (Lambda_j mu_j)_a] and c'_j = c_j - mu_j^T Lambda_j mu_j / 2: one GEMM of
  inner dimension F per tile, accumulated in place (tensor-core friendly), but its terms
  cancel: the error grows like eps ||Lambda_j|| (|x - s| + |mu_j - s|)^2 around the centre s
  of the data. :func:`quadratic_error_estimate` predicts it; ``form="auto"`` takes the
  quadratic form when the prediction is <= :data:`QUADRATIC_MAX_ERROR`, else the whitened.

Features are gathered from the row tile of X (``x_ref[rows, a]``, L1 hits) in chunks of
power-of-two widths (F padded to a multiple of 16: 152 -> 128 + 32 for p = 16), so no
in-kernel tensor has a non-power-of-two shape; the same chunks are the statistics'
features: every statistics kernel accumulates Phi^T r (F x block_k: sum r x_a x_b for
a <= b, sum r x_a) and sum r in registers. X is padded to P = max(16, next_pow2(p))
columns (float64 dots need a contraction >= 16), components to a multiple of ``block_k``
(padded components get c = -inf and zero probability), rows to a multiple of ``block_n``
(zero weight). Every kernel runs on grid (component block, row group): program (kb, g)
walks ``tiles_per_program`` row tiles against its component block's coefficients and
writes one partial per (block, group), combined by XLA. Nothing of size n x k is written
except by :func:`mvn_logpdf`.

Kernels:

* ``_block_lse_kernel``: log sum_{j in block} exp(logit_ij) per row -> (blocks, n);
  XLA's logsumexp over blocks gives log p(x).
* ``_suff_stats_kernel``: recomputes the block's logits, r = w exp(logit - log p(x)), and
  accumulates N and Phi^T r over the row group.
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
import numpy as np
from jax.experimental import pallas as pl

from gpustat.mixture_params import (
    MixtureParams,
    SuffStats,
    full_precision_cholesky,
    log_det_precision_cholesky,
)
from gpustat.pallas._common import next_pow2, pad_axis, pallas_call, register_lowering_case

__all__ = [
    "FORMS",
    "MAX_FEATURES",
    "PRECISIONS",
    "QUADRATIC_MAX_ERROR",
    "log_prob",
    "mvn_logpdf",
    "quadratic_error_estimate",
    "responsibility_stats",
    "sample_labels",
    "sample_labels_with_stats",
    "suff_stats",
    "suff_stats_from_labels",
]

MAX_FEATURES = 32  # whitened: p products of (block_n, P) x (P, block_k) per tile
PRECISIONS = {
    "highest": jax.lax.DotAlgorithmPreset.F32_F32_F32,
    "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}
FORMS = ("whitened", "quadratic")
# form="auto" takes the quadratic form when quadratic_error_estimate <= this: half of the
# 1e-3 nats per point that the issue allows. Calibrated on the benchmark's data on a CPU
# (float32 GEMM vs float64), shifted off-centre by 0, 2, 5 and 20 and scaled by 1 and 10:
# the estimate was 1.9x to 2.7x the measured max error in every case.
QUADRATIC_MAX_ERROR = 5e-4
# Kernel settings per form and family: "density" (the log p(x) pass, mvn_logpdf) and
# "stats" (the statistics passes; sampling uses them for its lse pass too, whose blocks it
# shares). whitened density: the fastest of four settings timed on an H100 (4.4 ms for the
# pass at n = 1e6, p = 16, k = 256, "tf32x3", commit dcc904f).
DEFAULT_BLOCKS = {
    "whitened": {
        "density": {"block_n": 64, "block_k": 32, "tiles_per_program": 64, "num_warps": 4},
        "stats": {"block_n": 64, "block_k": 32, "tiles_per_program": 64, "num_warps": 4},
    },
    "quadratic": {
        "density": {"block_n": 64, "block_k": 64, "tiles_per_program": 64, "num_warps": 4},
        "stats": {"block_n": 64, "block_k": 64, "tiles_per_program": 64, "num_warps": 4},
    },
}


def padded_features(p: int) -> int:
    """P: feature axis padded to a power of two >= 16."""
    return max(16, next_pow2(p))


def feature_chunks(p: int) -> tuple[tuple[int, int], ...]:
    """(offset, width) of the power-of-two chunks (each >= 16) covering the F features."""
    n_features = -(-(p * (p + 1) // 2 + p) // 16) * 16
    chunks, offset = [], 0
    for bit in reversed(range(n_features.bit_length())):
        if n_features & (1 << bit):
            chunks.append((offset, 1 << bit))
            offset += 1 << bit
    return tuple(chunks)


def _feature_tables(p: int):
    """(first, second) column of X per feature: Phi_f = x[first] * x[second] for the pairs
    a <= b (``np.triu_indices`` order), x[first] * 1 for the p linear features after them
    (their ``second`` is a dummy 0); padding features repeat x_0^2 with zero weight (their
    statistics are dropped)."""
    a, b = np.triu_indices(p)
    width = sum(w for _, w in feature_chunks(p))
    pad = width - len(a) - p
    first = np.concatenate([a, np.arange(p), np.zeros(pad, int)])
    second = np.concatenate([b, np.zeros(p + pad, int)])
    return jnp.asarray(first, jnp.int32), jnp.asarray(second, jnp.int32)


def _dot_algorithm(dtype, precision: str):
    """Dot algorithm for float32 (never plain TF32); None = native float64."""
    return None if jnp.dtype(dtype) == jnp.float64 else PRECISIONS[precision]


def _log_normaliser(params: MixtureParams, weighted: bool):
    """c_j = [log w_j] + log det U_j - p/2 log 2 pi."""
    p = params.means.shape[1]
    c = log_det_precision_cholesky(params) - 0.5 * p * math.log(2 * math.pi)
    return c + jnp.log(params.weights) if weighted else c


def _whitening(params: MixtureParams, P: int, K: int, *, weighted: bool = True):
    """(W (p, P, K), m (p, K), c (K,)): W[d, :, j] = U_j[:, d], m[d, j] = mu_j^T U_j[:, d]."""
    k, p = params.means.shape
    chol = full_precision_cholesky(params)
    shift = jnp.einsum("ka,kad->kd", params.means, chol, precision=jax.lax.Precision.HIGHEST)
    W = jnp.pad(jnp.transpose(chol, (2, 1, 0)), ((0, 0), (0, P - p), (0, K - k)))
    m = jnp.pad(shift.T, ((0, 0), (0, K - k)))
    c = jnp.pad(_log_normaliser(params, weighted), (0, K - k), constant_values=-jnp.inf)
    return W, m, c


def _precisions(params: MixtureParams):
    chol = full_precision_cholesky(params)
    return jnp.einsum("kad,kbd->kab", chol, chol, precision=jax.lax.Precision.HIGHEST)


def _quadratic_weights(params: MixtureParams, K: int, *, weighted: bool = True):
    """(W (F_pad, K), c (K,)): Phi(x) . W[:, j] + c_j = logit_j (module docstring)."""
    k, p = params.means.shape
    prec = _precisions(params)
    lin = jnp.einsum("kab,kb->ka", prec, params.means, precision=jax.lax.Precision.HIGHEST)
    a, b = np.triu_indices(p)
    quad = -prec[:, a, b] * np.where(a == b, 0.5, 1.0).astype(prec.dtype)
    width = sum(w for _, w in feature_chunks(p))
    W = jnp.concatenate([quad, lin], axis=1).T
    W = jnp.pad(W, ((0, width - W.shape[0]), (0, K - k)))
    c = _log_normaliser(params, weighted) - 0.5 * jnp.sum(lin * params.means, axis=1)
    return W, jnp.pad(c, (0, K - k), constant_values=-jnp.inf)


def quadratic_error_estimate(X, params: MixtureParams):
    """Predicted max |error| of the quadratic form's log-densities in X's dtype (scalar).

    u max_j ||Lambda_j||_inf (R + |mu_j|)^2 with u = eps / 2 of X's dtype and R the largest
    row norm of X: the size of the largest terms of Phi(x) . W_j that cancel (X and the
    means as the kernels get them, i.e. centred). Not a rigorous bound; see
    :data:`QUADRATIC_MAX_ERROR` for its calibration.
    """
    u = 0.5 * jnp.finfo(X.dtype).eps
    norm = jnp.max(jnp.sum(jnp.abs(_precisions(params)), axis=2), axis=1)
    radius = jnp.sqrt(jnp.max(jnp.sum(X * X, axis=1)))
    spread = radius + jnp.sqrt(jnp.sum(params.means * params.means, axis=1))
    return u * jnp.max(norm * spread * spread)


# ---------------------------------------------------------------------------------------
# In-kernel pieces shared by all kernels.


def _features(x_ref, first_ref, second_ref, rows, chunks, linear):
    """Phi of a row tile as one (block_n, width) tensor per chunk, gathered from X.

    ``linear`` = (start, stop): the features x_a * 1 (their second factor is 1).
    """
    idx = rows.start + jax.lax.broadcasted_iota(jnp.int32, (rows.size, 1), 0)
    phis = []
    for offset, width in chunks:
        cols = pl.ds(offset, width)
        xa = x_ref[idx, first_ref[cols][None, :]]
        xb = x_ref[idx, second_ref[cols][None, :]]
        if offset < linear[1] and linear[0] < offset + width:  # static
            f = offset + jax.lax.broadcasted_iota(jnp.int32, (1, width), 1)
            xb = jnp.where((f >= linear[0]) & (f < linear[1]), 1.0, xb)
        phis.append(xa * xb)
    return tuple(phis)


def _block_logits(form, x_ref, phis, rows, coef_refs, kb, block_k, algorithm):
    """(block_n, block_k) weighted logits of component block kb for one row tile."""
    cols = pl.ds(kb * block_k, block_k)

    def dot(a, b):
        return jnp.dot(a, b, precision=algorithm, preferred_element_type=a.dtype)

    if form == "quadratic":
        W_ref, c_ref = coef_refs
        offsets = np.cumsum([0] + [phi.shape[1] for phi in phis])
        acc = None
        for phi, offset in zip(phis, offsets):  # static: accumulated in place
            term = dot(phi, W_ref[pl.ds(int(offset), phi.shape[1]), cols])
            acc = term if acc is None else acc + term
        return c_ref[cols][None, :] + acc
    W_ref, m_ref, c_ref = coef_refs
    x = x_ref[rows, :]
    sq = None
    for d in range(W_ref.shape[0]):  # static: one product per whitened coordinate
        z = dot(x, W_ref[d, :, cols]) - m_ref[d, cols][None, :]
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


class _Refs:
    """The kernels' inputs: X, the feature tables, per-row arrays, the form's coefficients."""

    def __init__(self, refs, n_rows_arrays, n_coef):
        self.x, self.first, self.second = refs[:3]
        self.rows = refs[3:3 + n_rows_arrays]
        self.coef = refs[3 + n_rows_arrays:3 + n_rows_arrays + n_coef]
        self.outs = refs[3 + n_rows_arrays + n_coef:]


def _block_lse_kernel(*refs, form, n_coef, chunks, linear, block_n, block_k,
                      tiles_per_program, n_tiles, algorithm):
    r = _Refs(refs, 0, n_coef)
    kb = pl.program_id(0)

    def body(t, carry):
        rows = pl.ds(t * block_n, block_n)
        phis = (_features(r.x, r.first, r.second, rows, chunks, linear)
                if form == "quadratic" else ())
        logits = _block_logits(form, r.x, phis, rows, r.coef, kb, block_k, algorithm)
        top = _safe_max(logits)
        r.outs[0][kb, rows] = top + jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=1))
        return carry

    _tile_loop(body, 0, tiles_per_program=tiles_per_program, n_tiles=n_tiles)


def _run_stats(r: _Refs, responsibilities_fn, *, chunks, linear, block_n, block_k,
               tiles_per_program, n_tiles, algorithm):
    """Accumulate N and Phi^T r of ``responsibilities_fn(rows, phis)`` over this program's
    row tiles (register accumulators), then store this program's partials."""
    dtype = r.x.dtype

    def body(t, acc):
        counts, moments = acc
        rows = pl.ds(t * block_n, block_n)
        phis = _features(r.x, r.first, r.second, rows, chunks, linear)
        resp = responsibilities_fn(rows, phis)
        # rows are the contraction axis: Phi^T r, (width, block_n) x (block_n, block_k)
        moments = tuple(
            m + jax.lax.dot_general(phi, resp, (((0,), (0,)), ((), ())), precision=algorithm,
                                    preferred_element_type=dtype)
            for m, phi in zip(moments, phis))
        return counts + jnp.sum(resp, axis=0), moments

    init = (jnp.zeros((block_k,), dtype),
            tuple(jnp.zeros((width, block_k), dtype) for _, width in chunks))
    counts, moments = _tile_loop(body, init, tiles_per_program=tiles_per_program,
                                 n_tiles=n_tiles)
    kb, g = pl.program_id(0), pl.program_id(1)
    cols = pl.ds(kb * block_k, block_k)
    counts_ref, moments_ref = r.outs[-2:]
    counts_ref[g, cols] = counts
    for (offset, width), m in zip(chunks, moments):
        moments_ref[g, pl.ds(offset, width), cols] = m


def _suff_stats_kernel(*refs, form, n_coef, **kw):
    r = _Refs(refs, 2, n_coef)
    w_ref, lse_ref = r.rows
    kb = pl.program_id(0)

    def responsibilities(rows, phis):
        logits = _block_logits(form, r.x, phis, rows, r.coef, kb, kw["block_k"],
                               kw["algorithm"])
        return jnp.exp(logits - lse_ref[rows][:, None]) * w_ref[rows][:, None]

    _run_stats(r, responsibilities, **kw)


def _sample_stats_kernel(*refs, form, n_coef, n_components, **kw):
    r = _Refs(refs, 5, n_coef)
    w_ref, u_ref, lse_ref, start_ref, landing_ref = r.rows
    label_ref = r.outs[0]
    block_k = kw["block_k"]
    kb = pl.program_id(0)
    component = kb * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def responsibilities(rows, phis):
        prob = jnp.exp(_block_logits(form, r.x, phis, rows, r.coef, kb, block_k,
                                     kw["algorithm"]) - lse_ref[rows][:, None])
        # inverse CDF inside the block: components whose cumulative probability is <= u
        cdf = start_ref[kb, rows][:, None] + jnp.cumsum(prob, axis=1)
        below = jnp.sum(cdf <= u_ref[rows][:, None], axis=1, dtype=jnp.int32)
        label = jnp.minimum(kb * block_k + jnp.minimum(below, block_k - 1), n_components - 1)
        mine = landing_ref[rows] == kb  # u_i lands in this block (from the lse pass)
        label_ref[kb, rows] = jnp.where(mine, label, 0)
        onehot = (label[:, None] == component) & mine[:, None]
        return onehot.astype(prob.dtype) * w_ref[rows][:, None]

    _run_stats(r, responsibilities, **kw)


def _label_stats_kernel(*refs, **kw):
    r = _Refs(refs, 2, 0)
    w_ref, label_ref = r.rows
    block_k = kw["block_k"]
    component = pl.program_id(0) * block_k + jax.lax.broadcasted_iota(jnp.int32, (1, block_k), 1)

    def responsibilities(rows, _):
        onehot = label_ref[rows][:, None] == component
        return onehot.astype(r.x.dtype) * w_ref[rows][:, None]

    _run_stats(r, responsibilities, **kw)


def _mvn_logpdf_kernel(*refs, form, n_coef, chunks, linear, block_n, block_k,
                       algorithm):
    r = _Refs(refs, 0, n_coef)
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    kb = pl.program_id(1)
    phis = (_features(r.x, r.first, r.second, rows, chunks, linear)
            if form == "quadratic" else ())
    r.outs[0][rows, pl.ds(kb * block_k, block_k)] = _block_logits(
        form, r.x, phis, rows, r.coef, kb, block_k, algorithm)


# ---------------------------------------------------------------------------------------
# Wrappers: same signatures as gpustat.reference.mixture (plus kernel settings).


def _settings(blocks: dict, form: str, family: str) -> dict:
    """DEFAULT_BLOCKS[form][family] updated with the caller's non-None settings."""
    defaults = DEFAULT_BLOCKS[form][family]
    unknown = set(blocks) - set(defaults)
    if unknown:
        raise TypeError(f"unknown kernel settings {sorted(unknown)}; known: "
                        f"{[*defaults, 'form']}")
    return {**defaults, **{k: v for k, v in blocks.items() if v is not None}}


def _check_form(form: str) -> None:
    if form not in (*FORMS, "auto"):
        raise ValueError(f"form must be one of {(*FORMS, 'auto')}, got {form!r}")


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


class _Layout:
    """Padded rows, the feature tables and the grid of one kernel family (module docstring)."""

    def __init__(self, X, n_components, *, precision, interpret, blocks, form,
                 family="stats"):
        s = _settings(blocks, form, family)
        self.form = form
        self.block_n, self.block_k = s["block_n"], s["block_k"]
        self.tiles, self.num_warps = s["tiles_per_program"], s["num_warps"]
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
        self.chunks = feature_chunks(self.p)
        self.tables = _feature_tables(self.p)

    def pad_rows(self, a):
        return jnp.pad(a, (0, self.n_pad - a.shape[0]))

    def static(self, **extra):
        n_pairs = self.p * (self.p + 1) // 2
        return dict(chunks=self.chunks, linear=(n_pairs, n_pairs + self.p),
                    block_n=self.block_n, block_k=self.block_k, algorithm=self.algorithm,
                    **extra)

    def call(self, kernel, inputs, out_shape, **static):
        """Launch on grid (component blocks, row groups) with whole-array refs."""
        kernel = functools.partial(kernel, tiles_per_program=self.tiles, n_tiles=self.n_tiles,
                                   **self.static(**static))
        inputs = (self.Xp, *self.tables, *inputs)
        return pallas_call(
            kernel, interpret=self.interpret, num_warps=self.num_warps,
            grid=(self.n_blocks, self.groups),
            in_specs=[_full_spec(a.shape) for a in inputs],
            out_specs=[_full_spec(s.shape) for s in out_shape], out_shape=out_shape,
        )(*inputs)

    def stats_shapes(self):
        dtype = self.Xp.dtype
        width = sum(w for _, w in self.chunks)
        return [jax.ShapeDtypeStruct((self.groups, self.K), dtype),
                jax.ShapeDtypeStruct((self.groups, width, self.K), dtype)]

    def sum_stats(self, counts, moments, loglik) -> SuffStats:
        """Sum the per-group partials, cut the padding and unpack the features."""
        k, p = self.k, self.p
        a, b = np.triu_indices(p)
        moments = moments.sum(0)[:, :k]
        pairs = moments[:len(a)].T
        s2 = jnp.zeros((k, p, p), moments.dtype).at[:, a, b].set(pairs).at[:, b, a].set(pairs)
        return SuffStats(counts.sum(0)[:k], moments[len(a):len(a) + p].T, s2, loglik)


class _Problem(_Layout):
    """The layout plus the form's coefficients of the parameters."""

    def __init__(self, X, params, *, weighted=True, **kw):
        super().__init__(X, params.n_components, **kw)
        if self.form == "quadratic":
            self.coefficients = _quadratic_weights(params, self.K, weighted=weighted)
        else:
            self.coefficients = _whitening(params, self.P, self.K, weighted=weighted)

    def call(self, kernel, inputs, out_shape, **static):
        return super().call(kernel, (*inputs, *self.coefficients), out_shape, form=self.form,
                            n_coef=len(self.coefficients), **static)

    def block_lse(self):
        """(blocks, n_pad) log-sum-exp of each component block's weighted logits."""
        out = jax.ShapeDtypeStruct((self.n_blocks, self.n_pad), self.Xp.dtype)
        return self.call(_block_lse_kernel, (), [out])[0]


def _by_form(form, X, params, run):
    """``run(concrete_form)``; "auto" picks by :func:`quadratic_error_estimate` (a Python
    choice on concrete input, ``lax.cond`` under tracing)."""
    _check_form(form)
    if form != "auto":
        return run(form)
    quadratic = quadratic_error_estimate(X, params) <= QUADRATIC_MAX_ERROR
    if isinstance(quadratic, jax.core.Tracer):
        return jax.lax.cond(quadratic, lambda: run("quadratic"), lambda: run("whitened"))
    return run("quadratic" if bool(quadratic) else "whitened")


def _row_weights(X, sample_weight, layout: _Layout):
    w = jnp.ones(X.shape[0], X.dtype) if sample_weight is None else sample_weight.astype(X.dtype)
    return layout.pad_rows(w)


def _log_prob(X, params, form, kw, blocks):
    prob = _Problem(X, params, form=form, blocks=blocks, family="density", **kw)
    return jax.nn.logsumexp(prob.block_lse(), axis=0)[:prob.n]


def _responsibility_stats(X, params, log_prob_x, sample_weight, form, kw, blocks):
    prob = _Problem(X, params, form=form, blocks=blocks, **kw)
    lse = prob.pad_rows(log_prob_x)
    w = _row_weights(X, sample_weight, prob)
    partials = prob.call(_suff_stats_kernel, (w, lse), prob.stats_shapes())
    return prob.sum_stats(*partials, jnp.sum(w * lse))


def log_prob(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
             form: str = "auto", **blocks):
    """(n,) log p(x_i): per-block log-sum-exp kernel, combined over blocks by XLA.

    ``form``: "whitened", "quadratic" or "auto" (module docstring). ``blocks``: kernel
    settings overriding :data:`DEFAULT_BLOCKS` (here and below).
    """
    kw = dict(precision=precision, interpret=interpret)
    return _by_form(form, X, params, lambda f: _log_prob(X, params, f, kw, blocks))


def responsibility_stats(X, params: MixtureParams, log_prob_x, sample_weight=None, *,
                         precision: str = "highest", interpret: bool = False,
                         form: str = "auto", **blocks) -> SuffStats:
    """The statistics pass alone, given log p(x_i) (n,): N, sum r x, sum r x x^T, sum w log p."""
    kw = dict(precision=precision, interpret=interpret)
    return _by_form(form, X, params, lambda f: _responsibility_stats(
        X, params, log_prob_x, sample_weight, f, kw, blocks))


def suff_stats(X, params: MixtureParams, sample_weight=None, *, precision: str = "highest",
               interpret: bool = False, form: str = "auto", density_blocks=None,
               **blocks) -> SuffStats:
    """Fused E-step statistics: the log p(x) pass, then the per-component-block stats pass.

    ``density_blocks``: settings of the log p(x) pass (``blocks`` are the statistics
    pass's); both passes use one form.
    """
    kw = dict(precision=precision, interpret=interpret)

    def run(f):
        lse = _log_prob(X, params, f, kw, density_blocks or {})
        return _responsibility_stats(X, params, lse, sample_weight, f, kw, blocks)

    return _by_form(form, X, params, run)


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           precision: str = "highest", interpret: bool = False,
                           **blocks) -> SuffStats:
    """Statistics of hard labels with one-hot responsibilities built in-kernel."""
    layout = _Layout(X, n_components, precision=precision, interpret=interpret, blocks=blocks,
                     form="quadratic")
    w = _row_weights(X, sample_weight, layout)
    labels = layout.pad_rows(labels.astype(jnp.int32))
    partials = layout.call(_label_stats_kernel, (w, labels), layout.stats_shapes())
    return layout.sum_stats(*partials, jnp.zeros((), X.dtype))


def _sample_labels_with_stats(key, X, params, form, kw, blocks):
    prob = _Problem(X, params, form=form, blocks=blocks, **kw)
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
        _sample_stats_kernel, (w, u, lse, start, landing),
        [jax.ShapeDtypeStruct((prob.n_blocks, prob.n_pad), jnp.int32), *prob.stats_shapes()],
        n_components=prob.k)
    labels = jnp.sum(labels, axis=0)[:prob.n]
    return labels, lse[:prob.n], prob.sum_stats(*partials, jnp.zeros((), X.dtype))


def sample_labels_with_stats(key, X, params: MixtureParams, *, precision: str = "highest",
                             interpret: bool = False, form: str = "auto", **blocks):
    """Inverse-CDF draw per row fused with the statistics of the drawn labels.

    Returns (labels (n,) int32, log p(x) (n,), :class:`SuffStats` of the labels).
    """
    kw = dict(precision=precision, interpret=interpret)
    return _by_form(form, X, params, lambda f: _sample_labels_with_stats(
        key, X, params, f, kw, blocks))


def sample_labels(key, X, params: MixtureParams, *, precision: str = "highest",
                  interpret: bool = False, return_log_prob: bool = False, form: str = "auto",
                  **blocks):
    """One inverse-CDF categorical draw per row (uniforms as in the reference)."""
    labels, lse, _ = sample_labels_with_stats(key, X, params, precision=precision,
                                              interpret=interpret, form=form, **blocks)
    return (labels, lse) if return_log_prob else labels


def _mvn_logpdf(X, params, form, kw, blocks):
    prob = _Problem(X, params, weighted=False, form=form, blocks=blocks, family="density",
                    **kw)
    kernel = functools.partial(_mvn_logpdf_kernel, form=form, n_coef=len(prob.coefficients),
                               **prob.static())
    inputs = (prob.Xp, *prob.tables, *prob.coefficients)
    out_shape = jax.ShapeDtypeStruct((prob.n_pad, prob.K), X.dtype)
    out = pallas_call(
        kernel, interpret=prob.interpret, num_warps=prob.num_warps,
        grid=(prob.n_tiles, prob.n_blocks),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=_full_spec(out_shape.shape), out_shape=out_shape,
    )(*inputs)
    return out[:prob.n, :prob.k]


def mvn_logpdf(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
               form: str = "auto", **blocks):
    """(n, k) component log-densities, one (block_n, block_k) tile per program."""
    kw = dict(precision=precision, interpret=interpret)
    return _by_form(form, X, params, lambda f: _mvn_logpdf(X, params, f, kw, blocks))


def _register_lowering_cases() -> None:
    """Lowering cases per kernel, form and dtype (n = 100 ragged rows, p = 16, k = 40)."""
    n, p, k = 100, 16, 40

    def params_of(dtype):
        return MixtureParams(
            jax.ShapeDtypeStruct((k,), dtype), jax.ShapeDtypeStruct((k, p), dtype),
            jax.ShapeDtypeStruct((k, p, p), dtype), jax.ShapeDtypeStruct((k, p, p), dtype),
            "full")

    cases = {"suff_stats_from_labels": lambda X, _, labels: suff_stats_from_labels(X, labels, k)}
    for form in FORMS:
        cases |= {
            f"log_prob_{form}": lambda X, prm, _, f=form: log_prob(X, prm, form=f),
            f"suff_stats_{form}": lambda X, prm, _, f=form: suff_stats(
                X, prm, precision="tf32x3", form=f),
            # the smallest blocks the tests use (float64 dots need M, K >= 16 and N >= 8)
            f"suff_stats_small_blocks_{form}": lambda X, prm, _, f=form: suff_stats(
                X, prm, form=f, block_n=16, block_k=8,
                density_blocks=dict(block_n=16, block_k=8)),
            f"mvn_logpdf_{form}": lambda X, prm, _, f=form: mvn_logpdf(X, prm, form=f),
            f"sample_labels_with_stats_{form}": lambda X, prm, _, f=form: (
                sample_labels_with_stats(jax.random.key(0), X, prm, form=f)),
        }
    for dtype in (jnp.float32, jnp.float64):
        for name, fn in cases.items():
            register_lowering_case(
                "mixture", f"{name}_{jnp.dtype(dtype).name}", fn,
                (jax.ShapeDtypeStruct((n, p), dtype), params_of(dtype),
                 jax.ShapeDtypeStruct((n,), jnp.int32)))


_register_lowering_cases()

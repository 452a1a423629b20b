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
(the public ops and the drivers pass centred X). The quadratic-feature form is slower at
both precisions and less accurate (``benchmarks/results/*/probes/mixture_*.md``).

Passes. Rows are processed in chunks of ``rows_per_chunk`` (memory O(chunk x k), so
n = 1e8 fits). Per chunk the *density pass* (``_density_kernel``) computes each
(block_n, block_k) tile of logits once, writes the per-block log-sum-exp (combined by XLA
into log p(x)) and, for the statistics and the draws, the logits themselves; the
*statistics pass* reads them back (one write and one read of 4 k bytes per row instead of
recomputing the densities, which costs more than the round trip) and
accumulates N, x^T r and the second moments in registers, its products contracting the
row axis of X^T (no in-register transposes). ``moments`` picks the second-moment
products: "full", one (P^2, block_n) x (block_n, block_k) product of vec(x x^T);
"packed", the symmetric halves only: rows a < P/2 against every b, then a, b >= P/2
((P/2) P + (P/2)^2 = 3/4 of the rows), the rest mirrored by XLA.

Layout: features padded to P = max(16, next_pow2(p)) (Triton tensors are powers of two;
float64 dots need a contraction >= 16), components to a multiple of both passes'
``block_k`` (padded components get c = -inf and zero probability), rows to a multiple of
both ``block_n`` (zero weight). Every kernel runs on grid (component block, row group):
program (kb, g) walks ``tiles_per_program`` row tiles and writes one partial per
(block, group).

Kernels: ``_density_kernel`` (block lse, optionally the logits), ``_suff_stats_kernel``
(r = w exp(logit - log p(x))), ``_draw_kernel`` (inverse-CDF label inside the component
block where the row's uniform lands, known from the block masses),
``_mvn_logpdf_kernel``; the statistics of the drawn labels are
the label statistics below.

Precision: float32 dots run as ``"highest"`` (IEEE fp32 FMA) or ``"tf32x3"`` (three TF32
tensor-core products, error-compensated, close to fp32); plain TF32 is never used.
float64 dots are native float64. Block settings default per float32 precision and for
float64 (:data:`DEFAULT_BLOCKS`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gpustat._arrays import next_pow2, over_row_chunks, pad_axis, row_weights
from gpustat.pallas._common import pallas_call
from gpustat.reference.mixture import (
    MixtureParams,
    SuffStats,
    full_precision_cholesky,
    log_det_precision_cholesky,
)

__all__ = [
    "DEFAULT_BLOCKS",
    "LABEL_BLOCKS",
    "MAX_FEATURES",
    "MOMENTS",
    "PRECISIONS",
    "default_blocks",
    "label_stats",
    "log_prob",
    "mvn_logpdf",
    "sample_labels",
    "sample_labels_with_stats",
    "suff_stats",
    "suff_stats_from_labels",
]

MAX_FEATURES = 32  # P^2 x block_k second-moment accumulators per program
PRECISIONS = {
    "highest": jax.lax.DotAlgorithmPreset.F32_F32_F32,
    "tf32x3": jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}
MOMENTS = ("full", "packed")
ROWS_PER_CHUNK = 1 << 20  # logits buffer of a chunk: 4 MiB per component (1 GiB at k = 256)
# The centred statistics pass (a pivot per component): one (P, block_n) x (block_n, P)
# product per component of the block, unrolled, so block_k is small. Not yet swept on a GPU.
_CENTRED_BLOCKS = {"block_n": 32, "block_k": 8, "tiles_per_program": 64, "num_warps": 4,
                   "num_stages": 1}
# Kernel settings of the density pass and of the statistics passes per float32 precision
# and for float64 (num_stages: Triton's software pipelining of the row-tile loop).
# Sampling regroups the density pass's block lse into the statistics pass's blocks, so
# its block_k must divide theirs.
DEFAULT_BLOCKS = {
    # "tf32x3": the fastest density and statistics settings of bench_mixture's sweep at
    # n = 1e6, p = 16, k = 256
    "tf32x3": {
        "density": {"block_n": 128, "block_k": 32, "tiles_per_program": 32, "num_warps": 4,
                    "num_stages": 1},
        "stats": {"block_n": 32, "block_k": 64, "tiles_per_program": 64, "num_warps": 4,
                  "num_stages": 1, "moments": "packed"},
        "centred": _CENTRED_BLOCKS,
    },
    # "highest": IEEE fp32 dots keep their operands in registers, so small statistics
    # tiles; the density pass's tile loop is software-pipelined over 3 stages (faster
    # there, slower for the statistics pass, "tf32x3" and float64)
    "highest": {
        "density": {"block_n": 64, "block_k": 32, "tiles_per_program": 32, "num_warps": 4,
                    "num_stages": 3},
        "stats": {"block_n": 16, "block_k": 64, "tiles_per_program": 128, "num_warps": 4,
                  "num_stages": 1, "moments": "packed"},
        "centred": _CENTRED_BLOCKS,
    },
    # float64: the fastest of the same sweep; the "highest" statistics tiles are several
    # times slower in float64
    "float64": {
        "density": {"block_n": 64, "block_k": 16, "tiles_per_program": 64, "num_warps": 4,
                    "num_stages": 1},
        "stats": {"block_n": 32, "block_k": 32, "tiles_per_program": 128, "num_warps": 4,
                  "num_stages": 1, "moments": "packed"},
        "centred": _CENTRED_BLOCKS,
    },
}


def default_blocks(dtype, precision: str) -> dict:
    """The kernels' default settings for ``dtype`` (float64 has its own) and ``precision``."""
    return DEFAULT_BLOCKS["float64" if jnp.dtype(dtype) == jnp.float64 else precision]


def padded_features(p: int) -> int:
    """P: feature axis padded to a power of two >= 16."""
    return max(16, next_pow2(p))


def _dot_algorithm(dtype, precision: str):
    """Dot algorithm for float32 (never plain TF32); None = native float64."""
    return None if jnp.dtype(dtype) == jnp.float64 else PRECISIONS[precision]


def _whitening(params: MixtureParams, P: int, K: int, weighted: bool):
    """(W (p, P, K), m (p, K), c (K,)): W[d, :, j] = U_j[:, d], m[d, j] = mu_j^T U_j[:, d],
    c_j = [log w_j] + log det U_j - p/2 log 2 pi (-inf on padded components)."""
    k, p = params.means.shape
    chol = full_precision_cholesky(params)
    shift = jnp.einsum("ka,kad->kd", params.means, chol, precision=jax.lax.Precision.HIGHEST)
    c = log_det_precision_cholesky(params) - 0.5 * p * math.log(2 * math.pi)
    if weighted:
        c = c + jnp.log(params.weights)
    W = jnp.pad(jnp.transpose(chol, (2, 1, 0)), ((0, 0), (0, P - p), (0, K - k)))
    m = jnp.pad(shift.T, ((0, 0), (0, K - k)))
    return W, m, jnp.pad(c, (0, K - k), constant_values=-jnp.inf)


# ---------------------------------------------------------------------------------------
# Kernel bodies.


def _dot(a, b, algorithm):
    return jnp.dot(a, b, precision=algorithm, preferred_element_type=a.dtype)


def _contraction(d: int, P: int, dtype) -> int:
    """Features that whitened coordinate d contracts: U_j is upper triangular, so
    U_j[:, d] is zero below row d; the smallest power of two >= d + 1 that a dot takes
    (8 for float32, 16 for float64), at most P."""
    return min(P, max(16 if jnp.dtype(dtype) == jnp.float64 else 8, next_pow2(d + 1)))


def _block_logits(x_ref, rows, coef_refs, kb, block_k, algorithm):
    """(block_n, block_k) logits of component block kb for the row tile ``rows`` of X.

    One product per whitened coordinate d over its first :func:`_contraction` features
    (for p = 16 in float32: 8 for d < 8, so 3/4 of the multiply-adds of full products).
    """
    W_ref, m_ref, c_ref = coef_refs
    cols = pl.ds(kb * block_k, block_k)
    P = x_ref.shape[1]
    leading = {}  # x's first K features per contraction K, loaded once
    sq = None
    for d in range(W_ref.shape[0]):  # static: one product per whitened coordinate
        K = _contraction(d, P, x_ref.dtype)
        if K not in leading:
            leading[K] = x_ref[rows, pl.ds(0, K)]
        z = _dot(leading[K], W_ref[d, pl.ds(0, K), cols], algorithm) - m_ref[d, cols][None, :]
        sq = z * z if sq is None else sq + z * z
    return c_ref[cols][None, :] - 0.5 * sq


def _safe_max(logits):
    """Row max, 0 where a row's block is all -inf (zero weights), so exp(-inf - 0) = 0."""
    top = jnp.max(logits, axis=1)
    return jnp.where(top > -jnp.inf, top, 0.0)


def _tile_loop(body, init, *, tiles_per_program, n_tiles):
    """fori_loop over this program's row tiles [g * tiles_per_program, ...)."""
    first = pl.program_id(1) * tiles_per_program
    return jax.lax.fori_loop(first, jnp.minimum(first + tiles_per_program, n_tiles), body,
                             init)


def _density_kernel(x_ref, *refs, store_logits, block_n, block_k, tiles_per_program, n_tiles,
                    algorithm):
    coef_refs, (lse_ref, *logits_ref) = refs[:3], refs[3:]
    kb = pl.program_id(0)

    def body(t, carry):
        rows = pl.ds(t * block_n, block_n)
        logits = _block_logits(x_ref, rows, coef_refs, kb, block_k, algorithm)
        if store_logits:
            logits_ref[0][rows, pl.ds(kb * block_k, block_k)] = logits
        top = _safe_max(logits)
        lse_ref[kb, rows] = top + jnp.log(jnp.sum(jnp.exp(logits - top[:, None]), axis=1))
        return carry

    _tile_loop(body, 0, tiles_per_program=tiles_per_program, n_tiles=n_tiles)


def _second_moment_rows(xt, xt_ref, rows, moments):
    """The left operands of the second-moment products of the row tile ``xt`` (P, block_n)
    (rows contract): "full": [vec(x x^T)] (P^2, block_n), row a P + b = x_a x_b; "packed":
    [x_a x_b for a < P/2, all b] ((P/2) P, block_n) and [x_a x_b for a, b >= P/2]
    ((P/2)^2, block_n), whose halves of x are read from ``xt_ref`` (no value slicing)."""
    P, block_n = xt.shape
    if moments == "full":
        return ((xt[:, None, :] * xt[None, :, :]).reshape(P * P, block_n),)
    half = P // 2
    top = xt_ref[pl.ds(0, half), rows]
    bottom = xt_ref[pl.ds(half, half), rows]
    return ((top[:, None, :] * xt[None, :, :]).reshape(half * P, block_n),
            (bottom[:, None, :] * bottom[None, :, :]).reshape(half * half, block_n))


def _run_stats(xt_ref, responsibilities_fn, counts_ref, s1_ref, s2_ref, *, moments, block_n,
               block_k, tiles_per_program, n_tiles, algorithm):
    """N += sum r, S1 += x^T r, S2 += (second-moment rows) r of ``responsibilities_fn(rows)``
    (block_n, block_k) over this program's row tiles, in registers; then store the
    partials.

    Rows are the contraction axis of every product, so the tile is read transposed
    (xt (P, block_n), from X^T) and r is the right operand as it stands.
    """
    P = xt_ref.shape[0]
    dtype = xt_ref.dtype

    def body(t, acc):
        counts, s1, s2 = acc
        rows = pl.ds(t * block_n, block_n)
        r = responsibilities_fn(rows)
        xt = xt_ref[:, rows]
        s2 = tuple(s + _dot(q, r, algorithm)
                   for s, q in zip(s2, _second_moment_rows(xt, xt_ref, rows, moments)))
        return counts + jnp.sum(r, axis=0), s1 + _dot(xt, r, algorithm), s2

    s2_rows = (P * P,) if moments == "full" else (P * P // 2, P * P // 4)
    init = (jnp.zeros((block_k,), dtype), jnp.zeros((P, block_k), dtype),
            tuple(jnp.zeros((m, block_k), dtype) for m in s2_rows))
    counts, s1, s2 = _tile_loop(body, init, tiles_per_program=tiles_per_program,
                                n_tiles=n_tiles)
    kb, g = pl.program_id(0), pl.program_id(1)
    cols = pl.ds(kb * block_k, block_k)
    counts_ref[g, cols] = counts
    s1_ref[g, :, cols] = s1
    offset = 0
    for s in s2:
        s2_ref[g, pl.ds(offset, s.shape[0]), cols] = s
        offset += s.shape[0]


def _suff_stats_kernel(xt_ref, w_ref, lse_ref, logits_ref, *outs, block_k, **loop):
    cols = pl.ds(pl.program_id(0) * block_k, block_k)

    def responsibilities(rows):
        return jnp.exp(logits_ref[rows, cols] - lse_ref[rows][:, None]) * w_ref[rows][:, None]

    _run_stats(xt_ref, responsibilities, *outs, block_k=block_k, **loop)


def _centred_stats_kernel(xt_ref, x_ref, w_ref, lse_ref, logits_ref, pivot_ref, pivot_t_ref,
                          counts_ref, s1_ref, s2_ref, *, block_n, block_k,
                          tiles_per_program, n_tiles, algorithm):
    """Statistics about a pivot c_j per component: N_j, sum r (x - c_j) and
    sum r (x - c_j)(x - c_j)^T, each deviation formed before its product (float32 keeps
    the small eigenvalues of components far from the origin).

    Per row tile: r (block_n, block_k) as in :func:`_suff_stats_kernel`; S1' takes one
    product X^T r less c_j N_j of the tile (the tile's sums stay near the deviations);
    S2'_j one (P, block_n) x (block_n, P) product (x - c_j)^T diag(r_j) (x - c_j) per
    component j of the block (unrolled), r_j picked out of r by a masked row sum.
    """
    kb = pl.program_id(0)
    cols = pl.ds(kb * block_k, block_k)
    P = xt_ref.shape[0]
    dtype = xt_ref.dtype
    pivots = [pivot_ref[kb * block_k + j, :] for j in range(block_k)]  # (P,) each
    pivot_t = pivot_t_ref[:, cols]  # (P, block_k)
    component = jax.lax.broadcasted_iota(jnp.int32, (block_n, block_k), 1)

    def body(t, acc):
        counts, s1, s2 = acc
        rows = pl.ds(t * block_n, block_n)
        r = jnp.exp(logits_ref[rows, cols] - lse_ref[rows][:, None]) * w_ref[rows][:, None]
        xt = xt_ref[:, rows]
        x = x_ref[rows, :]
        tile_counts = jnp.sum(r, axis=0)
        s1 = s1 + (_dot(xt, r, algorithm) - pivot_t * tile_counts[None, :])
        new_s2 = []
        for j in range(block_k):  # static
            r_j = jnp.sum(jnp.where(component == j, r, 0.0), axis=1)
            y_t = (xt - pivots[j][:, None]) * r_j[None, :]
            new_s2.append(s2[j] + _dot(y_t, x - pivots[j][None, :], algorithm))
        return counts + tile_counts, s1, tuple(new_s2)

    init = (jnp.zeros((block_k,), dtype), jnp.zeros((P, block_k), dtype),
            tuple(jnp.zeros((P, P), dtype) for _ in range(block_k)))
    counts, s1, s2 = _tile_loop(body, init, tiles_per_program=tiles_per_program,
                                n_tiles=n_tiles)
    g = pl.program_id(1)
    counts_ref[g, cols] = counts
    s1_ref[g, :, cols] = s1
    for j in range(block_k):
        s2_ref[g, kb * block_k + j, :, :] = s2[j]


def _draw_kernel(u_ref, lse_ref, start_ref, landing_ref, logits_ref, label_ref, *, block_n,
                 block_k, tiles_per_program, n_tiles, n_components):
    """Inverse-CDF label of each row whose uniform lands in component block kb (0 in the
    other blocks' rows; the caller sums over blocks). Runs on the statistics pass's grid."""
    kb = pl.program_id(0)
    cols = pl.ds(kb * block_k, block_k)

    def body(t, carry):
        rows = pl.ds(t * block_n, block_n)
        prob = jnp.exp(logits_ref[rows, cols] - lse_ref[rows][:, None])
        # components of the block whose cumulative probability is <= u
        cdf = start_ref[kb, rows][:, None] + jnp.cumsum(prob, axis=1)
        below = jnp.sum(cdf <= u_ref[rows][:, None], axis=1, dtype=jnp.int32)
        label = jnp.minimum(kb * block_k + jnp.minimum(below, block_k - 1), n_components - 1)
        mine = landing_ref[rows] == kb  # u_i lands in this block (from the block masses)
        label_ref[kb, rows] = jnp.where(mine, label, 0)
        return carry

    _tile_loop(body, 0, tiles_per_program=tiles_per_program, n_tiles=n_tiles)


def _mvn_logpdf_kernel(x_ref, *refs, block_n, block_k, algorithm):
    coef_refs, out_ref = refs[:3], refs[3]
    rows = pl.ds(pl.program_id(0) * block_n, block_n)
    kb = pl.program_id(1)
    out_ref[rows, pl.ds(kb * block_k, block_k)] = _block_logits(
        x_ref, rows, coef_refs, kb, block_k, algorithm)


# ---------------------------------------------------------------------------------------
# Wrappers: same signatures as gpustat.reference.mixture (plus kernel settings).


def _settings(defaults: dict, blocks: dict | None) -> dict:
    """``defaults`` updated with the caller's non-None settings."""
    blocks = blocks or {}
    unknown = set(blocks) - set(defaults)
    if unknown:
        raise TypeError(f"unknown kernel settings {sorted(unknown)}; known: {list(defaults)}")
    settings = {**defaults, **{k: v for k, v in blocks.items() if v is not None}}
    if settings.get("moments", "full") not in MOMENTS:
        raise ValueError(f"moments must be one of {MOMENTS}, got {settings['moments']!r}")
    stages = settings.get("num_stages", 1)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"num_stages must be a positive integer, got {stages!r}")
    return settings


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


class _Pass:
    """Block settings and grid of one pass over n_pad rows and K components."""

    def __init__(self, settings: dict, n_pad: int, K: int):
        self.block_n, self.block_k = settings["block_n"], settings["block_k"]
        self.tiles, self.num_warps = settings["tiles_per_program"], settings["num_warps"]
        self.num_stages = settings["num_stages"]  # Triton software pipelining of the tile loop
        self.n_tiles = n_pad // self.block_n
        self.grid = (K // self.block_k, -(-self.n_tiles // self.tiles))

    def call(self, kernel, inputs, out_shape, *, interpret, **static):
        kernel = functools.partial(kernel, block_n=self.block_n, block_k=self.block_k,
                                   tiles_per_program=self.tiles, n_tiles=self.n_tiles,
                                   **static)
        return pallas_call(
            kernel, interpret=interpret, num_warps=self.num_warps, num_stages=self.num_stages,
            grid=self.grid,
            in_specs=[_full_spec(a.shape) for a in inputs],
            out_specs=[_full_spec(s.shape) for s in out_shape], out_shape=out_shape,
        )(*inputs)


class _Layout:
    """Padding shared by the density and statistics passes of one row chunk (n rows)."""

    def __init__(self, n, p, n_components, dtype, *, precision, interpret,
                 density_blocks=None, stats_blocks=None, centred_blocks=None):
        defaults = default_blocks(dtype, precision)
        density = _settings(defaults["density"], density_blocks)
        stats = _settings(defaults["stats"], stats_blocks)
        centred = _settings(defaults["centred"], centred_blocks)
        self.n, self.p, self.k = n, p, n_components
        self.P = padded_features(p)
        passes = (density, stats, centred)  # block sizes are powers of two
        row_multiple = max(s["block_n"] for s in passes)
        col_multiple = max(s["block_k"] for s in passes)
        self.n_pad = -(-n // row_multiple) * row_multiple
        self.K = -(-n_components // col_multiple) * col_multiple
        self.density = _Pass(density, self.n_pad, self.K)
        self.stats = _Pass(stats, self.n_pad, self.K)
        self.centred = _Pass(centred, self.n_pad, self.K)
        self.moments = stats["moments"]
        self.packed = self.moments == "packed"
        self.algorithm = _dot_algorithm(dtype, precision)
        self.interpret = interpret
        self.dtype = dtype

    def pad_rows(self, a):
        return jnp.pad(a, [(0, self.n_pad - a.shape[0])] + [(0, 0)] * (a.ndim - 1))

    def padded_x(self, X):
        return self.pad_rows(jnp.pad(X, ((0, 0), (0, self.P - self.p))))

    def coefficients(self, params, weighted=True):
        return _whitening(params, self.P, self.K, weighted)

    def density_pass(self, Xp, coefficients, *, store_logits):
        """(block lse (blocks, n_pad), logits (n_pad, K) or None)."""
        out = [jax.ShapeDtypeStruct((self.density.grid[0], self.n_pad), self.dtype)]
        if store_logits:
            out.append(jax.ShapeDtypeStruct((self.n_pad, self.K), self.dtype))
        res = self.density.call(_density_kernel, (Xp, *coefficients), out,
                                interpret=self.interpret, store_logits=store_logits,
                                algorithm=self.algorithm)
        return res[0], (res[1] if store_logits else None)

    def stats_pass(self, kernel, Xp, inputs, extra_out=(), **static):
        """Partials (counts, S1, S2) of a statistics kernel (plus its ``extra_out``)."""
        groups = self.stats.grid[1]
        P = self.P
        s2_rows = P * P * 3 // 4 if self.packed else P * P
        out = [*extra_out, jax.ShapeDtypeStruct((groups, self.K), self.dtype),
               jax.ShapeDtypeStruct((groups, P, self.K), self.dtype),
               jax.ShapeDtypeStruct((groups, s2_rows, self.K), self.dtype)]
        return self.stats.call(kernel, (Xp.T, *inputs), out, interpret=self.interpret,
                               algorithm=self.algorithm, moments=self.moments, **static)

    def centred_stats(self, Xp, w, lse, logits, pivot, loglik) -> SuffStats:
        """:class:`SuffStats` about the pivots (k, p) (:func:`_centred_stats_kernel`)."""
        P, K = self.P, self.K
        pivot = jnp.pad(pivot.astype(self.dtype), ((0, K - self.k), (0, P - self.p)))
        groups = self.centred.grid[1]
        out = [jax.ShapeDtypeStruct((groups, K), self.dtype),
               jax.ShapeDtypeStruct((groups, P, K), self.dtype),
               jax.ShapeDtypeStruct((groups, K, P, P), self.dtype)]
        counts, s1, s2 = self.centred.call(
            _centred_stats_kernel, (Xp.T, Xp, w, lse, logits, pivot, pivot.T), out,
            interpret=self.interpret, algorithm=self.algorithm)
        k, p = self.k, self.p
        return SuffStats(counts.sum(0)[:k], s1.sum(0)[:p, :k].T, s2.sum(0)[:k, :p, :p],
                         loglik)

    def sum_stats(self, counts, s1, s2, loglik) -> SuffStats:
        """Sum the per-group partials, mirror packed second moments and cut the padding."""
        k, p, P = self.k, self.p, self.P
        s2 = s2.sum(0)
        if self.packed:  # rows: (a < P/2, b) then (a, b >= P/2); S2[a, b] = S2[b, a]
            half = P // 2
            top = s2[:half * P].reshape(half, P, self.K)
            bottom = s2[half * P:].reshape(half, half, self.K)
            lower = jnp.concatenate([jnp.swapaxes(top[:, half:], 0, 1), bottom], axis=1)
            s2 = jnp.concatenate([top, lower], axis=0)
        s2 = s2.reshape(P, P, self.K)[:p, :p, :k]
        return SuffStats(counts.sum(0)[:k], s1.sum(0)[:p, :k].T, jnp.transpose(s2, (2, 0, 1)),
                         loglik)


def log_prob(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
             **blocks):
    """(n,) log p(x_i): the density pass (block log-sum-exps, no logits written), combined
    over blocks by XLA. ``blocks``: density-pass settings overriding :data:`DEFAULT_BLOCKS`.
    """
    layout = _Layout(*X.shape, params.n_components, X.dtype, precision=precision,
                     interpret=interpret, density_blocks=blocks)
    part, _ = layout.density_pass(layout.padded_x(X), layout.coefficients(params),
                                  store_logits=False)
    return jax.nn.logsumexp(part, axis=0)[:layout.n]


def suff_stats(X, params: MixtureParams, sample_weight=None, pivot=None, *,
               precision: str = "highest", interpret: bool = False,
               rows_per_chunk: int = ROWS_PER_CHUNK, density_blocks: dict | None = None,
               stats_blocks: dict | None = None, centred_blocks: dict | None = None
               ) -> SuffStats:
    """Fused E-step statistics per row chunk: the density pass (logits and block lse), then
    the statistics pass over the stored logits: about the origin, or with ``pivot`` (k, p)
    about c_j per component (:func:`_centred_stats_kernel`, settings ``centred_blocks``)."""
    def chunk(Xc, wc):
        layout = _Layout(*Xc.shape, params.n_components, X.dtype, precision=precision,
                         interpret=interpret, density_blocks=density_blocks,
                         stats_blocks=stats_blocks, centred_blocks=centred_blocks)
        Xp = layout.padded_x(Xc)
        part, logits = layout.density_pass(Xp, layout.coefficients(params), store_logits=True)
        lse = jax.nn.logsumexp(part, axis=0)
        w = layout.pad_rows(wc)
        loglik = jnp.sum(w * lse)
        if pivot is not None:
            return (layout.centred_stats(Xp, w, lse, logits, pivot, loglik),)
        partials = layout.stats_pass(_suff_stats_kernel, Xp, (w, lse, logits))
        return (layout.sum_stats(*partials, loglik),)

    return over_row_chunks(chunk, rows_per_chunk, (X, row_weights(X, sample_weight)))[0]


def suff_stats_from_labels(X, labels, n_components: int, sample_weight=None, *,
                           precision: str = "highest", interpret: bool = False,
                           **blocks) -> SuffStats:
    """Statistics of hard labels: rows sorted by label, one product per row tile of each
    component's run (the label statistics below). ``blocks``: settings
    overriding :data:`LABEL_BLOCKS`."""
    p = X.shape[1]
    Xp = jnp.pad(X, ((0, 0), (0, padded_features(p) - p)))
    return label_stats(Xp, row_weights(X, sample_weight), labels.astype(jnp.int32),
                       n_components, p, algorithm=_dot_algorithm(X.dtype, precision),
                       interpret=interpret, **_label_settings(X.dtype, precision, blocks))


def _label_settings(dtype, precision: str, blocks: dict | None) -> dict:
    """The label statistics' settings: the defaults of the dtype and precision, updated."""
    precision = "highest" if jnp.dtype(dtype) == jnp.float64 else precision
    return _settings(LABEL_BLOCKS[precision], blocks)


def sample_labels_with_stats(key, X, params: MixtureParams, *, precision: str = "highest",
                             interpret: bool = False, rows_per_chunk: int = ROWS_PER_CHUNK,
                             density_blocks: dict | None = None,
                             stats_blocks: dict | None = None,
                             label_blocks: dict | None = None):
    """Inverse-CDF draw per row (on the statistics pass's grid) followed by the statistics
    of the drawn labels (:func:`suff_stats_from_labels`, settings ``label_blocks``).

    Row i uses u_i = ``jax.random.uniform(key, (n,))[i]``. Returns (labels (n,) int32,
    log p(x) (n,), :class:`SuffStats` of the labels).
    """
    label_settings = _label_settings(X.dtype, precision, label_blocks)
    u_all = jax.random.uniform(key, (X.shape[0],), dtype=X.dtype)

    def chunk(Xc, uc, wc):
        layout = _Layout(*Xc.shape, params.n_components, X.dtype, precision=precision,
                         interpret=interpret, density_blocks=density_blocks,
                         stats_blocks=stats_blocks)
        if layout.stats.block_k % layout.density.block_k:
            raise ValueError("sampling needs the density pass's block_k to divide the "
                             f"statistics pass's, got {layout.density.block_k} and "
                             f"{layout.stats.block_k}")
        Xp = layout.padded_x(Xc)
        part, logits = layout.density_pass(Xp, layout.coefficients(params), store_logits=True)
        # regroup the density pass's block lse into the statistics pass's blocks
        blocks = layout.stats.grid[0]
        part = jax.nn.logsumexp(part.reshape(blocks, -1, layout.n_pad), axis=1)
        lse = jax.nn.logsumexp(part, axis=0)
        u = layout.pad_rows(uc)
        # block masses -> exclusive prefix (start of each block's CDF) and the landing
        # block: the last block of positive mass whose start is <= u
        mass = jnp.exp(part - lse)
        start = jnp.cumsum(mass, axis=0) - mass
        block_ids = jnp.arange(blocks, dtype=jnp.int32)[:, None]
        landing = jnp.max(jnp.where((start <= u) & (mass > 0), block_ids, 0), axis=0)
        (labels,) = layout.stats.call(
            _draw_kernel, (u, lse, start, landing, logits),
            [jax.ShapeDtypeStruct((blocks, layout.n_pad), jnp.int32)],
            interpret=layout.interpret, n_components=layout.k)
        # one block holds each row's label (0 in the others); int32 sum (x64 promotes)
        labels = jnp.sum(labels, axis=0, dtype=jnp.int32)[:layout.n]
        stats = label_stats(Xp[:layout.n], wc, labels, layout.k, layout.p,
                            algorithm=layout.algorithm, interpret=layout.interpret,
                            **label_settings)
        return stats, labels, lse[:layout.n]

    stats, labels, lse = over_row_chunks(chunk, rows_per_chunk,
                                      (X, u_all, jnp.ones(X.shape[0], X.dtype)))
    return labels, lse, stats


def sample_labels(key, X, params: MixtureParams, *, precision: str = "highest",
                  interpret: bool = False, return_log_prob: bool = False, **settings):
    """One inverse-CDF categorical draw per row (uniforms as in the reference)."""
    labels, lse, _ = sample_labels_with_stats(key, X, params, precision=precision,
                                              interpret=interpret, **settings)
    return (labels, lse) if return_log_prob else labels


def mvn_logpdf(X, params: MixtureParams, *, precision: str = "highest", interpret: bool = False,
               **blocks):
    """(n, k) component log-densities, one (block_n, block_k) tile per program."""
    layout = _Layout(*X.shape, params.n_components, X.dtype, precision=precision,
                     interpret=interpret, density_blocks=blocks)
    d = layout.density
    inputs = (layout.padded_x(X), *layout.coefficients(params, weighted=False))
    kernel = functools.partial(_mvn_logpdf_kernel, block_n=d.block_n, block_k=d.block_k,
                               algorithm=layout.algorithm)
    out_shape = jax.ShapeDtypeStruct((layout.n_pad, layout.K), X.dtype)
    out = pallas_call(
        kernel, interpret=interpret, num_warps=d.num_warps, num_stages=d.num_stages,
        grid=(d.n_tiles, layout.K // d.block_k),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=_full_spec(out_shape.shape), out_shape=out_shape,
    )(*inputs)
    return out[:layout.n, :layout.k]


# -- statistics of hard labels ------------------------------------------------------------
# Pallas-Triton kernel for the statistics of hard labels (Gibbs sweeps, k-means-style
# counts): (N_j, sum_i w_i x_i, sum_i w_i x_i x_i^T) over the rows labelled j.
#
# Rows are sorted by label (stable, so the sums are deterministic): component j owns the run
# of rows [start_j, end_j), which spans row tiles first_j .. last_j of ``block_n`` rows. A
# *work item* is up to ``tiles_per_item`` consecutive tiles of one run; its program sums
# w x x^T over them with one (P, block_n) @ (block_n, P) product per tile, rows outside the
# run weighted 0. No product multiplies the zeros of other components (one-hot
# responsibilities over (block_n, block_k) tiles spend block_k times the work).
#
# A run of m tiles makes ceil(m / tiles_per_item) items, so there are at most
# n_tiles / tiles_per_item + K items: a static bound, the unused ones empty. The items'
# partial sums are added per component by a one-hot (k, items) product at full precision
# (XLA; no atomics, so deterministic). Large components are spread over many programs, so
# imbalanced labels (a Gibbs sweep's start) keep every SM busy.

# Row tile, tiles per work item and warps per float32 dot algorithm (float64 takes
# "highest"'s): among the fastest of bench_mixture's sweep at n = 1e6, p = 16, k = 256,
# away from settings an order of magnitude slower (wide tiles on few warps).
LABEL_BLOCKS = {
    "tf32x3": {"block_n": 128, "tiles_per_item": 16, "num_warps": 2},
    "highest": {"block_n": 256, "tiles_per_item": 8, "num_warps": 2},
}


def _work_items(start, end, block_n, tiles_per_item, n_items):
    """(component (n_items,), bounds (4, n_items) int32: first tile, end tile, first row,
    end row) of each work item, from the runs [start_j, end_j) of the sorted rows; unused
    items have no tiles and component 0."""
    first = start // block_n
    tiles = jnp.where(end > start, (end - 1) // block_n + 1 - first, 0)
    items = -(-tiles // tiles_per_item)
    items_end = jnp.cumsum(items)
    item = jnp.arange(n_items, dtype=jnp.int32)
    used = item < items_end[-1]
    component = jnp.searchsorted(items_end, item, side="right", method="scan_unrolled")
    component = jnp.where(used, component, 0).astype(jnp.int32)
    tile_lo = first[component] + (item - (items_end - items)[component]) * tiles_per_item
    tile_hi = jnp.minimum(tile_lo + tiles_per_item, first[component] + tiles[component])
    bounds = jnp.stack([tile_lo, jnp.where(used, tile_hi, tile_lo), start[component],
                        end[component]])
    return component, bounds


def _item_kernel(x_ref, w_ref, bounds_ref, counts_ref, s1_ref, s2_ref, *, block_n,
                 algorithm):
    """Partial sums of one work item: its tiles' rows in [first row, end row)."""
    i = pl.program_id(0)
    P = x_ref.shape[1]
    dtype = x_ref.dtype
    row_lo, row_hi = bounds_ref[2, i], bounds_ref[3, i]

    def body(t, acc):
        count, s1, s2 = acc
        rows = pl.ds(t * block_n, block_n)
        row = t * block_n + jax.lax.broadcasted_iota(jnp.int32, (block_n, 1), 0)
        w = jnp.where((row >= row_lo) & (row < row_hi), w_ref[rows][:, None], 0)
        x = x_ref[rows, :]
        xw = x * w
        # rows contract: (block_n, P)^T x (block_n, P)
        s2 = s2 + jax.lax.dot_general(xw, x, (((0,), (0,)), ((), ())), precision=algorithm,
                                      preferred_element_type=dtype)
        return count + jnp.sum(w, axis=0), s1 + jnp.sum(xw, axis=0), s2

    init = (jnp.zeros((1,), dtype), jnp.zeros((P,), dtype), jnp.zeros((P, P), dtype))
    count, s1, s2 = jax.lax.fori_loop(bounds_ref[0, i], bounds_ref[1, i], body, init)
    counts_ref[pl.ds(i, 1)] = count
    s1_ref[i, :] = s1
    s2_ref[i, :, :] = s2


def _full_spec(shape):
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def label_stats(Xp, w, labels, n_components: int, p: int, *, algorithm, interpret: bool,
                block_n: int, tiles_per_item: int, num_warps: int) -> SuffStats:
    """Statistics of ``labels`` over the rows of ``Xp`` (n, P) (features padded to a power
    of two P >= 16, the first ``p`` real) weighted by ``w``; labels outside
    [0, n_components) count nowhere. ``algorithm``: the float32 dot algorithm (None for
    native float64)."""
    dtype = Xp.dtype
    P = Xp.shape[1]
    # out-of-range labels sort after every run and are not counted
    labels = jnp.where((labels >= 0) & (labels < n_components), labels, n_components)
    sorted_labels, order = jax.lax.sort_key_val(
        labels, jnp.arange(labels.shape[0], dtype=jnp.int32), is_stable=True)
    # run edges: one fused binary search (a scatter-add count contends on k bins; the
    # looped search launches kernels per step)
    edges = jnp.searchsorted(sorted_labels, jnp.arange(n_components + 1, dtype=jnp.int32),
                             method="scan_unrolled").astype(jnp.int32)
    # one gather of the sorted rows, padded to whole tiles (the padding rows lie after
    # every run, so the kernel gives them weight 0)
    order = pad_axis(order, 0, block_n)
    x, w = Xp[order], w[order]
    n_tiles = order.shape[0] // block_n
    n_items = -(-n_tiles // tiles_per_item) + n_components
    component, bounds = _work_items(edges[:-1], edges[1:], block_n, tiles_per_item, n_items)
    inputs = (x, w, bounds)
    out_shape = [jax.ShapeDtypeStruct((n_items,), dtype),
                 jax.ShapeDtypeStruct((n_items, P), dtype),
                 jax.ShapeDtypeStruct((n_items, P, P), dtype)]
    count, s1, s2 = pallas_call(
        functools.partial(_item_kernel, block_n=block_n, algorithm=algorithm),
        interpret=interpret, num_warps=num_warps, grid=(n_items,),
        in_specs=[_full_spec(a.shape) for a in inputs],
        out_specs=[_full_spec(s.shape) for s in out_shape], out_shape=out_shape,
    )(*inputs)
    # per component: a one-hot product over the items (exact, deterministic)
    onehot = (component[None, :] == jnp.arange(n_components)[:, None]).astype(dtype)
    flat = jnp.concatenate([count[:, None], s1, s2.reshape(n_items, P * P)], axis=1)
    total = jnp.dot(onehot, flat, precision=jax.lax.Precision.HIGHEST)
    s2 = total[:, 1 + P:].reshape(n_components, P, P)[:, :p, :p]
    return SuffStats(total[:, 0], total[:, 1:1 + p], 0.5 * (s2 + jnp.swapaxes(s2, 1, 2)),
                     jnp.zeros((), dtype))

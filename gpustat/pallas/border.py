"""Pallas kernels for batched border (arrow-Schur) Newton solves, in three stages.

1. **Row pass** (Pallas, one program per atom): the atom's rows stream through in
   chunks of ``block_rows``; per chunk the latent coordinates ``p < d`` are
   ``(block_rows, K)`` tiles of ``H_tb`` loaded straight from the packed layout, each
   row's ``d x d`` Cholesky and forward substitution run elementwise over the rows
   (unrolled over the static ``d``), and ``sum_i Y_i^T Y_i`` is ``d`` two-dimensional
   ``(K, rows) @ (rows, K)`` dots (tensor-core DMMA for float64 on Hopper, IEEE float32
   otherwise). The program writes the unridged Schur complement ``S0 = H_bb - sum_i
   Y_i^T Y_i`` (``K x K``, zero padding), the reduced right-hand side ``r = sum_i Y_i^T
   u_i - g_b``, the rows' log-determinant, the first failing row and its bump (computed
   only in atoms that have one) and a NaN probe of its inputs.
2. **Schur solve** (XLA, per ``K``): the Gershgorin bump of ``S0``, then
   ``S = S0 + ridge_beta I`` (identity padding); for ``K = 16`` on a GPU the Cholesky of
   every ``S``
   and both triangular solves, unrolled over the static ``K`` on ``(B,)`` vectors of atoms
   (every step elementwise across atoms, which XLA fuses into far fewer launches than
   ``lax.linalg.cholesky`` + two batched triangular solves);
   for ``K = 32`` and in interpret mode the batched calls (XLA compiles the unrolled
   ``K = 32`` form in tens of seconds); then the log-determinant and the per-atom status.
   The serial ``K``-step factorisation is off the per-atom critical path of stage 1.
3. **Back substitution** (Pallas, one program per row chunk, rows independent):
   ``delta_t_i = -L_i^{-T} (u_i + Y_i delta_beta)``, re-whitening the chunk's rows
   from the inputs (read a second time).

Row dimensions ``8 < d <= 32`` take a looped row factorisation instead of the unrolled
one: stages 1 and 3 run one program per chunk of ``wide_rows`` rows of one atom (a long
atom spreads over many programs); each row's block is a ``(D, D)`` tile (``D`` = 16 or
32, identity padding) factorised by a right-looking loop over its ``d`` columns that
updates ``H_tb`` and ``g_t`` alongside (:func:`_wide_whiten`), ``Y_i^T Y_i`` one
``(K, D) @ (D, K)`` dot; the chunks' partial ``S``, ``r``, log-determinants, failing
rows and probes are summed per atom in XLA before stage 2. One call takes one ``d``
(:func:`gpustat.reference.border.solve_by_dim` splits a mixed batch).

``K`` is the border width padded to 16 or 32 (the float64 dot minimum is 16);
padded rows are identity blocks with zero cross terms and padded border entries
identity, so they change nothing. Row-pass atoms are bucketed by ``(K, block_rows)``,
one ``pallas_call`` each, writing in place (aliased outputs) into per-``K`` buffers.

Numerics: float64 stays float64, everything else computes in float32 (dots at
``Precision.HIGHEST``, i.e. no TF32). A pivot fails when ``not (pivot > 0)``; a failed
atom's outputs go NaN and its status says why (same rules as
:mod:`gpustat.reference.border`), other atoms never see it. Index arithmetic is int32:
packed arrays must have fewer than 2**31 entries.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from gpustat._arrays import compute_dtype, next_pow2, nonempty
from gpustat.pallas._common import pallas_call, plt
from gpustat.reference.border import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_ROW_NOT_PD,
    STATUS_SCHUR_NOT_PD,
    BorderLayout,
    gershgorin_bounds,
    gershgorin_ridge_bump,
    row_bump,
    schur_overflow,
    symmetric_from_lower,
)

__all__ = ["MAX_KERNEL_D", "MAX_UNROLLED_D", "KernelConfig", "plan_buckets",
           "solve_border_pallas"]

#: Largest row dimension d the kernel unrolls over rows in lanes (larger d takes the
#: looped row factorisation of :func:`_wide_whiten`).
MAX_UNROLLED_D = 8
#: Largest row dimension d the kernel takes (larger d goes to the reference).
MAX_KERNEL_D = 32
_MIN_TILE = 16  # smallest K and block_rows: float64 dots need M, K >= 16 in Triton
_NO_ROW = 2**30  # "no failing row yet" sentinel, larger than any atom-local row index
# Row pass: atom id, position in its K group, first row, rows, border width,
# H_tb / H_bb / g_b offsets.
_ROW_META = 8
# Back substitution: first row of the chunk, rows in it, border width, H_tb offset of the
# chunk, the atom's position in its K group.
_BACK_META = 5


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile rules of the row pass: ``block_rows <= max_block_rows`` and
    ``d * block_rows * K <= tile_elems`` (the ``H_tb`` tiles of one chunk);
    ``num_warps = clamp(block_rows * K / elems_per_warp, 1, max_warps)``. The back
    substitution takes chunks of ``back_rows`` rows (capped the same way) at
    ``back_warps`` warps. For ``d > unrolled_d`` (at most :data:`MAX_UNROLLED_D`) both
    passes take the looped row factorisation, one program per chunk of ``wide_rows`` rows
    at ``wide_warps`` warps.

    Defaults: a 16-row cap at 2 warps (``elems_per_warp = 128``), the fastest setting of
    ``bench_border``'s sweep on the benchmark batch (d = 2, k_a in [4, 12]); wider row
    blocks spill the row pass's per-lane ``(rows, K)`` accumulators.
    """

    tile_elems: int = 4096
    max_block_rows: int = 16
    elems_per_warp: int = 128
    max_warps: int = 4
    back_rows: int = 32
    back_warps: int = 1
    wide_rows: int = 16
    wide_warps: int = 2
    unrolled_d: int = MAX_UNROLLED_D

    def block_rows_cap(self, d: int, K: int, rows: int | None = None) -> int:
        cap = min(self.max_block_rows if rows is None else rows,
                  max(1, self.tile_elems // (d * K)))
        return max(_MIN_TILE, next_pow2(cap + 1) // 2)  # round down to a power of two

    def num_warps(self, block_rows: int, K: int) -> int:
        return int(np.clip(block_rows * K // self.elems_per_warp, 1, self.max_warps))


@dataclasses.dataclass(frozen=True)
class _Bucket:
    """Atoms whose row pass uses one tile shape, one program each (in program order)."""

    K: int
    block_rows: int
    streamed: bool  # atoms longer than one chunk: a loop over chunks
    atoms: np.ndarray


def _padded_borders(layout: BorderLayout) -> np.ndarray:
    return np.array([max(_MIN_TILE, next_pow2(k)) for k in layout.k_dims], dtype=np.int64)


def plan_buckets(layout: BorderLayout, config: KernelConfig) -> list[_Bucket]:
    """Group atoms by padded border ``K`` and row tile (host, static).

    Atoms that fit one chunk get ``block_rows = next_pow2(n_a)`` (at least 16); longer
    atoms stream chunks of the cap, longest first so the last programs are short.
    """
    buckets = []
    K_all = _padded_borders(layout)
    for K in sorted(set(K_all.tolist())):
        cap = config.block_rows_cap(layout.d, K)
        in_K = np.flatnonzero(K_all == K)
        n = layout.n_rows[in_K]
        R_all = np.array([max(_MIN_TILE, next_pow2(x)) for x in n], dtype=np.int64)
        for R in sorted(set(R_all[n <= cap].tolist())):
            buckets.append(_Bucket(K, R, False, in_K[(n <= cap) & (R_all == R)]))
        if np.any(n > cap):
            long = in_K[n > cap]
            buckets.append(_Bucket(K, cap, True,
                                   long[np.argsort(-layout.n_rows[long], kind="stable")]))
    return buckets


def _group_positions(layout: BorderLayout) -> dict[int, np.ndarray]:
    """``{K: atoms}``: the atoms of each padded border width, ascending (position = index)."""
    K_all = _padded_borders(layout)
    return {K: np.flatnonzero(K_all == K) for K in sorted(set(K_all.tolist()))}


def _row_meta(layout: BorderLayout, atoms: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Flat ``(programs * 8,)`` int32 row-pass metadata in :data:`_ROW_META` order."""
    fields = [atoms, pos, layout.row_offsets[atoms], layout.n_rows[atoms], layout.k_dims[atoms],
              layout.cross_offsets[atoms], layout.hbb_offsets[atoms],
              layout.border_offsets[atoms]]
    return np.stack(fields, axis=1).astype(np.int32).reshape(-1)


def _back_meta(layout: BorderLayout, atoms: np.ndarray, rows: int) -> np.ndarray:
    """Flat ``(chunks * 5,)`` int32 back-substitution metadata, ``rows`` rows per chunk
    (:data:`_BACK_META` order); the atoms' positions are their indices in ``atoms``."""
    n = layout.n_rows[atoms]
    chunks = -(-n // rows)
    owner = np.repeat(np.arange(atoms.size), chunks)
    first = (np.arange(int(chunks.sum())) - np.repeat(np.cumsum(chunks) - chunks, chunks)) * rows
    a = atoms[owner]
    k = layout.k_dims[a]
    fields = [layout.row_offsets[a] + first, np.minimum(rows, layout.n_rows[a] - first), k,
              layout.cross_offsets[a] + first * layout.d * k, owner]
    return np.stack(fields, axis=1).astype(np.int32).reshape(-1)


def _load(ref, index, mask, other):
    """Gather ``ref[index]`` where ``mask`` (a safe index elsewhere)."""
    return plt.load(ref.at[jnp.where(mask, index, 0)], mask=mask, other=other)


def _store(ref, index, value, mask):
    """Scatter ``value`` to ``ref[index]`` where ``mask``.

    Masked lanes aim at the buffer's last slot, a spare one in interpret mode: that mode
    emulates a masked store as a read-modify-write scatter, so a masked lane must not
    share a real index there (on the GPU a masked lane writes nothing).
    """
    plt.store(ref.at[jnp.where(mask, index, ref.shape[0] - 1)], value, mask=mask)


def _nan_probe(x):
    """``sum(x * 0)``: 0 when every entry of ``x`` is finite, NaN otherwise.

    Reduced one axis at a time: a full reduction of a 2-D tile does not lower.
    """
    x = x * 0.0
    while x.ndim:
        x = jnp.sum(x, axis=-1)
    return x


def _row_cholesky(h, ridge, d):
    """Unrolled ``d x d`` lower Cholesky of ``h + ridge I`` whose entries ``h[(p, q)]``
    (p >= q) are vectors: ``(R,)`` rows in the kernels, ``(B,)`` atoms in the Schur solve.

    Returns ``(L, inv_diag, pivots)``: ``L[(p, q)]`` for p > q, ``1 / L[(p, p)]`` and
    the ``d`` pivots (``L[(p, p)]^2``).
    """
    L, inv_diag, pivots = {}, [], []
    for j in range(d):
        pivot = h[(j, j)] + ridge - sum((L[(j, q)] ** 2 for q in range(j)), start=0.0)
        inv_diag.append(jax.lax.rsqrt(pivot))
        for i in range(j + 1, d):
            dot = sum((L[(i, q)] * L[(j, q)] for q in range(j)), start=0.0)
            L[(i, j)] = (h[(i, j)] - dot) * inv_diag[j]
        pivots.append(pivot)
    return L, inv_diag, pivots


def _solve_transposed(L, inv_diag, w):
    """``x`` with ``L^T x = w`` for the unrolled factor of :func:`_row_cholesky` (any
    entry shape: row vectors in the kernels, atom vectors in the Schur solve)."""
    x = [None] * len(w)
    for p in reversed(range(len(w))):
        v = w[p]
        for q in range(p + 1, len(w)):
            v = v - L[(q, p)] * x[q]
        x[p] = v * inv_diag[p]
    return x


def _failing_row_bump(htt_ref, row0, first_bad, ridge, d, R, unit_roundoff):
    """Gershgorin bump of the atom's first failing row (0 when none): its ``H_tt`` block
    is read again, broadcast over ``R`` lanes, only in atoms that have one (a failing row
    is rare; keeping every row's bump in the chunk loop cost a reduction per chunk)."""
    def bump():
        lane_bad = first_bad + jnp.zeros((R,), jnp.int32)
        h = _load_row_blocks(htt_ref, row0 + lane_bad, lane_bad >= 0, d)
        return jnp.max(row_bump(h, ridge, d, unit_roundoff))

    return jax.lax.cond(first_bad < _NO_ROW, bump, lambda: ridge * 0.0)


def _binary_parts(x):
    """``(m, e)`` with ``x = m * 2**e``, ``m`` in ``[1, 2)`` and integer ``e``, for positive
    finite ``x``, from the bits of ``x``: the row pass multiplies pivots instead of summing
    their logarithms, whose float64 polynomial was a third of its chunk loop. A subnormal
    ``x`` is rebuilt from its integer fraction (exact, and immune to flush-to-zero
    arithmetic); ``+inf`` gives ``m = inf``; zero, negative and NaN ``x`` give garbage
    (their atoms fail and report NaN)."""
    ftype = x.dtype
    itype, mbits = (jnp.int64, 52) if ftype == jnp.float64 else (jnp.int32, 23)
    bias = int(jnp.finfo(ftype).maxexp) - 1
    bits = jax.lax.bitcast_convert_type(x, itype)
    fraction = bits & ((1 << mbits) - 1)
    subnormal = (bits >> mbits) == 0  # x = fraction * 2**(1 - bias - mbits)
    y = jnp.where(subnormal, fraction.astype(ftype), x)
    bits = jax.lax.bitcast_convert_type(y, itype)
    e = (bits >> mbits) - bias + jnp.where(subnormal, 1 - bias - mbits, 0).astype(itype)
    m = jax.lax.bitcast_convert_type((bits & ((1 << mbits) - 1)) | (bias << mbits), ftype)
    return jnp.where(x == jnp.inf, x, m), e.astype(jnp.int32)


def _gram(Y):
    """``Y^T Y`` of an ``(R, K)`` tile as one 2-D dot, full precision."""
    return jax.lax.dot_general(Y, Y, (((0,), (0,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=Y.dtype)


def _load_row_blocks(htt_ref, row, row_ok, d):
    """Lower entries ``h[(p, q)]`` (p >= q) of the rows' ``H_tt`` blocks as ``(R,)``
    vectors; rows not ``row_ok`` read as identity blocks."""
    return {(p, q): _load(htt_ref, row * (d * d) + p * d + q, row_ok, 1.0 if p == q else 0.0)
            for p in range(d) for q in range(p + 1)}


def _load_rows(refs, row0, local, n, k, cross0, d, K):
    """Rows ``row0 + local`` (``local < n`` valid): lower ``H_tt`` entries and ``g_t`` as
    ``(R,)`` vectors, ``H_tb`` as one ``(R, K)`` tile per latent coordinate ``p`` (row
    stride ``d k`` from ``cross0``). Masked rows read as identity blocks."""
    htt_ref, htb_ref, gt_ref = refs
    row_ok = local < n
    row = row0 + local
    ck = jnp.arange(K, dtype=jnp.int32)
    h = _load_row_blocks(htt_ref, row, row_ok, d)
    g = [_load(gt_ref, row * d + p, row_ok, 0.0) for p in range(d)]
    tile_ok = row_ok[:, None] & (ck < k)[None, :]
    B = [_load(htb_ref, cross0 + (local[:, None] * d + p) * k + ck[None, :], tile_ok, 0.0)
         for p in range(d)]
    return row_ok, h, g, B


def _whiten(row_ok, h, g, B, ridge_t, d):
    """``L_i``, ``u_i = L_i^{-1} g_i``, ``Y_i = L_i^{-1} H_tb_i`` on a chunk of rows."""
    L, inv_diag, pivots = _row_cholesky(h, jnp.where(row_ok, ridge_t, 0.0), d)
    Y, u = [], []
    for p in range(d):
        y_p, u_p = B[p], g[p]
        for q in range(p):
            y_p = y_p - L[(p, q)][:, None] * Y[q]
            u_p = u_p - L[(p, q)] * u[q]
        Y.append(y_p * inv_diag[p][:, None])
        u.append(u_p * inv_diag[p])
    return L, inv_diag, pivots, Y, u


def _row_pass_kernel(*refs, d, K, block_rows, streamed, unit_roundoff):
    """Stage 1 for one atom: ``S``, ``r`` and the row statistics (module docstring)."""
    # refs: 7 inputs, then (after the first bucket of a K group) the 6 aliased outputs,
    # then the outputs.
    meta_ref, ridge_t_ref, htt_ref, htb_ref, gt_ref, hbb_ref, gb_ref = refs[:7]
    S_ref, r_ref, ld_ref, bad_ref, row_bump_ref, probe_ref = refs[-6:]
    R = block_rows
    dtype = ld_ref.dtype
    base = pl.program_id(0) * _ROW_META
    atom, pos, row0, n, k, cross0, hbb0, gb0 = (meta_ref[base + f] for f in range(_ROW_META))
    ridge_t = ridge_t_ref[atom]
    ck = jnp.arange(K, dtype=jnp.int32)
    col_ok = ck < k
    # The border is loaded before the chunk loop, so its latency overlaps the rows'.
    ii, jj = ck[:, None], ck[None, :]
    border_ok = col_ok[:, None] & col_ok[None, :]
    H_bb = _load(hbb_ref, hbb0 + jnp.maximum(ii, jj) * k + jnp.minimum(ii, jj), border_ok, 0.0)
    g_b = _load(gb_ref, gb0 + ck, col_ok, 0.0)

    # Only S is reduced per chunk (the dots); the other statistics accumulate per lane,
    # (R,) or (R, K), and are reduced once per atom: a cross-lane reduction per chunk
    # and statistic had made the chunk loop a chain of shuffles and barriers.
    def chunk(c, carry):
        S, rhs, mantissa, exponent, bad, probe = carry
        local = c * R + jnp.arange(R, dtype=jnp.int32)
        row_ok, h, g, B = _load_rows((htt_ref, htb_ref, gt_ref), row0, local, n, k, cross0,
                                     d, K)
        _, _, pivots, Y, u = _whiten(row_ok, h, g, B, ridge_t, d)
        good = row_ok
        for pivot in pivots:
            good = good & (pivot > 0) & (pivot < jnp.inf)  # +inf: L not finite
            m, e = _binary_parts(jnp.where(row_ok, pivot, 1.0))
            mantissa *= m
            exponent += e
        bad = jnp.minimum(bad, jnp.where(row_ok & ~good, local, _NO_ROW))
        for x in [*h.values(), *g]:
            probe += (x * 0.0)[:, None]
        for p in range(d):
            probe += B[p] * 0.0
            # S -= sum_i Y_i^T Y_i (one dot per p), rhs += sum_i Y_i^T u_i.
            S -= _gram(Y[p])
            rhs += Y[p] * u[p][:, None]
        # renormalised every chunk, so the product stays in [1, 2**(d+1)) however long the atom
        m, e = _binary_parts(mantissa)
        return S, rhs, m, exponent + e, bad, probe

    carry = (jnp.zeros((K, K), dtype), jnp.zeros((R, K), dtype), jnp.ones((R,), dtype),
             jnp.zeros((R,), jnp.int32), jnp.full((R,), _NO_ROW, jnp.int32),
             jnp.zeros((R, K), dtype))
    if streamed:
        carry = jax.lax.fori_loop(0, (n + R - 1) // R, chunk, carry)
    else:
        carry = chunk(0, carry)
    S, rhs, mantissa, exponent, bad, probe = carry
    rhs = jnp.sum(rhs, axis=0)
    log_det = jnp.sum(jnp.log(mantissa)) + float(np.log(2.0)) * jnp.sum(exponent).astype(dtype)
    first_bad = jnp.min(bad)
    probe = _nan_probe(probe)
    row_bump = _failing_row_bump(htt_ref, row0, first_bad, ridge_t, d, R, unit_roundoff)

    # S0 = H_bb - sum Y^T Y, unridged with zero padding: the Schur solve adds the ridge
    # and the padding's identity and takes the Gershgorin bump from it.
    probe += _nan_probe(H_bb) + _nan_probe(g_b)
    S += H_bb

    whole = ck >= 0  # all-true mask: S and r are stored whole, padding included
    _store(S_ref, pos * (K * K) + ii * K + jj, S, whole[:, None] & whole[None, :])
    _store(r_ref, pos * K + ck, rhs - g_b, whole)
    ld_ref[pos] = log_det
    bad_ref[pos] = first_bad
    row_bump_ref[pos] = row_bump
    probe_ref[pos] = probe


def _back_kernel(*refs, d, K, block_rows):
    """Stage 3 for one chunk of rows: ``delta_t_i = -L_i^{-T} (u_i + Y_i delta_beta)``.

    ``delta_beta`` of a failed atom is NaN, so its rows come out NaN too."""
    meta_ref, ridge_t_ref, htt_ref, htb_ref, gt_ref, db_ref = refs[:6]
    dt_ref = refs[-1]
    base = pl.program_id(0) * _BACK_META
    row0, n, k, cross0, pos = (meta_ref[base + f] for f in range(_BACK_META))
    local = jnp.arange(block_rows, dtype=jnp.int32)
    row_ok, h, g, B = _load_rows((htt_ref, htb_ref, gt_ref), row0, local, n, k, cross0, d, K)
    ck = jnp.arange(K, dtype=jnp.int32)
    delta_beta = _load(db_ref, pos * K + ck, ck < K, 0.0)
    L, inv_diag, _, Y, u = _whiten(row_ok, h, g, B, ridge_t_ref[pos], d)
    x = _solve_transposed(L, inv_diag,
                          [u[p] + jnp.sum(Y[p] * delta_beta[None, :], axis=1) for p in range(d)])
    row = row0 + local
    for p in range(d):
        _store(dt_ref, row * d + p, -x[p], row_ok)


#: Largest K whose Schur solve runs unrolled (XLA compiles the unrolled K = 32 form in
#: tens of seconds; K = 16 in a few).
MAX_UNROLLED_K = 16


def _unrolled_cholesky_solve(S, rhs):
    """``L L^T x = rhs`` for ``(B, K, K)`` matrices, unrolled over the static ``K``: every
    entry of ``L``, ``z`` and ``x`` is a ``(B,)`` vector over atoms and every step is
    elementwise, so XLA fuses the whole solve into a few kernels (the kernels' unrolled
    :func:`_row_cholesky` and :func:`_solve_transposed` at size ``K``).

    Returns ``x (B, K)`` and ``L``'s diagonal ``(B, K)``. A pivot ``<= 0`` gives a NaN
    (negative) or zero (zero) diagonal entry, which the caller reads as "not PD"."""
    K = S.shape[-1]
    St = jnp.moveaxis(S, 0, -1)  # (K, K, B)
    L, inv, _ = _row_cholesky({(i, j): St[i, j] for i in range(K) for j in range(i + 1)},
                              0.0, K)
    z = []
    for j in range(K):
        z.append((rhs[:, j] - sum((L[(j, q)] * z[q] for q in range(j)), start=0.0)) * inv[j])
    x = _solve_transposed(L, inv, z)
    return jnp.stack(x, axis=-1), 1.0 / jnp.stack(inv, axis=-1)


def _batched_cholesky_solve(S, rhs):
    """``L L^T x = rhs`` through ``lax.linalg.cholesky`` and two batched triangular solves."""
    L_S = jax.lax.linalg.cholesky(S, symmetrize_input=False)
    z = jax.lax.linalg.triangular_solve(L_S, rhs[..., None], left_side=True, lower=True)
    x = jax.lax.linalg.triangular_solve(L_S, z, left_side=True, lower=True, transpose_a=True)
    return x[..., 0], jnp.diagonal(L_S, axis1=-2, axis2=-1)


def _schur_solve(S0, rhs, k, ridge_beta, row_log_det, first_bad, row_bump, probe, *,
                 unrolled):
    """Stage 2 for the unridged ``(B, K, K)`` Schur complements ``S0`` (zero padding) of
    one ``K`` group (XLA): the Gershgorin bump of ``S0`` (spec B.5), then the solve with
    ``S = S0 + ridge_beta I`` and identity padding.

    ``unrolled`` picks :func:`_unrolled_cholesky_solve` (the GPU path for K <= 16, faster
    than the batched LAPACK-style calls there) or
    :func:`_batched_cholesky_solve` (K = 32, and interpret mode: XLA's CPU compiler takes
    seconds over the unrolled form, which its own test covers). Returns padded
    ``delta_beta (B, K)`` (NaN rows for failed atoms), ``log_det``, ``status``, ``row`` and
    ``bump``, each ``(B,)``. A non-positive-definite ``S`` shows as a NaN or zero pivot on
    the Cholesky diagonal (only that atom's)."""
    real = jnp.arange(S0.shape[-1])[None, :] < k[:, None]
    unit_roundoff = float(jnp.finfo(S0.dtype).eps) / 2
    schur_bump = gershgorin_ridge_bump(*jax.vmap(gershgorin_bounds)(S0, real), ridge_beta,
                                       k.astype(S0.dtype), unit_roundoff)
    S = S0 + jnp.where(real, ridge_beta[:, None], 1.0)[:, :, None] * jnp.eye(S0.shape[-1],
                                                                             dtype=S0.dtype)
    solve = _unrolled_cholesky_solve if unrolled else _batched_cholesky_solve
    delta_beta, diag = solve(S, rhs)
    schur_bad = jnp.any(real & ~(diag > 0), axis=-1)
    log_det = row_log_det + 2 * jnp.sum(jnp.where(real, jnp.log(diag), 0.0), axis=-1)
    # probe is NaN exactly when some input entry the solve reads is not finite. A failing
    # row makes Y NaN, so S0 and r (overflow from finite inputs) count only after the rows;
    # S0 through its bump, already reduced (no second pass over the complements).
    status = jnp.where(~(probe == 0), STATUS_NONFINITE,
                       jnp.where(first_bad < _NO_ROW, STATUS_ROW_NOT_PD,
                                 jnp.where(schur_overflow(schur_bump, rhs, real),
                                           STATUS_NONFINITE,
                                           jnp.where(schur_bad, STATUS_SCHUR_NOT_PD,
                                                     STATUS_OK))))
    status = status.astype(jnp.int32)
    failed = status != STATUS_OK
    row = jnp.where(status == STATUS_ROW_NOT_PD, first_bad, -1).astype(jnp.int32)
    bump = jnp.where(status == STATUS_ROW_NOT_PD, row_bump,
                     jnp.where(status == STATUS_SCHUR_NOT_PD, schur_bump, 0.0))
    return (jnp.where(failed[:, None], jnp.nan, delta_beta), jnp.where(failed, jnp.nan, log_det),
            status, row, bump)


def _call(kernel, inputs, outputs, *, interpret, num_warps, programs):
    """One ``pallas_call``. ``outputs`` are ``jax.ShapeDtypeStruct`` on the first call of a
    chain (fresh buffers, no memset: the calls together write every entry) and arrays
    after it, updated in place (aliased)."""
    fresh = isinstance(outputs[0], jax.ShapeDtypeStruct)
    call = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps, grid=(programs,),
        out_shape=[jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs],
        input_output_aliases={} if fresh else {len(inputs) + i: i for i in range(len(outputs))},
    )
    return call(*inputs) if fresh else call(*inputs, *outputs)


def _row_pass(layout, K, atoms, arrays, ridge_t, *, config, interpret, spare):
    """Stage 1 over the atoms of one ``K`` group; returns the per-position statistics."""
    dtype = arrays[0].dtype
    B = atoms.size
    sizes = (B * K * K, B * K, B, B, B, B)
    dtypes = (dtype, dtype, dtype, jnp.int32, dtype, dtype)
    outputs = [jax.ShapeDtypeStruct((s + spare,), t) for s, t in zip(sizes, dtypes)]
    position = np.empty(layout.num_atoms, dtype=np.int64)
    position[atoms] = np.arange(B)
    for bucket in plan_buckets(layout.subset(atoms), config):
        members = atoms[bucket.atoms]
        meta = jnp.asarray(_row_meta(layout, members, position[members]))
        kernel = functools.partial(
            _row_pass_kernel, d=layout.d, K=K, block_rows=bucket.block_rows,
            streamed=bucket.streamed, unit_roundoff=float(jnp.finfo(dtype).eps) / 2)
        outputs = _call(kernel, (meta, ridge_t, *arrays), outputs,
                        interpret=interpret, programs=members.size,
                        num_warps=config.num_warps(bucket.block_rows, K))
    S, r, *stats = (out[:s] for out, s in zip(outputs, sizes))
    return S.reshape(B, K, K), r.reshape(B, K), stats


def _back_substitution(layout, K, atoms, arrays, ridge_t, delta_beta, delta_t, *, config,
                       interpret):
    """Stage 3 over one ``K`` group's row chunks, writing into ``delta_t`` in place (a
    ``jax.ShapeDtypeStruct`` before the first group that has rows)."""
    rows = config.block_rows_cap(layout.d, K, config.back_rows)
    meta = _back_meta(layout, atoms, rows)
    if not meta.size:
        return delta_t
    kernel = functools.partial(_back_kernel, d=layout.d, K=K, block_rows=rows)
    return _call(kernel, (jnp.asarray(meta), ridge_t[atoms], *arrays[:3],
                          delta_beta.reshape(-1)), [delta_t], interpret=interpret,
                 num_warps=config.back_warps, programs=meta.size // _BACK_META)[0]


def _wide_load_row(refs, row, local, k, cross0, d, D, K):
    """One row's ``H_tt`` block ``(D, D)`` (lower triangle read, identity padding), its
    ``H_tb`` block ``(D, K)`` and ``g_t`` ``(D,)`` (zero padding), ``D = 16`` or ``32``."""
    htt_ref, htb_ref, gt_ref = refs
    idx = jnp.arange(D, dtype=jnp.int32)
    p, q = idx[:, None], idx[None, :]
    real = (p < d) & (q < d)
    A = _load(htt_ref, row * (d * d) + jnp.maximum(p, q) * d + jnp.minimum(p, q), real, 0.0)
    A = jnp.where(real, A, jnp.where(p == q, 1.0, 0.0).astype(A.dtype))
    ck = jnp.arange(K, dtype=jnp.int32)[None, :]
    B = _load(htb_ref, cross0 + (local * d + p) * k + ck, (p < d) & (ck < k), 0.0)
    g = _load(gt_ref, row * d + idx, idx < d, 0.0)
    return A, B, g


def _wide_whiten(A, B, g, ridge, d):
    """Right-looking Cholesky ``L L^T = A + ridge I_d`` of one ``(D, D)`` row block
    (identity padding), carrying ``B (D, K)`` and ``g (D,)`` along, as a loop over the
    ``d`` columns on whole tiles (masked column and row extraction, rank-1 updates).

    Column ``j`` of the updated ``A`` (and row ``j`` of ``B``, entry ``j`` of ``g``) is final
    once step ``j`` has run, so ``L = tril(A) diag(1 / sqrt(pivot))``, ``Y = L^{-1} B =
    diag(..) B`` and ``u = L^{-1} g`` come out of the updated tiles. Returns ``(L, inv_diag,
    Y, u, log_det, good)``: ``log_det`` the sum of the log pivots, ``good`` 1.0 when every
    pivot is positive and finite, else 0.0.
    """
    D = A.shape[0]
    dtype = A.dtype
    idx = jnp.arange(D, dtype=jnp.int32)
    A = A + jnp.where((idx[:, None] == idx[None, :]) & (idx < d)[:, None], ridge, 0.0)

    def step(j, carry):
        A, B, g, inv, log_det, good = carry
        e = idx == j
        col = jnp.sum(jnp.where(e[None, :], A, 0.0), axis=1)
        pivot = jnp.sum(jnp.where(e, col, 0.0))
        s = jax.lax.rsqrt(pivot)
        lower = jnp.where(idx > j, col * s, 0.0)
        y = jnp.sum(jnp.where(e[:, None], B, 0.0), axis=0) * s
        u = jnp.sum(jnp.where(e, g, 0.0)) * s
        A = A - lower[:, None] * lower[None, :]
        B = B - lower[:, None] * y[None, :]
        g = g - lower * u
        ok = (pivot > 0) & (pivot < jnp.inf)
        return A, B, g, jnp.where(e, s, inv), log_det + jnp.log(pivot), jnp.where(ok, good, 0.0)

    one = jnp.ones((), dtype)
    A, B, g, inv, log_det, good = jax.lax.fori_loop(
        0, d, step, (A, B, g, jnp.ones((D,), dtype), one * 0.0, one))
    L = jnp.where(idx[:, None] >= idx[None, :], A, 0.0) * inv[None, :]
    return L, inv, B * inv[:, None], g * inv, log_det, good


def _wide_row_kernel(meta_ref, ridge_t_ref, htt_ref, htb_ref, gt_ref, S_ref, r_ref, ld_ref,
                     bad_ref, probe_ref, *, d, D, K):
    """Stage 1 for one chunk of rows of one atom (``d > 8``): the chunk's ``-sum_i Y_i^T
    Y_i`` (one ``(K, D) @ (D, K)`` dot per row), ``sum_i Y_i^T u_i``, the rows' log
    pivots, the first failing chunk-local row and a NaN probe of the rows' inputs."""
    c = pl.program_id(0)
    base = c * _BACK_META
    row0, n, k, cross0, pos = (meta_ref[base + f] for f in range(_BACK_META))
    ridge_t = ridge_t_ref[pos]
    dtype = ld_ref.dtype

    def row_step(i, carry):
        S, rhs, log_det, bad, probe = carry
        A, B, g = _wide_load_row((htt_ref, htb_ref, gt_ref), row0 + i, i, k, cross0, d, D, K)
        probe += _nan_probe(A) + _nan_probe(B) + _nan_probe(g)
        _, _, Y, u, row_log_det, good = _wide_whiten(A, B, g, ridge_t, d)
        bad = jnp.minimum(bad, jnp.where(good > 0, _NO_ROW, i))
        return S - _gram(Y), rhs + Y * u[:, None], log_det + row_log_det, bad, probe

    zero = jnp.zeros((), dtype)
    S, rhs, log_det, bad, probe = jax.lax.fori_loop(
        0, n, row_step, (jnp.zeros((K, K), dtype), jnp.zeros((D, K), dtype), zero,
                         jnp.full((), _NO_ROW, jnp.int32), zero))
    ck = jnp.arange(K, dtype=jnp.int32)
    whole = ck >= 0
    _store(S_ref, c * (K * K) + ck[:, None] * K + ck[None, :], S, whole[:, None] & whole[None, :])
    _store(r_ref, c * K + ck, jnp.sum(rhs, axis=0), whole)
    ld_ref[c] = log_det
    bad_ref[c] = bad
    probe_ref[c] = probe


def _wide_back_kernel(*refs, d, D, K):
    """Stage 3 for one chunk of rows (``d > 8``): ``delta_t_i = -L_i^{-T} (u_i + Y_i
    delta_beta)``, the transposed solve a loop over the ``d`` rows of ``L_i``."""
    meta_ref, ridge_t_ref, htt_ref, htb_ref, gt_ref, db_ref = refs[:6]
    dt_ref = refs[-1]  # after the first K group, the aliased delta_t comes in as well
    base = pl.program_id(0) * _BACK_META
    row0, n, k, cross0, pos = (meta_ref[base + f] for f in range(_BACK_META))
    ck = jnp.arange(K, dtype=jnp.int32)
    delta_beta = _load(db_ref, pos * K + ck, ck < K, 0.0)
    ridge_t = ridge_t_ref[pos]
    idx = jnp.arange(D, dtype=jnp.int32)

    def row_step(i, carry):
        A, B, g = _wide_load_row((htt_ref, htb_ref, gt_ref), row0 + i, i, k, cross0, d, D, K)
        L, inv, Y, u, _, _ = _wide_whiten(A, B, g, ridge_t, d)

        def back(t, carry):
            w, x = carry
            e = idx == d - 1 - t
            xp = jnp.sum(jnp.where(e, w * inv, 0.0))
            w = w - jnp.sum(jnp.where(e[:, None], L, 0.0), axis=0) * xp
            return w, jnp.where(e, xp, x)

        w = u + jnp.sum(Y * delta_beta[None, :], axis=1)
        _, x = jax.lax.fori_loop(0, d, back, (w, jnp.zeros_like(w)))
        _store(dt_ref, (row0 + i) * d + idx, -x, idx < d)

    jax.lax.fori_loop(0, n, row_step, None)


def _wide_dim(d: int) -> int:
    """``d`` padded to a power-of-two tile of at least 16 (the float64 dot minimum)."""
    return max(_MIN_TILE, next_pow2(d))


def _gather_borders(layout, atoms, K, H_bb, g_b):
    """``(B, K, K)`` symmetric borders from their lower triangles and ``(B, K)`` border
    gradients of ``atoms``, zero padding; indices built on the device from per-atom
    offsets (``O(B)`` constants)."""
    k = jnp.asarray(layout.k_dims[atoms])[:, None]
    ck = jnp.arange(K)[None, :]
    i, j = ck[:, :, None], ck[:, None, :]
    kk = k[:, :, None]
    hbb = jnp.where((i < kk) & (j < kk), jnp.asarray(layout.hbb_offsets[atoms])[:, None, None]
                    + jnp.maximum(i, j) * kk + jnp.minimum(i, j), H_bb.size)
    gb = jnp.where(ck < k, jnp.asarray(layout.border_offsets[atoms])[:, None] + ck, g_b.size)
    take = functools.partial(jnp.take, mode="fill", fill_value=0)
    return take(H_bb, hbb), take(g_b, gb)


def _wide_row_pass(layout, K, atoms, arrays, ridge_t, *, config, interpret, spare):
    """Stage 1 over one ``K`` group (``d > 8``): chunk programs, then per-atom segment
    sums (XLA); returns ``S0``, ``r`` and the statistics :func:`_schur_solve` takes."""
    d, D = layout.d, _wide_dim(layout.d)
    dtype = arrays[0].dtype
    B = atoms.size
    meta = _back_meta(layout, atoms, config.wide_rows)
    chunks = meta.size // _BACK_META
    fields = meta.reshape(-1, _BACK_META)
    owner = fields[:, 4]
    H_bb, g_b = _gather_borders(layout, atoms, K, arrays[3], arrays[4])
    borders_probe = (jnp.sum(H_bb * 0.0, axis=(1, 2)) + jnp.sum(g_b * 0.0, axis=1))
    if chunks == 0:  # atoms without rows
        zeros = jnp.zeros((B,), dtype)
        return (H_bb, -g_b, [zeros, jnp.full((B,), _NO_ROW, jnp.int32), zeros,
                             borders_probe])
    sizes = (chunks * K * K, chunks * K, chunks, chunks, chunks)
    dtypes = (dtype, dtype, dtype, jnp.int32, dtype)
    outputs = [jax.ShapeDtypeStruct((size + spare,), t) for size, t in zip(sizes, dtypes)]
    kernel = functools.partial(_wide_row_kernel, d=d, D=D, K=K)
    S, r, ld, bad, probe = (out[:size] for out, size in zip(
        _call(kernel, (jnp.asarray(meta), ridge_t[atoms], *arrays[:3]), outputs,
              interpret=interpret, num_warps=config.wide_warps, programs=chunks), sizes))
    segment = functools.partial(jax.ops.segment_sum, segment_ids=jnp.asarray(owner),
                                num_segments=B)
    S0 = H_bb + segment(S.reshape(chunks, K, K))
    rhs = segment(r.reshape(chunks, K)) - g_b
    # the chunk's first row within its atom turns a chunk-local failing row atom-local
    first_local = fields[:, 0] - layout.row_offsets[atoms[owner]]
    bad = jnp.where(bad < _NO_ROW, bad + jnp.asarray(first_local, jnp.int32), _NO_ROW)
    first_bad = jax.ops.segment_min(bad, jnp.asarray(owner), num_segments=B)
    first_bad = jnp.minimum(first_bad, _NO_ROW)  # atoms without rows
    # the Gershgorin bump of each atom's first failing row, from its H_tt block
    row = jnp.asarray(layout.row_offsets[atoms]) + jnp.where(first_bad < _NO_ROW, first_bad, 0)
    pq = jnp.arange(d * d)
    blocks = jnp.take(arrays[0], row[:, None] * (d * d) + pq[None, :], mode="fill",
                      fill_value=0).reshape(B, d, d)
    bounds = jax.vmap(gershgorin_bounds, in_axes=(0, None))(symmetric_from_lower(blocks),
                                                            jnp.ones(d, bool))
    row_bump = gershgorin_ridge_bump(*bounds, ridge_t[atoms], d, float(jnp.finfo(dtype).eps) / 2)
    probe = segment(probe) + borders_probe
    return S0, rhs, [segment(ld), first_bad, row_bump, probe]


def _wide_back_substitution(layout, K, atoms, arrays, ridge_t, delta_beta, delta_t, *, config,
                            interpret):
    """Stage 3 over one ``K`` group's row chunks (``d > 8``), in place into ``delta_t``."""
    meta = _back_meta(layout, atoms, config.wide_rows)
    if not meta.size:
        return delta_t
    kernel = functools.partial(_wide_back_kernel, d=layout.d, D=_wide_dim(layout.d), K=K)
    return _call(kernel, (jnp.asarray(meta), ridge_t[atoms], *arrays[:3],
                          delta_beta.reshape(-1)), [delta_t], interpret=interpret,
                 num_warps=config.wide_warps, programs=meta.size // _BACK_META)[0]


@functools.partial(jax.jit, static_argnames=("layout", "interpret", "config"))
def solve_border_pallas(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta,
                        *, interpret: bool = False, config: KernelConfig = KernelConfig()):
    """Kernel twin of :func:`gpustat.reference.border.solve_border_reference` (same arguments).

    Returns ``delta_t (N, d)``, ``delta_beta`` flat, ``log_det (b,)``, ``status (b,)``,
    ``row (b,)``, ``bump (b,)``; arrays in the compute dtype.
    """
    dtype = compute_dtype(jnp.result_type(H_tt, H_tb, g_t, H_bb, g_b))
    d = layout.d
    # Masked loads aim at slot 0, so an empty packed array becomes one zero slot (only then:
    # the shapes are static, and a non-empty array is passed as it is, without a copy).
    arrays = tuple(nonempty(jnp.asarray(x, dtype).reshape(-1))
                   for x in (H_tt, H_tb, g_t, H_bb, g_b))
    ridge_t = jnp.asarray(ridge_t, dtype)
    ridge_beta = jnp.asarray(ridge_beta, dtype)
    # In interpret mode every kernel output has one spare trailing slot for masked lanes
    # (see _store); on the GPU masked lanes write nothing.
    spare = 1 if interpret else 0
    delta_t = jax.ShapeDtypeStruct((layout.num_rows * d + spare,), dtype)
    per_group, order, beta_pad, beta_base = [], [], [], 0
    beta_index = np.zeros(int(layout.border_offsets[-1]), dtype=np.int64)
    if not layout.uniform:
        raise ValueError(f"solve_border_pallas takes one d per call, got {layout}")
    if d > MAX_KERNEL_D:
        raise ValueError(f"the Pallas kernel takes d <= {MAX_KERNEL_D}, got {d=}")
    wide = d > min(config.unrolled_d, MAX_UNROLLED_D)
    row_pass = _wide_row_pass if wide else _row_pass
    back_substitution = _wide_back_substitution if wide else _back_substitution
    for K, atoms in _group_positions(layout).items():
        S0, r, stats = row_pass(layout, K, atoms, arrays, ridge_t, config=config,
                                interpret=interpret, spare=spare)
        delta_beta, *per_atom = _schur_solve(S0, r, jnp.asarray(layout.k_dims[atoms]),
                                             ridge_beta[atoms], *stats,
                                             unrolled=not interpret and K <= MAX_UNROLLED_K)
        delta_t = back_substitution(layout, K, atoms, arrays, ridge_t, delta_beta, delta_t,
                                    config=config, interpret=interpret)
        per_group.append(per_atom)
        order.append(atoms)
        beta_pad.append(delta_beta.reshape(-1))
        ks = layout.k_dims[atoms]
        within = layout.border_index(atoms) - np.repeat(layout.border_offsets[atoms], ks)
        beta_index[layout.border_index(atoms)] = (
            beta_base + np.repeat(np.arange(atoms.size) * K, ks) + within)
        beta_base += atoms.size * K
    if isinstance(delta_t, jax.ShapeDtypeStruct):  # no rows at all
        delta_t = jnp.zeros((0,), dtype)
    inverse = np.argsort(np.concatenate(order))
    log_det, status, row, bump = (jnp.concatenate(parts)[inverse] for parts in zip(*per_group))
    delta_beta = jnp.concatenate(beta_pad)[beta_index]
    delta_t = delta_t[:layout.num_rows * d].reshape(layout.num_rows, d)
    return delta_t, delta_beta, log_det, status, row, bump

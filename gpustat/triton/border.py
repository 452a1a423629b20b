"""Fused Triton kernel for batched border (arrow-Schur) Newton solves: one program per atom.

A program runs the whole solve of its atom (spec B.3, same conventions as
:mod:`gpustat.pallas.border`):

1. **Row pass**: chunks of ``R`` rows; each row's ``d x d`` Cholesky, ``u_i`` and
   ``Y_i = L_i^{-1} H_tb_i`` (``d`` tiles of ``(R, K)``), ``S += Y_p^T Y_p`` as ``d``
   tensor-core dots, the right-hand side, the rows' log-determinant, the first failing row
   and, in atoms with a failing row only, a NaN probe of the inputs (elsewhere a
   non-finite entry makes ``S0`` or ``r`` non-finite, which reports the same status).
   ``K`` is ``k + 1`` padded to 16 or 32, so that ``u_i`` rides in ``Y_i``'s last column
   and the dots give the right-hand side too (``k = 32``: ``K = 32`` and an ``(R, K)``
   accumulator instead).
2. **Schur solve**: ``S0 = H_bb - sum_i Y_i^T Y_i``, then ``S = S0 + ridge_beta I``
   (identity padding) solved, its pivots (the ``LDL^T``
   pivots, all ``> 0`` exactly when ``S`` is positive definite, in exact arithmetic) giving
   its log-determinant and status:

   * ``k <= 12``: a Cholesky factorisation in scalars (:func:`_scalar_schur`). The tile's
     lower triangle goes through a per-program scratch buffer and comes back as scalars in
     every lane, so the factorisation has no cross-lane step. Atoms are launched in
     groups of one ``k``, each unrolled for its ``k``.
   * wider borders: Gauss-Jordan elimination of the tile without pivoting, ``k`` steps
     (:func:`_gauss_jordan`); a scalar factorisation of 15 would spill.

   An ``S`` within rounding of singular can go either way: these factorisations and the
   reference's round differently, and then their statuses can differ. ``S0``'s
   Gershgorin ridge bump (spec B.5) is computed where the solve failed (status 2 reports
   it) or where it could overflow (status 3: an entry of ``S0`` or the ridge within
   ``2**8`` of the largest float).
3. **Back substitution**: the atom's rows again (from L2: the program read them
   microseconds before), ``delta_t_i = -L_i^{-T} L_i^{-1} (g_i + H_tb_i delta_beta)``
   (``= -L_i^{-T} (u_i + Y_i delta_beta)`` without whitening ``H_tb_i`` again).

A failed atom (a non-finite input, a row or ``S`` not positive definite, ``S0`` or the
right-hand side overflowing) gets NaN ``delta_beta``, so its rows come out NaN; the
wrapper turns the per-atom statistics into ``status``, ``row`` and ``bump`` with the rules
of :mod:`gpustat.reference.border`.

Loads. Lane ``i`` reads row ``i``, so the rows' loads are uncoalesced (an Nsight Compute
profile of the ``k = 12`` launch: the L1 data pipe 75 % busy, most of it these loads); fewer
load instructions paid, but coalesced tiles and shared-memory staging were slower
(``benchmarks/results/*/probes/border_*.md``). In a launch of one ``k <= 12`` on one warp
(``FIXED_K``, :func:`_chunk_fixed_k`), each row's ``H_tb`` block of ``d k`` contiguous
entries loads as a tuple of vectors, 16 bytes a lane for even ``d`` (every block then starts
at an even offset), and whitens column by column; the ``Y`` tiles for the dots are assembled
in registers (:func:`_stack16`). ``H_tt``, ``g_t`` and ``delta_t`` move in pairs too for
even ``d`` (:func:`_row_entries`), which shortens the solve of the benchmark batch.

Layout of the runtime-``k`` path: the ``H_tb`` tiles' column offsets pass through a PTX
move (:func:`_opaque`),
which hides their contiguity from Triton's coalescing pass, so it lays a tile out one row
per thread (``threadsPerWarp = [32, 1]``) instead of a row across 16 threads. The rows'
scalar work (``d`` square roots and the whitening factors) then runs once per row instead
of 16 times (the probe records ``benchmarks/results/*/probes/border_*.md`` have the
timings and what was tried). ptxas still sees the constant offsets and folds them into the
loads' address immediates: a tile element costs its load, a predicate and a zero, not an
address. (An earlier form multiplied the columns by a runtime 1; Triton's interpreter, which has no
inline assembly, still does.) Index arithmetic is int32, as in the Pallas kernels
(``BorderBatch`` checks the packed sizes), up to the rows' ``H_tb`` pointers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from gpustat._arrays import compute_dtype, next_pow2, nonempty
from gpustat.reference.border import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_ROW_NOT_PD,
    STATUS_SCHUR_NOT_PD,
    BorderLayout,
    row_bump,
)
from gpustat.triton._common import CompileCase, launch

__all__ = ["COMPILE_CASES", "MAX_TRITON_D", "launch_config", "solve_border_triton"]

#: Largest row dimension d the kernel unrolls.
MAX_TRITON_D = 8
_MIN_K = 16  # the Gram dots need M, N >= 16
_ROWS = 32  # rows per chunk: one per thread of a warp
# Atoms of k <= 12 launch in groups of one k, a compile-time constant there: their rows'
# H_tb blocks load as vectors (in pairs for even d) and S is factorised in scalars, both
# unrolled for that k. Wider borders keep runtime k, H_tb tiles and Gauss-Jordan on the tile
# (a scalar factorisation of 15 spills: 760 bytes in an offline sm_90 compile).
_MAX_SCALAR_K = 12
_NO_ROW = 2**30  # "no failing row" sentinel, larger than any atom-local row index
_LN2 = tl.constexpr(float(np.log(2.0)))
_META = 8  # atom, first row, rows, border width, H_tb / H_bb / g_b offsets, a spare
# Per-atom statistics: log-determinant, first failing row, NaN probe of the inputs,
# Schur bump, S0 or r non-finite, S not positive definite.
_STATS = 6


@triton.jit
def _lower(h, p: tl.constexpr, q: tl.constexpr):
    """Entry (p, q), p >= q, of a row-major lower triangle stored as a flat tuple."""
    return h[p * (p + 1) // 2 + q]


@triton.jit
def _opaque(x):
    """``x`` (int32) through a PTX move: Triton's analyses see an unknown value (no
    contiguity), ptxas still sees the constants."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _row_entries(ptr, start, ok, W: tl.constexpr, DIAG: tl.constexpr, PAIRS: tl.constexpr):
    """``ptr[start + j]``, ``j < W``, of each row (``start``: ``(R,)``) as a tuple of ``(R,)``
    vectors; masked rows read 0, or 1 at ``j = DIAG``. ``PAIRS`` (``W`` and every ``start``
    even): in pairs, 16 bytes a lane. The ``(R, 2)`` tiles keep one row a thread and halve
    the load instructions, and with them the L1 wavefronts of the uncoalesced rows."""
    out = ()
    if PAIRS:
        two = tl.arange(0, 2)
        for j in tl.static_range(0, W, 2):
            pair = tl.load(ptr + start[:, None] + (j + two)[None, :], mask=ok[:, None],
                           other=tl.where((j + two) == DIAG, 1.0, 0.0)[None, :])
            a, b = tl.split(pair)
            out = out + (a, b)  # noqa: RUF005
    else:
        for j in tl.static_range(W):
            out = out + (tl.load(ptr + start + j, mask=ok,  # noqa: RUF005
                                 other=1.0 if j == DIAG else 0.0),)
    return out


@triton.jit
def _row_tt(htt_ptr, gt_ptr, row, ok, D: tl.constexpr):
    """The rows' lower ``H_tt`` entries (a flat tuple) and ``g_t`` as ``(R,)`` vectors; rows
    past the atom read as identity blocks. Even ``D``: in pairs (:func:`_row_entries`; the
    upper entry of an odd-sized pair is read and dropped)."""
    PAIRS: tl.constexpr = D % 2 == 0
    h = ()
    for p in tl.static_range(D):
        entries = _row_entries(htt_ptr, row * (D * D) + p * D, ok, p + 1 + (p + 1) % 2 * PAIRS,
                               p, PAIRS)
        for q in tl.static_range(p + 1):
            h = h + (entries[q],)  # noqa: RUF005
    return h, _row_entries(gt_ptr, row * D, ok, D, -1, PAIRS)


@triton.jit
def _load_rows(htt_ptr, gt_ptr, htb_ptr, row, ok, loc, cross0, k, cols, tile_cols,
               D: tl.constexpr):
    """:func:`_row_tt` and ``H_tb`` as ``D`` tiles of ``(R, K)`` (runtime ``k``)."""
    h, g = _row_tt(htt_ptr, gt_ptr, row, ok, D)
    tile_ok = ok[:, None] & (cols < k)[None, :]
    B = ()
    for p in tl.static_range(D):
        row_ptr = htb_ptr + (cross0 + (loc * D + p) * k)
        B = B + (tl.load(row_ptr[:, None] + tile_cols[None, :], mask=tile_ok,  # noqa: RUF005
                         other=0.0),)
    return h, g, B


@triton.jit
def _row_block(htb_ptr, loc, ok, cross0, D: tl.constexpr, KA: tl.constexpr):
    """The rows' ``H_tb`` blocks for a compile-time border width ``KA``: each row's
    ``D * KA`` contiguous entries as a flat tuple of ``(R,)`` vectors (entry ``(p, c)`` at
    ``p * KA + c``), in pairs for even ``D`` (then every block starts at an even offset)."""
    PAIRS: tl.constexpr = D % 2 == 0
    if PAIRS:  # (tells Triton's alignment analysis that cross0 is even: it is, for even D)
        cross0 = cross0 // 2 * 2
    return _row_entries(htb_ptr, cross0 + loc * (D * KA), ok, D * KA, -1, PAIRS)


@triton.jit
def _stack16(v):
    """The ``(R, 16)`` tile whose column ``j`` is the ``(R,)`` vector ``v[j]``: four levels of
    ``tl.join`` (each adds a minor in-thread axis), fed in bit-reversed order so that the
    row-major reshape puts ``v[j]`` in column ``j``."""
    level = ()
    for j in tl.static_range(0, 16, 2):  # bitrev(j) and bitrev(j + 1) = bitrev(j) + 8
        level = level + (tl.join(v[((j & 2) << 1) | ((j & 4) >> 1) | ((j & 8) >> 3)],  # noqa: RUF005
                                 v[((j & 2) << 1) | ((j & 4) >> 1) | ((j & 8) >> 3) | 8]),)
    for step in tl.static_range(3):
        up = ()
        for j in tl.static_range(0, 8 >> step, 2):
            up = up + (tl.join(level[j], level[j + 1]),)  # noqa: RUF005
        level = up
    return tl.reshape(level[0], (v[0].shape[0], 16))


@triton.jit
def _cholesky(h, ridge, D: tl.constexpr):
    """Cholesky ``L L^T = h + ridge I`` of a flat lower-triangle tuple ``h`` (entries may be
    scalars or vectors of independent systems), Cholesky-Banachiewicz order: ``L`` as a flat
    tuple of the strictly lower entries (each diagonal slot holds the pivot, never read as
    ``L_pp``), ``1 / L_pp`` and the pivots ``L_pp^2``."""
    L = ()
    inv = ()
    piv = ()
    for p in tl.static_range(D):
        for q in tl.static_range(p):
            v = _lower(h, p, q)
            for c in tl.static_range(q):
                v = v - _lower(L, p, c) * _lower(L, q, c)
            L = L + (v * inv[q],)  # noqa: RUF005
        v = _lower(h, p, p) + ridge
        for c in tl.static_range(p):
            v = v - _lower(L, p, c) * _lower(L, p, c)
        piv = piv + (v,)  # noqa: RUF005
        inv = inv + (tl.rsqrt(v),)  # noqa: RUF005
        L = L + (v,)  # noqa: RUF005
    return L, inv, piv


@triton.jit
def _forward(L, inv, g, D: tl.constexpr):
    """``L^{-1} g`` for a tuple ``g`` (:func:`_cholesky`'s ``L`` and ``inv``)."""
    u = ()
    for p in tl.static_range(D):
        up = g[p]
        for q in tl.static_range(p):
            up = up - _lower(L, p, q) * u[q]
        u = u + (up * inv[p],)  # noqa: RUF005
    return u


@triton.jit
def _backward(L, inv, v, D: tl.constexpr):
    """``L^{-T} v`` for a tuple ``v``, solved from the last coordinate; in order."""
    x = ()  # x[t] is coordinate D - 1 - t
    for t in tl.static_range(D):
        w = v[D - 1 - t]
        for s in tl.static_range(t):
            w = w - _lower(L, D - 1 - s, D - 1 - t) * x[s]
        x = x + (w * inv[D - 1 - t],)  # noqa: RUF005
    out = ()
    for p in tl.static_range(D):
        out = out + (x[D - 1 - p],)  # noqa: RUF005
    return out


@triton.jit
def _whiten(h, g, B, ridge, D: tl.constexpr):
    """Rows' Cholesky (:func:`_cholesky` of ``H_tt_i + ridge I``), ``u = L^{-1} g`` and
    ``Y = L^{-1} B``."""
    L, inv, piv = _cholesky(h, ridge, D)
    Y = ()
    for p in tl.static_range(D):
        yp = B[p]
        for q in tl.static_range(p):
            yp = yp - _lower(L, p, q)[:, None] * Y[q]
        Y = Y + (yp * inv[p][:, None],)  # noqa: RUF005
    return L, inv, piv, _forward(L, inv, g, D), Y


@triton.jit
def _binary_parts(x):
    """``(m, e)`` with ``x = m * 2**e``, ``m`` in ``[1, 2)`` and int32 ``e``, for positive
    finite ``x``, from its bits, as :func:`gpustat.pallas.border._binary_parts` (the row pass
    multiplies pivots instead of summing their logarithms, whose float64 polynomial is long;
    a subnormal ``x`` is rebuilt from its integer fraction; ``+inf`` gives ``m = inf``;
    zero, negative and NaN ``x`` give garbage: their atoms fail and report NaN)."""
    if x.dtype == tl.float64:
        return _binary_parts_of(x, tl.int64, 52, 1023)
    else:
        return _binary_parts_of(x, tl.int32, 23, 127)


@triton.jit
def _binary_parts_of(x, ITYPE: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """:func:`_binary_parts` for a float of ``MBITS`` fraction bits and exponent ``BIAS``."""
    bits = x.to(ITYPE, bitcast=True)
    fraction = bits & ((1 << MBITS) - 1)
    subnormal = (bits >> MBITS) == 0  # x = fraction * 2**(1 - BIAS - MBITS)
    bits = tl.where(subnormal, fraction.to(x.dtype), x).to(ITYPE, bitcast=True)
    e = (bits >> MBITS) - BIAS + tl.where(subnormal, 1 - BIAS - MBITS, 0)
    m = ((bits & ((1 << MBITS) - 1)) | (BIAS << MBITS)).to(x.dtype, bitcast=True)
    return tl.where(x == float("inf"), x, m), e.to(tl.int32)


@triton.jit
def _chunk(htt_ptr, gt_ptr, htb_ptr, loc, n, row0, cross0, k, cols, tile_cols, ridge_t,
           D: tl.constexpr):
    """Rows ``loc`` (atom-local; those ``>= n`` are padding) loaded and whitened for the
    row pass: ``ok``, the pivots, ``u`` and ``Y`` (:func:`_load_rows`, :func:`_whiten`)."""
    ok = loc < n
    h, g, B = _load_rows(htt_ptr, gt_ptr, htb_ptr, row0 + loc, ok, loc, cross0, k, cols,
                         tile_cols, D)
    _, _, piv, u, Y = _whiten(h, g, B, tl.where(ok, ridge_t, 0.0), D)
    return ok, piv, u, Y


@triton.jit
def _chunk_fixed_k(htt_ptr, gt_ptr, htb_ptr, loc, n, row0, cross0, ridge_t, D: tl.constexpr,
                   KA: tl.constexpr):
    """:func:`_chunk` for a compile-time border width ``KA`` (``< 16``): the rows' blocks as
    vectors (:func:`_row_block`), whitened column by column, and ``Y`` as ``D`` tiles of
    ``(R, 16)`` with ``u`` already in the spare column 15."""
    ok = loc < n
    h, g = _row_tt(htt_ptr, gt_ptr, row0 + loc, ok, D)
    b = _row_block(htb_ptr, loc, ok, cross0, D, KA)
    L, inv, piv = _cholesky(h, tl.where(ok, ridge_t, 0.0), D)
    u = _forward(L, inv, g, D)
    columns = ()  # columns[c][p] = Y_p[:, c]
    for c in tl.static_range(KA):
        col = ()
        for p in tl.static_range(D):
            col = col + (b[p * KA + c],)  # noqa: RUF005
        columns = columns + (_forward(L, inv, col, D),)  # noqa: RUF005
    zero = tl.zeros(u[0].shape, u[0].dtype)
    Y = ()
    for p in tl.static_range(D):
        v = ()
        for c in tl.static_range(15):
            v = v + (columns[c][p] if c < KA else zero,)  # noqa: RUF005
        Y = Y + (_stack16(v + (u[p],)),)  # noqa: RUF005
    return ok, piv, u, Y


@triton.jit
def _gershgorin_bump(gap, scale, radius, ridge, dim, unit_roundoff):
    """:func:`gpustat.reference.border.gershgorin_ridge_bump` on scalars."""
    gamma_2 = 2 * unit_roundoff / (1.0 - 2 * unit_roundoff)
    gamma_d = (dim + 1) * unit_roundoff / (1.0 - (dim + 1) * unit_roundoff)
    deficit = tl.maximum(-(gap + ridge), 0.0) + gamma_d * (radius + tl.abs(ridge))
    rel = dim * unit_roundoff * (1.0 + gamma_2) + gamma_2
    return deficit + rel * (scale + tl.abs(ridge) + deficit) / (1.0 - rel)


@triton.jit
def _atom(meta_ptr, ridge_t_ptr, K: tl.constexpr, ASM: tl.constexpr):
    """The atom's metadata (``_META`` order), its row ridge, a runtime 1 (``unit``), the
    border columns, the same as ``H_tb`` tiles' column offsets (see the module docstring)
    and which of them are real. ``ASM``: hide the columns through a PTX move (not in
    Triton's interpreter, which has no inline assembly: there a runtime 1 hides them)."""
    atom = tl.load(meta_ptr)
    k = tl.load(meta_ptr + 3)
    unit = (k > 0).to(tl.int32)
    cols = tl.arange(0, K)
    if ASM:
        tile_cols = _opaque(cols)
    else:
        tile_cols = cols * unit
    return (atom, tl.load(meta_ptr + 1), tl.load(meta_ptr + 2), k, tl.load(meta_ptr + 4),
            tl.load(meta_ptr + 5), tl.load(meta_ptr + 6), tl.load(ridge_t_ptr + atom),
            unit, cols, tile_cols, cols < k)


@triton.jit
def _schur_system(meta_ptr, ridge_t_ptr, ridge_b_ptr, htt_ptr, htb_ptr, gt_ptr, hbb_ptr,
                  gb_ptr, D: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                  SPARE_COLUMN: tl.constexpr, ASM: tl.constexpr, SCHUR_DIM: tl.constexpr,
                  FIXED_K: tl.constexpr):
    """Step 1 and the start of step 2 for the atom of ``meta_ptr``: the ridged Schur
    complement ``A`` (identity padding), the right-hand side ``z``, ``S0``, the border
    ridge, whether ``S0`` or ``r`` has a non-finite entry, the rows' log-determinant, the
    NaN probe and the first failing row."""
    atom, row0, n, k, cross0, hbb0, gb0, ridge_t, unit, cols, tile_cols, col_ok = _atom(
        meta_ptr, ridge_t_ptr, K, ASM)
    dtype = htt_ptr.dtype.element_ty
    ridge_b = tl.load(ridge_b_ptr + atom)
    ii = cols[:, None]
    jj = cols[None, :]
    border_ok = col_ok[:, None] & col_ok[None, :]
    H_bb = tl.load(hbb_ptr + hbb0 + tl.maximum(ii, jj) * k + tl.minimum(ii, jj) * unit,
                   mask=border_ok, other=0.0)
    g_b = tl.load(gb_ptr + gb0 + cols, mask=col_ok, other=0.0)
    lanes = tl.arange(0, R)

    # Row pass. Per-lane accumulators, reduced once per atom. SPARE_COLUMN (every k < K):
    # u rides in Y's zero column K - 1, so the Gram dots also give r's sum_i Y_i^T u_i
    # (S's last column) and no (R, K) accumulator is held.
    S = tl.zeros((K, K), dtype)
    if not SPARE_COLUMN:
        rhs = tl.zeros((R, K), dtype)
    mantissa = tl.full((R,), 1.0, dtype)  # the rows' pivots as mantissa * 2**exponent
    exponent = tl.zeros((R,), tl.int32)
    bad = tl.full((R,), 2**30, tl.int32)
    # (while loops: Triton's interpreter cannot run a for loop to a loaded bound)
    first = 0
    while first < n:
        loc = first + lanes
        if FIXED_K:
            ok, piv, u, Y = _chunk_fixed_k(htt_ptr, gt_ptr, htb_ptr, loc, n, row0, cross0,
                                           ridge_t, D, SCHUR_DIM)
        else:
            ok, piv, u, Y = _chunk(htt_ptr, gt_ptr, htb_ptr, loc, n, row0, cross0, k, cols,
                                   tile_cols, ridge_t, D)
        good = ok
        for p in tl.static_range(D):
            # a pivot that overflowed to +inf fails too (the reference: L not finite)
            good = good & (piv[p] > 0) & (piv[p] < float("inf"))
            m, e = _binary_parts(tl.where(ok, piv[p], 1.0))
            mantissa *= m
            exponent += e
            Yp = Y[p]
            if SPARE_COLUMN and not FIXED_K:  # (FIXED_K: u is in the spare column already)
                Yp = tl.where((cols == K - 1)[None, :], u[p][:, None], Yp)
            S = tl.dot(tl.trans(Yp), Yp, S, input_precision="ieee", out_dtype=dtype)
            if not SPARE_COLUMN:
                rhs += Yp * u[p][:, None]
        bad = tl.minimum(bad, tl.where(ok & ~good, loc, 2**30))
        # renormalised every chunk, so the product stays in [1, 2**(D+1))
        m, e = _binary_parts(mantissa)
        mantissa = m
        exponent += e
        first += R
    first_bad = tl.min(bad)
    S0 = H_bb - S
    if SPARE_COLUMN:
        r = tl.where(col_ok, tl.sum(tl.where(jj == K - 1, S, 0.0), axis=1), 0.0) - g_b
    else:
        r = tl.sum(rhs, axis=0) - g_b
    # NaN entries: Triton's min / max may drop a NaN, a sum keeps it.
    nonfinite = tl.sum(tl.sum(tl.where(border_ok, S0, 0.0) * 0.0, axis=1)) + tl.sum(r * 0.0)
    probe = tl.full([], 0.0, dtype)
    if first_bad < 2**30:
        # A non-finite input entry makes S0 or r non-finite (status 3 through the overflow
        # check), unless a row failed and made them NaN anyway: only then are the inputs
        # probed, for status 3 wins over status 1.
        probe = (tl.sum(_input_probe(htt_ptr, gt_ptr, htb_ptr, n, row0, cross0, k, cols,
                                     tile_cols, D, R), axis=0)
                 + tl.sum(tl.sum(H_bb * 0.0, axis=1)) + tl.sum(g_b * 0.0))
    A = tl.where(border_ok, S0, 0.0) + tl.where(ii == jj, tl.where(col_ok[:, None], ridge_b,
                                                                   1.0), 0.0)
    z = tl.where(col_ok, r, 0.0)
    log_det = tl.sum(tl.log(mantissa), axis=0) + _LN2 * tl.sum(exponent, axis=0).to(dtype)
    return A, z, S0, ridge_b, nonfinite != 0.0, log_det, probe, first_bad


@triton.jit
def _input_probe(htt_ptr, gt_ptr, htb_ptr, n, row0, cross0, k, cols, tile_cols,
                 D: tl.constexpr, R: tl.constexpr):
    """``0 * x`` summed per lane over the atom's ``H_tt`` (lower), ``g_t`` and ``H_tb``
    entries: NaN where one of them is not finite."""
    probe = tl.zeros((R,), htt_ptr.dtype.element_ty)
    lanes = tl.arange(0, R)
    first = 0
    while first < n:
        loc = first + lanes
        h, g, B = _load_rows(htt_ptr, gt_ptr, htb_ptr, row0 + loc, loc < n, loc, cross0, k,
                             cols, tile_cols, D)
        for e in tl.static_range(D * (D + 1) // 2):
            probe += h[e] * 0.0
        for p in tl.static_range(D):
            probe += g[p] * 0.0 + tl.sum(B[p] * 0.0, axis=1)
        first += R
    return probe


@triton.jit
def _schur_bump(S0, ridge, schur_bad, k, K: tl.constexpr, UNIT_ROUNDOFF: tl.constexpr,
                BUMP_SAFE: tl.constexpr):
    """The Gershgorin bump of ``S0`` (spec B.5) where it matters: where the Schur solve
    failed (status 2 reports it) or where it could overflow (status 3), i.e. where an entry
    of ``S0`` or the ridge reaches ``BUMP_SAFE``; 0 elsewhere, where it is finite and not
    reported."""
    cols = tl.arange(0, K)
    ii = cols[:, None]
    jj = cols[None, :]
    col_ok = cols < k
    absS = tl.where(col_ok[:, None] & col_ok[None, :], tl.abs(S0), 0.0)
    largest = tl.max(tl.max(absS, axis=1), axis=0)
    bump = tl.full([], 0.0, S0.dtype)
    if schur_bad | (largest >= BUMP_SAFE) | (tl.abs(ridge) >= BUMP_SAFE):
        diag = tl.sum(tl.where(ii == jj, S0, 0.0), axis=1)
        off = tl.sum(absS, axis=1) - tl.abs(diag)
        gap = tl.min(tl.where(col_ok, diag - off, float("inf")))
        scale = tl.maximum(tl.max(tl.where(col_ok, tl.abs(diag), 0.0)), 1.0)
        radius = tl.max(tl.where(col_ok, tl.abs(diag) + off, 0.0))
        bump = _gershgorin_bump(gap, scale, radius, ridge, k.to(S0.dtype), UNIT_ROUNDOFF)
    return bump


@triton.jit
def _gauss_jordan(A, z, k, K: tl.constexpr):
    """``delta_beta = A^{-1} z`` and the ``LDL^T`` pivots of the ``(K, K)`` tile ``A`` by
    Gauss-Jordan elimination without pivoting, ``k`` steps: after step ``j`` column ``j`` is
    zero but for the pivot, so ``A`` ends diagonal (a pivot <= 0 or NaN stays one, or turns
    the pivots after it NaN) and ``z`` is ``D delta_beta``."""
    # (1-D sums name their axis: a full reduction would first reshape through shared memory)
    cols = tl.arange(0, K)
    ii = cols[:, None]
    jj = cols[None, :]
    j = 0
    while j < k:
        col = tl.sum(tl.where(jj == j, A, 0.0), axis=1)
        pivot_row = tl.sum(tl.where(ii == j, A, 0.0), axis=0)
        pivot = tl.sum(tl.where(cols == j, col, 0.0), axis=0)
        z_j = tl.sum(tl.where(cols == j, z, 0.0), axis=0)
        factor = tl.where(cols == j, 0.0, col * (1.0 / pivot))
        A = A - factor[:, None] * pivot_row[None, :]
        z = z - factor * z_j
        j += 1
    pivots = tl.sum(tl.where(ii == jj, A, 0.0), axis=1)
    return z / pivots, pivots


@triton.jit
def _scalar_schur(A, z, scratch, SCHUR_DIM: tl.constexpr, K: tl.constexpr):
    """``delta_beta = A^{-1} z`` and the Cholesky pivots of ``A``'s leading ``SCHUR_DIM``
    block (identity padding past ``k``), in scalars: the tile's lower triangle and ``z`` go
    through this program's ``scratch`` and come back as scalars in every lane, so the
    factorisation is a chain of registers with no cross-lane step (each Gauss-Jordan step
    on the tile is a set of cross-lane reductions, slower on the benchmark batch)."""
    cols = tl.arange(0, K)
    ii = cols[:, None]
    jj = cols[None, :]
    triangle: tl.constexpr = SCHUR_DIM * (SCHUR_DIM + 1) // 2
    tl.store(scratch + ii * (ii + 1) // 2 + jj, A, mask=(jj <= ii) & (ii < SCHUR_DIM))
    tl.store(scratch + triangle + cols, z, mask=cols < SCHUR_DIM)
    tl.debug_barrier()  # the stores of every lane before the loads
    h = ()
    for e in tl.static_range(triangle):
        h = h + (tl.load(scratch + e),)  # noqa: RUF005
    g = ()
    for p in tl.static_range(SCHUR_DIM):
        g = g + (tl.load(scratch + triangle + p),)  # noqa: RUF005
    L, inv, piv = _cholesky(h, 0.0, SCHUR_DIM)
    x = _backward(L, inv, _forward(L, inv, g, SCHUR_DIM), SCHUR_DIM)
    delta_beta = tl.zeros((K,), A.dtype)
    pivots = tl.full((K,), 1.0, A.dtype)
    for p in tl.static_range(SCHUR_DIM):
        delta_beta = tl.where(cols == p, x[p], delta_beta)
        pivots = tl.where(cols == p, piv[p], pivots)
    return delta_beta, pivots, x


@triton.jit
def _finish(meta_ptr, ridge_t_ptr, htt_ptr, htb_ptr, gt_ptr, dt_ptr, db_ptr, stats_ptr,
            delta_beta, pivots, x_beta, row_log_det, probe_sum, first_bad, bump, overflow,
            schur_bad, failed, D: tl.constexpr, K: tl.constexpr, R: tl.constexpr, ASM: tl.constexpr,
            SCHUR_DIM: tl.constexpr, FIXED_K: tl.constexpr):
    """Step 2's end and step 3 for the atom of ``meta_ptr``: the statistics and the back
    substitution over its rows (read again). ``x_beta``: ``delta_beta`` as scalars
    (:func:`_scalar_schur`), which ``FIXED_K`` reads."""
    atom, row0, n, k, cross0, _hbb0, gb0, ridge_t, _unit, cols, tile_cols, col_ok = _atom(
        meta_ptr, ridge_t_ptr, K, ASM)
    dtype = htt_ptr.dtype.element_ty
    schur_log_det = tl.sum(tl.where(col_ok, tl.log(pivots), 0.0), axis=0)
    delta_beta = tl.where(failed, float("nan"), delta_beta)
    failed_beta = ()  # x_beta the same way: a failed atom's rows come out NaN
    for c in tl.static_range(SCHUR_DIM):
        failed_beta = failed_beta + (tl.where(failed, float("nan"), x_beta[c]),)  # noqa: RUF005
    tl.store(db_ptr + gb0 + cols, delta_beta, mask=col_ok)
    stats = stats_ptr + atom * 6
    tl.store(stats, tl.where(failed, float("nan"), row_log_det + schur_log_det))
    if dtype == tl.float32:  # the row's bits: float32 holds integers only up to 2**24
        tl.store(stats + 1, first_bad.to(tl.float32, bitcast=True))
    else:
        tl.store(stats + 1, first_bad.to(dtype))
    tl.store(stats + 2, probe_sum)
    tl.store(stats + 3, bump)
    tl.store(stats + 4, overflow.to(dtype))
    tl.store(stats + 5, schur_bad.to(dtype))

    lanes = tl.arange(0, R)
    first = 0
    while first < n:
        loc = first + lanes
        ok = loc < n
        row = row0 + loc
        rhs = ()  # (H_tt + ridge_t I) x = g + H_tb delta_beta, without whitening H_tb again
        if FIXED_K:
            h, g = _row_tt(htt_ptr, gt_ptr, row, ok, D)
            b = _row_block(htb_ptr, loc, ok, cross0, D, SCHUR_DIM)
            for p in tl.static_range(D):
                v = g[p]
                for c in tl.static_range(SCHUR_DIM):
                    v += b[p * SCHUR_DIM + c] * failed_beta[c]
                rhs = rhs + (v,)  # noqa: RUF005
        else:
            h, g, B = _load_rows(htt_ptr, gt_ptr, htb_ptr, row, ok, loc, cross0, k, cols,
                                 tile_cols, D)
            for p in tl.static_range(D):
                rhs = rhs + (g[p] + tl.sum(B[p] * delta_beta[None, :], axis=1),)  # noqa: RUF005
        L, inv, _ = _cholesky(h, tl.where(ok, ridge_t, 0.0), D)
        x = _backward(L, inv, _forward(L, inv, rhs, D), D)
        _store_rows(dt_ptr, row * D, ok, x, D)
        first += R


@triton.jit
def _store_rows(ptr, start, ok, x, D: tl.constexpr):
    """``ptr[start + p] = -x[p]`` for each row; in pairs for even ``D`` (as
    :func:`_row_entries`)."""
    if D % 2 == 0:
        two = tl.arange(0, 2)
        for p in tl.static_range(0, D, 2):
            tl.store(ptr + start[:, None] + (p + two)[None, :], -tl.join(x[p], x[p + 1]),
                     mask=ok[:, None])
    else:
        for p in tl.static_range(D):
            tl.store(ptr + start + p, -x[p], mask=ok)


@triton.jit
def _border_atom_kernel(meta_ptr, ridge_t_ptr, ridge_b_ptr, htt_ptr, htb_ptr, gt_ptr,
                        hbb_ptr, gb_ptr, dt_in_ptr, db_in_ptr, stats_in_ptr,
                        dt_ptr, db_ptr, stats_ptr, scratch_ptr,
                        D: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                        UNIT_ROUNDOFF: tl.constexpr, SPARE_COLUMN: tl.constexpr,
                        SCHUR_DIM: tl.constexpr, FIXED_K: tl.constexpr, ASM: tl.constexpr,
                        BUMP_SAFE: tl.constexpr):
    # dt_in / db_in / stats_in alias dt / db / stats (launches of other groups wrote their
    # atoms there); a program writes only its atom's entries. scratch: _scalar_schur's.
    meta = meta_ptr + tl.program_id(0) * 8
    A, z, S0, ridge_b, nonfinite, row_log_det, probe, first_bad = _schur_system(
        meta, ridge_t_ptr, ridge_b_ptr, htt_ptr, htb_ptr, gt_ptr, hbb_ptr, gb_ptr,
        D, K, R, SPARE_COLUMN, ASM, SCHUR_DIM, FIXED_K)
    k = tl.load(meta + 3)
    if SCHUR_DIM > 0:
        scratch = scratch_ptr + tl.program_id(0).to(tl.int64) * (SCHUR_DIM * (SCHUR_DIM + 3) // 2)
        delta_beta, pivots, x = _scalar_schur(A, z, scratch, SCHUR_DIM, K)
    else:
        delta_beta, pivots = _gauss_jordan(A, z, k, K)
        x = ()  # (the back substitution reads delta_beta)
    cols = tl.arange(0, K)
    schur_bad = tl.sum(tl.where((cols < k) & ~((pivots > 0) & (pivots < float("inf"))), 1, 0),
                       axis=0) > 0
    bump = _schur_bump(S0, ridge_b, schur_bad, k, K, UNIT_ROUNDOFF, BUMP_SAFE)
    overflow = nonfinite | (tl.abs(bump) == float("inf")) | (bump != bump)
    failed = (probe != 0.0) | (first_bad < 2**30) | overflow | schur_bad
    _finish(meta, ridge_t_ptr, htt_ptr, htb_ptr, gt_ptr, dt_ptr, db_ptr, stats_ptr, delta_beta,
            pivots, x, row_log_det, probe, first_bad, bump, overflow, schur_bad, failed, D, K,
            R, ASM, SCHUR_DIM, FIXED_K)


def launch_config(d: int, K: int) -> tuple[int, int]:
    """``(rows per chunk, warps)``: 32 rows, one a thread of one warp while a row has at most
    32 tile entries (``d K``); wider rows spread over more warps (a power of two, up to 8:
    fewer spilled registers, as ptxas keeps every load of a chunk in flight)."""
    return _ROWS, 1 if d * K <= 32 else min(8, next_pow2(d * K // 8))


def _padded_borders(layout: BorderLayout) -> np.ndarray:
    """``K`` of each atom: ``k`` plus the spare column, padded to 16 or 32 (``k = 32``: 32)."""
    return np.array([max(_MIN_K, min(32, next_pow2(k + 1))) for k in layout.k_dims],
                    dtype=np.int64)


def _bump_safe(dtype) -> float:
    """Entries of ``S0`` and a border ridge below this give a finite Gershgorin bump: it is
    at most a few times ``k (max |S0_ij|) + |ridge|`` with ``k <= 32``."""
    return float(jnp.finfo(dtype).max) / 2**8


def _schur_dims(layout: BorderLayout) -> np.ndarray:
    """Each atom's launch group: its ``k`` (a scalar Schur solve of that size), or 0 past
    ``_MAX_SCALAR_K`` (Gauss-Jordan on the tile)."""
    return np.where(layout.k_dims <= _MAX_SCALAR_K, layout.k_dims, 0)


def _fixed_k(schur_dim: int, warps: int) -> bool:
    """Whether a launch group of one ``k`` (``schur_dim > 0``) reads its rows' ``H_tb`` as
    vectors (:func:`_chunk_fixed_k`): where a program is one warp, one row a thread."""
    return bool(schur_dim > 0 and warps == 1)


def _meta(layout: BorderLayout, atoms: np.ndarray) -> np.ndarray:
    """Flat ``(programs * 8,)`` int32 metadata in ``_META`` order, longest atoms first."""
    atoms = atoms[np.argsort(-layout.n_rows[atoms], kind="stable")]
    fields = [atoms, layout.row_offsets[atoms], layout.n_rows[atoms], layout.k_dims[atoms],
              layout.cross_offsets[atoms], layout.hbb_offsets[atoms],
              layout.border_offsets[atoms], np.zeros_like(atoms)]
    return np.stack(fields, axis=1).astype(np.int32).reshape(-1)


def _row_bumps(layout: BorderLayout, H_tt, first_bad, ridge_t):
    """Gershgorin bump (spec B.5) of each atom's first failing row (any row where none)."""
    d = layout.d
    if layout.num_rows == 0:  # no rows, no failing row
        return jnp.zeros(layout.num_atoms, H_tt.dtype)
    local = jnp.where(first_bad < _NO_ROW, first_bad, 0)
    row = jnp.asarray(layout.row_offsets[:-1]) + jnp.minimum(
        local, jnp.maximum(jnp.asarray(layout.n_rows) - 1, 0))
    blocks = H_tt.reshape(-1, d, d)[jnp.minimum(row, layout.num_rows - 1)]
    h = {(p, q): blocks[:, p, q] for p in range(d) for q in range(p + 1)}
    return row_bump(h, ridge_t, d, float(jnp.finfo(H_tt.dtype).eps) / 2)


@functools.partial(jax.jit, static_argnames=("layout", "interpret"))
def solve_border_triton(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta,
                        *, interpret: bool = False):
    """Triton twin of :func:`gpustat.pallas.border.solve_border_pallas` (same arguments and
    returns): one launch per padded border width ``K``. Works under ``jax.vmap`` (one solve
    per batch element, in sequence: jax-triton launches have no batching rule)."""
    if layout.d > MAX_TRITON_D:
        raise ValueError(f"the Triton kernel unrolls d <= {MAX_TRITON_D}, got d={layout.d}")
    for name, ridge in (("ridge_t", ridge_t), ("ridge_beta", ridge_beta)):
        if jnp.shape(ridge) != (layout.num_atoms,):
            raise ValueError(f"{name}: expected shape ({layout.num_atoms},) (one ridge per "
                             f"atom), got {jnp.shape(ridge)}")
    dtype = compute_dtype(jnp.result_type(H_tt, H_tb, g_t, H_bb, g_b))
    arrays = [jnp.asarray(x, dtype) for x in (H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta)]
    return _solver(layout, interpret)(*arrays)


@functools.cache
def _solver(layout: BorderLayout, interpret: bool):
    """The solve of one batch of ``layout`` with a ``jax.vmap`` rule."""

    @jax.custom_batching.custom_vmap
    def solve(*arrays):
        return _launch_all(layout, *arrays, interpret=interpret)

    @solve.def_vmap
    def _vmap(axis_size, in_batched, *arrays):
        stacked = [a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
                   for a, batched in zip(arrays, in_batched, strict=True)]
        return jax.lax.map(lambda a: solve(*a), stacked), (True,) * 6

    return solve


def _launch_all(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta, *,
                interpret: bool):
    dtype = H_tt.dtype
    d, b = layout.d, layout.num_atoms
    arrays = [nonempty(x.reshape(-1)) for x in (H_tt, H_tb, g_t, H_bb, g_b)]
    shapes = (jax.ShapeDtypeStruct((max(layout.num_rows * d, 1),), dtype),
              jax.ShapeDtypeStruct((max(int(layout.border_offsets[-1]), 1),), dtype),
              jax.ShapeDtypeStruct((b * _STATS,), dtype))
    # The first launch writes fresh buffers (no memset: the launches together write every
    # entry), the next ones update them in place; the first gets placeholders to alias.
    outs, aliases = tuple(jnp.zeros((1,), dtype) for _ in shapes), {}
    K_all = _padded_borders(layout)
    groups = np.stack([K_all, _schur_dims(layout)], axis=1)
    unit_roundoff = float(jnp.finfo(dtype).eps) / 2
    for K, schur_dim in sorted({tuple(g) for g in groups.tolist()}):
        atoms = np.flatnonzero((groups[:, 0] == K) & (groups[:, 1] == schur_dim))
        meta = jnp.asarray(_meta(layout, atoms))
        rows, warps = launch_config(d, K)
        scratch = jax.ShapeDtypeStruct((max(atoms.size * schur_dim * (schur_dim + 3) // 2, 1),),
                                       dtype)  # written and read by the kernel only
        *outs, _ = launch(_border_atom_kernel, (meta, ridge_t, ridge_beta, *arrays, *outs),
                          (*shapes, scratch), (atoms.size,), num_warps=warps,
                          interpret=interpret, aliases=aliases, D=d, K=int(K), R=rows,
                          UNIT_ROUNDOFF=unit_roundoff,
                          SPARE_COLUMN=bool(layout.k_dims[atoms].max() < K),
                          SCHUR_DIM=int(schur_dim), FIXED_K=_fixed_k(schur_dim, warps),
                          ASM=not interpret, BUMP_SAFE=_bump_safe(dtype))
        aliases = {8 + i: i for i in range(len(shapes))}
    delta_t, delta_beta, stats = outs
    stats = stats.reshape(b, _STATS)
    log_det, first_bad, probe, schur_bump = (stats[:, i] for i in range(4))
    overflow, schur_bad = stats[:, 4] != 0, stats[:, 5] != 0
    first_bad = (jax.lax.bitcast_convert_type(first_bad, jnp.int32) if dtype == jnp.float32
                 else first_bad.astype(jnp.int32))
    status = jnp.where(~(probe == 0), STATUS_NONFINITE,
                       jnp.where(first_bad < _NO_ROW, STATUS_ROW_NOT_PD,
                                 jnp.where(overflow, STATUS_NONFINITE,
                                           jnp.where(schur_bad, STATUS_SCHUR_NOT_PD,
                                                     STATUS_OK)))).astype(jnp.int32)
    row = jnp.where(status == STATUS_ROW_NOT_PD, first_bad, -1).astype(jnp.int32)
    bump = jnp.where(status == STATUS_ROW_NOT_PD, _row_bumps(layout, H_tt, first_bad, ridge_t),
                     jnp.where(status == STATUS_SCHUR_NOT_PD, schur_bump, 0.0))
    delta_t = delta_t[:layout.num_rows * d].reshape(layout.num_rows, d)
    return (delta_t, delta_beta[:int(layout.border_offsets[-1])], log_det, status, row,
            bump.astype(dtype))


def _compile_cases() -> tuple[CompileCase, ...]:
    """Configurations the CPU tests compile for sm_90: compile-time k of 12 and 5 (even d:
    paired loads), 4 (d = 1) and 7 (d = 3), and runtime k with Gauss-Jordan (d 2 and 4,
    K = 16 and 32, with and without the spare column)."""
    cases = []
    for dtype in (jnp.float64, jnp.float32):
        for d, K, spare, schur_dim in ((2, 16, True, 12), (2, 16, True, 5), (1, 16, True, 4),
                                       (3, 16, True, 7), (2, 16, True, 0), (4, 32, True, 0),
                                       (2, 32, False, 0)):
            rows, warps = launch_config(d, K)
            cases.append(CompileCase(
                f"border[{jnp.dtype(dtype).name},d={d},K={K},schur={schur_dim}]",
                _border_atom_kernel, (jnp.int32, *[dtype] * 14),
                dict(D=d, K=K, R=rows, UNIT_ROUNDOFF=float(jnp.finfo(dtype).eps) / 2,
                     SPARE_COLUMN=spare, SCHUR_DIM=schur_dim,
                     FIXED_K=_fixed_k(schur_dim, warps), ASM=True, BUMP_SAFE=_bump_safe(dtype)),
                warps))
    return tuple(cases)


COMPILE_CASES = _compile_cases()

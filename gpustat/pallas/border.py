"""Pallas kernel for batched border (arrow-Schur) Newton solves: the square-root Schur sequence.

One program solves ``block_atoms`` atoms side by side. Its tensors are
``(block_atoms, block_rows, K)``: the atoms' rows stream through in chunks of
``block_rows`` (a loop whose trip count is the longest atom's chunk count), each
row's ``d x d`` Cholesky and forward substitution unrolled over the static ``d``,
and the Schur complement ``S`` ``(block_atoms, K, K)`` accumulated in registers.
``S``'s Cholesky, ``delta_beta`` and the log-determinant follow in registers; a
second pass over the same chunks (recently read, so mostly from L2) forms
``delta_t``. ``K`` is the border width padded to a power of two (padded entries are
identity, so they change nothing).

Imbalance: atoms are bucketed by ``K`` and by their row count. Small atoms share
a program (many short rows chunks side by side); large atoms get a program each
and stream many chunks. Within a bucket atoms are sorted by row count so one
program's atoms need about the same number of chunks. Each bucket is one
``pallas_call`` writing in place (aliased outputs) into the shared packed results.

Numerics: float64 stays float64, everything else computes in float32. A pivot
fails when ``not (pivot > 0)``; the failing atom's lanes go NaN and its status
says why (same rules as :mod:`gpustat.reference.border`), other atoms never see it.
Index arithmetic is int32: packed arrays must have fewer than 2**31 entries.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from gpustat.border_layout import BorderLayout
from gpustat.pallas._common import compute_dtype, next_pow2, pallas_call, register_lowering_case
from gpustat.reference.border import (
    STATUS_NONFINITE,
    STATUS_OK,
    STATUS_ROW_NOT_PD,
    STATUS_SCHUR_NOT_PD,
    gershgorin_ridge_bump,
)

__all__ = ["MAX_KERNEL_D", "KernelConfig", "plan_buckets", "solve_border_pallas"]

#: Largest row dimension d the kernel unrolls (larger d goes to the reference).
MAX_KERNEL_D = 8
_NO_ROW = 2**30  # "no failing row yet" sentinel, larger than any atom-local row index
_META_FIELDS = 7  # atom id, first row, rows, border width, H_tb / H_bb / g_b offsets


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile shape rules: ``block_atoms * block_rows * K * K <= tile_elems`` (the ``Y^T Y``
    product tile), ``block_rows <= max_block_rows``, ``block_atoms <= max_block_atoms``."""

    tile_elems: int = 4096
    max_block_rows: int = 32
    max_block_atoms: int = 32
    num_warps: int = 4


@dataclasses.dataclass(frozen=True)
class _Bucket:
    """Programs of one tile shape; ``atoms`` ``(programs * block_atoms,)``, -1 = empty lane."""

    K: int
    block_atoms: int
    block_rows: int
    atoms: np.ndarray
    chunks: np.ndarray  # (programs,) row chunks of the longest atom in each program


def plan_buckets(layout: BorderLayout, config: KernelConfig) -> list[_Bucket]:
    """Group atoms into programs by padded border ``K`` and row-chunk size (host, static)."""
    buckets = []
    K_all = np.maximum(2, [next_pow2(k) for k in layout.k_dims]).astype(np.int64)
    for K in sorted(set(K_all.tolist())):
        rows_cap = max(1, config.tile_elems // (K * K))
        R_max = min(config.max_block_rows, next_pow2(rows_cap + 1) // 2)
        in_K = np.flatnonzero(K_all == K)
        R_all = np.array([min(next_pow2(n), R_max) for n in layout.n_rows[in_K]], dtype=np.int64)
        for R in sorted(set(R_all.tolist())):
            atoms = in_K[R_all == R]
            atoms = atoms[np.argsort(-layout.n_rows[atoms], kind="stable")]
            A = int(min(config.max_block_atoms, max(1, rows_cap // R)))
            A = next_pow2(A + 1) // 2  # round down to a power of two
            programs = -(-atoms.size // A)
            lanes = np.full(programs * A, -1, dtype=np.int64)
            lanes[:atoms.size] = atoms
            longest = np.where(lanes >= 0, layout.n_rows[np.maximum(lanes, 0)], 0)
            chunks = -(-longest.reshape(programs, A).max(axis=1) // R)
            buckets.append(_Bucket(K, A, R, lanes, chunks.astype(np.int32)))
    return buckets


def _bucket_meta(layout: BorderLayout, bucket: _Bucket) -> np.ndarray:
    """Flat ``(lanes * 7,)`` int32 per-lane metadata in :data:`_META_FIELDS` order."""
    a = np.maximum(bucket.atoms, 0)
    empty = bucket.atoms < 0
    fields = [bucket.atoms, layout.row_offsets[a], layout.n_rows[a], layout.k_dims[a],
              layout.cross_offsets[a], layout.hbb_offsets[a], layout.border_offsets[a]]
    meta = np.stack([np.where(empty & (i > 0), 0, f) for i, f in enumerate(fields)], axis=1)
    return meta.astype(np.int32).reshape(-1)


def _load(ref, index, mask, other):
    """Gather ``ref[index]`` where ``mask`` (a safe index elsewhere)."""
    return plt.load(ref.at[jnp.where(mask, index, 0)], mask=mask, other=other)


def _store(ref, index, value, mask):
    """Scatter ``value`` to ``ref[index]`` where ``mask``.

    Masked lanes aim at the buffer's spare last slot: interpret mode emulates a masked
    store as a read-modify-write scatter, so a masked lane must not share a real index.
    """
    plt.store(ref.at[jnp.where(mask, index, ref.shape[0] - 1)], value, mask=mask)


def _count_nonfinite(x, mask):
    """Per-element 1.0 where ``x`` is NaN or infinite (and ``mask``), else 0.0."""
    return jnp.where(mask & ~(jnp.abs(x) <= jnp.finfo(x.dtype).max), 1.0, 0.0).astype(x.dtype)


def _load_row_blocks(htt_ref, row, row_ok, d):
    """Lower triangles of the ``(A, R)`` rows' ``H_tt`` blocks: ``{(p, q): (A, R)}``, p >= q.

    Masked rows read as identity blocks so their Cholesky stays finite.
    """
    return {(p, q): _load(htt_ref, row * (d * d) + p * d + q, row_ok, 1.0 if p == q else 0.0)
            for p in range(d) for q in range(p + 1)}


def _row_cholesky(h, ridge, d):
    """Unrolled ``d x d`` lower Cholesky of ``h + ridge I`` on ``(A, R)`` lanes.

    Returns ``(L, pivots)``: ``L[(p, q)]`` for p >= q and the ``d`` pivots.
    """
    L, pivots = {}, []
    for j in range(d):
        pivot = h[(j, j)] + ridge - sum((L[(j, q)] ** 2 for q in range(j)), start=0.0)
        L[(j, j)] = jnp.sqrt(pivot)
        for i in range(j + 1, d):
            dot = sum((L[(i, q)] * L[(j, q)] for q in range(j)), start=0.0)
            L[(i, j)] = (h[(i, j)] - dot) / L[(j, j)]
        pivots.append(pivot)
    return L, pivots


def _row_bump(h, ridge, d, unit_roundoff):
    """Gershgorin ridge bump of every row's unridged block ``h`` (spec B.5), ``(A, R)``."""
    gap = scale = radius = None
    for p in range(d):
        diag = h[(p, p)]
        off = sum((jnp.abs(h[(max(p, q), min(p, q))]) for q in range(d) if q != p), start=0.0)
        row_gap, row_radius = diag - off, jnp.abs(diag) + off
        gap = row_gap if gap is None else jnp.minimum(gap, row_gap)
        scale = jnp.abs(diag) if scale is None else jnp.maximum(scale, jnp.abs(diag))
        radius = row_radius if radius is None else jnp.maximum(radius, row_radius)
    return gershgorin_ridge_bump(gap, jnp.maximum(scale, 1.0), radius, ridge, d, unit_roundoff)


def _border_kernel(meta_ref, chunks_ref, ridge_t_ref, ridge_b_ref, htt_ref, htb_ref, gt_ref,
                   hbb_ref, gb_ref, _dt_in, _db_in, _ld_in, _st_in, _row_in, _bump_in,
                   dt_ref, db_ref, ld_ref, st_ref, row_ref, bump_ref, *, d, K, block_atoms,
                   block_rows, unit_roundoff):
    A, R = block_atoms, block_rows
    dtype = ld_ref.dtype
    lane = pl.program_id(0) * A + jnp.arange(A, dtype=jnp.int32)
    atom, row0, n, k, cross0, hbb0, gb0 = (meta_ref[lane * _META_FIELDS + f]
                                            for f in range(_META_FIELDS))
    atom_ok = atom >= 0
    ridge_t = ridge_t_ref[lane][:, None]
    ridge_b = ridge_b_ref[lane]
    n_chunks = chunks_ref[pl.program_id(0)]
    ck = jnp.arange(K, dtype=jnp.int32)
    col_ok = ck[None, :] < k[:, None]  # (A, K)
    cross_mask = col_ok[:, None, :]

    def chunk_rows(c):
        """Atom-local rows ``(R,)``, their validity and packed index ``(A, R)``."""
        local = c * R + jnp.arange(R, dtype=jnp.int32)
        row_ok = local[None, :] < n[:, None]
        return local, row_ok, row0[:, None] + local[None, :]

    def cross_blocks(row, local, row_ok):
        """``H_tb`` of the chunk, one ``(A, R, K)`` tile per latent coordinate p."""
        mask = row_ok[:, :, None] & cross_mask
        return [_load(htb_ref, cross0[:, None, None] + (local[None, :, None] * d + p)
                      * k[:, None, None] + ck[None, None, :], mask, 0.0) for p in range(d)]

    def row_pass(c, carry):
        S, rhs, log_det, first_bad, bump, bad_inputs = carry
        local, row_ok, row = chunk_rows(c)
        h = _load_row_blocks(htt_ref, row, row_ok, d)
        L, pivots = _row_cholesky(h, jnp.where(row_ok, ridge_t, 0.0), d)
        g = [_load(gt_ref, row * d + p, row_ok, 0.0) for p in range(d)]
        B = cross_blocks(row, local, row_ok)

        # Step 1 failures: first failing row of the chunk and its Gershgorin bump.
        good = row_ok
        for pivot in pivots:
            good = good & (pivot > 0)
        failing = jnp.min(jnp.where(row_ok & ~good, local[None, :], _NO_ROW), axis=1)
        chunk_bump = jnp.sum(jnp.where(local[None, :] == failing[:, None],
                                       _row_bump(h, ridge_t, d, unit_roundoff), 0.0), axis=1)
        bump = jnp.where(failing < first_bad, chunk_bump, bump)
        first_bad = jnp.minimum(first_bad, failing)
        for x in [*h.values(), *g]:
            bad_inputs += jnp.sum(_count_nonfinite(x, row_ok), axis=1)
        for x in B:
            bad_inputs += jnp.sum(jnp.sum(_count_nonfinite(x, True), axis=2), axis=1)
        for pivot in pivots:
            log_det += jnp.sum(jnp.where(row_ok, jnp.log(pivot), 0.0), axis=1)

        # Step 2: u = L^{-1} g, Y = L^{-1} H_tb (forward substitution over p);
        # step 3: S -= sum_i Y_i^T Y_i, rhs += sum_i Y_i^T u_i.
        Y, u = [], []
        for p in range(d):
            y_p, u_p = B[p], g[p]
            for q in range(p):
                y_p = y_p - L[(p, q)][:, :, None] * Y[q]
                u_p = u_p - L[(p, q)] * u[q]
            Y.append(y_p / L[(p, p)][:, :, None])
            u.append(u_p / L[(p, p)])
            S -= jnp.sum(Y[p][:, :, :, None] * Y[p][:, :, None, :], axis=1)
            rhs += jnp.sum(Y[p] * u[p][:, :, None], axis=1)
        return S, rhs, log_det, first_bad, bump, bad_inputs

    zeros_a = jnp.zeros((A,), dtype)
    S, rhs, log_det, first_bad, row_bump, bad_inputs = jax.lax.fori_loop(
        0, n_chunks, row_pass,
        (jnp.zeros((A, K, K), dtype), jnp.zeros((A, K), dtype), zeros_a,
         jnp.full((A,), _NO_ROW, jnp.int32), zeros_a, zeros_a))

    # Border: S0 = H_bb - sum Y^T Y (unridged, for the bump), then ridge; padding is I.
    ii, jj = ck[None, :, None], ck[None, None, :]
    border_ok = (ii < k[:, None, None]) & (jj < k[:, None, None])
    H_bb = _load(hbb_ref, hbb0[:, None, None] + jnp.maximum(ii, jj) * k[:, None, None]
                 + jnp.minimum(ii, jj), border_ok, 0.0)
    g_b = _load(gb_ref, gb0[:, None] + ck[None, :], col_ok, 0.0)
    bad_inputs += jnp.sum(jnp.sum(_count_nonfinite(H_bb, True), axis=2), axis=1)
    bad_inputs += jnp.sum(_count_nonfinite(g_b, True), axis=1)
    S = S + H_bb
    diag_S = jnp.sum(jnp.where(ii == jj, S, 0.0), axis=2)
    off_S = jnp.sum(jnp.where(border_ok, jnp.abs(S), 0.0), axis=2) - jnp.abs(diag_S)
    schur_bump = gershgorin_ridge_bump(
        jnp.min(jnp.where(col_ok, diag_S - off_S, jnp.inf), axis=1),
        jnp.maximum(1.0, jnp.max(jnp.where(col_ok, jnp.abs(diag_S), 0.0), axis=1)),
        jnp.max(jnp.where(col_ok, jnp.abs(diag_S) + off_S, 0.0), axis=1),
        ridge_b, k.astype(dtype), unit_roundoff)
    S = S + jnp.where(ii == jj, jnp.where(ii < k[:, None, None], ridge_b[:, None, None], 1.0), 0.0)
    rhs = rhs - g_b

    # Steps 4-5: right-looking Cholesky of S in registers, forward solve fused (z = L_S^{-1} rhs).
    def schur_column(j, carry):
        S, L_S, z, rhs, log_det, schur_bad = carry
        col = jnp.sum(jnp.where(jj == j, S, 0.0), axis=2)
        pivot = jnp.sum(jnp.where(ck[None, :] == j, col, 0.0), axis=1)
        l_jj = jnp.sqrt(pivot)[:, None]
        l = jnp.where(ck[None, :] > j, col / l_jj, jnp.where(ck[None, :] == j, l_jj, 0.0))
        trailing = (ii > j) & (jj > j)
        S = S - jnp.where(trailing, l[:, :, None] * l[:, None, :], 0.0)
        L_S = L_S + jnp.where(jj == j, l[:, :, None], 0.0)
        z_j = jnp.sum(jnp.where(ck[None, :] == j, rhs, 0.0), axis=1)[:, None] / l_jj
        z = jnp.where(ck[None, :] == j, z_j, z)
        rhs = rhs - jnp.where(ck[None, :] > j, l * z_j, 0.0)
        real = j < k
        log_det += jnp.where(real, jnp.log(pivot), 0.0)
        schur_bad = schur_bad | (real & ~(pivot > 0))
        return S, L_S, z, rhs, log_det, schur_bad

    _, L_S, z, _, log_det, schur_bad = jax.lax.fori_loop(
        0, K, schur_column,
        (S, jnp.zeros((A, K, K), dtype), jnp.zeros((A, K), dtype), rhs, log_det,
         jnp.zeros((A,), jnp.bool_)))

    # Step 5: delta_beta = L_S^{-T} z, one row of L_S^T (= column of L_S) per step.
    def back_column(step, x):
        j = K - 1 - step
        col = jnp.sum(jnp.where(jj == j, L_S, 0.0), axis=2)
        done = jnp.sum(jnp.where(ck[None, :] > j, col * x, 0.0), axis=1)
        l_jj = jnp.sum(jnp.where(ck[None, :] == j, col, 0.0), axis=1)
        z_j = jnp.sum(jnp.where(ck[None, :] == j, z, 0.0), axis=1)
        return jnp.where(ck[None, :] == j, ((z_j - done) / l_jj)[:, None], x)

    delta_beta = jax.lax.fori_loop(0, K, back_column, jnp.zeros((A, K), dtype))

    status = jnp.where(bad_inputs > 0, STATUS_NONFINITE,
                       jnp.where(first_bad < _NO_ROW, STATUS_ROW_NOT_PD,
                                 jnp.where(schur_bad, STATUS_SCHUR_NOT_PD, STATUS_OK)))
    failed = status != STATUS_OK
    _store(st_ref, atom, status.astype(jnp.int32), atom_ok)
    _store(row_ref, atom, jnp.where(status == STATUS_ROW_NOT_PD, first_bad, -1), atom_ok)
    _store(bump_ref, atom, jnp.where(status == STATUS_ROW_NOT_PD, row_bump,
                                     jnp.where(status == STATUS_SCHUR_NOT_PD, schur_bump, 0.0)),
           atom_ok)
    _store(ld_ref, atom, jnp.where(failed, jnp.nan, log_det), atom_ok)
    _store(db_ref, gb0[:, None] + ck[None, :], jnp.where(failed[:, None], jnp.nan, delta_beta),
           atom_ok[:, None] & col_ok)

    # Step 6: delta_t_i = -(H_tt_i + rho_t I)^{-1} (g_t_i + H_tb_i delta_beta), rows re-read.
    def solve_pass(c, carry):
        local, row_ok, row = chunk_rows(c)
        L, _ = _row_cholesky(_load_row_blocks(htt_ref, row, row_ok, d),
                             jnp.where(row_ok, ridge_t, 0.0), d)
        B = cross_blocks(row, local, row_ok)
        w = []
        for p in range(d):
            v = _load(gt_ref, row * d + p, row_ok, 0.0) + jnp.sum(
                B[p] * delta_beta[:, None, :], axis=2)
            for q in range(p):
                v = v - L[(p, q)] * w[q]
            w.append(v / L[(p, p)])
        x = [None] * d
        for p in reversed(range(d)):
            v = w[p]
            for q in range(p + 1, d):
                v = v - L[(q, p)] * x[q]
            x[p] = v / L[(p, p)]
        store_ok = row_ok & atom_ok[:, None]
        for p in range(d):
            _store(dt_ref, row * d + p, jnp.where(failed[:, None], jnp.nan, -x[p]), store_ok)
        return carry

    jax.lax.fori_loop(0, n_chunks, solve_pass, jnp.int32(0))


def _solve_bucket(bucket: _Bucket, meta, ridge_t, ridge_beta, arrays, outputs, *, d,
                  interpret, num_warps):
    dtype = outputs[0].dtype
    kernel = functools.partial(
        _border_kernel, d=d, K=bucket.K, block_atoms=bucket.block_atoms,
        block_rows=bucket.block_rows, unit_roundoff=float(jnp.finfo(dtype).eps) / 2)
    lanes = jnp.asarray(np.maximum(bucket.atoms, 0))
    inputs = (meta, jnp.asarray(bucket.chunks), ridge_t[lanes], ridge_beta[lanes], *arrays)
    call = pallas_call(
        kernel, interpret=interpret, num_warps=num_warps,
        grid=(bucket.chunks.size,),
        out_shape=[jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outputs],
        input_output_aliases={len(inputs) + i: i for i in range(len(outputs))},
    )
    return call(*inputs, *outputs)


@functools.partial(jax.jit, static_argnames=("layout", "interpret", "config"))
def solve_border_pallas(layout: BorderLayout, H_tt, H_tb, g_t, H_bb, g_b, ridge_t, ridge_beta,
                        *, interpret: bool = False, config: KernelConfig = KernelConfig()):
    """Kernel twin of :func:`gpustat.reference.border.solve_border_reference` (same arguments).

    Returns ``delta_t (N, d)``, ``delta_beta`` flat, ``log_det (b,)``, ``status (b,)``,
    ``row (b,)``, ``bump (b,)``; arrays in the compute dtype.
    """
    dtype = compute_dtype(H_tt.dtype)
    d = layout.d
    arrays = tuple(jnp.asarray(x, dtype).reshape(-1) for x in (H_tt, H_tb, g_t, H_bb, g_b))
    b = layout.num_atoms
    # Every output has one spare trailing slot for masked lanes (see _store).
    sizes = (layout.num_rows * d, int(layout.border_offsets[-1]), b, b, b, b)
    dtypes = (dtype, dtype, dtype, jnp.int32, jnp.int32, dtype)
    outputs = [jnp.zeros((size + 1,), dt) for size, dt in zip(sizes, dtypes)]
    ridge_t = jnp.asarray(ridge_t, dtype)
    ridge_beta = jnp.asarray(ridge_beta, dtype)
    for bucket in plan_buckets(layout, config):
        meta = jnp.asarray(_bucket_meta(layout, bucket))
        outputs = _solve_bucket(bucket, meta, ridge_t, ridge_beta, arrays, outputs, d=d,
                                interpret=interpret, num_warps=config.num_warps)
    delta_t, delta_beta, log_det, status, row, bump = (
        out[:size] for out, size in zip(outputs, sizes))
    return delta_t.reshape(layout.num_rows, d), delta_beta, log_det, status, row, bump


def _register_lowering_cases() -> None:
    """One small ragged layout per dtype: both tile regimes (packed small atoms, streamed)."""
    layout = BorderLayout(2, np.array([3, 40, 1, 200]), np.array([2, 5, 1, 17]))
    for dtype in (jnp.float32, jnp.float64):
        sizes = layout.packed_sizes()
        args = [jax.ShapeDtypeStruct(sizes[name], dtype)
                for name in ("H_tt", "H_tb", "g_t", "H_bb", "g_b")]
        args += [jax.ShapeDtypeStruct((layout.num_atoms,), dtype)] * 2
        register_lowering_case(
            "border", f"solve_border_{jnp.dtype(dtype).name}",
            lambda *a: solve_border_pallas(layout, *a), args)


_register_lowering_cases()
